# ruff: noqa: E501  (scripts below are data: long lines are the model's cells)
"""Autonomous mode as a user runs it (issue 8 bullet 1): ``prime-agent -p --autonomous`` with a
pytest gate that runs in the session's sandbox, the scripted model, a real DuckDB file. The
agent fixes the failing test on its second try; an unchanged workspace is not re-gated; every
limit stops with its own exit code and a final ``autonomous_stop`` event."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.control.autonomous import EXIT_CODES
from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, need, write_config

GATE: Final = "python -m pytest -q -p no:cacheprovider test_calc.py"
FIX_SCRIPT: Final = """
repeat forever:
    when "EDITED": text: fixed it
    when "Gate failed (attempt 1)":
        code: import pathlib; p = pathlib.Path("calc.py"); p.write_text(p.read_text().replace("a - b", "a + b")); print("EDITED")
    when "fix the calculator": text: nothing to fix, I think
"""
STUBBORN_SCRIPT: Final = """
repeat forever:
    when "fix the calculator": text: nothing to fix
    else: text: still nothing to fix
"""
IDLE_SCRIPT: Final = """
repeat forever:
    text: working on it
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "project"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (work / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    return work


def _serve(script: str) -> Iterator[FakeModelServer]:
    with FakeModelServer(script) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 0\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        )
        yield srv


@pytest.fixture
def fixer() -> Iterator[FakeModelServer]:
    yield from _serve(FIX_SCRIPT)


@pytest.fixture
def stubborn() -> Iterator[FakeModelServer]:
    yield from _serve(STUBBORN_SCRIPT)


@pytest.fixture
def idle() -> Iterator[FakeModelServer]:
    yield from _serve(IDLE_SCRIPT)


def _run(project: Path, *extra: str, task: str = "fix the calculator") -> Any:
    return cli(
        ["-p", task, "--model", "openai/fake", "--cwd", str(project), "--autonomous", *extra]
    )


async def _events() -> list[tuple[str, dict[str, Any]]]:
    store = await Store.open(Paths.from_env().database_file, read_only=True)
    try:
        sessions = await store.list_sessions()
        return [(e.type, e.payload) for e in await store.events(sessions[-1].id)]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("through_daemon", "backend"),
    [(False, "local"), (True, "local"), (False, "docker")],
    ids=["in-process", "daemon", "docker"],
)
def test_the_agent_fixes_a_failing_gate_on_its_second_try(
    fixer: FakeModelServer, project: Path, through_daemon: bool, backend: str
) -> None:
    if backend == "docker":  # the gate runs in the container (pytest is in the image)
        from orchestrator.sandbox.docker import docker_usable

        usable, why = docker_usable()
        if not usable:
            need("docker", why)
        # A root-owned workspace runs as the image's user, who may not write root's files.
        from orchestrator.sandbox.docker_run import SANDBOX_UID

        for path in (project, *project.iterdir()):
            os.chown(path, SANDBOX_UID, SANDBOX_UID)
    if through_daemon:
        started = cli(["daemon", "start"])
        assert started.returncode == 0, started.stderr
    proc = _run(project, "--autonomous-gate", GATE, "--backend", backend)
    if through_daemon:
        cli(["daemon", "stop"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "fixed it\n"
    assert "return a + b" in (project / "calc.py").read_text()
    events = asyncio.run(_events())
    gates = [p for t, p in events if t == "gate_result"]
    assert [(g["passed"], g["attempt"], g["skipped"]) for g in gates] == [
        (False, 1, False),
        (True, 2, False),
    ]
    assert "1 failed" in gates[0]["output"] and gates[0]["exit_code"] == 1
    # the final events: the stop with its reason, then the run's end naming it too
    assert [t for t, _ in events[-2:]] == ["autonomous_stop", "run_end"]
    stop = events[-2][1]
    assert stop["reason"] == events[-1][1]["reason"] == "gate_passed"
    assert stop["turns"] == 2 and stop["tokens"] > 0
    # the failure went back to the agent, bounded, as a harness message
    fed = [p for t, p in events if t == "user_message" and p["source"] == "harness"]
    assert len(fed) == 1 and "Gate failed (attempt 1)" in fed[0]["text"]


def test_an_unchanged_workspace_is_not_re_gated_and_the_limit_says_gate_failed(
    stubborn: FakeModelServer, project: Path
) -> None:
    proc = _run(project, "--autonomous-gate", GATE, "--autonomous-max-turns", "3")
    assert proc.returncode == EXIT_CODES["gate_failed"] == 6, proc.stderr
    assert "the run stopped: gate_failed" in proc.stderr and proc.stdout == ""
    events = asyncio.run(_events())
    gates = [p for t, p in events if t == "gate_result"]
    assert [g["skipped"] for g in gates] == [False, True, True]
    assert all(not g["passed"] for g in gates)
    assert events[-2][0] == "autonomous_stop" and events[-2][1]["reason"] == "gate_failed"
    assert events[-1] == (
        "run_end",
        {"reason": "gate_failed", "final_text": "still nothing to fix", "error_class": None},
    )


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--autonomous-max-turns", "2"], "turn_limit"),
        (["--autonomous-max-tokens", "10"], "token_limit"),
        (["--autonomous-timeout-ms", "1"], "time_limit"),
    ],
)
def test_each_limit_stops_with_its_own_exit_code(
    idle: FakeModelServer, project: Path, flags: list[str], reason: str
) -> None:
    proc = _run(project, *flags, task="keep going")
    assert proc.returncode == EXIT_CODES[reason], proc.stderr
    assert f"the run stopped: {reason}" in proc.stderr
    events = asyncio.run(_events())
    assert events[-2][0] == "autonomous_stop" and events[-2][1]["reason"] == reason
    assert events[-1][0] == "run_end" and events[-1][1]["reason"] == reason
    turns = sum(1 for t, _ in events if t == "turn_end")
    assert turns == (2 if reason == "turn_limit" else 1)


def test_every_failing_stop_has_its_own_exit_code() -> None:
    assert {r for r, c in EXIT_CODES.items() if c == 0} == {
        "gate_passed",
        "goal_complete",
        "completed",
    }
    failing = [c for c in EXIT_CODES.values() if c != 0]
    assert len(failing) == len(set(failing)) == 7  # stuck (7) since issue 15


EVAL_SCRIPT: Final = """
repeat forever:
    when "EDITED": text: fixed it
    when "Gate failed (attempt 1)":
        code: import pathlib; p = pathlib.Path("calc.py"); p.write_text(p.read_text().replace("a - b", "a + b")); print("EDITED")
    when "The tests in test_calc.py fail": text: looks fine to me
"""


def test_run_config_writes_a_result_record(tmp_path: Path) -> None:
    """Issue 8 bullet 4: the example config, pointed at the scripted model, runs to a passed
    gate and writes its result to DuckDB and as JSON (stop reason, gates, tokens, cost, time)."""
    import json
    import shutil

    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "eval"
    copy = tmp_path / "eval"
    shutil.copytree(example, copy)
    with FakeModelServer(EVAL_SCRIPT) as srv:
        config = yaml.safe_load((copy / "fix-tests.yaml").read_text())
        config["model"]["api_base"] = srv.url
        (copy / "fix-tests.yaml").write_text(yaml.safe_dump(config))
        proc = cli(["run", "--config", str(copy / "fix-tests.yaml")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("fix-tests: gate_passed (exit 0)"), proc.stdout
    result = json.loads((copy / "fix-tests.result.json").read_text())
    assert result["stop_reason"] == "gate_passed" and result["exit_code"] == 0
    assert [g["passed"] for g in result["gates"]] == [False, True]
    assert result["tokens_input"] > 0 and result["sessions"] == 1
    assert result["cost_known"] is True and result["cost_usd"] > 0
    assert result["wall_s"] > 0 and result["config"]["name"] == "fix-tests"

    async def stored() -> list[str]:
        from orchestrator.store.eval_results import select_recent_eval_results

        async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
            rows = await store.read(lambda con: select_recent_eval_results(con, 5))
            return [r.stop_reason for r in rows]

    assert asyncio.run(stored()) == ["gate_passed"]
    bad = cli(["run", "--config", str(copy / "missing.yaml")])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


CHILD_SCRIPT: Final = """
repeat forever:
    when "[task from parent]":
        code: import time; time.sleep(120); print("never")
    when "spawned kid": text: delegated
    when "Delegate":
        code: h = await rlm("sleepy work", name="kid"); print("spawned", h.name)
"""


def test_children_still_working_are_cancelled_and_the_stop_says_so(project: Path) -> None:
    with FakeModelServer(CHILD_SCRIPT) as srv:
        write_config(f'model_max_retries = 0\n[models."openai/fake"]\napi_base = "{srv.url}"\n')
        proc = _run(project, "--autonomous-gate", "true", task="Delegate the work")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "delegated\n"
    events = asyncio.run(_events_of_root())
    stop = next(p for t, p in events if t == "autonomous_stop")
    assert stop["reason"] == "gate_passed"
    assert list(stop["children"].values()) == ["cancelled"]


async def _events_of_root() -> list[tuple[str, dict[str, Any]]]:
    store = await Store.open(Paths.from_env().database_file, read_only=True)
    try:
        roots = [s for s in await store.list_sessions() if s.parent_id is None]
        return [(e.type, e.payload) for e in await store.events(roots[-1].id)]
    finally:
        await store.close()


GOAL_SCRIPT: Final = """
repeat forever:
    when "Goal complete.": text: all done, budget reported
    when 'kind="continuation"':
        code: r = await goal.complete(); print(r)
    when 'kind="start"': text: first step taken
    when 'kind="budget_limit"': text: wrapped up
"""


@pytest.fixture
def goal_model() -> Iterator[FakeModelServer]:
    yield from _serve(GOAL_SCRIPT)


def test_goal_continuation_stops_at_goal_complete(
    goal_model: FakeModelServer, project: Path
) -> None:
    proc = cli(
        ["-p", "--goal", "make the tests pass", "--model", "openai/fake", "--cwd", str(project)]
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "all done, budget reported\n"
    events = asyncio.run(_events())
    harness = [p["text"] for t, p in events if t == "user_message" and p["source"] == "harness"]
    assert len(harness) == 2  # the start, one continuation; none after goal.complete()
    assert "make the tests pass" in harness[1] and "user-provided data" in harness[1]
    statuses = [p["status"] for t, p in events if t == "goal_update"]
    assert statuses[0] == "active" and statuses[-1] == "complete"
    assert events[-2][0] == "autonomous_stop" and events[-2][1]["reason"] == "goal_complete"


def test_a_goal_at_its_budget_gets_the_wrap_up_and_stops(
    goal_model: FakeModelServer, project: Path
) -> None:
    budget = ["--goal-budget", "50", "--cwd", str(project)]
    proc = cli(["-p", "--goal", "make the tests pass", "--model", "openai/fake", *budget])
    assert proc.returncode == EXIT_CODES["token_limit"], proc.stderr
    assert "the run stopped: token_limit" in proc.stderr
    events = asyncio.run(_events())
    harness = [p["text"] for t, p in events if t == "user_message" and p["source"] == "harness"]
    assert len(harness) == 2 and 'kind="budget_limit"' in harness[1]
    said = [p["text"] for t, p in events if t == "assistant_message"]
    assert said[-1] == "wrapped up"
    assert [p["status"] for t, p in events if t == "goal_update"][-1] == "budget_limited"
    assert events[-2][1]["reason"] == "token_limit"
