"""The idempotency journal: a mutating command runs once per (client_id, command_id).

A client that lost its connection after sending ``create_session`` cannot know whether the
daemon ran it; it reconnects with the same client id and sends the same command id again, and
gets the stored response instead of a second session. An entry is reserved *before* the handler
runs, holding a future, so a repeat that arrives while the first is still running waits for the
same answer instead of starting another run.

The journal is bounded (``JOURNAL_MAX_ENTRIES``, ``JOURNAL_TTL_S``) and, once ``open`` gave it a
file, persistent: every reservation and every answer is appended to that file (0600, in the
daemon's private runtime directory), and the next daemon loads it. So a repeat after a daemon
restart still gets the stored answer; and a command whose reservation is on disk but whose
answer is not (the daemon died while it ran) is answered ``shutting_down`` — "effect uncertain" —
never run a second time (docs/spec.md §4: never replay a side effect we are unsure about).

The file stays bounded: it is rewritten from the live entries whenever it passes
``JOURNAL_FILE_MAX_BYTES`` or holds more than twice ``max_entries`` records, and an answer larger
than ``JOURNAL_PERSIST_MAX_LINE_BYTES`` (mutating commands answer a few hundred bytes) is kept in
memory only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "JOURNAL_FILE_MAX_BYTES",
    "JOURNAL_FILE_MODE",
    "JOURNAL_FILE_NAME",
    "JOURNAL_MAX_ENTRIES",
    "JOURNAL_PERSIST_MAX_LINE_BYTES",
    "JOURNAL_TTL_S",
    "CommandJournal",
    "JournalEntry",
]

log = logging.getLogger(__name__)

JOURNAL_MAX_ENTRIES: Final = 4096
JOURNAL_TTL_S: Final = 15 * 60.0
# The daemon keeps its journal next to its socket, in the private runtime directory.
JOURNAL_FILE_NAME: Final = "journal.jsonl"
JOURNAL_FILE_MODE: Final = 0o600
# Past this size the file is rewritten from the live entries; a rewrite keeps the newest
# entries up to half of it, so appends do not trigger one rewrite after another.
JOURNAL_FILE_MAX_BYTES: Final = 16 * 1024 * 1024
# An answer longer than this is not written to disk (it would answer "effect uncertain" after
# a restart). Mutating commands answer a few hundred bytes.
JOURNAL_PERSIST_MAX_LINE_BYTES: Final = 64 * 1024
# A rewrite happens once the file holds this many times max_entries records.
_RECORDS_PER_ENTRY_BEFORE_REWRITE: Final = 2
_TMP_SUFFIX: Final = ".tmp"
_NEWLINE: Final = b"\n"

JournalKey = tuple[str, str]  # (client_id, command_id)
# Builds the answer for a command whose first run ended without one (the daemon stopped).
UncertainLine = Callable[[str], bytes]


@dataclass
class JournalEntry:
    fingerprint: str  # the command without its id: a reused id with other content is a conflict
    created: float  # the journal's clock (monotonic), for the TTL
    # The encoded response line, once the first run finished.
    result: asyncio.Future[bytes]
    wall: float = 0.0  # time.time() at reservation: what survives a restart


class CommandJournal:
    def __init__(
        self,
        *,
        max_entries: int = JOURNAL_MAX_ENTRIES,
        ttl_s: float = JOURNAL_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self._entries: OrderedDict[JournalKey, JournalEntry] = OrderedDict()
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._wall = wall_clock
        self.hits = 0
        self._path: Path | None = None
        self._fd: int | None = None
        self._file_bytes = 0
        self._file_records = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def path(self) -> Path | None:
        """The file the journal persists to, or None (memory only)."""
        return self._path if self._fd is not None else None

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
        """Record that ``key`` is about to run; the caller then calls ``complete``.

        With a file, the reservation is written before this returns, so a daemon that dies while
        the command runs leaves a trace that the next one answers as "effect uncertain".
        """
        entry = JournalEntry(
            fingerprint,
            self._clock(),
            asyncio.get_running_loop().create_future(),
            wall=self._wall(),
        )
        self._entries[key] = entry
        self._expire()
        self._append(_record(key, entry, None))
        return entry

    def complete(self, key: JournalKey, entry: JournalEntry, line: bytes) -> None:
        """Store the answer of ``key`` (waking repeats that wait for it) and persist it."""
        if not entry.result.done():
            entry.result.set_result(line)
        if len(line) > JOURNAL_PERSIST_MAX_LINE_BYTES:
            log.warning(
                "journal: the answer to %s is %d bytes; kept in memory only", key[1], len(line)
            )
            return
        if self._entries.get(key) is entry:
            self._append(_record(key, entry, line))

    # ---------------------------------------------------------------------------- the file

    def open(self, path: Path, uncertain: UncertainLine) -> int:
        """Load ``path`` (the previous daemon's journal), then persist to it; the entry count.

        Entries past the TTL are dropped; a reservation without an answer gets
        ``uncertain(command_id)`` as its answer. The file is then rewritten with what was kept.
        A file that cannot be read or written leaves the journal in memory only (logged).
        """
        loop = asyncio.get_running_loop()
        now_wall, now = self._wall(), self._clock()
        for key, (fingerprint, wall, line) in _load(path).items():
            age = max(0.0, now_wall - wall)
            if age > self._ttl:
                continue
            entry = JournalEntry(fingerprint, now - age, loop.create_future(), wall=wall)
            entry.result.set_result(line if line is not None else uncertain(key[1]))
            self._entries[key] = entry
        self._expire()
        self._path = path
        self._rewrite()
        return len(self._entries)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _append(self, record: bytes) -> None:
        if self._fd is None:
            return
        try:
            # O_APPEND: one write() per record, so a crash leaves whole lines (and at most one
            # torn last line, which loading skips).
            os.write(self._fd, record)
        except OSError as exc:
            self._give_up(exc)
            return
        self._file_bytes += len(record)
        self._file_records += 1
        too_many = self._file_records > _RECORDS_PER_ENTRY_BEFORE_REWRITE * self._max
        if self._file_bytes > JOURNAL_FILE_MAX_BYTES or too_many:
            self._rewrite()

    def _rewrite(self) -> None:
        """Replace the file with the live entries, newest first up to half the byte bound."""
        path = self._path
        if path is None:
            return
        self.close()
        kept: list[bytes] = []
        budget = JOURNAL_FILE_MAX_BYTES // 2
        for key, entry in reversed(self._entries.items()):
            line = entry.result.result() if entry.result.done() else None
            if line is not None and len(line) > JOURNAL_PERSIST_MAX_LINE_BYTES:
                continue
            record = _record(key, entry, line)
            if len(record) > budget:
                break
            budget -= len(record)
            kept.append(record)
        data = b"".join(reversed(kept))
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fd = os.open(tmp, flags, JOURNAL_FILE_MODE)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            append = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            self._fd = os.open(path, append)
        except OSError as exc:
            self._give_up(exc)
            return
        self._file_bytes = len(data)
        self._file_records = len(kept)

    def _give_up(self, exc: OSError) -> None:
        log.warning("journal: cannot write %s (%s); keeping it in memory only", self._path, exc)
        self.close()
        self._path = None


def _record(key: JournalKey, entry: JournalEntry, line: bytes | None) -> bytes:
    body: dict[str, Any] = {"c": key[0], "i": key[1], "f": entry.fingerprint, "t": entry.wall}
    if line is not None:
        body["r"] = line.decode("utf-8", "replace").rstrip("\n")
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + _NEWLINE


def _load(path: Path) -> OrderedDict[JournalKey, tuple[str, float, bytes | None]]:
    """``key → (fingerprint, wall time, answer line or None)`` in reservation order."""
    out: OrderedDict[JournalKey, tuple[str, float, bytes | None]] = OrderedDict()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return out
    except OSError as exc:
        log.warning("journal: cannot read %s (%s); starting empty", path, exc)
        return out
    with os.fdopen(fd, "rb") as fh:
        # A file is never larger than the bound (we rewrite it); a foreign one is read only up
        # to it, from its end, so loading is bounded too.
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - JOURNAL_FILE_MAX_BYTES)
        fh.seek(start)
        data = fh.read(JOURNAL_FILE_MAX_BYTES)
    lines = data.split(_NEWLINE)
    if start > 0:
        lines = lines[1:]  # the first one is cut
    for raw in lines:
        parsed = _parse(raw)
        if parsed is None:
            continue  # blank, torn by a crash, or not ours
        key, fingerprint, wall, line = parsed
        previous = out.get(key)
        if previous is not None and line is None and previous[1] == wall:
            continue  # the same run's answer is never replaced by its reservation
        out[key] = (fingerprint, wall, line)
    # Reservation order (the TTL walk relies on it), whatever order the answers came in.
    return OrderedDict(sorted(out.items(), key=lambda item: item[1][1]))


def _parse(raw: bytes) -> tuple[JournalKey, str, float, bytes | None] | None:
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    client, command, fingerprint, wall = body.get("c"), body.get("i"), body.get("f"), body.get("t")
    answer = body.get("r")
    if not (isinstance(client, str) and isinstance(command, str) and isinstance(fingerprint, str)):
        return None
    if not isinstance(wall, int | float) or not (answer is None or isinstance(answer, str)):
        return None
    line = answer.encode() + _NEWLINE if answer is not None else None
    return (client, command), fingerprint, float(wall), line
