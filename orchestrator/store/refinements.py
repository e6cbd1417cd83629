"""The ``refinements`` table: one row per ``/refine`` or rollback (SPEC.md §6, docs/harness.md).

A refinement is planned in the background and applied at a later turn boundary, possibly by
another daemon after a restart, so its whole state lives in this row rather than in memory:
the plan (``edits`` with their baseline versions), what applying it did (each edit's
before/after version), and the outcome measured N turns later. ``status`` moves planning →
planned → applied | failed | discarded.

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal, get_args

import duckdb

from orchestrator.errors import HarnessNotFound
from orchestrator.ids import new_event_id
from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow

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


def _check_status(value: object) -> None:
    if value not in REFINEMENT_STATUSES:
        raise ValueError(
            f"unknown refinement status {value!r}: expected one of {', '.join(REFINEMENT_STATUSES)}"
        )


def _to_db(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return None if value is None else json.dumps(value, ensure_ascii=False)
    if name in _TIME_FIELDS:
        return None if value is None else to_db_ts(value)
    return value


def _row(values: Sequence[Any]) -> RefinementRow:
    data = dict(zip(_COLUMNS, values, strict=True))
    for name in _JSON_FIELDS:
        if data[name] is not None:
            data[name] = json.loads(data[name])
    for name in _TIME_FIELDS:
        if data[name] is not None:
            data[name] = from_db_ts(data[name])
    return RefinementRow(**data)


def insert_refinement(con: duckdb.DuckDBPyConnection, row: RefinementRow) -> RefinementRow:
    _check_status(row.status)
    placeholders = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
    con.execute(
        f"INSERT INTO refinements ({_COLUMN_LIST}) VALUES ({placeholders})",
        [_to_db(name, getattr(row, name)) for name in _COLUMNS],
    )
    return row


def update_refinement(
    con: duckdb.DuckDBPyConnection, refinement_id: str, **changes: Any
) -> RefinementRow:
    """Set the named columns of one refinement; returns the row as stored afterwards.

    ``ValueError`` for a name that is not a column (or ``id``) or an unknown status;
    ``HarnessNotFound`` when there is no such refinement.
    """
    unknown = sorted(name for name in changes if name not in _COLUMNS or name == "id")
    if unknown:
        raise ValueError(f"refinements have no updatable field(s) {', '.join(unknown)}")
    if "status" in changes:
        _check_status(changes["status"])
    if changes:
        names = list(changes)
        assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
        con.execute(
            f"UPDATE refinements SET {assignments} WHERE id = $1",
            [refinement_id, *(_to_db(name, changes[name]) for name in names)],
        )
    row = select_refinement(con, refinement_id)
    if row is None:
        raise HarnessNotFound(f"no refinement {refinement_id!r}")
    return row


def select_refinement(con: duckdb.DuckDBPyConnection, refinement_id: str) -> RefinementRow | None:
    values = con.execute(
        f"SELECT {_COLUMN_LIST} FROM refinements WHERE id = $1", [refinement_id]
    ).fetchone()
    return None if values is None else _row(values)


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
    return [_row(values) for values in rows]
