"""The in-kernel runtime against a real nats-server and a real kernel (no mocks of either).

A private nats-server runs with an admin user and per-session users whose permissions are
exactly what the orchestrator grants (publish ``pa.host.<sid>``, subscribe ``_INBOX.<sid>.>``).
A tiny fake host (an admin nats-py client in this process) answers canned replies on
``pa.host.<sid>`` and records every request. One kernel (local backend, no pool) is started
with the session's ``PRIME_AGENT_*`` env, and the tests run cells in it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from orchestrator.runtime import wire
from orchestrator.runtime.errors import HostTimeout, HostUnavailable, NotFound
from orchestrator.runtime.host import HostClient
from orchestrator.sandbox.base import CellResult, SandboxSpec
from orchestrator.sandbox.local import LocalBackend, LocalSandbox

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="local sandbox is Linux-only"),
]

NATS_SERVER = Path(sys.executable).parent / "nats-server"
SID = "s-rt1"  # the kernel's session
SID_ALONE = "s-rt2"  # a session nobody answers for
ADMIN = ("admin", "admin-pw")
PASSWORDS = {SID: "pw-rt1", SID_ALONE: "pw-rt2"}
READY_DEADLINE_S = 10.0
RETRY_S = 0.02
STOP_GRACE_S = 5.0
REQUEST_WAIT_S = 10.0
CELL_TIMEOUT_S = 30.0
KERNEL_REQUEST_TIMEOUT_S = 5  # PRIME_AGENT_REQUEST_TIMEOUT_S inside the kernel

CHILD = {"rlm_child_id": "sub-0001", "session_id": "s-child-w1", "model": "fake/model"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _session_user(sid: str) -> str:
    return (
        f"{{ user: {sid}, password: {PASSWORDS[sid]}, permissions: {{ "
        f'publish: {{ allow: ["{wire.host_subject(sid)}"] }}, '
        f'subscribe: {{ allow: ["{wire.inbox_prefix(sid)}.>"] }} }} }}'
    )


def session_env(url: str, sid: str, **extra: str) -> dict[str, str]:
    return {
        wire.ENV_NATS_URL: url,
        wire.ENV_NATS_USER: sid,
        wire.ENV_NATS_PASSWORD: PASSWORDS[sid],
        wire.ENV_SESSION_ID: sid,
        wire.ENV_HOST_SUBJECT: wire.host_subject(sid),
        wire.ENV_INBOX_PREFIX: wire.inbox_prefix(sid),
        **extra,
    }


@dataclass
class Bus:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class FakeHost:
    """Answers host requests with canned replies; records what arrives."""

    admin: NatsClient
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def handle(self, msg: Msg) -> None:
        body = json.loads(msg.data)
        self.requests.append((msg.subject, body))
        async with self.arrived:
            self.arrived.notify_all()
        reply = self.answer(body["type"], body.get("args", {}))
        if reply is not None and msg.reply:
            await self.admin.publish(msg.reply, json.dumps(reply).encode())

    def answer(self, kind: str, args: dict[str, Any]) -> dict[str, Any] | None:
        def ok(result: object) -> dict[str, Any]:
            return {"ok": True, "result": result}

        def error(code: str, message: str, retry_after: float | None = None) -> dict[str, Any]:
            return {
                "ok": False,
                "error": {"code": code, "message": message, "retry_after": retry_after},
            }

        child = {**CHILD, "name": args.get("name", "subagent-x"), "status": "running"}
        if kind == "rlm.run":
            return ok({key: child[key] for key in ("rlm_child_id", "name", "session_id", "model")})
        if kind == "rlm.list_subagents":
            return ok({"subagents": [child]})
        if kind == "rlm.delete_subagent":
            if args.get("target") == "ghost":
                return error("not_found", "no child named 'ghost'")
            return ok({**child, "status": "deleted"})
        if kind == "agent_message.send":
            if args.get("receiver_name") == "busy":
                return error("rate_limited", "3 messages/s to busy", 0.5)
            target = args.get("receiver_name") or "root"
            return ok({"id": "m-1", "status": "delivered", "target": target, "at": "t0"})
        if kind == "agent_message.list_agents":
            me = {"name": "w1", "session_id": SID, "status": "running"}
            return ok({"self": me, "parent": None, "siblings": [], "children": []})
        return None  # anything else: no answer (the client times out)

    def count(self, kind: str | None = None) -> int:
        return sum(1 for _, body in self.requests if kind is None or body["type"] == kind)

    async def wait_for(self, kind: str, count: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(
                self.arrived.wait_for(lambda: self.count(kind) >= count), REQUEST_WAIT_S
            )


async def _connect_with_retries(url: str, process: subprocess.Popen[bytes]) -> NatsClient:
    """Readiness: connect as admin, retrying until the deadline (or the server died)."""

    async def quiet(exc: Exception) -> None:  # refused attempts are expected here
        pass

    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        try:
            return await nats.connect(
                url,
                user=ADMIN[0],
                password=ADMIN[1],
                allow_reconnect=False,
                connect_timeout=1,
                error_cb=quiet,
            )
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(RETRY_S)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def bus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bus]:
    tmp = tmp_path_factory.mktemp("nats")
    port = _free_port()
    config = tmp / "nats.conf"
    config.write_text(
        f"listen: 127.0.0.1:{port}\n"
        "authorization { users = [\n"
        f"  {{ user: {ADMIN[0]}, password: {ADMIN[1]} }}\n"
        f"  {_session_user(SID)}\n"
        f"  {_session_user(SID_ALONE)}\n"
        "] }\n"
    )
    log_path = tmp / "nats.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(NATS_SERVER), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    yield Bus(url=f"nats://127.0.0.1:{port}", process=process, log_path=log_path)
    process.terminate()
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def host(bus: Bus) -> AsyncIterator[FakeHost]:
    admin = await _connect_with_retries(bus.url, bus.process)
    fake = FakeHost(admin=admin)
    await admin.subscribe(wire.host_subject(SID), cb=fake.handle)
    await admin.flush()
    yield fake
    await admin.close()


@dataclass
class Kernel:
    sandbox: LocalSandbox
    preload: str  # what the first cell saw, before any host request


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def kernel(
    bus: Bus, host: FakeHost, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Kernel]:
    tmp = tmp_path_factory.mktemp("kernel")
    backend = LocalBackend(pool_size=0)
    spec = SandboxSpec(
        session_id=SID,
        cwd=tmp,
        artifacts_dir=tmp / "artifacts",
        env=session_env(
            bus.url, SID, **{wire.ENV_REQUEST_TIMEOUT_S: str(KERNEL_REQUEST_TIMEOUT_S)}
        ),
    )
    sandbox = await backend.create(spec)
    first = await sandbox.execute(
        "import sys\n('nats' in sys.modules, type(rlm).__name__)",
        timeout_s=CELL_TIMEOUT_S,
        cell_id="preload",
    )
    yield Kernel(sandbox=sandbox, preload=first.result)
    await sandbox.stop()
    await backend.close()


async def cell(kernel: Kernel, code: str) -> CellResult:
    return await kernel.sandbox.execute(code, timeout_s=CELL_TIMEOUT_S, cell_id="c")


def ok(result: CellResult) -> CellResult:
    assert result.status == "ok", (result.error, result.stdout, result.stderr)
    assert result.stderr == ""  # no warnings, no nats logging in the cell
    return result


# --- in the kernel ----------------------------------------------------------------------------


async def test_preload_is_lazy(kernel: Kernel) -> None:
    # Nothing imported nats, and rlm was still the stand-in, before the first use.
    assert kernel.preload == "(False, '_LazyHelper')"


async def test_spawn_returns_the_handle_at_admission(kernel: Kernel, host: FakeHost) -> None:
    before = len(host.requests)
    result = ok(await cell(kernel, 'h = await rlm("do x", name="w1")\nh'))
    assert result.result == (
        "RLMSpawnHandle(rlm_child_id='sub-0001', name='w1', session_id='s-child-w1', "
        "model='fake/model')"
    )
    subject, body = host.requests[before]
    assert subject == wire.host_subject(SID)
    assert body == {"v": 1, "type": "rlm.run", "args": {"prompt": "do x", "name": "w1"}}
    assert "sender" not in json.dumps(body)
    assert ok(await cell(kernel, "type(rlm).__name__, h.name")).result == "('Rlm', 'w1')"


async def test_cells_in_a_row_share_one_loop_and_one_connection(kernel: Kernel) -> None:
    ok(await cell(kernel, "import asyncio\nloop_a = asyncio.get_running_loop()"))
    first = ok(await cell(kernel, "subs = await rlm.list_subagents()\nsubs[0].status"))
    assert first.result == "'running'"
    second = ok(
        await cell(
            kernel,
            "family = await agent_message.list_agents()\n"
            "print(family.self.name)\n"
            "asyncio.get_running_loop() is loop_a",
        )
    )
    assert second.stdout == "w1\n" and second.result == "True"
    stats = ok(
        await cell(
            kernel,
            "from orchestrator.runtime.host import default_client\n"
            "(default_client().connections_opened, default_client().open_connections())",
        )
    )
    assert stats.result == "(1, 1)"


async def test_error_replies_raise_typed_exceptions(kernel: Kernel) -> None:
    result = await cell(kernel, 'await rlm.delete_subagent("ghost")')
    assert result.status == "error" and result.error is not None
    assert result.error.ename == NotFound.__name__
    assert result.error.evalue == "no child named 'ghost'"
    # The traceback is the cell's own line and the message, not the runtime's internals.
    assert "host.py" not in result.error.traceback
    assert "NotFound: no child named 'ghost'" in result.error.traceback

    caught = ok(
        await cell(
            kernel,
            "try:\n"
            '    await agent_message.send("hi", receiver_role="sibling", receiver_name="busy")\n'
            "except RuntimeError as exc:\n"
            "    print(type(exc).__name__, exc.code, exc.retry_after, exc)",
        )
    )
    assert (
        caught.stdout == "RateLimited rate_limited 0.5 3 messages/s to busy (retry after 0.5 s)\n"
    )


async def test_unknown_kwarg_is_a_type_error_and_sends_nothing(
    kernel: Kernel, host: FakeHost
) -> None:
    before = len(host.requests)
    result = await cell(kernel, 'await rlm("x", nme="w2")')
    assert result.status == "error" and result.error is not None
    assert result.error.ename == "TypeError"
    assert "allowed: name, model, thinking, budget" in result.error.evalue
    bad_role = await cell(kernel, 'await agent_message.send("hi", receiver_role="sibling")')
    assert bad_role.error is not None and bad_role.error.ename == "TypeError"
    # The next request to arrive is this one: nothing was sent for the failed calls.
    ok(await cell(kernel, 'await rlm("y", name="w3")'))
    assert len(host.requests) == before + 1
    assert host.requests[before][1]["args"] == {"prompt": "y", "name": "w3"}


async def test_background_task_and_other_loops(kernel: Kernel, host: FakeHost) -> None:
    sends = host.count("agent_message.send")
    # The cell ends at once; the task runs on the kernel's loop while the kernel is idle.
    ok(await cell(kernel, 't = asyncio.create_task(agent_message.send("hello from a task"))'))
    await host.wait_for("agent_message.send", sends + 1)
    receipt = ok(await cell(kernel, "await asyncio.wait_for(t, 5)"))
    assert receipt.result == "MessageReceipt(id='m-1', status='delivered', target='root', at='t0')"
    assert host.requests[-1][1]["args"] == {
        "message": "hello from a task",
        "receiver_role": "parent",
        "mode": "steer",
    }
    # A thread with its own loop gets its own connection, dropped when that loop closes.
    threaded = ok(
        await cell(
            kernel,
            "import threading\n"
            "out = {}\n"
            "def work():\n"
            "    out['r'] = asyncio.run(rlm.list_subagents())\n"
            "th = threading.Thread(target=work)\n"
            "th.start(); th.join(10)\n"
            "(out['r'][0].name, default_client().connections_opened, "
            "default_client().open_connections())",
        )
    )
    assert threaded.result == "('subagent-x', 2, 1)"
    # The abandoned connection of the closed loop leaves no noise behind.
    ok(await cell(kernel, "import gc\ngc.collect()\nawait asyncio.sleep(0.05)"))


async def test_no_answer_is_host_timeout(kernel: Kernel) -> None:
    result = await cell(kernel, 'await rlm.host_request("test.silent", {}, timeout=0.3)')
    assert result.error is not None and result.error.ename == HostTimeout.__name__
    assert result.error.evalue == "the orchestrator did not answer test.silent within 0.3 s"
    caught = ok(
        await cell(
            kernel,
            "try:\n"
            '    await rlm.host_request("test.silent", {}, timeout=0.2)\n'
            "except TimeoutError:\n"
            "    print('caught as TimeoutError')",
        )
    )
    assert caught.stdout == "caught as TimeoutError\n"


async def test_without_session_env_is_host_unavailable(kernel: Kernel) -> None:
    result = await cell(
        kernel,
        "import os\n"
        "saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith('PRIME_AGENT_')}\n"
        "try:\n"
        "    await rlm.list_subagents()\n"
        "finally:\n"
        "    os.environ.update(saved)",
    )
    assert result.error is not None and result.error.ename == HostUnavailable.__name__
    assert "not connected to an orchestrator" in result.error.evalue
    ok(await cell(kernel, "await rlm.list_subagents()"))  # and back again


# --- the client without a kernel --------------------------------------------------------------


async def _fails(call: Callable[[], Awaitable[Any]], exc: type[Exception], match: str) -> float:
    start = time.monotonic()
    with pytest.raises(exc, match=match):
        await call()
    return time.monotonic() - start


async def test_nobody_listening_is_host_unavailable(bus: Bus) -> None:
    client = HostClient(session_env(bus.url, SID_ALONE))
    # NATS answers "no responders" (the message says so), never the request's timeout: how
    # fast that is belongs to bench/, not to this test.
    await _fails(
        lambda: client.request("rlm.list_subagents", {}), HostUnavailable, "no orchestrator"
    )
    await client.close()


async def test_denied_subject_is_reported_not_just_timed_out(bus: Bus, host: FakeHost) -> None:
    # R17: a session's credentials cannot publish on another session's host subject.
    env = session_env(bus.url, SID_ALONE, **{wire.ENV_HOST_SUBJECT: wire.host_subject(SID)})
    client = HostClient(env)
    before = len(host.requests)
    await _fails(
        lambda: client.request("rlm.run", {"prompt": "spoof"}, timeout=0.5),
        HostUnavailable,
        "permissions violation",
    )
    assert len(host.requests) == before
    await client.close()


async def test_bad_credentials_and_no_server_fail_fast(bus: Bus) -> None:
    wrong = HostClient({**session_env(bus.url, SID), wire.ENV_NATS_PASSWORD: "wrong"})
    took = await _fails(
        lambda: wrong.request("rlm.list_subagents", {}),
        HostUnavailable,
        "refused this kernel's credentials",
    )
    assert took < 5.0
    nowhere = HostClient(session_env(f"nats://127.0.0.1:{_free_port()}", SID))
    took = await _fails(
        lambda: nowhere.request("rlm.list_subagents", {}), HostUnavailable, "cannot reach"
    )
    assert took < 5.0


async def test_each_loop_gets_its_own_connection(bus: Bus, host: FakeHost) -> None:
    client = HostClient(session_env(bus.url, SID))
    assert (await client.request("rlm.list_subagents", {}))["subagents"][0]["name"]

    def in_thread() -> Any:
        return asyncio.run(client.request("rlm.list_subagents", {}))

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(in_thread()))
    thread.start()
    await asyncio.to_thread(thread.join, REQUEST_WAIT_S)
    assert results and results[0]["subagents"]
    assert client.connections_opened == 2
    assert client.open_connections() == 1  # the thread's loop closed; its link was dropped
    await client.close()
    assert client.open_connections() == 0
