"""Host requests ``history.*`` and ``compact.*`` from kernels (docs/spec.md §3, "Context and
history").

``history.search / get / tail`` read the caller's whole recorded history, compacted parts
included, from the store (the kernel never opens the database); every answer is bounded in
events and characters, and each event is shown as ``store/history_entries.py`` makes it an
entry. ``compact.run`` asks the caller's loop for a compaction at its next
step boundary; ``compact.status`` reports the context's size against the threshold. As for
every host request, the caller is the session whose NATS subject the request came on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from orchestrator.bus.router import HostRequestError
from orchestrator.sessions.compaction import SCHEDULED_NOTE
from orchestrator.sessions.live import LiveSession
from orchestrator.store.context_queries import (
    select_history_range,
    select_history_search,
    select_history_tail,
)
from orchestrator.store.db import Store
from orchestrator.store.history_entries import entry_of

__all__ = [
    "HISTORY_GET_MAX_EVENTS",
    "HISTORY_REPLY_MAX_CHARS",
    "HISTORY_SEARCH_LIMIT_MAX",
    "HISTORY_TAIL_MAX",
    "HistoryHost",
    "HistoryService",
]

HISTORY_SEARCH_LIMIT_MAX: Final = 100
HISTORY_TAIL_MAX: Final = 200
HISTORY_GET_MAX_EVENTS: Final = 200  # events per history.get answer (``more`` says if cut)
HISTORY_REPLY_MAX_CHARS: Final = 256 * 1024  # all entries of one answer together
SEARCH_TEXT_MAX_CHARS: Final = 1000
COMPACT_INSTRUCTIONS_MAX_CHARS: Final = 4000
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


class HistoryHost(Protocol):
    """What the handlers need from the orchestrator that owns the sessions (``Orchestrator``):
    the loaded sessions, to find the caller, and the store its history is read from."""

    @property
    def sessions(self) -> Mapping[str, LiveSession]: ...

    @property
    def store(self) -> Store: ...


class HistoryService:
    """The ``history.*`` and ``compact.*`` handlers over a ``HistoryHost``."""

    def __init__(self, orch: HistoryHost):
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
