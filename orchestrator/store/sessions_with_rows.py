"""Which sessions may have rows in a side table, so that the others skip their reads.

At the end of every turn the orchestrator asks three side tables about the session: its open
goal (``goals``), its autonomous run (``autonomy``), its refinements awaiting a boundary
(``refinements``); a new session's first prompt asks ``harness_entries`` about its tree (keyed
by ``owner``: the root's id, or global). Almost every session has no row in any of them, and
each question is a DuckDB query of 0.5–3 ms of CPU: at 20 sessions of short turns, a tenth of
the host's CPU per step went to learning "nothing" (docs/benchmarks.md, session 14).

The harness table's writers are several (the harness service, refinements, proposals, the
daemon's harness commands); each tells the prompt builder ``changed(owner)`` after its write,
which adds the owner. A first prompt built between such a commit and its ``changed`` misses the
new entry for that one turn, as a cached prompt always did (docs/harness.md: a write shows from
the next turn on).

A ``SessionsWithRows`` answers "none" from memory. It is the set of sessions that have (or may
have) a row: read with one query on first use, then kept by the table's only writer, which
calls ``add`` before each insert. The set may hold more than the table (rows deleted, goals
closed, an insert that failed): such a session pays a read, which gives the right answer. It
must never hold less; its invariants:

- every session with a row when the first query ran is in the set once it ran;
- a row's session is added before the row is inserted, so no reader sees the row's absence
  from the set while the row exists; an add made while the first query runs is merged into
  its answer, not lost with it.

Only the process that owns the store (the daemon, or a print-mode run) writes these tables,
so no row appears behind the writer's back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import duckdb

from orchestrator.store.db import Store

__all__ = ["SessionsWithRows", "distinct_sessions_query"]


def distinct_sessions_query(
    table: str, column: str = "session_id"
) -> Callable[[duckdb.DuckDBPyConnection], set[str]]:
    """The first query of an index over ``table``, keyed by ``column`` (constant names from
    our own schema: ``harness_entries`` is keyed by ``owner``, a root session id or global)."""
    sql = f"SELECT DISTINCT {column} FROM {table}"  # constants of our schema, never input

    def query(con: duckdb.DuckDBPyConnection) -> set[str]:
        return {str(row[0]) for row in con.execute(sql).fetchall()}

    return query


class SessionsWithRows:
    """The sessions with rows in one side table (see the module docstring)."""

    def __init__(
        self, store: Store, query: Callable[[duckdb.DuckDBPyConnection], set[str]]
    ) -> None:
        self._store = store
        self._query = query
        self._known: set[str] | None = None  # None until the first query has run
        self._added: set[str] = set()  # adds while the first query runs
        self._loading: asyncio.Lock | None = None

    async def may_have(self, session_id: str) -> bool:
        """False when the session certainly has no row; True when it may (read to know)."""
        known = self._known
        if known is None:
            known = await self._load()
        return session_id in known

    def add(self, session_id: str) -> None:
        """The writer is about to insert a row of ``session_id`` (call it before the insert)."""
        if self._known is None:
            self._added.add(session_id)
        else:
            self._known.add(session_id)

    async def _load(self) -> set[str]:
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self._known is None:
                found = await self._store.read_side(self._query)
                self._known = found | self._added
                self._added = set()
            return self._known
