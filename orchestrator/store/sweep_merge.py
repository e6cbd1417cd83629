"""Shards' results folded into one store's sweep tables (``sweep merge``, docs/sweeps.md).

Each shard of a sweep ran with its own store and exported its cells and trials. Merging them
writes the sweep, its cells and its trials into one store as if the sweep had run there, and
can be repeated: merging a shard twice, or a shard that was run again after a partial failure,
never makes a cell or a trial twice.

- A trial is kept once, by its id. A trial still ``running`` in an export belonged to a runner
  that stopped: it is stored ``abandoned`` (it never counts, as a local rerun would mark it).
- A cell is kept once, by its fingerprint. When two results of one cell meet, the more complete
  one wins — ``scored`` over ``errored`` over ``unrunnable`` over not run — and between two
  equally complete ones the later (``updated_at``); on a tie the stored one stays. So a scored
  cell is never replaced by a rerun's error, and a retried shard's new score replaces an old
  error. Its ``trials`` is the number of its trials the store holds (at least the winner's own).
- The sweep's row is made from the shards' file (spec, digest) if the store has none; a store
  whose sweep of that name came from another file (another digest) is refused. The sweep is
  ``done`` once the store holds a score for every cell of the file, else ``incomplete``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import duckdb

from orchestrator.errors import UserError
from orchestrator.store.queries import to_db_ts
from orchestrator.store.sweeps import TRIAL_COLUMNS, CellRow, select_cells, select_sweep

__all__ = ["CELL_COLUMNS", "MergeCounts", "ShardResults", "completeness", "merge_shards"]

# What a shard's export carries of each cell: every column of sweep_cells but the sweep's name.
CELL_COLUMNS: Final = tuple(f for f in CellRow.__dataclass_fields__ if f != "sweep")
_RANK: Final = {"scored": 3, "errored": 2, "unrunnable": 1}  # anything else: 0 (not run)
_ABANDONED: Final = "abandoned"


@dataclass(frozen=True)
class ShardResults:
    """One shard's export: the sweep it belongs to and its rows (times as ``datetime``)."""

    sweep: str
    digest: str
    spec: Mapping[str, Any]
    cells_total: int  # cells of the whole sweep file, every shard's
    cells: Sequence[Mapping[str, Any]]  # CELL_COLUMNS
    trials: Sequence[Mapping[str, Any]]  # TRIAL_COLUMNS but the sweep's name


@dataclass(frozen=True)
class MergeCounts:
    cells_added: int
    cells_replaced: int
    cells_kept: int
    trials_added: int
    state: str


def completeness(cell: Mapping[str, Any]) -> tuple[int, datetime]:
    """How a cell's result ranks against another of the same cell: the greater wins."""
    return _RANK.get(str(cell["state"]), 0), to_db_ts(cell["updated_at"])


def merge_shards(
    con: duckdb.DuckDBPyConnection, shards: Sequence[ShardResults], now: datetime
) -> MergeCounts:
    """Fold ``shards`` (all of one sweep and one digest) into the tables; run it inside one
    transaction."""
    if not shards:
        raise ValueError("nothing to merge")
    first = shards[0]
    if any(s.sweep != first.sweep or s.digest != first.digest for s in shards):
        raise ValueError("shards of different sweeps are merged one sweep at a time")
    name = first.sweep
    existing = select_sweep(con, name)
    if existing is not None and existing.digest != first.digest:
        raise UserError(
            f"sweep {name} in this store came from another sweep file (digest "
            f"{existing.digest[:12]}, the shards' {first.digest[:12]}): merge into another "
            "store (--into FILE)"
        )
    ts = to_db_ts(now)
    if existing is None:
        con.execute(
            "INSERT INTO sweeps (name, spec, digest, state, runner_pid, created_at, updated_at) "
            "VALUES ($1, $2, $3, 'incomplete', NULL, $4, $4)",
            [name, json.dumps(dict(first.spec), sort_keys=True), first.digest, ts],
        )
    trials_added = _merge_trials(con, name, [t for s in shards for t in s.trials])
    added, replaced, kept = _merge_cells(con, name, [c for s in shards for c in s.cells])
    _count_trials(con, name)
    total = max(s.cells_total for s in shards)
    scored = con.execute(
        "SELECT count(*) FROM sweep_cells WHERE sweep = $1 AND state = 'scored'", [name]
    ).fetchone()
    state = "done" if scored is not None and int(scored[0]) >= total else "incomplete"
    con.execute(
        "UPDATE sweeps SET state = $2, runner_pid = NULL, updated_at = $3 WHERE name = $1",
        [name, state, ts],
    )
    return MergeCounts(added, replaced, kept, trials_added, state)


def _merge_trials(
    con: duckdb.DuckDBPyConnection, name: str, trials: Sequence[Mapping[str, Any]]
) -> int:
    known = {
        str(r[0])
        for r in con.execute("SELECT id FROM sweep_trials WHERE sweep = $1", [name]).fetchall()
    }
    new: dict[str, list[Any]] = {}
    for trial in trials:
        if trial["id"] in known or trial["id"] in new:
            continue
        row = {**trial, "sweep": name}
        if row["state"] == "running":
            row["state"] = _ABANDONED
        for key in ("started_at", "finished_at"):
            if row[key] is not None:
                row[key] = to_db_ts(row[key])
        new[str(trial["id"])] = [row[c] for c in TRIAL_COLUMNS]
    if new:
        marks = ", ".join(f"${i + 1}" for i in range(len(TRIAL_COLUMNS)))
        con.executemany(
            f"INSERT INTO sweep_trials ({', '.join(TRIAL_COLUMNS)}) VALUES ({marks})",
            list(new.values()),
        )
    return len(new)


def _merge_cells(
    con: duckdb.DuckDBPyConnection, name: str, cells: Sequence[Mapping[str, Any]]
) -> tuple[int, int, int]:
    stored = {row.fingerprint: row.to_wire() for row in select_cells(con, name)}
    for row in stored.values():
        row["updated_at"] = datetime.fromisoformat(row["updated_at"])
    best: dict[str, Mapping[str, Any]] = {}
    for cell in cells:
        fingerprint = str(cell["fingerprint"])
        held = best.get(fingerprint) or stored.get(fingerprint)
        if held is None or completeness(cell) > completeness(held):
            best[fingerprint] = cell
    added = sum(1 for f in best if f not in stored)
    replaced = len(best) - added
    kept = len({str(c["fingerprint"]) for c in cells}) - len(best)
    if best:
        con.execute(
            "DELETE FROM sweep_cells WHERE sweep = $1 AND list_contains($2, fingerprint)",
            [name, list(best)],
        )
        columns = ("sweep", *CELL_COLUMNS)
        marks = ", ".join(f"${i + 1}" for i in range(len(columns)))
        con.executemany(
            f"INSERT INTO sweep_cells ({', '.join(columns)}) VALUES ({marks})",
            [[name, *(_cell_value(cell, c) for c in CELL_COLUMNS)] for cell in best.values()],
        )
    return added, replaced, kept


def _cell_value(cell: Mapping[str, Any], column: str) -> Any:
    if column == "updated_at":
        return to_db_ts(cell[column])
    if column == "state" and cell[column] == "running":
        return "pending"  # its trial's runner stopped: the cell runs again
    return cell[column]


def _count_trials(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Each cell's ``trials``: the trials the store holds of it, at least its own count."""
    con.execute(
        "UPDATE sweep_cells SET trials = greatest(sweep_cells.trials, t.n) "
        "FROM (SELECT fingerprint, count(*) AS n FROM sweep_trials WHERE sweep = $1 "
        "GROUP BY fingerprint) AS t "
        "WHERE sweep_cells.sweep = $1 AND sweep_cells.fingerprint = t.fingerprint",
        [name],
    )
