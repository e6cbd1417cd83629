"""Which bwrap sandboxes exist on this host and whose they are; finding one and killing it.

The bwrap backend's counterpart of ``docker_owned.py``. A sandbox is known on the host by:

- its runtime dir: a direct child of ``runtime_base()`` named ``RUNTIME_DIR_PREFIX…``, holding
  bwrap's ``--info-fd`` file (``INFO_FILE_NAME``: the host pid of the sandbox's pid 1) and the
  limits record (``CONFINEMENT_FILE_NAME``, for ``confinement.reopen``);
- its bwrap process: bwrap running our gateway module with that runtime dir's outputs bind on
  its command line, leading its own process group, and (a daemon's) carrying the owner mark
  ``OWNER_ENV=owner_mark(socket)`` in its environment.

``find_bwrap``/``find_init`` recognise a recorded process only when it is still that very one
(a reused pid is never signalled); ``owned_sandboxes`` lists a daemon's; ``sweep_stale``
removes what dead sandboxes left; ``kill_sandbox`` stops every process of one (docs/bwrap.md,
"Stop, adoption, cleanup"). Nothing here starts a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path
from typing import Final

from orchestrator.procs import pid_alive
from orchestrator.sandbox import proctree
from orchestrator.sandbox.bwrap_probe import BWRAP_PROGRAM
from orchestrator.sandbox.confined import GATEWAY_MODULE, outputs_dir
from orchestrator.sandbox.confinement import reopen
from orchestrator.sandbox.docker_user import ROOT_UID
from orchestrator.sandbox.local import OWNER_ENV

__all__ = [
    "CONFINEMENT_FILE_NAME",
    "INFO_FILE_NAME",
    "RUNTIME_DIR_PREFIX",
    "find_bwrap",
    "find_init",
    "kill_sandbox",
    "own_runtime_dir",
    "owned_sandboxes",
    "owner_mark",
    "read_info",
    "runtime_base",
    "sweep_stale",
    "wait_gone",
]

RUNTIME_DIR_PREFIX: Final = "prime-agent-bwr-"
# The runtime dirs' parent when the temp dir is closed to the sandbox's user (``runtime_base``).
FALLBACK_RUNTIME_BASE: Final = Path("/tmp")
INFO_FILE_NAME: Final = "info.json"  # bwrap --info-fd: {"child-pid": host pid of pid 1}
INFO_CHILD_PID_KEY: Final = "child-pid"
CONFINEMENT_FILE_NAME: Final = "confinement.json"
STOP_POLL_S: Final = 0.02
OWNER_MARK_PREFIX: Final = "bwrap:"
OWNER_MARK_HEX: Final = 32


def owner_mark(owner: str) -> str:
    """The value of ``OWNER_ENV`` on a bwrap process of the daemon on socket ``owner``.

    A digest, not the path: the sandbox's pid 1 is a fork of bwrap, so its environment (and
    with it the mark) can be read from inside (``/proc/1/environ``). It also keeps the local
    backend's scan (``local.owned_gateways``, the raw path) from taking a bwrap for its own."""
    return OWNER_MARK_PREFIX + hashlib.sha256(owner.encode()).hexdigest()[:OWNER_MARK_HEX]


def read_info(runtime_dir: Path) -> int | None:
    """The host pid of the sandbox's pid 1 from bwrap's --info-fd file, None until written."""
    try:
        info = json.loads((runtime_dir / INFO_FILE_NAME).read_text())
        return int(info[INFO_CHILD_PID_KEY])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def runtime_base() -> Path:
    """Where this process puts its sandboxes' runtime dirs: the temp dir, unless we are root and
    some directory on its path is closed to other users (a private ``TMPDIR`` such as
    pam_tmpdir's ``/tmp/user/0``, or the bench's 0700 temp dir); the unprivileged bwrap opens its
    socket, outputs and stage dirs by path, so it must be able to pass through every ancestor.
    Then ``FALLBACK_RUNTIME_BASE`` (world-searchable and sticky on every Linux)."""
    temp = Path(tempfile.gettempdir()).resolve()
    if os.getuid() != ROOT_UID or _searchable_by_everyone(temp):
        return temp
    return FALLBACK_RUNTIME_BASE


def _searchable_by_everyone(path: Path) -> bool:
    for directory in (path, *path.parents):
        try:
            if not directory.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def own_runtime_dir(recorded: str) -> Path | None:
    """``recorded`` when it is one of our runtime dirs (a direct child of ``runtime_base()``
    with our prefix), else None: a path read back from the database is never removed blindly."""
    if not recorded:
        return None
    path = Path(recorded)
    if path.parent.resolve() != runtime_base() or not path.name.startswith(RUNTIME_DIR_PREFIX):
        return None
    return path


def _cmdline(pid: int) -> list[bytes] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def find_bwrap(pid: int, runtime_dir: Path) -> proctree.ProcInfo | None:
    """The recorded bwrap process if it still runs and is that very one: bwrap running our
    gateway module with ``runtime_dir``'s outputs directory on its command line, leading its
    own process group (a reused pid is never signalled)."""
    info = proctree.read_proc(pid)
    if info is None or info.state == "Z" or info.pgid != pid:
        return None
    argv = _cmdline(pid)
    if argv is None or GATEWAY_MODULE.encode() not in argv:
        return None
    if str(outputs_dir(runtime_dir)).encode() not in argv:
        return None
    return info


def find_init(runtime_dir: Path) -> proctree.ProcInfo | None:
    """The sandbox's pid 1 named in ``runtime_dir``'s info file, if that process still runs
    and is that sandbox's (a fork of its bwrap: the same command line); it may outlive bwrap
    itself (killed by a signal) when the sandbox was not started to die with it."""
    init_pid = read_info(runtime_dir)
    return find_bwrap(init_pid, runtime_dir) if init_pid is not None else None


def _runtime_dir_of(argv: list[bytes]) -> str | None:
    """The runtime dir named on a bwrap command line (the parent of its outputs bind)."""
    temp = str(runtime_base())
    for arg in argv:
        path = Path(os.fsdecode(arg))
        parent = path.parent
        ours = parent.name.startswith(RUNTIME_DIR_PREFIX) and str(parent.parent) == temp
        if ours and path == outputs_dir(parent):
            return str(parent)
    return None


def owned_sandboxes(owner: str) -> list[tuple[proctree.ProcInfo, str]]:
    """Running bwrap sandboxes whose bwrap process carries ``OWNER_ENV=owner`` in its
    environment, with their runtime dirs (``remove_unknown``, ``prime-agent doctor``)."""
    marker = f"{OWNER_ENV}={owner_mark(owner)}".encode()
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        argv = _cmdline(int(name))
        if not argv or GATEWAY_MODULE.encode() not in argv:
            continue
        if os.path.basename(os.fsdecode(argv[0])) != BWRAP_PROGRAM:
            continue
        try:
            if marker not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        runtime_dir = _runtime_dir_of(argv)
        info = proctree.read_proc(int(name))
        if runtime_dir and info is not None and info.state != "Z" and info.pgid == info.pid:
            found.append((info, runtime_dir))
    # The sandbox's pid 1 is a fork of bwrap (same command line and environment): only the
    # bwrap process started by the daemon counts.
    pids = {info.pid for info, _ in found}
    return [(info, runtime_dir) for info, runtime_dir in found if info.ppid not in pids]


def _running_runtime_dirs() -> set[str]:
    """The runtime dirs of every bwrap sandbox running now (from their command lines)."""
    found = set()
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            argv = _cmdline(int(name))
            if argv and GATEWAY_MODULE.encode() in argv:
                runtime_dir = _runtime_dir_of(argv)
                if runtime_dir is not None:
                    found.add(runtime_dir)
    return found


def sweep_stale() -> int:
    """Remove what dead sandboxes of this user left: a runtime dir whose sandbox's pid 1 is
    gone and that no running bwrap names (a ``die_with_parent`` sandbox dies with its owner,
    and nobody is left to remove its directory and cgroup), with its cgroup. Returns how many.

    A directory still being set up has no pid 1 recorded yet and is never touched."""
    temp = runtime_base()
    running = _running_runtime_dirs()
    removed = 0
    for path in temp.glob(f"{RUNTIME_DIR_PREFIX}*"):
        try:
            if path.is_symlink() or path.stat().st_uid != os.geteuid():
                continue
        except OSError:
            continue
        init_pid = read_info(path)
        if init_pid is None or str(path) in running or pid_alive(init_pid):
            continue
        record = None
        with contextlib.suppress(OSError):
            record = reopen((path / CONFINEMENT_FILE_NAME).read_text())
        if record is not None:
            record.remove()
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


async def wait_gone(info: proctree.ProcInfo, timeout_s: float) -> bool:
    """Poll until ``info``'s process is gone (it is not our child); whether it went."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while proctree.is_running(info):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(STOP_POLL_S)
    return True


async def kill_sandbox(init: proctree.ProcInfo | None, grace_s: float) -> None:
    """SIGTERM the gateway (pid 1's child: it stops its kernel and sweeps), then SIGKILL the
    sandbox's pid 1 once the grace is over: the kernel kills every process of the pid
    namespace with it, so nothing started inside survives."""
    if init is None or not proctree.is_running(init):
        return
    for child in proctree.children(init.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.pid, signal.SIGTERM)
    if not await wait_gone(init, grace_s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(init.pid, signal.SIGKILL)
        await wait_gone(init, grace_s)
