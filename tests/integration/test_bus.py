"""The bus against a real nats-server: server lifecycle, per-session permissions (R17), the
host-request router (R18: identity from the subject), and JetStream mailboxes across restarts.

Permission violations are asynchronous in NATS: a denied publish or subscribe does not raise,
it reaches the client's ``error_cb`` (nats-py lowercases the server's text), and a denied
request simply times out. The tests observe exactly that, from a plain nats-py client holding
nothing but a session's credentials.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from orchestrator.bus.mailbox import Mailbox
from orchestrator.bus.protocol import HostReply
from orchestrator.bus.router import HostRequestError, HostRouter
from orchestrator.bus.server import (
    AdminCredentials,
    EmbeddedNats,
    SessionCredentials,
    connect_nats,
    session_permissions,
)
from orchestrator.errors import BusError
from orchestrator.ids import new_session_id
from orchestrator.runtime.wire import (
    ENV_HOST_SUBJECT,
    ENV_INBOX_PREFIX,
    ENV_NATS_PASSWORD,
    ENV_NATS_URL,
    ENV_NATS_USER,
    ENV_SESSION_ID,
    MAX_REQUEST_BYTES,
    host_subject,
    inbox_prefix,
)
from tests.helpers import pids_alive, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

REPLY_TIMEOUT_S = 2.0  # a reply that should come
DENIED_TIMEOUT_S = 0.3  # a request that must NOT be answered: it times out after this
VIOLATION_TIMEOUT_S = 2.0  # how long to wait for the async permission error
GONE_TIMEOUT_S = 5.0
ROOT = Path(__file__).resolve().parents[2]


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest_asyncio.fixture
async def bus(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    server = EmbeddedNats(runtime_dir=tmp_path / "run", store_dir=tmp_path / "store")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def admin(bus: EmbeddedNats) -> AsyncIterator[NatsClient]:
    nc = await bus.admin.connect()
    try:
        yield nc
    finally:
        await nc.close()


class Calls:
    """Handlers for the router under test, recording what they were given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.release = asyncio.Event()
        self.blocked = 0
        self.both_blocked = asyncio.Event()

    async def echo(self, session_id: str, args: dict[str, Any]) -> Any:
        self.seen.append((session_id, args))
        return {"session_id": session_id, "args": args}

    async def fail(self, session_id: str, args: dict[str, Any]) -> Any:
        raise RuntimeError("handler bug with /secret/host/path")

    async def refuse(self, session_id: str, args: dict[str, Any]) -> Any:
        raise HostRequestError("rate_limited", "slow down", retry_after=2.5)

    async def unserializable(self, session_id: str, args: dict[str, Any]) -> Any:
        return object()

    async def block(self, session_id: str, args: dict[str, Any]) -> Any:
        self.blocked += 1
        if self.blocked >= 2:
            self.both_blocked.set()
        await self.release.wait()
        return "released"

    async def sleep(self, session_id: str, args: dict[str, Any]) -> Any:
        await asyncio.sleep(60)


SHORT_DEFAULT_S = 0.2
LONGER_THAN_DEFAULT_S = 0.6


def make_router(nc: NatsClient, calls: Calls, **kwargs: Any) -> HostRouter:
    router = HostRouter(nc, **kwargs)
    router.register("test.echo", calls.echo)
    router.register("test.fail", calls.fail)
    router.register("test.refuse", calls.refuse)
    router.register("test.unserializable", calls.unserializable)
    router.register("test.block", calls.block)
    router.register("test.sleep", calls.sleep)
    return router


@pytest_asyncio.fixture
async def calls() -> Calls:
    return Calls()


@pytest_asyncio.fixture
async def router(admin: NatsClient, calls: Calls) -> AsyncIterator[HostRouter]:
    r = make_router(admin, calls)
    await r.start()
    try:
        yield r
    finally:
        await r.close()


class SessionClient:
    """A plain nats-py client holding only a session's credentials (what a kernel has)."""

    def __init__(self, nc: NatsClient, errors: asyncio.Queue[str], creds: SessionCredentials):
        self.nc = nc
        self.errors = errors
        self.creds = creds

    async def request(self, payload: Any, *, subject: str | None = None) -> HostReply:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        msg = await self.nc.request(
            subject or self.creds.host_subject, data, timeout=REPLY_TIMEOUT_S
        )
        return HostReply.model_validate_json(msg.data)

    async def violation(self, needle: str) -> str:
        """The next permission error mentioning ``needle`` (lower case, as nats-py reports)."""
        async with asyncio.timeout(VIOLATION_TIMEOUT_S):
            while True:
                text = await self.errors.get()
                if "permissions violation" in text and needle.lower() in text:
                    return text


async def session_client(
    creds: SessionCredentials, *, use_inbox_prefix: bool = True
) -> SessionClient:
    errors: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        errors.put_nowait(str(exc).lower())

    options: dict[str, Any] = {
        "user": creds.user,
        "password": creds.password,
        "error_cb": on_error,
        "allow_reconnect": False,
    }
    if use_inbox_prefix:
        options["inbox_prefix"] = creds.inbox_prefix
    nc = await nats.connect(creds.url, **options)
    return SessionClient(nc, errors, creds)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process in process group ``pgid``? An orphan's zombie may linger
    unreaped under a container's init; it holds no resources, so it does not count."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry))
    return bool(pids_alive(members))


# --- server lifecycle ---------------------------------------------------------------------------


async def test_server_files_are_private_and_stop_leaves_nothing(tmp_path: Path) -> None:
    server = EmbeddedNats(runtime_dir=tmp_path / "run", store_dir=tmp_path / "store")
    await server.start()
    pid = server.pid
    assert pids_alive([pid]) == [pid]
    assert server.url.startswith("nats://127.0.0.1:")
    assert _mode(server.runtime_dir) == 0o700
    assert _mode(server.config_path) == 0o600
    assert _mode(server.runtime_dir / "nats-server.json") == 0o600
    assert int(server.pid_path.read_text()) == pid
    assert (tmp_path / "store" / "jetstream").is_dir()  # JetStream is on, in our store dir

    sid = new_session_id()
    await server.add_session_user(sid)
    config = json.loads(server.config_path.read_text())
    users = {u["user"]: u for u in config["authorization"]["users"]}
    # Exactly these grants and nothing else (R17).
    assert users[sid]["permissions"] == {
        "publish": {"allow": [f"pa.host.{sid}"]},
        "subscribe": {"allow": [f"_INBOX.{sid}.>"]},
    }
    assert users[sid]["permissions"] == session_permissions(sid)
    assert "http" not in config and "http_port" not in config and "monitor_port" not in config
    assert config["listen"].startswith("127.0.0.1:")

    await server.stop()
    assert wait_until(lambda: not pids_alive([pid]), timeout=GONE_TIMEOUT_S)
    assert not _group_alive(pid)
    assert not server.pid_path.exists()
    assert not list(server.runtime_dir.glob("*.ports"))
    with pytest.raises(BusError):
        _ = server.url


async def test_credentials_env_write_and_repr(bus: EmbeddedNats, tmp_path: Path) -> None:
    sid = new_session_id()
    creds = await bus.add_session_user(sid)
    assert creds.password not in repr(creds)
    env = creds.env()
    assert env == {
        ENV_NATS_URL: bus.url,
        ENV_NATS_USER: sid,
        ENV_NATS_PASSWORD: creds.password,
        ENV_SESSION_ID: sid,
        ENV_HOST_SUBJECT: host_subject(sid),
        ENV_INBOX_PREFIX: inbox_prefix(sid),
    }
    path = tmp_path / "creds.json"
    creds.write(path)
    assert _mode(path) == 0o600
    assert SessionCredentials.read(path) == creds
    # Adding again is idempotent: same password, so a running sandbox keeps working.
    assert await bus.add_session_user(sid) == creds
    with pytest.raises(ValueError):
        await bus.add_session_user("../../etc")


# --- R17: what a session's credentials allow --------------------------------------------------


async def test_r17_session_credentials_reach_only_their_own_subjects(
    bus: EmbeddedNats, router: HostRouter, calls: Calls
) -> None:
    sid_a, sid_b = new_session_id(), new_session_id()
    a = await session_client(await bus.add_session_user(sid_a))
    b_creds = await bus.add_session_user(sid_b)
    try:
        # Its own host subject: a request gets a reply, and the handler sees its session id.
        reply = await a.request({"v": 1, "type": "test.echo", "args": {"x": 1}})
        assert reply.ok and reply.result == {"session_id": sid_a, "args": {"x": 1}}

        # Another session's host subject: publish is refused (seen in error_cb only) ...
        await a.nc.publish(host_subject(sid_b), b'{"type": "test.echo"}')
        await a.nc.flush()
        await a.violation(f'publish to "pa.host.{sid_b}"')
        # ... and a request there just times out.
        with pytest.raises(nats.errors.TimeoutError):
            await a.nc.request(
                host_subject(sid_b), b'{"type":"test.echo"}', timeout=DENIED_TIMEOUT_S
            )
        await a.violation(f"pa.host.{sid_b}")

        # Subscribing to another session's inbox, to the whole pa.> tree, or to its own host
        # subject (to read requests) is refused.
        for subject in (b_creds.inbox_prefix + ".>", "pa.>", host_subject(sid_a), ">"):
            await a.nc.subscribe(subject, cb=_ignore)
            await a.nc.flush()
            await a.violation(f'subscription to "{subject.lower()}"')

        # JetStream API and mailbox subjects are not reachable either.
        for subject in ("$JS.API.STREAM.NAMES", f"pa.mbox.{sid_b}", f"pa.mbox.{sid_a}"):
            await a.nc.publish(subject, b"{}")
            await a.nc.flush()
            await a.violation(f'publish to "{subject.lower()}"')

        # Nothing denied reached the router: only the one good request arrived.
        assert [sid for sid, _ in calls.seen] == [sid_a]
        assert router.statistics().requests == 1
    finally:
        await a.nc.close()


async def test_r17_default_inbox_prefix_cannot_receive_replies(
    bus: EmbeddedNats, router: HostRouter
) -> None:
    client = await session_client(
        await bus.add_session_user(new_session_id()), use_inbox_prefix=False
    )
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await client.nc.request(
                client.creds.host_subject, b'{"type":"test.echo"}', timeout=DENIED_TIMEOUT_S
            )
        await client.violation('subscription to "_inbox.')
    finally:
        await client.nc.close()


async def _ignore(msg: Msg) -> None:
    return None


# --- R18: identity from the subject -----------------------------------------------------------


async def test_identity_comes_from_the_subject_not_the_payload(
    bus: EmbeddedNats, router: HostRouter, calls: Calls
) -> None:
    sid_a, sid_b = new_session_id(), new_session_id()
    a = await session_client(await bus.add_session_user(sid_a))
    b = await session_client(await bus.add_session_user(sid_b))
    got_by_b: list[bytes] = []

    async def on_b_inbox(msg: Msg) -> None:
        got_by_b.append(msg.data)

    await b.nc.subscribe(b.creds.inbox_prefix + ".>", cb=on_b_inbox)
    await b.nc.flush()
    try:
        # A top-level identity claim is an unknown field: refused outright.
        for claim in ({"session_id": sid_b}, {"from": sid_b}, {"sender": sid_b}):
            reply = await a.request({"v": 1, "type": "test.echo", **claim})
            assert not reply.ok and reply.error and reply.error.code == "invalid_argument"
        # Inside args it is just data: the handler still gets the subject's session id.
        reply = await a.request({"type": "test.echo", "args": {"session_id": sid_b}})
        assert reply.ok and reply.result["session_id"] == sid_a
        assert calls.seen == [(sid_a, {"session_id": sid_b})]

        # A reply subject in B's inbox is refused: the router never writes into B's inbox.
        await a.nc.publish(
            host_subject(sid_a), b'{"type":"test.echo"}', reply=b.creds.inbox_prefix + ".x.y"
        )
        reply = await a.request({"type": "test.echo"})  # processed after the forged one
        assert reply.ok
        await b.nc.flush()
        assert got_by_b == []
        assert router.statistics().dropped == 1
    finally:
        await a.nc.close()
        await b.nc.close()


# --- the router survives bad input and bad handlers --------------------------------------------


async def test_garbage_payloads_get_invalid_argument(bus: EmbeddedNats, router: HostRouter) -> None:
    client = await session_client(await bus.add_session_user(new_session_id()))
    garbage = [
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b"[]",
        b"null",
        b'"rlm.run"',
        b'{"v": 2, "type": "test.echo"}',
        b'{"type": 5}',
        b'{"args": {}}',
        b'{"type": "test.echo", "args": [1, 2]}',
        b'{"type": "test.echo", "args": {}, "extra": true}',
        b"{" * 10_000,
        b"[" * 100_000,  # deep enough to make json.loads raise RecursionError
        b'{"type": "test.echo", "args": {"pad": "' + b"x" * MAX_REQUEST_BYTES + b'"}}',
    ]
    try:
        for payload in garbage:
            reply = await client.request(payload)
            assert not reply.ok, payload[:40]
            assert reply.error is not None and reply.error.code == "invalid_argument", payload[:40]
        reply = await client.request({"type": "no.such.thing"})
        assert reply.error is not None and reply.error.code == "unknown_request"
        reply = await client.request({"type": "test.echo"})
        assert reply.ok
        stats = router.statistics()
        assert stats.requests == len(garbage) + 2 and stats.errors == len(garbage) + 1
    finally:
        await client.nc.close()


async def test_handler_failures_do_not_stop_the_router(
    bus: EmbeddedNats, router: HostRouter
) -> None:
    client = await session_client(await bus.add_session_user(new_session_id()))
    try:
        reply = await client.request({"type": "test.fail"})
        assert reply.error is not None and reply.error.code == "internal"
        assert "secret" not in reply.error.message  # details stay in the orchestrator log
        reply = await client.request({"type": "test.echo", "args": {"n": 1}})
        assert reply.ok and reply.result["args"] == {"n": 1}

        reply = await client.request({"type": "test.refuse"})
        assert reply.error is not None
        assert (reply.error.code, reply.error.message, reply.error.retry_after) == (
            "rate_limited",
            "slow down",
            2.5,
        )
        reply = await client.request({"type": "test.unserializable"})
        assert reply.error is not None and reply.error.code == "internal"
        reply = await client.request({"type": "test.echo"})
        assert reply.ok
        stats = router.statistics()
        assert stats.internal_errors == 2 and stats.errors == 3 and stats.in_flight == 0
    finally:
        await client.nc.close()

    with pytest.raises(ValueError):
        HostRequestError("no_such_code", "x")


async def test_handlers_run_concurrently_with_a_per_session_bound(
    bus: EmbeddedNats, admin: NatsClient, calls: Calls
) -> None:
    router = make_router(admin, calls, max_in_flight_per_session=2)
    await router.start()
    sid_a, sid_b = new_session_id(), new_session_id()
    a = await session_client(await bus.add_session_user(sid_a))
    b = await session_client(await bus.add_session_user(sid_b))
    try:
        first = asyncio.create_task(a.request({"type": "test.block"}))
        second = asyncio.create_task(a.request({"type": "test.block"}))
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            await calls.both_blocked.wait()  # both handlers are running at once
        reply = await a.request({"type": "test.echo"})
        assert reply.error is not None and reply.error.code == "quota_exceeded"
        # Another session is not affected by A's full quota.
        assert (await b.request({"type": "test.echo"})).ok
        calls.release.set()
        assert [r.result for r in await asyncio.gather(first, second)] == ["released"] * 2
        assert (await a.request({"type": "test.echo"})).ok
    finally:
        await a.nc.close()
        await b.nc.close()
        await router.close()


async def test_slow_handler_times_out_and_close_cancels(
    bus: EmbeddedNats, admin: NatsClient, calls: Calls
) -> None:
    router = make_router(admin, calls, handler_timeout_s=0.2)
    await router.start()
    client = await session_client(await bus.add_session_user(new_session_id()))
    try:
        reply = await client.request({"type": "test.sleep"})
        assert reply.error is not None and reply.error.code == "internal"
        assert "did not finish" in reply.error.message
        # A request still in flight at close() is cancelled after the grace period.
        pending = asyncio.create_task(
            client.nc.request(client.creds.host_subject, b'{"type":"test.block"}', timeout=0.5)
        )
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while calls.blocked < 1:
                await asyncio.sleep(0.01)
        await router.close(grace_s=0.1)
        assert router.statistics().in_flight == 0
        with pytest.raises(nats.errors.TimeoutError):
            await pending
    finally:
        await client.nc.close()
        await router.close()


async def test_a_request_type_with_its_own_bound_outlives_the_default(
    bus: EmbeddedNats, admin: NatsClient
) -> None:
    """An MCP call may run longer than the host-request default (wire.REQUEST_TIMEOUTS_S)."""

    async def slow_tool(session_id: str, args: dict[str, Any]) -> Any:
        await asyncio.sleep(LONGER_THAN_DEFAULT_S)
        return "finished"

    router = HostRouter(admin, handler_timeout_s=SHORT_DEFAULT_S)
    router.register("mcp.call_tool", slow_tool)
    router.register("test.slow", slow_tool)
    await router.start()
    client = await session_client(await bus.add_session_user(new_session_id()))
    try:
        bounded = await client.request({"type": "mcp.call_tool"})
        assert bounded.ok and bounded.result == "finished"
        default = await client.request({"type": "test.slow"})
        assert default.error is not None and default.error.code == "internal"
    finally:
        await client.nc.close()
        await router.close()


# --- users at runtime -------------------------------------------------------------------------


async def test_users_added_and_removed_at_runtime(bus: EmbeddedNats, router: HostRouter) -> None:
    sid = new_session_id()
    creds = await bus.add_session_user(sid)  # in effect on return: no sleep, no retry
    client = await session_client(creds)
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    client.nc._closed_cb = on_closed  # nats-py has no public setter after connect
    assert (await client.request({"type": "test.echo"})).ok
    assert sid in bus.session_users()

    await bus.remove_session_user(sid)
    assert sid not in bus.session_users()
    # The live connection is cut by the reload, and the user can no longer log in.
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        await closed.wait()
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await session_client(creds)
    await bus.remove_session_user(sid)  # removing twice is harmless


# --- reuse, crashes and restarts ---------------------------------------------------------------

_OWNER_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from orchestrator.bus.server import EmbeddedNats

    async def main():
        run, store, sid, mode = sys.argv[1:5]
        server = EmbeddedNats(runtime_dir=Path(run), store_dir=Path(store),
                              die_with_parent=(mode == "die"))
        await server.start()
        creds = await server.add_session_user(sid)
        creds.write(Path(run).parent / "owner-creds.json")
        print(json.dumps({"pid": server.pid, "url": server.url}), flush=True)
        if mode == "die":
            await asyncio.Event().wait()  # hold it until killed
        server.detach()  # a daemon exiting and leaving the server to its successor

    asyncio.run(main())
    """
)


def _owner(tmp_path: Path, sid: str, mode: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _OWNER_SCRIPT,
            str(tmp_path / "run"),
            str(tmp_path / "store"),
            sid,
            mode,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "owner process failed"
    return proc, json.loads(line)


async def test_reuse_adopts_a_detached_server_from_another_process(tmp_path: Path) -> None:
    sid_old, sid_new = new_session_id(), new_session_id()
    proc, info = _owner(tmp_path, sid_old, "detach")
    assert proc.wait(timeout=GONE_TIMEOUT_S) == 0  # the owner exited; its server did not
    assert pids_alive([info["pid"]]) == [info["pid"]]
    old_creds = SessionCredentials.read(tmp_path / "owner-creds.json")

    server = EmbeddedNats(runtime_dir=tmp_path / "run", store_dir=tmp_path / "store")
    try:
        await server.start()
        assert server.reused and server.pid == info["pid"] and server.url == info["url"]
        # The previous owner's user still works, and this owner can manage users too.
        old = await session_client(old_creds)
        new = await session_client(await server.add_session_user(sid_new))
        await old.nc.close()
        await new.nc.close()
        assert server.session_users() == sorted([sid_old, sid_new])

        # Without reuse, a second server on the same directory is refused, not started.
        with pytest.raises(BusError, match="already runs"):
            await EmbeddedNats(
                runtime_dir=tmp_path / "run", store_dir=tmp_path / "store", reuse=False
            ).start()
    finally:
        await server.stop()
    assert wait_until(lambda: not pids_alive([info["pid"]]), timeout=GONE_TIMEOUT_S)
    assert not _group_alive(info["pid"])


async def test_die_with_parent_server_is_not_shared_and_dies_with_its_owner(
    tmp_path: Path,
) -> None:
    sid = new_session_id()
    proc, info = _owner(tmp_path, sid, "die")
    try:
        with pytest.raises(BusError, match="dies with it"):
            await EmbeddedNats(runtime_dir=tmp_path / "run", store_dir=tmp_path / "store").start()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=GONE_TIMEOUT_S)
    assert wait_until(lambda: not pids_alive([info["pid"]]), timeout=GONE_TIMEOUT_S)

    # A stale pid file is ignored; the restart keeps the URL and the users (sandboxes whose
    # clients reconnect keep working).
    server = EmbeddedNats(runtime_dir=tmp_path / "run", store_dir=tmp_path / "store")
    try:
        await server.start()
        assert not server.reused and server.pid != info["pid"]
        assert server.url == info["url"]
        client = await session_client(SessionCredentials.read(tmp_path / "owner-creds.json"))
        await client.nc.close()
    finally:
        await server.stop()


async def test_router_and_sessions_survive_a_server_restart(
    bus: EmbeddedNats, admin: NatsClient, router: HostRouter
) -> None:
    creds = await bus.add_session_user(new_session_id())
    url = bus.url
    await bus.stop()
    await bus.start()
    assert bus.url == url  # same port, same users: nobody needs new credentials
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        while not admin.is_connected:  # the router's connection reconnects by itself
            await asyncio.sleep(0.01)
    client = await session_client(creds)
    try:
        assert (await client.request({"type": "test.echo"})).ok
    finally:
        await client.nc.close()


async def test_a_wrong_admin_password_is_refused_as_a_bus_error(bus: EmbeddedNats) -> None:
    admin = bus.admin
    assert isinstance(admin, AdminCredentials)
    with pytest.raises(BusError):
        await connect_nats(
            bus.url, user=admin.user, password="wrong", name="prime-agent-test", reconnect=False
        )
    nc = await connect_nats(
        bus.url, user=admin.user, password=admin.password, name="prime-agent-test", reconnect=False
    )
    assert nc.is_connected
    await nc.close()


# --- mailboxes --------------------------------------------------------------------------------


def _message(n: int) -> dict[str, Any]:
    return {"id": f"msg-{n}", "body": f"hello {n}"}


async def test_mailbox_survives_restarts_and_redelivers_unacked(
    bus: EmbeddedNats, admin: NatsClient
) -> None:
    sid, other = new_session_id(), new_session_id()
    box = Mailbox(admin)
    await box.ensure_stream()
    await box.ensure_stream()  # idempotent
    seqs = [await box.put(sid, _message(n)) for n in range(5)]
    assert seqs == sorted(seqs)
    await box.put(other, _message(99))
    assert await box.put(sid, _message(0)) == seqs[0]  # a retried put is stored once
    assert await box.pending(sid) == 5

    await bus.stop()
    await bus.start()  # same store dir
    nc = await bus.admin.connect()
    try:
        box = Mailbox(nc)
        await box.ensure_stream()
        taken = await box.take(sid, max=10)
        assert [m.message_id for m in taken] == [f"msg-{n}" for n in range(5)]
        assert [m.data for m in taken] == [_message(n) for n in range(5)]
        assert [m.seq for m in taken] == seqs
        assert await box.take(sid, max=2) == taken[:2]

        await box.ack(taken[:2])
        await box.ack(taken[0])  # twice is harmless
        again = await box.take(sid)  # the un-acked ones come back, in order
        assert [m.message_id for m in again] == ["msg-2", "msg-3", "msg-4"]
    finally:
        await nc.close()

    await bus.stop()
    await bus.start()
    nc = await bus.admin.connect()
    try:
        box = Mailbox(nc)
        after = await box.take(sid)
        assert [m.message_id for m in after] == ["msg-2", "msg-3", "msg-4"]  # acks were durable
        await box.put(sid, _message(5))
        await box.ack_through(sid, after[-1].seq)  # one request for a whole recorded take
        assert [m.message_id for m in await box.take(sid)] == ["msg-5"]
        await box.ack(await box.take(sid))
        assert await box.take(sid) == [] and await box.pending(sid) == 0
        assert [m.message_id for m in await box.take(other)] == ["msg-99"]  # untouched
        await box.purge(other)
        assert await box.pending(other) == 0
    finally:
        await nc.close()


async def test_mailbox_survives_a_server_crash(bus: EmbeddedNats, admin: NatsClient) -> None:
    sid = new_session_id()
    box = Mailbox(admin)
    await box.ensure_stream()
    for n in range(3):
        await box.put(sid, _message(n))
    old_pid = bus.pid
    os.kill(old_pid, signal.SIGKILL)  # no clean shutdown: what was acked must be there
    assert wait_until(lambda: not bus.running, timeout=GONE_TIMEOUT_S)
    await bus.start()  # notices the dead server and starts a new one on the same store
    assert bus.running and bus.pid != old_pid
    nc = await bus.admin.connect()
    try:
        taken = await Mailbox(nc).take(sid)
        assert [m.message_id for m in taken] == ["msg-0", "msg-1", "msg-2"]
    finally:
        await nc.close()


async def test_mailbox_take_without_batch_get_matches(
    admin: NatsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = new_session_id()
    box = Mailbox(admin)
    await box.ensure_stream()
    for n in range(4):
        await box.put(sid, _message(n))
    batched = await box.take(sid, max=3)
    monkeypatch.setattr(box, "_batch_get_supported", lambda: False)  # a pre-2.11 server
    assert await box.take(sid, max=3) == batched
    assert len(await box.take(sid)) == 4


async def test_mailbox_refuses_bad_messages(admin: NatsClient) -> None:
    box = Mailbox(admin)
    await box.ensure_stream()
    sid = new_session_id()
    with pytest.raises(ValueError):
        await box.put(sid, {"body": "no id"})
    with pytest.raises(ValueError):
        await box.put(sid, {"id": "x", "body": "y" * 100_000})
    with pytest.raises(ValueError):
        await box.put("not-a-session", _message(1))
    assert await box.take(sid) == []
