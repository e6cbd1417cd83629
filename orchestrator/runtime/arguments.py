"""Argument checks every in-kernel helper applies when it is *called* (stdlib only).

Each raises ``TypeError`` for an unknown keyword argument or a wrong type and
``InvalidArgument`` (a ``ValueError``) for a bad value, naming the call (``where``) first, so a
mistake shows before anything is awaited or sent. The host checks everything again; these only
give clearer, earlier errors. ``rlm.py``, ``messaging.py``, ``history.py``, ``harness.py``,
``refine.py``, ``goal.py`` and ``heartbeat.py`` share them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.runtime.errors import InvalidArgument

__all__ = [
    "MAX_NAME_CHARS",
    "check_int",
    "check_name",
    "check_timeout",
    "optional_text",
    "reject_unknown",
    "require_text",
]

MAX_NAME_CHARS = 64
# Unicode categories a name may not contain: control, format, surrogate, line/paragraph breaks.
_FORBIDDEN_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def reject_unknown(where: str, unknown: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """``TypeError`` naming the unsupported keyword arguments and the allowed ones."""
    if unknown:
        names = ", ".join(sorted(unknown))
        raise TypeError(
            f"{where}() got unsupported keyword argument(s): {names}; allowed: {', '.join(allowed)}"
        )


def require_text(where: str, what: str, value: object) -> str:
    """A non-empty (not only whitespace) ``str``."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {what} must be a str, not {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument(f"{where}: {what} is empty")
    return value


def optional_text(where: str, what: str, value: object) -> str | None:
    if value is None:
        return None
    return require_text(where, what, value).strip()


def check_name(where: str, value: object, what: str = "name") -> str:
    """A display name: trimmed, non-empty, at most 64 chars, no control characters."""
    name = require_text(where, what, value).strip()
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgument(
            f"{where}: {what} is {len(name)} characters; the limit is {MAX_NAME_CHARS}"
        )
    for ch in name:
        if unicodedata.category(ch) in _FORBIDDEN_NAME_CATEGORIES:
            raise InvalidArgument(f"{where}: {what} contains the control character {ch!r}")
    return name


def check_int(where: str, what: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: {what} must be an int, not {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise InvalidArgument(f"{where}: {what} must be {bound}, not {value}")
    return value


def check_timeout(where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidArgument(f"{where}: timeout must be a positive number of seconds")
    return float(value)
