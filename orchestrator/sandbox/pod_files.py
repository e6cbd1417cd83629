"""The host's client of a gateway's files endpoint (``gateway_files.py``): push a directory
into a sandbox, pull one out.

It talks to the gateway's base URL with its token, so it works the same whether the gateway is
reached at a pod's IP or through a port-forward. Both directions stream: a tar is packed by a
thread into a pipe whose other end is the request body (``push``), or the response body is
written into a pipe a thread unpacks from (``pull``); nothing is spooled on disk and memory
stays at a few chunks. A refused or failed transfer is one ``SandboxError`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import httpx

from orchestrator.errors import SandboxError
from orchestrator.sandbox.file_tar import FILES_MAX_BYTES, FILES_PATH, pack, unpack

__all__ = ["FILES_IDLE_TIMEOUT_S", "PodFiles"]

# How long a transfer may wait for its next chunk (a big tree is packed as it is sent).
FILES_IDLE_TIMEOUT_S: Final = 120.0
CHUNK_BYTES: Final = 1024**2
REASON_MAX_CHARS: Final = 300


def _pack_into(source: Path, fd: int, max_bytes: int) -> int:
    with os.fdopen(fd, "wb") as out:
        return pack(source, out, max_bytes=max_bytes)


def _unpack_from(fd: int, dest: Path, max_bytes: int) -> int:
    with os.fdopen(fd, "rb") as stream:
        try:
            return unpack(stream, dest, max_bytes=max_bytes)
        finally:
            while stream.read(CHUNK_BYTES):  # the rest, so the writer is never stuck
                pass


class PodFiles:
    """Files in and out of the sandbox whose gateway is at ``url`` (token ``token``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        max_bytes: int = FILES_MAX_BYTES,
        idle_timeout_s: float = FILES_IDLE_TIMEOUT_S,
    ):
        self.url = url
        self.token = token
        self.max_bytes = max_bytes
        self.idle_timeout_s = idle_timeout_s

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"token {self.token}"},
            trust_env=False,
            timeout=self.idle_timeout_s,
        )

    def _failed(self, what: str, status: int, body: bytes) -> SandboxError:
        reason = body.decode(errors="replace").strip()[:REASON_MAX_CHARS]
        return SandboxError(f"{what}: the sandbox answered HTTP {status} {reason}".rstrip())

    async def push(
        self,
        source: Path,
        root: str,
        path: str = ".",
        *,
        clear: bool = False,
        read_only: bool = False,
    ) -> None:
        """Put ``source`` (a directory's contents, or one file) into ``root/path`` inside;
        ``clear`` empties that directory first, ``read_only`` takes the write bits off."""
        what = f"copying {source} into the sandbox's {root}/{path}"
        read_fd, write_fd = os.pipe()
        packing = asyncio.ensure_future(
            asyncio.to_thread(_pack_into, source, write_fd, self.max_bytes)
        )
        reader = os.fdopen(read_fd, "rb")

        async def body() -> AsyncIterator[bytes]:
            while chunk := await asyncio.to_thread(reader.read1, CHUNK_BYTES):
                yield chunk

        params = {"root": root, "path": path}
        if clear:
            params["clear"] = "1"
        if read_only:
            params["read_only"] = "1"
        try:
            async with self._client() as http:
                response = await http.put(FILES_PATH, params=params, content=body())
        except httpx.HTTPError as exc:
            raise SandboxError(f"{what}: {exc or type(exc).__name__}") from exc
        finally:
            reader.close()  # a packer still writing gets EPIPE and stops
            await asyncio.wait({packing})
        packed = packing.exception()
        if isinstance(packed, SandboxError):  # e.g. too large: the body was cut short for it
            raise packed
        if response.status_code >= httpx.codes.BAD_REQUEST:
            raise self._failed(what, response.status_code, response.content)
        if packed is not None:
            raise SandboxError(f"{what}: {packed}") from packed

    async def pull(self, root: str, path: str, dest: Path) -> bool:
        """Unpack ``root/path`` from inside into the directory ``dest`` (made when missing);
        False when it does not exist there."""
        what = f"copying the sandbox's {root}/{path} to {dest}"
        dest.mkdir(parents=True, exist_ok=True)
        params = {"root": root, "path": path}
        try:
            async with self._client() as http, http.stream("GET", FILES_PATH, params=params) as r:
                if r.status_code == httpx.codes.NOT_FOUND:
                    return False
                if r.status_code >= httpx.codes.BAD_REQUEST:
                    raise self._failed(what, r.status_code, await r.aread())
                await self._unpack_stream(r.aiter_bytes(CHUNK_BYTES), dest)
        except httpx.HTTPError as exc:
            raise SandboxError(f"{what}: {exc or type(exc).__name__}") from exc
        return True

    async def _unpack_stream(self, chunks: AsyncIterator[bytes], dest: Path) -> None:
        read_fd, write_fd = os.pipe()
        unpacking = asyncio.ensure_future(
            asyncio.to_thread(_unpack_from, read_fd, dest, self.max_bytes)
        )
        writer = os.fdopen(write_fd, "wb")
        try:
            async for chunk in chunks:
                await asyncio.to_thread(writer.write, chunk)
        finally:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(writer.close)
            try:
                await unpacking
            except OSError as exc:
                raise SandboxError(f"unpacking into {dest}: {exc}") from exc
