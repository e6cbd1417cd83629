"""The ``sandboxes`` table: every live sandbox a daemon started, so the next daemon can adopt it.

Rows are written when a sandbox starts (and again when it is ready, or handed from the warm
pool to a session) and deleted when it stops. A daemon killed with ``kill -9`` leaves its rows
behind; at its next start (``orchestrator/sessions/adoption.py``) each row is adopted or its
sandbox removed. Print-mode sandboxes die with their process and are never recorded.

Like ``queries``, the functions here run on the store's writer thread (``db.Store``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import duckdb

from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow

__all__ = [
    "SANDBOX_STATES",
    "SandboxRow",
    "delete_sandbox",
    "select_sandboxes",
    "upsert_sandbox",
]

SandboxState = Literal["starting", "ready"]
SANDBOX_STATES: Final = ("starting", "ready")

_COLUMNS = (
    "backend, ref, session_id, url, kernel_id, token, runtime_dir, state, started_at, updated_at"
)


@dataclass(frozen=True)
class SandboxRow:
    """One recorded sandbox. ``token`` is the gateway's secret (see migration 0003)."""

    backend: str
    ref: str  # local: gateway pid; docker: container id
    session_id: str  # "pool" for an idle warm-pool sandbox
    url: str
    kernel_id: str  # "" while starting
    token: str = field(repr=False)
    runtime_dir: str
    state: SandboxState = "ready"
    started_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)


def upsert_sandbox(con: duckdb.DuckDBPyConnection, row: SandboxRow) -> None:
    """Insert the row, or update everything but ``started_at`` of the one with its key."""
    if row.state not in SANDBOX_STATES:
        raise ValueError(f"unknown sandbox state {row.state!r}")
    con.execute(
        f"INSERT INTO sandboxes ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
        "ON CONFLICT (backend, ref) DO UPDATE SET session_id = excluded.session_id, "
        "url = excluded.url, kernel_id = excluded.kernel_id, token = excluded.token, "
        "runtime_dir = excluded.runtime_dir, state = excluded.state, "
        "updated_at = excluded.updated_at",
        [
            row.backend,
            row.ref,
            row.session_id,
            row.url,
            row.kernel_id,
            row.token,
            row.runtime_dir,
            row.state,
            to_db_ts(row.started_at),
            to_db_ts(utcnow()),
        ],
    )


def delete_sandbox(con: duckdb.DuckDBPyConnection, backend: str, ref: str) -> None:
    con.execute("DELETE FROM sandboxes WHERE backend = $1 AND ref = $2", [backend, ref])


def _row(values: tuple[Any, ...]) -> SandboxRow:
    backend, ref, session_id, url, kernel_id, token, runtime_dir, state, started, updated = values
    return SandboxRow(
        backend=backend,
        ref=ref,
        session_id=session_id,
        url=url,
        kernel_id=kernel_id,
        token=token,
        runtime_dir=runtime_dir,
        state=state,
        started_at=from_db_ts(started),
        updated_at=from_db_ts(updated),
    )


def select_sandboxes(con: duckdb.DuckDBPyConnection) -> list[SandboxRow]:
    """Every recorded sandbox, oldest first."""
    rows = con.execute(f"SELECT {_COLUMNS} FROM sandboxes ORDER BY started_at, ref").fetchall()
    return [_row(values) for values in rows]
