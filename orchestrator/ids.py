"""Identifiers: session ids, sortable event ids, tool-call ids.

Ids are validated at every boundary and are safe to use as a single path component only after
``validate_session_id`` (R14).
"""

from __future__ import annotations

import os
import re
import threading
import time

__all__ = [
    "SESSION_ID_RE",
    "new_event_id",
    "new_session_id",
    "new_tool_call_id",
    "validate_session_id",
]

_B32 = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case
SESSION_ID_LEN = 12
SESSION_ID_RE = re.compile(rf"^s-[{_B32}]{{{SESSION_ID_LEN}}}$")
_EVENT_RANDOM_CHARS = 10
_TIME_CHARS = 10

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_B32[n & 31])
        n >>= 5
    return "".join(reversed(out))


def _random_b32(width: int) -> str:
    return _b32(int.from_bytes(os.urandom((width * 5 + 7) // 8), "big"), width)


def new_session_id() -> str:
    return "s-" + _random_b32(SESSION_ID_LEN)


def new_event_id() -> str:
    """ULID-like id: 48-bit millisecond time + monotonic counter within a millisecond.

    Sorting ids as strings sorts events by creation time within this process.
    """
    global _last_ms, _counter
    with _lock:
        now = int(time.time() * 1000)
        if now <= _last_ms:
            now = _last_ms
            _counter += 1
        else:
            _last_ms = now
            _counter = 0
        counter = _counter
    return _b32(now, _TIME_CHARS) + _b32(counter, 4) + _random_b32(_EVENT_RANDOM_CHARS - 4)


def new_tool_call_id() -> str:
    return "call_" + _random_b32(16)


def validate_session_id(value: str) -> str:
    if not isinstance(value, str) or not SESSION_ID_RE.match(value):
        from orchestrator.errors import UserError

        raise UserError(f"invalid session id {value[:80]!r}: expected s- followed by 12 characters")
    return value
