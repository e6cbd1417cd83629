"""The control API client used by the CLI and the TUI.

    async with await ControlClient.connect() as client:
        await client.call("ping")
        await client.call("attach", session=sid)
        async for message in client.events():   # Event or Resync (or Stream, see below)
            ...

One background task reads the socket and routes each line: responses to the request waiting on
that ``command_id``, events and resyncs to a bounded queue that ``events()`` drains. If that queue
overflows (the consumer stopped draining it), queued events are replaced by a local ``Resync``
per session, the same contract as the server's: a consumer either sees every event in order or
is told to resync.

A client that lists ``CAP_STREAM`` among its capabilities (``capabilities=(*CLIENT_CAPABILITIES,
CAP_STREAM)``) also gets ``Stream`` items (text deltas and the like) in the same queue; they are
never stored anywhere, so when the queue overflows they are the first to go, without a resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from orchestrator.api.errors import (
    ApiCommandError,
    ConnectionClosed,
    DaemonNotRunning,
    DaemonUnresponsive,
    PermissionDenied,
    ProtocolMismatch,
    error_from_wire,
)
from orchestrator.api.framing import (
    LINE_TOO_LONG,
    FrameError,
    LineReader,
    decode_line,
    encode_command,
    encode_object,
)
from orchestrator.api.messages import (
    ErrorMessage,
    Event,
    Response,
    Resync,
    Stream,
    Welcome,
    decode_server_message,
)
from orchestrator.api.socket_file import default_socket_path
from orchestrator.api.wire import (
    CLIENT_CAPABILITIES,
    E_INVALID_COMMAND,
    E_LINE_TOO_LONG,
    E_VERSION_MISMATCH,
    PROTOCOL_VERSION,
    version_mismatch_message,
)

if TYPE_CHECKING:
    from orchestrator.api.protocol import Command

__all__ = [
    "CLIENT_EVENT_QUEUE_MAX",
    "CONNECT_TIMEOUT_S",
    "ControlClient",
    "request_sync",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 5.0
CLIENT_EVENT_QUEUE_MAX: Final = 10_000
_CLIENT_ID_PREFIX: Final = "c"
HELLO_TYPE: Final = "hello"  # the first line of every connection (protocol.Hello)
_RANDOM_HEX_CHARS: Final = 12


class ControlClient:
    """A connected, handshaken client. Build it with ``await ControlClient.connect(...)``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        client_id: str,
        welcome: Welcome,
        lines: LineReader,
    ):
        self.client_id = client_id
        self.welcome = welcome
        self._writer = writer
        self._lines = lines
        self._send_lock = asyncio.Lock()
        self._pending: dict[str, asyncio.Future[Response]] = {}
        self._events: deque[Event | Resync | Stream] = deque()
        self._events_ready = asyncio.Event()
        # Command ids: unique within this process's use of the client id; a retry after a
        # reconnect must reuse the id it sent before, which is why callers may pass their own.
        self._id_prefix = uuid.uuid4().hex[:_RANDOM_HEX_CHARS]
        self._ids = itertools.count(1)
        self._closed = False
        self.last_error: ErrorMessage | None = None
        self._reader_task = asyncio.create_task(self._read_loop(), name="control-client-reader")

    # ---------------------------------------------------------------------------- connecting

    @classmethod
    async def connect(
        cls,
        socket_path: Path | str | None = None,
        *,
        client_id: str | None = None,
        capabilities: Iterable[str] = CLIENT_CAPABILITIES,
        timeout: float = CONNECT_TIMEOUT_S,
    ) -> ControlClient:
        path = Path(socket_path) if socket_path is not None else default_socket_path()
        client_id = client_id or f"{_CLIENT_ID_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise DaemonNotRunning(f"no daemon is listening on {path}; start it first") from None
        except PermissionError:
            raise PermissionDenied(f"no permission to connect to {path}") from None
        except TimeoutError:
            raise DaemonNotRunning(f"the daemon on {path} did not accept in {timeout}s") from None
        lines = LineReader(reader)
        try:
            async with asyncio.timeout(timeout):
                welcome = await cls._handshake(writer, lines, client_id, capabilities)
        except TimeoutError:
            writer.close()
            raise DaemonUnresponsive(
                f"the daemon on {path} did not answer within {timeout:.0f} s; it may be "
                "stuck (see its log, or restart it with prime-agent daemon stop --force)"
            ) from None
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, client_id=client_id, welcome=welcome, lines=lines)

    @staticmethod
    async def _handshake(
        writer: asyncio.StreamWriter,
        lines: LineReader,
        client_id: str,
        capabilities: Iterable[str],
    ) -> Welcome:
        hello = {
            "type": HELLO_TYPE,
            "protocol_version": PROTOCOL_VERSION,
            "client_id": client_id,
            "capabilities": list(capabilities),
        }
        try:
            writer.write(encode_object(hello, HELLO_TYPE))
            await writer.drain()
            line = await lines.read_line()
        except OSError as exc:
            raise ConnectionClosed(f"the daemon dropped the connection: {exc}") from None
        if line is None or line is LINE_TOO_LONG:
            raise ConnectionClosed("the daemon closed the connection during the handshake")
        try:
            message = decode_server_message(decode_line(line))
        except ValueError:  # FrameError is one too
            raise ConnectionClosed("the daemon answered the handshake with garbage") from None
        if isinstance(message, ErrorMessage):
            raise error_from_wire(message.code, message.message)
        if not isinstance(message, Welcome):
            raise ConnectionClosed(f"expected welcome, got {message.type}")
        if message.protocol_version != PROTOCOL_VERSION:
            msg = version_mismatch_message(PROTOCOL_VERSION, message.protocol_version)
            raise ProtocolMismatch(E_VERSION_MISMATCH, msg)
        return message

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        self._fail_pending("the client was closed")

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(self.welcome.capabilities)

    @property
    def closed(self) -> bool:
        return self._closed or self._reader_task.done()

    # ---------------------------------------------------------------------------- requests

    def new_command_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids)}"

    def command(
        self, command_type: str, /, *, command_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """The command ``command_type`` as the daemon reads it: ``fields`` as given, those that
        are None left out (None is every optional field's default, ``test_api_protocol``
        checks it), and a new ``command_id`` unless one is given."""
        body = {k: v for k, v in fields.items() if v is not None}
        return {"type": command_type, "command_id": command_id or self.new_command_id(), **body}

    async def call(
        self, command_type: str, /, *, command_id: str | None = None, **fields: Any
    ) -> Any:
        """Run the command ``command_type`` with ``fields`` (see ``command`` and ``request``).

        The client sends it as plain data and the daemon validates it: a bad field comes back
        as ``invalid_command`` with the daemon's one-line summary. So this path needs no
        pydantic (docs/cli.md, "Start-up cost")."""
        return await self.request(self.command(command_type, command_id=command_id, **fields))

    async def request(
        self, command: Command | Mapping[str, Any], *, timeout: float | None = None
    ) -> Any:
        """Send ``command`` (a model of ``protocol.py``, or a body from ``command``), wait for
        its response; the result, or the error of its code (``error_from_wire``:
        ``ApiCommandError`` for every code a command fails with)."""
        if self.closed:
            raise ConnectionClosed(self._closed_reason())
        try:
            if isinstance(command, Mapping):
                command_id = str(command["command_id"])
                line = encode_object(command, str(command["type"]))
            else:
                command_id = command.command_id
                line = encode_command(command)
        except FrameError as exc:
            raise ApiCommandError(E_LINE_TOO_LONG, exc.message) from None
        except (TypeError, ValueError) as exc:  # a value JSON cannot hold (the daemon's check)
            raise ApiCommandError(E_INVALID_COMMAND, f"{command_type_of(command)}: {exc}") from None
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        # Mark a failure as seen even if the caller timed out and nobody awaits the future.
        future.add_done_callback(_consume_exception)
        # A repeat of an id still in flight shares the first request's future.
        future = self._pending.setdefault(command_id, future)
        try:
            async with self._send_lock:
                self._writer.write(line)
                await self._writer.drain()
        except OSError as exc:
            self._pending.pop(command_id, None)
            raise ConnectionClosed(f"lost the daemon connection: {exc}") from None
        try:
            async with asyncio.timeout(timeout):
                response = await asyncio.shield(future)
        finally:
            if future.done():
                self._pending.pop(command_id, None)
        if response.error is not None:
            raise error_from_wire(response.error.code, response.error.message)
        return response.result

    # ---------------------------------------------------------------------------- events

    async def events(self) -> AsyncIterator[Event | Resync | Stream]:
        """Events and resyncs (and stream messages, when asked for) in arrival order, until
        the connection ends."""
        while (item := await self.next_event()) is not None:
            yield item

    async def next_event(self) -> Event | Resync | Stream | None:
        """The next event or resync; None once the connection has ended and none is left.

        Cancelling a waiting call loses nothing: an item is taken only when it is returned.
        """
        while not self._events:
            if self.closed:
                return None
            self._events_ready.clear()
            await self._events_ready.wait()
        return self._events.popleft()

    def next_event_nowait(self) -> Event | Resync | Stream | None:
        """An event already received, or None. Everything the daemon sent before a response
        is queued by the time that response's request returns (one reader, in order)."""
        return self._events.popleft() if self._events else None

    def _queue_event(self, message: Event | Resync | Stream) -> None:
        if len(self._events) >= CLIENT_EVENT_QUEUE_MAX:
            # Stream items are the cheapest loss (nothing is owed for them): a new one goes,
            # and an event makes room by dropping the queued ones first.
            if isinstance(message, Stream):
                return
            self._events = deque(i for i in self._events if not isinstance(i, Stream))
        if len(self._events) >= CLIENT_EVENT_QUEUE_MAX:
            # The consumer stopped draining: drop the queued events and say so per session.
            kept: deque[Event | Resync | Stream] = deque()
            sessions: dict[str, None] = {}
            for item in self._events:
                if isinstance(item, Event):
                    sessions[item.session] = None
                else:
                    kept.append(item)
            sessions[message.session] = None
            marked = {item.session for item in kept}
            kept.extend(Resync(session=s) for s in sessions if s not in marked)
            self._events = kept
        else:
            self._events.append(message)
        self._events_ready.set()

    # ---------------------------------------------------------------------------- reading

    async def _read_loop(self) -> None:
        try:
            while (line := await self._lines.read_line()) is not None:
                if line is LINE_TOO_LONG:
                    log.warning("daemon sent a line over the cap; dropped")
                    continue
                try:
                    message = decode_server_message(decode_line(line))
                except ValueError as exc:  # FrameError is one too
                    log.warning("daemon sent an unreadable line: %s", exc)
                    continue
                if isinstance(message, Response):
                    future = self._pending.get(message.command_id)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif isinstance(message, Event | Resync | Stream):
                    self._queue_event(message)
                elif isinstance(message, ErrorMessage):
                    self.last_error = message
                    log.warning("daemon error %s: %s", message.code, message.message)
        except OSError as exc:
            log.debug("control connection lost: %s", exc)
        finally:
            self._fail_pending(self._closed_reason())
            self._events_ready.set()

    def _closed_reason(self) -> str:
        if self.last_error is not None:
            error = self.last_error
            return f"the daemon closed the connection ({error.code}: {error.message})"
        return "the daemon closed the connection"

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(reason))
        self._pending.clear()


def command_type_of(command: Command | Mapping[str, Any]) -> str:
    """The ``type`` of a command, model or body."""
    if isinstance(command, Mapping):
        return str(command.get("type"))
    return str(getattr(command, "type", None))


def _consume_exception(future: asyncio.Future[Response]) -> None:
    if not future.cancelled():
        future.exception()


def request_sync(
    command_type: str,
    /,
    *,
    socket_path: Path | str | None = None,
    timeout: float = CONNECT_TIMEOUT_S,
    **fields: Any,
) -> Any:
    """One command from synchronous code (the CLI): connect, run, close."""

    async def once() -> Any:
        async with await ControlClient.connect(socket_path, timeout=timeout) as client:
            return await client.call(command_type, **fields)

    return asyncio.run(once())
