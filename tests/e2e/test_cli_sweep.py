"""Sweeps as a user runs them (issue 19): real ``prime-agent sweep`` processes, a real daemon
started by the CLI, real sandboxes, two scripted models over HTTP — one that finds the needle,
one that never does — so the scores say which model ran which cell."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, kill_9, need, stop_daemons, wait_until, write_config

# Bounds, not expectations: 24 trials on 2 loaded cores.
SWEEP_TIMEOUT_S = 600.0
KILL_WAIT_S = 120.0
RUNNER_EXIT_S = 60.0

# Finds the needle: with code over the REPL variable `context` (rlm), or in the prompt itself
# (vanilla).
FINDER = r"""
repeat forever:
    when "context.txt":
        code:
            import re
            print(re.search(r"magic number is \d+", context).group(0))
    when re "magic number is ([0-9]+)": text: The number is \1.
    else: text: no idea
"""
DUD = """
repeat forever:
    text: I could not find it.
"""
# The finder, slowly: each reply waits, so a kill lands while trials are in flight.
SLOW_FINDER = r"""
repeat forever:
    when "context.txt":
        slow 0.5
        code:
            import re
            print(re.search(r"magic number is \d+", context).group(0))
    when re "magic number is ([0-9]+)":
        slow 0.5
        text: The number is \1.
    else: text: no idea
"""

SWEEP = """
name: {name}
suites: [{{suite: s-niah, tasks: 3, context_tokens: [600]}}]
models:
  - {{model: openai/finder, input_cost_per_mtok: 1.0, output_cost_per_mtok: 2.0}}
  - openai/dud
variants: [{{name: rlm}}, {{name: vanilla, rlm: false}}]
seeds: {seeds}
concurrency: {{trials: 4, sandboxes: 4}}
"""


@pytest.fixture
def autostart(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    yield
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def _models(finder: FakeModelServer, dud: FakeModelServer) -> None:
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/finder"]\napi_base = "{finder.url}"\n'
        f'[models."openai/dud"]\napi_base = "{dud.url}"\n'
    )


def _sweep_file(tmp_path: Path, name: str, seeds: str = "[1, 2]") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SWEEP.format(name=name, seeds=seeds))
    return path


def _cells(name: str) -> list[dict[str, Any]]:
    shown = cli(["sweep", "status", name, "--json"])
    assert shown.returncode == 0, shown.stderr
    return [json.loads(line) for line in shown.stdout.splitlines()]


def test_a_sweep_runs_every_cell_once_and_resumes_by_cell(autostart: None, tmp_path: Path) -> None:
    with FakeModelServer(FINDER) as finder, FakeModelServer(DUD) as dud:
        _models(finder, dud)
        path = _sweep_file(tmp_path, "niah")
        ran = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert ran.returncode == 0, ran.stderr
        assert "sweep niah: done" in ran.stderr

        # 3 tasks × 2 models × 2 variants × 2 seeds, each scored once, by the right model.
        cells = _cells("niah")
        assert len(cells) == 24
        assert {c["state"] for c in cells} == {"scored"}
        assert all(c["trials"] == 1 and c["session_id"] for c in cells)
        by_model = {
            m: [c["score"] for c in cells if c["model"] == m]
            for m in ("openai/finder", "openai/dud")
        }
        assert by_model == {"openai/finder": [1.0] * 12, "openai/dud": [0.0] * 12}
        assert all(c["tokens"] > 0 for c in cells)
        # Prices declared in the sweep file price the finder's calls; the dud's are unknown.
        assert all(c["cost_usd"] > 0 and c["cost_known"] for c in cells if "finder" in c["model"])
        assert not any(c["cost_known"] for c in cells if "dud" in c["model"])
        # The rlm variant read the context with code; vanilla got it in its prompt.
        rlm_prompts = [
            r for r in finder.requests if "context.txt" in json.dumps(r["messages"][1:2])
        ]
        assert len(rlm_prompts) >= 6

        # The same file again: nothing runs, nothing is counted twice.
        asked = len(finder.requests) + len(dud.requests)
        again = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert again.returncode == 0, again.stderr
        assert len(finder.requests) + len(dud.requests) == asked
        assert _cells("niah") == cells

        # A third seed: only its 12 new cells run; the old ones keep their rows.
        more = _sweep_file(tmp_path, "niah", seeds="[1, 2, 3]")
        grown = cli(["sweep", "run", str(more)], timeout=SWEEP_TIMEOUT_S)
        assert grown.returncode == 0, grown.stderr
        after = _cells("niah")
        assert len(after) == 36
        assert [c for c in after if c["seed"] != 3] == cells
        assert all(c["state"] == "scored" for c in after)

        # Results where users query them: the table, and the exports.
        table = cli(["sweep", "status", "niah"])
        assert table.returncode == 0, table.stderr
        assert "36 scored" in table.stdout
        finder_rows = [line.split() for line in table.stdout.splitlines() if "finder" in line]
        assert [row[2] for row in finder_rows] == ["1.000", "1.000"]
        for fmt in ("parquet", "csv", "jsonl"):
            out = tmp_path / f"cells.{fmt}"
            exported = cli(["sweep", "export", "niah", "--format", fmt, "--out", str(out)])
            assert exported.returncode == 0, exported.stderr
        con = duckdb.connect()
        scored = con.execute(
            f"SELECT model, avg(score), count(*) FROM '{tmp_path / 'cells.parquet'}' "
            "GROUP BY model ORDER BY model"
        ).fetchall()
        assert scored == [("openai/dud", 0.0, 18), ("openai/finder", 1.0, 18)]
        assert len((tmp_path / "cells.csv").read_text().splitlines()) == 37
        assert len((tmp_path / "cells.jsonl").read_text().splitlines()) == 36

        # The report's numbers are the cells' (the pictures are tests/unit/test_sweep_report's).
        report_dir = tmp_path / "report"
        reported = cli(["sweep", "report", "niah", "--out", str(report_dir)])
        assert reported.returncode == 0, reported.stderr
        numbers = json.loads((report_dir / "summary.json").read_text())
        groups = {(g["model"], g["variant"]): g for g in numbers["groups"]}
        for (model, variant), group in groups.items():
            mine = [c for c in after if c["model"] == model and c["variant"] == variant]
            assert group["scored"] == len(mine) == 9
            assert group["score"] == sum(c["score"] for c in mine) / len(mine)
            assert group["tokens"] == sum(c["tokens"] for c in mine)
        assert {g["score"] for g in groups.values()} == {0.0, 1.0}
        assert "| openai/finder | rlm | 1.000 |" in reported.stdout
        assert (report_dir / "index.html").stat().st_size > 0


@pytest.mark.parametrize("victim", ["runner", "daemon"])
def test_a_killed_run_resumes_without_rerunning_finished_cells(
    autostart: None, tmp_path: Path, victim: str
) -> None:
    """kill -9 of the runner or of the daemon mid-sweep; the same command again finishes the
    sweep, and what had finished is not run or counted again."""
    with FakeModelServer(SLOW_FINDER) as finder, FakeModelServer(DUD) as dud:
        _models(finder, dud)
        path = _sweep_file(tmp_path, "killed")
        started = cli(["daemon", "start"])
        assert started.returncode == 0, started.stderr
        (daemon,) = daemon_pids()
        runner = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "sweep", "run", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        try:
            scored_first: list[dict[str, Any]] = []

            def some_scored() -> bool:
                shown = cli(["sweep", "status", "killed", "--json"])
                if shown.returncode != 0:  # not opened yet
                    assert "no sweep" in shown.stderr, shown.stderr
                    return False
                cells = [json.loads(line) for line in shown.stdout.splitlines()]
                scored_first[:] = [c for c in cells if c["state"] == "scored"]
                return len(scored_first) >= 3

            assert wait_until(some_scored, timeout=KILL_WAIT_S, interval=0.5)
            assert len(scored_first) < 24  # the kill lands mid-sweep
            if victim == "runner":
                runner.send_signal(signal.SIGKILL)
                runner.wait(timeout=RUNNER_EXIT_S)
            else:
                kill_9(daemon, timeout=RUNNER_EXIT_S)
                # The runner says so in one line and exits; the sweep waits for a rerun.
                _, err = runner.communicate(timeout=RUNNER_EXIT_S)
                assert runner.returncode != 0
                assert "the daemon went away; run the same command again" in err, err
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
        resumed = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert resumed.returncode == 0, resumed.stderr
        final = {c["fingerprint"]: c for c in _cells("killed")}
        assert len(final) == 24 and {c["state"] for c in final.values()} == {"scored"}
        # What had finished before the kill kept its trial, its session and its score.
        for cell in scored_first:
            assert final[cell["fingerprint"]] == cell
        # A cell in flight at the kill ran again: its first trial was abandoned, not counted.
        rerun = [c for c in final.values() if c["trials"] > 1]
        said = re.search(r"(\d+) trial\(s\) of an interrupted run abandoned", resumed.stderr)
        assert (int(said.group(1)) if said else 0) == len(rerun)
        assert all(c["trials"] == 2 for c in rerun)


# Fixes the slugify repository of the code-fix suite by editing its file, then says so.
FIXER = r"""
repeat forever:
    when "failing test suite":
        code:
            path = "text_tools.py"
            text = open(path).read()
            open(path, "w").write(text.replace('"-".join(words)', '"-".join(words).lower()'))
    else: text: fixed
"""
CODE_FIX_SWEEP = """
name: fixes
suites: [{suite: code-fix, tasks: 1}]
models: [openai/finder, openai/dud]
budgets: {trial_turns: 2}
"""


def test_a_code_fix_cell_scores_by_its_gate_in_the_sandbox(autostart: None, tmp_path: Path) -> None:
    with FakeModelServer(FIXER) as fixer, FakeModelServer(DUD) as dud:
        _models(fixer, dud)
        path = tmp_path / "fixes.yaml"
        path.write_text(CODE_FIX_SWEEP)
        ran = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert ran.returncode == 0, ran.stderr
        cells = {c["model"]: c for c in _cells("fixes")}
        assert cells["openai/finder"]["score"] == 1.0
        assert cells["openai/finder"]["stop_reason"] == "gate_passed"
        # The dud never edits the file: its gate fails until its turns run out.
        assert cells["openai/dud"]["score"] == 0.0
        assert cells["openai/dud"]["stop_reason"] != "gate_passed"
        assert len(dud.requests) == 2  # trial_turns: 2


GPU_SWEEP = """
name: gpu
suites:
  - {suite: gpu-kernel, tasks: 2}
  - {suite: nanogpt, tasks: 1}
  - {suite: s-niah, tasks: 1, context_tokens: [600]}
models: [openai/finder]
variants: [{name: vanilla, rlm: false}]
"""


def test_gpu_cells_are_reported_and_not_run_on_a_machine_without_a_gpu(
    autostart: None, tmp_path: Path
) -> None:
    # No `[sandbox] gpus` in the config (and no NVIDIA runtime on a CI machine): the GPU
    # suites' cells cannot run here; the s-niah cell runs and scores.
    with FakeModelServer(FINDER) as finder, FakeModelServer(DUD) as dud:
        _models(finder, dud)
        path = tmp_path / "gpu.yaml"
        path.write_text(GPU_SWEEP)
        ran = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert ran.returncode == 1, ran.stderr  # incomplete
        (line,) = [x for x in ran.stderr.splitlines() if "cell(s) cannot run here:" in x]
        assert line.startswith("sweep gpu: 3 cell(s) cannot run here: gpu-kernel/")
        assert "(and 2 more task(s)): needs a GPU: " in line
        assert "sweep gpu: incomplete" in ran.stderr
        cells = {c["suite"]: c for c in _cells("gpu")}
        assert cells["s-niah"]["state"] == "scored" and cells["s-niah"]["score"] == 1.0
        held = [c for c in _cells("gpu") if c["suite"] != "s-niah"]
        assert len(held) == 3
        for cell in held:
            assert cell["state"] == "unrunnable" and cell["trials"] == 0
            assert cell["error_class"] == "cannot_run"
            assert cell["stop_reason"] == "needs a GPU: " + line.split(": needs a GPU: ", 1)[1]
        # No trial of theirs asked the model anything: only the s-niah cell did.
        asked = len(finder.requests)
        assert asked >= 1

        # Again: still reported, still not run; the scored cell is not run twice.
        again = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert again.returncode == 1, again.stderr
        assert "3 cell(s) cannot run here" in again.stderr
        assert len(finder.requests) == asked


def test_a_spent_sweep_budget_starts_no_more_trials(autostart: None, tmp_path: Path) -> None:
    with FakeModelServer(FINDER) as finder, FakeModelServer(DUD) as dud:
        _models(finder, dud)
        path = tmp_path / "budget.yaml"
        text = SWEEP.format(name="budget", seeds="[1, 2]")
        path.write_text(text + "budgets: {sweep_cost_usd: 0.000001}\n")
        ran = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert ran.returncode == 4, ran.stderr  # EXIT_BUDGET_SPENT
        assert "sweep budget: budget" in ran.stderr
        cells = _cells("budget")
        ran_cells = [c for c in cells if c["trials"]]
        # At most one round of trials in flight started before any cost was known.
        assert 1 <= len(ran_cells) <= 4 and len(cells) == 24
        asked = len(finder.requests) + len(dud.requests)
        again = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert again.returncode == 4, again.stderr
        assert len(finder.requests) + len(dud.requests) == asked


def test_a_cancelled_sweep_stops_and_resumes_when_run_again(
    autostart: None, tmp_path: Path
) -> None:
    with FakeModelServer(SLOW_FINDER) as finder, FakeModelServer(DUD) as dud:
        _models(finder, dud)
        path = _sweep_file(tmp_path, "cancelled")
        runner = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "sweep", "run", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        try:

            def running() -> bool:
                shown = cli(["sweep", "status", "cancelled", "--json"])
                cells = [json.loads(line) for line in shown.stdout.splitlines()]
                return any(c["state"] == "running" for c in cells)

            assert wait_until(running, timeout=KILL_WAIT_S, interval=0.5)
            cancelled = cli(["sweep", "cancel", "cancelled"])
            assert cancelled.returncode == 0, cancelled.stderr
            assert "cancelled" in cancelled.stdout
            _, err = runner.communicate(timeout=RUNNER_EXIT_S)
            assert runner.returncode == 130, err
        finally:
            if runner.poll() is None:
                runner.kill()
                runner.wait()
        shown = cli(["sweep", "status", "cancelled"])
        assert "sweep cancelled: cancelled" in shown.stdout
        cells = _cells("cancelled")
        assert any(c["state"] != "scored" for c in cells)
        # An aborted trial is not scored: it runs again.
        assert all(c["error_class"] == "aborted" for c in cells if c["state"] == "errored")
        resumed = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        assert resumed.returncode == 0, resumed.stderr
        assert {c["state"] for c in _cells("cancelled")} == {"scored"}


def test_a_model_without_its_key_is_refused_before_anything_runs(
    autostart: None, tmp_path: Path
) -> None:
    path = tmp_path / "nokey.yaml"
    path.write_text(
        "name: nokey\nsuites: [{suite: s-niah, tasks: 1}]\n"
        "models: [openai/gpt-4o-mini, anthropic/claude-x]\n"
    )
    refused = cli(["sweep", "run", str(path)])
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1
    assert "openai/gpt-4o-mini cannot run: OPENAI_API_KEY is not set" in refused.stderr
    assert "(and 1 more)" in refused.stderr
    assert daemon_pids() == []  # refused before the daemon was even started


HARBOR_DATASET = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
# Does what the hello-world task asks, in /app; reports whether the verifier's tests were
# visible while it worked (they must not be).
HARBOR_SOLVER = r"""
repeat forever:
    when "hello.txt":
        code:
            import os
            name = open("/app/name.txt").read().strip()
            open("/app/hello.txt", "w").write(f"Hello, {name}!\n")
            seen = os.path.exists("/tests/test_outputs.py"), sorted(os.listdir("."))
            print("tests visible:", seen[0], "cwd has:", seen[1])
    else: text: done
"""
HARBOR_SWEEP = """
name: harbor
suites: [{{suite: harbor, path: {path}}}]
models: [openai/finder, openai/dud]
backend: docker
"""


def test_harbor_task_directories_run_with_their_environment_and_verifier(
    autostart: None, tmp_path: Path
) -> None:
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    if not usable:
        need("docker", why)
    with FakeModelServer(HARBOR_SOLVER) as solver, FakeModelServer(DUD) as dud:
        _models(solver, dud)
        path = tmp_path / "harbor.yaml"
        path.write_text(HARBOR_SWEEP.format(path=HARBOR_DATASET))
        ran = cli(["sweep", "run", str(path)], timeout=SWEEP_TIMEOUT_S)
        # The task whose base image is on a registry cannot run here: said, not run.
        assert ran.returncode == 1, ran.stderr
        assert (
            "sweep harbor: 2 cell(s) cannot run here: harbor/remote-base: its base image "
            "ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest is not here" in ran.stderr
        )
        assert "sweep harbor: incomplete" in ran.stderr
        cells = {(c["task_id"], c["model"]): c for c in _cells("harbor")}
        assert cells[("harbor/remote-base", "openai/finder")]["trials"] == 0
        assert cells[("harbor/remote-base", "openai/dud")]["trials"] == 0
        # Scored by the task's own tests/test.sh, run in the trial's sandbox after the turn.
        solved = cells[("harbor/hello-world", "openai/finder")]
        assert (solved["state"], solved["score"]) == ("scored", 1.0)
        missed = cells[("harbor/hello-world", "openai/dud")]
        assert (missed["state"], missed["score"]) == ("scored", 0.0)
        # The environment's WORKDIR (with the file its Dockerfile copied) was the agent's /app
        # and its working directory; the tests were not there while it worked.
        seen = json.dumps(solver.requests[-1]["messages"])
        assert "tests visible: False" in seen
        assert "'name.txt'" in seen
        # The verifier's reward file is kept with the trial.
        rewards = list((Path(os.environ["XDG_DATA_HOME"])).rglob("logs/verifier/reward.txt"))
        assert sorted(r.read_text().strip() for r in rewards) == ["0", "1"]
