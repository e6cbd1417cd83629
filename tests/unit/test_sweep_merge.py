"""Shards folded into one store (store/sweep_merge.py, cli/sweep_shards.py) on real DuckDB
files and real Parquet: each cell and trial once however often a shard is merged; the more
complete, then the later, result of a cell wins; shards of another sweep file are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.sweep_files import write_rows
from orchestrator.cli.sweep_shards import (
    CELL_EXPORT_TYPES,
    find_exports,
    missing_shards,
    read_exports,
)
from orchestrator.errors import UserError
from orchestrator.store.db import Store
from orchestrator.store.sweep_merge import CELL_COLUMNS, MergeCounts, ShardResults, merge_shards
from orchestrator.store.sweeps import TRIAL_COLUMNS, select_cells, select_sweep

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
SPEC = {"name": "s", "seeds": [1]}


def _cell(n: int, state: str, score: float | None, at: datetime, trials: int = 1) -> dict[str, Any]:
    return {
        "fingerprint": f"f{n}",
        "suite": "s-niah",
        "task_id": f"s-niah/600/{n}",
        "model": "openai/fake",
        "variant": "rlm",
        "seed": 1,
        "context_tokens": 600,
        "state": state,
        "score": score,
        "answer": None if score is None else str(score),
        "tokens": 10,
        "cost_usd": 0.01,
        "cost_known": True,
        "wall_s": 1.0,
        "stop_reason": "completed" if state == "scored" else "error",
        "error_class": None if state == "scored" else "provider",
        "truncated": False,
        "session_id": f"sess-{n}-{at.minute}",
        "trials": trials,
        "position": n,
        "updated_at": at,
    }


def _trial(trial_id: str, n: int, state: str, at: datetime) -> dict[str, Any]:
    row = {c: None for c in TRIAL_COLUMNS if c != "sweep"}
    return {
        **row,
        "id": trial_id,
        "fingerprint": f"f{n}",
        "session_id": f"sess-{trial_id}",
        "state": state,
        "started_at": at,
        "finished_at": None if state == "running" else at,
    }


def _shard(
    cells: list[dict[str, Any]], trials: list[dict[str, Any]], digest: str = "d1", total: int = 3
) -> ShardResults:
    return ShardResults(
        sweep="s", digest=digest, spec=SPEC, cells_total=total, cells=cells, trials=trials
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "merged.duckdb") as opened:
        yield opened


async def _merge(store: Store, *shards: ShardResults) -> MergeCounts:
    return await store.transaction(lambda con: merge_shards(con, shards, T0))


async def _state(store: Store) -> dict[str, tuple[str, float | None, int]]:
    rows = await store.read(lambda con: select_cells(con, "s"))
    return {r.fingerprint: (r.state, r.score, r.trials) for r in rows}


async def test_two_shards_make_one_sweep_and_merging_again_adds_nothing(store: Store) -> None:
    zero = _shard(
        [_cell(0, "scored", 1.0, T0), _cell(2, "scored", 0.0, T0)],
        [_trial("t-a", 0, "scored", T0), _trial("t-b", 2, "scored", T0)],
    )
    one = _shard([_cell(1, "scored", 0.5, T0)], [_trial("t-c", 1, "scored", T0)])
    first = await _merge(store, zero, one)
    assert first == MergeCounts(3, 0, 0, 3, "done")
    merged = await _state(store)
    assert merged == {"f0": ("scored", 1.0, 1), "f1": ("scored", 0.5, 1), "f2": ("scored", 0.0, 1)}
    rows = await store.read(lambda con: select_cells(con, "s"))
    assert [r.fingerprint for r in rows] == ["f0", "f1", "f2"]  # the file's order
    sweep = await store.read(lambda con: select_sweep(con, "s"))
    assert sweep is not None and sweep.digest == "d1" and sweep.spec == SPEC
    assert sweep.state == "done" and sweep.runner_pid is None

    again = await _merge(store, one, zero)
    assert again == MergeCounts(0, 0, 3, 0, "done")
    assert await _state(store) == merged
    counted = await store.read(
        lambda con: con.execute("SELECT count(*), count(DISTINCT id) FROM sweep_trials").fetchone()
    )
    assert counted == (3, 3)


async def test_a_complete_result_wins_then_the_later(store: Store) -> None:
    later = T0 + timedelta(minutes=5)
    # A shard that failed part way: f0 errored, f1 never ran (its trial left running).
    failed = _shard(
        [_cell(0, "errored", None, T0), _cell(1, "running", None, T0)],
        [_trial("t-1", 0, "errored", T0), _trial("t-2", 1, "running", T0)],
    )
    counts = await _merge(store, failed)
    assert counts.state == "incomplete"
    assert await _state(store) == {"f0": ("errored", None, 1), "f1": ("pending", None, 1)}
    trials = await store.read(
        lambda con: con.execute("SELECT id, state FROM sweep_trials ORDER BY id").fetchall()
    )
    assert trials == [("t-1", "errored"), ("t-2", "abandoned")]

    # Rerun in a fresh store: both scored, with their own trials.
    rerun = _shard(
        [
            _cell(0, "scored", 1.0, later),
            _cell(1, "scored", 0.0, later),
            _cell(2, "scored", 1.0, later),
        ],
        [
            _trial("t-3", 0, "scored", later),
            _trial("t-4", 1, "scored", later),
            _trial("t-5", 2, "scored", later),
        ],
    )
    counts = await _merge(store, rerun)
    assert counts == MergeCounts(1, 2, 0, 3, "done")
    # Each cell's trials: every trial the store holds of it.
    assert await _state(store) == {
        "f0": ("scored", 1.0, 2),
        "f1": ("scored", 0.0, 2),
        "f2": ("scored", 1.0, 1),
    }

    # The old, failed export merged again: a score is never replaced by an error.
    counts = await _merge(store, failed)
    assert (counts.cells_added, counts.cells_replaced, counts.trials_added) == (0, 0, 0)
    assert (await _state(store))["f0"] == ("scored", 1.0, 2)

    # Two scores of one cell: the later one.
    newest = _shard([_cell(0, "scored", 0.25, later + timedelta(minutes=1))], [])
    await _merge(store, newest)
    assert (await _state(store))["f0"][:2] == ("scored", 0.25)


async def test_a_store_whose_sweep_came_from_another_file_is_refused(store: Store) -> None:
    await _merge(store, _shard([_cell(0, "scored", 1.0, T0)], []))
    with pytest.raises(UserError) as raised:
        await _merge(store, _shard([_cell(1, "scored", 1.0, T0)], [], digest="d2"))
    assert "came from another sweep file" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert set(await _state(store)) == {"f0"}  # nothing of it was written


def _export(
    directory: Path, stem: str, cells: list[dict[str, Any]], digest: str, name: str = "s"
) -> Path:
    rows = [
        {
            **c,
            "sweep": name,
            "digest": digest,
            "spec": '{"name": "s"}',
            "shard": 0,
            "shards": 2,
            "cells_total": 3,
            "updated_at": c["updated_at"].isoformat(),
        }
        for c in cells
    ]
    path = directory / f"{stem}.cells.parquet"
    fields = ("sweep", "digest", "spec", "shard", "shards", "cells_total", *CELL_COLUMNS)
    write_rows(rows, path, "parquet", fields, CELL_EXPORT_TYPES)
    return path


def test_exports_of_another_sweep_file_are_refused_in_one_line(tmp_path: Path) -> None:
    a = _export(tmp_path, "s.shard-0-of-2", [_cell(0, "scored", 1.0, T0)], "d1")
    b = _export(tmp_path, "s.shard-1-of-2", [_cell(1, "scored", 1.0, T0)], "d2")
    assert find_exports([tmp_path]) == [a.resolve(), b.resolve()]
    with pytest.raises(UserError) as raised:
        read_exports(find_exports([tmp_path]))
    message = str(raised.value)
    assert "another sweep file" in message and "\n" not in message
    (shard,) = read_exports([a])
    assert shard.digest == "d1" and shard.cells_total == 3 and shard.trials == []
    assert shard.cells[0]["updated_at"] == T0  # times come back as times
    assert missing_shards([a]) == ["1/2"]


def test_what_is_not_a_shard_export_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no shard exports"):
        find_exports([tmp_path])
    other = tmp_path / "cells.parquet"
    other.write_bytes(b"")
    with pytest.raises(UserError, match=r"not a shard's cells file"):
        find_exports([other])
    plain = tmp_path / "x.cells.parquet"
    write_rows([{"a": "1"}], plain, "parquet", ("a",), {})
    with pytest.raises(UserError, match="not a shard export"):
        read_exports([plain])
