"""A daemon touches only the containers of its own state directory (issue 15, item 9; R8).

Two setups of one user on one machine (CI next to the user's own runs): each has its own
``XDG_DATA_HOME`` (state dir, instance id), config and daemon. Real daemons, real containers,
the scripted model over HTTP.

- ``shutdown --force`` of one setup, while the other's daemon runs a docker session, leaves
  that container running and its session working: its next cell sees ``x`` (same kernel).
- a setup whose daemon crashed (its container keeps running, recorded in its table, for its
  next daemon to adopt) is not reaped by the other setup's daemon starting on the same socket
  path (shared ``XDG_RUNTIME_DIR``), nor by that setup's ``doctor --fix``, which lists it as
  another setup's; its own restarted daemon adopts it and ``x`` is intact.
- ``doctor --fix`` removes another instance's orphan once its state dir is gone, and
  ``--all-instances`` removes one whose state dir is still there.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.server import default_socket_path
from orchestrator.paths import APP_DIR_NAME, Paths
from orchestrator.testing import FakeModelServer
from tests.helpers import CLI_TIMEOUT_S, daemon_pids, kill_9, need, stop_daemons
from tests.integration.test_sandbox_conformance import docker_ready, workspace

pytestmark = pytest.mark.timeout(900)

POLL_TIMEOUT_S = 180.0  # a bound, not an expectation: a loaded machine starts containers slowly
POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
DEAD_PID = 2**22 + 4343  # above pid_max's default: never a live process

SCRIPT = """
repeat forever:
    when re "^42$":
        text: x plus one is 42
    when "x = 41":
        text: x is defined
    when "define x":
        code: x = 41; print("x = 41")
    when "print x":
        code: print(x + 1)
    else:
        text: x was lost
"""


@dataclass
class Setup:
    """One setup's environment: its own XDG config, data and runtime dirs."""

    env: dict[str, str]

    @property
    def paths(self) -> Paths:
        return Paths(
            config_dir=Path(self.env["XDG_CONFIG_HOME"]) / APP_DIR_NAME,
            data_dir=Path(self.env["XDG_DATA_HOME"]) / APP_DIR_NAME,
            cache_dir=Path(self.env["XDG_CACHE_HOME"]) / APP_DIR_NAME,
            runtime_dir=Path(self.env["XDG_RUNTIME_DIR"]) / APP_DIR_NAME,
        )

    @property
    def socket(self) -> Path:
        return default_socket_path(self.paths)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env=self.env,
            check=False,
        )

    def start_daemon(self) -> int:
        started = self.cli("daemon", "start")
        assert started.returncode == 0, started.stderr
        (pid,) = daemon_pids(self.env["XDG_RUNTIME_DIR"])
        return pid

    def containers(self) -> list[Any]:
        """The containers of this setup's daemon (by the socket they are labelled with)."""
        from orchestrator.sandbox.docker import list_owned

        return [c for c in list_owned() if c.daemon == str(self.socket)]


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    srv = FakeModelServer(SCRIPT).start()
    yield srv
    srv.close()


def _setup(root: Path, model: FakeModelServer, runtime: Path | None = None) -> Setup:
    env = dict(os.environ)
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data")):
        env[var] = str(root / sub)
    env["XDG_RUNTIME_DIR"] = str(runtime or root / "run")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    config = Path(env["XDG_CONFIG_HOME"]) / APP_DIR_NAME / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\nwarm_pool_size = 0\n"
        f'[models."openai/fake"]\napi_base = "{model.url}"\n'
    )
    return Setup(env)


@pytest.fixture
def setups(tmp_path: Path, model: FakeModelServer) -> Iterator[tuple[Setup, Setup]]:
    """Two setups (``a`` is this test's own environment's layout, under tmp_path); whatever a
    test did, their daemons and containers are gone after it."""
    why = docker_ready()
    if why is not None:
        need("docker", why)
    a, b = _setup(tmp_path / "a", model), _setup(tmp_path / "b", model)
    yield a, b
    _cleanup(a, b)


def _cleanup(*setups: Setup) -> None:
    from orchestrator.sandbox.docker import remove_containers

    for setup in setups:
        stop_daemons(setup.env["XDG_RUNTIME_DIR"])
        remove_containers([c.id for c in setup.containers()])


async def _poll(what: str, probe: Any) -> Any:
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            while not (found := await probe()):
                await asyncio.sleep(POLL_INTERVAL_S)
            return found
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _answer(client: ControlClient, sid: str, asked: int) -> str:
    """The session's last assistant text once it said something after ``asked`` replies and is
    idle again."""

    async def done() -> str | None:
        replay = await client.call("attach", session=sid, cursor=0)
        said = [
            e["payload"]["text"]
            for e in replay["events"]
            if e["type"] == "assistant_message" and e["payload"].get("text")
        ]
        status = (await client.call("get_session", session=sid))["session"]["status"]
        return said[-1] if len(said) > asked and status == "idle" else None

    found: str = await _poll(f"an answer from {sid}", done)
    return found


async def _define_x(setup: Setup, cwd: Path) -> str:
    """A docker session of ``setup``'s daemon with ``x = 41`` in its kernel."""
    client = await ControlClient.connect(setup.socket)
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="define x", model="openai/fake", backend="docker"
        )
        sid = str(created["session"])
        assert created["backend"] == "docker"
        assert await _answer(client, sid, 0) == "x is defined"
        return sid
    finally:
        await client.close()


async def _print_x(setup: Setup, sid: str) -> str:
    """What the session answers to "print x" (its cell runs ``print(x + 1)``)."""
    client = await ControlClient.connect(setup.socket)
    try:
        replay = await client.call("attach", session=sid, cursor=0)
        asked = sum(
            1
            for e in replay["events"]
            if e["type"] == "assistant_message" and e["payload"].get("text")
        )
        assert (await client.call("prompt", session=sid, text="print x"))["status"] == ("delivered")
        return await _answer(client, sid, asked)
    finally:
        await client.close()


def _session_container(setup: Setup, sid: str) -> str:
    (found,) = [c.id for c in setup.containers() if c.session_id == sid]
    return str(found)


def _running(container_id: str) -> bool:
    from orchestrator.sandbox.images import docker_client

    try:
        return str(docker_client().containers.get(container_id).status) == "running"
    except Exception:
        return False


def test_shutdown_force_leaves_another_setups_daemon_and_containers(
    setups: tuple[Setup, Setup], tmp_path: Path
) -> None:
    a, b = setups
    a.start_daemon()
    b_pid = b.start_daemon()
    asyncio.run(_define_x(a, workspace(tmp_path / "ws-a")))
    b_sid = asyncio.run(_define_x(b, workspace(tmp_path / "ws-b")))
    theirs = _session_container(b, b_sid)

    shutdown = a.cli("shutdown", "--force")
    assert shutdown.returncode == 0, shutdown.stderr
    assert a.containers() == []  # everything of a's is gone, its daemon too
    assert not daemon_pids(a.env["XDG_RUNTIME_DIR"])
    # b's daemon, container and kernel: untouched.
    assert daemon_pids(b.env["XDG_RUNTIME_DIR"]) == [b_pid]
    assert _running(theirs)
    assert asyncio.run(_print_x(b, b_sid)) == "x plus one is 42"
    assert _session_container(b, b_sid) == theirs


def test_a_crashed_setups_container_survives_another_daemon_and_its_doctor(
    tmp_path: Path, model: FakeModelServer
) -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)
    # One runtime dir (one socket path), two state dirs: only one daemon at a time.
    shared = tmp_path / "run"
    a, b = _setup(tmp_path / "a", model, shared), _setup(tmp_path / "b", model, shared)
    assert a.socket == b.socket
    try:
        b_pid = b.start_daemon()
        b_sid = asyncio.run(_define_x(b, workspace(tmp_path / "ws-b")))
        theirs = _session_container(b, b_sid)
        kill_9(b_pid, STOP_TIMEOUT_S)  # its container runs on, recorded for b's next daemon

        # a's doctor sees b's container as another setup's orphan and keeps it.
        doctor = a.cli("doctor", "--fix")
        assert _running(theirs), doctor.stdout
        assert "of other prime-agent setups" in doctor.stdout, doctor.stdout
        assert theirs[:12] in doctor.stdout and str(b.paths.data_dir) in doctor.stdout

        # a's daemon starts on the same socket path: its start-up sweep is not for b's.
        a.start_daemon()
        stopped = a.cli("daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert _running(theirs)

        # b's own daemon adopts it: the same kernel, x intact.
        b.start_daemon()
        assert asyncio.run(_print_x(b, b_sid)) == "x plus one is 42"
        assert _session_container(b, b_sid) == theirs
    finally:
        _cleanup(a, b)


def test_doctor_removes_another_instances_orphan_only_when_its_state_dir_is_gone(
    setups: tuple[Setup, Setup], tmp_path: Path
) -> None:
    from orchestrator.instance import instance_id
    from orchestrator.sandbox.docker import (
        LABEL_HOST_PID,
        LABEL_INSTANCE,
        LABEL_OWNER,
        LABEL_SESSION,
        LABEL_STATE_DIR,
        list_owned,
    )
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client

    a, b = setups
    b_instance = instance_id(b.paths)

    def orphan(state_dir: Path, instance: str) -> str:
        container = docker_client().containers.create(
            SESSION_IMAGE,
            ["true"],
            labels={
                LABEL_OWNER: str(os.getuid()),
                LABEL_SESSION: "s-orphan000000",
                LABEL_INSTANCE: instance,
                LABEL_HOST_PID: str(DEAD_PID),
                LABEL_STATE_DIR: str(state_dir),
            },
        )
        return str(container.id)

    kept = orphan(b.paths.data_dir, b_instance)  # b's: its state dir holds that instance
    gone = orphan(tmp_path / "vanished" / APP_DIR_NAME, "0123456789abcdef")
    ids = {kept, gone}
    try:
        fixed = a.cli("doctor", "--fix")
        left = {c.id for c in list_owned() if c.id in ids}
        assert left == {kept}, fixed.stdout
        assert kept[:12] in fixed.stdout and "kept for their own daemon" in fixed.stdout

        everything = a.cli("doctor", "--fix", "--all-instances")
        assert not [c for c in list_owned() if c.id in ids], everything.stdout
    finally:
        from orchestrator.sandbox.docker import remove_containers

        remove_containers(sorted(ids))
