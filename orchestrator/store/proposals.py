"""The ``harness_proposals`` table: global harness writes waiting for the user (docs/harness.md).

A kernel, or a refinement the agent started, may not change the global harness: what it asks
for is stored here as a proposal (migration 0008 documents each column) and reaches no system
prompt until the user accepts it. ``orchestrator/harness/proposals.py`` makes, accepts and
rejects them; these functions only read and write the rows. Like ``refinements``, they take the
DuckDB connection and run on the store's writer thread (``Store.read`` / ``Store.transaction``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final, Literal, get_args

import duckdb

from orchestrator.ids import new_event_id
from orchestrator.store.queries import utcnow
from orchestrator.store.rows import RowTable

__all__ = [
    "PROPOSAL_ID_PREFIX",
    "PROPOSAL_STATUSES",
    "ProposalRow",
    "ProposalStatus",
    "count_pending",
    "insert_proposal",
    "new_proposal_id",
    "select_proposal",
    "select_proposals",
    "update_proposal",
]

ProposalStatus = Literal["pending", "accepted", "rejected"]
PROPOSAL_STATUSES: Final[tuple[ProposalStatus, ...]] = get_args(ProposalStatus)
PROPOSAL_ID_PREFIX: Final = "p-"

_JSON_FIELDS = frozenset({"fields"})
_TIME_FIELDS = frozenset({"created_at", "decided_at"})


def new_proposal_id() -> str:
    """``p-`` and a sortable unique suffix (ids sort in creation order, like event ids)."""
    return PROPOSAL_ID_PREFIX + new_event_id()


@dataclass(frozen=True)
class ProposalRow:
    """One row of ``harness_proposals``."""

    id: str
    owner: str
    proposer: str
    action: str
    kind: str
    entry_id: str
    fields: dict[str, Any]
    base_version: int | None
    source: str
    reason: str
    session_id: str
    refinement_id: str | None = None
    status: ProposalStatus = "pending"
    created_at: datetime = field(default_factory=utcnow)
    decided_at: datetime | None = None
    decided_by: str | None = None
    decision_note: str | None = None
    result_version: int | None = None

    @property
    def target(self) -> str:
        """``global:prompt:be_brief``: the entry, as ``harness list`` names it."""
        return f"{self.owner}:{self.kind}:{self.entry_id}"

    def to_wire(self) -> dict[str, Any]:
        """JSON types (times as ISO-8601 UTC); ``fields`` is a copy."""
        wire: dict[str, Any] = {}
        for name in _COLUMNS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, dict):
                value = json.loads(json.dumps(value))
            wire[name] = value
        wire["target"] = self.target
        return wire


_COLUMNS: Final = tuple(f.name for f in fields(ProposalRow))
_COLUMN_LIST = ", ".join(_COLUMNS)


_TABLE: Final = RowTable(
    table="harness_proposals",
    what="proposal",
    columns=_COLUMNS,
    make=ProposalRow,
    json_fields=_JSON_FIELDS,
    time_fields=_TIME_FIELDS,
    statuses=PROPOSAL_STATUSES,
)


def insert_proposal(con: duckdb.DuckDBPyConnection, row: ProposalRow) -> ProposalRow:
    return _TABLE.insert(con, row)


def update_proposal(
    con: duckdb.DuckDBPyConnection, proposal_id: str, **changes: Any
) -> ProposalRow:
    """Set the named columns of one proposal; the row as stored afterwards (``RowTable.update``:
    ``ValueError`` for an unknown column or status, ``HarnessNotFound`` for no such row)."""
    return _TABLE.update(con, proposal_id, changes)


def select_proposal(con: duckdb.DuckDBPyConnection, proposal_id: str) -> ProposalRow | None:
    return _TABLE.select(con, proposal_id)


def select_proposals(
    con: duckdb.DuckDBPyConnection,
    *,
    status: ProposalStatus | None = None,
    proposers: Sequence[str] | None = None,
    limit: int,
) -> list[ProposalRow]:
    """The newest ``limit`` proposals, newest first (of one status, of these proposer trees)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    conditions = ["TRUE"]
    params: list[Any] = [limit]
    if status is not None:
        _TABLE.check_status(status)
        params.append(status)
        conditions.append(f"status = ${len(params)}")
    if proposers is not None:
        params.append(list(dict.fromkeys(proposers)))
        conditions.append(f"list_contains(${len(params)}::VARCHAR[], proposer)")
    rows = con.execute(
        f"SELECT {_COLUMN_LIST} FROM harness_proposals WHERE {' AND '.join(conditions)} "
        "ORDER BY created_at DESC, id DESC LIMIT $1",
        params,
    ).fetchall()
    return [_TABLE.row(values) for values in rows]


def count_pending(con: duckdb.DuckDBPyConnection, proposer: str) -> int:
    row = con.execute(
        "SELECT count(*) FROM harness_proposals WHERE proposer = $1 AND status = 'pending'",
        [proposer],
    ).fetchone()
    return int(row[0]) if row is not None else 0
