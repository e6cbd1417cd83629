"""Export a session as pi / Prime Agent session JSONL (version 3).

Line 1 is the session header; every event of the session (all branches, in ``seq`` order)
follows as one entry whose ``id``/``parentId`` rebuild the same tree. Conversational events
become ``message`` entries (user, assistant, toolResult) that pi puts into the model's context;
``branch_summary``, ``compaction`` and ``model_change`` events become pi's entries of those
names (a model ``provider/name`` splits into ``provider`` and ``modelId``); an entry kept from
an imported file (a ``custom`` event) is written back as it came; everything else becomes a
``custom`` entry (``customType`` ``prime-agent.<type>``), which pi keeps but never sends to a
model. What pi's shapes have no field for (who sent a user message, the fenced protocol, a
compaction's reason and pinned turn ...) rides in an extra ``primeAgent`` object, which pi
ignores and ``jsonl_parse`` reads back.

An imported event keeps the file's entry (``source_entry``, orchestrator/store/jsonl_parse.py):
it is written back as it was, under its own id (when no entry written before took it), and an
imported session's header is the file's (``sessions.imported_header``) with this version. So
import → export → import → export writes the same file twice, ids and session id included.

pi takes the last entry of a file as the leaf. When the session's leaf is not its newest event
(after a branch), one more entry follows: ``custom`` ``prime-agent.leaf`` whose parent is the
leaf, so pi resumes on the same path and ``jsonl_import`` restores the leaf (and drops it).

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

import duckdb

from orchestrator.errors import StoreError
from orchestrator.store.db import Store
from orchestrator.store.events import IMPORTED_ENTRY_TYPES
from orchestrator.store.queries import EventRecord

__all__ = [
    "CUSTOM_TYPE_PREFIX",
    "EXPORT_PAGE_SIZE",
    "JSONL_API",
    "JSONL_ID_HEX_CHARS",
    "JSONL_VERSION",
    "LEAF_MARKER",
    "PRIME_AGENT_KEY",
    "REFERENCE_FIELDS",
    "STOP_REASONS",
    "export_session_jsonl",
    "jsonl_entry",
    "pi_message",
]

JSONL_VERSION = 3
JSONL_ID_HEX_CHARS = 8
JSONL_API = "openai-completions"
CUSTOM_TYPE_PREFIX = "prime-agent."
LEAF_MARKER = CUSTOM_TYPE_PREFIX + "leaf"
PRIME_AGENT_KEY = "primeAgent"
# Entry fields that name another entry: mapped between pi ids and event ids both ways.
REFERENCE_FIELDS: tuple[str, ...] = ("firstKeptEntryId", "fromId", "targetId")
# User-message fields pi's message has no place for (kept under PRIME_AGENT_KEY when set).
_USER_EXTRAS: tuple[str, ...] = ("source", "sender", "sender_label", "message_id")
_DEFAULT_SOURCE = "user"
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
        self._events: set[str] = set()
        self._preferred: dict[str, str] = {}  # imported events: the id their file gave them

    def restrict(self, event_ids: set[str]) -> None:
        """The session's event ids: only these are mapped where a payload names an entry."""
        self._events = event_ids

    def known(self, event_id: str) -> bool:
        return event_id in self._events

    def prefer(self, preferred: dict[str, str]) -> None:
        """Event id → the entry id it had in an imported file: used when still free."""
        self._preferred = preferred

    def add(self, event_id: str) -> str:
        known = self._by_event.get(event_id)
        if known is not None:  # already named by a reference to it
            return known
        original = self._preferred.get(event_id)
        if original is not None and original not in self._taken:
            self._taken.add(original)
            self._by_event[event_id] = original
            return original
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


def _user_extras(p: dict[str, Any]) -> dict[str, Any]:
    extras = {k: p[k] for k in _USER_EXTRAS if p.get(k) is not None}
    if extras.get("source") == _DEFAULT_SOURCE:
        del extras["source"]
    return {PRIME_AGENT_KEY: extras} if extras else {}


def _message(event: EventRecord) -> dict[str, Any] | None:
    return pi_message(event.type, event.payload, _ms(event.ts))


def pi_message(kind: str, p: dict[str, Any], ts_ms: int) -> dict[str, Any] | None:
    """The pi ``AgentMessage`` of a user message, assistant message or tool result (None for
    any other event): what a session file's message entries and RPC mode's events carry.
    An imported message is the file's own (thinking blocks, costs and all)."""
    source = p.get("source_entry")
    if isinstance(source, dict) and isinstance(source.get("message"), dict):
        return dict(source["message"])
    if kind == "user_message":
        return {
            "role": "user",
            "content": [_text_block(p["text"])],
            "timestamp": ts_ms,
            **_user_extras(p),
        }
    if kind == "assistant_message":
        content: list[dict[str, Any]] = []
        if p.get("thinking"):
            content.append({"type": "thinking", "thinking": p["thinking"]})
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
            **({PRIME_AGENT_KEY: {"fenced": True}} if p.get("fenced") else {}),
        }
    if kind == "tool_result":
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


def _references(fields: dict[str, Any], ids: _IdMap | None) -> dict[str, Any]:
    """``fields`` with event ids in REFERENCE_FIELDS replaced by the entry ids they export as."""
    if ids is None:
        return fields
    out = dict(fields)
    for key in REFERENCE_FIELDS:
        value = out.get(key)
        if isinstance(value, str) and ids.known(value):
            out[key] = ids.add(value)
    return out


def _compaction_fields(p: dict[str, Any], ids: _IdMap | None) -> dict[str, Any]:
    """pi's compaction entry; what it has no field for goes under PRIME_AGENT_KEY."""
    refs = _references(
        {"firstKeptEntryId": p.get("first_kept_event_id"), "fromId": p.get("pinned_event_id")},
        ids,
    )
    fields: dict[str, Any] = {
        "summary": p["summary"],
        "firstKeptEntryId": refs["firstKeptEntryId"],
        "tokensBefore": p.get("tokens_before", 0),
        "details": {
            "readFiles": p.get("read_files") or [],
            "modifiedFiles": p.get("modified_files") or [],
        },
    }
    if p.get("instructions") is not None:
        fields["customInstructions"] = p["instructions"]
    fields[PRIME_AGENT_KEY] = {
        "tokensAfter": p.get("tokens_after", 0),
        "reason": p.get("reason"),
        "pinnedEntryId": refs["fromId"],
        "kernelNote": p.get("kernel_note"),
        "model": p.get("model"),
        "summarizedEvents": p.get("summarized_events", 0),
    }
    return fields


def jsonl_entry(
    event: EventRecord, entry_id: str, parent_id: str | None, ids: _IdMap | None = None
) -> dict[str, Any]:
    """The pi session entry for one event (without the header).

    ``ids`` maps event ids named inside a payload (a branch summary's ``fromId``, a kept
    entry's ``targetId`` ...) to entry ids; without it they are written as they are.
    """
    base: dict[str, Any] = {
        "id": entry_id,
        "parentId": parent_id,
        "timestamp": _iso(event.ts),
    }
    p = event.payload
    source = p.get("source_entry")
    if isinstance(source, dict) and event.type in IMPORTED_ENTRY_TYPES:
        # As the file had it; its references name the file's ids, which its entries keep.
        return {**source, "id": entry_id, "parentId": parent_id}
    if event.type == "branch_summary":
        entry: dict[str, Any] = {"type": "branch_summary", **base, "summary": p["summary"]}
        entry.update(_references({"fromId": p.get("from_event_id")}, ids))
        if p.get("details") is not None:
            entry["details"] = p["details"]
        return entry
    if event.type == "compaction":
        return {"type": "compaction", **base, **_compaction_fields(p, ids)}
    if event.type == "model_change":
        selector = str(p["model"])
        provider, _, model_id = selector.partition("/") if "/" in selector else ("", "", selector)
        entry = {"type": "model_change", **base, "provider": provider, "modelId": model_id}
        if p.get("previous") is not None:
            entry[PRIME_AGENT_KEY] = {"previous": p["previous"]}
        return entry
    if event.type == "custom":
        fields = {
            k: v
            for k, v in _references(p.get("fields") or {}, ids).items()
            if k not in ("type", "id", "parentId", "timestamp")
        }
        return {"type": p["entry_type"], **base, **fields}
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
    imported = await store.imported_header(session_id)
    header: dict[str, Any]
    if imported is not None:  # the file's header, in this file's version
        header = {"type": "session", "version": JSONL_VERSION, **imported}
        header["version"] = JSONL_VERSION
    else:
        header = {
            "type": "session",
            "version": JSONL_VERSION,
            "id": session.id,
            "timestamp": _iso(session.created_at),
            "cwd": session.cwd,
        }
        if session.forked_from is not None:  # pi names the file; we name the session
            header["parentSession"] = session.forked_from
    out.write(json.dumps(header, ensure_ascii=False) + "\n")
    ids = _IdMap()
    known, preferred = await store.read(lambda con: _event_ids(con, session_id))
    ids.restrict(known)
    ids.prefer(preferred)
    count = 0
    after = 0
    last: EventRecord | None = None
    while True:
        page = await store.events(session_id, after_seq=after, limit=EXPORT_PAGE_SIZE)
        for event in page:
            parent = ids.get(event.parent_event_id)
            entry = jsonl_entry(event, ids.add(event.id), parent, ids)
            out.write(json.dumps(entry, ensure_ascii=False) + "\n")
            count += 1
            last = event
        if len(page) < EXPORT_PAGE_SIZE:
            break
        after = page[-1].seq
    leaf = session.leaf_event_id
    if last is not None and leaf is not None and leaf != last.id and ids.known(leaf):
        marker: dict[str, Any] = {
            "type": "custom",
            "id": ids.add(f"{leaf}#{LEAF_MARKER}"),
            "parentId": ids.get(leaf),
            "timestamp": _iso(last.ts),
            "customType": LEAF_MARKER,
            "data": {},
        }
        out.write(json.dumps(marker, ensure_ascii=False) + "\n")
        count += 1
    return count


def _event_ids(con: duckdb.DuckDBPyConnection, session_id: str) -> tuple[set[str], dict[str, str]]:
    """The session's event ids, and for imported ones the entry id their file gave them."""
    rows = con.execute(
        "SELECT id, coalesce(json_extract_string(payload, '$.source_entry.id'), "
        "json_extract_string(payload, '$.entry_id')) FROM events "
        "WHERE session_id = $1",
        [session_id],
    ).fetchall()
    preferred = {str(row[0]): str(row[1]) for row in rows if row[1] is not None}
    return {str(row[0]) for row in rows}, preferred
