"""The DuckDB store: one database file, one writer thread, group-committed appends.

Every DuckDB call runs on one dedicated thread that owns the connection, so the asyncio loop
never blocks on disk and DuckDB's connection is never shared between threads. Callers submit
jobs to a queue; the writer resolves each caller's future with ``loop.call_soon_threadsafe``.

Appends are group-committed: the writer takes every append that is waiting (those made in the
same loop iteration reach it together, those that arrived while the previous commit was
syncing, plus, when several sessions have been appending together, those that arrive within
``GROUP_COMMIT_WINDOW_S``) and commits them as ONE line of the commit log
(``store/commit_log.py``): one write and one ``fdatasync``. A caller's ``append`` returns only
after that (R1: acknowledged means durable), so a crash at any moment leaves either the whole
batch or none of it, and nobody was told about a row that is not on disk.

The committed rows reach DuckDB's tables later, many batches in one transaction (``_ingest``):
at the latest ``INGEST_DELAY_S`` after the oldest of them, at ``INGEST_MAX_ROWS`` or
``INGEST_MAX_BYTES``, and always before any other job (a read, a session update, close) runs,
so every read sees every append acknowledged before it was submitted. A writable open replays
what a killed process left in the log.

A failed commit (disk full, I/O error) fails only the futures of that batch with ``StoreError``;
the in-memory sequence counters and leaf pointers advance only after a successful commit, so the
next append of every session continues without a gap (R6).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import duckdb
from pydantic import BaseModel

from orchestrator.errors import PrimeAgentError, StoreError, StoreLocked
from orchestrator.ids import new_event_id, validate_session_id
from orchestrator.paths import ensure_private_dir
from orchestrator.store import queries, sandboxes
from orchestrator.store.commit_log import (
    CommitLog,
    LoggedEntry,
    LoggedRow,
    LoggedStatus,
    commit_log_path,
    has_pending,
)
from orchestrator.store.events import EVENT_PAYLOADS, EventType, UsagePayload
from orchestrator.store.leaves import repair_leaves
from orchestrator.store.migrate import check_readable, migrate
from orchestrator.store.opening import (
    claim_path as _claim_path,
)
from orchestrator.store.opening import (
    one_line as _one_line,
)
from orchestrator.store.opening import (
    release_path as _release_path,
)
from orchestrator.store.opening import (
    store_error as _store_error,
)
from orchestrator.store.opening import (
    translate_open_error as _translate_open_error,
)
from orchestrator.store.queries import (
    SESSION_STATUSES,
    EventRecord,
    SessionRecord,
    SessionStatus,
    UsageSummary,
    to_db_ts,
    utcnow,
)

__all__ = [
    "CURRENT_LEAF",
    "DATABASE_FILE_MODE",
    "GROUP_COMMIT_MAX_ROWS",
    "GROUP_COMMIT_WINDOW_S",
    "INGEST_DELAY_S",
    "INGEST_MAX_BYTES",
    "INGEST_MAX_ROWS",
    "LOGGED_TABLES",
    "UPDATABLE_SESSION_FIELDS",
    "EventRecord",
    "SessionRecord",
    "Store",
    "StoreStatistics",
    "UsageSummary",
]

# How long the writer keeps a batch open for more appends once it has seen appends arrive
# from several sessions (the previous batch touched more than one). A lone session never waits:
# it would only add this much latency to every append.
GROUP_COMMIT_WINDOW_S = 0.002
# Upper bound on rows in one transaction, so one huge burst cannot delay everyone's
# acknowledgement behind a single enormous commit.
GROUP_COMMIT_MAX_ROWS = 1000
# Committed rows wait in the commit log at most this long before one DuckDB transaction moves
# them into the tables (unless a read or other job needs them there first). Longer means fewer
# transactions per step under load; the rows are durable either way.
INGEST_DELAY_S = 0.2
# ... or until this many rows / payload bytes wait. That bounds the memory they hold, the size of
# one ingest, and the free disk space the tables need before a full disk's log can be emptied.
INGEST_MAX_ROWS = 2000
INGEST_MAX_BYTES = 1024 * 1024
# The database holds conversations (possibly secrets): owner-only, like the 0700 directory.
DATABASE_FILE_MODE = 0o600
WRITER_THREAD_NAME = "prime-agent-store-writer"
# DuckDB columns are BIGINT; a token count beyond it would fail the whole batch's INSERT.
_BIGINT_MAX = 2**63 - 1

UPDATABLE_SESSION_FIELDS: frozenset[str] = frozenset(
    {"name", "cwd", "model", "backend", "sandbox_ref", "status", "leaf_event_id", "budget_tokens"}
    | {"refine_enabled", "model_spec", "sandbox_policy"}
)

_T = TypeVar("_T")


class _Leaf(enum.Enum):
    CURRENT = "current-leaf"


CURRENT_LEAF: Final = _Leaf.CURRENT
"""Default ``parent_event_id`` of ``append``: the session's leaf at the moment of the write."""


@dataclass(frozen=True)
class StoreStatistics:
    """Counters of the writer thread (``Store.statistics()``), for tests, bench and doctor."""

    commits: int  # append batches committed (one commit-log line each)
    rows: int  # events committed by those batches
    failed_commits: int  # append batches that failed (their callers got StoreError)
    largest_batch: int  # most events in one committed batch
    queued: int  # jobs waiting for the writer right now
    ingests: int  # DuckDB transactions that moved committed rows from the log into the tables
    pending: int  # committed rows and status changes still only in the commit log
    calls: int  # other jobs run (reads, session updates, transactions)


# -- jobs ----------------------------------------------------------------------------------------


@dataclass
class _Job:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


@dataclass
class _Call(_Job):
    fn: Callable[[], Any]
    # False for a read of tables the commit log never writes (``read_side``): it runs without
    # first moving committed rows into the tables.
    needs_logged_rows: bool = True


@dataclass
class _Append(_Job):
    session_id: str
    type: EventType
    payload: dict[str, Any]
    payload_json: str
    usage: UsagePayload | None
    parent: str | _Leaf | None


@dataclass
class _StatusChange(_Job):
    """``set_status``: committed with the appends around it, applied to the row at ingest."""

    session_id: str
    status: str


_Logged = _Append | _StatusChange  # the jobs that commit to the log and ride one batch


@dataclass
class _Close(_Job):
    pass


@dataclass
class _SessionState:
    """What the writer caches per session; touched only on the writer thread."""

    root_id: str
    last_seq: int
    leaf: str | None


_Outcome = tuple[_Job, Any, BaseException | None]


def _settle_all(outcomes: list[_Outcome]) -> None:
    """Resolve futures on their own loops (called from the writer thread).

    One ``call_soon_threadsafe`` per loop for the whole list, not one per future: each call
    wakes the loop, and a loop woken 50 times per batch competes with the writer for the GIL
    while the writer is trying to start the next commit.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].loop, []).append(outcome)
    for loop, group in by_loop.items():
        # RuntimeError: the loop is closed, so nobody is waiting for these answers any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, group)


def _resolve(group: list[_Outcome]) -> None:
    for job, result, exc in group:
        if job.future.done():  # the caller was cancelled and stopped waiting
            continue
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)


def _settle(job: _Job, result: Any = None, exc: BaseException | None = None) -> None:
    _settle_all([(job, result, exc)])


def _clean_utf8(text: str) -> str:
    """Replace lone surrogates (from undecodable bytes) with U+FFFD.

    DuckDB rejects them, and one bad payload must not fail the other appends of its batch.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


# -- SQL of the append transaction ---------------------------------------------------------------

_INSERT_EVENTS = """
INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
SELECT unnest($1::VARCHAR[]), unnest($2::BIGINT[]), unnest($3::VARCHAR[]),
       unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), unnest($6::TIMESTAMP[]),
       unnest($7::VARCHAR[])::JSON
"""
_INSERT_USAGE = """
INSERT INTO usage (event_id, session_id, root_id, provider, model, input, output, cache_read,
                   cache_write, cost_usd, cost_known, latency_ms, ts)
SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), unnest($3::VARCHAR[]),
       unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), unnest($6::BIGINT[]),
       unnest($7::BIGINT[]), unnest($8::BIGINT[]), unnest($9::BIGINT[]),
       unnest($10::DOUBLE[]), unnest($11::BOOLEAN[]), unnest($12::DOUBLE[]),
       unnest($13::TIMESTAMP[])
"""
_UPDATE_LEAVES = """
UPDATE sessions SET leaf_event_id = u.leaf, updated_at = u.ts
FROM (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::VARCHAR[]) AS leaf,
             unnest($3::TIMESTAMP[]) AS ts) AS u
WHERE sessions.id = u.id
"""
# The common case (one session in the batch) as a plain UPDATE: measured about half the cost of
# the join form above (1.0 ms vs 1.8 ms per statement).
_UPDATE_ONE_LEAF = "UPDATE sessions SET leaf_event_id = $2, updated_at = $3 WHERE id = $1"
# The tables the commit log writes: a read of any other may skip the ingest (Store.read_side).
LOGGED_TABLES: Final = ("events", "usage", "sessions")
# Logged status changes (LoggedStatus): only over an older row, so a stale replayed line never
# undoes a later direct update_session.
_UPDATE_STATUSES = """
UPDATE sessions SET status = u.status, updated_at = u.ts
FROM (SELECT unnest($1::VARCHAR[]) AS id, unnest($2::VARCHAR[]) AS status,
             unnest($3::TIMESTAMP[]) AS ts) AS u
WHERE sessions.id = u.id AND sessions.updated_at <= u.ts
"""
_UPDATE_ONE_STATUS = (
    "UPDATE sessions SET status = $2, updated_at = $3 WHERE id = $1 AND updated_at <= $3"
)

_Unflushed = list[tuple[LoggedEntry, UsagePayload | None]]


def _atomically(
    con: duckdb.DuckDBPyConnection, fn: Callable[[duckdb.DuckDBPyConnection], _T]
) -> _T:
    """``fn(con)`` in one transaction: all of its writes commit, or none."""
    con.begin()
    try:
        result = fn(con)
        con.commit()
    except BaseException:
        # The failure may already have aborted the transaction.
        with contextlib.suppress(duckdb.Error):
            con.rollback()
        raise
    return result


def _write_rows(con: duckdb.DuckDBPyConnection, entries: _Unflushed) -> None:
    """Apply committed status changes (each session's last), then insert committed rows, their
    usage rows, and each session's new leaf (its last row)."""
    statuses = {e.session_id: e for e, _ in entries if isinstance(e, LoggedStatus)}
    if len(statuses) == 1:
        (one,) = statuses.values()
        con.execute(_UPDATE_ONE_STATUS, [one.session_id, one.status, one.ts])
    elif statuses:
        ids = sorted(statuses)
        con.execute(
            _UPDATE_STATUSES,
            [ids, [statuses[i].status for i in ids], [statuses[i].ts for i in ids]],
        )
    rows = [(e, u) for e, u in entries if isinstance(e, LoggedRow)]
    if rows:
        _insert_rows(con, rows)


def _insert_rows(
    con: duckdb.DuckDBPyConnection, rows: list[tuple[LoggedRow, UsagePayload | None]]
) -> None:
    # One Python list per column: DuckDB's fastest insert path from Python (docs/store.md,
    # "Appends and group commit").
    con.execute(
        _INSERT_EVENTS,
        [
            [r.session_id for r, _ in rows],
            [r.seq for r, _ in rows],
            [r.id for r, _ in rows],
            [r.parent_event_id for r, _ in rows],
            [r.type for r, _ in rows],
            [r.ts for r, _ in rows],
            [r.payload_json for r, _ in rows],
        ],
    )
    usage = [(u, r) for r, u in rows if u is not None]
    if usage:
        con.execute(
            _INSERT_USAGE,
            [
                [r.id for _, r in usage],
                [r.session_id for _, r in usage],
                [r.root_id for _, r in usage],
                [u.provider for u, _ in usage],
                [u.model for u, _ in usage],
                [u.input for u, _ in usage],
                [u.output for u, _ in usage],
                [u.cache_read for u, _ in usage],
                [u.cache_write for u, _ in usage],
                [u.cost_usd for u, _ in usage],
                [u.cost_usd is not None for u, _ in usage],
                [u.latency_ms for u, _ in usage],
                [r.ts for _, r in usage],
            ],
        )
    leaves = {r.session_id: r for r, _ in rows}  # every append moves its session's leaf to it
    if len(leaves) == 1:
        (last,) = leaves.values()
        con.execute(_UPDATE_ONE_LEAF, [last.session_id, last.id, last.ts])
        return
    sessions = sorted(leaves)
    con.execute(
        _UPDATE_LEAVES,
        [sessions, [leaves[s].id for s in sessions], [leaves[s].ts for s in sessions]],
    )


class Store:
    """The database of one daemon. Create with ``await Store.open(path)``; close when done.

    All methods are coroutines and may be called from any number of tasks; the jobs run in
    submission order on the writer thread, so a read sees every append acknowledged before it
    was submitted.
    """

    def __init__(self, path: Path, *, read_only: bool, _path_key: str) -> None:
        """Use ``Store.open``; this only wires up the (not yet started) writer thread."""
        self._path = path
        self._read_only = read_only
        self._path_key = _path_key
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        # Appends submitted during this loop iteration, not yet queued (``_submit``). Invariant:
        # non-empty only while a ``_release`` callback is scheduled on the first one's loop.
        self._held: list[_Logged] = []
        self._closing = False
        self._done = threading.Event()
        # Writer-thread state: nothing below is touched from the loop.
        self._con: duckdb.DuckDBPyConnection | None = None
        self._sessions: dict[str, _SessionState] = {}
        self._last_batch_sessions = 0
        self._log: CommitLog | None = None
        # Rows committed to the log and not yet in the tables, in commit order, with the usage
        # row each one adds. Invariant: each row's session is in ``_sessions`` (its counters are
        # ahead of the tables), or ``_con`` is None and the next ``_connect`` replays the log.
        self._unflushed: _Unflushed = []
        self._unflushed_bytes = 0
        self._unflushed_since = 0.0  # monotonic time of the oldest row in _unflushed
        # Test seam: called after a batch is written to the commit log, before its fdatasync;
        # raising from it simulates a disk error at the worst moment.
        self._before_commit: Callable[[], None] | None = None
        self._stats_lock = threading.Lock()
        self._commits = 0
        self._rows = 0
        self._failed_commits = 0
        self._largest_batch = 0
        self._ingests = 0
        self._calls = 0
        self._thread = threading.Thread(target=self._run, name=WRITER_THREAD_NAME, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path, *, read_only: bool = False) -> Store:
        """Open (creating and migrating unless ``read_only``) the database at ``path``.

        Raises ``StoreLocked`` when another process (or this one) holds the file, and
        ``StoreError`` for anything else that prevents opening it.
        """
        path = Path(path).expanduser().absolute()
        if read_only and not path.exists():
            raise StoreError(f"database {path} does not exist")
        if read_only and has_pending(path):
            # A killed writer left committed rows in the commit log; only a writable open can
            # move them into the tables. If another process holds the file, it has done so.
            with contextlib.suppress(StoreLocked):
                await (await cls.open(path)).close()
        if not read_only and not path.parent.exists():
            try:
                ensure_private_dir(path.parent)
            except OSError as exc:
                raise _store_error(f"cannot create {path.parent}: {_one_line(exc)}", exc) from exc
        store = cls(path, read_only=read_only, _path_key=_claim_path(path))
        store._thread.start()
        try:
            await store._call_raw(store._connect)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Commit every append submitted so far, then close the database. Idempotent."""
        loop = asyncio.get_running_loop()
        with self._submit_lock:
            first = not self._closing
            self._closing = True
            if first:
                self._release_held()
                future: asyncio.Future[Any] = loop.create_future()
                # Queued behind every job submitted before it: pending appends commit first.
                self._queue.put(_Close(loop, future))
        if first:
            await future
        elif not self._done.is_set():
            await asyncio.to_thread(self._done.wait)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    def statistics(self) -> StoreStatistics:
        with self._stats_lock:
            return StoreStatistics(
                commits=self._commits,
                rows=self._rows,
                failed_commits=self._failed_commits,
                largest_batch=self._largest_batch,
                queued=self._queue.qsize(),
                ingests=self._ingests,
                pending=len(self._unflushed),  # one read of a list's length: no lock needed
                calls=self._calls,
            )

    # -- sessions --------------------------------------------------------------------------------

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        self._check_writable()
        for sid in (record.id, record.root_id, record.parent_id):
            if sid is not None:
                validate_session_id(sid)
        if record.status not in SESSION_STATUSES:
            raise ValueError(f"unknown session status {record.status!r}")
        return await self._call(lambda con: self._insert_session(con, record))

    async def update_session(self, session_id: str, **fields: Any) -> SessionRecord:
        """Change some of ``UPDATABLE_SESSION_FIELDS``; ``updated_at`` is set to now.

        Setting ``leaf_event_id`` moves the session's leaf (a branch): later appends hang off
        that event. It must name an event of this session, or be ``None`` (next append is a
        new root).
        """
        self._check_writable()
        unknown = sorted(set(fields) - UPDATABLE_SESSION_FIELDS)
        if unknown:
            raise TypeError(
                f"update_session() cannot change {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(UPDATABLE_SESSION_FIELDS))}"
            )
        if "status" in fields and fields["status"] not in SESSION_STATUSES:
            raise ValueError(f"unknown session status {fields['status']!r}")
        return await self._call(lambda con: self._update_session(con, session_id, fields))

    async def set_status(self, session_id: str, status: SessionStatus) -> None:
        """Set a session's ``status``; return once it is committed (R1).

        The cheap way for a loaded session's state changes (two per turn): the change commits
        to the commit log with the appends around it and reaches the row at the next ingest,
        before any read, instead of costing a DuckDB transaction (and an early ingest) of its
        own. ``StoreError`` for an unknown session.
        """
        self._check_writable()
        if status not in SESSION_STATUSES:
            raise ValueError(f"unknown session status {status!r}")
        loop = asyncio.get_running_loop()
        job = _StatusChange(loop, loop.create_future(), session_id, status)
        self._submit(job)
        await job.future

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._call(lambda con: queries.select_session(con, session_id))

    async def list_sessions(self) -> list[SessionRecord]:
        return await self._call(queries.select_sessions)

    async def family_sessions(self, root_id: str) -> list[SessionRecord]:
        """The sessions of one tree, parents before children."""
        return await self._call(lambda con: queries.select_family(con, root_id))

    async def find_session(self, prefix_or_name: str) -> SessionRecord | None:
        """Unique id prefix or exact name; ``None`` if nothing matches, ``UserError`` if several."""
        return await self._call(lambda con: queries.find_session(con, prefix_or_name))

    # -- events ----------------------------------------------------------------------------------

    async def append(
        self,
        session_id: str,
        type: EventType,
        payload: BaseModel,
        *,
        parent_event_id: str | Literal[_Leaf.CURRENT] | None = CURRENT_LEAF,
    ) -> EventRecord:
        """Append one event; return it once it is COMMITTED.

        ``parent_event_id`` defaults to the session's leaf at the time of the write; ``None``
        starts a new root. The session's leaf moves to the new event in the same transaction.
        A ``usage`` event also writes its ``usage`` row in that transaction.

        If the caller is cancelled after submitting, the event may still be committed (it is
        then a valid record that nobody was told about); it is never half-written.
        """
        self._check_writable()
        expected = EVENT_PAYLOADS.get(type)
        if expected is None:
            raise ValueError(f"unknown event type {type!r}")
        if not isinstance(payload, expected):
            raise TypeError(
                f"a {type!r} event needs a {expected.__name__}, got {payload.__class__.__name__}"
            )
        usage = payload if isinstance(payload, UsagePayload) else None
        if usage is not None:
            for name in ("input", "output", "cache_read", "cache_write"):
                if not 0 <= getattr(usage, name) <= _BIGINT_MAX:
                    raise ValueError(f"usage.{name} out of range: {getattr(usage, name)}")
        dumped = payload.model_dump(mode="json")
        # Serialized here, per caller, so a payload DuckDB cannot take fails only its caller:
        # NaN/inf are not JSON (ValueError here), lone surrogates are replaced.
        text = _clean_utf8(json.dumps(dumped, ensure_ascii=False, allow_nan=False))
        loop = asyncio.get_running_loop()
        job = _Append(
            loop, loop.create_future(), session_id, type, dumped, text, usage, parent_event_id
        )
        self._submit(job)
        result: EventRecord = await job.future
        return result

    async def events(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        """Events of a session (every branch) in ``seq`` order, those after ``after_seq``."""
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return await self._call(
            lambda con: queries.select_events(con, session_id, after_seq, limit)
        )

    async def recent_events(self, session_id: str, limit: int) -> list[EventRecord]:
        """The newest ``limit`` events of a session (every branch), oldest first."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        return await self._call(lambda con: queries.select_recent_events(con, session_id, limit))

    async def get_event(self, event_id: str) -> EventRecord | None:
        return await self._call(lambda con: queries.select_event(con, event_id))

    async def recorded_message_ids(self, session_id: str, message_ids: list[str]) -> set[str]:
        """The subset of ``message_ids`` already recorded as user messages of the session."""
        ids = list(message_ids)
        return await self._call(
            lambda con: queries.select_recorded_message_ids(con, session_id, ids)
        )

    async def active_path(self, session_id: str) -> list[EventRecord]:
        """The events from the root to the session's leaf, root first."""
        return await self._call(lambda con: queries.select_active_path(con, session_id))

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        """Run ``fn(connection)`` on the writer thread and return its result: the way query
        modules outside this file (``context_queries``) read. ``fn`` must not write."""
        return await self._call(fn)

    async def read_side(self, fn: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        """``read`` for a table the commit log never writes (``LOGGED_TABLES`` are the ones it
        does): goals, autonomy, refinements... It skips the ingest that every other job waits
        for, so a turn's end, which checks those tables, no longer forces the rows of its last
        step into DuckDB one session at a time. ``fn`` must neither write nor read a logged
        table (it would miss committed rows still in the log)."""
        return await self._call_raw(lambda: fn(self._connection()), needs_logged_rows=False)

    async def transaction(
        self, fn: Callable[[duckdb.DuckDBPyConnection], _T], *, sessions: tuple[str, ...] = ()
    ) -> _T:
        """Run ``fn(connection)`` in one transaction: all of its writes commit, or none.

        ``sessions`` names existing sessions whose events or leaf ``fn`` changes: the writer's
        cached counters for them are dropped and reloaded from the database.
        """
        self._check_writable()
        return await self._call(lambda con: self._transaction(con, fn, sessions))

    def _transaction(
        self,
        con: duckdb.DuckDBPyConnection,
        fn: Callable[[duckdb.DuckDBPyConnection], _T],
        sessions: tuple[str, ...],
    ) -> _T:
        try:
            return _atomically(con, fn)
        finally:
            for session_id in sessions:
                self._sessions.pop(session_id, None)

    # -- sandboxes (adopted by the next daemon: orchestrator/sessions/adoption.py) ---------------

    async def put_sandbox(self, row: sandboxes.SandboxRow) -> None:
        self._check_writable()
        await self._call(lambda con: sandboxes.upsert_sandbox(con, row))

    async def delete_sandbox(self, backend: str, ref: str) -> None:
        self._check_writable()
        await self._call(lambda con: sandboxes.delete_sandbox(con, backend, ref))

    async def list_sandboxes(self) -> list[sandboxes.SandboxRow]:
        return await self._call(sandboxes.select_sandboxes)

    # -- usage -----------------------------------------------------------------------------------

    async def usage_summary(
        self, session_ids: list[str] | None = None, *, imported: bool = True
    ) -> list[UsageSummary]:
        """Per-session usage totals (all sessions when ``session_ids`` is None);
        ``imported=False``: without the calls an imported file brought (budgets)."""
        ids = None if session_ids is None else list(session_ids)
        return await self._call(
            lambda con: queries.select_usage_summary(con, ids, imported=imported)
        )

    async def imported_header(self, session_id: str) -> dict[str, Any] | None:
        """The header of the file ``session_id`` was imported from (None: not imported)."""
        return await self._call(lambda con: queries.select_imported_header(con, session_id))

    # -- submission (loop side) ------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._read_only:
            raise StoreError(f"database {self._path} was opened read-only")

    def _submit(self, job: _Job) -> None:
        # The lock makes "not closing" and "queued" one step: no job can land behind _Close,
        # where the finished writer would never answer it.
        with self._submit_lock:
            if self._closing:
                raise StoreError(f"database {self._path} is closed")
            if isinstance(job, _Logged):
                # Held until the loop's current iteration ends, so appends made together (a
                # step's assistant_message and usage, several sessions' steps) reach the writer
                # together and commit in one transaction.
                self._held.append(job)
                if len(self._held) == 1:
                    job.loop.call_soon(self._release)
                return
            self._release_held()  # order: a call submitted after appends runs after them
            self._queue.put(job)

    def _release(self) -> None:
        with self._submit_lock:
            self._release_held()

    def _release_held(self) -> None:
        """Queue the held appends, in submission order (``_submit_lock`` held)."""
        for job in self._held:
            self._queue.put(job)
        self._held.clear()

    async def _call_raw(self, fn: Callable[[], _T], *, needs_logged_rows: bool = True) -> _T:
        loop = asyncio.get_running_loop()
        job = _Call(loop, loop.create_future(), fn, needs_logged_rows)
        self._submit(job)
        result: _T = await job.future
        return result

    async def _call(self, fn: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        return await self._call_raw(lambda: fn(self._connection()))

    # -- writer thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        carry: _Job | None = None
        while True:
            job = carry if carry is not None else self._next_job()
            carry = None
            if isinstance(job, _Close):
                self._finish(job)
                return
            if isinstance(job, _Call):
                if not job.needs_logged_rows or self._flush_for(job):
                    self._run_call(job)
                continue
            assert isinstance(job, _Logged)
            batch: list[_Logged] = [job]
            carry = self._gather(batch)
            try:
                self._run_batch(batch)
            except BaseException as exc:  # a bug: answer everyone, keep the writer alive
                for req in batch:
                    _settle(req, exc=exc)
            if len(self._unflushed) >= INGEST_MAX_ROWS or self._unflushed_bytes >= INGEST_MAX_BYTES:
                self._try_ingest()

    def _next_job(self) -> _Job:
        """The next job; while committed rows wait for the tables, ingest them when due."""
        while True:
            if not self._unflushed:
                return self._queue.get()
            remaining = self._unflushed_since + INGEST_DELAY_S - time.monotonic()
            if remaining > 0:
                try:
                    return self._queue.get(timeout=remaining)
                except queue.Empty:
                    pass
            if not self._try_ingest():
                # The tables cannot take them now (disk full?): the rows are safe in the log;
                # try again after another delay rather than spinning.
                self._unflushed_since = time.monotonic()

    def _gather(self, batch: list[_Logged]) -> _Job | None:
        """Add waiting appends to ``batch``; return the first non-append job met, if any."""
        # Wait for stragglers only when several sessions have recently been appending together
        # (one session's own appends of a step arrive together: ``_submit``); see
        # GROUP_COMMIT_WINDOW_S.
        window = GROUP_COMMIT_WINDOW_S if self._last_batch_sessions > 1 else 0.0
        deadline = time.monotonic() + window
        while len(batch) < GROUP_COMMIT_MAX_ROWS:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    job = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if not isinstance(job, _Logged):
                # Ordering: a call or close submitted after these appends runs after them.
                return job
            batch.append(job)
        return None

    def _flush_for(self, job: _Call) -> bool:
        """Before a call runs, every committed row must be in the tables (a read sees every
        acknowledged append). False, with the job answered, when they cannot get there."""
        if not self._unflushed or self._try_ingest():
            return True
        pending = len(self._unflushed)
        _settle(
            job,
            exc=StoreError(
                f"database {self._path}: {pending} committed event(s) could not be moved from "
                f"the commit log into the tables ({self._last_ingest_error}); they are kept "
                "and moved when the database can be written again"
            ),
        )
        return False

    def _run_call(self, job: _Call) -> None:
        with self._stats_lock:
            self._calls += 1
        try:
            result = job.fn()
        except PrimeAgentError as exc:
            _settle(job, exc=exc)
        except duckdb.Error as exc:
            _settle(job, exc=_store_error(f"database {self._path}: {_one_line(exc)}", exc))
            self._recover()
        except BaseException as exc:
            _settle(job, exc=exc)
        else:
            _settle(job, result)

    def _finish(self, job: _Close) -> None:
        try:
            # Whatever cannot reach the tables now stays in the log for the next open.
            self._try_ingest()
            if self._con is not None:
                self._con.close()  # DuckDB checkpoints the WAL into the file here
        except duckdb.Error:
            pass  # everything acknowledged is already in the WAL or the log; the next open replays
        finally:
            self._con = None
            if self._log is not None:
                self._log.close()
                self._log = None
            _release_path(self._path_key)
            self._done.set()
            _settle(job)
        # Nothing can be queued behind _Close (see _submit), but answer anything that is.
        while True:
            try:
                stray = self._queue.get_nowait()
            except queue.Empty:
                break
            _settle(stray, exc=StoreError(f"database {self._path} is closed"))

    def _connect(self) -> None:
        try:
            con = duckdb.connect(str(self._path), read_only=self._read_only)
        except duckdb.Error as exc:
            raise _translate_open_error(self._path, exc) from exc
        try:
            if self._read_only:
                check_readable(con, self._path)
            else:
                migrate(con, self._path)
                self._replay(con)
                # A session with events but no leaf (docs/tree.md).
                repair_leaves(con)
                os.chmod(self._path, DATABASE_FILE_MODE)
        except BaseException:
            con.close()
            raise
        self._con = con

    def _replay(self, con: duckdb.DuckDBPyConnection) -> None:
        """Move what the commit log holds into the tables (rows a killed process, or a failed
        ingest, left there), skipping rows the tables have; then empty the log."""
        try:
            if self._log is None:
                self._log = CommitLog(commit_log_path(self._path))
            batches = self._log.read() if self._log.size else []
        except OSError as exc:
            raise _store_error(f"cannot read the commit log of {self._path}: {exc}", exc) from exc
        if batches:
            last_seq: dict[str, int] = {}
            rows: _Unflushed = []
            for row in (r for batch in batches for r in batch):
                if isinstance(row, LoggedStatus):
                    rows.append((row, None))  # applied only over an older row (_write_rows)
                    continue
                if row.session_id not in last_seq:
                    last_seq[row.session_id] = queries.session_cursor(con, row.session_id)[2]
                if row.seq <= last_seq[row.session_id]:
                    continue  # in the tables already (the log was not emptied after an ingest)
                last_seq[row.session_id] = row.seq
                usage = None
                if row.type == "usage":
                    usage = UsagePayload.model_validate_json(row.payload_json)
                rows.append((row, usage))
            if rows:
                _atomically(con, lambda c: _write_rows(c, rows))
        try:
            self._log.clear()
        except OSError as exc:
            raise _store_error(f"cannot empty the commit log of {self._path}: {exc}", exc) from exc
        self._unflushed.clear()
        self._unflushed_bytes = 0

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            # A previous fatal error dropped the connection; try to come back (see _recover).
            self._connect()
        assert self._con is not None
        return self._con

    def _recover(self) -> None:
        """After a DuckDB error: keep the connection if it still works, else reopen it.

        DuckDB invalidates the whole database instance after a fatal I/O error during commit;
        every later statement on that connection would fail. Reopening replays DuckDB's WAL and
        the commit log, so the committed state comes back; the cached counters are dropped and
        reloaded from it. If reopening fails now (disk still full), the next job tries again.
        """
        con = self._con
        if con is None:
            return
        try:
            con.execute("SELECT 1").fetchall()
            return
        except duckdb.Error:
            pass
        self._sessions.clear()
        self._con = None
        with contextlib.suppress(duckdb.Error):
            con.close()
        try:
            self._connect()
        except PrimeAgentError:
            self._con = None

    def _session_state(self, session_id: str) -> _SessionState:
        state = self._sessions.get(session_id)
        if state is not None:
            return state
        root_id, leaf, last_seq = queries.session_cursor(self._connection(), session_id)
        state = _SessionState(root_id=root_id, leaf=leaf, last_seq=last_seq)
        self._sessions[session_id] = state
        return state

    def _run_batch(self, batch: list[_Logged]) -> None:
        now = utcnow()
        db_now = to_db_ts(now)
        if self._unflushed and any(
            isinstance(req, _Append) and isinstance(req.parent, str) for req in batch
        ):
            self._try_ingest()  # an explicit parent is looked up in the tables
        # Counters advance on copies; they replace the cache only after the commit, so a
        # failed one leaves no gap and no phantom leaf.
        pending: dict[str, _SessionState] = {}
        accepted: list[tuple[_Append, EventRecord, LoggedRow]] = []
        statuses: list[tuple[_StatusChange, LoggedStatus]] = []
        for req in batch:
            try:
                state = pending.get(req.session_id)
                if state is None:
                    state = replace(self._session_state(req.session_id))
                    pending[req.session_id] = state
                if isinstance(req, _StatusChange):  # the session exists: that is all to check
                    statuses.append((req, LoggedStatus(req.session_id, req.status, db_now)))
                    continue
                parent = state.leaf if req.parent is CURRENT_LEAF else req.parent
                if parent is not None and parent != state.leaf:
                    queries.check_parent(self._connection(), req.session_id, parent)
            except PrimeAgentError as exc:
                _settle(req, exc=exc)
                continue
            except duckdb.Error as exc:
                _settle(req, exc=_store_error(f"database {self._path}: {_one_line(exc)}", exc))
                continue
            state.last_seq += 1
            record = EventRecord(
                session_id=req.session_id,
                seq=state.last_seq,
                id=new_event_id(),
                parent_event_id=parent,
                type=req.type,
                ts=now,
                payload=req.payload,
            )
            state.leaf = record.id
            row = LoggedRow(
                req.session_id,
                state.root_id,
                record.seq,
                record.id,
                parent,
                req.type,
                db_now,
                req.payload_json,
            )
            accepted.append((req, record, row))
        if not accepted and not statuses:
            self._last_batch_sessions = 0
            return
        entries: list[LoggedEntry] = [row for _, _, row in accepted]
        entries += [status for _, status in statuses]
        try:
            if self._log is None:
                self._connection()  # a failed reopen left no log; this opens both or raises
            assert self._log is not None
            self._log.append(entries, self._before_commit)
        except (OSError, PrimeAgentError, duckdb.Error) as exc:
            with self._stats_lock:
                self._failed_commits += 1
            what = f"{len(accepted)} event(s) and {len(statuses)} status change(s)"
            message = f"could not commit {what} to {self._path}: {_one_line(exc)}"
            failed: list[_Outcome] = [
                (req, None, _store_error(message, exc))
                for req in ([r for r, _, _ in accepted] + [r for r, _ in statuses])
            ]
            _settle_all(failed)
            return
        touched = {row.session_id for _, _, row in accepted}
        self._sessions.update({s: pending[s] for s in touched})
        self._last_batch_sessions = len(touched)
        if not self._unflushed:
            self._unflushed_since = time.monotonic()
        self._unflushed.extend((row, req.usage) for req, _, row in accepted)
        self._unflushed.extend((status, None) for _, status in statuses)
        self._unflushed_bytes += sum(len(row.payload_json) for _, _, row in accepted)
        with self._stats_lock:
            self._commits += 1
            self._rows += len(accepted)
            self._largest_batch = max(self._largest_batch, len(accepted))
        done: list[_Outcome] = [(req, record, None) for req, record, _ in accepted]
        _settle_all(done + [(req, None, None) for req, _ in statuses])

    def _try_ingest(self) -> bool:
        """Move the committed rows into the tables in one transaction; False if that failed
        (the rows stay in the log and in ``_unflushed``; ``_last_ingest_error`` says why)."""
        if not self._unflushed:
            return True
        try:
            con = self._connection()
            if not self._unflushed:
                return True  # reopening replayed them
            _atomically(con, lambda c: _write_rows(c, self._unflushed))
        except (duckdb.Error, OSError, PrimeAgentError) as exc:
            self._last_ingest_error = _one_line(exc)
            self._recover()  # a reopen replays the log, which also settles the rows
            return not self._unflushed
        self._unflushed.clear()
        self._unflushed_bytes = 0
        with self._stats_lock:
            self._ingests += 1
        assert self._log is not None
        with contextlib.suppress(OSError):  # the lines are in the tables; a replay skips them
            self._log.clear()
        return True

    def _insert_session(
        self, con: duckdb.DuckDBPyConnection, record: SessionRecord
    ) -> SessionRecord:
        stored = queries.insert_session(con, record)
        self._sessions.pop(record.id, None)
        return stored

    def _update_session(
        self, con: duckdb.DuckDBPyConnection, session_id: str, fields: dict[str, Any]
    ) -> SessionRecord:
        updated = queries.update_session(con, session_id, fields, to_db_ts(utcnow()))
        if "leaf_event_id" in fields and session_id in self._sessions:
            # Keep the writer's cached leaf in step: the next default parent is the new leaf.
            self._sessions[session_id].leaf = fields["leaf_event_id"]
        return updated
