"""Export a session as pi / Prime Agent session JSONL (version 3).

Line 1 is the session header; every event of the session (all branches, in ``seq`` order)
follows as one entry whose ``id``/``parentId`` rebuild the same tree. Conversational events
become ``message`` entries (user, assistant, toolResult) that pi puts into the model's context;
everything else becomes a ``custom`` entry (``customType`` ``prime-agent.<type>``), which pi
keeps but never sends to a model.

pi's entry ids are 8 hex characters. Ours are longer, so each is mapped to the first 8 hex
digits of its SHA-256: the same event always exports under the same id. A collision inside one
session (about 1 in 90 for a 10,000-event session) is resolved by rehashing with a counter, in
``seq`` order, so the mapping stays stable for a given database.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, TextIO

from orchestrator.errors import StoreError
from orchestrator.store.db import Store
from orchestrator.store.queries import EventRecord

__all__ = [
    "EXPORT_PAGE_SIZE",
    "JSONL_API",
    "JSONL_ID_HEX_CHARS",
    "JSONL_VERSION",
    "STOP_REASONS",
    "export_session_jsonl",
    "jsonl_entry",
]

JSONL_VERSION = 3
JSONL_ID_HEX_CHARS = 8
JSONL_API = "openai-completions"
CUSTOM_TYPE_PREFIX = "prime-agent."
TOOL_NAME = "ipython"
# Events are read in pages so a long session never sits in memory whole.
EXPORT_PAGE_SIZE = 1000
MS_PER_S = 1000

STOP_REASONS: dict[str, str] = {
    "stop": "stop",
    "tool_calls": "toolUse",
    "length": "length",
    "error": "error",
    "aborted": "aborted",
}


def _iso(ts: datetime) -> str:
    """``2024-12-03T14:00:00.000Z``: UTC, milliseconds, like pi writes them."""
    utc = ts.astimezone(UTC) if ts.tzinfo is not None else ts
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _ms(ts: datetime) -> int:
    aware = ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
    return int(aware.timestamp() * MS_PER_S)


class _IdMap:
    """Our event ids → 8-hex pi ids, unique within one export."""

    def __init__(self) -> None:
        self._by_event: dict[str, str] = {}
        self._taken: set[str] = set()

    def add(self, event_id: str) -> str:
        attempt = 0
        while True:
            seed = event_id if attempt == 0 else f"{event_id}#{attempt}"
            short = hashlib.sha256(seed.encode()).hexdigest()[:JSONL_ID_HEX_CHARS]
            if short not in self._taken:
                break
            attempt += 1
        self._taken.add(short)
        self._by_event[event_id] = short
        return short

    def get(self, event_id: str | None) -> str | None:
        return None if event_id is None else self._by_event.get(event_id)


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _arguments(raw: str) -> dict[str, Any]:
    # pi's toolCall.arguments is an object. A model may emit malformed JSON (R13); keep its
    # text rather than drop the call.
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return parsed if isinstance(parsed, dict) else {"_raw": raw}


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    u = usage or {}
    input_, output = int(u.get("input", 0)), int(u.get("output", 0))
    cache_read, cache_write = int(u.get("cache_read", 0)), int(u.get("cache_write", 0))
    cost = u.get("cost_usd")
    # pi has only numbers here; the per-kind split is not recorded, so it stays 0 and the
    # total carries the call's cost (0 when unknown: pi has no "unknown").
    return {
        "input": input_,
        "output": output,
        "cacheRead": cache_read,
        "cacheWrite": cache_write,
        "totalTokens": input_ + output + cache_read + cache_write,
        "cost": {
            "input": 0,
            "output": 0,
            "cacheRead": 0,
            "cacheWrite": 0,
            "total": float(cost) if cost is not None else 0,
        },
    }


def _message(event: EventRecord) -> dict[str, Any] | None:
    p = event.payload
    ts_ms = _ms(event.ts)
    if event.type == "user_message":
        return {"role": "user", "content": [_text_block(p["text"])], "timestamp": ts_ms}
    if event.type == "assistant_message":
        content: list[dict[str, Any]] = []
        if p.get("text"):
            content.append(_text_block(p["text"]))
        for call in p.get("tool_calls", []):
            content.append(
                {
                    "type": "toolCall",
                    "id": call["id"],
                    "name": call.get("name") or TOOL_NAME,
                    "arguments": _arguments(call.get("arguments", "")),
                }
            )
        return {
            "role": "assistant",
            "content": content,
            "api": JSONL_API,
            "provider": p.get("provider", ""),
            "model": p.get("model", ""),
            "usage": _usage(p.get("usage")),
            "stopReason": STOP_REASONS.get(p.get("stop_reason", "stop"), "stop"),
            "timestamp": ts_ms,
        }
    if event.type == "tool_result":
        return {
            "role": "toolResult",
            "toolCallId": p["tool_call_id"],
            "toolName": p.get("name") or TOOL_NAME,
            "content": [_text_block(p["text"])],
            "details": {
                k: p[k] for k in ("status", "duration_ms", "artifact", "kernel_restarted") if k in p
            },
            "isError": bool(p.get("is_error", False)),
            "timestamp": ts_ms,
        }
    return None


def jsonl_entry(event: EventRecord, entry_id: str, parent_id: str | None) -> dict[str, Any]:
    """The pi session entry for one event (without the header)."""
    base: dict[str, Any] = {
        "id": entry_id,
        "parentId": parent_id,
        "timestamp": _iso(event.ts),
    }
    message = _message(event)
    if message is not None:
        return {"type": "message", **base, "message": message}
    return {
        "type": "custom",
        **base,
        "customType": CUSTOM_TYPE_PREFIX + event.type,
        "data": event.payload,
    }


async def export_session_jsonl(store: Store, session_id: str, out: TextIO) -> int:
    """Write the session to ``out`` as pi session JSONL; return the number of entries.

    The count excludes the header line. Every ``parentId`` names an entry written earlier in
    the file (parents precede children in ``seq`` order); a parent that is not an event of this
    session is exported as ``null``.
    """
    session = await store.get_session(session_id)
    if session is None:
        raise StoreError(f"unknown session {session_id!r}")
    header = {
        "type": "session",
        "version": JSONL_VERSION,
        "id": session.id,
        "timestamp": _iso(session.created_at),
        "cwd": session.cwd,
    }
    out.write(json.dumps(header, ensure_ascii=False) + "\n")
    ids = _IdMap()
    count = 0
    after = 0
    while True:
        page = await store.events(session_id, after_seq=after, limit=EXPORT_PAGE_SIZE)
        for event in page:
            parent = ids.get(event.parent_event_id)
            entry = jsonl_entry(event, ids.add(event.id), parent)
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
            count += 1
        if len(page) < EXPORT_PAGE_SIZE:
            return count
        after = page[-1].seq
