"""The daemon's control socket: an asyncio Unix server speaking the protocol in ``protocol.py``.

The socket is the user's (R15): it lives in a 0700 directory the daemon owns, is chmod 0600
after bind (binding inside the private directory means there is no moment at which another user
could connect, whatever the umask), and every connection's peer uid is read with SO_PEERCRED and
refused unless it is the daemon's own.

Every connection runs in its own task; inside it, a reader and a writer task share a bounded
``Outbox``. Nothing a client sends or fails to read can stall the daemon or another client (R12):
bad lines get typed errors, a 100 MB line is discarded as it streams, a client that stops
reading is resynced and then disconnected, and commands run in tasks of their own so a slow
handler delays only its own answer. The daemon plugs in a ``CommandHandler`` and pushes session
events with ``broadcast``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import importlib.metadata
import itertools
import logging
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.framing import (
    LINE_TOO_LONG,
    MAX_LINE_BYTES,
    FrameError,
    LineReader,
    decode_line,
    encode_message,
)
from orchestrator.api.journal import JOURNAL_MAX_ENTRIES, JOURNAL_TTL_S, CommandJournal
from orchestrator.api.messages import (
    ErrorInfo,
    ErrorMessage,
    Event,
    Response,
    Resync,
    Stream,
    Welcome,
)
from orchestrator.api.outbox import (
    CLIENT_QUEUE_MAX_BYTES,
    CLIENT_QUEUE_MAX_MESSAGES,
    QUEUE_OVERFLOW_LIMIT,
    ItemKind,
    Outbox,
)
from orchestrator.api.protocol import (
    COMMAND_TYPES,
    MAX_ID_CHARS,
    Attach,
    Command,
    Detach,
    Hello,
    JsonObject,
    command_adapter,
    command_fingerprint,
)
from orchestrator.api.socket_file import (
    check_socket_path,
    default_socket_path,
    remove_stale_socket,
    take_lock,
    unlink_if_same,
)
from orchestrator.api.wire import (
    CAP_EVENTS,
    CAP_STREAM,
    E_CONFLICT,
    E_HANDSHAKE_REQUIRED,
    E_HANDSHAKE_TIMEOUT,
    E_INTERNAL,
    E_INVALID_COMMAND,
    E_LINE_TOO_LONG,
    E_PERMISSION_DENIED,
    E_RESULT_TOO_LARGE,
    E_SHUTTING_DOWN,
    E_UNKNOWN_COMMAND,
    E_VERSION_MISMATCH,
    PROTOCOL_VERSION,
    SERVER_CAPABILITIES,
    version_mismatch_message,
)
from orchestrator.paths import CONTROL_SOCKET_FILE_NAME

__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "MAX_INFLIGHT_PER_CLIENT",
    "SOCKET_FILE_NAME",
    "SOCKET_MODE",
    "ClientInfo",
    "CommandHandler",
    "ControlServer",
    "SessionSnapshot",
    "default_socket_path",
    "package_version",
    "version_mismatch_message",
]

log = logging.getLogger(__name__)

PACKAGE_NAME: Final = "prime-agent"
UNKNOWN_VERSION: Final = "0+unknown"
SOCKET_FILE_NAME: Final = CONTROL_SOCKET_FILE_NAME
SOCKET_MODE: Final = 0o600
HANDSHAKE_TIMEOUT_S: Final = 5.0
# Commands one client may have running at once; the reader waits past this.
MAX_INFLIGHT_PER_CLIENT: Final = 32
# Writing a last error line to a client we are about to close must not hang on a non-reader.
FAREWELL_TIMEOUT_S: Final = 1.0
SNAPSHOT_TIMEOUT_S: Final = 30.0
# After a client's EOF, how long its running commands and unsent replies may take to go out.
EOF_FLUSH_TIMEOUT_S: Final = 30.0
# Validation messages quote field paths, never the (possibly huge) input; and only the first few.
MAX_VALIDATION_ERRORS_SHOWN: Final = 3
MAX_ERROR_MESSAGE_CHARS: Final = 500
_PEERCRED_FORMAT: Final = "3i"  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


def package_version() -> str:
    """The installed prime-agent version, sent in ``welcome`` for diagnostics."""
    try:
        return importlib.metadata.version(PACKAGE_NAME)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


@dataclass
class ClientInfo:
    """One connection as the handler sees it."""

    conn_id: int
    pid: int | None
    uid: int | None
    gid: int | None
    client_id: str = ""
    capabilities: frozenset[str] = frozenset()
    # Sessions whose events this connection receives; maintained by the server on attach/detach.
    attached: set[str] = field(default_factory=set)
    # Sessions whose descendants' events it receives too (``attach {family: true}``).
    family: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class SessionSnapshot:
    """A session's state as of ``cursor``, sent in a ``resync``."""

    cursor: int
    data: JsonObject


class CommandHandler(abc.ABC):
    """What the daemon implements. Raise ``ApiCommandError(code, message)`` for a typed failure;
    any other exception becomes ``internal`` (logged, never sent)."""

    @abc.abstractmethod
    async def handle(self, client: ClientInfo, command: Command) -> Any:
        """Run one command; the return value (JSON-serializable) is the response's result."""

    async def snapshot(self, client: ClientInfo, session: str) -> SessionSnapshot | None:
        """A fresh snapshot for a client that fell behind; None makes it re-attach instead."""
        return None

    async def client_disconnected(self, client: ClientInfo) -> None:
        """Called once per connection that completed the handshake, after it is gone."""
        return None

    def ancestors(self, session: str) -> Sequence[str]:
        """The sessions above ``session`` (parent first): clients attached to one of them with
        ``family`` get its events. Called for each broadcast while such clients exist."""
        return ()

    def journal_path(self) -> Path | None:
        """Where the idempotency journal persists (read at start, under the socket lock);
        None keeps it in memory."""
        return None


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_MESSAGE_CHARS else text[:MAX_ERROR_MESSAGE_CHARS] + "…"


def _error_line(code: str, message: str) -> bytes:
    return encode_message(ErrorMessage(code=code, message=_truncate(message)))


def _failure_line(command_id: str, code: str, message: str) -> bytes:
    response = Response(
        command_id=command_id, ok=False, error=ErrorInfo(code=code, message=_truncate(message))
    )
    return encode_message(response)


def _uncertain_line(command_id: str) -> bytes:
    """The answer to a journaled command whose run ended with the daemon, not with an answer."""
    msg = "the daemon stopped while this command ran; its effect is uncertain"
    return _failure_line(command_id, E_SHUTTING_DOWN, msg)


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False)[:MAX_VALIDATION_ERRORS_SHOWN]:
        where = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - MAX_VALIDATION_ERRORS_SHOWN
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def _peer_credentials(writer: asyncio.StreamWriter) -> tuple[int | None, int | None, int | None]:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        # Not Linux: the 0700 directory is then the only guard (documented in docs/protocol.md).
        return None, None, None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(_PEERCRED_FORMAT))
    pid, uid, gid = struct.unpack(_PEERCRED_FORMAT, raw)
    return pid, uid, gid


class _Connection:
    def __init__(
        self,
        info: ClientInfo,
        lines: LineReader,
        writer: asyncio.StreamWriter,
        outbox: Outbox,
    ):
        self.info = info
        self.lines = lines
        self.writer = writer
        self.outbox = outbox
        self.inflight = asyncio.Semaphore(MAX_INFLIGHT_PER_CLIENT)
        self.tasks: set[asyncio.Task[None]] = set()  # this connection's running commands

    def drop(self) -> None:
        """Disconnect now, discarding anything unsent (the client is not reading it anyway)."""
        self.outbox.close()
        self.outbox.clear()
        # abort(), not close(): close() would wait to flush a buffer the client never reads.
        self.writer.transport.abort()


class ControlServer:
    """``async with ControlServer(path, handler) as server:`` serves until the block exits."""

    def __init__(
        self,
        socket_path: Path,
        handler: CommandHandler,
        *,
        server_version: str = "",
        capabilities: Iterable[str] = SERVER_CAPABILITIES,
        allowed_uids: Iterable[int] | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        queue_max_messages: int = CLIENT_QUEUE_MAX_MESSAGES,
        queue_max_bytes: int = CLIENT_QUEUE_MAX_BYTES,
        queue_overflow_limit: int = QUEUE_OVERFLOW_LIMIT,
        journal_max_entries: int = JOURNAL_MAX_ENTRIES,
        journal_ttl_s: float = JOURNAL_TTL_S,
    ):
        server_version = server_version or package_version()
        self.socket_path = Path(socket_path)
        self._handler = handler
        self._server_version = server_version
        self._capabilities = frozenset(capabilities)
        self._allowed_uids = frozenset(allowed_uids or {os.geteuid()})
        self._handshake_timeout = handshake_timeout_s
        self._queue_limits = (queue_max_messages, queue_max_bytes, queue_overflow_limit)
        self.journal = CommandJournal(max_entries=journal_max_entries, ttl_s=journal_ttl_s)
        self._server: asyncio.Server | None = None
        self._lock_fd: int | None = None
        self._socket_ino: int | None = None
        self._conn_ids = itertools.count(1)
        self._connections: dict[int, _Connection] = {}
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._command_tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._stats = {"accepted": 0, "refused_uid": 0, "dropped_slow": 0, "commands": 0}

    # ---------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> ControlServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        path = self.socket_path
        check_socket_path(path)  # socket_file.py: the path, its lock, a stale socket
        self._lock_fd = take_lock(path)
        try:
            journal_path = self._handler.journal_path()
            if journal_path is not None:
                # Under the lock: only the daemon that owns the socket reads or writes it.
                loaded = self.journal.open(journal_path, _uncertain_line)
                log.info("idempotency journal %s: %d entries", journal_path, loaded)
            await remove_stale_socket(path)
            self._server = await asyncio.start_unix_server(self._on_connect, path=str(path))
            # The directory is 0700, so nobody else could connect in between; 0600 is the
            # second fence in case the directory's mode is ever loosened.
            os.chmod(path, SOCKET_MODE)
            self._socket_ino = os.stat(path).st_ino
        except BaseException:
            self._release_lock()
            raise
        log.info("control socket listening on %s", path)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    async def close(self) -> None:
        """Stop accepting, close every connection, stop running commands, remove the socket."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections.values()):
            conn.outbox.put_reply(_error_line(E_SHUTTING_DOWN, "the daemon is shutting down"))
            conn.outbox.close()
        for task in [*self._command_tasks, *self._conn_tasks]:
            task.cancel()
        await asyncio.gather(*self._command_tasks, *self._conn_tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self.journal.close()
        unlink_if_same(self.socket_path, self._socket_ino)
        self._release_lock()

    # ---------------------------------------------------------------------------- daemon API

    @property
    def clients(self) -> list[ClientInfo]:
        return [c.info for c in self._connections.values() if c.info.client_id]

    def attached_clients(self, session: str) -> list[ClientInfo]:
        return [c.info for c in self._connections.values() if session in c.info.attached]

    def _targets(self, session: str, capability: str = CAP_EVENTS) -> list[_Connection]:
        """Connections with ``capability`` attached to ``session``, or with ``family`` to one
        of its ancestors."""
        conns = [c for c in self._connections.values() if capability in c.info.capabilities]
        lineage: frozenset[str] = frozenset()
        if any(c.info.family for c in conns):
            try:
                lineage = frozenset(self._handler.ancestors(session))
            except Exception:
                log.exception("ancestors(%s) failed", session)
        return [
            c
            for c in conns
            if session in c.info.attached or (lineage and not lineage.isdisjoint(c.info.family))
        ]

    def broadcast_transient(
        self, session: str, event: JsonObject, *, after: int | None = None
    ) -> int:
        """Queue a ``stream`` message for every client with the ``stream`` capability that
        ``broadcast`` would reach; never blocks, never resyncs nor disconnects: a client whose
        queue is too full just misses it. ``after``: the cursor of the session's newest durable
        event when ``event`` was emitted. Returns the number of clients it was queued for."""
        targets = self._targets(session, CAP_STREAM)
        if not targets:
            return 0
        try:
            data = encode_message(Stream(session=session, event=event, after=after))
        except FrameError:
            return 0  # a delta over the line cap: the durable event carries the whole text
        return sum(1 for conn in targets if conn.outbox.put_transient(session, data))

    def broadcast(self, session: str, cursor: int, event: JsonObject) -> int:
        """Queue ``event`` for every client attached to ``session``; never blocks.

        Returns the number of clients it was queued for. A client whose queue overflowed twice
        without draining is disconnected here.
        """
        targets = self._targets(session)
        if not targets:
            return 0
        data: bytes | None
        try:
            data = encode_message(Event(session=session, cursor=cursor, event=event))
        except FrameError:
            # Too large for a line: attached clients resync and read the state another way.
            log.warning("event %s/%d exceeds the line cap; sending resync", session, cursor)
            data = None
        for conn in targets:
            if not conn.outbox.put_event(session, data):
                log.warning(
                    "client %s (conn %d) fell too far behind; disconnecting",
                    conn.info.client_id,
                    conn.info.conn_id,
                )
                self._stats["dropped_slow"] += 1
                conn.drop()
        return len(targets)

    def outbox_statistics(self, client: ClientInfo) -> dict[str, int]:
        """One client's queue: messages and bytes waiting, events dropped, resyncs queued."""
        conn = self._connections.get(client.conn_id)
        if conn is None:
            return {"messages": 0, "bytes": 0, "dropped_events": 0, "resyncs": 0}
        box = conn.outbox
        return {
            "messages": len(box),
            "bytes": box.buffered_bytes,
            "dropped_events": box.dropped_events,
            "dropped_transients": box.dropped_transients,
            "resyncs": box.resyncs,
        }

    def statistics(self) -> dict[str, int]:
        return {
            **self._stats,
            "connections": len(self._connections),
            "queued_messages": sum(len(c.outbox) for c in self._connections.values()),
            "queued_bytes": sum(c.outbox.buffered_bytes for c in self._connections.values()),
            "commands_running": len(self._command_tasks),
            "journal_entries": len(self.journal),
            "journal_hits": self.journal.hits,
        }

    # ---------------------------------------------------------------------------- connections

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            if not self._closing:
                raise
        except Exception:
            # One client's failure is that client's: log it and keep serving the others.
            log.exception("control connection failed")
        finally:
            self._conn_tasks.discard(task)
            if self._closing:
                writer.transport.abort()  # a non-reading client must not hold shutdown up
            else:
                writer.close()  # flushes what is left for a client that half-closed

    async def _farewell(self, writer: asyncio.StreamWriter, lines: LineReader, line: bytes) -> None:
        """Send one last line, then close without losing it.

        Closing a Unix socket whose receive queue still holds the peer's bytes (its hello, say)
        resets the connection, and the peer may then never read our error. So: send, half-close,
        and swallow what the peer still sends until it closes too, for at most
        ``FAREWELL_TIMEOUT_S``.
        """
        try:
            writer.write(line)
            async with asyncio.timeout(FAREWELL_TIMEOUT_S):
                await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
                while await lines.read_line() is not None:
                    pass
        except (OSError, TimeoutError):
            pass
        writer.close()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        lines = LineReader(reader)
        pid, uid, gid = _peer_credentials(writer)
        info = ClientInfo(conn_id=next(self._conn_ids), pid=pid, uid=uid, gid=gid)
        if uid is not None and uid not in self._allowed_uids:
            self._stats["refused_uid"] += 1
            log.warning("refused control connection from uid %s (pid %s)", uid, pid)
            msg = f"uid {uid} may not use this daemon's socket"
            await self._farewell(writer, lines, _error_line(E_PERMISSION_DENIED, msg))
            return
        if self._closing:
            await self._farewell(
                writer, lines, _error_line(E_SHUTTING_DOWN, "the daemon is stopping")
            )
            return
        max_messages, max_bytes, overflow_limit = self._queue_limits
        outbox = Outbox(
            max_messages=max_messages, max_bytes=max_bytes, overflow_limit=overflow_limit
        )
        conn = _Connection(info, lines, writer, outbox)
        if not await self._handshake(conn):
            return
        self._stats["accepted"] += 1
        self._connections[info.conn_id] = conn
        try:
            async with asyncio.TaskGroup() as tg:
                writer_task = tg.create_task(self._write_loop(conn))
                await self._read_loop(conn)
                await self._finish_after_eof(conn, writer_task)
        finally:
            self._connections.pop(info.conn_id, None)
            outbox.close()
            try:
                await self._handler.client_disconnected(info)
            except Exception:
                log.exception("client_disconnected handler failed")

    async def _finish_after_eof(self, conn: _Connection, writer_task: asyncio.Task[None]) -> None:
        """The client stopped sending. It may only have half-closed (``echo cmd | nc -U``) and
        still read, so its running commands get to answer, for at most ``EOF_FLUSH_TIMEOUT_S``;
        a client that is really gone makes the writer fail and ends this sooner."""
        conn.info.attached.clear()  # no new events for a client that said goodbye
        conn.info.family.clear()
        async with asyncio.timeout(EOF_FLUSH_TIMEOUT_S):
            with contextlib.suppress(TimeoutError):
                while conn.tasks and not writer_task.done():
                    await asyncio.wait({*conn.tasks, writer_task}, return_when="FIRST_COMPLETED")
                conn.outbox.close()
                await asyncio.wait({writer_task})
        if not writer_task.done():
            conn.drop()

    async def _handshake(self, conn: _Connection) -> bool:
        writer, lines = conn.writer, conn.lines
        try:
            async with asyncio.timeout(self._handshake_timeout):
                line = await lines.read_line()
        except TimeoutError:
            await self._farewell(
                writer, lines, _error_line(E_HANDSHAKE_TIMEOUT, "no hello received")
            )
            return False
        if line is None:
            return False
        if line is LINE_TOO_LONG:
            msg = f"line exceeds {MAX_LINE_BYTES} bytes"
            await self._farewell(writer, lines, _error_line(E_LINE_TOO_LONG, msg))
            return False
        try:
            obj = decode_line(line)
        except FrameError as exc:
            await self._farewell(writer, lines, _error_line(exc.code, exc.message))
            return False
        if obj.get("type") != "hello":
            msg = "the first message must be hello"
            await self._farewell(writer, lines, _error_line(E_HANDSHAKE_REQUIRED, msg))
            return False
        try:
            hello = Hello.model_validate(obj)
        except ValidationError as exc:
            await self._farewell(
                writer, lines, _error_line(E_INVALID_COMMAND, _validation_summary(exc))
            )
            return False
        if hello.protocol_version != PROTOCOL_VERSION:
            msg = version_mismatch_message(hello.protocol_version, PROTOCOL_VERSION)
            await self._farewell(writer, lines, _error_line(E_VERSION_MISMATCH, msg))
            return False
        conn.info.client_id = hello.client_id
        conn.info.capabilities = self._capabilities & frozenset(hello.capabilities)
        welcome = Welcome(
            protocol_version=PROTOCOL_VERSION,
            server_version=self._server_version,
            capabilities=sorted(conn.info.capabilities),
        )
        conn.outbox.put_reply(encode_message(welcome))
        return True

    async def _write_loop(self, conn: _Connection) -> None:
        writer = conn.writer
        while (item := await conn.outbox.get()) is not None:
            data = item.data
            if item.kind is ItemKind.RESYNC:
                data = await self._resync_line(conn.info, item.session)
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                # The client went away; the reader sees EOF and ends the connection.
                conn.drop()
                return

    async def _resync_line(self, client: ClientInfo, session: str) -> bytes:
        snap: SessionSnapshot | None = None
        try:
            async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
                snap = await self._handler.snapshot(client, session)
        except Exception:
            log.exception("snapshot of %s for resync failed; client will re-attach", session)
        if snap is not None:
            with contextlib.suppress(FrameError, PydanticSerializationError):
                return encode_message(
                    Resync(session=session, cursor=snap.cursor, snapshot=snap.data)
                )
            log.warning("snapshot of %s too large or not JSON; resync without it", session)
        return encode_message(Resync(session=session))

    async def _read_loop(self, conn: _Connection) -> None:
        while True:
            # A client that sends commands but never reads the answers throttles only itself.
            await conn.outbox.wait_for_space()
            if conn.outbox.closed:
                return
            try:
                line = await conn.lines.read_line()
            except OSError as exc:
                if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                    log.warning("reading control connection failed: %s", exc)
                return
            if line is None:
                return
            if line is LINE_TOO_LONG:
                msg = f"line exceeds {MAX_LINE_BYTES} bytes; the rest of it is discarded"
                conn.outbox.put_reply(_error_line(E_LINE_TOO_LONG, msg))
                continue
            if not line.strip():
                continue  # blank lines are tolerated (keep-alives, "\r\n" endings)
            reply = self._parse_command(conn, line)
            if isinstance(reply, bytes):
                conn.outbox.put_reply(reply)
                continue
            await conn.inflight.acquire()
            task = asyncio.create_task(self._run_command(conn, reply))
            self._command_tasks.add(task)
            conn.tasks.add(task)
            task.add_done_callback(self._command_tasks.discard)
            task.add_done_callback(conn.tasks.discard)

    def _parse_command(self, conn: _Connection, line: bytes) -> Command | bytes:
        """The command in ``line``, or the error line to answer with."""
        try:
            obj = decode_line(line)
        except FrameError as exc:
            return _error_line(exc.code, exc.message)
        raw_id = obj.get("command_id")
        command_id = raw_id if isinstance(raw_id, str) and 0 < len(raw_id) <= MAX_ID_CHARS else None
        kind = obj.get("type")

        def fail(code: str, message: str) -> bytes:
            # Tie the error to the command when we can, so the client's request() resolves.
            if command_id is not None:
                return _failure_line(command_id, code, message)
            return _error_line(code, message)

        if kind == "hello":
            return fail(E_INVALID_COMMAND, "hello was already received on this connection")
        if not isinstance(kind, str) or kind not in COMMAND_TYPES:
            shown = repr(kind)[:MAX_ID_CHARS]
            return fail(E_UNKNOWN_COMMAND, f"unknown command type {shown}")
        try:
            command: Command = command_adapter.validate_python(obj)
        except ValidationError as exc:
            return fail(E_INVALID_COMMAND, f"{kind}: {_validation_summary(exc)}")
        if isinstance(command, Attach) and CAP_EVENTS not in conn.info.capabilities:
            return fail(E_INVALID_COMMAND, f"attach needs the {CAP_EVENTS!r} capability")
        return command

    async def _run_command(self, conn: _Connection, command: Command) -> None:
        # Runs in a server-level task, not the connection's: a mutating command keeps going if
        # its client disconnects, so its result lands in the journal for the retry.
        self._stats["commands"] += 1
        try:
            if command.MUTATING:
                line = await self._run_journaled(conn.info, command)
            else:
                line = await self._execute(conn.info, command)
            conn.outbox.put_reply(line)
        finally:
            conn.inflight.release()

    async def _run_journaled(self, client: ClientInfo, command: Command) -> bytes:
        key = (client.client_id, command.command_id)
        fingerprint = command_fingerprint(command)
        entry = self.journal.get(key)
        if entry is not None:
            if entry.fingerprint != fingerprint:
                msg = f"command_id {command.command_id!r} was already used for another command"
                return _failure_line(command.command_id, E_CONFLICT, msg)
            # The first run may still be going; wait for its answer instead of running twice.
            return await asyncio.shield(entry.result)
        entry = self.journal.reserve(key, fingerprint)
        try:
            line = await self._execute(client, command)
        except asyncio.CancelledError:
            # Only when the daemon stops mid-command: repeats must not wait forever, and they
            # must not be told it succeeded.
            self.journal.complete(key, entry, _uncertain_line(command.command_id))
            raise
        self.journal.complete(key, entry, line)
        return line

    async def _execute(self, client: ClientInfo, command: Command) -> bytes:
        attaching = command.session if isinstance(command, Attach) else None
        family = isinstance(command, Attach) and command.family
        if attaching is not None:
            # Attach before the handler runs so no event between its replay and our bookkeeping
            # is lost; clients drop events whose cursor they already have.
            client.attached.add(attaching)
            if family:
                client.family.add(attaching)
        try:
            result = await self._handler.handle(client, command)
        except ApiCommandError as exc:
            if attaching is not None:
                client.attached.discard(attaching)
                client.family.discard(attaching)
            return _failure_line(command.command_id, exc.code, exc.message)
        except Exception:
            if attaching is not None:
                client.attached.discard(attaching)
                client.family.discard(attaching)
            log.exception("handler failed on %s %s", command.type, command.command_id)
            return _failure_line(command.command_id, E_INTERNAL, "internal error; see daemon log")
        if isinstance(command, Detach):
            client.attached.discard(command.session)
            client.family.discard(command.session)
        try:
            return encode_message(Response(command_id=command.command_id, ok=True, result=result))
        except FrameError as exc:
            return _failure_line(command.command_id, E_RESULT_TOO_LARGE, exc.message)
        except (PydanticSerializationError, TypeError, ValueError):
            log.exception("result of %s %s is not JSON", command.type, command.command_id)
            return _failure_line(command.command_id, E_INTERNAL, "internal error; see daemon log")
