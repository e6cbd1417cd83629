"""Host requests ``history.*`` and ``compact.*`` from kernels (docs/spec.md §3, "Context and
history").

``history.search / get / tail`` read the caller's whole recorded history, compacted parts
included, from the store (the kernel never opens the database); every answer is bounded in
events and characters. ``compact.run`` asks the caller's loop for a compaction at its next
step boundary; ``compact.status`` reports the context's size against the threshold. As for
every host request, the caller is the session whose NATS subject the request came on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from orchestrator.bus.router import HostRequestError
from orchestrator.sessions.compaction import SCHEDULED_NOTE
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.manager import Orchestrator
from orchestrator.store.context_queries import (
    select_history_range,
    select_history_search,
    select_history_tail,
)
from orchestrator.store.db import EventRecord

__all__ = [
    "HISTORY_GET_MAX_EVENTS",
    "HISTORY_REPLY_MAX_CHARS",
    "HISTORY_SEARCH_LIMIT_MAX",
    "HISTORY_TAIL_MAX",
    "HISTORY_TEXT_MAX_CHARS",
    "HistoryService",
    "entry_of",
]

HISTORY_SEARCH_LIMIT_MAX: Final = 100
HISTORY_TAIL_MAX: Final = 200
HISTORY_GET_MAX_EVENTS: Final = 200  # events per history.get answer (``more`` says if cut)
HISTORY_TEXT_MAX_CHARS: Final = 4000  # one entry's text (a search shows the part that matched)
HISTORY_REPLY_MAX_CHARS: Final = 256 * 1024  # all entries of one answer together
SEARCH_TEXT_MAX_CHARS: Final = 1000
COMPACT_INSTRUCTIONS_MAX_CHARS: Final = 4000
# A search hit's excerpt starts this share of the excerpt before the match.
MATCH_CONTEXT_SHARE: Final = 4
CUT_MARK: Final = "…"
NO_TURN: Final = "no turn is running: call it from a cell, or use /compact"

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


def _bad(message: str) -> HostRequestError:
    return HostRequestError("invalid_argument", message)


def _only(args: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(args) - allowed
    if unknown:
        raise _bad(f"unknown arguments: {', '.join(sorted(unknown))}")


def _int_arg(args: dict[str, Any], key: str, low: int, high: int | None = None) -> int:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{key} must be an int")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"at least {low}"
        raise _bad(f"{key} must be {bound}")
    return value


def _code(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    code = parsed.get("code") if isinstance(parsed, dict) else None
    return code if isinstance(code, str) else arguments


def _role_and_text(event: EventRecord) -> tuple[str, str]:
    p = event.payload
    if event.type == "user_message":
        source = str(p.get("source") or "user")
        if source == "agent":
            return "user", f"[message from {p.get('sender_label') or p.get('sender')}]\n{p['text']}"
        return ("user" if source in ("user", "parent") else source), str(p.get("text", ""))
    if event.type == "assistant_message":
        parts = [str(p.get("text") or "")] if p.get("text") else []
        if not p.get("fenced"):
            for call in p.get("tool_calls") or []:
                parts.append(f"[{call.get('name', 'tool')}]\n{_code(str(call.get('arguments')))}")
        return "assistant", "\n".join(parts)
    if event.type == "tool_result":
        return "tool", str(p.get("text", ""))
    if event.type in ("compaction", "branch_summary"):
        return "summary", str(p.get("summary", ""))
    if event.type == "error":
        return "error", f"{p.get('kind', '')}: {p.get('message', '')}"
    if event.type == "model_change":
        return "notice", f"model changed to {p.get('model')}"
    if event.type == "aborted":
        return "notice", f"aborted ({p.get('reason', '')})"
    return "notice", str(p.get("text", ""))


def _excerpt(text: str, match: str | None) -> tuple[str, bool]:
    if len(text) <= HISTORY_TEXT_MAX_CHARS:
        return text, False
    start = 0
    if match:
        found = text.lower().find(match.lower())
        if found > 0:
            start = max(0, found - HISTORY_TEXT_MAX_CHARS // MATCH_CONTEXT_SHARE)
    piece = text[start : start + HISTORY_TEXT_MAX_CHARS]
    head = CUT_MARK if start > 0 else ""
    tail = CUT_MARK if start + HISTORY_TEXT_MAX_CHARS < len(text) else ""
    return f"{head}{piece}{tail}", True


def entry_of(event: EventRecord, match: str | None = None) -> dict[str, Any]:
    """An event as ``history`` shows it (``HistoryEntry`` in the kernel)."""
    role, text = _role_and_text(event)
    shown, truncated = _excerpt(text, match)
    entry: dict[str, Any] = {
        "seq": event.seq,
        "id": event.id,
        "type": event.type,
        "role": role,
        "text": shown,
        "at": event.ts.isoformat(),
    }
    if truncated:
        entry["truncated"] = True
    return entry


def _bounded(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """At most ``HISTORY_REPLY_MAX_CHARS`` of text in one answer (always at least one)."""
    out: list[dict[str, Any]] = []
    used = 0
    for entry in entries:
        used += len(entry["text"])
        if out and used > HISTORY_REPLY_MAX_CHARS:
            return out, True
        out.append(entry)
    return out, False


class HistoryService:
    """The ``history.*`` and ``compact.*`` handlers over an ``Orchestrator``."""

    def __init__(self, orch: Orchestrator):
        self.orch = orch

    def handlers(self) -> dict[str, Handler]:
        return {
            "history.search": self.search,
            "history.get": self.get,
            "history.tail": self.tail,
            "compact.run": self.compact_run,
            "compact.status": self.compact_status,
        }

    def _caller(self, session_id: str) -> LiveSession:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted" or live.loop is None:
            raise HostRequestError("not_found", f"session {session_id} is not live here")
        return live

    # -- history ----------------------------------------------------------------------------

    async def search(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        _only(args, {"text", "limit"})
        text = args.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _bad("text must be a non-empty string")
        if len(text) > SEARCH_TEXT_MAX_CHARS:
            raise _bad(f"text must be at most {SEARCH_TEXT_MAX_CHARS} characters")
        limit = _int_arg(args, "limit", 1, HISTORY_SEARCH_LIMIT_MAX)
        events, total = await self.orch.store.read(
            lambda con: select_history_search(con, live.id, text, limit)
        )
        entries, _cut = _bounded([entry_of(e, text) for e in events])
        return {"entries": entries, "total": total}

    async def get(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        _only(args, {"from_seq", "to_seq"})
        low = _int_arg(args, "from_seq", 1)
        high = _int_arg(args, "to_seq", low)
        events = await self.orch.store.read(
            lambda con: select_history_range(con, live.id, low, high, HISTORY_GET_MAX_EVENTS + 1)
        )
        more = len(events) > HISTORY_GET_MAX_EVENTS
        entries, cut = _bounded([entry_of(e) for e in events[:HISTORY_GET_MAX_EVENTS]])
        return {"entries": entries, "more": more or cut}

    async def tail(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        _only(args, {"n"})
        count = _int_arg(args, "n", 1, HISTORY_TAIL_MAX)
        events = await self.orch.store.read(lambda con: select_history_tail(con, live.id, count))
        entries = [entry_of(e) for e in events]
        # Over the character budget, the newest entries win (a tail is about the end).
        kept, _cut = _bounded(entries[::-1])
        return {"entries": kept[::-1]}

    # -- compaction -------------------------------------------------------------------------

    async def compact_run(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        _only(args, {"instructions"})
        instructions = args.get("instructions")
        if instructions is not None and (
            not isinstance(instructions, str)
            or not instructions.strip()
            or len(instructions) > COMPACT_INSTRUCTIONS_MAX_CHARS
        ):
            raise _bad(
                f"instructions must be a non-empty string of at most "
                f"{COMPACT_INSTRUCTIONS_MAX_CHARS} characters"
            )
        loop = live.loop
        assert loop is not None
        if not loop.busy:
            return {"scheduled": False, "reason": NO_TURN}
        loop.compactor.request("requested", instructions)
        return {"scheduled": True, "note": SCHEDULED_NOTE}

    async def compact_status(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        _only(args, set())
        loop = live.loop
        assert loop is not None
        await loop.compactor.threshold()  # learns the model's window
        return loop.compactor.status()
