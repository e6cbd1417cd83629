"""The control API additions the TUI uses (docs/tui.md, docs/protocol.md), through a real
daemon: real processes (daemon, nats-server, kernel gateways, kernels, containers), the
control socket, and the scripted model over HTTP (the only fake).

- ``stream`` messages: text deltas before the durable reply, only for a client that asked;
- ``list_sessions`` rows: ``last_activity``, ``activity``, ``pending``;
- ``autonomous`` on / status / off for an existing session;
- ``sandbox_info`` and ``sandbox_control`` (stop, restart, refused during a turn) on the local
  backend, and ``sandbox_info`` of a docker session.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.errors import ApiCommandError
from orchestrator.api.messages import Event, Resync, Stream
from orchestrator.api.wire import CAP_STREAM, CLIENT_CAPABILITIES
from orchestrator.cli.usage import paged_rows
from orchestrator.sandbox.base import SANDBOX_LOG_TAIL_LINES
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, need, pids_alive, wait_until, write_config

pytestmark = pytest.mark.timeout(300)

# Bounds, not expectations: a loaded machine starts a kernel gateway in several seconds.
TURN_TIMEOUT_S = 90.0
CLI_TIMEOUT_S = 120.0
GONE_TIMEOUT_S = 30.0
SLOW_STEP_S = 60  # a scripted model call that outlasts the test: only an abort ends it
SECRET = 4242
POLL_S = 0.05
DOCKER_MEMORY_MIB = 512
MIB = 1024 * 1024
STREAMING = (*CLIENT_CAPABILITIES, CAP_STREAM)

Item = Event | Resync | Stream


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    srv = FakeModelServer().start()
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\nwarm_pool_size = 0\n"
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        f"[sandbox]\nmemory_mib = {DOCKER_MEMORY_MIB}\n"
    )
    yield srv
    srv.close()


@pytest.fixture
def daemon(model: FakeModelServer) -> Iterator[None]:
    proc = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    yield
    runtime = os.environ["XDG_RUNTIME_DIR"]
    if daemon_pids(runtime):
        cli(["daemon", "stop", "--force"], timeout=CLI_TIMEOUT_S)
    for pid in daemon_pids(runtime):
        os.kill(pid, signal.SIGKILL)


async def _until(client: ControlClient, done: Callable[[Item], bool]) -> list[Item]:
    """Everything the client receives, up to and including the first item ``done`` accepts."""
    seen: list[Item] = []
    async with asyncio.timeout(TURN_TIMEOUT_S):
        async for item in client.events():
            seen.append(item)
            if done(item):
                return seen
    raise AssertionError(f"the connection ended; got {seen}")


def _event(kind: str, text: str | None = None) -> Callable[[Item], bool]:
    """An ``event`` of type ``kind`` (whose payload text contains ``text``, when given)."""

    def done(item: Item) -> bool:
        if not isinstance(item, Event) or item.event["type"] != kind:
            return False
        return text is None or text in str(item.event["payload"].get("text", ""))

    return done


async def _turn(client: ControlClient, text: str) -> list[Item]:
    """What the client receives from the prompt ``text`` (its ``user_message``) to the end of
    that turn; earlier items are skipped."""
    prompted = _event("user_message", text)
    started = False

    def done(item: Item) -> bool:
        nonlocal started
        started = started or prompted(item)
        return started and _event("turn_end")(item)

    items = await _until(client, done)
    return items[next(i for i, item in enumerate(items) if prompted(item)) :]


async def _requested(model: FakeModelServer, count: int) -> None:
    """Until the model has received ``count`` requests (no event says a call went out)."""
    async with asyncio.timeout(TURN_TIMEOUT_S):
        while len(model.requests) < count:
            await asyncio.sleep(POLL_S)


async def _quiet(client: ControlClient, sid: str) -> None:
    """Until the session's turn and its post-turn work are over (the daemon says when)."""
    await client.call("wait_quiet", session=sid, timeout_s=TURN_TIMEOUT_S)


def _events(items: list[Item]) -> list[dict[str, Any]]:
    return [item.event for item in items if isinstance(item, Event)]


async def _session(
    client: ControlClient, cwd: Path, task: str | None = None, backend: str | None = None
) -> str:
    """A new session the client is attached to (before its first event), prompted ``task``."""
    fields: dict[str, Any] = {"cwd": str(cwd), "model": "openai/fake"}
    if backend is not None:
        fields["backend"] = backend
    created = await client.call("create_session", **fields)
    sid = str(created["session"])
    assert created["backend"] == (backend or "local")
    await client.call("attach", session=sid, cursor=0)
    if task is not None:
        await client.call("prompt", session=sid, text=task)
    return sid


def _row(listing: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(row for row in listing["sessions"] if row["id"] == sid)


# ------------------------------------------------------------------------------ stream

STREAM_SCRIPT = """
text: Let me compute that for you.
code: print(6 * 7)
---
when "42": text: The answer is forty-two, as computed.
"""


async def test_stream_capability_delivers_deltas_before_the_durable_reply(
    daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    model.load(STREAM_SCRIPT)
    async with (
        await ControlClient.connect(capabilities=STREAMING) as streaming,
        await ControlClient.connect() as plain,
    ):
        assert CAP_STREAM in streaming.capabilities and CAP_STREAM not in plain.capabilities
        sid = await _session(streaming, tmp_path)
        await plain.call("attach", session=sid, cursor=0)
        await streaming.call("prompt", session=sid, text="what is 6*7?")
        got = await _turn(streaming, "what is 6*7?")
        quiet = await _turn(plain, "what is 6*7?")

    replies = [e for e in _events(got) if e["type"] == "assistant_message"]
    assert [r["payload"]["text"] for r in replies] == [
        "Let me compute that for you.",
        "The answer is forty-two, as computed.",
    ]
    # The deltas of each reply arrive before it, and together they are its text.
    # Each is stamped with the cursor of the newest durable event before it (`after`).
    deltas: list[str] = []
    newest = 0
    for item in got:
        if isinstance(item, Stream):
            assert item.session == sid and item.event["session_id"] == sid
            assert item.after == newest
            if item.event["type"] == "text_delta":
                deltas.append(item.event["delta"])
            continue
        newest = item.cursor
        if item.event["type"] == "assistant_message":
            assert len(deltas) > 1, "a reply arrived without its deltas"
            assert "".join(deltas) == item.event["payload"]["text"]
            deltas = []
    # The cell's start is announced before its result, with the call's id.
    (call,) = replies[0]["payload"]["tool_calls"]
    starts = [
        i for i, m in enumerate(got) if isinstance(m, Stream) and m.event["type"] == "tool_start"
    ]
    results = [i for i, m in enumerate(got) if _event("tool_result")(m)]
    assert len(starts) == 1 and starts[0] < results[0]
    start = got[starts[0]]
    assert isinstance(start, Stream) and start.event["tool_call_id"] == call["id"]
    assert "6 * 7" in start.event["arguments"]
    # A client that did not ask gets the durable events and nothing else.
    assert not [m for m in quiet if isinstance(m, Stream)]
    assert _events(quiet) == _events(got)


# ------------------------------------------------------------------------------ list_sessions

LIST_SCRIPT = f"""
slow {SLOW_STEP_S}
---
text: Second answer.
"""


async def test_list_sessions_rows_carry_activity_pending_and_last_activity(
    daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    model.load(LIST_SCRIPT)
    async with await ControlClient.connect() as client:
        sid = await _session(client, tmp_path)
        row = _row(await client.call("list_sessions"), sid)
        assert (row["activity"], row["pending"], row["last_activity"]) == ("idle", 0, None)

        await client.call("prompt", session=sid, text="first")
        await _until(client, _event("user_message", "first"))  # the turn holds the loop
        # Abort once the slow step is being served: earlier, the next turn would get it.
        await _requested(model, 1)
        queued = await client.call("prompt", session=sid, text="second")
        assert queued["status"] == "queued"
        row = _row(await client.call("list_sessions"), sid)
        assert (row["status"], row["activity"], row["pending"]) == ("running", "turn", 1)

        await client.call("abort", session=sid)  # the queued prompt starts the next turn
        await _until(client, _event("assistant_message", "Second answer."))
        await _quiet(client, sid)
        newest = (await client.call("get_session", session=sid, recent=1))["events"][-1]
        copy = (await client.call("clone", session=sid))["session"]
        listing = await client.call("list_sessions")
        newest_only = await client.call("list_sessions", limit=1)
        children = await client.call("list_sessions", parent=sid)
        # Usage rows come in pages too (`prime-agent usage` asks page by page).
        whole = await client.call("get_usage", rows=True)
        first = await client.call("get_usage", rows=True, rows_limit=1)
        second = await client.call("get_usage", rows=True, rows_limit=1, rows_offset=1)
        paged = await paged_rows(client.call, None, page=1)

    ids = [r["session_id"] for r in whole["rows"]]
    assert ids == [sid, copy] and first["rows_total"] == second["rows_total"] == 2
    assert [r["session_id"] for r in first["rows"] + second["rows"]] == ids
    assert first["usage"] == [] and whole["usage"] != []  # a page carries rows only
    assert paged == whole["rows"]

    # `limit` keeps the newest matches and `total` counts them all; `parent` filters.
    assert [r["id"] for r in newest_only["sessions"]] == [copy] and newest_only["total"] == 2
    assert listing["total"] == 2 and children == {"sessions": [], "total": 0}
    row = _row(listing, sid)
    assert (row["activity"], row["pending"]) == ("idle", 0)
    assert row["last_activity"] == newest["ts"]
    inactive = _row(listing, copy)  # never loaded
    assert not inactive["live"] and (inactive["activity"], inactive["pending"]) == (None, 0)
    assert isinstance(inactive["last_activity"], str)


# ------------------------------------------------------------------------------ autonomous

AUTONOMOUS_SCRIPT = """
text: Step one.
usage in=100 out=10
---
text: Step two.
usage in=100 out=10
"""
AUTONOMOUS_TURNS = 2


async def test_autonomous_command_turns_mode_on_and_off(
    daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    model.load(AUTONOMOUS_SCRIPT)
    async with await ControlClient.connect() as client:
        sid = await _session(client, tmp_path)
        state = (await client.call("autonomous", session=sid))["autonomous"]
        assert (state["mode"], state["turns"], state["limits"]) == ("off", 0, None)

        on = await client.call(
            "autonomous", session=sid, action="on", max_turns=AUTONOMOUS_TURNS, gates=[]
        )
        assert on["session"] == sid and on["autonomous"]["mode"] == "on"
        assert on["autonomous"]["limits"]["max_turns"] == AUTONOMOUS_TURNS
        await client.call("prompt", session=sid, text="work on it")
        # One prompt, two turns: the harness continued the agent until its turn limit.
        got = await _until(client, _event("autonomous_stop"))
        state = (await client.call("autonomous", session=sid, action="status"))["autonomous"]

        for action, fields, code in [
            ("status", {"max_turns": 3}, "invalid_argument"),
            ("on", {"max_tokens": 0}, "invalid_command"),
        ]:
            with pytest.raises(ApiCommandError) as refused:
                await client.call("autonomous", session=sid, action=action, **fields)
            assert refused.value.code == code
        with pytest.raises(ApiCommandError) as missing:
            await client.call("autonomous", session="s-nosuchsession", action="on")
        assert missing.value.code == "not_found"

        again = (await client.call("autonomous", session=sid, action="on"))["autonomous"]
        off = (await client.call("autonomous", session=sid, action="off"))["autonomous"]

    replies = [e["payload"]["text"] for e in _events(got) if e["type"] == "assistant_message"]
    assert replies == ["Step one.", "Step two."]
    assert state["mode"] == "off" and state["stop_reason"] == "turn_limit"
    assert state["turns"] == AUTONOMOUS_TURNS and state["tokens"] > 0
    assert state["elapsed_s"] >= 0 and state["gates"] == []
    assert (again["mode"], again["turns"], again["stop_reason"]) == ("on", 0, None)
    assert off["mode"] == "off" and off["stop_reason"] is None
    assert off["limits"] == again["limits"]


# ------------------------------------------------------------------------------ sandboxes

SANDBOX_SCRIPT = f"""
code:
    secret_value = {SECRET}
    print("stored")
---
text: Stored.
---
code: print(secret_value + 1)
---
when "{SECRET + 1}": text: Still there.
else: text: Lost.
"""


def _gateway_pid(info: dict[str, Any]) -> int:
    name = str(info["sandbox"]["name"])
    assert name.startswith("pid "), name
    return int(name.removeprefix("pid "))


async def test_sandbox_info_stop_and_restart_on_the_local_backend(
    daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    model.load(SANDBOX_SCRIPT)
    async with await ControlClient.connect() as client:
        sid = await _session(client, tmp_path, task="keep a number")
        await _turn(client, "keep a number")
        await _quiet(client, sid)

        first = await client.call("sandbox_info", session=sid)
        second = await client.call("sandbox_info", session=sid)
        gateway = _gateway_pid(first)
        assert pids_alive([gateway]) == [gateway]
        before = (await client.call("get_session", session=sid))["session"]

        again = await client.call("sandbox_control", session=sid, action="restart")  # loaded
        after = (await client.call("get_session", session=sid))["session"]
        restarted = _gateway_pid(again)
        assert wait_until(lambda: not pids_alive([gateway]), timeout=GONE_TIMEOUT_S)

        stopped = await client.call("sandbox_control", session=sid, action="stop")
        assert wait_until(lambda: not pids_alive([restarted]), timeout=GONE_TIMEOUT_S)
        asleep = await client.call("sandbox_info", session=sid)
        row = _row(await client.call("list_sessions"), sid)

        woken = await client.call("sandbox_control", session=sid, action="restart")  # inactive
        await client.call("prompt", session=sid, text="is it still there?")
        got = await _turn(client, "is it still there?")

    sandbox = first["sandbox"]
    assert first["session"] == sid and first["status"] == "idle"
    assert sandbox["backend"] == "local" and sandbox["ref"] == str(gateway)
    assert sandbox["state"] == "running" and sandbox["image"] is None
    assert sandbox["cpu_seconds"] > 0 and sandbox["memory_bytes"] > 0
    assert sandbox["memory_limit_bytes"] is None
    assert isinstance(sandbox["log_tail"], list)
    assert 0 < len(sandbox["log_tail"]) <= SANDBOX_LOG_TAIL_LINES
    assert sandbox["started_at"] is not None and sandbox["uptime_s"] >= 0
    assert sandbox["cpu_percent"] is None  # nothing to compare with yet
    assert isinstance(second["sandbox"]["cpu_percent"], float)
    assert second["sandbox"]["cpu_percent"] >= 0

    # A restart of a loaded session replaced its sandbox and nothing else: the session stayed
    # loaded, the same in-memory session (its turn count, which a load starts at 0, is kept).
    assert again["session"] == sid and again["status"] == "idle" and not again["unloaded"]
    assert restarted != gateway and again["sandbox"]["cpu_percent"] is None  # a new meter
    assert before["live"] and after["live"] and before["status"] == after["status"] == "idle"
    assert before["turns"] == after["turns"] == 1

    assert stopped == {"session": sid, "status": "inactive", "sandbox": None, "unloaded": True}
    assert asleep == {"session": sid, "status": "inactive", "sandbox": None}
    assert row["status"] == "inactive" and not row["live"]

    assert not woken["unloaded"] and woken["status"] == "idle"
    assert _gateway_pid(woken) not in (gateway, restarted)
    # The namespace came back from its snapshot through both new sandboxes.
    results = [e for e in _events(got) if e["type"] == "tool_result"]
    assert str(SECRET + 1) in results[-1]["payload"]["text"]
    replies = [e["payload"]["text"] for e in _events(got) if e["type"] == "assistant_message"]
    assert replies[-1] == "Still there."


BUSY_SCRIPT = f"""
code: print("up")
---
slow {SLOW_STEP_S}
"""


async def test_sandbox_control_is_refused_while_a_turn_runs(
    daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    model.load(BUSY_SCRIPT)
    async with await ControlClient.connect() as client:
        sid = await _session(client, tmp_path, task="start")
        await _until(client, _event("tool_result"))  # the sandbox is up; the turn goes on
        before = await client.call("sandbox_info", session=sid)
        for action in ("stop", "restart"):
            with pytest.raises(ApiCommandError) as refused:
                await client.call("sandbox_control", session=sid, action=action)
            assert refused.value.code == "busy", action
        after = await client.call("sandbox_info", session=sid)
        gateway = _gateway_pid(before)
        alive_while_refused = pids_alive([gateway])
        await client.call("abort", session=sid)
        await _until(client, _event("aborted"))
        await _quiet(client, sid)
        stopped = await client.call("sandbox_control", session=sid, action="stop")

    assert before["status"] == "running"
    assert after["sandbox"]["ref"] == before["sandbox"]["ref"]  # untouched
    assert alive_while_refused == [gateway]
    assert stopped["status"] == "inactive" and stopped["unloaded"]
    assert wait_until(lambda: not pids_alive([gateway]), timeout=GONE_TIMEOUT_S)


# ------------------------------------------------------------------------------ docker


@pytest.fixture
def docker_image() -> None:
    from tests.integration.test_sandbox_conformance import docker_ready

    why = docker_ready()
    if why is not None:
        need("docker", why)


DOCKER_SCRIPT = """
code: print(sum(range(10)))
---
text: Done.
"""


async def test_sandbox_info_of_a_docker_session(
    docker_image: None, daemon: None, model: FakeModelServer, tmp_path: Path
) -> None:
    from orchestrator.sandbox.docker import list_owned
    from orchestrator.sandbox.images import SESSION_IMAGE
    from tests.integration.test_sandbox_conformance import workspace

    model.load(DOCKER_SCRIPT)
    cwd = workspace(tmp_path / "project")
    async with await ControlClient.connect() as client:
        sid = await _session(client, cwd, task="go", backend="docker")
        await _turn(client, "go")
        await _quiet(client, sid)
        info = await client.call("sandbox_info", session=sid)

    sandbox = info["sandbox"]
    (container,) = [c for c in list_owned() if c.session_id == sid]
    assert sandbox["backend"] == "docker" and sandbox["ref"] == container.id
    assert sandbox["name"] == container.name
    assert sandbox["image"] == SESSION_IMAGE
    assert sandbox["memory_limit_bytes"] == DOCKER_MEMORY_MIB * MIB
    assert sandbox["state"] == "running" and sandbox["started_at"] is not None
    assert sandbox["cpu_seconds"] > 0 and 0 < sandbox["memory_bytes"] < DOCKER_MEMORY_MIB * MIB
    assert isinstance(sandbox["log_tail"], list)
    assert len(sandbox["log_tail"]) <= SANDBOX_LOG_TAIL_LINES
