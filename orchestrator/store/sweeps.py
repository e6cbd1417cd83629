"""The ``sweeps``, ``sweep_cells`` and ``sweep_trials`` tables (migration 0010, docs/sweeps.md).

Invariants, kept by the functions here (each runs inside one store transaction):

- a cell's outcome columns are its latest *finished* trial's, and a cell is ``scored`` only
  through ``finish_trial``: a trial counts once (finishing it again changes nothing);
- a trial left ``running`` when its sweep is opened again belonged to a runner that died: it
  becomes ``abandoned`` and never counts, and its cell goes back to ``pending``;
- cells are only ever added: running a changed sweep file adds the cells whose fingerprints
  are new and leaves the old rows as they were (``sweep status`` shows the file's cells);
- a cell this machine cannot run (the runner says why when it adds the cells) is
  ``unrunnable`` with the reason as its stop reason and error class ``cannot_run``, unless it
  is scored or running; added again without a reason, it is ``pending`` again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final

import duckdb

from orchestrator.errors import StoreError
from orchestrator.ids import new_event_id
from orchestrator.store.queries import from_db_ts, to_db_ts

__all__ = [
    "CANNOT_RUN",
    "CELL_STATES",
    "FINISHED_TRIAL_STATES",
    "SWEEP_STATES",
    "TRIAL_COLUMNS",
    "TRIAL_ID_PREFIX",
    "UNRUNNABLE",
    "CellRow",
    "SweepNotRunning",
    "SweepRow",
    "TrialOutcome",
    "cancel_sweep",
    "close_sweep",
    "finish_trial",
    "open_cells",
    "open_sweep",
    "select_cells",
    "select_sweep",
    "select_sweeps",
    "select_trials",
    "start_trial",
    "trial_session",
]

SWEEP_STATES: Final = ("running", "done", "incomplete", "cancelled", "budget")
CELL_STATES: Final = ("pending", "running", "scored", "errored", "unrunnable")
UNRUNNABLE: Final = "unrunnable"
CANNOT_RUN: Final = "cannot_run"  # an unrunnable cell's error class
FINISHED_TRIAL_STATES: Final = ("scored", "errored")
TRIAL_ID_PREFIX: Final = "t-"


class SweepNotRunning(StoreError):
    """A trial was asked to start in a sweep that is not running (cancelled, or closed)."""


@dataclass(frozen=True)
class SweepRow:
    name: str
    spec: dict[str, Any]
    digest: str
    state: str
    runner_pid: int | None
    created_at: datetime
    updated_at: datetime

    def to_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        wire["created_at"] = self.created_at.isoformat()
        wire["updated_at"] = self.updated_at.isoformat()
        return wire


@dataclass(frozen=True)
class CellRow:
    sweep: str
    fingerprint: str
    suite: str
    task_id: str
    model: str
    variant: str
    seed: int
    context_tokens: int | None
    state: str
    score: float | None
    answer: str | None
    tokens: int | None
    cost_usd: float | None
    cost_known: bool | None
    wall_s: float | None
    stop_reason: str | None
    error_class: str | None
    truncated: bool | None
    session_id: str | None
    trials: int
    position: int
    updated_at: datetime

    def to_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        wire["updated_at"] = self.updated_at.isoformat()
        return wire


@dataclass(frozen=True)
class TrialOutcome:
    """What the runner knows of a finished trial; the daemon adds the tree's usage."""

    state: str  # scored | errored
    score: float | None
    answer: str | None
    stop_reason: str
    error_class: str | None
    error: str | None
    truncated: bool
    wall_s: float


_SWEEP_COLUMNS: Final = "name, spec, digest, state, runner_pid, created_at, updated_at"
_CELL_FIELDS: Final = tuple(CellRow.__dataclass_fields__)
_CELL_COLUMNS: Final = ", ".join(_CELL_FIELDS)
_CELL_KEYS: Final = ("fingerprint", "suite", "task_id", "model", "variant", "seed")
# Every column of sweep_trials, in the table's order (a shard's export carries them all).
TRIAL_COLUMNS: Final = (
    "id",
    "sweep",
    "fingerprint",
    "session_id",
    "state",
    "score",
    "answer",
    "tokens_input",
    "tokens_output",
    "cost_usd",
    "cost_known",
    "wall_s",
    "stop_reason",
    "error_class",
    "error",
    "truncated",
    "started_at",
    "finished_at",
)
_TRIAL_TIMES: Final = ("started_at", "finished_at")


def _sweep(values: Sequence[Any]) -> SweepRow:
    name, spec, digest, state, pid, created, updated = values
    return SweepRow(
        name=name,
        spec=json.loads(spec),
        digest=digest,
        state=state,
        runner_pid=pid,
        created_at=from_db_ts(created),
        updated_at=from_db_ts(updated),
    )


def _cell(values: Sequence[Any]) -> CellRow:
    data = dict(zip(_CELL_FIELDS, values, strict=True))
    data["updated_at"] = from_db_ts(data["updated_at"])
    return CellRow(**data)


def select_sweep(con: duckdb.DuckDBPyConnection, name: str) -> SweepRow | None:
    row = con.execute(f"SELECT {_SWEEP_COLUMNS} FROM sweeps WHERE name = $1", [name]).fetchone()
    return None if row is None else _sweep(row)


def select_sweeps(con: duckdb.DuckDBPyConnection, limit: int) -> list[SweepRow]:
    """The newest ``limit`` sweeps (by their last change), newest first."""
    rows = con.execute(
        f"SELECT {_SWEEP_COLUMNS} FROM sweeps ORDER BY updated_at DESC, name LIMIT $1", [limit]
    ).fetchall()
    return [_sweep(values) for values in rows]


def select_cells(
    con: duckdb.DuckDBPyConnection,
    name: str,
    fingerprints: Sequence[str] | None = None,
    *,
    offset: int = 0,
    limit: int | None = None,
) -> list[CellRow]:
    """The sweep's cells in the file's order; only ``fingerprints`` when given; the page
    ``offset``..``offset + limit`` when ``limit`` is given."""
    sql = f"SELECT {_CELL_COLUMNS} FROM sweep_cells WHERE sweep = $1"
    args: list[Any] = [name]
    if fingerprints is not None:
        sql += " AND list_contains($2, fingerprint)"
        args.append(list(fingerprints))
    sql += " ORDER BY position, fingerprint"
    if limit is not None:
        sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
    rows = con.execute(sql, args).fetchall()
    return [_cell(values) for values in rows]


def select_trials(
    con: duckdb.DuckDBPyConnection, name: str, fingerprints: Sequence[str]
) -> list[dict[str, Any]]:
    """Every trial of the given cells, oldest first, as wire data (times in ISO 8601)."""
    rows = con.execute(
        f"SELECT {', '.join(TRIAL_COLUMNS)} FROM sweep_trials "
        "WHERE sweep = $1 AND list_contains($2, fingerprint) ORDER BY started_at, id",
        [name, list(fingerprints)],
    ).fetchall()
    trials: list[dict[str, Any]] = []
    for values in rows:
        trial = dict(zip(TRIAL_COLUMNS, values, strict=True))
        for key in _TRIAL_TIMES:
            if trial[key] is not None:
                trial[key] = from_db_ts(trial[key]).isoformat()
        trials.append(trial)
    return trials


def open_sweep(
    con: duckdb.DuckDBPyConnection,
    *,
    name: str,
    spec: dict[str, Any],
    digest: str,
    runner_pid: int,
    now: datetime,
) -> int:
    """Create the sweep or take it over (the caller checked that no other runner is alive):
    the trials a dead runner left running are abandoned and their cells run again. Returns
    how many trials were abandoned."""
    ts = to_db_ts(now)
    spec_text = json.dumps(spec, sort_keys=True)
    if select_sweep(con, name) is None:
        con.execute(
            f"INSERT INTO sweeps ({_SWEEP_COLUMNS}) VALUES ($1, $2, $3, 'running', $4, $5, $5)",
            [name, spec_text, digest, runner_pid, ts],
        )
    else:
        con.execute(
            "UPDATE sweeps SET spec = $2, digest = $3, state = 'running', runner_pid = $4, "
            "updated_at = $5 WHERE name = $1",
            [name, spec_text, digest, runner_pid, ts],
        )
    abandoned = con.execute(
        "UPDATE sweep_trials SET state = 'abandoned', finished_at = $2 "
        "WHERE sweep = $1 AND state = 'running' RETURNING id",
        [name, ts],
    ).fetchall()
    con.execute(
        "UPDATE sweep_cells SET state = CASE WHEN stop_reason IS NULL "
        "THEN 'pending' ELSE 'errored' END, updated_at = $2 "
        "WHERE sweep = $1 AND state = 'running'",
        [name, ts],
    )
    return len(abandoned)


def open_cells(
    con: duckdb.DuckDBPyConnection, name: str, cells: Sequence[dict[str, Any]], now: datetime
) -> tuple[int, list[CellRow]]:
    """Add the cells whose fingerprints are new (after the sweep's others, in the given
    order); how many were new, and the rows of ``cells`` in their order."""
    existing = {
        row[0]
        for row in con.execute(
            "SELECT fingerprint FROM sweep_cells WHERE sweep = $1", [name]
        ).fetchall()
    }
    position = con.execute(
        "SELECT coalesce(max(position) + 1, 0) FROM sweep_cells WHERE sweep = $1", [name]
    ).fetchone()
    next_position = int(position[0]) if position is not None else 0
    new = [c for c in cells if c["fingerprint"] not in existing]
    if new:
        ts = to_db_ts(now)
        con.executemany(
            "INSERT INTO sweep_cells (sweep, fingerprint, suite, task_id, model, variant, seed, "
            "context_tokens, state, trials, position, updated_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $10)",
            [
                [name, *(c[k] for k in _CELL_KEYS), c.get("context_tokens"), next_position + i, ts]
                for i, c in enumerate(new)
            ],
        )
    _mark_unrunnable(con, name, cells, now)
    wanted = [c["fingerprint"] for c in cells]
    by_print = {row.fingerprint: row for row in select_cells(con, name, wanted)}
    return len(new), [by_print[f] for f in wanted]


def _mark_unrunnable(
    con: duckdb.DuckDBPyConnection, name: str, cells: Sequence[dict[str, Any]], now: datetime
) -> None:
    """Mark the cells given with a reason ``unrunnable`` (not a scored or running one), and
    put the ``unrunnable`` ones given without a reason back to ``pending``."""
    ts = to_db_ts(now)
    marked = [[name, c["fingerprint"], c["unrunnable"], ts] for c in cells if c.get("unrunnable")]
    if marked:
        con.executemany(
            f"UPDATE sweep_cells SET state = '{UNRUNNABLE}', stop_reason = $3, "
            f"error_class = '{CANNOT_RUN}', updated_at = $4 WHERE sweep = $1 AND "
            f"fingerprint = $2 AND state IN ('pending', 'errored', '{UNRUNNABLE}')",
            marked,
        )
    runnable = [c["fingerprint"] for c in cells if not c.get("unrunnable")]
    if runnable:
        con.execute(
            "UPDATE sweep_cells SET state = 'pending', stop_reason = NULL, error_class = NULL, "
            f"updated_at = $3 WHERE sweep = $1 AND state = '{UNRUNNABLE}' "
            "AND list_contains($2, fingerprint)",
            [name, runnable, ts],
        )


def trial_session(con: duckdb.DuckDBPyConnection, trial_id: str) -> str:
    row = con.execute("SELECT session_id FROM sweep_trials WHERE id = $1", [trial_id]).fetchone()
    if row is None:
        raise StoreError(f"no trial {trial_id!r}")
    return str(row[0])


def start_trial(
    con: duckdb.DuckDBPyConnection,
    *,
    sweep: str,
    fingerprint: str,
    session_id: str,
    now: datetime,
) -> str:
    """A new trial of the cell, running in ``session_id``; refused unless the sweep runs."""
    row = select_sweep(con, sweep)
    if row is None:
        raise StoreError(f"no sweep {sweep!r}")
    if row.state != "running":
        raise SweepNotRunning(f"sweep {sweep} is {row.state}")
    ts = to_db_ts(now)
    updated = con.execute(
        "UPDATE sweep_cells SET state = 'running', trials = trials + 1, session_id = $3, "
        "updated_at = $4 WHERE sweep = $1 AND fingerprint = $2 RETURNING fingerprint",
        [sweep, fingerprint, session_id, ts],
    ).fetchall()
    if not updated:
        raise StoreError(f"sweep {sweep} has no cell {fingerprint}")
    trial_id = TRIAL_ID_PREFIX + new_event_id()
    con.execute(
        "INSERT INTO sweep_trials (id, sweep, fingerprint, session_id, state, started_at) "
        "VALUES ($1, $2, $3, $4, 'running', $5)",
        [trial_id, sweep, fingerprint, session_id, ts],
    )
    return trial_id


def finish_trial(
    con: duckdb.DuckDBPyConnection,
    *,
    trial_id: str,
    outcome: TrialOutcome,
    tokens_input: int,
    tokens_output: int,
    cost_usd: float | None,
    cost_known: bool,
    now: datetime,
) -> CellRow:
    """Record a trial's outcome, and make it its cell's, once: a trial no longer ``running``
    (finished before, or abandoned) changes nothing and its cell is returned as it is."""
    if outcome.state not in FINISHED_TRIAL_STATES:
        raise ValueError(f"a trial finishes scored or errored, not {outcome.state!r}")
    found = con.execute(
        "SELECT sweep, fingerprint, state FROM sweep_trials WHERE id = $1", [trial_id]
    ).fetchone()
    if found is None:
        raise StoreError(f"no trial {trial_id!r}")
    sweep, fingerprint, state = found
    if state == "running":
        ts = to_db_ts(now)
        con.execute(
            "UPDATE sweep_trials SET state = $2, score = $3, answer = $4, tokens_input = $5, "
            "tokens_output = $6, cost_usd = $7, cost_known = $8, wall_s = $9, "
            "stop_reason = $10, error_class = $11, error = $12, truncated = $13, "
            "finished_at = $14 WHERE id = $1",
            [
                trial_id,
                outcome.state,
                outcome.score,
                outcome.answer,
                tokens_input,
                tokens_output,
                cost_usd,
                cost_known,
                outcome.wall_s,
                outcome.stop_reason,
                outcome.error_class,
                outcome.error,
                outcome.truncated,
                ts,
            ],
        )
        con.execute(
            "UPDATE sweep_cells SET state = $3, score = $4, answer = $5, tokens = $6, "
            "cost_usd = $7, cost_known = $8, wall_s = $9, stop_reason = $10, "
            "error_class = $11, truncated = $12, updated_at = $13 "
            "WHERE sweep = $1 AND fingerprint = $2",
            [
                sweep,
                fingerprint,
                outcome.state,
                outcome.score,
                outcome.answer,
                tokens_input + tokens_output,
                cost_usd,
                cost_known,
                outcome.wall_s,
                outcome.stop_reason,
                outcome.error_class,
                outcome.truncated,
                ts,
            ],
        )
    (cell,) = select_cells(con, sweep, [fingerprint])
    return cell


def cancel_sweep(con: duckdb.DuckDBPyConnection, name: str, now: datetime) -> list[str]:
    """Mark the sweep cancelled (no trial starts from now on); the sessions of its running
    trials, for the caller to abort."""
    if select_sweep(con, name) is None:
        raise StoreError(f"no sweep {name!r}")
    con.execute(
        "UPDATE sweeps SET state = 'cancelled', updated_at = $2 WHERE name = $1",
        [name, to_db_ts(now)],
    )
    rows = con.execute(
        "SELECT session_id FROM sweep_trials WHERE sweep = $1 AND state = 'running'", [name]
    ).fetchall()
    return [str(r[0]) for r in rows]


def close_sweep(con: duckdb.DuckDBPyConnection, name: str, state: str, now: datetime) -> SweepRow:
    """The runner is done with the sweep: ``state`` unless it was cancelled meanwhile."""
    if state not in SWEEP_STATES:
        raise ValueError(f"unknown sweep state {state!r}")
    con.execute(
        "UPDATE sweeps SET state = CASE WHEN state = 'cancelled' THEN state ELSE $2 END, "
        "runner_pid = NULL, updated_at = $3 WHERE name = $1",
        [name, state, to_db_ts(now)],
    )
    row = select_sweep(con, name)
    if row is None:
        raise StoreError(f"no sweep {name!r}")
    return row
