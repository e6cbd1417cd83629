"""Sandboxes outlive a daemon crash and the restarted daemon adopts them (docs/spec.md §4, R2, R8).

Real processes all the way: the daemon (``prime-agent daemon start``), nats-server, kernel
gateways and kernels (or containers), the DuckDB file and the scripted model over HTTP.

- local: a session defines ``x = 41``, then runs a long cell; ``kill -9`` of the daemon leaves
  the gateway and kernel running; the restarted daemon adopts them (the long cell is
  interrupted and has its ``interrupted`` result, the turn its ``aborted`` event), and the next
  turn's ``print(x + 1)`` prints 42 in the same kernel process; ``daemon stop`` then leaves no
  process behind.
- docker: the same with the session's container, and ``prime-agent shutdown`` leaves no
  container with this daemon's label.
- a recorded sandbox of a session deleted meanwhile is removed at start, as are the warm
  pool's idle sandboxes; a container with this daemon's label that no row knows is removed,
  one of another daemon is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.server import default_socket_path
from orchestrator.paths import Paths
from orchestrator.sandbox.local import OWNER_ENV
from orchestrator.sessions.adoption import RESUME_TEXT
from orchestrator.sessions.manager import INTERRUPTED_CELL_TEXT
from orchestrator.sessions.sandbox_records import ADOPTED_NOTICE
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, kill_9, need, pids_alive, wait_until, write_config
from tests.integration.test_daemon import _daemon_pids, daemon_cli
from tests.integration.test_sandbox_conformance import docker_ready, workspace

pytestmark = pytest.mark.timeout(600)

# Bounds, not expectations: a loaded machine starts a gateway (or a container) in seconds.
POLL_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
NAP_S = 600  # the long cell outlasts the test: only the crash (and the adoption) end it
NAP_MARKER = "napping"  # the long cell creates this file in the workspace before it sleeps
SESSION_NAME = "define x"  # the default name: the task's first line
# The dead orchestrator of a labelled container: above pid_max's default, never a live process.
DEAD_PID = 2**22 + 4242

SCRIPT = f"""
repeat forever:
    when "orchestrator restarted":
        text: resumed after the restart
    when "pids":
        text: x is defined
    when re "^42 ":
        text: x plus one is 42
    when "NameError":
        text: x was lost
    when "define x":
        code:
            import os
            x = 41
            family = await agent_message.list_agents()
            print("pids", os.getpid(), os.getppid(), family.self.name)
    when "take a nap":
        code: open({NAP_MARKER!r}, "w").close(); import time; time.sleep({NAP_S})
    when "print x":
        code:
            import os
            family = await agent_message.list_agents()
            print(x + 1, os.getpid(), family.self.name)
"""


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    srv = FakeModelServer(SCRIPT).start()
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
    )
    yield srv
    srv.close()


@pytest.fixture
def daemons(model: FakeModelServer) -> Iterator[None]:
    """Whatever a test did, no daemon of this test's runtime dir (or its gateways) is left."""
    yield
    if _daemon_pids():
        daemon_cli("stop", "--force")
    for pid in _daemon_pids():
        os.kill(pid, signal.SIGKILL)
    for pid in _our_gateways():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _start_daemon() -> int:
    started = daemon_cli("start")
    assert started.returncode == 0, started.stderr
    (pid,) = _daemon_pids()
    return pid


def _kill_daemon(pid: int) -> None:
    kill_9(pid, STOP_TIMEOUT_S)


def _our_gateways() -> list[int]:
    """Gateway processes marked as this test's daemon's (its socket in their environment)."""
    marker = f"{OWNER_ENV}={default_socket_path()}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return pids_alive(found)


async def _poll(what: str, probe: Any) -> Any:
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            while not (found := await probe()):
                await asyncio.sleep(POLL_INTERVAL_S)
            return found
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _events(client: ControlClient, sid: str) -> list[dict[str, Any]]:
    replay = await client.call("attach", session=sid, cursor=0)
    assert not replay["snapshot"]
    return list(replay["events"])


async def _said(client: ControlClient, sid: str, text: str) -> list[dict[str, Any]]:
    """Events once the session said ``text`` and is idle again."""

    async def done() -> list[dict[str, Any]] | None:
        events = await _events(client, sid)
        said = any(
            e["type"] == "assistant_message" and e["payload"]["text"] == text for e in events
        )
        status = (await client.call("get_session", session=sid))["session"]["status"]
        return events if said and status == "idle" else None

    found: list[dict[str, Any]] = await _poll(f"{text!r} from {sid}", done)
    return found


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["type"] == "tool_result"]


async def _define_x_and_nap(cwd: Path, backend: str) -> tuple[str, int, int]:
    """A session with ``x = 41`` whose next cell is sleeping; returns (session, kernel pid,
    gateway pid) as the kernel sees them (its own pid namespace on docker)."""
    client = await ControlClient.connect()
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="define x", model="openai/fake", backend=backend
        )
        sid = str(created["session"])
        assert created["backend"] == backend
        events = await _said(client, sid, "x is defined")
        (defined,) = _results(events)
        match = re.search(r"pids (\d+) (\d+) " + SESSION_NAME, defined["text"])
        assert match is not None, defined
        marker = cwd / NAP_MARKER
        assert (await client.call("prompt", session=sid, text="take a nap"))["status"] == (
            "delivered"
        )
        assert await asyncio.to_thread(wait_until, marker.exists, timeout=POLL_TIMEOUT_S)
        return sid, int(match.group(1)), int(match.group(2))
    finally:
        await client.close()


async def _print_x(sid: str, model: FakeModelServer) -> tuple[list[dict[str, Any]], str]:
    """After the restart: the next turn prints x + 1; returns the events and that output."""
    client = await ControlClient.connect()
    try:
        # The turn the crash interrupted continues by itself (a harness message), once.
        await _said(client, sid, "resumed after the restart")
        resumed = [
            r for r in model.requests if str(r["messages"][-1].get("content")) == RESUME_TEXT
        ]
        assert len(resumed) == 1
        asked = len(model.requests)
        assert (await client.call("prompt", session=sid, text="print x"))["status"] == "delivered"
        events = await _said(client, sid, "x plus one is 42")
    finally:
        await client.close()
    request = [str(m.get("content")) for m in model.requests[asked]["messages"]]
    assert request[-1].endswith("print x")
    assert ADOPTED_NOTICE in request  # the model is told its namespace is intact
    assert INTERRUPTED_CELL_TEXT in request  # and that the long cell's outcome is unknown
    return events, str(_results(events)[-1]["text"])


def _check_history(events: list[dict[str, Any]]) -> None:
    results = _results(events)
    # x = 41, the nap (interrupted by the crash: explicit, never re-run), print(x + 1).
    assert [r["status"] for r in results] == ["ok", "interrupted", "ok"], results
    assert results[1]["text"] == INTERRUPTED_CELL_TEXT
    assert not results[2].get("kernel_restarted")
    assert "aborted" in [e["type"] for e in events]  # the crashed turn is marked


# ------------------------------------------------------------------------------ local


def test_local_sandbox_survives_a_daemon_crash_and_is_adopted(
    daemons: None, model: FakeModelServer, tmp_path: Path
) -> None:
    pid = _start_daemon()
    sid, kernel, gateway = asyncio.run(_define_x_and_nap(tmp_path, "local"))
    before = _our_gateways()
    assert gateway in before  # (the warm pool's gateway is there too)

    _kill_daemon(pid)
    # Started without die_with_parent: the gateway and its kernel survive the daemon.
    assert pids_alive([gateway, kernel]) == [gateway, kernel]

    pid = _start_daemon()
    # The session's sandbox was adopted; the pool's idle one was removed before `ready`.
    assert gateway in _our_gateways() and not pids_alive([p for p in before if p != gateway])

    events, output = asyncio.run(_print_x(sid, model))
    # The same kernel process, x intact, and its host requests (NATS) work.
    assert output.split() == ["42", str(kernel), *SESSION_NAME.split()]
    _check_history(events)

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_until(
        lambda: not pids_alive([pid, gateway, kernel]) and not _our_gateways(),
        timeout=STOP_TIMEOUT_S,
    ), (pids_alive([pid, gateway, kernel]), _our_gateways())


IDLE_UNLOAD_S = 2.0  # the restarted daemon's idle time: an adopted sandbox waits this long


async def _define_x_while_attached(cwd: Path, pid: int) -> tuple[str, int, int]:
    """``x = 41`` in an idle session that a client keeps attached (so the idle unloader leaves
    it loaded) until the daemon is killed; returns (session, kernel pid, gateway pid)."""
    client = await ControlClient.connect()
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="define x", model="openai/fake", backend="local"
        )
        sid = str(created["session"])
        await client.call("attach", session=sid, cursor=0)
        (defined,) = _results(await _said(client, sid, "x is defined"))
        match = re.search(r"pids (\d+) (\d+) " + SESSION_NAME, defined["text"])
        assert match is not None, defined
        await asyncio.to_thread(_kill_daemon, pid)
        return sid, int(match.group(1)), int(match.group(2))
    finally:
        await client.close()


def test_an_adopted_sandbox_nobody_wakes_is_unloaded_like_an_idle_session(
    daemons: None, model: FakeModelServer, tmp_path: Path
) -> None:
    write_config(
        f"idle_unload_seconds = {IDLE_UNLOAD_S}\nretry_base_delay_s = 0.01\n"
        f'model_max_retries = 1\n[models."openai/fake"]\napi_base = "{model.url}"\n'
    )
    pid = _start_daemon()
    sid, kernel, gateway = asyncio.run(_define_x_while_attached(tmp_path, pid))
    assert pids_alive([gateway, kernel]) == [gateway, kernel]

    _start_daemon()  # adopts the sandbox; no turn was interrupted, so nothing loads the session

    async def wake() -> tuple[str, list[str]]:
        client = await ControlClient.connect()
        try:
            # Quiet for the idle time, it is loaded, snapshotted and unloaded: the sandbox
            # goes (the unload stops it before the session leaves memory).
            async def unloaded() -> bool:
                row = (await client.call("get_session", session=sid))["session"]
                gone = not pids_alive([gateway, kernel])
                return gone and row["status"] == "inactive" and not row["live"]

            await _poll("the adopted session's unload", unloaded)
            asked = len(model.requests)
            await client.call("prompt", session=sid, text="print x")
            events = await _said(client, sid, "x plus one is 42")
        finally:
            await client.close()
        request = [str(m.get("content")) for m in model.requests[asked]["messages"]]
        return str(_results(events)[-1]["text"]), request

    output, request = asyncio.run(wake())
    # A new kernel, x revived from the snapshot taken before the unload, and the model is told.
    printed, new_kernel, name = output.split(maxsplit=2)
    assert (printed, name) == ("42", SESSION_NAME) and int(new_kernel) != kernel
    assert any("revived from its last snapshot" in text and "x" in text for text in request)


def test_recorded_sandbox_of_a_deleted_session_is_removed_at_start(
    daemons: None, model: FakeModelServer, tmp_path: Path
) -> None:
    pid = _start_daemon()
    sid, kernel, gateway = asyncio.run(_define_x_and_nap(tmp_path, "local"))
    _kill_daemon(pid)
    assert pids_alive([gateway, kernel]) == [gateway, kernel]

    async def delete() -> None:  # as if deleted by hand while no daemon ran
        async with await Store.open(Paths.from_env().database_file) as store:
            assert {r.session_id for r in await store.list_sandboxes()} >= {sid}
            await store.update_session(sid, status="deleted")

    asyncio.run(delete())
    pid = _start_daemon()
    # Removed before the daemon said it was ready: no gateway of the old daemon is left.
    assert not pids_alive([gateway, kernel])
    assert all(p not in _our_gateways() for p in (gateway, kernel))
    assert daemon_cli("stop").returncode == 0
    assert wait_until(lambda: not _our_gateways(), timeout=STOP_TIMEOUT_S), _our_gateways()

    async def rows() -> list[str]:
        async with await Store.open(Paths.from_env().database_file) as store:
            return [r.session_id for r in await store.list_sandboxes()]

    assert asyncio.run(rows()) == []  # every row goes with its sandbox


# ------------------------------------------------------------------------------ docker


@pytest.fixture
def docker_image() -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)


def _our_containers() -> list[Any]:
    from orchestrator.sandbox.docker import list_owned

    socket = str(default_socket_path())
    return [c for c in list_owned() if c.daemon == socket]


@pytest.fixture
def containers(docker_image: None) -> Iterator[None]:
    yield
    from orchestrator.sandbox.docker import remove_containers

    remove_containers([c.id for c in _our_containers()])


def test_docker_sandbox_survives_a_daemon_crash_and_is_adopted(
    daemons: None, containers: None, model: FakeModelServer, tmp_path: Path
) -> None:
    cwd = workspace(tmp_path / "ws")
    pid = _start_daemon()
    sid, kernel, _gateway = asyncio.run(_define_x_and_nap(cwd, "docker"))
    (session_container,) = [c for c in _our_containers() if c.session_id == sid]

    _kill_daemon(pid)
    assert session_container.id in [c.id for c in _our_containers()]

    _start_daemon()
    events, output = asyncio.run(_print_x(sid, model))
    # The same kernel, x intact; its NATS relay was served again.
    assert output.split() == ["42", str(kernel), *SESSION_NAME.split()]
    _check_history(events)
    # Adopted, not replaced: the same container; the pool's idle ones are gone.
    assert [c.id for c in _our_containers()] == [session_container.id]

    shutdown = cli(["shutdown"])
    assert shutdown.returncode == 0, shutdown.stderr
    assert not _daemon_pids()
    assert _our_containers() == []


def test_unknown_container_with_our_label_is_removed_at_start(
    daemons: None, containers: None, model: FakeModelServer
) -> None:
    from orchestrator.instance import instance_id
    from orchestrator.sandbox.docker import (
        LABEL_DAEMON,
        LABEL_HOST_PID,
        LABEL_INSTANCE,
        LABEL_OWNER,
        LABEL_SESSION,
        remove_containers,
    )
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client

    client = docker_client()

    def labelled(daemon_socket: str, instance: str = instance_id()) -> str:
        container = client.containers.create(
            SESSION_IMAGE,
            ["true"],
            labels={
                LABEL_OWNER: str(os.getuid()),
                LABEL_SESSION: "s-unknown00000",
                LABEL_INSTANCE: instance,
                LABEL_HOST_PID: str(DEAD_PID),
                LABEL_DAEMON: daemon_socket,
            },
        )
        return str(container.id)

    ours = labelled(str(default_socket_path()))
    theirs = labelled(str(default_socket_path()) + ".another-daemon")
    # Same socket path, another state dir's instance (a setup sharing XDG_RUNTIME_DIR).
    other_setup = labelled(str(default_socket_path()), "0123456789abcdef")
    try:
        _start_daemon()
        # Not in this daemon's table: a daemon that died between `docker run` and recording.
        assert ours not in [c.id for c in _our_containers()]
        from orchestrator.sandbox.docker import list_owned

        assert theirs in [c.id for c in list_owned()]  # another daemon's: not ours to remove
        assert other_setup in [c.id for c in list_owned()]  # another instance's: neither
        assert daemon_cli("stop").returncode == 0
    finally:
        remove_containers([ours, theirs, other_setup])


# ------------------------------------------------------------------------------ bwrap


@pytest.fixture
def bwrap_here() -> None:
    from orchestrator.sandbox.bwrap_probe import bwrap_usable

    usable, why = bwrap_usable()
    if not usable:
        need("bwrap", why)


def _our_bwraps() -> list[int]:
    """bwrap sandboxes marked as this test's daemon's (orchestrator/sandbox/bwrap_owned.py)."""
    from orchestrator.sandbox.bwrap_owned import owned_sandboxes

    return [info.pid for info, _ in owned_sandboxes(str(default_socket_path()))]


def test_bwrap_sandbox_survives_a_daemon_crash_and_is_adopted(
    daemons: None, bwrap_here: None, model: FakeModelServer, tmp_path: Path
) -> None:
    from orchestrator.sandbox.bwrap import BwrapBackend

    cwd = workspace(tmp_path / "ws")
    try:
        pid = _start_daemon()
        sid, kernel, _gateway = asyncio.run(_define_x_and_nap(cwd, "bwrap"))
        (sandbox,) = _our_bwraps()

        _kill_daemon(pid)
        # Started without die_with_parent: the sandbox survives the daemon.
        assert _our_bwraps() == [sandbox]

        pid = _start_daemon()
        events, output = asyncio.run(_print_x(sid, model))
        # The same kernel (its pid in the sandbox's own namespace), x intact; its NATS relay
        # was served again.
        assert output.split() == ["42", str(kernel), *SESSION_NAME.split()]
        _check_history(events)
        assert _our_bwraps() == [sandbox]  # adopted, not replaced

        stop = daemon_cli("stop")
        assert stop.returncode == 0, stop.stderr
        assert wait_until(
            lambda: not pids_alive([pid, sandbox]) and not _our_bwraps(), timeout=STOP_TIMEOUT_S
        ), (pids_alive([pid, sandbox]), _our_bwraps())
    finally:  # whatever failed: no sandbox of this daemon is left
        asyncio.run(BwrapBackend(owner=str(default_socket_path())).remove_unknown(set()))


def test_doctor_removes_the_bwrap_sandbox_of_a_crashed_daemon(
    daemons: None, bwrap_here: None, model: FakeModelServer, tmp_path: Path
) -> None:
    from orchestrator.sandbox.bwrap import BwrapBackend
    from orchestrator.sandbox.bwrap_owned import owned_sandboxes

    cwd = workspace(tmp_path / "ws")
    try:
        pid = _start_daemon()
        asyncio.run(_define_x_and_nap(cwd, "bwrap"))
        ((info, runtime_dir),) = owned_sandboxes(str(default_socket_path()))
        doctor = cli(["doctor"])
        assert "bwrap sandboxes: owned by the running daemon" in doctor.stdout, doctor.stdout

        _kill_daemon(pid)
        doctor = cli(["doctor"])
        assert doctor.returncode == 1, doctor.stdout
        assert f"orphaned sandbox pid {info.pid}" in doctor.stdout, doctor.stdout
        fixed = cli(["doctor", "--fix"])
        assert fixed.returncode == 0, fixed.stdout
        assert wait_until(lambda: not _our_bwraps(), timeout=STOP_TIMEOUT_S)
        assert not Path(runtime_dir).exists()  # nor what it kept on the host
    finally:  # whatever failed: no sandbox of this daemon is left
        asyncio.run(BwrapBackend(owner=str(default_socket_path())).remove_unknown(set()))
