"""The control socket's file on disk: its path check, its lock, a stale one's removal.

Split out of ``server.py``, which serves connections; this module only decides whether the
daemon may bind ``path`` (docs/protocol.md, "The socket"): the path fits ``AF_UNIX``, its
directory is private and ours, no other daemon holds the lock, and a socket file left behind
is replaced only when nothing answers on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from pathlib import Path
from typing import Final

from orchestrator.api.errors import DaemonAlreadyRunning, SocketPathError
from orchestrator.paths import Paths, ensure_private_dir

__all__ = [
    "LOCK_FILE_MODE",
    "LOCK_FILE_SUFFIX",
    "STALE_PROBE_TIMEOUT_S",
    "SUN_PATH_MAX_BYTES",
    "check_socket_path",
    "default_socket_path",
    "remove_stale_socket",
    "take_lock",
    "unlink_if_same",
]

log = logging.getLogger(__name__)

LOCK_FILE_SUFFIX: Final = ".lock"
LOCK_FILE_MODE: Final = 0o600
# AF_UNIX sun_path is 108 bytes on Linux, including the terminating NUL.
SUN_PATH_MAX_BYTES: Final = 107
# Probing an existing socket file: a live daemon answers connect() at once.
STALE_PROBE_TIMEOUT_S: Final = 1.0


def default_socket_path(paths: Paths | None = None) -> Path:
    """``$XDG_RUNTIME_DIR/prime-agent/orchestrator.sock`` (or the /tmp fallback of ``Paths``)."""
    return (paths or Paths.from_env()).control_socket


def check_socket_path(path: Path) -> None:
    """``SocketPathError`` unless ``path`` fits ``AF_UNIX`` and lies in a private directory
    of ours (created 0700 when missing)."""
    if len(os.fsencode(path)) > SUN_PATH_MAX_BYTES:
        raise SocketPathError(
            f"socket path {path} is longer than {SUN_PATH_MAX_BYTES} bytes; "
            "set XDG_RUNTIME_DIR to a shorter directory"
        )
    parent = ensure_private_dir(path.parent)
    if os.stat(parent).st_uid != os.geteuid():
        raise SocketPathError(f"{parent} belongs to another user; refusing to serve there")


def take_lock(socket_path: Path) -> int:
    """The flock next to ``socket_path``, held by the returned descriptor (closing it releases
    the lock); ``DaemonAlreadyRunning`` when another daemon holds it."""
    lock_path = socket_path.with_name(socket_path.name + LOCK_FILE_SUFFIX)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
    try:
        # Two daemons starting at once would both find the socket stale and both bind; the
        # loser of this lock never gets that far. The kernel drops the lock if we die.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DaemonAlreadyRunning(
            f"another daemon holds {lock_path}; stop it first or use its socket"
        ) from None
    return fd


async def remove_stale_socket(path: Path) -> None:
    """Remove a socket file nothing answers on (a daemon died); refuse a live one
    (``DaemonAlreadyRunning``) and anything that is not a socket (``SocketPathError``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    try:
        async with asyncio.timeout(STALE_PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_unix_connection(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        # Nobody listens: a daemon died without cleaning up. Safe to replace.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info("removed stale control socket %s", path)
        return
    except TimeoutError:
        # Something holds the socket but does not accept promptly: assume it is alive.
        raise DaemonAlreadyRunning(
            f"{path} is held by a process that does not answer; stop it first"
        ) from None
    except OSError as exc:
        raise SocketPathError(f"cannot probe {path}: {exc.strerror}") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    raise DaemonAlreadyRunning(f"a daemon is already listening on {path}")


def unlink_if_same(path: Path, inode: int | None) -> None:
    """Remove ``path`` only if it is still the file we bound (inode ``inode``): a successor
    daemon may already have replaced it."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass
