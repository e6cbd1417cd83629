"""The daemon as a user runs it: real processes (daemon, nats-server, kernel gateway, kernel),
a real DuckDB file, the control socket, and the scripted model over HTTP.

One session's life: ``daemon start`` → create with a task → attach and watch it finish → a
client attaching later replays what it missed → clients leave, the session stays → abort a slow
turn, prompt again → ``daemon stop`` leaves no process and no socket behind (R8).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.errors import ApiCommandError
from orchestrator.api.framing import MAX_LINE_BYTES
from orchestrator.api.messages import Event
from orchestrator.api.protocol import Attach
from orchestrator.api.server import ClientInfo, default_socket_path
from orchestrator.daemon.handler import ATTACH_REPLAY_MAX_EVENTS, DaemonControl, DaemonHandler
from orchestrator.ids import new_session_id
from orchestrator.paths import Paths
from orchestrator.sessions.manager import Orchestrator
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import NoticePayload
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, descendant_pids, pids_alive, wait_until, write_config

# Bounds, not expectations: a loaded CI machine starts a kernel gateway in several seconds.
TURN_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 120.0
# The scripted `slow` step outlasts the test: only an abort ends that turn.
SLOW_STEP_S = 60
SLOW_REQUEST_NO = 3  # the script's third model call is the slow one
POOL_PROCESSES = 2  # a ready warm-pool sandbox: gateway + kernel

SCRIPT = f"""
text: Let me compute.
code: print(6 * 7)
usage in=120 out=12
---
when "42":
    text: The answer is 42.
    usage in=150 out=6
---
slow {SLOW_STEP_S}
---
text: Second answer.
"""


def daemon_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``prime-agent daemon ARGS`` as a user runs it."""
    return cli(["daemon", *args], timeout=CLI_TIMEOUT_S)


def _daemon_pids() -> list[int]:
    """Daemon processes serving THIS test's runtime dir (other tests may run their own)."""
    ours = os.environ["XDG_RUNTIME_DIR"].encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.daemon" in argv and b"XDG_RUNTIME_DIR=" + ours in env:
            found.append(int(entry))
    return pids_alive(found)


@pytest.fixture
def model() -> Any:
    srv = FakeModelServer(SCRIPT).start()
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
    )
    yield srv
    srv.close()


@pytest.fixture
def daemon(model: FakeModelServer) -> Any:
    proc = daemon_cli("start")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("daemon started"), proc.stdout
    pids = _daemon_pids()
    assert len(pids) == 1
    yield pids[0]
    # Whatever the test did, leave nothing behind for the next one.
    if _daemon_pids():
        daemon_cli("stop", "--force")
    for pid in _daemon_pids():  # only daemons of this test's private runtime dir
        os.kill(pid, signal.SIGKILL)


async def _until(client: ControlClient, events: dict[int, dict[str, Any]], done: Any) -> None:
    """Collect pushed events (deduplicated by cursor) until ``done(events)``."""
    async with asyncio.timeout(TURN_TIMEOUT_S):
        if done(events):
            return
        async for message in client.events():
            if isinstance(message, Event):
                events.setdefault(message.cursor, message.event)
            if done(events):
                return
    raise AssertionError(f"the connection ended; events so far: {_types(events)}")


def _types(events: dict[int, dict[str, Any]]) -> list[str]:
    return [events[k]["type"] for k in sorted(events)]


def _said(text: str) -> Any:
    """The turn's reply with ``text`` has arrived, and so has its ``turn_end`` (recorded after
    the reply's usage row: the turn's last event)."""

    def done(evs: dict[int, dict[str, Any]]) -> bool:
        said = [
            k
            for k, e in evs.items()
            if e["type"] == "assistant_message" and text in e["payload"]["text"]
        ]
        return bool(said) and any(e["type"] == "turn_end" for k, e in evs.items() if k > said[0])

    return done


async def _status(client: ControlClient, sid: str, want: str) -> None:
    async with asyncio.timeout(TURN_TIMEOUT_S):
        while (await client.call("get_session", session=sid))["session"]["status"] != want:
            await asyncio.sleep(0.05)


async def _conversation(tmp_path: Path, model: FakeModelServer) -> str:
    first = await ControlClient.connect()
    created = await first.call(
        "create_session", cwd=str(tmp_path), task="what is 6*7?", model="openai/fake"
    )
    sid = created["session"]
    assert created["prompt"] == "delivered"
    attached = await first.call("attach", session=sid, cursor=0)
    seen = {e["seq"]: e for e in attached["events"]}
    await _until(first, seen, _said("The answer is 42."))
    await _status(first, sid, "idle")
    assert _types(seen) == [
        "user_message",
        "assistant_message",
        "usage",
        "tool_result",
        "assistant_message",
        "usage",
        "turn_end",
    ]
    assert sorted(seen) == list(range(1, len(seen) + 1))  # every cursor, in order, no gap

    # A client that was not there replays the whole history from the store.
    second = await ControlClient.connect()
    replay = await second.call("attach", session=sid, cursor=0)
    assert not replay["snapshot"]
    assert [e["seq"] for e in replay["events"]] == sorted(seen)
    assert [e["payload"] for e in replay["events"]] == [seen[k]["payload"] for k in sorted(seen)]
    assert replay["cursor"] == max(seen)

    # Typed errors for what cannot be done; the connection stays usable.
    for command, fields, code in [
        ("get_session", {"session": "s-nosuchsession"}, "not_found"),
        ("prompt", {"session": sid, "text": "  "}, "invalid_argument"),
        ("create_session", {"cwd": "relative/dir"}, "invalid_argument"),
        ("create_session", {"cwd": str(tmp_path), "model": "nosuchprovider/x"}, "invalid_argument"),
        ("create_session", {"cwd": str(tmp_path), "backend": "podman"}, "invalid_argument"),
        # An extra mount over a path the sandbox needs, or of a source that is not there.
        (
            "create_session",
            {"cwd": str(tmp_path), "mounts": [{"source": str(tmp_path), "target": "/etc"}]},
            "invalid_argument",
        ),
        (
            "create_session",
            {"cwd": str(tmp_path), "mounts": [{"source": str(tmp_path / "no"), "target": "/a"}]},
            "invalid_argument",
        ),
    ]:
        with pytest.raises(ApiCommandError) as failed:
            await second.call(command, **fields)
        assert failed.value.code == code, (command, failed.value)

    # A check in the quiet session's sandbox, in its workspace (a sweep's verifier).
    (tmp_path / "marker.txt").write_text("here")
    checked = await second.call(
        "run_check", session=sid, command="cat marker.txt; exit 3", timeout_s=60
    )
    assert (checked["exit_code"], checked["passed"], checked["timed_out"]) == (3, False, False)
    assert "here" in checked["output"]

    # The first client goes away: the session and the daemon stay.
    await first.close()
    listed = (await second.call("list_sessions"))["sessions"]
    row = next(r for r in listed if r["id"] == sid)
    assert row["status"] == "idle" and row["live"] and row["usage"]["own"]["calls"] == 2

    # A slow turn is aborted; the session is idle again and takes the next prompt.
    later = {e["seq"]: e for e in replay["events"]}
    assert (await second.call("prompt", session=sid, text="take your time"))["status"] == (
        "delivered"
    )
    await _status(second, sid, "running")
    with pytest.raises(ApiCommandError) as working:  # never on a workspace being changed
        await second.call("run_check", session=sid, command="true", timeout_s=60)
    assert working.value.code == "busy"
    # Abort once the slow step is being served: earlier, the next prompt would get it instead.
    async with asyncio.timeout(TURN_TIMEOUT_S):
        while len(model.requests) < SLOW_REQUEST_NO:
            await asyncio.sleep(0.05)
    with pytest.raises(ApiCommandError) as refused:  # a running turn is not killed unasked
        await second.call("shutdown", force=False)
    assert refused.value.code == "busy"
    aborted = await second.call("abort", session=sid)
    assert aborted["aborted"] and aborted["status"] == "idle"
    await _until(second, later, lambda evs: "aborted" in _types(evs))
    assert (await second.call("prompt", session=sid, text="again"))["status"] == "delivered"
    await _until(second, later, _said("Second answer."))
    await _status(second, sid, "idle")
    await second.close()
    return str(sid)


async def _stored_status(sid: str) -> str:
    async with await Store.open(Paths.from_env().database_file, read_only=True) as store:
        rec = await store.get_session(sid)
    assert rec is not None
    return rec.status


def test_daemon_serves_sessions_that_outlive_clients(
    daemon: int, model: FakeModelServer, tmp_path: Path
) -> None:
    status = daemon_cli("status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"daemon running (pid {daemon},"), status.stdout

    again = daemon_cli("start")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"daemon already running (pid {daemon},"), again.stdout
    assert _daemon_pids() == [daemon]

    sid = asyncio.run(_conversation(tmp_path, model))
    assert sid.startswith("s-")
    assert len(model.requests) == 4

    # Everything the daemon started: nats-server, the session's gateway and kernel, spares.
    children = descendant_pids(daemon)
    assert len(children) >= 3, children
    socket_path = default_socket_path()
    assert socket_path.exists()

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout == f"daemon stopped (pid {daemon})\n"
    assert wait_until(lambda: not pids_alive([daemon, *children]), timeout=STOP_TIMEOUT_S), (
        pids_alive([daemon, *children])
    )
    assert not socket_path.exists()

    # The session's sandbox is gone and its history is on disk: inactive, not "idle".
    assert asyncio.run(_stored_status(sid)) == "inactive"

    gone = daemon_cli("status")
    assert gone.returncode == 3 and gone.stdout.startswith("daemon not running")


def _nats_pids(daemon_pid: int) -> list[int]:
    out = []
    for pid in descendant_pids(daemon_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"nats-server" in fh.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def test_restart_after_kill_replaces_the_socket_and_adopts_nats(daemon: int) -> None:
    nats = _nats_pids(daemon)
    assert len(nats) == 1

    def pool() -> list[int]:  # the warm pool's sandbox: its gateway and kernel
        return [p for p in descendant_pids(daemon) if p not in nats]

    assert wait_until(lambda: len(pool()) >= POOL_PROCESSES, timeout=STOP_TIMEOUT_S), pool()
    others = pool()
    os.kill(daemon, signal.SIGKILL)
    assert wait_until(lambda: not pids_alive([daemon]), timeout=STOP_TIMEOUT_S)
    # The daemon's sandboxes outlive it (the next daemon adopts or removes them, R2), and so
    # does NATS.
    assert pids_alive(others) == others
    # The socket file is left behind by the dead daemon, and nothing answers on it.
    assert default_socket_path().exists()
    assert daemon_cli("status").returncode == 3

    started = daemon_cli("start")
    assert started.returncode == 0, started.stderr
    (new,) = _daemon_pids()
    assert new != daemon
    # An idle pool sandbox belongs to no session: removed before the new daemon was ready.
    assert not pids_alive(others)
    # NATS outlives a daemon crash (its mailboxes hold undelivered messages) and is adopted.
    assert pids_alive(nats) == nats
    assert f"adopted the NATS server left by a previous daemon (pid {nats[0]})" in (
        Path(os.environ["XDG_RUNTIME_DIR"], "prime-agent", "daemon.log").read_text()
    )

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_until(lambda: not pids_alive([new, *nats]), timeout=STOP_TIMEOUT_S)
    assert not default_socket_path().exists()


# --------------------------------------------------------- attach replay bounds (no daemon)

BIG_EVENT_CHARS = 100_000


class _StubDaemon:
    """Just enough of ``DaemonControl`` for the handler's store-backed commands."""

    def __init__(self, store: Store, orch: Orchestrator):
        self.settings = Settings()
        self.socket_path = Path("/nonexistent.sock")
        self.started_monotonic = 0.0
        self.store = store
        self.orch = orch
        self.ready = True
        self.stopping = False

    async def wait_ready(self) -> None:
        return None


def _stub_handler(store: Store) -> tuple[DaemonHandler, Orchestrator]:
    """A handler over ``store`` with an orchestrator that starts no sandbox."""
    from orchestrator.sandbox.local import LocalBackend

    orch = Orchestrator(
        store=store, backend=LocalBackend(pool_size=0), settings=Settings(), paths=Paths.from_env()
    )
    return DaemonHandler(cast(DaemonControl, _StubDaemon(store, orch))), orch


async def _replays() -> None:
    async with await Store.open(Paths.from_env().database_file) as store:
        handler, _ = _stub_handler(store)
        client = ClientInfo(conn_id=1, pid=None, uid=None, gid=None, client_id="t")

        async def session(name: str, texts: list[str]) -> str:
            rec = SessionRecord(
                id=new_session_id(), root_id="", cwd="/", model="m", backend="local", name=name
            )
            rec = SessionRecord(**{**rec.__dict__, "root_id": rec.id})
            await store.create_session(rec)
            # Concurrent appends are group-committed: a long history is written quickly.
            await asyncio.gather(
                *(store.append(rec.id, "notice", NoticePayload(text=t)) for t in texts)
            )
            return rec.id

        def attach(sid: str, cursor: int | None) -> Any:
            return handler.handle(client, Attach(command_id="a", session=sid, cursor=cursor))

        many = ATTACH_REPLAY_MAX_EVENTS + 100
        long_sid = await session("long", ["x"] * many)
        full = await attach(long_sid, 0)
        assert full["snapshot"] and full["missed"] == many and full["cursor"] == many
        assert [e["seq"] for e in full["events"]] == list(range(101, many + 1))
        recent = await attach(long_sid, many - 10)
        assert not recent["snapshot"] and [e["seq"] for e in recent["events"]] == list(
            range(many - 9, many + 1)
        )
        assert (await attach(long_sid, many))["events"] == []

        big_sid = await session("big", ["y" * BIG_EVENT_CHARS] * 10)
        big = await attach(big_sid, None)
        assert big["snapshot"] and big["cursor"] == 10
        assert 0 < len(big["events"]) < 10 and big["events"][-1]["seq"] == 10
        assert len(json.dumps(big).encode()) < MAX_LINE_BYTES
        snap = await handler.snapshot(client, big_sid)
        assert snap is not None and snap.cursor == 10 and snap.data["events"] == big["events"]

        with pytest.raises(ApiCommandError) as by_name:  # events are pushed under the id
            await attach("big", 0)
        assert by_name.value.code == "invalid_argument"


def test_attach_replays_a_bounded_tail() -> None:
    asyncio.run(_replays())


def test_print_mode_goes_through_a_running_daemon(daemon: int, model: FakeModelServer) -> None:
    """The daemon owns the database: `-p` talks to it and behaves as in-process (issue 5)."""
    proc = cli(["-p", "what is 6*7?", "--model", "openai/fake"], timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The answer is 42.\n"
    # JSON mode through the daemon: the header, then durable events in order, to the last one.
    model.load(SCRIPT)
    proc = cli(["-p", "again", "--mode", "json", "--model", "openai/fake"], timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["type"] == "session"
    seqs = [e["seq"] for e in lines[1:]]
    assert seqs == list(range(1, len(seqs) + 1))
    assert lines[-1]["type"] == "run_end" and lines[-1]["payload"]["reason"] == "completed"
    # A bad model is still one line and exit 2, answered by the daemon.
    bad = cli(["-p", "x", "--model", "nosuch/model"], timeout=CLI_TIMEOUT_S)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
    # The released sessions are inactive: their sandboxes are gone, their history is not.
    assert daemon_cli("stop").returncode == 0
    listing = cli(["agents", "--json"])
    statuses = sorted(root["status"] for root in json.loads(listing.stdout))
    assert statuses == ["inactive", "inactive"]


async def _live_lookups() -> None:
    async with await Store.open(Paths.from_env().database_file) as store:
        handler, orch = _stub_handler(store)
        rec = SessionRecord(id=new_session_id(), root_id="", cwd="/", model="m", backend="local")
        rec = SessionRecord(**{**rec.__dict__, "root_id": rec.id})
        await store.create_session(rec)
        loaded = cast(Any, object())  # stands in for the LiveSession this daemon holds
        orch.sessions[rec.id] = loaded

        before = store.statistics().calls
        assert await handler._live(rec.id) is loaded
        assert store.statistics().calls == before  # answered from memory, no store read
        assert await handler._live(rec.id[:12]) is loaded  # a prefix still asks the store
        assert store.statistics().calls == before + 1


def test_a_loaded_sessions_exact_id_is_resolved_without_the_store() -> None:
    """Every prompt names its session; with many sessions busy, that lookup (a read, and the
    ingest of every committed row it forces) was most of a prompt's cost on the writer."""
    asyncio.run(_live_lookups())
