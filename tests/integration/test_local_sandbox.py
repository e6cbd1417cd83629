"""The local sandbox backend against a real Kernel Gateway and real ipykernels (no mocks).

Most tests share one sandbox (module scope) to keep the suite fast; each test uses its own
variable names, and tests that restart the kernel do not depend on earlier state. Tests that
stop or kill a sandbox start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import CellResult, SandboxRef, SandboxSpec
from orchestrator.sandbox.local import LocalBackend, LocalSandbox
from orchestrator.sandbox.output import ARTIFACT_SUBDIR

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc"),
]

PLANTED_KEY = "sk-planted-do-not-leak-0123456789"
CAP = 4096  # a small output cap keeps the big-output tests cheap
GRACE_S = 1.0  # interrupt grace for the module backend
GONE_DEADLINE_S = 15.0
POLL_S = 0.05


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state != "Z"


async def _wait_gone(pids: list[int], deadline_s: float = GONE_DEADLINE_S) -> list[int]:
    """Poll /proc until every pid is gone (or a zombie); return those still alive."""
    deadline = time.monotonic() + deadline_s
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(POLL_S)


def _spec(
    tmp: Path, name: str, *, env: dict[str, str] | None = None, die_with_parent: bool = True
) -> SandboxSpec:
    cwd = tmp / f"{name}-cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    return SandboxSpec(
        session_id=f"s-{name}",
        cwd=cwd,
        artifacts_dir=tmp / f"{name}-art",
        env=env or {},
        die_with_parent=die_with_parent,
    )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend() -> AsyncIterator[LocalBackend]:
    b = LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S, output_cap_chars=CAP)
    yield b
    await b.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared(
    backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalSandbox]:
    # A provider key in the orchestrator's environment must never reach the sandbox (R16).
    os.environ["OPENAI_API_KEY"] = PLANTED_KEY
    # The user's choice of accelerators holds inside (here: none, which is an empty value).
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        tmp = tmp_path_factory.mktemp("shared")
        sandbox = await backend.create(_spec(tmp, "shared", env={"PRIME_TEST_VAR": "hello"}))
    finally:
        del os.environ["OPENAI_API_KEY"]
        if devices is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = devices
    yield sandbox
    await sandbox.stop()


async def run(
    sandbox: LocalSandbox, code: str, timeout_s: float = 30.0, cell: str = "c"
) -> CellResult:
    return await sandbox.execute(code, timeout_s=timeout_s, cell_id=cell)


# --- basics ----------------------------------------------------------------------------------


async def test_state_persists_across_cells(shared: LocalSandbox) -> None:
    assert (await run(shared, "persist_x = 41")).status == "ok"
    result = await run(shared, "persist_x += 1\npersist_x")
    assert result.status == "ok"
    assert result.result == "42"


async def test_streams_result_display_and_error(shared: LocalSandbox) -> None:
    code = (
        "import sys\n"
        "print('to stdout')\n"
        "print('to stderr', file=sys.stderr)\n"
        "display('shown')\n"
        "6 * 7"
    )
    result = await run(shared, code)
    assert result.status == "ok"
    assert result.stdout == "to stdout\n"
    assert result.stderr == "to stderr\n"
    assert result.display == "'shown'"
    assert result.result == "42"
    assert result.error is None and not result.kernel_restarted

    failed = await run(shared, "print('before')\nraise ValueError('boom')")
    assert failed.status == "error"
    assert failed.stdout == "before\n"
    assert failed.error is not None
    assert failed.error.ename == "ValueError"
    assert failed.error.evalue == "boom"
    assert "ValueError: boom" in failed.error.traceback
    assert "\x1b" not in failed.error.traceback  # NoColor + cleaning


async def test_cwd_env_and_no_secrets(shared: LocalSandbox) -> None:
    result = await run(
        shared,
        "import os\n"
        "print(os.getcwd())\n"
        "print(os.environ.get('PRIME_TEST_VAR'))\n"
        "print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))\n"
        "sorted(os.environ)",
    )
    assert result.stdout.splitlines() == [str(shared.spec.cwd), "hello", "''"]
    assert "OPENAI_API_KEY" not in result.result
    assert "PRIME_AGENT_GATEWAY_TOKEN" not in result.result
    # Not in the environment of either process, whatever the kernel's os.environ says now.
    assert shared.kernel_pid is not None
    for pid in (shared.kernel_pid, shared.gateway_pid):
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert PLANTED_KEY.encode() not in environ
        assert b"OPENAI_API_KEY" not in environ


async def test_output_bounded_with_artifact_and_cleaned(shared: LocalSandbox) -> None:
    # ~10 MB over 100k writes, with ANSI colours, BEL and NUL sprinkled in.
    code = (
        "for i in range(100_000):\n"
        "    print(f'line {i:06d} \\x1b[31mred\\x1b[0m\\x07\\x00 ' + 'x' * 80)\n"
        "print('the end')"
    )
    result = await run(shared, code, cell="big-1")
    assert result.status == "ok"
    assert len(result.stdout) <= CAP
    assert "[... truncated " in result.stdout
    assert result.truncated_chars > 9_000_000
    assert result.stdout.startswith("line 000000 red " + "x" * 80 + "\n")
    assert result.stdout.endswith("the end\n")
    assert not any(ch in result.stdout for ch in "\x1b\x07\x00")
    # Past 1 MiB the kernel spilled stdout: the file is exactly what the cell wrote (escapes
    # and all; the model reading it back gets it cleaned like any output).
    spilled = shared.spec.artifacts_dir / ARTIFACT_SUBDIR / "big-1.stdout.txt"
    assert result.artifact_path == spilled
    assert result.artifact_bytes == spilled.stat().st_size
    lines = spilled.read_text().split("\n")
    assert len(lines) == 100_002 and lines[-2:] == ["the end", ""]
    assert lines[12345] == "line 012345 \x1b[31mred\x1b[0m\x07\x00 " + "x" * 80
    assert not (shared.spec.artifacts_dir / ARTIFACT_SUBDIR / "big-1.txt").exists()


async def test_invalid_utf8_control_chars_and_carriage_returns(shared: LocalSandbox) -> None:
    # Bytes written to fd 1 reach the cell through ipykernel's fd capture thread, which is not
    # ordered with sys.stdout: one cell each.
    raw = await run(shared, "import os\nos.write(1, b'raw \\xff\\xfe bytes\\n')")
    assert raw.stdout == "raw \ufffd\ufffd bytes\n"
    code = (
        "import sys\n"
        "print('bell\\x07 nul\\x00 esc\\x1b[2J\\x1b]0;title\\x07 done')\n"
        "sys.stdout.write('10%\\r50%\\r100%\\n')\n"
    )
    result = await run(shared, code)
    assert result.status == "ok"
    assert result.stdout == "bell nul esc done\n100%\n"
    assert result.artifact_path is None and result.truncated_chars == 0


async def test_oversized_single_message_is_dropped_with_a_note_on_its_own_cell(
    shared: LocalSandbox,
) -> None:
    # The kernel spills big output itself (test_sandbox_conformance.py), but the host cannot
    # rely on it: a cell may send a 40 MB message past it. That keeps the gateway serializing
    # for longer than a cell once waited for its idle, so the note went to the NEXT cell.
    code = (
        "import sys\n"
        "_out = sys.stdout\n"
        "_msg = _out.session.msg('stream', {'name': 'stdout', 'text': 'z' * 40_000_000},\n"
        "                        parent=_out.parent_header)\n"
        "_out.session.send(_out.pub_thread, _msg, ident=_out.topic)\n"
        "del _msg"
    )
    result = await run(shared, code, timeout_s=120)
    assert result.status == "ok"
    assert "was dropped" in result.notice
    follow = await run(shared, "print('still here')")
    assert follow.stdout == "still here\n" and not follow.notice


async def test_a_cell_arms_the_same_timers_however_many_messages_it_sends(
    shared: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting for a cell arms its time limit once (and once more when the reply sets the idle
    grace), not a timer per kernel message (gateway.py, ``_wait``; docs/benchmarks.md, "Where
    a step's host CPU goes"): one output or forty, the same count."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    await run(shared, "from IPython.display import display")
    monkeypatch.setattr(loop, "call_at", counting)
    counts = []
    for outputs in (1, 40):
        armed.clear()
        result = await run(shared, f"for i in range({outputs}):\n    display(i)")
        assert result.status == "ok" and str(outputs - 1) in result.display
        counts.append(len(armed))
    assert counts[0] == counts[1]


# --- timeouts, restarts, kernel death ------------------------------------------------------


async def test_timeout_interrupts_and_keeps_namespace(shared: LocalSandbox) -> None:
    await run(shared, "kept_y = 7")
    started = time.monotonic()
    result = await run(shared, "while True: pass", timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + GRACE_S + 2
    assert result.status == "timeout"
    assert not result.kernel_restarted
    assert "interrupted" in result.notice
    assert result.error is not None and result.error.ename == "KeyboardInterrupt"
    assert (await run(shared, "kept_y")).result == "7"


async def test_cancelled_execute_interrupts_the_kernel(shared: LocalSandbox) -> None:
    await run(shared, "cancel_v = 3")
    task = asyncio.create_task(run(shared, "while True: pass", timeout_s=60))
    # Wait until the cell is running (the pending request exists), then give up on it.
    deadline = time.monotonic() + GONE_DEADLINE_S
    while shared.client._pending is None and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The kernel was interrupted: the next cell runs at once and the namespace is intact.
    follow = await run(shared, "cancel_v", timeout_s=5)
    assert follow.status == "ok" and follow.result == "3"


async def test_cell_ignoring_interrupt_gets_kernel_restarted(shared: LocalSandbox) -> None:
    await run(shared, "lost_z = 1\nimport os\nos.environ['SET_IN_CELL'] = '1'")
    old_pid = shared.kernel_pid
    code = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
    )
    result = await run(shared, code, timeout_s=0.5)
    assert result.status == "timeout"
    assert result.kernel_restarted
    assert "restarted" in result.notice and "namespace is lost" in result.notice
    assert shared.kernel_pid != old_pid and shared.kernel_pid is not None
    after = await run(
        shared, "import os\nprint(os.getcwd(), os.environ.get('PRIME_TEST_VAR'))\n'lost_z' in dir()"
    )
    assert after.status == "ok"
    assert after.result == "False"
    # The session's cwd and env are applied again to the new kernel.
    assert after.stdout == f"{shared.spec.cwd} hello\n"


async def test_kernel_killed_mid_cell_then_next_cell_works(shared: LocalSandbox) -> None:
    old_pid = shared.kernel_pid
    assert old_pid is not None
    result = await run(shared, "import os\nos.kill(os.getpid(), 9)")
    assert result.status == "kernel_died"
    assert result.kernel_restarted
    assert "died" in result.notice
    assert not _alive(old_pid)
    follow = await run(shared, "import os\nprint(os.getcwd())\n1 + 1")
    assert follow.status == "ok" and follow.result == "2"
    assert follow.stdout == f"{shared.spec.cwd}\n"
    assert shared.kernel_pid not in (None, old_pid)


async def test_kernel_killed_between_cells_is_reported_on_the_next(shared: LocalSandbox) -> None:
    await run(shared, "between_w = 1")
    assert shared.kernel_pid is not None
    os.kill(shared.kernel_pid, signal.SIGKILL)
    # The gateway notices (restarter poll) and announces the restart on the socket.
    deadline = time.monotonic() + GONE_DEADLINE_S
    while not shared.client.unreported_restarts and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    result = await run(shared, "'between_w' in dir()")
    assert result.status == "ok"
    assert result.result == "False"
    assert result.kernel_restarted and "died" in result.notice


# --- %%bash --------------------------------------------------------------------------------


async def test_bash_magic_streams_and_reports_exit_status(shared: LocalSandbox) -> None:
    ok = await run(shared, "%%bash\necho out\necho err >&2\nprintf 'bad \\xff\\n'")
    assert ok.status == "ok"
    assert ok.stdout == "out\nbad \ufffd\n"
    assert ok.stderr == "err\n"
    failed = await run(shared, "%%bash\necho partial\nexit 3")
    assert failed.status == "error"
    assert failed.stdout == "partial\n"
    assert failed.error is not None
    assert failed.error.traceback == "BashExitError: bash exited with status 3"


async def test_bash_follows_cd_and_environ(shared: LocalSandbox, tmp_path: Path) -> None:
    await run(shared, f"%cd {tmp_path}\nimport os\nos.environ['FROM_PY'] = 'yes'")
    try:
        result = await run(shared, "%%bash\npwd\necho $FROM_PY")
        assert result.stdout == f"{tmp_path}\nyes\n"
    finally:
        await run(shared, f"%cd {shared.spec.cwd}")


async def test_bash_process_group_killed_on_interrupt(shared: LocalSandbox) -> None:
    code = "%%bash\nsleep 120 &\necho $!\nsleep 120\n"
    result = await run(shared, code, timeout_s=1.0)
    assert result.status == "timeout"
    assert not result.kernel_restarted  # the magic handled the interrupt
    background_pid = int(result.stdout.split()[0])
    assert await _wait_gone([background_pid]) == []
    assert (await run(shared, "1")).result == "1"


async def test_edit_helper(shared: LocalSandbox) -> None:
    path = shared.spec.cwd / "edit_me.txt"
    path.write_text("alpha\nbeta\ngamma\nbeta\n")
    once = await run(shared, "print(await edit('edit_me.txt', 'alpha', 'ALPHA'))")
    assert once.status == "ok"
    assert "-alpha\n+ALPHA\n" in once.stdout
    plain = await run(shared, "edit('edit_me.txt', 'gamma', 'GAMMA')")
    assert "+GAMMA" in plain.result
    assert path.read_text() == "ALPHA\nbeta\nGAMMA\nbeta\n"
    twice = await run(shared, "edit('edit_me.txt', 'beta', 'B')")
    assert twice.error is not None and "occurs 2 times" in twice.error.evalue
    missing = await run(shared, "edit('edit_me.txt', 'delta', 'D')")
    assert missing.error is not None and "not found" in missing.error.evalue
    assert path.read_text() == "ALPHA\nbeta\nGAMMA\nbeta\n"


# --- lifecycle -----------------------------------------------------------------------------


async def test_stop_leaves_no_process(backend: LocalBackend, tmp_path: Path) -> None:
    sandbox = await backend.create(_spec(tmp_path, "stop"))
    code = (
        "import subprocess\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(p.pid)"
    )
    detached = int((await run(sandbox, code)).stdout)
    bash_job = await run(sandbox, "%%bash\nsleep 300 >/dev/null 2>&1 &\necho $!")
    pids = [sandbox.gateway_pid, sandbox.kernel_pid, detached, int(bash_job.stdout)]
    assert all(isinstance(pid, int) and _alive(pid) for pid in pids)
    assert await sandbox.is_alive()
    await sandbox.stop()
    assert sandbox not in backend._owned
    assert await _wait_gone([pid for pid in pids if pid is not None]) == []
    assert not sandbox.runtime_dir.exists()
    assert not await sandbox.is_alive()
    await sandbox.stop()  # idempotent
    with pytest.raises(SandboxError):
        await run(sandbox, "1")


_ORPHAN_SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from orchestrator.sandbox.base import CellResult, SandboxRef, SandboxSpec
from orchestrator.sandbox.local import LocalBackend

async def main():
    tmp = Path(sys.argv[1])
    backend = LocalBackend(pool_size=0)
    sandbox = await backend.create(SandboxSpec(
        session_id="s-orphan", cwd=tmp, artifacts_dir=tmp, die_with_parent=True))
    pids = {"gateway": sandbox.gateway_pid, "kernel": sandbox.kernel_pid}
    print(json.dumps({**pids, "runtime_dir": str(sandbox.runtime_dir)}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_die_with_parent_on_sigkill(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _ORPHAN_SCRIPT,
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            line = await proc.stdout.readline()
        ready = json.loads(line)
        assert _alive(ready["gateway"]) and _alive(ready["kernel"])
    finally:
        proc.kill()
        await proc.wait()
    assert await _wait_gone([ready["gateway"], ready["kernel"]]) == []
    # Nobody is left to clean up, so the gateway removed its runtime dir on the way out.
    assert not Path(ready["runtime_dir"]).exists()


async def test_warm_pool_acquire_returns_ready_sandbox(tmp_path: Path) -> None:
    backend = LocalBackend(pool_size=1, interrupt_grace_s=GRACE_S)
    try:
        assert backend.pool is not None
        backend.start_pool()
        await backend.pool.wait_ready(timeout_s=60)
        spec = _spec(tmp_path, "pool", env={"POOL_VAR": "p"})
        # How fast a pooled sandbox answers is measured in bench/ (bench_first_cell.py), not here.
        sandbox = await backend.create(spec)
        result = await run(sandbox, "import os\nprint(os.getcwd(), os.environ['POOL_VAR'])")
        assert result.stdout == f"{spec.cwd} p\n"
        assert sandbox.ref.session_id == "s-pool"
        stats = backend.pool.statistics()
        assert stats.hits == 1 and stats.misses == 0
        # The pool refills in the background.
        await backend.pool.wait_ready(timeout_s=60)
        # A different die_with_parent cannot come from this pool: cold start.
        cold = await backend.create(_spec(tmp_path, "cold", die_with_parent=False))
        assert backend.pool.statistics().misses == 1
        assert (await run(cold, "1 + 1")).result == "2"
    finally:
        await backend.close()


class _RecordThatHangs:
    """A listener whose record of a READY sandbox (kernel id set) never finishes: the moment a
    warm pool closed at shutdown cancels its filler."""

    def __init__(self) -> None:
        self.refs: list[SandboxRef] = []
        self.hanging = asyncio.Event()

    async def sandbox_up(self, ref: SandboxRef) -> None:
        self.refs.append(ref)
        if ref.kernel_id:
            self.hanging.set()
            await asyncio.Event().wait()

    async def sandbox_down(self, ref: SandboxRef) -> None:
        return None


async def test_a_start_cancelled_while_its_record_is_written_stops_its_gateway(
    tmp_path: Path,
) -> None:
    # Was: the last record sat outside the start's cleanup, so a cancel there left a
    # running gateway nobody held (seen as a gateway alive after `daemon stop`).
    backend = LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    listener = _RecordThatHangs()
    backend.listener = listener
    start = asyncio.ensure_future(backend.create(_spec(tmp_path, "hang", die_with_parent=False)))
    try:
        async with asyncio.timeout(60):
            await listener.hanging.wait()
        gateway = int(listener.refs[0].ref)
        assert _alive(gateway)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert await _wait_gone([gateway]) == []
        assert not Path(listener.refs[0].runtime_dir).exists()
    finally:
        await backend.close()
