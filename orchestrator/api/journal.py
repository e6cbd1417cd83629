"""The idempotency journal: a mutating command runs once per (client_id, command_id).

A client that lost its connection after sending ``create_session`` cannot know whether the
daemon ran it; it reconnects with the same client id and sends the same command id again, and
gets the stored response instead of a second session. An entry is reserved *before* the handler
runs, holding a future, so a repeat that arrives while the first is still running waits for the
same answer instead of starting another run.

The journal is in memory and bounded (``JOURNAL_MAX_ENTRIES``, ``JOURNAL_TTL_S``): a repeat after a
daemon restart or outside the window runs again. The daemon should persist it (DuckDB) once it
owns sessions that outlive itself; the interface stays the same.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["JOURNAL_MAX_ENTRIES", "JOURNAL_TTL_S", "CommandJournal", "JournalEntry"]

JOURNAL_MAX_ENTRIES: Final = 4096
JOURNAL_TTL_S: Final = 15 * 60.0

JournalKey = tuple[str, str]  # (client_id, command_id)


@dataclass
class JournalEntry:
    fingerprint: str  # the command without its id: a reused id with other content is a conflict
    created: float
    # The encoded response line, once the first run finished.
    result: asyncio.Future[bytes]


class CommandJournal:
    def __init__(
        self,
        *,
        max_entries: int = JOURNAL_MAX_ENTRIES,
        ttl_s: float = JOURNAL_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._entries: OrderedDict[JournalKey, JournalEntry] = OrderedDict()
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        deadline = self._clock() - self._ttl
        # Insertion order is creation order, so expired entries are all at the front.
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.created >= deadline:
                break
            del self._entries[key]
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, key: JournalKey) -> JournalEntry | None:
        self._expire()
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
        return entry

    def reserve(self, key: JournalKey, fingerprint: str) -> JournalEntry:
        """Record that ``key`` is about to run; the caller sets ``entry.result`` when done."""
        entry = JournalEntry(fingerprint, self._clock(), asyncio.get_running_loop().create_future())
        self._entries[key] = entry
        self._expire()
        return entry
