"""The ``goals`` table: a session's objective, its token budget and its state (docs/spec.md §7).

A goal is created by the user (``--goal``, ``/goal``) or the agent (``goal.create()``); after
each turn while it is ``active`` the harness re-prompts with it (``orchestrator/control/goals.py``).
``status`` moves active ⇄ paused, active → budget_limited (the budget is spent), and to one of
the final states complete | cleared | error. A session has at most one goal that is not final;
final goals stay as its history.

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal, get_args

import duckdb

from orchestrator.errors import GoalError
from orchestrator.ids import new_event_id
from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow

__all__ = [
    "FINAL_GOAL_STATUSES",
    "GOAL_ID_PREFIX",
    "GOAL_STATUSES",
    "OPEN_GOAL_STATUSES",
    "GoalRow",
    "GoalStatus",
    "insert_goal",
    "new_goal_id",
    "select_current",
    "select_goal",
    "select_goals",
    "tokens_since_update",
    "update_goal",
]

GoalStatus = Literal["active", "paused", "budget_limited", "complete", "cleared", "error"]
GOAL_STATUSES: Final[tuple[GoalStatus, ...]] = get_args(GoalStatus)
# Not final: at most one of these per session (a new goal is refused while one exists).
OPEN_GOAL_STATUSES: Final[tuple[GoalStatus, ...]] = ("active", "paused", "budget_limited")
FINAL_GOAL_STATUSES: Final[tuple[GoalStatus, ...]] = ("complete", "cleared", "error")
GOAL_ID_PREFIX: Final = "g-"

_TIME_FIELDS = frozenset({"created_at", "updated_at", "completed_at"})

# Tokens (input + output, cache excluded) of the session's usage events after the goal's
# newest goal_update event: what the agent spent since the goal was last accounted (each
# accounting records a goal_update, so nothing is counted twice and nothing spent while the
# goal was paused is counted). A refinement's planning call is not the agent's work.
_TOKENS_SINCE_UPDATE = """
SELECT coalesce(sum(coalesce(CAST(payload->>'$.input' AS BIGINT), 0)
                    + coalesce(CAST(payload->>'$.output' AS BIGINT), 0)), 0)
FROM events
WHERE session_id = $1 AND type = 'usage'
  AND coalesce(payload->>'$.purpose', '') <> 'refine'
  AND seq > (SELECT coalesce(max(seq), 0) FROM events
             WHERE session_id = $1 AND type = 'goal_update' AND payload->>'$.goal_id' = $2)
"""


def new_goal_id() -> str:
    """``g-`` and a sortable unique suffix: ids sort in creation order, like event ids."""
    return GOAL_ID_PREFIX + new_event_id()


@dataclass(frozen=True)
class GoalRow:
    """One row of ``goals``; the migration (0006) documents each column."""

    id: str
    session_id: str
    objective: str
    token_budget: int | None = None
    tokens_used: int = 0
    status: GoalStatus = "active"
    continuations: int = 0
    last_reason: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    completed_at: datetime | None = None

    @property
    def tokens_remaining(self) -> int | None:
        """Budget left (never below 0); None without a budget."""
        if self.token_budget is None:
            return None
        return max(0, self.token_budget - self.tokens_used)

    @property
    def budget_spent(self) -> bool:
        return self.token_budget is not None and self.tokens_used >= self.token_budget

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_GOAL_STATUSES

    def to_wire(self) -> dict[str, Any]:
        """JSON types (times as ISO-8601 UTC) plus ``tokens_remaining``, as the control API
        and the kernel see it."""
        wire: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            wire[name] = value.isoformat() if isinstance(value, datetime) else value
        wire["tokens_remaining"] = self.tokens_remaining
        return wire


_COLUMNS: Final = tuple(f.name for f in fields(GoalRow))
_COLUMN_LIST = ", ".join(_COLUMNS)


def _check_status(value: object) -> None:
    if value not in GOAL_STATUSES:
        raise ValueError(
            f"unknown goal status {value!r}: expected one of {', '.join(GOAL_STATUSES)}"
        )


def _to_db(name: str, value: Any) -> Any:
    if name in _TIME_FIELDS:
        return None if value is None else to_db_ts(value)
    return value


def _row(values: Sequence[Any]) -> GoalRow:
    data = dict(zip(_COLUMNS, values, strict=True))
    for name in _TIME_FIELDS:
        if data[name] is not None:
            data[name] = from_db_ts(data[name])
    return GoalRow(**data)


def insert_goal(con: duckdb.DuckDBPyConnection, row: GoalRow) -> GoalRow:
    _check_status(row.status)
    placeholders = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
    con.execute(
        f"INSERT INTO goals ({_COLUMN_LIST}) VALUES ({placeholders})",
        [_to_db(name, getattr(row, name)) for name in _COLUMNS],
    )
    return row


def update_goal(con: duckdb.DuckDBPyConnection, goal_id: str, **changes: Any) -> GoalRow:
    """Set the named columns of one goal; returns the row as stored afterwards.

    ``updated_at`` is set to now unless given. ``ValueError`` for a name that is not a column
    (or ``id`` / ``session_id``) or an unknown status; ``GoalError`` (``not_found``) when there
    is no such goal.
    """
    unknown = sorted(
        name for name in changes if name not in _COLUMNS or name in ("id", "session_id")
    )
    if unknown:
        raise ValueError(f"goals have no updatable field(s) {', '.join(unknown)}")
    if "status" in changes:
        _check_status(changes["status"])
    changes.setdefault("updated_at", utcnow())
    names = list(changes)
    assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
    con.execute(
        f"UPDATE goals SET {assignments} WHERE id = $1",
        [goal_id, *(_to_db(name, changes[name]) for name in names)],
    )
    row = select_goal(con, goal_id)
    if row is None:
        raise GoalError(f"no goal {goal_id!r}", code="not_found")
    return row


def select_goal(con: duckdb.DuckDBPyConnection, goal_id: str) -> GoalRow | None:
    values = con.execute(f"SELECT {_COLUMN_LIST} FROM goals WHERE id = $1", [goal_id]).fetchone()
    return None if values is None else _row(values)


def select_current(con: duckdb.DuckDBPyConnection, session_id: str) -> GoalRow | None:
    """The session's newest goal that is not final (active, paused or budget_limited)."""
    values = con.execute(
        f"SELECT {_COLUMN_LIST} FROM goals "
        "WHERE session_id = $1 AND list_contains($2::VARCHAR[], status) "
        "ORDER BY created_at DESC, id DESC LIMIT 1",
        [session_id, list(OPEN_GOAL_STATUSES)],
    ).fetchone()
    return None if values is None else _row(values)


def select_goals(con: duckdb.DuckDBPyConnection, session_id: str, *, limit: int) -> list[GoalRow]:
    """The session's newest ``limit`` goals (any status), newest first."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = con.execute(
        f"SELECT {_COLUMN_LIST} FROM goals WHERE session_id = $1 "
        "ORDER BY created_at DESC, id DESC LIMIT $2",
        [session_id, limit],
    ).fetchall()
    return [_row(values) for values in rows]


def tokens_since_update(con: duckdb.DuckDBPyConnection, session_id: str, goal_id: str) -> int:
    """Input + output tokens of the session's usage events (refine planning excluded) after
    the newest ``goal_update`` event of ``goal_id``: one aggregate query."""
    row = con.execute(_TOKENS_SINCE_UPDATE, [session_id, goal_id]).fetchone()
    return int(row[0]) if row is not None else 0
