"""The gateway's files endpoint: tar streams in and out of a sandbox over its own HTTP port.

A pod cannot mount the host, so the host moves files through the gateway it already talks to
(at the pod's IP, or through a port-forward: the same URL either way), with the gateway's own
token (``Authorization: token ...``, compared in constant time):

- ``GET  FILES_PATH?root=R&path=P``: a tar of ``R/P`` (a directory's contents, or one file or
  link); 404 when it does not exist.
- ``PUT  FILES_PATH?root=R&path=P[&clear=1][&read_only=1]``: the body, a tar, unpacked into
  the directory ``R/P`` (made when missing); ``clear`` empties it first, ``read_only`` takes
  the write bits off what was unpacked. 204 when done.

``R`` must be one of the roots the gateway was started with (``gateway_main --files-root``:
the workspace, home, the snapshot, skill and outputs directories a pod has); ``P`` is relative,
without ``..``, and every directory on the way must be a real directory under ``R`` (never a
symlink out). What a transfer carries and how it is unpacked safely is ``file_tar.py``; the
files of one transfer hold at most ``FILES_MAX_BYTES``; a refused transfer is a 400 with its
reason. The body streams straight into the unpacking thread (no spool file, bounded memory),
and a tar streams out as it is packed.

Imported by ``gateway_main`` only when ``--files-root`` is given; tornado is the gateway's own.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import queue
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from tornado import web

from orchestrator.errors import SandboxError
from orchestrator.sandbox.file_tar import (
    FILES_MAX_BYTES,
    FILES_PATH,
    clear_dir,
    pack,
    safe_relative,
    unpack,
)

__all__ = ["FilesHandler", "install_files_handler"]

TOKEN_PREFIX: Final = "token "
# The body of a PUT: the files' bytes plus the tar's headers and padding.
BODY_MAX_BYTES: Final = FILES_MAX_BYTES * 2
STREAM_CHUNK_BYTES: Final = 1024**2
QUEUE_CHUNKS: Final = 8  # chunks of a body waiting for the unpacking thread
TAR_CONTENT_TYPE: Final = "application/x-tar"
HTTP_NO_CONTENT: Final = 204
HTTP_BAD_REQUEST: Final = 400
HTTP_UNAUTHORIZED: Final = 401
HTTP_FORBIDDEN: Final = 403
HTTP_NOT_FOUND: Final = 404


class _Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def _resolve(root: Path, path: str, *, make: bool) -> Path:
    """``root/path`` through real directories only (made when ``make``)."""
    try:
        rel = safe_relative(path)
    except SandboxError as exc:
        raise _Refused(HTTP_BAD_REQUEST, str(exc)) from exc
    current = root
    for index, part in enumerate(rel.parts):
        current = current / part
        last = index == len(rel.parts) - 1
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            if not make:
                raise _Refused(HTTP_NOT_FOUND, f"{path} does not exist") from None
            current.mkdir()
            continue
        if stat.S_ISDIR(mode) or (last and not make):
            continue
        raise _Refused(HTTP_BAD_REQUEST, f"{path} is not a directory under its root")
    return current


class _QueueReader(io.RawIOBase):
    """The body's chunks as a file, read by the unpacking thread; None ends it."""

    def __init__(self, chunks: queue.Queue[bytes | None]):
        self.chunks = chunks
        self.pending = b""
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending and not self.ended:
            chunk = self.chunks.get()
            if chunk is None:
                self.ended = True
            else:
                self.pending = chunk
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size

    def drain(self) -> None:
        while not self.ended:
            self.ended = self.chunks.get() is None


class _HandlerWriter(io.RawIOBase):
    """A file whose writes (from the packing thread) are sent by the handler on its loop."""

    def __init__(self, handler: FilesHandler, loop: asyncio.AbstractEventLoop):
        self.handler = handler
        self.loop = loop

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        asyncio.run_coroutine_threadsafe(self.handler.send(chunk), self.loop).result()
        return len(chunk)


@web.stream_request_body
class FilesHandler(web.RequestHandler):
    """``GET``/``PUT`` of ``FILES_PATH`` (the module docstring)."""

    roots: tuple[str, ...]

    def initialize(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)
        self.chunks: queue.Queue[bytes | None] = queue.Queue(QUEUE_CHUNKS)
        self.job: asyncio.Future[int] | None = None
        self.ending: asyncio.Future[None] | None = None
        self.refusal: _Refused | None = None

    def _refuse(self, refused: _Refused) -> None:
        self.set_status(refused.status)
        self.finish({"reason": str(refused)})

    def _authorized(self) -> bool:
        expected = str(self.settings.get("kg_auth_token") or "")
        given = self.request.headers.get("Authorization", "")
        if not expected or not given.startswith(TOKEN_PREFIX):
            return False
        return hmac.compare_digest(given[len(TOKEN_PREFIX) :].encode(), expected.encode())

    def _root(self) -> Path:
        root = self.get_query_argument("root", "")
        if root not in self.roots:
            raise _Refused(HTTP_FORBIDDEN, f"{root!r} is not a root this sandbox shares")
        return Path(root)

    async def prepare(self) -> None:
        # A refused PUT is answered once its body was read: a sender still writing would see
        # a reset connection instead of the reason.
        try:
            if not self._authorized():
                raise _Refused(HTTP_UNAUTHORIZED, "a valid token is required")
            if self.request.method == "PUT":
                self._start_receiving()
        except _Refused as refused:
            if self.request.method != "PUT":
                self._refuse(refused)
            self.refusal = refused

    def _start_receiving(self) -> None:
        self.request.connection.set_max_body_size(BODY_MAX_BYTES)  # type: ignore[union-attr]
        target = _resolve(self._root(), self.get_query_argument("path", "."), make=True)
        clear = self.get_query_argument("clear", "") == "1"
        read_only = self.get_query_argument("read_only", "") == "1"
        reader = _QueueReader(self.chunks)

        def receive() -> int:
            try:
                if clear:
                    clear_dir(target)
                return unpack(io.BufferedReader(reader, STREAM_CHUNK_BYTES), target,
                              read_only=read_only)  # fmt: skip
            finally:
                reader.drain()  # a refused stream is read to its end: the sender is not stuck

        self.job = asyncio.get_running_loop().run_in_executor(None, receive)

    async def data_received(self, chunk: bytes) -> None:
        if self.job is not None:
            await asyncio.to_thread(self.chunks.put, chunk)

    async def put(self) -> None:
        if self.refusal is not None:
            self._refuse(self.refusal)
            return
        assert self.job is not None
        await asyncio.to_thread(self.chunks.put, None)
        try:
            await self.job
        except (SandboxError, OSError) as exc:
            self._refuse(_Refused(HTTP_BAD_REQUEST, str(exc)))
            return
        self.set_status(HTTP_NO_CONTENT)
        self.finish()

    def on_connection_close(self) -> None:
        # A body cut short: the unpacking thread is told it ended (it then fails on the
        # truncated tar and stops).
        if self.job is not None and not self.job.done():
            self.ending = asyncio.ensure_future(asyncio.to_thread(self.chunks.put, None))

    async def get(self) -> None:
        try:
            source = _resolve(self._root(), self.get_query_argument("path", "."), make=False)
        except _Refused as refused:
            self._refuse(refused)
            return
        self.set_header("Content-Type", TAR_CONTENT_TYPE)
        loop = asyncio.get_running_loop()

        def send_all() -> None:
            with io.BufferedWriter(_HandlerWriter(self, loop), STREAM_CHUNK_BYTES) as out:
                pack(source, out)

        await loop.run_in_executor(None, send_all)
        self.finish()

    async def send(self, chunk: bytes) -> None:
        self.write(chunk)
        await self.flush()


def install_files_handler(web_app: Any, roots: Sequence[str]) -> None:
    """Serve ``FILES_PATH`` for ``roots`` on the gateway's tornado application."""
    web_app.add_handlers(r".*", [(FILES_PATH, FilesHandler, {"roots": list(roots)})])
