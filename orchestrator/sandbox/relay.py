"""Byte relays between a Unix socket and a TCP port (stdlib asyncio only).

The docker backend gives a session container no network at all (``network_mode=none``) and
connects it to the host through two Unix sockets in a bind-mounted directory:

- the kernel gateway listens on ``gateway.sock`` (the host's ``KernelGatewayClient`` connects
  to it), and
- the bus: nats-py speaks only TCP, so inside the container ``gateway_main --relay`` listens on
  ``127.0.0.1:4222`` and forwards each connection to ``nats.sock``, where the host side
  (``serve_unix_to_tcp``, run by the backend) forwards it to the orchestrator's NATS server on
  the host loopback.

So the only thing a kernel can open a connection to is NATS, where its per-session user can
publish only its own subjects. This module runs on both sides: keep it stdlib-only and cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["RELAY_BUFFER_BYTES", "serve_tcp_to_unix", "serve_unix_to_tcp"]

RELAY_BUFFER_BYTES = 64 * 1024
# Any user id in a container must be able to connect (the socket's directory guards access).
UNIX_SOCKET_MODE = 0o666


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_BUFFER_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()  # half-close: the other direction may still carry data


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    up_reader, up_writer = upstream
    collected = False  # the coroutine is being closed unfinished (its loop is gone): no awaits
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    except GeneratorExit:
        collected = True
        raise
    finally:
        for w in (writer, up_writer):
            w.close()
        if not collected:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    await w.wait_closed()


async def serve_unix_to_tcp(
    socket_path: Path, target: Callable[[], tuple[str, int] | None]
) -> asyncio.Server:
    """Listen on ``socket_path``; relay every connection to ``target()`` (host, port), looked up
    per connection (a pooled sandbox learns its session's bus only when it is assigned); a
    connection is refused while ``target()`` is None."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = target()
        try:
            if address is None:
                raise ConnectionRefusedError
            upstream = await asyncio.open_connection(*address)
        except OSError:
            writer.close()
            return
        await _splice(reader, writer, upstream)

    with contextlib.suppress(FileNotFoundError):
        socket_path.unlink()
    server = await asyncio.start_unix_server(handle, path=str(socket_path))
    os.chmod(socket_path, UNIX_SOCKET_MODE)
    return server


async def serve_tcp_to_unix(host: str, port: int, socket_path: Path) -> asyncio.Server:
    """Listen on ``host:port``; relay every connection to the Unix socket ``socket_path``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await asyncio.open_unix_connection(str(socket_path))
        except OSError:
            writer.close()
            return
        await _splice(reader, writer, upstream)

    return await asyncio.start_server(handle, host, port)
