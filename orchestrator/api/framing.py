"""JSON-lines framing with a hard cap: one UTF-8 JSON object per ``\\n``-terminated line.

The reader never holds more than ``MAX_LINE_BYTES`` plus one read chunk of a line, however long
the line a peer sends: past the cap it reports ``LINE_TOO_LONG`` once and then throws the rest
of that line away chunk by chunk until the next newline, after which framing is back in sync. A
100 MB line therefore costs the reader time, never memory, and the connection stays usable.

A line counts only when its newline arrives: bytes left over at EOF (a peer that died mid-line)
are dropped, so a truncated command is never executed.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from orchestrator.api.wire import E_PARSE_ERROR, E_RESULT_TOO_LARGE
from orchestrator.errors import ApiError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from orchestrator.api.messages import AnyServerMessage

__all__ = [
    "LINE_TOO_LONG",
    "MAX_LINE_BYTES",
    "READ_CHUNK_BYTES",
    "FrameError",
    "LineReader",
    "Overlong",
    "decode_line",
    "encode_command",
    "encode_message",
    "encode_object",
]

MAX_LINE_BYTES: Final = 1024 * 1024  # 1 MiB per line, in both directions
# How much one read asks the transport for; also the most a discarded line adds to memory.
READ_CHUNK_BYTES: Final = 64 * 1024
_NEWLINE: Final = b"\n"
_CR: Final = b"\r"


class Overlong(enum.Enum):
    """Marker type for a line that passed the cap (an enum so ``is`` checks type-narrow)."""

    LINE_TOO_LONG = "line_too_long"


LINE_TOO_LONG: Final = Overlong.LINE_TOO_LONG


class FrameError(ApiError):
    """A line that cannot be a message: bad UTF-8, bad JSON, not an object, or too large."""


class LineReader:
    """Reads capped lines from an ``asyncio.StreamReader``.

    ``read_line()`` returns the line without its ``\\n`` (and without one trailing ``\\r``),
    ``LINE_TOO_LONG`` once for a line over the cap, or ``None`` at EOF.
    """

    def __init__(self, reader: asyncio.StreamReader, *, max_line_bytes: int = MAX_LINE_BYTES):
        self._reader = reader
        self._max = max_line_bytes
        self._buf = bytearray()
        # Set after LINE_TOO_LONG: the rest of the current line is still to be thrown away.
        self._discarding = False
        self._eof = False
        # How far into _buf we already know there is no newline: a line built from many small
        # chunks is scanned once, not once per chunk.
        self._scanned = 0

    async def read_line(self) -> bytes | Overlong | None:
        while True:
            cut = self._buf.find(_NEWLINE, self._scanned)
            if self._discarding:
                if cut < 0:
                    self._buf.clear()
                else:
                    del self._buf[: cut + 1]
                    self._discarding = False
                self._scanned = 0
                if cut >= 0:
                    continue
            elif cut >= 0:
                self._scanned = 0
                if cut > self._max:
                    # The whole overlong line happened to arrive in one go.
                    del self._buf[: cut + 1]
                    return LINE_TOO_LONG
                line = bytes(self._buf[:cut])
                del self._buf[: cut + 1]
                return line[:-1] if line.endswith(_CR) else line
            elif len(self._buf) > self._max:
                self._buf.clear()
                self._scanned = 0
                self._discarding = True
                return LINE_TOO_LONG
            else:
                self._scanned = len(self._buf)
            if self._eof:
                self._buf.clear()
                return None
            chunk = await self._reader.read(READ_CHUNK_BYTES)
            if not chunk:
                self._eof = True
            else:
                self._buf += chunk

    def statistics(self) -> dict[str, int]:
        """Bytes currently buffered (tests use it to show a huge line is not held)."""
        return {"buffered_bytes": len(self._buf)}


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; Python's json accepts them by default.
    raise ValueError(f"{name} is not valid JSON")


def decode_line(line: bytes) -> dict[str, Any]:
    """Parse one line into a JSON object, or raise ``FrameError(parse_error)``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(E_PARSE_ERROR, f"line is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise FrameError(E_PARSE_ERROR, "JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad constants, int too long to convert
        raise FrameError(E_PARSE_ERROR, f"invalid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise FrameError(E_PARSE_ERROR, "a message must be a JSON object")
    return value


def _capped(data: bytes, what: str, max_line_bytes: int) -> bytes:
    """``data`` as a line, or ``FrameError(result_too_large)`` past the cap.

    The sender enforces the cap too: a line the peer would discard as ``line_too_long`` is
    better reported as what it is.
    """
    if len(data) > max_line_bytes:
        raise FrameError(
            E_RESULT_TOO_LARGE,
            f"{what} of {len(data)} bytes exceeds the {max_line_bytes}-byte line cap",
        )
    return data + _NEWLINE


def encode_message(message: AnyServerMessage, *, max_line_bytes: int = MAX_LINE_BYTES) -> bytes:
    """A message of the daemon's as a line (serialised by pydantic: a result may hold any value
    it knows how to write, a datetime say). Only the daemon sends these, so only it loads the
    models."""
    from orchestrator.api.protocol import server_message_adapter

    data = server_message_adapter.dump_json(message)
    return _capped(data, message.__class__.__name__, max_line_bytes)


def encode_object(
    body: Mapping[str, Any], what: str, *, max_line_bytes: int = MAX_LINE_BYTES
) -> bytes:
    """A JSON object as a line (``what`` names it in the error past the cap): how a client sends
    its hello and its commands, as plain data the daemon validates."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return _capped(data, what, max_line_bytes)


def encode_command(command: BaseModel, *, max_line_bytes: int = MAX_LINE_BYTES) -> bytes:
    """A command model as a line, leaving out the fields that hold their default value.

    The daemon fills defaults in, so the meaning is the same; and a daemon that predates an
    optional field (same protocol version, older install) only refuses a command that actually
    uses it, instead of every command of that type.
    """
    body = {
        "type": getattr(command, "type", None),
        **command.model_dump(mode="json", exclude_defaults=True),
    }
    return encode_object(body, command.__class__.__name__, max_line_bytes=max_line_bytes)
