"""The sweep tables (store/sweeps.py) on a real DuckDB file: cells are added, never replaced;
a trial counts once; a dead runner's trials are abandoned and their cells run again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from orchestrator.errors import StoreError
from orchestrator.store.db import Store
from orchestrator.store.sweeps import (
    CellRow,
    SweepNotRunning,
    TrialOutcome,
    cancel_sweep,
    close_sweep,
    finish_trial,
    open_cells,
    open_sweep,
    select_cells,
    select_sweep,
    start_trial,
)
from tests.sweep_cells import cell_spec

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


SCORED = TrialOutcome(
    state="scored",
    score=1.0,
    answer="42",
    stop_reason="completed",
    error_class=None,
    error=None,
    truncated=False,
    wall_s=1.5,
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "state" / "prime-agent.duckdb") as opened:
        yield opened


async def _open(
    store: Store, cells: list[dict[str, object]], pid: int = 1
) -> tuple[int, list[CellRow]]:
    def run(con: duckdb.DuckDBPyConnection) -> tuple[int, list[CellRow]]:
        abandoned = open_sweep(
            con, name="s", spec={"name": "s"}, digest="d", runner_pid=pid, now=NOW
        )
        return abandoned, open_cells(con, "s", cells, NOW)[1]

    return await store.transaction(run)


async def test_cells_are_added_in_order_and_kept(store: Store) -> None:
    abandoned, rows = await _open(store, [cell_spec(0), cell_spec(1)])
    assert abandoned == 0
    assert [(r.fingerprint, r.state, r.position) for r in rows] == [
        ("f0", "pending", 0),
        ("f1", "pending", 1),
    ]
    # A changed file: a new cell is added after the old ones; the old rows stay.
    _, rows = await _open(store, [cell_spec(2), cell_spec(0)])
    assert [(r.fingerprint, r.position) for r in rows] == [("f2", 2), ("f0", 0)]
    everything = await store.read(lambda con: select_cells(con, "s"))
    assert [r.fingerprint for r in everything] == ["f0", "f1", "f2"]


async def test_a_trial_counts_once(store: Store) -> None:
    await _open(store, [cell_spec(0)])
    trial = await store.transaction(
        lambda con: start_trial(con, sweep="s", fingerprint="f0", session_id="s-1", now=NOW)
    )

    def finish(score: float) -> object:
        outcome = TrialOutcome(**{**SCORED.__dict__, "score": score})
        return store.transaction(
            lambda con: finish_trial(
                con,
                trial_id=trial,
                outcome=outcome,
                tokens_input=100,
                tokens_output=20,
                cost_usd=0.5,
                cost_known=True,
                now=NOW,
            )
        )

    cell = await finish(1.0)  # type: ignore[misc]
    again = await finish(0.0)  # type: ignore[misc]
    assert cell.state == "scored" and cell.score == 1.0 and cell.tokens == 120
    assert again == cell  # the repeat changed nothing
    assert cell.trials == 1 and cell.session_id == "s-1"


async def test_a_dead_runners_trials_are_abandoned_and_their_cells_run_again(
    store: Store,
) -> None:
    await _open(store, [cell_spec(0), cell_spec(1)])
    for fp, sid in (("f0", "s-1"), ("f1", "s-2")):
        await store.transaction(
            lambda con, fp=fp, sid=sid: start_trial(
                con, sweep="s", fingerprint=fp, session_id=sid, now=NOW
            )
        )
    abandoned, rows = await _open(store, [cell_spec(0), cell_spec(1)], pid=2)
    assert abandoned == 2
    assert [r.state for r in rows] == ["pending", "pending"]
    assert [r.trials for r in rows] == [1, 1]
    states = await store.read(
        lambda con: con.execute("SELECT DISTINCT state FROM sweep_trials").fetchall()
    )
    assert states == [("abandoned",)]


async def test_a_cancelled_sweep_starts_no_trial_and_names_its_running_sessions(
    store: Store,
) -> None:
    await _open(store, [cell_spec(0), cell_spec(1)])
    await store.transaction(
        lambda con: start_trial(con, sweep="s", fingerprint="f0", session_id="s-1", now=NOW)
    )
    running = await store.transaction(lambda con: cancel_sweep(con, "s", NOW))
    assert running == ["s-1"]
    with pytest.raises(SweepNotRunning, match="cancelled"):
        await store.transaction(
            lambda con: start_trial(con, sweep="s", fingerprint="f1", session_id="s-2", now=NOW)
        )
    closed = await store.transaction(lambda con: close_sweep(con, "s", "done", NOW))
    assert closed.state == "cancelled" and closed.runner_pid is None
    with pytest.raises(StoreError, match="no sweep"):
        await store.transaction(lambda con: cancel_sweep(con, "nosuch", NOW))
    row = await store.read(lambda con: select_sweep(con, "s"))
    assert row is not None and row.spec == {"name": "s"}


async def test_a_cell_this_machine_cannot_run_is_unrunnable_with_its_reason_until_it_can(
    store: Store,
) -> None:
    why = "needs a GPU: no NVIDIA container runtime in this Docker Engine"
    _, rows = await _open(store, [{**cell_spec(0), "unrunnable": why}, cell_spec(1)])
    assert [(r.state, r.stop_reason, r.error_class) for r in rows] == [
        ("unrunnable", why, "cannot_run"),
        ("pending", None, None),
    ]
    # A machine that can run it: pending again, with no reason left over.
    _, rows = await _open(store, [cell_spec(0)])
    assert (rows[0].state, rows[0].stop_reason, rows[0].error_class) == ("pending", None, None)
    # A scored cell stays scored whatever this machine lacks now.
    trial = await store.transaction(
        lambda con: start_trial(con, sweep="s", fingerprint="f1", session_id="s-1", now=NOW)
    )
    await store.transaction(
        lambda con: finish_trial(
            con,
            trial_id=trial,
            outcome=SCORED,
            tokens_input=1,
            tokens_output=1,
            cost_usd=None,
            cost_known=False,
            now=NOW,
        )
    )
    _, rows = await _open(store, [{**cell_spec(1), "unrunnable": why}])
    assert (rows[0].state, rows[0].stop_reason) == ("scored", "completed")
