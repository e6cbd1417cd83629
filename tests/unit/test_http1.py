"""orchestrator/models/http1.py against a real loopback server that answers as each case needs.

Every case is one scripted reply (raw bytes, so the framing is exactly what is written); the
server records each request it read and on which connection, so reuse is observable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from orchestrator.models import http1

REQUEST_HEAD_END = b"\r\n\r\n"


@dataclass
class Seen:
    request: bytes
    connection: int


@dataclass
class Server:
    """Answers the k-th request with ``replies[k]`` (bytes, or a callable that gets the writer)."""

    replies: list[bytes | Callable[[asyncio.StreamWriter], None]]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(REQUEST_HEAD_END)
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.seen.append(Seen(head + body, number))
                reply = self.replies[len(self.seen) - 1]
                if callable(reply):
                    reply(writer)
                    return
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., object]]:
    started: list[Server] = []

    async def start(*replies: bytes | Callable[[asyncio.StreamWriter], None]) -> Server:
        server = Server(list(replies))
        server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0)
        started.append(server)
        return server

    yield start
    http1.close_pool()
    for server in started:
        assert server.server is not None
        server.server.close()
        await server.server.wait_closed()


def _sized(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def _chunked(*pieces: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for piece in pieces:
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


async def test_a_sized_reply_is_read_and_its_connection_kept(serve: Callable[..., object]) -> None:
    server = await serve(_sized(b'{"a": 1}'), _sized(b"second"))  # type: ignore[misc]
    first = await http1.pool().post(server.url, b'{"q": 1}', {"Authorization": "Bearer k"})
    assert first.status == 200
    assert await first.read() == b'{"a": 1}'
    second = await http1.pool().post(server.url, b"{}", {})
    assert await second.read() == b"second"
    assert [s.connection for s in server.seen] == [1, 1]  # the second rode the first's socket
    request = server.seen[0].request
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in request
    assert b"\r\nContent-Length: 8\r\n" in request
    assert request.endswith(b'\r\n\r\n{"q": 1}')


async def test_a_chunked_body_is_joined_across_chunks(serve: Callable[..., object]) -> None:
    server = await serve(  # type: ignore[misc]
        _chunked(b"data: one\r\nda", b"ta: two\n", b"tail"), _sized(b"again")
    )
    response = await http1.pool().post(server.url, b"{}", {})
    assert await response.read() == b"data: one\r\ndata: two\ntail"
    again = await http1.pool().post(server.url, b"{}", {})
    assert await again.read() == b"again"
    assert [s.connection for s in server.seen] == [1, 1]  # read to its end: kept


async def test_a_reply_that_asks_to_close_is_not_reused(serve: Callable[..., object]) -> None:
    server = await serve(  # type: ignore[misc]
        _sized(b"x", extra="Connection: close\r\n"), _sized(b"y")
    )
    assert await (await http1.pool().post(server.url, b"{}", {})).read() == b"x"
    assert await (await http1.pool().post(server.url, b"{}", {})).read() == b"y"
    assert [s.connection for s in server.seen] == [1, 2]


async def test_a_body_that_ends_with_the_connection(serve: Callable[..., object]) -> None:
    def close_after(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")

    server = await serve(close_after)  # type: ignore[misc]
    response = await http1.pool().post(server.url, b"{}", {})
    assert await response.read() == b"all of it"


async def test_a_stale_kept_connection_is_replaced_once(serve: Callable[..., object]) -> None:
    """The server closes the kept-alive socket after its first reply, unannounced: the next
    request goes out on it, finds it dead before any byte came back, and is sent again."""

    def answer_then_drop(writer: asyncio.StreamWriter) -> None:
        writer.write(_sized(b"first"))  # returning closes the socket

    server = await serve(answer_then_drop, _sized(b"again"))  # type: ignore[misc]
    assert await (await http1.pool().post(server.url, b"{}", {})).read() == b"first"
    second = await http1.pool().post(server.url, b"{}", {})
    assert await second.read() == b"again"
    assert [s.connection for s in server.seen] == [1, 2]


async def test_a_reply_cut_inside_its_body_fails_at_receive(serve: Callable[..., object]) -> None:
    def cut(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

    server = await serve(cut)  # type: ignore[misc]
    response = await http1.pool().post(server.url, b"{}", {})
    with pytest.raises(http1.HttpFailure) as caught:
        await response.read()
    assert caught.value.stage == "receive"


async def test_no_server_fails_at_connect() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(http1.HttpFailure) as caught:
        await http1.pool().post(f"http://127.0.0.1:{port}/v1", b"{}", {})
    assert caught.value.stage == "connect"
    http1.close_pool()


async def test_not_an_http_url_is_refused() -> None:
    with pytest.raises(http1.HttpFailure, match="not an http"):
        await http1.pool().post("ftp://example.invalid/x", b"{}", {})


async def test_an_error_status_body_is_readable(serve: Callable[..., object]) -> None:
    server = await serve(_sized(b'{"error": "no"}', status="429 Too Many Requests"))  # type: ignore[misc]
    response = await http1.pool().post(server.url, b"{}", {})
    assert response.status == 429
    assert await response.read() == b'{"error": "no"}'


async def test_a_released_unread_reply_closes_its_connection(
    serve: Callable[..., object],
) -> None:
    server = await serve(_sized(b"unread"), _sized(b"next"))  # type: ignore[misc]
    response = await http1.pool().post(server.url, b"{}", {})
    response.release()  # the body was never read: the socket cannot carry another request
    assert await (await http1.pool().post(server.url, b"{}", {})).read() == b"next"
    assert [s.connection for s in server.seen] == [1, 2]


CHUNKED_BODY_PIECES = [b"data: one\r\n", b"\r\n", b"data: " + b"x" * 300 + b"\n", b"tail"]


def _chunked_body(pieces: list[bytes], trailer: bytes = b"") -> bytes:
    out = b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in pieces)
    return out + b"0\r\n" + trailer + b"\r\n"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_chunked_decoding_is_the_same_however_the_bytes_arrive(size: int) -> None:
    raw = _chunked_body(CHUNKED_BODY_PIECES, trailer=b"X-Trailer: 1\r\n")
    body = http1._ChunkedBody()
    out = b"".join(body.feed(raw[i : i + size]) for i in range(0, len(raw), size))
    assert out == b"".join(CHUNKED_BODY_PIECES) and body.done and not body.extra


def test_chunked_bytes_after_the_end_make_the_connection_unusable() -> None:
    body = http1._ChunkedBody()
    assert body.feed(_chunked_body([b"a"]) + b"HTTP/1.1 200") == b"a"
    assert body.done and body.extra


@pytest.mark.parametrize("raw", [b"zz\r\nab\r\n", b"2\r\nabXY", b"1" * (http1.HEAD_LIMIT + 1)])
def test_bad_chunked_framing_fails_at_receive(raw: bytes) -> None:
    with pytest.raises(http1.HttpFailure) as caught:
        http1._ChunkedBody().feed(raw)
    assert caught.value.stage == "receive"


class _Writer:
    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def test_a_chunked_reply_that_arrived_is_taken_in_one_read() -> None:
    """Every chunk already in the stream's buffer is decoded by one read: no await per chunk
    (three per chunk was the largest cost of a streamed reply on the event loop)."""
    reader = asyncio.StreamReader()
    reader.feed_data(_chunked_body([b"data: %d\n\n" % i for i in range(50)]))
    calls: list[str] = []
    for name in ("read", "readuntil", "readexactly", "readline"):
        method = getattr(reader, name)

        async def counted(*args: object, _name: str = name, _method: object = method) -> bytes:
            calls.append(_name)
            return await _method(*args)  # type: ignore[operator, no-any-return]

        setattr(reader, name, counted)
    connection = http1._Connection(reader, _Writer())  # type: ignore[arg-type]
    headers = {"transfer-encoding": "chunked"}
    response = http1.Response(http1.Pool(), ("http", "h", 80), connection, 200, headers)
    pieces = [piece async for piece in response.chunks()]
    assert calls == ["read"]
    assert b"".join(pieces) == b"".join(b"data: %d\n\n" % i for i in range(50))
