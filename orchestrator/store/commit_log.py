"""The commit log: where an append becomes durable before it reaches DuckDB's tables.

A DuckDB transaction costs about 3.5 ms of writer CPU for a handful of rows (the bulk INSERT,
the leaf UPDATE and the commit), and a step makes two of them. Writing the same batch as one
line to an append-only file and ``fdatasync``-ing it costs well under a millisecond. So the
writer commits each batch here (``append``), acknowledges it, and moves the lines into the
tables later, many batches in one DuckDB transaction (``Store._ingest``); then the file is
emptied (``clear``). A process killed in between leaves lines that the next writable open
replays (``read``); replaying is idempotent because ``seq`` is per session and contiguous.

File format, one batch per line: ``<crc32 as 8 hex digits> <JSON array of rows>\\n``. A line
whose checksum or shape is wrong is a torn write that nobody was told about (its fdatasync never
returned) and is skipped. An event row (a JSON array) carries everything the INSERTs need, the
payload as JSON text; a status row (a JSON object) is a loaded session's new lifecycle state
(``Store.set_status``), which a turn changes twice and which therefore rides the same cheap
commit instead of a DuckDB transaction of its own.

Invariant (``_good_size``): the first ``_good_size`` bytes of the file are whole, checksummed
lines, every one acknowledged; each new line is written at exactly that offset, so the bytes
of a failed write are overwritten by the next one and never glue onto an acknowledged line.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

__all__ = [
    "COMMIT_LOG_SUFFIX",
    "CommitLog",
    "LoggedEntry",
    "LoggedRow",
    "LoggedStatus",
    "commit_log_path",
    "has_pending",
]

# Next to the database file: ``state.duckdb`` -> ``state.duckdb.commits``.
COMMIT_LOG_SUFFIX: Final = ".commits"
# Owner-only, like the database: the rows are conversations.
COMMIT_LOG_FILE_MODE: Final = 0o600
_CRC_HEX_DIGITS: Final = 8
_ROW_FIELDS: Final = 8
_STATUS_FIELDS: Final = frozenset({"session_id", "status", "ts"})


def commit_log_path(database: Path) -> Path:
    return database.with_name(database.name + COMMIT_LOG_SUFFIX)


@dataclass(frozen=True)
class LoggedRow:
    """One committed event, as the commit log holds it until it is in the tables."""

    session_id: str
    root_id: str
    seq: int
    id: str
    parent_event_id: str | None
    type: str
    ts: datetime  # naive UTC, as the tables store it
    payload_json: str

    def encode(self) -> list[Any]:
        return [
            self.session_id,
            self.root_id,
            self.seq,
            self.id,
            self.parent_event_id,
            self.type,
            self.ts.isoformat(),
            self.payload_json,
        ]

    @classmethod
    def decode(cls, row: Any) -> LoggedRow | None:
        """The row, or ``None`` when it is not one (a damaged line)."""
        if not isinstance(row, list) or len(row) != _ROW_FIELDS:
            return None
        session_id, root_id, seq, event_id, parent, type_, ts, payload = row
        strings = (session_id, root_id, event_id, type_, ts, payload)
        if not all(isinstance(s, str) for s in strings) or not isinstance(seq, int):
            return None
        if parent is not None and not isinstance(parent, str):
            return None
        try:
            stamp = datetime.fromisoformat(ts)
        except ValueError:
            return None
        return cls(session_id, root_id, seq, event_id, parent, type_, stamp, payload)


@dataclass(frozen=True)
class LoggedStatus:
    """A session's new ``status``, as the commit log holds it until it is in the tables.

    Applied only over an older row (``updated_at <= ts``): a status line replayed after a
    direct ``update_session`` (possible only when emptying the log failed) does not undo it.
    """

    session_id: str
    status: str
    ts: datetime  # naive UTC, as the tables store it

    def encode(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "status": self.status, "ts": self.ts.isoformat()}

    @classmethod
    def decode(cls, row: Any) -> LoggedStatus | None:
        """The status change, or ``None`` when it is not one (a damaged line)."""
        if not isinstance(row, dict) or set(row) != _STATUS_FIELDS:
            return None
        session_id, status, ts = row["session_id"], row["status"], row["ts"]
        if not all(isinstance(s, str) for s in (session_id, status, ts)):
            return None
        try:
            return cls(session_id, status, datetime.fromisoformat(ts))
        except ValueError:
            return None


LoggedEntry = LoggedRow | LoggedStatus


def _decode(row: Any) -> LoggedEntry | None:
    return LoggedStatus.decode(row) if isinstance(row, dict) else LoggedRow.decode(row)


def _line(rows: list[LoggedEntry]) -> bytes:
    body = json.dumps([r.encode() for r in rows], ensure_ascii=False, separators=(",", ":"))
    data = body.encode("utf-8")
    return b"%08x %s\n" % (zlib.crc32(data), data)


def _parse(line: bytes) -> list[LoggedEntry] | None:
    head, _, data = line.partition(b" ")
    if len(head) != _CRC_HEX_DIGITS:
        return None
    try:
        if int(head, 16) != zlib.crc32(data):
            return None
        rows = json.loads(data)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    decoded = [_decode(r) for r in rows]
    if any(r is None for r in decoded):
        return None
    return [r for r in decoded if r is not None]


class CommitLog:
    """The open commit log of one writable database; used on the writer thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        created = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, COMMIT_LOG_FILE_MODE)
        os.fchmod(self._fd, COMMIT_LOG_FILE_MODE)
        if created:
            # The file's name must survive a crash too, or its first lines go with it.
            _sync_directory(path.parent)
        self._good_size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        return self._good_size

    def read(self) -> list[list[LoggedEntry]]:
        """Every whole batch in the file, oldest first; damaged lines are left out."""
        with open(self.path, "rb") as f:
            data = f.read()
        batches = []
        for line in data.split(b"\n")[:-1]:  # the part after the last newline is torn
            rows = _parse(line)
            if rows:
                batches.append(rows)
        return batches

    def append(
        self, rows: list[LoggedEntry], before_sync: Callable[[], None] | None = None
    ) -> None:
        """Write one batch and fdatasync it; on return it is durable. Raises ``OSError``."""
        line = _line(rows)
        offset = self._good_size
        try:
            written = 0
            while written < len(line):
                written += os.pwrite(self._fd, line[written:], offset + written)
            if before_sync is not None:
                before_sync()
            os.fdatasync(self._fd)
        except BaseException:
            # Best effort: the next write starts at _good_size in any case.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, offset)
            raise
        self._good_size = offset + len(line)

    def clear(self) -> None:
        """Empty the file: every line in it is in the tables now. Raises ``OSError``.

        Not synced: if the emptying is lost in a crash, the next open replays lines that are
        already in the tables, and replay skips those.
        """
        os.ftruncate(self._fd, 0)
        self._good_size = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def has_pending(database: Path) -> bool:
    """Whether a commit log with lines sits next to ``database`` (a killed writer's)."""
    try:
        return commit_log_path(database).stat().st_size > 0
    except OSError:
        return False


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
