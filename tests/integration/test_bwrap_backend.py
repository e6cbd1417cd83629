"""The bwrap backend against real bubblewrap: who runs the kernel, what it sees, the workspace
modes, the outputs and snapshot directories, NATS through the relay, the network policy,
adoption after the owner's kill -9, and cleanup (orchestrator/sandbox/bwrap.py).

The attacks (secrets, host files, limits) are in test_bwrap_isolation.py; the contract every
backend keeps is in test_sandbox_conformance.py. Needs bwrap that runs a sandbox here: skipped
otherwise, failed with CI=true.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.errors import SandboxStartError
from orchestrator.procs import pid_alive
from orchestrator.sandbox.base import SandboxRef, SandboxSpec, WorkspaceMode
from orchestrator.sandbox.bwrap import BwrapBackend, BwrapSandbox
from orchestrator.sandbox.bwrap_owned import CONFINEMENT_FILE_NAME, owned_sandboxes, owner_mark
from tests.helpers import need, wait_until
from tests.integration.test_docker_backend import _Echo
from tests.integration.test_sandbox_conformance import SANDBOX_UID, workspace

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(300),
]

GRACE_S = 1.0
CAP = 4096
GONE_TIMEOUT_S = 15.0
DRIVER_READY_S = 60.0
ROOT = Path(__file__).resolve().parents[2]
# A mark, never a real socket; one per run, so two runs of this file never remove each
# other's sandboxes (remove_unknown takes every sandbox of its owner).
OWNER = f"/tmp/prime-agent-test-owner-{os.getpid()}.sock"


@pytest.fixture(scope="module")
def bwrap_here() -> None:
    from orchestrator.sandbox.bwrap_probe import bwrap_usable

    usable, why = bwrap_usable()
    if not usable:
        need("bwrap", why)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(bwrap_here: None) -> AsyncIterator[BwrapBackend]:
    b = BwrapBackend(interrupt_grace_s=GRACE_S, output_cap_chars=CAP)
    yield b
    await b.close()


def _spec(tmp: Path, name: str, **changes: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "session_id": f"bw-{name}",
        "cwd": workspace(tmp / f"{name}-cwd"),
        "artifacts_dir": tmp / f"{name}-art",
    }
    fields.update(changes)
    return SandboxSpec(**fields)


async def _run(sb: BwrapSandbox, code: str, cell: str = "c") -> str:
    r = await sb.execute(code, timeout_s=60, cell_id=cell)
    assert r.status == "ok", r
    return r.stdout


def _processes(sb: BwrapSandbox) -> list[int]:
    assert sb.child is not None and sb.init is not None
    return [sb.child.pid, sb.init.pid]


def _all_gone(pids: list[int]) -> None:
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), timeout=GONE_TIMEOUT_S), [
        p for p in pids if pid_alive(p)
    ]


async def test_kernel_runs_unprivileged_in_its_own_namespaces(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    sb = await backend.create(_spec(tmp_path, "who"))
    try:
        out = await _run(
            sb,
            "import os, socket\n"
            "print(os.getuid(), os.getgid(), os.getgroups())\n"
            "print(os.getcwd(), os.environ['HOME'], socket.gethostname())\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "print(min(int(p) for p in os.listdir('/proc') if p.isdigit()))\n",
        )
        ids, where, caps, own_pids = out.strip().splitlines()
        expected = SANDBOX_UID if os.getuid() == 0 else os.getuid()
        assert ids.split()[0] == str(expected) and ids.split()[0] != "0"
        assert where == f"{sb.spec.cwd} /home/sandbox sandbox"
        assert int(caps, 16) == 0  # no capability at all
        assert own_pids == "1"  # its own pid namespace: bwrap's init is pid 1
        assert sb.init is not None and sb.init.pid != 1  # the host pid of its pid 1
        # the host side sees the bwrap process run as that uid too
        assert sb.child is not None
        assert os.stat(f"/proc/{sb.child.pid}").st_uid == expected
        info = await sb.info()
        assert info.state == "running" and info.name == f"pid {sb.child.pid}"
        assert info.memory_bytes is not None and info.memory_bytes > 0
        assert info.cpu_seconds is not None and info.cpu_seconds > 0
    finally:
        await sb.stop()


async def test_only_the_allowed_host_paths_are_visible(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    other = workspace(tmp_path / "other-session")
    (other / "secret.txt").write_text("another session's file")
    sb = await backend.create(_spec(tmp_path, "view"))
    try:
        out = await _run(
            sb,
            "import os\n"
            f"paths = ['/var/run/docker.sock', '/root/.ssh', {str(other)!r}, '/etc/shadow',\n"
            "         '/etc/nats-server.conf', '/var/lib', '/home/sandbox']\n"
            "print([p for p in paths if os.path.exists(p)])\n"
            "print(sorted(os.listdir('/tmp')))\n"
            "print(sorted(os.listdir('/run')), sorted(os.listdir('/run/prime-agent')))\n",
        )
        exists, tmp_entries, run_entries = out.strip().splitlines()
        assert exists == "['/home/sandbox']"
        # the sandbox's own /tmp: the gateway's runtime dir and the first directories of the
        # workspace and outputs paths (bound at the host's paths); nothing else of the host's
        assert sb.runtime_dir is not None
        expected = {"prime-agent-gateway", sb.runtime_dir.name}
        if sb.spec.cwd.is_relative_to("/tmp"):
            expected.add(sb.spec.cwd.relative_to("/tmp").parts[0])
        assert tmp_entries == repr(sorted(expected))
        assert run_entries == "['prime-agent'] ['gateway.sock', 'nats.sock']"
    finally:
        await sb.stop()


async def test_workspace_rw_ro_and_copy(backend: BwrapBackend, tmp_path: Path) -> None:
    write = "import pathlib\npathlib.Path('new.txt').write_text('agent')\nprint('wrote')"
    for mode in ("rw", "ro", "copy"):
        spec = _spec(tmp_path, f"ws-{mode}", workspace=mode)
        (spec.cwd / "data.txt").write_text("original")
        sb = await backend.create(spec)
        try:
            read = await _run(sb, "print(open('data.txt').read())", "read")
            assert read.strip() == "original"
            r = await sb.execute(write, timeout_s=60, cell_id="write")
            if mode == "ro":
                assert r.status == "error" and r.error is not None
                assert "Read-only file system" in r.error.evalue
            else:
                assert r.status == "ok", r
            # copy: the project is untouched while the sandbox runs
            assert (spec.cwd / "new.txt").exists() == (mode == "rw")
        finally:
            await sb.stop()
        # copy: synced back at stop
        assert (spec.cwd / "new.txt").exists() == (mode != "ro"), mode
        if mode != "ro":
            assert (spec.cwd / "new.txt").stat().st_uid == spec.cwd.stat().st_uid


@pytest.mark.skipif(os.getuid() != 0, reason="a root-owned 0700 workspace exists only as root")
async def test_a_workspace_the_sandbox_user_cannot_enter_is_refused_in_one_line(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "data.txt").write_text("root's")
    spec = SandboxSpec(session_id="bw-private", cwd=private, artifacts_dir=tmp_path / "p-art")
    with pytest.raises(SandboxStartError) as caught:
        await backend.create(spec)
    message = str(caught.value)
    assert "--workspace copy" in message and "chmod" in message and "\n" not in message
    # copy mode works: the private copy is the sandbox user's
    mode: WorkspaceMode = "copy"
    sb = await backend.create(SandboxSpec(**{**spec.__dict__, "workspace": mode}))
    try:
        assert (await _run(sb, "print(open('data.txt').read())")).strip() == "root's"
    finally:
        await sb.stop()


async def test_outputs_and_snapshots_are_the_same_files_on_both_sides(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    sb = await backend.create(_spec(tmp_path, "files", snapshot_dir=snapshots))
    try:
        r = await sb.execute("print('z' * 50_000)", timeout_s=60, cell_id="big")
        assert r.artifact_path is not None and r.artifact_path.stat().st_size > 50_000
        assert sb.runtime_dir is not None and sb.runtime_dir in r.artifact_path.parents
        size = await _run(sb, f"import os; print(os.path.getsize({str(r.artifact_path)!r}))")
        assert int(size) == r.artifact_path.stat().st_size
        assert sb.kernel_snapshot_dir is not None and sb.kernel_snapshot_dir != str(snapshots)
        await _run(sb, f"open({sb.kernel_snapshot_dir + '/made'!r}, 'w').write('snap')")
        assert (snapshots / "made").read_text() == "snap"
    finally:
        await sb.stop()


async def test_nats_through_the_relay_and_no_host_port(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    async with _Echo() as nats, _Echo() as other:
        env = {"PRIME_AGENT_NATS_URL": f"nats://127.0.0.1:{nats.port}"}
        sb = await backend.create(_spec(tmp_path, "nats", env=env))
        try:
            out = await _run(
                sb,
                "import os, socket\n"
                "def can_connect(port):\n"
                "    try:\n"
                "        socket.create_connection(('127.0.0.1', port), timeout=2).close()\n"
                "        return True\n"
                "    except OSError:\n"
                "        return False\n"
                "print(os.environ['PRIME_AGENT_NATS_URL'])\n"
                f"print(can_connect({other.port}), can_connect({nats.port}))\n"
                "s = socket.create_connection(('127.0.0.1', 4222), timeout=5)\n"
                "s.sendall(b'ping'); print(s.recv(10)); s.close()\n",
            )
            url, host_ports, echo = out.strip().splitlines()
            assert url == "nats://127.0.0.1:4222"
            assert host_ports == "False False"  # its loopback is its own
            assert echo == "b'ping'"
        finally:
            await sb.stop()


async def test_the_host_network_only_when_asked(bwrap_here: None, tmp_path: Path) -> None:
    b = BwrapBackend(interrupt_grace_s=GRACE_S, output_cap_chars=CAP, network=True)
    try:
        async with _Echo() as nats:
            env = {"PRIME_AGENT_NATS_URL": f"nats://127.0.0.1:{nats.port}"}
            sb = await b.create(_spec(tmp_path, "net", env=env))
            out = await _run(
                sb,
                "import os, socket\n"
                "print(os.environ['PRIME_AGENT_NATS_URL'])\n"
                f"s = socket.create_connection(('127.0.0.1', {nats.port}), timeout=5)\n"
                "s.sendall(b'ping'); print(s.recv(10)); s.close()\n"
                "print(os.path.exists('/etc/resolv.conf'))\n",
            )
            url, echo, resolv = out.strip().splitlines()
            assert url == f"nats://127.0.0.1:{nats.port}"  # used as it is: no relay
            assert echo == "b'ping'"
            assert resolv == str(Path("/etc/resolv.conf").exists())
    finally:
        await b.close()


# A process that owns one sandbox, prints its ref, and waits to be killed.
_OWNER_SCRIPT = """
import asyncio, dataclasses, json, sys
from pathlib import Path
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox import proctree
from orchestrator.sandbox.bwrap import BwrapBackend

async def main():
    tmp, nats_port, die = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "die"
    backend = BwrapBackend(owner=sys.argv[4])
    spec = SandboxSpec(session_id="bw-owned", cwd=tmp, artifacts_dir=tmp / "art",
                       env={"PRIME_AGENT_NATS_URL": f"nats://127.0.0.1:{nats_port}"},
                       die_with_parent=die)
    sandbox = await backend.create(spec)
    await sandbox.execute("kept = 42", timeout_s=30, cell_id="a")
    inside = [p.pid for p in proctree.descendants(sandbox.init.pid)]
    print(json.dumps({"ref": dataclasses.asdict(sandbox.ref), "init": sandbox.init.pid,
                      "inside": inside}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def _owner(tmp: Path, nats_port: int, *, die: bool) -> dict[str, Any]:
    """Start an owning process, read its sandbox's ref, kill it with SIGKILL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _OWNER_SCRIPT,
        str(workspace(tmp)),
        str(nats_port),
        "die" if die else "keep",
        OWNER,
        stdout=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(DRIVER_READY_S):
            line = await proc.stdout.readline()
        ready: dict[str, Any] = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return ready


async def test_a_sandbox_outlives_its_owner_and_is_adopted(
    bwrap_here: None, tmp_path: Path
) -> None:
    async with _Echo() as nats:
        ready = await _owner(tmp_path / "adopt", nats.port, die=False)
        ref = SandboxRef(**ready["ref"])
        bwrap_pid = int(ref.ref)
        assert pid_alive(bwrap_pid) and pid_alive(ready["init"])  # it outlived its owner
        spec = SandboxSpec(
            session_id="bw-owned",
            cwd=(tmp_path / "adopt").resolve(),
            artifacts_dir=tmp_path / "adopt" / "art",
            env={"PRIME_AGENT_NATS_URL": f"nats://127.0.0.1:{nats.port}"},
            die_with_parent=False,
        )
        b = BwrapBackend(interrupt_grace_s=GRACE_S, output_cap_chars=CAP, owner=OWNER)
        try:
            # an unrecorded sandbox would be removed, a recorded one is not touched
            assert await b.remove_unknown({ref.ref}) == 0
            sb = await b.adopt(ref, spec)
            assert sb.adopted and sb.ref.ref == ref.ref
            assert (await _run(sb, "print(kept)")).strip() == "42"  # the same namespace
            # NATS through the relay again: the old owner's relay died with it
            echo = await _run(
                sb,
                "import socket\n"
                "s = socket.create_connection(('127.0.0.1', 4222), timeout=5)\n"
                "s.sendall(b'ping'); print(s.recv(10)); s.close()\n",
            )
            assert echo.strip() == "b'ping'"
            # the owner's mark is on the host-side bwrap process, a digest: the daemon's
            # socket path is never visible inside (bwrap's pid 1 is a fork of it)
            mark = await _run(
                sb,
                "import os\n"
                "hits = []\n"
                "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                "    try:\n"
                "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
                "    except OSError:\n"
                "        continue\n"
                f"    hits += [pid] if {OWNER.encode()!r} in data else []\n"
                "print(hits)\n",
            )
            assert mark.strip() == "[]"
            assert f"PRIME_AGENT_SANDBOX_OWNER={owner_mark(OWNER)}".encode() in Path(
                f"/proc/{bwrap_pid}/environ"
            ).read_bytes().split(b"\0")
            runtime_dir = sb.runtime_dir
            await sb.stop()
            _all_gone([bwrap_pid, ready["init"], *ready["inside"]])
            assert runtime_dir is not None and not runtime_dir.exists()
        finally:
            await b.close()


async def test_an_unrecorded_sandbox_of_a_dead_owner_is_removed(
    bwrap_here: None, tmp_path: Path
) -> None:
    ready = await _owner(tmp_path / "unknown", 1, die=False)
    bwrap_pid = int(ready["ref"]["ref"])
    runtime_dir = Path(ready["ref"]["runtime_dir"])
    assert [info.pid for info, _ in owned_sandboxes(OWNER)] == [bwrap_pid]
    b = BwrapBackend(owner=OWNER)
    assert await b.remove_unknown(set()) == 1
    _all_gone([bwrap_pid, ready["init"], *ready["inside"]])
    assert not runtime_dir.exists()
    assert owned_sandboxes(OWNER) == []
    # gone is gone: removing the record again, or adopting it, never touches another process
    await b.remove(SandboxRef(**ready["ref"]))
    with pytest.raises(Exception, match="gone"):
        await b.adopt(SandboxRef(**ready["ref"]), _spec(tmp_path, "late"))


async def test_a_die_with_parent_sandbox_dies_with_its_owner(
    bwrap_here: None, tmp_path: Path
) -> None:
    ready = await _owner(tmp_path / "die", 1, die=True)
    _all_gone([int(ready["ref"]["ref"]), ready["init"], *ready["inside"]])
    # nobody was left to remove its directory and cgroup: the next backend's first start does
    runtime_dir = Path(ready["ref"]["runtime_dir"])
    record = (runtime_dir / CONFINEMENT_FILE_NAME).read_text()
    groups = [Path(g) for g in json.loads(record)["groups"]]
    assert all(g.is_dir() for g in groups)
    b = BwrapBackend(interrupt_grace_s=GRACE_S, output_cap_chars=CAP)
    try:
        sb = await b.create(_spec(tmp_path, "after-die"))
        await sb.stop()
    finally:
        await b.close()
    assert not runtime_dir.exists()
    assert not any(g.exists() for g in groups)


async def test_stop_kills_everything_in_the_sandbox(backend: BwrapBackend, tmp_path: Path) -> None:
    sb = await backend.create(_spec(tmp_path, "stop"))
    out = await _run(
        sb,
        "import subprocess, os\n"
        "p = subprocess.Popen(['sh', '-c', 'trap \"\" TERM; exec sleep 300'],"
        " start_new_session=True)\n"
        "print(p.pid)\n",
    )
    assert out.strip().isdigit()
    processes = _processes(sb)
    assert sb.init is not None
    from orchestrator.sandbox import proctree

    inside = [p.pid for p in proctree.descendants(sb.init.pid)]
    assert len(inside) >= 3  # the gateway, the kernel, the sleep
    runtime_dir = sb.runtime_dir
    await sb.stop()
    await sb.stop()  # idempotent
    assert not any(pid_alive(p) for p in processes + inside)
    assert runtime_dir is not None and not runtime_dir.exists()
    assert not await sb.is_alive()


async def test_skills_are_importable_and_read_only(backend: BwrapBackend, tmp_path: Path) -> None:
    from orchestrator.sandbox.confined import CONTAINER_SKILLS_DIR
    from tests.integration.test_skills_sandbox import (
        CHILD_CELL,
        EROFS,
        IMPORT_CELL,
        IMPORT_NAME,
        SKILL_NAME,
        make_fixture_skill,
    )

    skill_dir = make_fixture_skill(tmp_path / "skills")
    # Writable for everyone on the host: only the read-only bind can refuse the write below.
    (skill_dir / IMPORT_NAME / "__init__.py").chmod(0o666)
    sb = await backend.create(_spec(tmp_path, "skills", skill_dirs=(skill_dir,)))
    try:
        assert (await sb.execute(IMPORT_CELL, timeout_s=60, cell_id="a")).result == "42"
        assert (await _run(sb, CHILD_CELL, "b")).strip() == "8"
        target = f"{CONTAINER_SKILLS_DIR}/{SKILL_NAME}/{IMPORT_NAME}/__init__.py"
        out = await _run(
            sb,
            f"try:\n    open({target!r}, 'a').write('x')\n    print('written')\n"
            "except OSError as exc:\n    print('refused', exc.errno)\n",
            "c",
        )
        assert out.strip() == f"refused {EROFS}"
    finally:
        await sb.stop()


async def test_orchestrator_dirs_inside_the_workspace_are_hidden(
    backend: BwrapBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(tmp_path, "hidden")
    data = spec.cwd / ".data" / "prime-agent"
    data.mkdir(parents=True)
    (data / "store.duckdb").write_text("the store")
    (spec.cwd / "project.txt").write_text("the project")
    monkeypatch.setenv("XDG_DATA_HOME", str(spec.cwd / ".data"))
    sb = await backend.create(spec)
    try:
        out = await _run(
            sb,
            "import os\n"
            "def can(what, *args):\n"
            "    try:\n"
            "        what(*args)\n"
            "        return True\n"
            "    except OSError:\n"
            "        return False\n"
            "print(can(open, '.data/prime-agent/store.duckdb'), open('project.txt').read())\n"
            "print(can(open, '.data/prime-agent/x', 'w'), os.path.isdir('.data/prime-agent'))\n",
        )
        assert out.strip().splitlines() == ["False the project", "False True"]
    finally:
        await sb.stop()
    assert sorted(os.listdir(data)) == ["store.duckdb"]


async def test_a_killed_sandbox_is_reported_lost_and_still_cleaned_up(
    backend: BwrapBackend, tmp_path: Path
) -> None:
    from orchestrator.errors import KernelDied

    sb = await backend.create(_spec(tmp_path, "killed"))
    try:
        assert sb.init is not None and sb.child is not None
        os.kill(sb.init.pid, signal.SIGKILL)  # the whole pid namespace goes with it
        _all_gone([sb.init.pid])
        from orchestrator.procs import ChildProcess

        assert isinstance(sb.child, ChildProcess)
        await asyncio.wait_for(sb.child.proc.wait(), GONE_TIMEOUT_S)  # bwrap exits with it
        with pytest.raises(KernelDied, match="bwrap sandbox"):
            await sb.execute("1", timeout_s=30, cell_id="after")
        assert not await sb.is_alive()
    finally:
        runtime_dir = sb.runtime_dir
        await sb.stop()
    assert runtime_dir is not None and not runtime_dir.exists()


async def test_a_start_that_times_out_leaves_nothing(
    bwrap_here: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway needs about a second to print its ready line: a start given a tenth of that
    # gives up with the sandbox already running. It must not outlive the failed start, even
    # though it was not started to die with its owner.
    from orchestrator.sandbox import bwrap, bwrap_owned

    seen: dict[str, Any] = {}
    start = bwrap.BwrapSandbox.start

    async def watched(self: BwrapSandbox) -> None:
        try:
            await start(self)
        finally:  # before create's teardown: what ran, and where
            assert self.runtime_dir is not None and self.child is not None
            seen.update(dir=self.runtime_dir, bwrap=self.child.pid)
            seen["init"] = bwrap_owned.read_info(self.runtime_dir)

    monkeypatch.setattr(bwrap.BwrapSandbox, "start", watched)
    b = BwrapBackend(start_timeout_s=0.1)
    try:
        with pytest.raises(SandboxStartError, match=r"did not (become ready|start within)"):
            await b.create(_spec(tmp_path, "slow", die_with_parent=False))
    finally:
        await b.close()
    assert seen["init"] is not None  # the sandbox was running
    assert not pid_alive(seen["bwrap"]) and not pid_alive(seen["init"])
    assert not seen["dir"].exists()
