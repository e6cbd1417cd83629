"""stdin and stdout as a protocol's own (``--mode acp``, ``--mode rpc``): the protocol writes
to a copy of fd 1, and fd 1 itself is pointed at stderr, so nothing printed by accident — a
library's warning, a stray ``print`` — can corrupt the stream a client parses."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Final

__all__ = ["STDIO_LIMIT_BYTES", "claim_stdout", "open_stdio"]

# The longest line read from the client (an embedded resource or an image can be large).
STDIO_LIMIT_BYTES: Final = 50 * 1024 * 1024


def claim_stdout() -> int:
    """A new descriptor for the real stdout; fd 1 becomes a copy of stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return protocol_fd


class _WriteProtocol(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """A write pipe's protocol with the flow control a ``StreamWriter`` drains on."""


async def open_stdio(protocol_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over stdin and the claimed stdout (both pipes or terminals)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STDIO_LIMIT_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = os.fdopen(protocol_fd, "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(_WriteProtocol, out)
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)
