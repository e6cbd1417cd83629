"""The control socket end to end: a real Unix socket, a dummy handler, real clients (R12, R15)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import textwrap
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.api import client as client_module
from orchestrator.api.client import ControlClient, request_sync
from orchestrator.api.errors import (
    ApiCommandError,
    ConnectionClosed,
    DaemonAlreadyRunning,
    ProtocolMismatch,
    SocketPathError,
)
from orchestrator.api.framing import MAX_LINE_BYTES
from orchestrator.api.messages import Event, Resync, Stream
from orchestrator.api.protocol import COMMAND_TYPES, Command, CreateSession, server_message_adapter
from orchestrator.api.server import (
    SOCKET_FILE_NAME,
    ClientInfo,
    CommandHandler,
    ControlServer,
    SessionSnapshot,
)
from orchestrator.api.wire import (
    CAP_STREAM,
    CLIENT_CAPABILITIES,
    ERROR_CODES,
    PROTOCOL_VERSION,
    SERVER_CAPABILITIES,
)
from orchestrator.errors import UserError

IO_TIMEOUT_S = 10.0
READ_CHUNK_BYTES = 65536
TEST_HANDSHAKE_TIMEOUT_S = 0.5
HUGE_LINE_BYTES = 100 * 1024 * 1024
HUGE_CHUNK_BYTES = 1024 * 1024
# The whole process (server and the client streaming 100 MB) may allocate at most this much.
HUGE_LINE_PEAK_BYTES = 40 * 1024 * 1024
NOBODY_UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


class DummyHandler(CommandHandler):
    """Answers every command from memory; counts calls; can hold a command on a gate."""

    def __init__(self) -> None:
        self.calls: list[Command] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.last_cursor = 0
        self.disconnected: list[ClientInfo] = []
        self.parents: dict[str, list[str]] = {}  # session -> its ancestors (family routing)

    def count(self, kind: str) -> int:
        return sum(1 for c in self.calls if c.type == kind)

    async def handle(self, client: ClientInfo, command: Command) -> Any:
        self.calls.append(command)
        match command.type:
            case "ping":
                return {"pong": True}
            case "create_session":
                assert isinstance(command, CreateSession)
                if command.task == "slow":
                    await self.gate.wait()
                sid = f"s-{len(self.sessions):012d}"
                self.sessions[sid] = {"cwd": command.cwd}
                return {"session": sid}
            case "list_sessions":
                return sorted(self.sessions)
            case "get_session":
                raise ApiCommandError("not_found", f"no session {command.session}")  # type: ignore[union-attr]
            case "get_usage":
                if command.session == "boom":  # type: ignore[union-attr]
                    raise RuntimeError("secret detail that must not leak")
                if command.session == "object":  # type: ignore[union-attr]
                    return object()
                if command.session == "huge":  # type: ignore[union-attr]
                    return "x" * (MAX_LINE_BYTES + 1)
                return {"tokens": 0}
            case "attach":
                return {"cursor": self.last_cursor}
            case _:
                return {"ok": True}

    async def snapshot(self, client: ClientInfo, session: str) -> SessionSnapshot | None:
        return SessionSnapshot(cursor=self.last_cursor, data={"session": session, "n": 1})

    async def client_disconnected(self, client: ClientInfo) -> None:
        self.disconnected.append(client)

    def ancestors(self, session: str) -> list[str]:
        return self.parents.get(session, [])


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # pytest's tmp_path is too long for AF_UNIX (107 bytes) and sits under a 0700 directory
    # that the uid test's "nobody" could not traverse.
    base = Path(tempfile.mkdtemp(prefix="pa-api-", dir="/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def sock_path(sock_dir: Path) -> Path:
    return sock_dir / "run" / SOCKET_FILE_NAME


@pytest.fixture
def handler() -> DummyHandler:
    return DummyHandler()


@pytest.fixture
async def server(sock_path: Path, handler: DummyHandler) -> AsyncIterator[ControlServer]:
    async with ControlServer(
        sock_path,
        handler,
        server_version="test",
        handshake_timeout_s=TEST_HANDSHAKE_TIMEOUT_S,
        queue_max_messages=64,
        queue_max_bytes=1024 * 1024,
    ) as srv:
        yield srv


class Raw:
    """A hand-driven connection: exact bytes in, parsed lines out."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        hello: bool = True,
        client_id: str = "raw",
        capabilities: tuple[str, ...] = CLIENT_CAPABILITIES,
    ) -> Raw:
        reader, writer = await asyncio.open_unix_connection(str(path))
        raw = cls(reader, writer)
        if hello:
            hello = {
                "type": "hello",
                "protocol_version": PROTOCOL_VERSION,
                "client_id": client_id,
                "capabilities": list(capabilities),
            }
            await raw.send(hello)
            welcome = await raw.recv()
            assert welcome["type"] == "welcome", welcome
        return raw

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(IO_TIMEOUT_S):
            line = await self.reader.readline()
        assert line, "connection closed"
        message: dict[str, Any] = json.loads(line)
        server_message_adapter.validate_python(message)  # every line the server sends is typed
        return message

    async def at_eof(self) -> bool:
        """Read (and discard) whatever is still in flight; True once the server has closed."""
        async with asyncio.timeout(IO_TIMEOUT_S):
            try:
                while await self.reader.read(READ_CHUNK_BYTES):
                    pass
            except ConnectionResetError:
                pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with _suppress_os():
            await self.writer.wait_closed()


class _suppress_os:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return isinstance(exc[1], OSError)


async def wait_for(predicate: Any, *, timeout: float = IO_TIMEOUT_S) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------ basics


async def test_socket_and_directory_are_private(server: ControlServer, sock_path: Path) -> None:
    assert stat.S_IMODE(os.stat(sock_path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
    await server.close()
    assert not sock_path.exists()


async def test_handshake_and_ping(server: ControlServer, handler: DummyHandler) -> None:
    async with await ControlClient.connect(server.socket_path, client_id="cli") as client:
        assert client.welcome.protocol_version == PROTOCOL_VERSION
        assert client.welcome.server_version == "test"
        # `stream` is opt-in: the default client capabilities leave it out.
        assert client.capabilities == frozenset(SERVER_CAPABILITIES) - {CAP_STREAM}
        assert await client.call("ping") == {"pong": True}
        assert [c.client_id for c in server.clients] == ["cli"]
    await wait_for(lambda: handler.disconnected)
    assert handler.disconnected[0].client_id == "cli"


async def test_sync_helper(server: ControlServer) -> None:
    result = await asyncio.to_thread(request_sync, "ping", socket_path=server.socket_path)
    assert result == {"pong": True}


async def test_unknown_and_invalid_commands_get_typed_errors(server: ControlServer) -> None:
    raw = await Raw.open(server.socket_path)
    await raw.send({"type": "frobnicate", "command_id": "c1"})
    reply = await raw.recv()
    assert reply["type"] == "response" and reply["command_id"] == "c1"
    assert reply["ok"] is False and reply["error"]["code"] == "unknown_command"
    await raw.send({"type": "frobnicate"})  # no command id: a connection-level error
    assert (await raw.recv())["code"] == "unknown_command"
    await raw.send({"type": "get_session", "command_id": "c2"})  # missing field
    reply = await raw.recv()
    assert reply["error"]["code"] == "invalid_command" and "session" in reply["error"]["message"]
    await raw.send({"type": "ping", "command_id": "c3", "extra": 1})  # unknown field
    assert (await raw.recv())["error"]["code"] == "invalid_command"
    await raw.send({"type": "hello", "protocol_version": 1, "client_id": "x", "command_id": "c4"})
    assert (await raw.recv())["error"]["code"] == "invalid_command"
    await raw.send({"type": "ping", "command_id": "c5"})
    assert (await raw.recv())["ok"] is True
    await raw.close()


async def test_garbage_bytes_get_parse_errors(server: ControlServer) -> None:
    raw = await Raw.open(server.socket_path)
    for junk in (b"\xff\xfe\x00\x01garbage", b"not json", b"[1, 2]", b'{"a": NaN}', b"{" * 100_000):
        await raw.send(junk + b"\n")
        reply = await raw.recv()
        assert reply["type"] == "error" and reply["code"] == "parse_error", junk[:20]
    await raw.send(b"\r\n\n")  # blank lines are ignored
    await raw.send(b'{"type": "ping", "command_id": "p"}\r\n')  # CRLF works
    assert (await raw.recv())["ok"] is True
    await raw.close()


async def test_first_message_must_be_hello(server: ControlServer) -> None:
    raw = await Raw.open(server.socket_path, hello=False)
    await raw.send({"type": "ping", "command_id": "1"})
    assert (await raw.recv())["code"] == "handshake_required"
    assert await raw.at_eof()


async def test_handshake_timeout_closes(server: ControlServer) -> None:
    raw = await Raw.open(server.socket_path, hello=False)
    assert (await raw.recv())["code"] == "handshake_timeout"
    assert await raw.at_eof()


async def test_wrong_protocol_version(
    server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = await Raw.open(server.socket_path, hello=False)
    await raw.send({"type": "hello", "protocol_version": PROTOCOL_VERSION + 1, "client_id": "x"})
    error = await raw.recv()
    assert error["code"] == "version_mismatch" and "restart the daemon" in error["message"]
    assert await raw.at_eof()
    # The client turns it into one line a person can act on.
    monkeypatch.setattr("orchestrator.api.client.PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolMismatch) as info:
        await ControlClient.connect(server.socket_path)
    assert isinstance(info.value, UserError)
    assert "restart the daemon" in str(info.value) and "\n" not in str(info.value)


async def test_handler_errors_are_typed_and_leak_nothing(server: ControlServer) -> None:
    async with await ControlClient.connect(server.socket_path) as client:
        with pytest.raises(ApiCommandError) as info:
            await client.call("get_session", session="s-nope")
        assert info.value.code == "not_found"
        for session, code in (("boom", "internal"), ("object", "internal")):
            with pytest.raises(ApiCommandError) as info:
                await client.call("get_usage", session=session)
            assert info.value.code == code and "secret" not in info.value.message
        with pytest.raises(ApiCommandError) as info:
            await client.call("get_usage", session="huge")
        assert info.value.code == "result_too_large"
        assert await client.call("ping") == {"pong": True}


# ------------------------------------------------------------------------------ R12: abuse


async def test_hundred_megabyte_line(server: ControlServer) -> None:
    raw = await Raw.open(server.socket_path)
    chunk = b"x" * HUGE_CHUNK_BYTES
    sent_half = asyncio.Event()

    async def stream() -> None:
        for i in range(HUGE_LINE_BYTES // HUGE_CHUNK_BYTES):
            raw.writer.write(chunk)
            await raw.writer.drain()
            if i == HUGE_LINE_BYTES // HUGE_CHUNK_BYTES // 2:
                sent_half.set()
        raw.writer.write(b"\n")
        await raw.writer.drain()

    tracemalloc.start()
    try:
        async with asyncio.timeout(60), asyncio.TaskGroup() as tg:
            tg.create_task(stream())
            error = await raw.recv()  # answered as soon as the cap is passed
            assert error["type"] == "error" and error["code"] == "line_too_long"
            await sent_half.wait()
            # Mid-stream, another client is served normally.
            async with await ControlClient.connect(server.socket_path) as other:
                assert await other.call("ping") == {"pong": True}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < HUGE_LINE_PEAK_BYTES, f"peak {peak} bytes while discarding a 100 MB line"
    # Framing is back in sync after the newline.
    await raw.send({"type": "ping", "command_id": "after"})
    assert (await raw.recv())["command_id"] == "after"
    await raw.close()


async def test_disconnect_mid_line_runs_nothing(
    server: ControlServer, handler: DummyHandler
) -> None:
    raw = await Raw.open(server.socket_path)
    await raw.send(b'{"type": "create_session", "command_id": "1", "cwd": "/tmp"}   ')
    await raw.close()  # no newline: the line never completed
    await wait_for(lambda: server.statistics()["connections"] == 0)
    assert handler.count("create_session") == 0
    async with await ControlClient.connect(server.socket_path) as client:
        assert await client.call("ping") == {"pong": True}


async def test_half_closed_client_still_gets_its_answers(
    server: ControlServer, handler: DummyHandler
) -> None:
    # `printf '...' | nc -U sock` style: send everything, shut the write side, then read.
    handler.gate.clear()
    raw = await Raw.open(server.socket_path)
    await raw.send({"type": "create_session", "command_id": "slow", "cwd": "/", "task": "slow"})
    await raw.send({"type": "ping", "command_id": "p"})
    raw.writer.write_eof()
    assert (await raw.recv())["command_id"] == "p"
    handler.gate.set()
    assert (await raw.recv())["result"] == {"session": "s-000000000000"}
    assert await raw.at_eof()


async def test_disconnect_while_command_runs_then_retry_gets_stored_result(
    server: ControlServer, handler: DummyHandler
) -> None:
    handler.gate.clear()
    first = await ControlClient.connect(server.socket_path, client_id="retry")
    command = CreateSession(command_id="create-1", cwd="/w", task="slow")
    pending = asyncio.create_task(first.request(command))
    await wait_for(lambda: handler.count("create_session") == 1)
    await first.close()  # the client dies while the command runs
    with pytest.raises(ConnectionClosed):
        await pending
    handler.gate.set()
    await wait_for(lambda: handler.sessions)
    async with await ControlClient.connect(server.socket_path, client_id="retry") as second:
        result = await second.request(command)
    assert result == {"session": "s-000000000000"}
    assert handler.count("create_session") == 1


async def test_repeated_mutating_command_runs_once(
    server: ControlServer, handler: DummyHandler
) -> None:
    async with await ControlClient.connect(server.socket_path, client_id="idem") as client:
        a = await client.call("create_session", command_id="x1", cwd="/a")
        b = await client.call("create_session", command_id="x1", cwd="/a")
        assert a == b and handler.count("create_session") == 1
        # Two copies in flight at once still run once.
        handler.gate.clear()
        cmd = CreateSession(command_id="x2", cwd="/b", task="slow")
        raw = await Raw.open(server.socket_path, client_id="idem")
        first = asyncio.create_task(client.request(cmd))
        await wait_for(lambda: handler.count("create_session") == 2)
        await raw.send(json.loads(cmd.model_dump_json()))
        handler.gate.set()
        stored = await first
        assert (await raw.recv())["result"] == stored
        assert handler.count("create_session") == 2
        await raw.close()
        # Same id, different command: a conflict, not a silent replay.
        with pytest.raises(ApiCommandError) as info:
            await client.call("create_session", command_id="x1", cwd="/other")
        assert info.value.code == "conflict"
        # Reads are not journaled; another client id is another namespace.
        await client.call("ping", command_id="p")
        await client.call("ping", command_id="p")
        assert handler.count("ping") == 2
    async with await ControlClient.connect(server.socket_path, client_id="other") as other:
        await other.call("create_session", command_id="x1", cwd="/a")
    assert handler.count("create_session") == 3
    assert server.statistics()["journal_hits"] >= 2


async def test_never_reading_client_is_bounded_and_dropped(
    server: ControlServer, handler: DummyHandler
) -> None:
    sid = "s-000000000001"
    stalled = await Raw.open(server.socket_path, client_id="stalled")
    await stalled.send({"type": "attach", "command_id": "a", "session": sid})
    assert (await stalled.recv())["ok"] is True
    stalled_info = next(c for c in server.clients if c.client_id == "stalled")
    reader = await ControlClient.connect(server.socket_path, client_id="reader")
    await reader.call("attach", session=sid)
    reader_info = next(c for c in server.clients if c.client_id == "reader")

    received: list[int] = []

    async def consume() -> None:
        async for message in reader.events():
            assert isinstance(message, Event), message
            received.append(message.cursor)
            if message.cursor == total:
                return

    total = 2000
    payload = {"text": "y" * 4096}
    max_bytes_seen = 0
    async with asyncio.TaskGroup() as tg:
        consumer = tg.create_task(consume())
        for cursor in range(1, total + 1):
            handler.last_cursor = cursor
            server.broadcast(sid, cursor, payload)
            max_bytes_seen = max(max_bytes_seen, server.outbox_statistics(stalled_info)["bytes"])
            if cursor % 16 == 0:
                # Let the reading client keep up; the stalled one never does.
                await wait_for(lambda: server.outbox_statistics(reader_info)["messages"] == 0)
        await consumer
    assert received == list(range(1, total + 1))
    assert max_bytes_seen <= 1024 * 1024  # the server fixture's queue_max_bytes
    assert server.statistics()["dropped_slow"] == 1
    assert stalled_info not in server.clients
    assert await stalled.at_eof()
    assert await reader.call("ping") == {"pong": True}
    await reader.close()


async def test_slow_reader_gets_resync_with_snapshot(
    server: ControlServer, handler: DummyHandler
) -> None:
    sid = "s-000000000002"
    slow = await Raw.open(server.socket_path, client_id="slow")
    await slow.send({"type": "attach", "command_id": "a", "session": sid})
    assert (await slow.recv())["ok"] is True
    info = next(c for c in server.clients if c.client_id == "slow")
    cursor = 0
    while server.outbox_statistics(info)["resyncs"] == 0:
        cursor += 1
        handler.last_cursor = cursor
        server.broadcast(sid, cursor, {"text": "z" * 8192})
        if cursor % 8 == 0:
            await asyncio.sleep(0)
    assert cursor < 10_000
    overflow_cursor = cursor
    # The client reads again: what was already in flight, then the resync, then live events.
    for extra in range(1, 4):
        handler.last_cursor = overflow_cursor + extra
        server.broadcast(sid, overflow_cursor + extra, {"text": "live"})
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1].get("cursor") != overflow_cursor + 3:
        seen.append(await slow.recv())
    resyncs = [m for m in seen if m["type"] == "resync"]
    assert len(resyncs) == 1
    assert resyncs[0]["snapshot"] == {"session": sid, "n": 1}
    assert resyncs[0]["cursor"] >= overflow_cursor
    assert server.statistics()["dropped_slow"] == 0
    await slow.close()


async def test_stream_messages_reach_only_clients_that_asked(
    server: ControlServer, handler: DummyHandler
) -> None:
    root, child = "s-000000000010", "s-000000000011"
    handler.parents[child] = [root]
    streaming = (*CLIENT_CAPABILITIES, CAP_STREAM)
    watcher = await ControlClient.connect(server.socket_path, capabilities=streaming)
    plain = await ControlClient.connect(server.socket_path)
    family = await ControlClient.connect(server.socket_path, capabilities=streaming)
    elsewhere = await ControlClient.connect(server.socket_path, capabilities=streaming)
    assert CAP_STREAM in watcher.capabilities and CAP_STREAM not in plain.capabilities
    await watcher.call("attach", session=child)
    await plain.call("attach", session=child)
    await family.call("attach", session=root, family=True)
    await elsewhere.call("attach", session=root)  # not with family: not the child's
    delta = {"type": "text_delta", "session_id": child, "delta": "hel"}
    assert server.broadcast_transient(child, delta) == 2
    assert server.broadcast(child, 1, {"type": "assistant_message"}) == 3
    for client, expected in [
        (watcher, [Stream, Event]),
        (family, [Stream, Event]),
        (plain, [Event]),
        (elsewhere, []),
    ]:
        await client.call("ping")  # everything sent before its answer is queued by now
        got = []
        while (item := client.next_event_nowait()) is not None:
            got.append(item)
        assert [type(item) for item in got] == expected
        if expected:
            assert got[0].session == child
        if expected[:1] == [Stream]:
            assert isinstance(got[0], Stream) and got[0].event == delta
    for client in (watcher, plain, family, elsewhere):
        await client.close()


async def test_stream_messages_to_a_slow_client_are_dropped_not_resynced(
    server: ControlServer, handler: DummyHandler
) -> None:
    sid = "s-000000000012"
    slow = await Raw.open(
        server.socket_path, client_id="slow-stream", capabilities=(*CLIENT_CAPABILITIES, CAP_STREAM)
    )
    await slow.send({"type": "attach", "command_id": "a", "session": sid})
    assert (await slow.recv())["ok"] is True
    info = next(c for c in server.clients if c.client_id == "slow-stream")
    sent = 0
    while server.outbox_statistics(info)["dropped_transients"] == 0:
        sent += 1
        server.broadcast_transient(sid, {"type": "text_delta", "delta": "d" * 8192})
        if sent % 8 == 0:
            await asyncio.sleep(0)  # let the writer fill the socket buffers
    assert sent < 10_000
    stats = server.outbox_statistics(info)
    assert stats["resyncs"] == 0 and stats["dropped_events"] == 0
    assert info in server.clients and server.statistics()["dropped_slow"] == 0
    # The durable event still goes out, after the stream messages that were queued.
    handler.last_cursor = 1
    server.broadcast(sid, 1, {"type": "assistant_message"})
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["type"] != "event":
        seen.append(await slow.recv())
    assert {m["type"] for m in seen[:-1]} == {"stream"} and seen[-1]["cursor"] == 1
    await slow.close()


async def test_client_queue_drops_stream_items_first(
    server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 8
    monkeypatch.setattr(client_module, "CLIENT_EVENT_QUEUE_MAX", limit)
    sid = "s-000000000013"
    client = await ControlClient.connect(
        server.socket_path, capabilities=(*CLIENT_CAPABILITIES, CAP_STREAM)
    )
    await client.call("attach", session=sid)

    def drain() -> list[Any]:
        out = []
        while (item := client.next_event_nowait()) is not None:
            out.append(item)
        return out

    # A queue full of stream items: an event pushes them all out, without a resync.
    for i in range(limit):
        server.broadcast_transient(sid, {"type": "text_delta", "delta": str(i)})
    server.broadcast(sid, 1, {"n": 1})
    await client.call("ping")
    got = drain()
    assert [type(m) for m in got] == [Event] and got[0].cursor == 1
    # A queue full of events: a stream item is dropped, nothing else happens.
    for cursor in range(2, limit + 2):
        server.broadcast(sid, cursor, {"n": cursor})
    server.broadcast_transient(sid, {"type": "text_delta", "delta": "late"})
    await client.call("ping")
    got = drain()
    assert [type(m) for m in got] == [Event] * limit
    assert [m.cursor for m in got] == list(range(2, limit + 2))
    await client.close()


async def test_server_close_fails_pending_requests(
    server: ControlServer, handler: DummyHandler, sock_path: Path
) -> None:
    handler.gate.clear()
    client = await ControlClient.connect(server.socket_path)
    pending = asyncio.create_task(client.call("create_session", cwd="/", task="slow"))
    await wait_for(lambda: handler.count("create_session") == 1)
    await server.close()
    with pytest.raises(ConnectionClosed):
        await pending
    assert not sock_path.exists()
    await client.close()


# ------------------------------------------------------------------------------ start-up


async def test_stale_socket_is_replaced_and_live_one_refused(
    sock_path: Path, handler: DummyHandler
) -> None:
    sock_path.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_path))
    stale.close()  # the file stays, nobody listens: a daemon that died
    async with ControlServer(sock_path, handler) as srv:
        async with await ControlClient.connect(sock_path) as client:
            assert await client.call("ping") == {"pong": True}
        with pytest.raises(DaemonAlreadyRunning):
            await ControlServer(sock_path, handler).start()  # the lock says no
        await wait_for(lambda: srv.statistics()["connections"] == 0)


async def test_live_foreign_listener_refused_and_non_socket_kept(
    sock_path: Path, handler: DummyHandler
) -> None:
    sock_path.parent.mkdir(mode=0o700)

    async def ignore(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    listener = await asyncio.start_unix_server(ignore, path=str(sock_path))
    async with listener:
        with pytest.raises(DaemonAlreadyRunning):
            await ControlServer(sock_path, handler).start()
    sock_path.unlink()
    sock_path.write_text("not a socket")
    with pytest.raises(SocketPathError):
        await ControlServer(sock_path, handler).start()
    assert sock_path.read_text() == "not a socket"
    with pytest.raises(SocketPathError):
        await ControlServer(sock_path.parent / ("x" * 120), handler).start()


# ------------------------------------------------------------------------------ R15: other uids

NOBODY_SCRIPT = textwrap.dedent(
    """
    import json, socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(sys.argv[1])
    except PermissionError:
        print("EACCES")
        sys.exit(0)
    hello = {"type": "hello", "protocol_version": 1, "client_id": "nobody"}
    s.sendall(json.dumps(hello).encode() + b"\\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    print(data.decode().strip())
    """
)


async def _connect_as_nobody(path: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable,
        "-I",
        "-c",
        NOBODY_SCRIPT,
        str(path),
        user=NOBODY_UID,
        group=NOBODY_UID,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


@pytest.mark.skipif(
    os.geteuid() != 0, reason="dropping to another uid needs root (CI runs as root)"
)
async def test_other_uid_is_refused(server: ControlServer, sock_dir: Path, sock_path: Path) -> None:
    # 1. As deployed: the 0700 directory stops another user at connect().
    os.chmod(sock_dir, 0o755)
    assert await _connect_as_nobody(sock_path) == "EACCES"
    # 2. With the directory and socket opened up, the SO_PEERCRED check is what refuses.
    os.chmod(sock_path.parent, 0o755)
    os.chmod(sock_path, 0o666)
    reply = json.loads(await _connect_as_nobody(sock_path))
    assert reply["type"] == "error" and reply["code"] == "permission_denied"
    assert str(NOBODY_UID) in reply["message"]
    assert server.statistics()["refused_uid"] == 1
    assert server.clients == []
    async with await ControlClient.connect(sock_path) as client:  # the owner still gets in
        assert await client.call("ping") == {"pong": True}


# ------------------------------------------------------------------------------ fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
command_shaped = st.fixed_dictionaries(
    {"type": st.sampled_from([*sorted(COMMAND_TYPES), "hello", "bogus", ""])},
    optional={
        "command_id": st.one_of(st.text(max_size=6), st.integers(), st.none()),
        "session": json_values,
        "cwd": json_values,
        "text": json_values,
        "mode": st.sampled_from(["steer", "follow_up", "other"]),
        "cursor": json_values,
        "force": json_values,
    },
)
fuzz_lines = st.lists(
    st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        command_shaped.map(lambda v: json.dumps(v).encode()),
    ),
    max_size=6,
)


def _check_server_line(line: bytes) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(line)
    parsed = server_message_adapter.validate_python(message)
    if message["type"] == "error":
        assert message["code"] in ERROR_CODES
    if message["type"] == "response" and not message["ok"]:
        assert message["error"]["code"] in ERROR_CODES
    assert not isinstance(parsed, Resync)
    return message


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=fuzz_lines)
async def test_fuzz_after_handshake(server: ControlServer, lines: list[bytes]) -> None:
    raw = await Raw.open(server.socket_path, client_id="fuzz")
    try:
        await raw.send(b"\n".join(lines) + b"\n")
        await raw.send({"type": "ping", "command_id": "__probe__"})
        while True:
            message = _check_server_line(await _readline(raw))
            if message.get("command_id") == "__probe__" and message.get("ok"):
                break
    finally:
        await raw.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    first=st.one_of(st.binary(max_size=200), command_shaped.map(lambda v: json.dumps(v).encode()))
)
async def test_fuzz_before_handshake(server: ControlServer, first: bytes) -> None:
    raw = await Raw.open(server.socket_path, hello=False)
    try:
        await raw.send(first + b"\n")
        line = await _readline(raw)
        if line:  # a blank first line is skipped: then it is the handshake timeout that answers
            message = _check_server_line(line)
            assert message["type"] == "error"
            assert await raw.at_eof()
    finally:
        await raw.close()
    async with await ControlClient.connect(server.socket_path) as client:
        assert await client.call("ping") == {"pong": True}


async def _readline(raw: Raw) -> bytes:
    async with asyncio.timeout(IO_TIMEOUT_S):
        return await raw.reader.readline()
