"""``history`` and ``compact``: the session's full record and its compaction (in the kernel).

Compaction replaces the older part of the model's context with a summary; nothing is deleted,
and ``history`` reads all of it back, compacted parts included. The orchestrator answers from
its database over NATS (the kernel never opens it) and bounds every answer.

Wire shapes (``args`` -> ``result``):

- ``history.search``: ``{text, limit}`` -> ``{entries: [entry], total}``, newest first
- ``history.get``: ``{from_seq, to_seq}`` -> ``{entries: [entry], more}``, oldest first
- ``history.tail``: ``{n}`` -> ``{entries: [entry]}``, oldest first
- ``compact.run``: ``{instructions?}`` -> ``{scheduled, note?, reason?}``
- ``compact.status``: ``{}`` -> ``{tokens, context_window?, threshold?, percent?, scheduled,
  last?}``

An entry is ``{seq, id, type, role, text, at?, truncated?}``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.runtime.arguments import check_int, reject_unknown, require_text
from orchestrator.runtime.errors import InternalHostError, InvalidArgument
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_items, as_object, field_opt_str, field_str

__all__ = [
    "COMPACT_INSTRUCTIONS_MAX_CHARS",
    "HISTORY_SEARCH_DEFAULT_LIMIT",
    "HISTORY_TAIL_DEFAULT",
    "Compact",
    "CompactRequest",
    "CompactStatus",
    "History",
    "HistoryEntry",
    "HistoryResults",
    "compact",
    "history",
]

HISTORY_SEARCH_DEFAULT_LIMIT = 20
HISTORY_TAIL_DEFAULT = 20
HISTORY_MIN = 1  # limits and counts must be positive; the host sets the upper bounds
FIRST_SEQ = 1
COMPACT_INSTRUCTIONS_MAX_CHARS = 4000


def _int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class HistoryEntry:
    """One recorded event: ``seq`` orders the session's events (``history.get`` takes it);
    ``text`` is cut to the host's limit when ``truncated``."""

    seq: int
    id: str
    type: str
    role: str
    text: str
    at: str | None = None
    truncated: bool = False

    @classmethod
    def from_wire(cls, value: object, where: str) -> HistoryEntry:
        obj = as_object(value, where)
        seq = _int(obj, "seq")
        if seq is None:
            raise InternalHostError(f"the orchestrator's reply to {where} has no 'seq'")
        return cls(
            seq=seq,
            id=field_str(obj, "id", where),
            type=field_str(obj, "type", where),
            role=field_str(obj, "role", where),
            text=field_str(obj, "text", where),
            at=field_opt_str(obj, "at"),
            truncated=obj.get("truncated") is True,
        )

    def __str__(self) -> str:
        return f"#{self.seq} [{self.role}] {self.text}"


class HistoryResults(list[HistoryEntry]):
    """The entries of one answer (a list), with ``total`` (search: all matches) and ``more``
    (get: the range had more than one answer holds; ask again from the next ``seq``)."""

    total: int
    more: bool

    def __init__(self, entries: list[HistoryEntry], *, total: int, more: bool = False):
        super().__init__(entries)
        self.total = total
        self.more = more


@dataclass(frozen=True)
class CompactRequest:
    """``compact.run``: ``scheduled`` (at the next step boundary) or not, and why."""

    scheduled: bool
    note: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class CompactStatus:
    """The context's size now (``tokens``), the model's window, the compaction threshold."""

    tokens: int
    context_window: int | None
    threshold: int | None
    percent: float | None
    scheduled: bool
    last: dict[str, Any] | None = None


def _results(result: object, where: str) -> HistoryResults:
    entries = [HistoryEntry.from_wire(e, where) for e in as_items(result, "entries", where)]
    obj = result if isinstance(result, dict) else {}
    total = _int(obj, "total")
    return HistoryResults(
        entries, total=len(entries) if total is None else total, more=obj.get("more") is True
    )


class History(HostBound):
    """The session's full history: ``search(text)``, ``get(from_seq, to_seq)``, ``tail(n)``."""

    def __repr__(self) -> str:
        return (
            "<history: await history.search(text, limit=20) -> newest matches first; "
            "await history.get(from_seq, to_seq); await history.tail(n=20) -> [HistoryEntry]>"
        )

    def search(
        self, text: str, limit: int = HISTORY_SEARCH_DEFAULT_LIMIT, **unknown: Any
    ) -> Coroutine[Any, Any, HistoryResults]:
        """Events whose text or cell code contains ``text`` (case-insensitive), newest first.
        ``.total`` counts every match."""
        where = "history.search"
        reject_unknown(where, unknown, ("limit",))
        args = {
            "text": require_text(where, "text", text),
            "limit": check_int(where, "limit", limit, HISTORY_MIN),
        }
        return self._ask(where, args)

    def get(
        self, from_seq: int, to_seq: int, **unknown: Any
    ) -> Coroutine[Any, Any, HistoryResults]:
        """Events with ``from_seq <= seq <= to_seq``, oldest first (``.more``: the range holds
        more than one answer carries; continue after the last ``seq``)."""
        where = "history.get"
        reject_unknown(where, unknown, ())
        low = check_int(where, "from_seq", from_seq, FIRST_SEQ)
        high = check_int(where, "to_seq", to_seq, FIRST_SEQ)
        if high < low:
            raise InvalidArgument(f"{where}: to_seq ({high}) is before from_seq ({low})")
        return self._ask(where, {"from_seq": low, "to_seq": high})

    def tail(
        self, n: int = HISTORY_TAIL_DEFAULT, **unknown: Any
    ) -> Coroutine[Any, Any, HistoryResults]:
        """The newest ``n`` events, oldest first."""
        where = "history.tail"
        reject_unknown(where, unknown, ())
        return self._ask(where, {"n": check_int(where, "n", n, HISTORY_MIN)})

    async def _ask(self, where: str, args: dict[str, Any]) -> HistoryResults:
        return _results(await self._client().request(where, args), where)


class Compact(HostBound):
    """``await compact.run(instructions=None)`` and ``await compact.status()``."""

    def __repr__(self) -> str:
        return (
            "<compact: await compact.run(instructions=None) -> CompactRequest (compacts at the "
            "next step boundary); await compact.status() -> CompactStatus>"
        )

    def run(
        self, instructions: str | None = None, **unknown: Any
    ) -> Coroutine[Any, Any, CompactRequest]:
        """Ask for a compaction of this session's context once the running cell ends; the
        turn then carries on. ``instructions`` say what the summary must keep."""
        where = "compact.run"
        reject_unknown(where, unknown, ("instructions",))
        args: dict[str, Any] = {}
        if instructions is not None:
            text = require_text(where, "instructions", instructions).strip()
            if len(text) > COMPACT_INSTRUCTIONS_MAX_CHARS:
                raise InvalidArgument(
                    f"{where}: instructions are {len(text)} characters; the limit is "
                    f"{COMPACT_INSTRUCTIONS_MAX_CHARS}"
                )
            args["instructions"] = text
        return self._run(args)

    async def _run(self, args: dict[str, Any]) -> CompactRequest:
        where = "compact.run"
        obj = as_object(await self._client().request(where, args), where)
        return CompactRequest(
            scheduled=obj.get("scheduled") is True,
            note=field_opt_str(obj, "note"),
            reason=field_opt_str(obj, "reason"),
        )

    def status(self, **unknown: Any) -> Coroutine[Any, Any, CompactStatus]:
        """The context's size, the model's window and the compaction threshold."""
        reject_unknown("compact.status", unknown, ())
        return self._status()

    async def _status(self) -> CompactStatus:
        where = "compact.status"
        obj = as_object(await self._client().request(where, {}), where)
        last = obj.get("last")
        window = _int(obj, "context_window")
        return CompactStatus(
            tokens=_int(obj, "tokens") or 0,
            context_window=window,
            threshold=_int(obj, "threshold"),
            percent=_number(obj, "percent"),
            scheduled=obj.get("scheduled") is True,
            last=dict(last) if isinstance(last, dict) else None,
        )


history = History()
compact = Compact()
