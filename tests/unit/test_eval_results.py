"""Evaluation results (orchestrator/store/eval_results.py): tree totals, the row, the JSON file."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.control.eval_config import EvalConfig, load_eval_config
from orchestrator.errors import StoreError
from orchestrator.ids import new_session_id
from orchestrator.store import eval_results
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.eval_results import (
    EVAL_RESULT_ID_PREFIX,
    EvalResultRow,
    build_result,
    insert_eval_result,
    save_result,
    select_eval_result,
    select_recent_eval_results,
    select_tree_usage,
    write_result_json,
)
from orchestrator.store.events import GateResultPayload, UsagePayload

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
CONFIG_TEXT = """\
name: tree-run
task: do it
model: {name: openai/m, input_cost_per_mtok: 1.0}
autonomous:
  gates: [python -m pytest -q]
"""


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "state" / "prime-agent.duckdb") as opened:
        yield opened


@pytest.fixture
def config(tmp_path: Path) -> EvalConfig:
    path = tmp_path / "eval.yaml"
    path.write_text(CONFIG_TEXT, encoding="utf-8")
    return load_eval_config(path)


async def new_session(store: Store, parent: SessionRecord | None = None) -> SessionRecord:
    sid = new_session_id()
    return await store.create_session(
        SessionRecord(
            id=sid,
            root_id=parent.root_id if parent else sid,
            parent_id=parent.id if parent else None,
            depth=parent.depth + 1 if parent else 0,
            cwd="/work",
            model="openai/m",
            backend="local",
        )
    )


async def use(store: Store, session: SessionRecord, inp: int, out: int, cost: float | None) -> None:
    await store.append(
        session.id,
        "usage",
        UsagePayload(provider="openai", model="m", input=inp, output=out, cost_usd=cost),
    )


async def tree(store: Store) -> tuple[SessionRecord, SessionRecord, SessionRecord]:
    """A root and two children, with a call each (and two on the root)."""
    root = await new_session(store)
    a = await new_session(store, root)
    b = await new_session(store, root)
    await use(store, root, 100, 10, 0.01)
    await use(store, root, 200, 20, 0.02)
    await use(store, a, 30, 3, 0.003)
    await use(store, b, 40, 4, 0.004)
    return root, a, b


async def result(
    store: Store, config: EvalConfig, root: SessionRecord, **changes: object
) -> EvalResultRow:
    args: dict[str, object] = {
        "config": config,
        "config_path": config.source,
        "root_session_id": root.id,
        "stop_reason": "gate_passed",
        "exit_code": 0,
        "gates": [GateResultPayload(command="python -m pytest -q", passed=True, exit_code=0)],
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=75.5),
    }
    args.update(changes)
    return await build_result(store, **args)  # type: ignore[arg-type]


async def test_totals_cover_the_whole_tree_and_nothing_else(
    store: Store, config: EvalConfig
) -> None:
    root, _, _ = await tree(store)
    other = await new_session(store)  # another tree: not counted
    await use(store, other, 10_000, 10_000, 5.0)
    row = await result(store, config, root)
    assert row.id.startswith(EVAL_RESULT_ID_PREFIX)
    assert row.sessions == 3
    assert row.tokens_input == 370 and row.tokens_output == 37 and row.tokens == 407
    assert row.cost_usd == pytest.approx(0.037) and row.cost_known
    assert row.wall_s == 75.5
    assert row.stop_reason == "gate_passed" and row.exit_code == 0
    assert row.gates[0]["command"] == "python -m pytest -q" and row.gates[0]["passed"] is True
    assert row.config == config.record() and row.config["fingerprint"] == config.fingerprint()
    assert row.config_path == str(config.source)


async def test_a_grandchild_counts_too(store: Store, config: EvalConfig) -> None:
    root, a, _ = await tree(store)
    grandchild = await new_session(store, a)
    await use(store, grandchild, 5, 5, 0.0)
    row = await result(store, config, root)
    assert row.sessions == 4 and row.tokens_input == 375 and row.cost_known


async def test_one_unknown_price_makes_the_cost_unknown(store: Store, config: EvalConfig) -> None:
    root, a, _ = await tree(store)
    await use(store, a, 7, 1, None)
    row = await result(store, config, root)
    assert row.tokens_input == 377
    assert not row.cost_known
    assert row.cost_usd == pytest.approx(0.037)  # the known part, never the unknown as 0


async def test_no_known_price_at_all_is_none(store: Store, config: EvalConfig) -> None:
    root = await new_session(store)
    await use(store, root, 1, 1, None)
    row = await result(store, config, root)
    assert row.cost_usd is None and not row.cost_known


async def test_a_tree_without_calls_cost_nothing(store: Store, config: EvalConfig) -> None:
    root = await new_session(store)
    row = await result(store, config, root, stop_reason="model_error", exit_code=1, gates=[])
    assert row.sessions == 1 and row.tokens == 0
    assert row.cost_usd == 0.0 and row.cost_known
    usage = await store.read(lambda con: select_tree_usage(con, root.id))
    assert usage.calls == 0 and usage.sessions == 1


async def test_root_must_exist_and_be_a_root(store: Store, config: EvalConfig) -> None:
    root, a, _ = await tree(store)
    with pytest.raises(StoreError, match="no session"):
        await result(store, config, root, root_session_id=new_session_id())
    with pytest.raises(ValueError, match="not a root"):
        await result(store, config, root, root_session_id=a.id)
    with pytest.raises(ValueError, match="stop_reason"):
        await result(store, config, root, stop_reason="")


async def test_row_round_trip_and_recent(store: Store, config: EvalConfig) -> None:
    root, _, _ = await tree(store)
    first = await result(store, config, root, gates=[{"command": "x", "passed": False}])
    later = await result(
        store,
        config,
        root,
        stop_reason="turn_limit",
        exit_code=3,
        finished_at=T0 + timedelta(hours=1),
    )
    await store.transaction(lambda con: insert_eval_result(con, first))
    await save_result(store, later, None)
    assert await store.read(lambda con: select_eval_result(con, first.id)) == first
    assert await store.read(lambda con: select_eval_result(con, "e-none")) is None
    recent = await store.read(lambda con: select_recent_eval_results(con, 10))
    assert [r.id for r in recent] == [later.id, first.id]
    assert recent[0] == later and recent[0].started_at.tzinfo is not None
    assert await store.read(lambda con: select_recent_eval_results(con, 1)) == [later]
    with pytest.raises(ValueError):
        await store.read(lambda con: select_recent_eval_results(con, -1))


async def test_json_file_contents_and_mode(
    store: Store, config: EvalConfig, tmp_path: Path
) -> None:
    root, _, _ = await tree(store)
    row = await result(store, config, root)
    path = tmp_path / "results" / "run.result.json"
    old_umask = os.umask(0o022)
    try:
        await save_result(store, row, path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    assert list(data) == [
        "id",
        "session_id",
        "stop_reason",
        "exit_code",
        "gates",
        "sessions",
        "tokens_input",
        "tokens_output",
        "cost_usd",
        "cost_known",
        "started_at",
        "finished_at",
        "wall_s",
        "config_path",
        "config",
    ]
    assert data["session_id"] == root.id and data["stop_reason"] == "gate_passed"
    assert data["tokens_input"] == 370 and data["cost_known"] is True
    assert data["started_at"] == T0.isoformat() and data["wall_s"] == 75.5
    assert data["config"]["fingerprint"] == config.fingerprint()
    assert data["config"]["autonomous"]["gates"] == ["python -m pytest -q"]
    assert list(data["config"]) == sorted(data["config"])  # stable order at every level
    assert list(data["gates"][0]) == sorted(data["gates"][0])
    # The database holds the same row; rewriting gives the same bytes, leaving no temp file.
    assert await store.read(lambda con: select_eval_result(con, row.id)) == row
    write_result_json(row, path)
    assert path.read_text(encoding="utf-8") == text
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.result.json"]


def test_public_surface() -> None:
    for name in eval_results.__all__:
        assert hasattr(eval_results, name), name
