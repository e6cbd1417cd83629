"""Reads for context assembly and the REPL's ``history``: bounded, never the whole session.

**Context path.** A session's context is the path from its leaf to its root, but only back to
the newest compaction on that path: the compaction event stands for everything before it
except its kept span (``first_kept_event_id`` onwards) and the user turn it pinned. So the
walk starts at the leaf and follows parent links backwards until it has passed the compaction
and reached its first kept event; nothing older is read. The walk reads the session's events in
``seq`` windows going backwards from the leaf (a parent is always appended before its child,
so it has a smaller ``seq``): each window is one range query on ``(session_id, seq)``, the
first ``CONTEXT_WINDOW_FIRST_ROWS`` long and each next one ``CONTEXT_WINDOW_GROWTH`` times
longer. Rows of a window that are not on the path are dropped before the next window is read,
so memory holds one window plus the path. ``ContextPath.rows_read`` counts every row fetched;
for a compacted session it is about the kept span plus what came after, whatever the history's
length (tests/integration/test_compaction.py checks this on 100,000 events).

**History.** ``history.search / get / tail`` from the kernel read every event of the session,
compacted ones included, bounded by the caller's limit (the host caps the limits).

The functions here take the DuckDB connection and run on the store's writer thread through
``Store.read``; ``read_context_path`` is the async entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import duckdb

from orchestrator.store.db import Store
from orchestrator.store.queries import EventRecord, event_from_row

__all__ = [
    "CONTEXT_WINDOW_FIRST_ROWS",
    "CONTEXT_WINDOW_GROWTH",
    "HISTORY_EVENT_TYPES",
    "ContextPath",
    "read_context_path",
    "select_context_path",
    "select_history_range",
    "select_history_search",
    "select_history_tail",
]

# The first backwards window from the leaf, in events; enough for the kept span of a typical
# compaction (about 20,000 tokens is a few hundred events) in one query.
CONTEXT_WINDOW_FIRST_ROWS: Final = 512
CONTEXT_WINDOW_GROWTH: Final = 4
# What ``history`` shows: the conversation and the harness's records, not bookkeeping (usage
# rows, retries, run ends).
HISTORY_EVENT_TYPES: Final[tuple[str, ...]] = (
    "user_message",
    "assistant_message",
    "tool_result",
    "notice",
    "error",
    "aborted",
    "compaction",
    "model_change",
    "branch_summary",
)

_COLUMNS: Final = "session_id, seq, id, parent_event_id, type, ts, payload"
_TYPES_SQL: Final = "(" + ", ".join(f"'{t}'" for t in HISTORY_EVENT_TYPES) + ")"
# The searchable text of an event: its text fields and the code of its tool calls (arguments
# that are not JSON are searched as they are).
_SEARCH_TEXT: Final = """lower(concat_ws(chr(10),
    payload->>'text', payload->>'summary', payload->>'message', payload->>'reason',
    payload->>'model',
    array_to_string(list_transform(
        coalesce(json_extract_string(payload, '$.tool_calls[*].arguments'), []::VARCHAR[]),
        lambda a: CASE WHEN json_valid(a) THEN coalesce(json_extract_string(a, '$.code'), a)
                       ELSE a END), chr(10))))"""


@dataclass(frozen=True)
class ContextPath:
    """What context assembly needs, read from the leaf back to the newest compaction.

    ``events`` run root-first from the first kept event (or the root, when nothing was
    compacted) to the leaf; the compaction event itself is among them. ``pinned`` is the user
    message the compaction kept in front of its kept span (the turn that was in flight).
    """

    events: list[EventRecord]
    compaction: EventRecord | None = None
    pinned: EventRecord | None = None
    rows_read: int = 0


def _record(row: tuple[Any, ...]) -> EventRecord:
    return event_from_row(row)


def select_context_path(con: duckdb.DuckDBPyConnection, session_id: str) -> ContextPath:
    row = con.execute(
        "SELECT e.seq, e.id FROM sessions s JOIN events e ON e.id = s.leaf_event_id "
        "WHERE s.id = $1 AND e.session_id = $1",
        [session_id],
    ).fetchone()
    if row is None:
        return ContextPath(events=[])
    high, cursor = int(row[0]), str(row[1])
    window = CONTEXT_WINDOW_FIRST_ROWS
    backwards: list[EventRecord] = []
    compaction: EventRecord | None = None
    stop_at: str | None = None
    rows_read = 0
    done = False
    current: str | None = cursor
    while not done and current is not None and high > 0:
        low = max(0, high - window)
        rows = con.execute(
            f"SELECT {_COLUMNS} FROM events WHERE session_id = $1 AND seq > $2 AND seq <= $3",
            [session_id, low, high],
        ).fetchall()
        rows_read += len(rows)
        by_id = {str(r[2]): r for r in rows}
        while current is not None and current in by_id:
            event = _record(by_id[current])
            backwards.append(event)
            if compaction is None and event.type == "compaction":
                compaction = event
                stop_at = event.payload.get("first_kept_event_id")
                if stop_at is None:  # nothing before the compaction is kept
                    done = True
                    break
            if stop_at is not None and event.id == stop_at:
                done = True
                break
            current = event.parent_event_id
        high = low
        window *= CONTEXT_WINDOW_GROWTH
    pinned: EventRecord | None = None
    pinned_id = compaction.payload.get("pinned_event_id") if compaction is not None else None
    if isinstance(pinned_id, str):
        found = con.execute(
            f"SELECT {_COLUMNS} FROM events WHERE id = $1 AND session_id = $2",
            [pinned_id, session_id],
        ).fetchone()
        rows_read += 1 if found is not None else 0
        pinned = _record(found) if found is not None else None
    backwards.reverse()
    return ContextPath(events=backwards, compaction=compaction, pinned=pinned, rows_read=rows_read)


async def read_context_path(store: Store, session_id: str) -> ContextPath:
    """The session's context path (see the module docstring), read on the store's thread."""
    return await store.read(lambda con: select_context_path(con, session_id))


# -- history (the REPL's ``history``) ------------------------------------------------------------


def select_history_range(
    con: duckdb.DuckDBPyConnection, session_id: str, from_seq: int, to_seq: int, limit: int
) -> list[EventRecord]:
    """Events with ``from_seq <= seq <= to_seq`` (history types only), oldest first, at most
    ``limit`` of them."""
    rows = con.execute(
        f"SELECT {_COLUMNS} FROM events WHERE session_id = $1 AND seq >= $2 AND seq <= $3 "
        f"AND type IN {_TYPES_SQL} ORDER BY seq LIMIT $4",
        [session_id, from_seq, to_seq, limit],
    ).fetchall()
    return [_record(r) for r in rows]


def select_history_tail(
    con: duckdb.DuckDBPyConnection, session_id: str, count: int
) -> list[EventRecord]:
    """The newest ``count`` history events, oldest first."""
    rows = con.execute(
        f"SELECT {_COLUMNS} FROM events WHERE session_id = $1 AND type IN {_TYPES_SQL} "
        "ORDER BY seq DESC LIMIT $2",
        [session_id, count],
    ).fetchall()
    return [_record(r) for r in reversed(rows)]


def select_history_search(
    con: duckdb.DuckDBPyConnection, session_id: str, text: str, limit: int
) -> tuple[list[EventRecord], int]:
    """The newest ``limit`` events whose text (or tool-call code) contains ``text``, case
    insensitive, newest first; and how many match in all."""
    rows = con.execute(
        f"SELECT {_COLUMNS}, count(*) OVER () FROM events WHERE session_id = $1 "
        f"AND type IN {_TYPES_SQL} AND contains({_SEARCH_TEXT}, lower($2)) "
        "ORDER BY seq DESC LIMIT $3",
        [session_id, text, limit],
    ).fetchall()
    total = int(rows[0][-1]) if rows else 0
    return [_record(r[:-1]) for r in rows], total
