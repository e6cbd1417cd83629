"""The rules of a Continual Harness entry, written once (stdlib only; docs/harness.md).

An entry (a prompt note, a memory, a skill or a subagent spec) is checked twice with these same
rules: in the kernel when ``rlm.harness`` is called (``runtime/harness.py``), so a bad argument
fails before any request is sent, and on the host before anything is written
(``store/harness_entry.py`` -> ``store/harness.py``), because the host trusts no kernel (R20). Both
sides import this module; it lives under ``orchestrator/runtime`` because the kernel may import
nothing from the host side.

Each check returns the accepted value or raises ``TypeError`` (the value is not even of the
right type) or ``ValueError`` (it is of the right type but breaks a rule). The message is one
line and names the field but not the caller; each side adds its own context and exception type
(``InvalidArgument`` in the kernel, ``HarnessInvalid`` on the host).

The limits keep one entry small enough to list and to put into a prompt. The base system prompt
is deliberately not an entry: the id ``base_system_prompt`` is refused for every kind.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

__all__ = [
    "BASE_PROMPT_ID",
    "CONTENT_MAX_CHARS",
    "ENTRY_ID_MAX_CHARS",
    "ENTRY_ID_RE",
    "JSON_FIELD_MAX_BYTES",
    "KINDS",
    "PATH_MAX_CHARS",
    "REASON_MAX_CHARS",
    "SCOPES",
    "SKILL_REFERENCE_KEYS",
    "SKILL_REFERENCE_TYPE",
    "TITLE_MAX_CHARS",
    "Kind",
    "Scope",
    "check_content",
    "check_entry_id",
    "check_json_object",
    "check_kind",
    "check_path",
    "check_reason",
    "check_scope",
    "check_skill_arguments",
    "check_skill_reference",
    "check_text",
    "check_title",
    "slugify",
]

Kind = Literal["prompt", "memory", "skill", "subagent"]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
Scope = Literal["local", "global"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)

# The immutable base prompt's name: never an entry id, whatever the kind.
BASE_PROMPT_ID: Final = "base_system_prompt"

ENTRY_ID_MAX_CHARS: Final = 80
ENTRY_ID_RE: Final = re.compile(rf"[a-z0-9][a-z0-9_]{{0,{ENTRY_ID_MAX_CHARS - 1}}}")
TITLE_MAX_CHARS: Final = 200
CONTENT_MAX_CHARS: Final = 16_000
PATH_MAX_CHARS: Final = 200
REASON_MAX_CHARS: Final = 1_000
# reference / arguments / metadata, each measured as compact UTF-8 JSON.
JSON_FIELD_MAX_BYTES: Final = 16 * 1024

SKILL_REFERENCE_TYPE: Final = "python"
SKILL_REFERENCE_KEYS: Final = ("type", "import", "callable")
_SKILL_REFERENCE_SHAPE: Final = "{'type': 'python', 'import': module, 'callable': name}"

_SLUG_SEPARATORS: Final = re.compile(r"[^a-z0-9]+")
_LINE_BREAKS: Final = "\n\r\t"
# How much of a refused value a message quotes.
_QUOTE_CHARS: Final = 60
_CUT_MARK: Final = "…"


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + _CUT_MARK


def _type_name(value: object) -> str:
    return type(value).__name__


# --- names ----------------------------------------------------------------------------------


def slugify(title: str) -> str:
    """A title's default id: lower case, each run of other characters one ``_``, trimmed, at
    most ``ENTRY_ID_MAX_CHARS``. Empty when the title has no letter or digit (the caller says
    so: there is no id to derive)."""
    slug = _SLUG_SEPARATORS.sub("_", title.lower()).strip("_")
    return slug[:ENTRY_ID_MAX_CHARS].rstrip("_")


def check_entry_id(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"id must be a str, not {_type_name(value)}")
    if not ENTRY_ID_RE.fullmatch(value):
        raise ValueError(
            f"invalid entry id {_quote(value)}: use lower-case letters, digits and _ "
            f"(starting with a letter or digit, at most {ENTRY_ID_MAX_CHARS} characters)"
        )
    if value == BASE_PROMPT_ID:
        raise ValueError(f"{BASE_PROMPT_ID!r} is the immutable base prompt, not a harness entry")
    return value


def check_kind(value: object) -> Kind:
    if not isinstance(value, str):
        raise TypeError(f"kind must be a str, not {_type_name(value)}")
    for kind in KINDS:
        if value == kind:
            return kind
    raise ValueError(f"unknown harness kind {_quote(value)}: expected one of {', '.join(KINDS)}")


def check_scope(value: object) -> Scope:
    if not isinstance(value, str):
        raise TypeError(f"scope must be a str, not {_type_name(value)}")
    for scope in SCOPES:
        if value == scope:
            return scope
    raise ValueError(f"unknown scope {_quote(value)}: expected one of {', '.join(SCOPES)}")


# --- fields ---------------------------------------------------------------------------------


def check_text(what: str, value: object, max_chars: int, *, blank_ok: bool = False) -> str:
    """A string of at most ``max_chars`` that encodes as UTF-8; not blank unless ``blank_ok``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {_type_name(value)}")
    if not blank_ok and not value.strip():
        raise ValueError(f"{what} is empty")
    if len(value) > max_chars:
        raise ValueError(f"{what} is {len(value):,} characters; the limit is {max_chars:,}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid text (it has an unpaired surrogate)") from None
    return value


def check_title(value: object) -> str:
    return check_text("title", value, TITLE_MAX_CHARS)


def check_content(value: object) -> str:
    return check_text("content", value, CONTENT_MAX_CHARS)


def check_path(value: object) -> str:
    path = check_text("path", value, PATH_MAX_CHARS)
    if any(ch in path for ch in _LINE_BREAKS):
        raise ValueError("path must be one line")
    return path


def check_reason(value: object) -> str:
    return check_text("reason", value, REASON_MAX_CHARS, blank_ok=True)


def check_json_object(what: str, value: object) -> dict[str, Any]:
    """A JSON object of at most ``JSON_FIELD_MAX_BYTES`` (``reference``, ``arguments``,
    ``metadata``); returned as the JSON round trip, which is what gets stored (tuples become
    lists, and so on)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a JSON object (a dict), not {_type_name(value)}")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not plain JSON: {exc}") from None
    if size > JSON_FIELD_MAX_BYTES:
        raise ValueError(f"{what} is {size:,} bytes as JSON; the limit is {JSON_FIELD_MAX_BYTES:,}")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _is_identifier(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def check_skill_reference(value: object) -> dict[str, Any]:
    """``{"type": "python", "import": "pkg.module", "callable": "name"}``: the Python callable
    that implements a skill."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"a skill needs reference {_SKILL_REFERENCE_SHAPE}, not {_type_name(value)}"
        )
    reference = check_json_object("reference", value)
    unknown = sorted(key for key in reference if key not in SKILL_REFERENCE_KEYS)
    if unknown:
        raise ValueError(
            f"reference has unknown key(s) {', '.join(unknown)}; it is {_SKILL_REFERENCE_SHAPE}"
        )
    if reference.get("type") != SKILL_REFERENCE_TYPE:
        raise ValueError(
            f"reference type must be {SKILL_REFERENCE_TYPE!r}, not {_quote(reference.get('type'))}"
        )
    module = reference.get("import")
    if not isinstance(module, str) or not all(_is_identifier(p) for p in module.split(".")):
        raise ValueError(f"reference import must be a dotted module name, not {_quote(module)}")
    if not _is_identifier(reference.get("callable")):
        raise ValueError(
            "reference callable must be a Python identifier (a name in that module), "
            f"not {_quote(reference.get('callable'))}"
        )
    return reference


def check_skill_arguments(value: object) -> dict[str, Any]:
    """Each argument name of a skill mapped to its description (a string or a JSON object)."""
    arguments = check_json_object("arguments", value)
    if not arguments:
        raise ValueError(
            "arguments must name each argument of the skill, e.g. {'path': 'the file to read'}"
        )
    for name, spec in arguments.items():
        if not _is_identifier(name):
            raise ValueError(f"argument name {_quote(name)} is not a Python identifier")
        if not isinstance(spec, str | dict):
            raise ValueError(
                f"argument {name!r} must be described by a string or an object, "
                f"not {_type_name(spec)}"
            )
    return arguments
