"""The docker backend against a real Docker Engine: isolation, limits, recovery, cleanup.

Needs the session image; it is built once per test session when missing or stale (see
test_sandbox_conformance.docker_ready). Skipped when no engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from orchestrator.sandbox.base import SandboxSpec
from tests.helpers import container_stopped, need, wait_until
from tests.integration.test_sandbox_conformance import docker_ready, workspace

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(600),
]

PLANTED_KEY = "sk-planted-docker-0123456789abcdef"
GRACE_S = 1.0
CAP = 4096
SMALL_MEMORY = 384 * 1024**2
SMALL_PIDS = 64
BASE_PROCESSES = 3  # in a sandbox container at rest: docker-init, the gateway, the kernel
# A killed container is reported stopped by the engine within this bound.
KILL_SETTLE_S = 30.0
SETTLE_DEADLINE_S = 15.0  # the gateway reaps adopted zombies every second
POLL_S = 0.1
HANG_S = 5.0  # after timeout + grace: give up on the container (fork bomb) sooner in tests


@pytest.fixture(scope="module")
def docker_image() -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)


@pytest.fixture(scope="module")
def planted_key() -> Iterator[str]:
    # Module scope: the key is in this process's environment before any container starts.
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = PLANTED_KEY
    yield PLANTED_KEY
    if old is None:
        os.environ.pop("OPENAI_API_KEY", None)
    else:
        os.environ["OPENAI_API_KEY"] = old


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(docker_image: None, planted_key: str) -> AsyncIterator[object]:
    from orchestrator.sandbox.docker import DockerBackend

    b = DockerBackend(
        pool_size=0,
        interrupt_grace_s=GRACE_S,
        output_cap_chars=CAP,
        memory_bytes=SMALL_MEMORY,
        pids_limit=SMALL_PIDS,
        hang_allowance_s=HANG_S,
    )
    yield b
    await b.close()
    from orchestrator.sandbox.docker import list_owned

    assert not [c for c in list_owned() if c.session_id.startswith("dk-")]


def _spec(tmp: Path, name: str, env: dict[str, str] | None = None) -> SandboxSpec:
    return SandboxSpec(
        session_id=f"dk-{name}",
        cwd=workspace(tmp / f"{name}-cwd"),
        artifacts_dir=tmp / f"{name}-art",
        env=env or {},
    )


class _Echo:
    """A TCP echo server on the host loopback: stands in for NATS (and for 'another port')."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> _Echo:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.read(100))
            await w.drain()
            w.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def test_isolation(backend: object, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    assert isinstance(backend, DockerBackend)
    async with _Echo() as nats, _Echo() as other:
        env = {"PRIME_AGENT_NATS_URL": f"nats://127.0.0.1:{nats.port}"}
        sb = await backend.create(_spec(tmp_path, "iso", env))
        try:
            probe = f"""
import os, socket
def can_connect(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False
def can_write(path):
    try:
        open(path, 'w').close()
        return True
    except OSError:
        return False
cg = open('/proc/1/cgroup').read()
print('container', os.path.exists('/.dockerenv') or 'docker' in cg)
print('uid', os.getuid())
print('write_usr', can_write('/usr/x'), can_write('/x'), can_write('/etc/x'))
print('write_ws', can_write('ws.txt'), can_write('/tmp/t'))
print('outside', can_connect('1.1.1.1', 53) or can_connect('8.8.8.8', 53))
print('host_other', can_connect('127.0.0.1', {other.port}), can_connect('172.17.0.1', {other.port}))
print('nats_url', os.environ['PRIME_AGENT_NATS_URL'])
s = socket.create_connection(('127.0.0.1', 4222), timeout=5)
s.sendall(b'ping'); print('nats_echo', s.recv(10)); s.close()
"""
            r = await sb.execute(probe, timeout_s=60, cell_id="probe")
            assert r.status == "ok", r
            lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
            assert lines["container"] == "True"
            assert lines["uid"] != "0"
            assert lines["write_usr"] == "False False False"
            assert lines["write_ws"] == "True True"
            assert lines["outside"] == "False"
            assert lines["host_other"] == "False False"
            assert lines["nats_url"] == "nats://127.0.0.1:4222"
            assert lines["nats_echo"] == "b'ping'"
        finally:
            await sb.stop()


async def test_no_planted_key_in_env_or_filesystem(
    backend: object, tmp_path: Path, planted_key: str
) -> None:
    from orchestrator.sandbox.docker import DockerBackend, DockerSandbox

    assert isinstance(backend, DockerBackend)
    sb = await backend.create(_spec(tmp_path, "secret"))
    try:
        assert isinstance(sb, DockerSandbox)
        half = len(planted_key) // 2
        # The key is assembled in the kernel so the cell source itself does not contain it.
        code = (
            f"key = {planted_key[:half]!r} + {planted_key[half:]!r}\n"
            "import os, subprocess\n"
            "hits = [k for k, v in os.environ.items() if key in v]\n"
            "for pid in os.listdir('/proc'):\n"
            "    if pid.isdigit():\n"
            "        try: data = open(f'/proc/{pid}/environ', 'rb').read()\n"
            "        except OSError: continue\n"
            "        hits += [pid] if key.encode() in data else []\n"
            "grep = subprocess.run(['grep', '-rIlF', '--exclude-dir=proc', '--exclude-dir=sys',\n"
            "    '--exclude-dir=dev', key, '/'], capture_output=True, text=True)\n"
            "print(hits, repr(grep.stdout), grep.returncode)\n"
        )
        r = await sb.execute(code, timeout_s=120, cell_id="scan")
        assert r.status == "ok", r
        # grep: no file matched (exit 2 only means some root-only files were unreadable, to
        # the kernel too).
        assert r.stdout.strip() in ("[] '' 1", "[] '' 2"), r.stdout
        attrs = backend.docker.containers.get(sb.container_id).attrs
        assert planted_key not in str(attrs["Config"]["Env"])
    finally:
        await sb.stop()


async def test_memory_hog_and_fork_bomb_stay_inside(backend: object, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    assert isinstance(backend, DockerBackend)
    bystander = await backend.create(_spec(tmp_path, "bystander"))
    sb = await backend.create(_spec(tmp_path, "hostile"))
    try:
        await bystander.execute("alive = 1", timeout_s=30, cell_id="a")
        hog = await sb.execute("x = b'a' * (1024**3)", timeout_s=60, cell_id="hog")
        assert hog.status == "kernel_died" and hog.kernel_restarted and hog.notice, hog
        ok = await sb.execute("1 + 1", timeout_s=60, cell_id="after-hog")
        assert ok.status == "ok" and ok.result == "2"

        bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
        r = await sb.execute(bomb, timeout_s=3, cell_id="bomb")
        # Either the interrupt stops the kernel and the copies it forked are killed (the
        # namespace is kept), or the kernel is restarted and the gateway kills what it left.
        assert r.status in ("timeout", "kernel_died") and r.notice, r
        if not r.kernel_restarted:
            assert "forked copies of the kernel it left were killed" in r.notice, r
        ok = await sb.execute("2 + 2", timeout_s=60, cell_id="after-bomb")
        assert ok.status == "ok" and ok.result == "4", ok
        # Nothing of the bomb is left: docker-init, the gateway and the kernel.
        assert await _processes_settle(backend, sb.container_id, BASE_PROCESSES) == BASE_PROCESSES
        still = await bystander.execute("alive + 1", timeout_s=30, cell_id="b")
        assert still.result == "2"
    finally:
        await sb.stop()
        await bystander.stop()


async def _processes_settle(backend: object, container_id: str, want: int) -> int:
    """Poll the container's process list until it holds ``want`` processes (or a deadline
    passes); return the last count."""
    from orchestrator.sandbox.docker import DockerBackend

    assert isinstance(backend, DockerBackend)
    container = backend.docker.containers.get(container_id)
    deadline = asyncio.get_running_loop().time() + SETTLE_DEADLINE_S
    while True:
        count = len((await asyncio.to_thread(container.top))["Processes"])
        if count == want or asyncio.get_running_loop().time() > deadline:
            return count
        await asyncio.sleep(POLL_S)


async def test_killed_container_recovers_with_a_notice(backend: object, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend, DockerSandbox

    assert isinstance(backend, DockerBackend)
    sb = await backend.create(_spec(tmp_path, "kill"))
    try:
        assert isinstance(sb, DockerSandbox)
        await sb.execute("y = 5", timeout_s=30, cell_id="a")
        old = sb.container_id
        await asyncio.to_thread(backend.docker.containers.get(old).kill)
        assert await asyncio.to_thread(
            wait_until, lambda: container_stopped(backend.docker, old), timeout=KILL_SETTLE_S
        )
        r = await sb.execute("print('back')", timeout_s=60, cell_id="b")
        assert r.status == "ok" and r.stdout == "back\n"
        assert r.kernel_restarted and "namespace is lost" in r.notice
        assert sb.container_id != old
        names = await sb.execute("'y' in dir()", timeout_s=30, cell_id="c")
        assert names.result == "False"
    finally:
        await sb.stop()


async def test_orphans_are_found_and_removed(backend: object) -> None:
    from orchestrator.sandbox.docker import (
        LABEL_HOST_PID,
        LABEL_INSTANCE,
        LABEL_OWNER,
        LABEL_SESSION,
        DockerBackend,
        find_orphans,
        remove_orphans,
    )

    assert isinstance(backend, DockerBackend)
    dead_pid = 2**22 + 12345  # above pid_max's default: never a live process
    orphan = await asyncio.to_thread(
        backend.docker.containers.create,
        backend.image,
        ["true"],
        labels={
            LABEL_OWNER: str(os.getuid()),
            LABEL_SESSION: "dk-orphan",
            LABEL_INSTANCE: "main",
            LABEL_HOST_PID: str(dead_pid),
        },
    )
    try:
        found = await asyncio.to_thread(find_orphans)
        assert orphan.id in [o.id for o in found]
        kept = await asyncio.to_thread(find_orphans, live_sessions={"dk-orphan"})
        assert orphan.id not in [o.id for o in kept]
        removed = await asyncio.to_thread(remove_orphans)
        assert orphan.id in [o.id for o in removed]
        assert orphan.id not in [o.id for o in backend.list_owned()]
    finally:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(orphan.remove, force=True)


async def test_warm_pool_hit_for_the_same_workspace(docker_image: None, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    b = DockerBackend(pool_size=1, interrupt_grace_s=GRACE_S)
    try:
        first = await b.create(_spec(tmp_path, "pool-a"))
        assert b.pool is not None
        await b.pool.wait_ready(120)
        second = await b.create(
            SandboxSpec(session_id="dk-pool-b", cwd=first.spec.cwd, artifacts_dir=tmp_path / "b")
        )
        assert b.pool.statistics().hits == 1
        r = await second.execute("import os; os.getcwd()", timeout_s=30, cell_id="a")
        assert r.result == repr(str(first.spec.cwd))
    finally:
        await b.close()
    from orchestrator.sandbox.docker import list_owned

    assert not [c for c in list_owned() if c.session_id in ("dk-pool-a", "dk-pool-b", "pool")]
