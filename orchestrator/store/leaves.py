"""A session's leaf pointer and the rule for a missing one (docs/tree.md).

``sessions.leaf_event_id`` names the end of the session's active path. A session with events
but no leaf (a damaged or hand-edited row) gets its newest event (highest ``seq``) as its leaf:
the writer repairs every such row at each writable open (``repair_leaves``, called by
``Store``), and readers apply the same rule meanwhile (``effective_leaf``).

The functions take the DuckDB connection and run on the store's writer thread. This module is
below both ``db`` (which repairs at open) and ``tree`` (which reads leaves to branch, fork and
list), so neither imports the other for it.
"""

from __future__ import annotations

import duckdb

from orchestrator.store.queries import SessionRecord

__all__ = ["effective_leaf", "newest_event_id", "repair_leaves"]


def newest_event_id(con: duckdb.DuckDBPyConnection, session_id: str) -> str | None:
    row = con.execute(
        "SELECT id FROM events WHERE session_id = $1 ORDER BY seq DESC LIMIT 1", [session_id]
    ).fetchone()
    return str(row[0]) if row is not None else None


def effective_leaf(con: duckdb.DuckDBPyConnection, session: SessionRecord) -> str | None:
    """The stored leaf, or the newest event when the pointer is missing."""
    return session.leaf_event_id or newest_event_id(con, session.id)


def repair_leaves(con: duckdb.DuckDBPyConnection) -> int:
    """Point every session that has events but no leaf at its newest event; return how many.

    Runs at each writable open (``Store``). Only sessions whose pointer is NULL are looked at
    (a cheap scan of ``sessions``), each with one indexed query, so an open does not read the
    events table.
    """
    missing = con.execute("SELECT id FROM sessions WHERE leaf_event_id IS NULL").fetchall()
    repaired = 0
    for (session_id,) in missing:
        newest = newest_event_id(con, session_id)
        if newest is None:
            continue
        con.execute(
            "UPDATE sessions SET leaf_event_id = $2 WHERE id = $1 AND leaf_event_id IS NULL",
            [session_id, newest],
        )
        repaired += 1
    return repaired
