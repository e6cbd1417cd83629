"""Print mode always ends (issue 15, item 8): signals abort the tree, ``prime-agent abort``
cascades, a spent budget ends the run, a restarted daemon is waited for.

Real processes throughout: ``prime-agent`` as a subprocess, a real daemon, real kernels (local
backend), the scripted model over HTTP. Every background process is killed at teardown (the
``runs`` fixture), so a failing test leaves nothing running.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import (
    CliRun,
    cli,
    daemon_pids,
    descendant_pids,
    kill_9,
    pids_alive,
    wait_until,
    write_config,
)

# Several real processes per test on a loaded machine: more than the default 120 s.
pytestmark = pytest.mark.timeout(600)

# Bounds, not expectations (a loaded machine starts a kernel in seconds).
START_TIMEOUT_S = 120.0
EXIT_WAIT_S = 60.0  # a signalled run exits well within cli/interrupts.py's abort deadline
BUDGET_EXIT_S = 120.0
REAP_WAIT_S = 15.0
KILL_WAIT_S = 30.0
EXIT_ABORTED = 130
EXIT_BUDGET_SPENT = 4
EXIT_UNREACHABLE = 2
FAST_RETRIES = "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
TOKEN_BUDGET = 1000
# What a held root may still receive once its run has ended: its children's reports.
REPORTS_AFTER_THE_END = {"notice", "user_message"}


@pytest.fixture
def runs() -> Iterator[list[CliRun]]:
    started: list[CliRun] = []
    yield started
    for run in started:
        run.kill()


def _start(runs: list[CliRun], args: list[str]) -> CliRun:
    run = CliRun(args)
    runs.append(run)
    return run


def _print_run(url: str, task: str, *, json_mode: bool = True) -> list[str]:
    mode = ["--mode", "json"] if json_mode else []
    return ["-p", task, *mode, "--model", "openai/fake", "--api-base", url]


def _configure(srv: FakeModelServer, extra: str = "") -> None:
    write_config(FAST_RETRIES + extra + f'[models."openai/fake"]\napi_base = "{srv.url}"\n')


def _stored() -> tuple[dict[str, Any], dict[str, list[tuple[str, Any]]]]:
    """Every session row (by name) and its events, read from the database (no daemon)."""

    async def read() -> tuple[dict[str, Any], dict[str, list[tuple[str, Any]]]]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            rows = {rec.name or rec.id: rec for rec in await store.list_sessions()}
            events = {
                name: [(e.type, e.payload) for e in await store.events(rec.id)]
                for name, rec in rows.items()
            }
            return rows, events
        finally:
            await store.close()

    return asyncio.run(read())


def _agents() -> dict[str, dict[str, Any]]:
    """``agents --json`` flattened: every session of the trees by name."""
    proc = cli(["agents", "--json"])
    assert proc.returncode == 0, proc.stderr
    out: dict[str, dict[str, Any]] = {}
    todo = list(json.loads(proc.stdout))
    while todo:
        node = todo.pop()
        out[node["name"]] = node
        todo.extend(node.get("children") or [])
    return out


def _sleeper_family(marker: Path) -> str:
    """A root that spawns one child whose cell sleeps (after touching ``marker``)."""
    return f"""
repeat forever:
    when "spawn a sleeper":
        code: h = await rlm("sleep long", name="sleeper"); print("spawned", h.name)
    when "spawned":
        text: waiting for the sleeper
    when "[task from parent]":
        code:
            import pathlib, time
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(120)
    else:
        text: noted
"""


def _kernel_pids_below(pid: int) -> list[int]:
    return [p for p in descendant_pids(pid) if p != pid]


# ------------------------------------------------------------------ (a) the budget ends the run

BUDGET_FAMILY = """
repeat forever:
    when "spend it":
        code: hs = [await rlm(f"work {c}", name=c) for c in "ab"]; print("spawned", len(hs))
        usage in=10 out=10
    when "spawned":
        text: waiting
        usage in=5000 out=5000
    when "[task from parent]":
        code:
            import time
            time.sleep(2)
            print("worked")
        usage in=10 out=10
    else:
        text: noted
        usage in=10 out=10
"""


@pytest.mark.parametrize("where", ["in-process", "daemon"])
def test_a_spent_root_budget_ends_print_mode_while_children_still_report(
    runs: list[CliRun], where: str
) -> None:
    with FakeModelServer(BUDGET_FAMILY) as srv:
        _configure(srv, f"session_token_budget = {TOKEN_BUDGET}\n")
        if where == "daemon":
            assert cli(["daemon", "start"]).returncode == 0
        run = _start(runs, _print_run(srv.url, "spend it", json_mode=False))
        code = run.wait(BUDGET_EXIT_S)
        assert code == EXIT_BUDGET_SPENT, (code, run.stderr)
        assert "token_limit" in run.stderr and "token budget is spent" in run.stderr
        if where == "daemon":
            assert cli(["daemon", "stop"]).returncode == 0
    rows, events = _stored()
    assert rows["spend it"].status != "running"
    kinds = [kind for kind, _ in events["spend it"]]
    assert "run_end" in kinds, kinds
    # A child that finishes after the run ended still reports: its notice is kept (nothing
    # lost), but the held root runs no further turn on it.
    after = kinds[len(kinds) - 1 - kinds[::-1].index("run_end") + 1 :]
    assert set(after) <= REPORTS_AFTER_THE_END, after


def test_the_budget_exit_code_is_the_token_limits() -> None:
    from orchestrator.cli.common import EXIT_BUDGET_SPENT as CLI_CODE
    from orchestrator.control.autonomous import EXIT_TOKEN_LIMIT

    assert CLI_CODE == EXIT_TOKEN_LIMIT == EXIT_BUDGET_SPENT


# ------------------------------------------------------------- (b) SIGTERM aborts the whole tree


def test_sigterm_in_process_aborts_the_turn_and_the_children(
    runs: list[CliRun], tmp_path: Path
) -> None:
    marker = tmp_path / "child-cell-runs"
    with FakeModelServer(_sleeper_family(marker)) as srv:
        run = _start(runs, _print_run(srv.url, "spawn a sleeper"))
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        sandboxes = _kernel_pids_below(run.proc.pid)
        run.proc.send_signal(signal.SIGTERM)
        code = run.wait(EXIT_WAIT_S)
    assert code == EXIT_ABORTED, (code, run.stderr)
    assert "interrupted" in run.stderr and "Traceback" not in run.stderr
    assert wait_until(lambda: not pids_alive(sandboxes), timeout=REAP_WAIT_S)
    rows, events = _stored()
    assert rows["sleeper"].status == "aborted"
    child = [t for t, _ in events["sleeper"]]
    assert "aborted" in child and child[-1] == "aborted"
    assert events["spawn a sleeper"][-1] == ("run_end", events["spawn a sleeper"][-1][1])
    assert events["spawn a sleeper"][-1][1]["reason"] == "aborted"


def test_sigterm_through_the_daemon_aborts_the_turn_and_the_children(
    runs: list[CliRun], tmp_path: Path
) -> None:
    marker = tmp_path / "child-cell-runs"
    with FakeModelServer(_sleeper_family(marker)) as srv:
        _configure(srv)
        assert cli(["daemon", "start"]).returncode == 0
        run = _start(runs, _print_run(srv.url, "spawn a sleeper"))
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        run.proc.send_signal(signal.SIGTERM)
        code = run.wait(EXIT_WAIT_S)
        assert code == EXIT_ABORTED, (code, run.stderr)
        assert "interrupted" in run.stderr
        # Nothing of the tree runs in the daemon any more: the child is aborted, the root
        # ended (run_end recorded) and released.
        sessions = _agents()
        assert sessions["sleeper"]["status"] == "aborted"
        assert all(s["status"] != "running" for s in sessions.values()), sessions
        (pid,) = daemon_pids()
        assert not [p for p in descendant_pids(pid) if "sleep" in _cmdline(p)]
        assert cli(["daemon", "stop"]).returncode == 0
    _, events = _stored()
    assert "aborted" in [t for t, _ in events["sleeper"]]
    assert events["spawn a sleeper"][-1][0] == "run_end"
    assert events["spawn a sleeper"][-1][1]["reason"] == "aborted"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# ------------------------------------------------------------ (c) prompt-agent abort cascades


def test_abort_command_cascades_to_the_children_through_the_daemon(
    runs: list[CliRun], tmp_path: Path
) -> None:
    marker = tmp_path / "child-cell-runs"
    with FakeModelServer(_sleeper_family(marker)) as srv:
        _configure(srv)
        assert cli(["daemon", "start"]).returncode == 0
        run = _start(runs, _print_run(srv.url, "spawn a sleeper"))
        header = run.event("session", timeout=START_TIMEOUT_S)
        assert header is not None, run.stderr
        root = str(header["id"])
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        child = _agents()["sleeper"]["session_id"]
        out = cli(["abort", root])
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"aborted 1 turn(s): {child}\n"
        # The print-mode client sees its tree go quiet and ends as aborted.
        code = run.wait(EXIT_WAIT_S)
        assert code == EXIT_ABORTED, (code, run.stderr)
        sessions = _agents()
        assert sessions["sleeper"]["status"] == "aborted"
        assert all(s["status"] != "running" for s in sessions.values()), sessions
        again = cli(["abort", root])
        assert again.returncode == 0 and again.stdout.startswith("nothing to abort"), again
        assert cli(["daemon", "stop"]).returncode == 0
    _, events = _stored()
    assert [t for t, _ in events["sleeper"]][-1] == "aborted"


# ---------------------------------------------- (d) the client waits for a restarted daemon


def _nap_script(marker: Path) -> str:
    return f"""
repeat forever:
    when "nap then answer":
        code:
            import pathlib, time
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(60)
    when "orchestrator restarted": text: answered after the restart
    else: text: unexpected
"""


def test_print_mode_reconnects_to_a_restarted_daemon_and_prints_the_answer(
    runs: list[CliRun], tmp_path: Path
) -> None:
    marker = tmp_path / "cell-runs"
    with FakeModelServer(_nap_script(marker)) as srv:
        _configure(srv)
        assert cli(["daemon", "start"]).returncode == 0
        (first,) = daemon_pids()
        run = _start(runs, _print_run(srv.url, "nap then answer", json_mode=False))
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        kill_9(first, timeout=KILL_WAIT_S)
        assert wait_until(lambda: "lost the daemon" in run.stderr, timeout=EXIT_WAIT_S)
        assert run.proc.poll() is None, run.stderr  # waiting, not failed
        assert cli(["daemon", "start"]).returncode == 0
        code = run.wait(START_TIMEOUT_S)
        assert code == 0, (code, run.stderr)
        assert run.stdout == "answered after the restart\n"
        assert cli(["daemon", "stop"]).returncode == 0


# ------------------------------------------------------- (e) a signal is never lost, runs end

QUICK_CELL_THEN_SLOW_CALL = """
code: print("quick")
---
slow 120
"""


def _signal_moment_script(moment: str, marker: Path) -> str:
    if moment == "during a cell":
        return f"code: import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(120)"
    if moment == "right after a cell's result":
        return QUICK_CELL_THEN_SLOW_CALL
    return "slow 120"  # during a model call, and at start-up


@pytest.mark.parametrize(
    "moment",
    ["at start-up", "during a model call", "during a cell", "right after a cell's result"],
)
def test_sigint_at_any_moment_ends_the_run(runs: list[CliRun], tmp_path: Path, moment: str) -> None:
    marker = tmp_path / "cell-runs"
    with FakeModelServer(_signal_moment_script(moment, marker)) as srv:
        run = _start(runs, _print_run(srv.url, "go"))
        if moment == "at start-up":
            assert run.event("session", timeout=START_TIMEOUT_S) is not None, run.stderr
        elif moment == "during a model call":
            assert wait_until(lambda: bool(srv.requests), timeout=START_TIMEOUT_S), run.stderr
        elif moment == "during a cell":
            assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        else:
            assert run.event("tool_result", timeout=START_TIMEOUT_S) is not None, run.stderr
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(EXIT_WAIT_S)
    assert code == EXIT_ABORTED, (moment, code, run.stderr)
    assert "Traceback" not in run.stderr
    _, events = _stored()
    (types,) = [[t for t, _ in evs] for evs in events.values()]
    assert types[-1] == "run_end"
    assert events["go"][-1][1]["reason"] == "aborted"
    if moment != "at start-up":
        assert "aborted" in types


def test_a_second_signal_exits_at_once(runs: list[CliRun], tmp_path: Path) -> None:
    marker = tmp_path / "cell-runs"
    script = (
        "code: import pathlib, signal, time; "
        f"pathlib.Path({str(marker)!r}).touch(); time.sleep(120)"
    )
    with FakeModelServer(script) as srv:
        run = _start(runs, _print_run(srv.url, "go"))
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
        run.proc.send_signal(signal.SIGINT)
        run.proc.send_signal(signal.SIGTERM)
        code = run.wait(EXIT_WAIT_S)
    assert code == EXIT_ABORTED, (code, run.stderr)


def test_a_run_whose_model_server_is_gone_ends_after_its_retries(
    runs: list[CliRun], tmp_path: Path
) -> None:
    marker = tmp_path / "cell-runs"
    script = (
        "code: import pathlib, time; "
        f"pathlib.Path({str(marker)!r}).touch(); time.sleep(3); print('slept')"
    )
    srv = FakeModelServer(script)
    srv.start()
    try:
        _configure(srv)
        run = _start(runs, _print_run(srv.url, "go", json_mode=False))
        assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
    finally:
        srv.close()  # the next model call finds nothing listening
    code = run.wait(EXIT_WAIT_S)
    assert code == EXIT_UNREACHABLE, (code, run.stderr)  # docs/cli.md: an unreachable endpoint
    assert "cannot reach the model endpoint" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_runs_fixture_leaves_nothing_behind(tmp_path: Path) -> None:
    """The teardown this file relies on: a run killed mid-cell leaves no process."""
    marker = tmp_path / "cell-runs"
    script = f"code: import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(120)"
    with FakeModelServer(script) as srv:
        run = CliRun(_print_run(srv.url, "go"))
        try:
            assert wait_until(marker.exists, timeout=START_TIMEOUT_S), run.stderr
            below = descendant_pids(run.proc.pid)
            assert below
        finally:
            run.kill()
    assert run.proc.poll() is not None
    assert wait_until(lambda: not pids_alive(below), timeout=REAP_WAIT_S)
    assert os.environ["PRIME_AGENT_BACKEND"] == "local"
