"""Autonomous gates (orchestrator/control/gates.py) on a real local sandbox: the command runs in
the session's kernel, in its working directory, bounded in time and output, and leaves no
process behind; and an autonomous run whose agent fixes a failing pytest gate."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel

from orchestrator.control.autonomous import AutonomousPolicy, Autonomy, Continue, Stop
from orchestrator.control.gates import CAPTURE_MAX_BYTES, KILL_GRACE_S, GateRun, run_gate
from orchestrator.control.workspace_hash import GATE_OUTPUT_MAX_CHARS
from orchestrator.ids import new_session_id
from orchestrator.sandbox.base import Sandbox, SandboxSpec
from orchestrator.sandbox.local import LocalBackend, LocalSandbox
from orchestrator.store.db import Store
from orchestrator.store.events import EventType, TurnEndPayload, UsagePayload
from orchestrator.store.queries import SessionRecord

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc"),
]

# A small cell output cap: a report line longer than this is read back from the cell's artifact.
CAP = 4096
GONE_DEADLINE_S = 15.0
POLL_S = 0.05


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_DEADLINE_S
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend() -> AsyncIterator[LocalBackend]:
    b = LocalBackend(pool_size=0, interrupt_grace_s=1.0, output_cap_chars=CAP)
    yield b
    await b.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sandbox(
    backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSandbox]:
    tmp = tmp_path_factory.mktemp("gates")
    cwd = tmp / "workspace"
    cwd.mkdir()
    sb = await backend.create(
        SandboxSpec(session_id="s-gates", cwd=cwd, artifacts_dir=tmp / "artifacts")
    )
    yield sb
    await sb.stop()


def _cwd(sandbox: LocalSandbox) -> Path:
    return sandbox.spec.cwd


async def gate(sandbox: Sandbox, command: str, cwd: Path, timeout_s: float = 30.0) -> GateRun:
    return await run_gate(
        sandbox, command, cwd=str(cwd), timeout_s=timeout_s, cell_id=f"gate-{time.time_ns()}"
    )


async def test_exit_zero_passes(sandbox: LocalSandbox) -> None:
    run = await gate(sandbox, "echo all good", _cwd(sandbox))
    assert run == GateRun(
        exit_code=0, output="all good\n", timed_out=False, duration_ms=run.duration_ms
    )
    assert run.passed and 0 < run.duration_ms < 30_000


async def test_exit_three_with_its_output(sandbox: LocalSandbox) -> None:
    run = await gate(sandbox, "echo to stdout; echo to stderr >&2; exit 3", _cwd(sandbox))
    assert run.exit_code == 3 and not run.passed and not run.timed_out
    assert run.output == "to stdout\nto stderr\n"


async def test_output_over_the_bound_is_cut_in_the_middle(sandbox: LocalSandbox) -> None:
    # 20,000 numbered lines (~200 kB): the head and the tail survive, the middle is counted.
    command = "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done; exit 1"
    run = await gate(sandbox, command, _cwd(sandbox))
    assert run.exit_code == 1
    assert len(run.output) <= GATE_OUTPUT_MAX_CHARS
    assert run.output.startswith("line-0\nline-1\n")
    assert run.output.endswith("line-19999\n")
    assert "chars cut ...]" in run.output

    # Past the capture bound the gate keeps its first and last half MiB and says so.
    run = await gate(
        sandbox, f"head -c {3 * CAPTURE_MAX_BYTES} /dev/zero | tr '\\0' y", _cwd(sandbox)
    )
    assert run.exit_code == 0 and len(run.output) <= GATE_OUTPUT_MAX_CHARS
    assert run.output.startswith(f"[output over {CAPTURE_MAX_BYTES} bytes: ")
    assert run.output.endswith("yyy")


async def test_timeout_kills_the_whole_process_group(sandbox: LocalSandbox) -> None:
    cwd = _cwd(sandbox)
    pid_file = cwd / "child.pid"
    command = f"sleep 300 & echo $! > {pid_file.name}; echo started; sleep 300"
    started = time.monotonic()
    run = await gate(sandbox, command, cwd, timeout_s=1.0)
    elapsed = time.monotonic() - started
    assert run.timed_out and run.exit_code is None and not run.passed
    assert run.output == "started\n"
    assert elapsed < 1.0 + KILL_GRACE_S + 10  # not the sleep's 300 s
    child = int(pid_file.read_text())
    assert await _wait_gone(child), f"background child {child} survived the gate"


async def test_a_term_ignoring_gate_is_killed_after_the_grace(sandbox: LocalSandbox) -> None:
    cwd = _cwd(sandbox)
    command = "trap '' TERM; sleep 300 & echo $! > stubborn.pid; wait"
    run = await gate(sandbox, command, cwd, timeout_s=0.5)
    assert run.timed_out
    assert await _wait_gone(int((cwd / "stubborn.pid").read_text()))


async def test_nothing_of_a_finished_gate_is_left_running(sandbox: LocalSandbox) -> None:
    cwd = _cwd(sandbox)
    run = await gate(sandbox, "sleep 300 & echo $! > left.pid; exit 0", cwd)
    assert run.passed
    assert await _wait_gone(int((cwd / "left.pid").read_text()))


async def test_cwd_is_honoured(sandbox: LocalSandbox, tmp_path: Path) -> None:
    sub = _cwd(sandbox) / "pkg"
    sub.mkdir(exist_ok=True)
    run = await gate(sandbox, "pwd; touch made-here", sub)
    assert run.passed and run.output == f"{sub}\n"
    assert (sub / "made-here").exists()

    missing = await gate(sandbox, "true", tmp_path / "does-not-exist")
    assert missing.exit_code is None and not missing.passed
    assert "could not start the gate" in missing.output


async def test_the_agent_namespace_is_untouched(sandbox: LocalSandbox) -> None:
    await sandbox.execute("gate_probe = 7", timeout_s=30, cell_id="probe-1")
    assert (await gate(sandbox, "true", _cwd(sandbox))).passed
    result = await sandbox.execute(
        "sorted(k for k in ('ARGS', 'MARKER', '_main', '_stop_group') if k in globals()), "
        "gate_probe",
        timeout_s=30,
        cell_id="probe-2",
    )
    assert result.result == "([], 7)"


# --- an autonomous run end to end --------------------------------------------------------------


@dataclass
class LiveTarget:
    store: Store
    session_id: str
    box: LocalSandbox

    @property
    def cwd(self) -> str:
        return str(self.box.spec.cwd)

    async def sandbox(self) -> Sandbox:
        return self.box

    async def record(self, type_: EventType, payload: BaseModel) -> Any:
        return await self.store.append(self.session_id, type_, payload)

    def workspace_dir(self) -> Path | None:
        return self.box.spec.cwd


async def test_agent_fixes_a_failing_pytest_gate(backend: LocalBackend, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    )
    box = await backend.create(
        SandboxSpec(session_id="s-pytest", cwd=project, artifacts_dir=tmp_path / "art")
    )
    pytest_gate = f"{sys.executable} -m pytest -q -p no:cacheprovider test_calc.py"
    try:
        async with await Store.open(tmp_path / "db" / "prime-agent.duckdb") as store:
            sid = new_session_id()
            await store.create_session(
                SessionRecord(
                    id=sid, root_id=sid, cwd=str(project), model="openai/fake", backend="local"
                )
            )
            target = LiveTarget(store, sid, box)
            autonomy = Autonomy(store)
            await autonomy.enable(sid, AutonomousPolicy(gates=[pytest_gate], gate_timeout_s=60))

            async def turn(tokens: int) -> Continue | Stop | None:
                usage = UsagePayload(provider="fake", model="fake", input=tokens, output=10)
                await store.append(sid, "usage", usage)
                await store.append(sid, "turn_end", TurnEndPayload(reason="completed"))
                return await autonomy.after_turn(target, "completed")

            first = await turn(100)
            assert isinstance(first, Continue)
            assert "attempt 1" in first.text and "exited with 1" in first.text
            assert "assert 0 == 4" in first.text and "1 failed" in first.text

            # Nothing changed: the failing gate is not run again.
            second = await turn(100)
            assert isinstance(second, Continue) and "not run again" in second.text

            # A different size, so Python does not take the stale .pyc of the same second.
            (project / "calc.py").write_text("def add(a, b):\n    return a + b  # fixed\n")
            third = await turn(100)
            assert third == Stop("gate_passed", "1 gate passed") and third.exit_code == 0

            events = await store.events(sid)
            results = [e.payload for e in events if e.type == "gate_result"]
            assert [(r["passed"], r["skipped"], r["attempt"]) for r in results] == [
                (False, False, 1),
                (False, True, 2),
                (True, False, 3),
            ]
            assert events[-1].type == "autonomous_stop"
            stop = events[-1].payload
            assert (stop["reason"], stop["turns"], stop["tokens"]) == ("gate_passed", 3, 330)
            row = await autonomy.get(sid)
            assert row is not None and row.stop_reason == "gate_passed"
            assert json.dumps(row.to_wire())  # the control API can show it
    finally:
        await box.stop()
