"""A YAML settings file read for a person: every problem is one line naming the file and the
field (an evaluation config, ``control/eval_config.py``; a sweep file, ``sweeps/spec.py``).

``read_yaml_mapping`` reads the file (a key given twice in one mapping is refused: plain YAML
keeps the last silently, and two ``autonomous:`` blocks are a mistake, not a merge);
``validation_line`` turns pydantic's first error into ``FILE: where: what`` with short wording
(``must be >= 1``, ``unknown field``) instead of pydantic's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from orchestrator.errors import ConfigError

__all__ = ["one_line", "read_yaml_mapping", "validation_line"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable: construct_mapping reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def one_line(text: str) -> str:
    return " ".join(text.split())


def read_yaml_mapping(source: Path, shown: str, *, empty: str) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``source`` (``shown`` is how the user named it);
    ``empty`` says what the file needs at least, for the error an empty file gets."""
    try:
        raw = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, not a config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.load(raw, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(one_line(f"{shown}: not valid YAML{where}: {problem}")) from None
    if data is None:
        raise ConfigError(f"{shown}: is empty (it needs {empty})")
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: must be a mapping of settings, not a {type(data).__name__}")
    return data


def _loc_text(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_SHORT_MESSAGES: Final = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "string_type": "must be a string",
}
_BOUNDS: Final = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}
_LENGTHS: Final = {"too_short": "at least", "too_long": "at most"}


def _describe(error: ErrorDetails, patterns: Mapping[str, str]) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _SHORT_MESSAGES:
        message = _SHORT_MESSAGES[kind]
    elif kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        message = f"must be {op} {ctx[key]}"
    elif kind in _LENGTHS:
        bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        message = f"must have {_LENGTHS[kind]} {bound} item(s)"
    elif kind == "value_error" and "error" in ctx:
        message = str(ctx["error"])
    elif kind == "string_too_short" and ctx.get("min_length") == 1:
        message = "must not be empty"
    elif kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        message = patterns.get(pattern, f"must match {pattern}")
    else:
        message = error["msg"]
        if message.startswith("Input should be "):
            message = "must be " + message.removeprefix("Input should be ")
    where = _loc_text(error["loc"])
    return one_line(f"{where}: {message}" if where else message)


def validation_line(shown: str, exc: ValidationError, patterns: Mapping[str, str]) -> str:
    """``SHOWN: where: what`` for the first error (and how many more there are);
    ``patterns`` words a string pattern's mismatch (pattern → ``must be …``)."""
    errors = exc.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{shown}: {_describe(errors[0], patterns)}{more}"
