"""Ctrl-C and kill -9 of a print-mode run: history kept, nothing left running.

Every run is killed with what it started at teardown (``procs``), so a failing test leaves no
process behind; tests/e2e/test_cli_abort.py has SIGINT at other moments, SIGTERM and abort."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, descendant_pids, kill_process_tree, need, pids_alive, wait_until

LONG_CELL = "code: import time; time.sleep(120)"
EXIT_WAIT_S = 30.0
REAP_WAIT_S = 15.0


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(LONG_CELL) as srv:
        yield srv


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Every run a test starts; killed with all it started at teardown, pass or fail."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        kill_process_tree(proc)


def _start(url: str, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = _popen(url)
    procs.append(proc)
    return proc


def _popen(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "-p",
            "sleep",
            "--mode",
            "json",
            "--model",
            "openai/fake",
            "--api-base",
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _wait_for_cell(proc: subprocess.Popen[str]) -> str:
    """Read JSON events until the cell has started; return the session id."""
    assert proc.stdout is not None
    session_id = ""
    for line in proc.stdout:
        event = json.loads(line)
        if event["type"] == "session":
            session_id = event["id"]
        if event["type"] == "tool_start":
            return session_id
    raise AssertionError("the run ended before its cell started")


def _wait_for_kernel(pid: int) -> list[int]:
    """The gateway and its kernel are up once the tree has at least two processes."""
    found: list[int] = []

    def ready() -> bool:
        found[:] = descendant_pids(pid)
        return len(found) >= 2

    assert wait_until(ready, timeout=60), "sandbox processes never appeared"
    return found


def _events(session_id: str) -> list[tuple[str, dict[str, object]]]:
    async def read() -> list[tuple[str, dict[str, object]]]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            return [(e.type, e.payload) for e in await store.events(session_id)]
        finally:
            await store.close()

    return asyncio.run(read())


def test_ctrl_c_stops_cleanly_and_keeps_the_history(
    model: FakeModelServer, procs: list[subprocess.Popen[str]]
) -> None:
    proc = _start(model.url, procs)
    session_id = _wait_for_cell(proc)
    children = _wait_for_kernel(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=EXIT_WAIT_S)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert wait_until(lambda: not pids_alive(children), timeout=REAP_WAIT_S), pids_alive(children)
    types = [t for t, _ in _events(session_id)]
    assert types[-3:] == ["tool_result", "aborted", "run_end"]


def test_kill_9_leaves_no_sandbox_process(
    model: FakeModelServer, procs: list[subprocess.Popen[str]]
) -> None:
    proc = _start(model.url, procs)
    session_id = _wait_for_cell(proc)
    children = _wait_for_kernel(proc.pid)
    proc.kill()
    proc.communicate(timeout=EXIT_WAIT_S)
    # The gateway learns of its parent's death (PR_SET_PDEATHSIG) and takes the kernel with it.
    assert wait_until(lambda: not pids_alive(children), timeout=REAP_WAIT_S), pids_alive(children)
    # What was acknowledged before the kill is in the database.
    types = [t for t, _ in _events(session_id)]
    assert types[:2] == ["user_message", "assistant_message"]


def test_shutdown_removes_containers_a_killed_run_left(
    model: FakeModelServer, procs: list[subprocess.Popen[str]]
) -> None:
    from orchestrator.sandbox.docker import docker_usable, list_owned

    usable, why = docker_usable()
    if not usable:
        need("docker", why)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "orchestrator", "-p", "sleep", "--mode", "json"),
            *("--backend", "docker", "--model", "openai/fake", "--api-base", model.url),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    procs.append(proc)
    session_id = _wait_for_cell(proc)

    def mine() -> list[object]:
        return [c for c in list_owned() if c.session_id == session_id]

    assert wait_until(lambda: bool(mine()), timeout=60), "no container for the session"
    proc.kill()
    proc.communicate(timeout=EXIT_WAIT_S)
    assert mine(), "the container should outlive a kill -9 of its orchestrator"
    out = cli(["shutdown"])
    assert out.returncode == 0, out.stderr
    assert not mine()
    assert "removed" in out.stdout
