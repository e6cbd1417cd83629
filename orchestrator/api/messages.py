"""What the daemon sends a client: one frozen dataclass per message type, and their decoder.

They are plain dataclasses so that both sides share one definition without the client loading
pydantic: the daemon validates and serialises them through pydantic (``protocol.py`` builds its
``server_message_adapter`` over these classes), while the client decodes a line with
``decode_server_message`` below, which needs only the standard library. A plain ``prime-agent
-p`` therefore talks to the daemon without importing pydantic (docs/cli.md, "Start-up cost").

Decoding is lenient where the protocol says so (a field this client does not know is ignored,
so a newer daemon may add some) and strict about the fields it knows: a missing one or one of
the wrong JSON kind is a ``ValueError``, and the client drops that line as unreadable.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = [
    "AnyServerMessage",
    "ErrorInfo",
    "ErrorMessage",
    "Event",
    "Response",
    "Resync",
    "Stream",
    "Welcome",
    "decode_server_message",
]

JsonObject = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Welcome:
    """The server's answer to a compatible `hello`; `capabilities` is the negotiated set."""

    type: Literal["welcome"] = "welcome"
    protocol_version: int
    server_version: str
    capabilities: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ErrorInfo:
    code: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Response:
    """The answer to one command, matched by `command_id`; `ok` ⇔ no `error`."""

    type: Literal["response"] = "response"
    command_id: str
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None

    def __post_init__(self) -> None:
        if self.ok == (self.error is not None):
            raise ValueError("a response has an error exactly when ok is false")


@dataclass(frozen=True, kw_only=True)
class Event:
    """A session event pushed to attached clients; `cursor` increases per session."""

    type: Literal["event"] = "event"
    session: str
    cursor: int
    event: JsonObject


@dataclass(frozen=True, kw_only=True)
class Resync:
    """Events for `session` were dropped because the client fell behind.

    With a `snapshot`, it is the session's state up to `cursor`: replace local state with it and
    drop later events whose cursor is not above `cursor`. Without one, re-`attach` with the last
    cursor applied to get a replay.
    """

    type: Literal["resync"] = "resync"
    session: str
    cursor: int | None = None
    snapshot: JsonObject | None = None


@dataclass(frozen=True, kw_only=True)
class Stream:
    """A transient event of ``session`` (``STREAM_EVENT_TYPES``: a text delta, a tool call
    starting, a compaction starting) for clients that negotiated ``stream``. Never stored, no
    cursor of its own: a client that falls behind loses them, and the next durable event is the
    truth. ``after`` is the cursor of the session's newest durable event when it was emitted
    (None when the daemon knows none): a client that has applied a later cursor (its replay
    already holds the message these deltas were building) drops it."""

    type: Literal["stream"] = "stream"
    session: str
    event: JsonObject
    after: int | None = None


@dataclass(frozen=True, kw_only=True)
class ErrorMessage:
    """A connection-level error, not tied to a command (bad line, refused handshake)."""

    type: Literal["error"] = "error"
    code: str
    message: str


AnyServerMessage = Welcome | Response | Event | Resync | Stream | ErrorMessage
_MESSAGE_CLASSES: tuple[type[AnyServerMessage], ...] = typing.get_args(AnyServerMessage)
_BY_TYPE: dict[str, type[AnyServerMessage]] = {
    str(cls.__dataclass_fields__["type"].default): cls for cls in _MESSAGE_CLASSES
}
# The field types of each class, resolved once (the annotations are strings until then).
_HINTS: dict[type[Any], dict[str, Any]] = {}


def decode_server_message(obj: Mapping[str, Any]) -> AnyServerMessage:
    """The message a decoded line holds; ``ValueError`` when it is none this client reads."""
    cls = _BY_TYPE.get(str(obj.get("type")))
    if cls is None:
        raise ValueError(f"unknown message type {obj.get('type')!r}")
    return _build(cls, obj)


def _build(cls: type[T], obj: Mapping[str, Any]) -> T:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in obj:
            values[f.name] = _checked(obj[f.name], hints[f.name], f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{f.name} is missing")
    return cls(**values)


def _checked(value: Any, hint: Any, name: str) -> Any:
    """``value`` as the field ``name`` of type ``hint`` holds it, or ``ValueError``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        for option in typing.get_args(hint):
            try:
                return _checked(value, option, name)
            except ValueError:
                continue
    elif origin is Literal:
        if value in typing.get_args(hint):
            return value
    elif origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(value, list):
            return [_checked(v, item, name) for v in value]
    elif origin is dict:
        if isinstance(value, dict):
            return value
    elif hint is type(None):
        if value is None:
            return value
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, dict):
            return _build(hint, value)
    elif isinstance(value, hint) and not (isinstance(value, bool) and hint is not bool):
        return value
    raise ValueError(f"{name}: {value!r} is not a {hint}"[:200])
