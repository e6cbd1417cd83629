"""HTTP/1.1 over asyncio streams: POST a body, read the reply as it arrives, keep connections.

The lean model transport (openai_stream.py) makes one streamed POST per model call. Under 20
sessions in one daemon, httpx was the daemon's largest CPU cost per step: its pool walks every
connection on each request (with a readability probe per socket), and each read passes through
anyio's socket wrappers and h11 (docs/benchmarks.md, "Where a step's host CPU goes"). This
module does what that transport needs and nothing else:

- ``http`` and ``https`` (the system's default TLS context, the host name checked); no proxy
  variables, no ``.netrc``, no redirects: the endpoint is the one named;
- a reply body framed by ``Content-Length``, chunked transfer encoding, or the end of the
  connection; no compression asked for (``Accept-Encoding: identity``);
- a connection returns to its event loop's pool only after its reply was read to the end and
  the server did not ask to close it; a pooled connection the server has closed meanwhile is
  replaced once, before any byte of the reply arrived (the request never reached a handler).

Failures are one ``HttpFailure`` whose ``stage`` says whether no connection could be made
(``connect``) or the exchange broke off after the request went out (``receive``); the caller
turns it into its own terms. Timeouts are the caller's (``asyncio.timeout`` around each await).
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import AsyncIterator
from typing import Final, Literal
from urllib.parse import urlsplit

__all__ = ["HttpFailure", "Pool", "Response", "close_pool", "pool"]

CONNECT_TIMEOUT_S: Final = 30.0
READ_SIZE: Final = 65536
HEAD_LIMIT: Final = 65536  # status line and headers together
IDLE_PER_ORIGIN_MAX: Final = 256  # one per concurrently streaming session is plenty
HTTP_CONTINUE: Final = 100
HTTP_OK_MIN: Final = 200
NO_BODY_STATUSES: Final = frozenset({204, 304})
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
USER_AGENT: Final = "prime-agent"
CRLF: Final = b"\r\n"
HEAD_END: Final = b"\r\n\r\n"

Stage = Literal["connect", "receive"]
_Origin = tuple[str, str, int]  # scheme, host, port


class HttpFailure(Exception):
    """The exchange failed; ``stage`` says how far it got (see the module docstring)."""

    def __init__(self, stage: Stage, reason: str) -> None:
        super().__init__(reason)
        self.stage: Stage = stage
        self.reason = reason


class _Unanswered(Exception):
    """The connection broke before any byte of the reply (``Pool.post`` decides what it means)."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        """Still open both ways, as far as the loop knows without a syscall."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class Response:
    """A reply whose head was read; its body is read with ``read`` or ``chunks``.

    Invariant: ``_connection`` is set until the body was read to its end or ``release`` ran;
    ``release`` puts it back in the pool only when ``_complete`` and ``_reusable``.
    """

    def __init__(
        self,
        pool: Pool,
        origin: _Origin,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
    ) -> None:
        self.status = status
        self.headers = headers  # names lower-cased; a repeated header keeps its last value
        self._pool = pool
        self._origin = origin
        self._connection: _Connection | None = connection
        self._complete = False
        connection_header = headers.get("connection", "").lower()
        self._reusable = "close" not in connection_header
        self._length: int | None = None
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if status in NO_BODY_STATUSES:
            self._length = 0
        elif not self._chunked and "content-length" in headers:
            try:
                self._length = int(headers["content-length"])
            except ValueError:
                raise HttpFailure("receive", "the server sent a bad Content-Length") from None
        if self._length is None and not self._chunked:
            self._reusable = False  # the body ends with the connection

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive."""
        connection = self._connection
        if connection is None:
            return
        reader = connection.reader
        try:
            if self._chunked:
                body = _ChunkedBody()
                while not body.done:
                    data = await reader.read(READ_SIZE)
                    if not data:
                        raise HttpFailure("receive", "the reply broke off: the connection closed")
                    if piece := body.feed(data):
                        yield piece
                if body.extra:
                    self._reusable = False  # more than this reply came: not ours to guess
            elif self._length is not None:
                remaining = self._length
                while remaining:
                    piece = await reader.read(min(remaining, READ_SIZE))
                    if not piece:
                        raise HttpFailure("receive", "the connection closed inside the reply")
                    remaining -= len(piece)
                    yield piece
            else:
                while piece := await reader.read(READ_SIZE):
                    yield piece
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise HttpFailure("receive", f"the reply broke off: {_describe(exc)}") from exc
        self._complete = True
        self.release()

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    def release(self) -> None:
        """Done with this reply: keep the connection if it can carry another, else close it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._complete and self._reusable and connection.usable():
            self._pool.put(self._origin, connection)
        else:
            connection.close()


class _ChunkedBody:
    """Chunked transfer decoding of whatever the socket delivered, however it is cut.

    A streamed reply is one chunk per SSE event; reading each chunk's size line, its data and
    its CRLF as three awaits on the stream cost more of the event loop than the rest of the
    reply's handling (docs/benchmarks.md, "Where a step's host CPU goes"). Here one read takes
    every chunk that arrived, and what ends inside a chunk waits for the next read.
    """

    __slots__ = ("_buffer", "_left", "_state", "done", "extra")

    def __init__(self) -> None:
        self._buffer = b""
        self._state: Literal["size", "data", "data_end", "trailer"] = "size"
        self._left = 0  # bytes of the current chunk's data still to come
        self.done = False  # the last chunk and the trailers' blank line came
        self.extra = False  # bytes came after the end (the connection cannot be reused)

    def feed(self, data: bytes) -> bytes:
        """The body bytes ``data`` completes; raises ``HttpFailure`` on bad framing."""
        buf = self._buffer + data if self._buffer else data
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end and not self.done:
            if self._state == "data":
                take = min(self._left, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = "data_end"
            elif self._state == "data_end":
                if end - pos < len(CRLF):
                    break
                if buf[pos : pos + len(CRLF)] != CRLF:
                    raise HttpFailure("receive", "the server sent a chunk without its CRLF")
                pos += len(CRLF)
                self._state = "size"
            else:
                line_end = buf.find(CRLF, pos)
                if line_end < 0:
                    if end - pos > HEAD_LIMIT:
                        raise HttpFailure("receive", "the server sent a chunk line too long")
                    break
                line, pos = buf[pos:line_end], line_end + len(CRLF)
                if self._state == "trailer":
                    self.done = not line  # trailers end with a blank line
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HttpFailure("receive", "the server sent a bad chunk size") from None
                self._state, self._left = ("data", size) if size else ("trailer", 0)
        self._buffer = buf[pos:]
        self.extra = self.done and bool(self._buffer)
        return b"".join(out)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed"
    return str(exc) or type(exc).__name__


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest.partition(" ")[0]
    if not version.startswith("HTTP/") or not code.isdigit():
        raise HttpFailure("receive", f"not an HTTP reply: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


class Pool:
    """Kept-alive connections of one event loop, by origin (scheme, host, port)."""

    def __init__(self) -> None:
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    def put(self, origin: _Origin, connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= IDLE_PER_ORIGIN_MAX:
            connection.close()
        else:
            idle.append(connection)

    def _take(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.close()
        return None

    async def _open(self, origin: _Origin) -> _Connection:
        scheme, host, port = origin
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None, limit=HEAD_LIMIT
                )
        except TimeoutError:
            raise HttpFailure("connect", f"connecting to {host}:{port} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise HttpFailure("connect", f"{host}:{port}: {_describe(exc)}") from exc
        return _Connection(reader, writer)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Response:
        """Send ``body`` to ``url``; the reply once its head has arrived."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            raise HttpFailure("connect", f"not an http(s) URL: {url}")
        port = parts.port or DEFAULT_PORTS[scheme]
        origin = (scheme, parts.hostname, port)
        host = parts.netloc.rpartition("@")[2]
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        fields = {
            "Host": host,
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "identity",
            "Content-Type": "application/json",
            **headers,
            "Content-Length": str(len(body)),
        }
        request = (
            f"POST {target} HTTP/1.1\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in fields.items())
            + "\r\n"
        ).encode("latin-1") + body
        connection = self._take(origin)
        if connection is not None:
            try:
                return await self._exchange(origin, connection, request)
            except _Unanswered:
                pass  # the kept-alive connection was gone: once more, on a fresh one
        try:
            return await self._exchange(origin, await self._open(origin), request)
        except _Unanswered as exc:
            raise HttpFailure("receive", f"no reply from the server: {exc}") from exc

    async def _exchange(self, origin: _Origin, connection: _Connection, request: bytes) -> Response:
        """Write ``request`` and read the reply's head (``_Unanswered``: not one byte came)."""
        reader = connection.reader
        answered = False
        try:
            connection.writer.write(request)
            await connection.writer.drain()
            while True:
                head = await reader.readuntil(HEAD_END)
                answered = True
                status, headers = _parse_head(head[: -len(HEAD_END)])
                if not HTTP_CONTINUE <= status < HTTP_OK_MIN:
                    return Response(self, origin, connection, status, headers)
        except asyncio.IncompleteReadError as exc:
            connection.close()
            if answered or exc.partial:
                raise HttpFailure("receive", "the connection closed inside the reply") from exc
            raise _Unanswered("the connection closed") from exc
        except asyncio.LimitOverrunError as exc:
            connection.close()
            raise HttpFailure("receive", "the reply's headers are too long") from exc
        except OSError as exc:
            connection.close()
            if answered:
                raise HttpFailure("receive", _describe(exc)) from exc
            raise _Unanswered(_describe(exc)) from exc
        except BaseException:
            connection.close()  # a failure of ours, or cancelled (a timeout): not reusable
            raise

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pool] = weakref.WeakKeyDictionary()


def pool() -> Pool:
    """The running event loop's pool."""
    loop = asyncio.get_running_loop()
    found = _pools.get(loop)
    if found is None:
        found = _pools[loop] = Pool()
    return found


def close_pool() -> None:
    """Close the running loop's kept-alive connections (the next request opens new ones)."""
    found = _pools.pop(asyncio.get_running_loop(), None)
    if found is not None:
        found.close()
