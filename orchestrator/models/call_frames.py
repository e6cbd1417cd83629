"""The frames between a daemon and its model-call workers (call_workers.py, call_worker.py).

A frame is two big-endian 32-bit lengths, a JSON header of the first length, and a body of
the second (raw bytes: a request's JSON body travels as it is, never escaped into the header).

Daemon → worker: ``{"id", "url", "headers", "idle_s", "deltas"}`` with the request body, or
``{"id", "cancel": true}``. Worker → daemon, body empty: ``{"id", "delta": text}`` (the text
the stream carried since the last delta frame), then one of ``{"id", "reply": {...}}`` or
``{"id", "failed": {...}}`` (an ``AttemptFailed``'s fields).
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any, Final

from orchestrator.call_records import ToolCall
from orchestrator.models.openai_stream import RawReply
from orchestrator.models.reply import AttemptFailed

__all__ = [
    "FRAME_MAX_BYTES",
    "decode_failure",
    "decode_reply",
    "encode_failure",
    "encode_frame",
    "encode_reply",
    "read_frame",
]

_LENGTHS: Final = struct.Struct(">II")
# A request body is the whole context; far above any model's window in bytes.
FRAME_MAX_BYTES: Final = 256 * 1024 * 1024


def encode_frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    header = json.dumps(head, separators=(",", ":")).encode()
    return _LENGTHS.pack(len(header), len(body)) + header + body


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """The next frame; ``asyncio.IncompleteReadError`` at the end of the stream."""
    head_size, body_size = _LENGTHS.unpack(await reader.readexactly(_LENGTHS.size))
    if head_size + body_size > FRAME_MAX_BYTES:
        raise ValueError(f"a frame of {head_size + body_size} bytes is over the limit")
    head = json.loads(await reader.readexactly(head_size))
    body = await reader.readexactly(body_size) if body_size else b""
    if not isinstance(head, dict):
        raise ValueError("a frame's header is not a JSON object")
    return head, body


def encode_reply(reply: RawReply) -> dict[str, Any]:
    return {
        "text": reply.text,
        "tool_calls": [[c.id, c.name, c.arguments] for c in reply.tool_calls],
        "finish": reply.finish,
        "usage": reply.usage,
        "thinking": reply.thinking,
    }


def decode_reply(fields: dict[str, Any]) -> RawReply:
    calls = [ToolCall(id=i, name=n, arguments=a) for i, n, a in fields["tool_calls"]]
    return RawReply(
        str(fields["text"]),
        calls,
        str(fields["finish"]),
        fields.get("usage"),
        str(fields.get("thinking") or ""),
    )


def encode_failure(exc: AttemptFailed) -> dict[str, Any]:
    return {
        "kind": exc.kind,
        "reason": exc.reason,
        "status": exc.status,
        "retry_after_s": exc.retry_after_s,
        "connected": exc.connected,
    }


def decode_failure(fields: dict[str, Any]) -> AttemptFailed:
    return AttemptFailed(
        fields["kind"],
        str(fields["reason"]),
        status=fields.get("status"),
        retry_after_s=fields.get("retry_after_s"),
        connected=bool(fields.get("connected", True)),
    )
