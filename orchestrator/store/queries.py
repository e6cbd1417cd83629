"""Read models of the store: session, event and usage records and the queries that build them.

The query functions take the DuckDB connection and run on the store's writer thread (see
``db.Store``); callers use the async methods of ``Store``, never these directly. Timestamps are
stored as UTC without a zone and come back as aware UTC datetimes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import duckdb

from orchestrator.errors import StoreError, UserError
from orchestrator.session_specs import StoredModel, StoredRunSettings, StoredSandboxPolicy
from orchestrator.store.events import EventType
from orchestrator.store.lifecycle import SESSION_STATUSES, SessionStatus

__all__ = [
    "ACTIVE_PATH_MAX_DEPTH",
    "SESSION_COLUMNS",
    "SESSION_STATUSES",
    "EventRecord",
    "SessionRecord",
    "SessionStatus",
    "UsageSummary",
    "check_parent",
    "event_from_row",
    "find_session",
    "format_cost",
    "from_db_ts",
    "insert_session",
    "select_active_path",
    "select_event",
    "select_events",
    "select_family",
    "select_imported_header",
    "select_last_event_times",
    "select_recent_events",
    "select_recorded_message_ids",
    "select_session",
    "select_sessions",
    "select_usage_summary",
    "session_cursor",
    "to_db_ts",
    "update_session",
    "utcnow",
]

# A guard against a parent cycle, which the writer never creates (a parent must exist before its
# child) but a hand-edited or damaged file could contain: the walk stops instead of looping.
ACTIVE_PATH_MAX_DEPTH = 1_000_000
# How many candidates an ambiguous selector error lists before "…".
AMBIGUOUS_LIST_MAX = 5
COST_DECIMALS = 4


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_db_ts(value: datetime) -> datetime:
    """Aware (or naive, taken as UTC) datetime → naive UTC for a TIMESTAMP column."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def from_db_ts(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class SessionRecord:
    """One row of ``sessions``. ``root_id`` is the session's own id for a root session."""

    id: str
    root_id: str
    cwd: str
    model: str
    backend: str
    parent_id: str | None = None
    name: str | None = None
    depth: int = 0
    sandbox_ref: str | None = None
    status: SessionStatus = "idle"
    leaf_event_id: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    rlm_child_id: str | None = None  # "sub-xxxxxxxx" for a child spawned by rlm()
    budget_tokens: int | None = None  # reserved at spawn; None = only ancestors' budgets apply
    forked_from: str | None = None  # fork/clone: the session copied (docs/tree.md)
    forked_at: str | None = None  # ... and its event the copy goes up to
    refine_enabled: bool = True  # /refine allowed (docs/harness.md); children inherit it
    # Migration 0007: the session's model endpoint and sandbox policy
    # (orchestrator/session_specs.py); None for rows written before it.
    model_spec: StoredModel | None = None
    sandbox_policy: StoredSandboxPolicy | None = None
    # Migration 0009: the settings its run chose over the daemon's config (an eval config's);
    # None: the config of whichever process runs it.
    run_settings: StoredRunSettings | None = None
    # Not a column: why a stored spec could not be read (a damaged row). Such a session is
    # not loaded rather than run against some other endpoint or policy.
    spec_problem: str | None = None


SESSION_COLUMNS: tuple[str, ...] = (
    "id",
    "root_id",
    "parent_id",
    "name",
    "depth",
    "cwd",
    "model",
    "backend",
    "sandbox_ref",
    "status",
    "leaf_event_id",
    "created_at",
    "updated_at",
    "rlm_child_id",
    "budget_tokens",
    "forked_from",
    "forked_at",
    "refine_enabled",
    "model_spec",
    "sandbox_policy",
    "run_settings",
)
# JSON columns and the pydantic model each one holds.
_SPEC_COLUMNS: dict[str, type[StoredModel | StoredSandboxPolicy | StoredRunSettings]] = {
    "model_spec": StoredModel,
    "sandbox_policy": StoredSandboxPolicy,
    "run_settings": StoredRunSettings,
}
_SESSION_SELECT = f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions"


@dataclass(frozen=True)
class EventRecord:
    """One row of ``events``; ``payload`` is the event's pydantic payload dumped to JSON types."""

    session_id: str
    seq: int
    id: str
    parent_event_id: str | None
    type: EventType
    ts: datetime
    payload: dict[str, Any]


_EVENT_COLUMNS = "session_id, seq, id, parent_event_id, type, ts, payload"


@dataclass(frozen=True)
class UsageSummary:
    """Model-call totals of one session.

    ``cost_usd`` sums only the calls whose price is known and is ``None`` when none is;
    ``unknown_cost_calls`` counts the rest. An unknown price is never added as 0: show the
    known sum *and* the unknown marker (``format_cost``).
    """

    session_id: str
    root_id: str
    calls: int
    input: int
    output: int
    cache_read: int
    cache_write: int
    cost_usd: float | None
    unknown_cost_calls: int
    latency_ms: float
    models: tuple[str, ...]
    # Of ``calls``: rows an imported session file brought (docs/tree.md, "Faithful import"),
    # counted in every total shown but never against a budget.
    imported_calls: int = 0

    @property
    def cost_known(self) -> bool:
        """True when every call of the session has a known price."""
        return self.unknown_cost_calls == 0

    @property
    def total_tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write


def format_cost(summary: UsageSummary) -> str:
    """``$0.0123``, ``$0.0123 + unknown (2 calls)``, or ``unknown (3 calls)``."""
    calls = summary.unknown_cost_calls
    unknown = f"unknown ({calls} call{'s' if calls != 1 else ''})"
    if summary.cost_usd is None:
        return unknown if calls else f"${0:.{COST_DECIMALS}f}"
    known = f"${summary.cost_usd:.{COST_DECIMALS}f}"
    return f"{known} + {unknown}" if calls else known


# -- row mapping -------------------------------------------------------------------------------


def _session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    values = dict(zip(SESSION_COLUMNS, row, strict=True))
    values["created_at"] = from_db_ts(values["created_at"])
    values["updated_at"] = from_db_ts(values["updated_at"])
    problems = []
    for column, model in _SPEC_COLUMNS.items():
        raw = values[column]
        if raw is None:
            continue
        try:
            values[column] = model.model_validate_json(raw)
        except ValueError as exc:
            values[column] = None
            problems.append(f"its stored {column} cannot be read ({_first_line(exc)})")
    return SessionRecord(**values, spec_problem="; ".join(problems) or None)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def spec_column_value(value: Any) -> Any:
    """A field value as its column takes it: a stored spec as its JSON text."""
    specs = (StoredModel, StoredSandboxPolicy, StoredRunSettings)
    return value.model_dump_json() if isinstance(value, specs) else value


def event_from_row(row: tuple[Any, ...]) -> EventRecord:
    """An ``events`` row (``session_id, seq, id, parent_event_id, type, ts, payload``)."""
    return _event_from_row(row)


def _event_from_row(row: tuple[Any, ...]) -> EventRecord:
    session_id, seq, event_id, parent, type_, ts, payload = row
    return EventRecord(
        session_id=session_id,
        seq=int(seq),
        id=event_id,
        parent_event_id=parent,
        type=cast(EventType, type_),
        ts=from_db_ts(ts),
        payload=json.loads(payload),
    )


# -- sessions ----------------------------------------------------------------------------------


def select_session(con: duckdb.DuckDBPyConnection, session_id: str) -> SessionRecord | None:
    row = con.execute(f"{_SESSION_SELECT} WHERE id = $1", [session_id]).fetchone()
    return _session_from_row(row) if row is not None else None


def select_sessions(con: duckdb.DuckDBPyConnection) -> list[SessionRecord]:
    rows = con.execute(f"{_SESSION_SELECT} ORDER BY created_at, id").fetchall()
    return [_session_from_row(row) for row in rows]


def select_family(con: duckdb.DuckDBPyConnection, root_id: str) -> list[SessionRecord]:
    """Every session of one tree (the root and its descendants), parents before children."""
    rows = con.execute(
        f"{_SESSION_SELECT} WHERE root_id = $1 ORDER BY depth, created_at, id", [root_id]
    ).fetchall()
    return [_session_from_row(row) for row in rows]


def find_session(con: duckdb.DuckDBPyConnection, selector: str) -> SessionRecord | None:
    """The session whose id equals or starts with ``selector``, or whose name or subagent id
    (``sub-…``, what ``agents`` shows for a child) equals it.

    An exact id wins outright. Otherwise the prefix and name matches together must be exactly
    one session; several raise ``UserError`` listing them, none returns ``None``.
    """
    if not selector:
        return None
    exact = select_session(con, selector)
    if exact is not None:
        return exact
    # starts_with, not LIKE: a selector containing % or _ must not act as a wildcard.
    rows = con.execute(
        f"{_SESSION_SELECT} WHERE starts_with(id, $1) OR name = $1 OR rlm_child_id = $1 "
        "ORDER BY created_at, id",
        [selector],
    ).fetchall()
    if not rows:
        return None
    if len(rows) > 1:
        shown = ", ".join(
            f"{r[0]} ({r[3]})" if r[3] else str(r[0]) for r in rows[:AMBIGUOUS_LIST_MAX]
        )
        more = ", …" if len(rows) > AMBIGUOUS_LIST_MAX else ""
        raise UserError(
            f"{selector!r} matches {len(rows)} sessions: {shown}{more}; give more of the id"
        )
    return _session_from_row(rows[0])


def insert_session(con: duckdb.DuckDBPyConnection, record: SessionRecord) -> SessionRecord:
    values = [spec_column_value(getattr(record, c)) for c in SESSION_COLUMNS]
    values[SESSION_COLUMNS.index("created_at")] = to_db_ts(record.created_at)
    values[SESSION_COLUMNS.index("updated_at")] = to_db_ts(record.updated_at)
    placeholders = ", ".join(f"${i + 1}" for i in range(len(SESSION_COLUMNS)))
    try:
        con.execute(
            f"INSERT INTO sessions ({', '.join(SESSION_COLUMNS)}) VALUES ({placeholders})",
            values,
        )
    except duckdb.ConstraintException as exc:
        raise StoreError(f"session {record.id} already exists") from exc
    stored = select_session(con, record.id)
    assert stored is not None
    return stored


def update_session(
    con: duckdb.DuckDBPyConnection, session_id: str, fields: dict[str, Any], now: datetime
) -> SessionRecord:
    """Set ``fields`` (names already checked by the caller) and ``updated_at = now``."""
    if select_session(con, session_id) is None:
        raise StoreError(f"unknown session {session_id!r}")
    if fields.get("leaf_event_id") is not None:
        check_parent(con, session_id, fields["leaf_event_id"])
    names = sorted(fields)
    assignments = "".join(f"{name} = ${i + 2}, " for i, name in enumerate(names))
    params: list[Any] = [
        session_id,
        *(spec_column_value(fields[n]) for n in names),
        to_db_ts(now),
    ]
    con.execute(
        f"UPDATE sessions SET {assignments}updated_at = ${len(params)} WHERE id = $1", params
    )
    updated = select_session(con, session_id)
    assert updated is not None
    return updated


def session_cursor(con: duckdb.DuckDBPyConnection, session_id: str) -> tuple[str, str | None, int]:
    """``(root_id, leaf_event_id, max seq)`` of a session: where its next append goes."""
    row = con.execute(
        "SELECT root_id, leaf_event_id, "
        "(SELECT coalesce(max(seq), 0) FROM events WHERE session_id = $1) "
        "FROM sessions WHERE id = $1",
        [session_id],
    ).fetchone()
    if row is None:
        raise StoreError(f"unknown session {session_id!r}")
    return str(row[0]), row[1], int(row[2])


def check_parent(con: duckdb.DuckDBPyConnection, session_id: str, event_id: str) -> None:
    """A parent (or a new leaf) must be an event of the same session: trees never cross."""
    row = con.execute(
        "SELECT count(*) FROM events WHERE id = $1 AND session_id = $2", [event_id, session_id]
    ).fetchone()
    if row is None or int(row[0]) == 0:
        raise StoreError(f"parent event {event_id!r} is not an event of session {session_id}")


# -- events ------------------------------------------------------------------------------------


def select_event(con: duckdb.DuckDBPyConnection, event_id: str) -> EventRecord | None:
    row = con.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = $1", [event_id]).fetchone()
    return _event_from_row(row) if row is not None else None


def select_events(
    con: duckdb.DuckDBPyConnection, session_id: str, after_seq: int, limit: int | None
) -> list[EventRecord]:
    sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = $1 AND seq > $2 ORDER BY seq"
    params: list[Any] = [session_id, after_seq]
    if limit is not None:
        sql += " LIMIT $3"
        params.append(limit)
    return [_event_from_row(row) for row in con.execute(sql, params).fetchall()]


def select_recent_events(
    con: duckdb.DuckDBPyConnection, session_id: str, limit: int
) -> list[EventRecord]:
    """The newest ``limit`` events of a session, oldest first (what ``observe`` shows)."""
    rows = con.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = $1 ORDER BY seq DESC LIMIT $2",
        [session_id, limit],
    ).fetchall()
    return [_event_from_row(row) for row in reversed(rows)]


def select_last_event_times(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """The time of each session's newest event (sessions without events are left out): one
    aggregate over ``events`` for every session at once (``list_sessions``)."""
    rows = con.execute("SELECT session_id, max(ts) FROM events GROUP BY session_id").fetchall()
    return {str(sid): from_db_ts(ts) for sid, ts in rows if ts is not None}


def select_recorded_message_ids(
    con: duckdb.DuckDBPyConnection, session_id: str, message_ids: list[str]
) -> set[str]:
    """Which of ``message_ids`` already entered ``session_id``'s history as a user_message.

    The dedupe check of durable agent messages (R4): a message is recorded once, then acked
    in its mailbox; a crash in between leaves it in both, and this drops the second delivery.
    Bounded by the session: the ``(session_id, seq)`` index narrows the scan to its own rows.
    """
    if not message_ids:
        return set()
    rows = con.execute(
        "SELECT DISTINCT payload->>'message_id' FROM events "
        "WHERE session_id = $1 AND type = 'user_message' "
        "AND payload->>'message_id' IN (SELECT unnest($2::VARCHAR[]))",
        [session_id, list(message_ids)],
    ).fetchall()
    found = {str(row[0]) for row in rows}
    # A batch of subagent notices (sessions/notices.py) records its other deliveries' ids in
    # ``merged_message_ids``: few rows have one, so they are read whole and matched here.
    merged = con.execute(
        "SELECT json_extract(payload, '$.merged_message_ids') FROM events "
        "WHERE session_id = $1 AND type = 'user_message' "
        "AND json_type(json_extract(payload, '$.merged_message_ids')) = 'ARRAY'",
        [session_id],
    ).fetchall()
    wanted = set(message_ids)
    for (ids,) in merged:
        found |= wanted.intersection(str(i) for i in json.loads(ids))
    return found


# The recursive step is restricted to the session's own rows: a session's events form a closed
# tree, and the filter keeps DuckDB's per-query hash build to that session instead of the whole
# table (measured: 6 ms vs 135 ms for a short path with 1M events in the file).
_ACTIVE_PATH_SQL = f"""
WITH RECURSIVE path(id, parent_event_id, depth) AS (
    SELECT e.id, e.parent_event_id, 0
    FROM events e JOIN sessions s ON e.id = s.leaf_event_id
    WHERE s.id = $1 AND e.session_id = $1
    UNION ALL
    SELECT e.id, e.parent_event_id, p.depth + 1
    FROM events e JOIN path p ON e.id = p.parent_event_id
    WHERE e.session_id = $1 AND p.depth < {ACTIVE_PATH_MAX_DEPTH}
)
SELECT e.session_id, e.seq, e.id, e.parent_event_id, e.type, e.ts, e.payload
FROM path p JOIN events e ON e.id = p.id
ORDER BY p.depth DESC
"""


def select_active_path(con: duckdb.DuckDBPyConnection, session_id: str) -> list[EventRecord]:
    """Events from the root to the session's leaf (root first); empty when there is no leaf."""
    rows = con.execute(_ACTIVE_PATH_SQL, [session_id]).fetchall()
    return [_event_from_row(row) for row in rows]


# -- usage -------------------------------------------------------------------------------------

_USAGE_SUMMARY_SQL = """
SELECT
    s.id,
    s.root_id,
    count(u.event_id),
    coalesce(sum(u.input), 0),
    coalesce(sum(u.output), 0),
    coalesce(sum(u.cache_read), 0),
    coalesce(sum(u.cache_write), 0),
    sum(u.cost_usd) FILTER (WHERE u.cost_known),
    count(u.event_id) FILTER (WHERE NOT u.cost_known),
    coalesce(sum(u.latency_ms), 0),
    list(DISTINCT u.model) FILTER (WHERE u.model IS NOT NULL),
    count(u.event_id) FILTER (WHERE u.imported)
FROM sessions s LEFT JOIN usage u ON u.session_id = s.id {calls}
{where}
GROUP BY s.id, s.root_id, s.created_at
ORDER BY s.created_at, s.id
"""


def select_usage_summary(
    con: duckdb.DuckDBPyConnection, session_ids: list[str] | None, *, imported: bool = True
) -> list[UsageSummary]:
    """Per-session totals; every selected session appears, with zeros when it made no call.
    ``imported=False`` leaves out the calls an imported file brought (what budgets count)."""
    calls = "" if imported else "AND NOT coalesce(u.imported, false)"
    if session_ids is None:
        rows = con.execute(_USAGE_SUMMARY_SQL.format(where="", calls=calls)).fetchall()
    else:
        where = "WHERE s.id IN (SELECT unnest($1::VARCHAR[]))"
        sql = _USAGE_SUMMARY_SQL.format(where=where, calls=calls)
        rows = con.execute(sql, [session_ids]).fetchall()
    return [
        UsageSummary(
            session_id=row[0],
            root_id=row[1],
            calls=int(row[2]),
            input=int(row[3]),
            output=int(row[4]),
            cache_read=int(row[5]),
            cache_write=int(row[6]),
            cost_usd=float(row[7]) if row[7] is not None else None,
            unknown_cost_calls=int(row[8]),
            latency_ms=float(row[9]),
            models=tuple(sorted(row[10] or ())),
            imported_calls=int(row[11]),
        )
        for row in rows
    ]


def select_imported_header(
    con: duckdb.DuckDBPyConnection, session_id: str
) -> dict[str, Any] | None:
    """The header line of the file a session was imported from (None: not imported)."""
    row = con.execute("SELECT imported_header FROM sessions WHERE id = $1", [session_id]).fetchone()
    if row is None or row[0] is None:
        return None
    header = json.loads(row[0])
    return header if isinstance(header, dict) else None
