"""The ``refinements`` table: one row per ``/refine`` or rollback (docs/spec.md §6,
docs/harness.md).

A refinement is planned in the background and applied at a later turn boundary, possibly by
another daemon after a restart, so its whole state lives in this row rather than in memory:
the plan (``edits`` with their baseline versions), what applying it did (each edit's
before/after version), and the outcome measured N turns later. ``status`` moves planning →
planned → applied | failed | discarded.

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal, get_args

import duckdb

from orchestrator.ids import new_event_id
from orchestrator.store.queries import utcnow
from orchestrator.store.rows import RowTable

__all__ = [
    "REFINEMENT_ID_PREFIX",
    "REFINEMENT_STATUSES",
    "RefinementRow",
    "RefinementStatus",
    "insert_refinement",
    "new_refinement_id",
    "select_refinement",
    "select_refinements",
    "update_refinement",
]

RefinementStatus = Literal["planning", "planned", "applied", "failed", "discarded"]
REFINEMENT_STATUSES: Final[tuple[RefinementStatus, ...]] = get_args(RefinementStatus)
REFINEMENT_ID_PREFIX: Final = "r-"

_JSON_FIELDS = frozenset({"edits", "outcome"})
_TIME_FIELDS = frozenset({"created_at", "planned_at", "applied_at", "outcome_at"})


def new_refinement_id() -> str:
    """``r-`` and a sortable unique suffix: ids sort in creation order, like event ids."""
    return REFINEMENT_ID_PREFIX + new_event_id()


@dataclass(frozen=True)
class RefinementRow:
    """One row of ``refinements``; the migration (0005) documents each column."""

    id: str
    session_id: str
    owner: str
    scope: str
    trigger: str
    instructions: str | None = None
    status: RefinementStatus = "planning"
    summary: str | None = None
    rationale: str | None = None
    expected_outcome: str | None = None
    edits: list[dict[str, Any]] = field(default_factory=list)
    rollback_of: str | None = None
    error: str | None = None
    turn_index: int | None = None
    outcome: dict[str, Any] | None = None
    created_at: datetime = field(default_factory=utcnow)
    planned_at: datetime | None = None
    applied_at: datetime | None = None
    outcome_at: datetime | None = None

    def to_wire(self) -> dict[str, Any]:
        """JSON types (times as ISO-8601 UTC), as the control API and the kernel see it."""
        wire: dict[str, Any] = {}
        for name in _WIRE_FIELDS:
            value = getattr(self, name)
            wire[name] = value.isoformat() if isinstance(value, datetime) else value
        return wire


_COLUMNS: Final = tuple(f.name for f in fields(RefinementRow))
_WIRE_FIELDS: Final = _COLUMNS
_COLUMN_LIST = ", ".join(_COLUMNS)


_TABLE: Final = RowTable(
    table="refinements",
    what="refinement",
    columns=_COLUMNS,
    make=RefinementRow,
    json_fields=_JSON_FIELDS,
    time_fields=_TIME_FIELDS,
    statuses=REFINEMENT_STATUSES,
)


def insert_refinement(con: duckdb.DuckDBPyConnection, row: RefinementRow) -> RefinementRow:
    return _TABLE.insert(con, row)


def update_refinement(
    con: duckdb.DuckDBPyConnection, refinement_id: str, **changes: Any
) -> RefinementRow:
    """Set the named columns of one refinement; the row as stored afterwards (``RowTable.update``:
    ``ValueError`` for an unknown column or status, ``HarnessNotFound`` for no such row)."""
    return _TABLE.update(con, refinement_id, changes)


def select_refinement(con: duckdb.DuckDBPyConnection, refinement_id: str) -> RefinementRow | None:
    return _TABLE.select(con, refinement_id)


def select_refinements(
    con: duckdb.DuckDBPyConnection,
    *,
    owners: Sequence[str] | None = None,
    session_id: str | None = None,
    limit: int,
) -> list[RefinementRow]:
    """The newest ``limit`` refinements, newest first, of ``owners`` and/or ``session_id``."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    conditions = ["TRUE"]
    params: list[Any] = [limit]
    if owners is not None:
        params.append(list(dict.fromkeys(owners)))
        conditions.append(f"list_contains(${len(params)}::VARCHAR[], owner)")
    if session_id is not None:
        params.append(session_id)
        conditions.append(f"session_id = ${len(params)}")
    rows = con.execute(
        f"SELECT {_COLUMN_LIST} FROM refinements WHERE {' AND '.join(conditions)} "
        "ORDER BY created_at DESC, id DESC LIMIT $1",
        params,
    ).fetchall()
    return [_TABLE.row(values) for values in rows]
