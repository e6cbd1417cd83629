"""The ``autonomy`` table: one row per session in autonomous mode (docs/control.md).

The reference kept the counters in memory, so a restarted worker started its limits over; here
the policy, the counters, the per-gate state and the stop live in this row and a new daemon
continues where the old one stopped. ``policy`` is ``AutonomousPolicy`` dumped to JSON and
``gate_state`` is ``{command: {"attempts": n, "last_exit": code | null, "failed_hash": hex |
null}}`` (orchestrator/control/autonomous.py reads and writes both; this module only stores
them). ``turn_tokens`` reads what one turn cost, with one aggregate query.

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final

import duckdb

from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow

__all__ = [
    "AutonomyRow",
    "select_autonomy",
    "turn_tokens",
    "update_autonomy",
    "upsert_autonomy",
]

_JSON_FIELDS: Final = frozenset({"policy", "gate_state"})
_TIME_FIELDS: Final = frozenset({"started_at", "stopped_at", "updated_at"})


@dataclass(frozen=True)
class AutonomyRow:
    """One row of ``autonomy``; the migration (0006) documents each column."""

    session_id: str
    policy: dict[str, Any]
    enabled: bool = True
    turns_used: int = 0
    tokens_used: int = 0
    continuations_used: int = 0
    started_at: datetime = field(default_factory=utcnow)
    gate_state: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    stop_detail: str | None = None
    stopped_at: datetime | None = None
    updated_at: datetime = field(default_factory=utcnow)

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def to_wire(self) -> dict[str, Any]:
        """JSON types (times as ISO-8601 UTC), as the control API shows it."""
        wire: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            wire[name] = value.isoformat() if isinstance(value, datetime) else value
        return wire


_COLUMNS: Final = tuple(f.name for f in fields(AutonomyRow))
_COLUMN_LIST: Final = ", ".join(_COLUMNS)
_UPDATABLE: Final = frozenset(_COLUMNS) - {"session_id"}

# What one turn cost: the usage events after the previous turn_end up to and including the
# last one (all of them while there is no turn_end yet). input + output + cache_write, as the
# reference's autonomous budget counted; a refinement's planning call is not the agent's work.
_TURN_TOKENS = """
WITH ends AS (
    SELECT seq FROM events WHERE session_id = $1 AND type = 'turn_end' ORDER BY seq DESC LIMIT 2
),
bounds AS (
    SELECT
        coalesce((SELECT min(seq) FROM ends WHERE (SELECT count(*) FROM ends) = 2), 0) AS after,
        coalesce((SELECT max(seq) FROM ends), 9223372036854775807) AS upto
)
SELECT coalesce(sum(
    coalesce(CAST(payload->>'$.input' AS BIGINT), 0)
    + coalesce(CAST(payload->>'$.output' AS BIGINT), 0)
    + coalesce(CAST(payload->>'$.cache_write' AS BIGINT), 0)), 0)
FROM events, bounds
WHERE session_id = $1 AND type = 'usage' AND seq > bounds.after AND seq <= bounds.upto
    AND coalesce(payload->>'$.purpose', '') <> 'refine'
"""


def _to_db(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return json.dumps(value, ensure_ascii=False)
    if name in _TIME_FIELDS:
        return None if value is None else to_db_ts(value)
    return value


def _row(values: Sequence[Any]) -> AutonomyRow:
    data = dict(zip(_COLUMNS, values, strict=True))
    for name in _JSON_FIELDS:
        data[name] = json.loads(data[name])
    for name in _TIME_FIELDS:
        if data[name] is not None:
            data[name] = from_db_ts(data[name])
    return AutonomyRow(**data)


def upsert_autonomy(con: duckdb.DuckDBPyConnection, row: AutonomyRow) -> AutonomyRow:
    """Insert the session's row, or replace every column of the one it has (``enable`` starts
    a new autonomous run over an old one)."""
    placeholders = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
    updates = ", ".join(f"{name} = excluded.{name}" for name in _COLUMNS if name != "session_id")
    con.execute(
        f"INSERT INTO autonomy ({_COLUMN_LIST}) VALUES ({placeholders}) "
        f"ON CONFLICT (session_id) DO UPDATE SET {updates}",
        [_to_db(name, getattr(row, name)) for name in _COLUMNS],
    )
    return row


def update_autonomy(
    con: duckdb.DuckDBPyConnection, session_id: str, /, **changes: Any
) -> AutonomyRow | None:
    """Set the named columns of the session's row (``updated_at`` to now unless it is named);
    returns the row as stored afterwards, or None when the session has none.

    ``ValueError`` for a name that is not an updatable column.
    """
    unknown = sorted(name for name in changes if name not in _UPDATABLE)
    if unknown:
        raise ValueError(f"autonomy has no updatable field(s) {', '.join(unknown)}")
    values = {"updated_at": utcnow(), **changes}
    names = list(values)
    assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
    con.execute(
        f"UPDATE autonomy SET {assignments} WHERE session_id = $1",
        [session_id, *(_to_db(name, values[name]) for name in names)],
    )
    return select_autonomy(con, session_id)


def select_autonomy(con: duckdb.DuckDBPyConnection, session_id: str) -> AutonomyRow | None:
    values = con.execute(
        f"SELECT {_COLUMN_LIST} FROM autonomy WHERE session_id = $1", [session_id]
    ).fetchone()
    return None if values is None else _row(values)


def turn_tokens(con: duckdb.DuckDBPyConnection, session_id: str) -> int:
    """Tokens (input + output + cache write) of the session's last turn: the ``usage`` events
    after the previous ``turn_end`` up to the last one, leaving out ``purpose`` "refine"."""
    row = con.execute(_TURN_TOKENS, [session_id]).fetchone()
    return int(row[0]) if row is not None else 0
