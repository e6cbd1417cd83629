"""Child processes: start in their own process group, wait for a ready line, stop cleanly.

Stopping is always SIGTERM to the whole group -> grace -> SIGKILL of the group (Trio's rule), so
a child that spawned grandchildren (a kernel gateway and its kernel, a model server) leaves
nothing behind. ``die_with_parent`` asks Linux to SIGTERM the child when this process dies, even
by SIGKILL (``PR_SET_PDEATHSIG``); children that must outlive us (daemon-owned sandboxes) pass
False.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import PrimeAgentError
from orchestrator.settings import PROCESS_STOP_GRACE_S

__all__ = [
    "PR_SET_PDEATHSIG",
    "ChildProcess",
    "pid_alive",
    "set_parent_death_signal",
    "start_child",
]

PR_SET_PDEATHSIG = 1
READY_LINE_MAX_BYTES = 64 * 1024
STDERR_TAIL_BYTES = 4096


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone); works for processes not our own."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:  # no /proc (macOS): fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)


@dataclass
class ChildProcess:
    """A started child; ``ready`` is the JSON object it printed on its first stdout line."""

    proc: asyncio.subprocess.Process
    ready: dict[str, Any]
    stderr_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self) -> str:
        if self.stderr_path is None:
            return ""
        try:
            with open(self.stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - STDERR_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    async def stop(self, grace_s: float = PROCESS_STOP_GRACE_S) -> None:
        await stop_process_group(self.proc, grace_s)


async def stop_process_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    if proc.returncode is not None:
        # The leader is gone but members of its group may linger; sweep them.
        _killpg(proc.pid, signal.SIGKILL)
        return
    _killpg(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(grace_s):
            await proc.wait()
    except TimeoutError:
        pass
    _killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def start_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    die_with_parent: bool = True,
    ready_timeout_s: float,
    stderr_path: Path | None = None,
    what: str,
    ready_line: bool = True,
    umask: int | None = None,
    preexec: Callable[[], None] | None = None,
    pass_fds: Sequence[int] = (),
) -> ChildProcess:
    """Start ``argv`` in a new session; return once it prints one JSON line on stdout.

    The child must print exactly one JSON object line when it is ready (a port, a URL). If it
    exits first or stays silent past ``ready_timeout_s`` it is stopped and a
    ``ChildStartError`` carries the tail of its stderr.

    ``ready_line=False`` is for programs that print no such line (nats-server): the child's
    stdout goes where its stderr goes (never a pipe, so a child that outlives us cannot die of
    SIGPIPE on its next log line), the call returns at once with ``ready == {}``, and the caller
    checks readiness its own way. ``ready_timeout_s`` is then unused.

    ``umask``: the child's, when it must differ from ours (``file_modes.user_umask``).

    ``preexec`` runs FIRST in the child between fork and exec (os calls only): the bwrap
    backend joins a cgroup and sets rlimits there while still root, then drops to the sandbox's
    uid. The parent-death signal is set after it, because a uid change clears it.
    ``pass_fds``: descriptors the child inherits (bind sources opened by the parent).
    """

    def _preexec() -> None:  # runs in the child between fork and exec
        if preexec is not None:
            preexec()
        if die_with_parent:
            set_parent_death_signal(signal.SIGTERM)
        if umask is not None:
            os.umask(umask)

    stderr_file = open(stderr_path, "ab") if stderr_path else None  # noqa: SIM115
    stdout: Any = asyncio.subprocess.PIPE
    if not ready_line:
        stdout = stderr_file if stderr_file is not None else asyncio.subprocess.DEVNULL
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr_file if stderr_file is not None else asyncio.subprocess.DEVNULL,
            env=dict(env),
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
            preexec_fn=_preexec,
            pass_fds=tuple(pass_fds),
            limit=READY_LINE_MAX_BYTES,
        )
    finally:
        if stderr_file is not None:
            stderr_file.close()
    child = ChildProcess(proc=proc, ready={}, stderr_path=stderr_path)
    if not ready_line:
        return child
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(ready_timeout_s):
            line = await proc.stdout.readline()
    except TimeoutError:
        await child.stop()
        raise ChildStartError(
            f"{what} did not become ready in {ready_timeout_s:.0f} s", child
        ) from None
    except BaseException:
        await child.stop()
        raise
    if not line:
        await child.stop()
        raise ChildStartError(f"{what} exited before it was ready", child)
    try:
        ready = json.loads(line)
        if not isinstance(ready, dict):
            raise ValueError("not an object")
    except ValueError:
        await child.stop()
        raise ChildStartError(
            f"{what} printed an unexpected ready line: {line[:200]!r}", child
        ) from None
    child.ready = ready
    # Nothing else is read from stdout; drain it so a chatty child never blocks on a full pipe.
    asyncio.get_running_loop().create_task(_drain(proc.stdout))
    return child


async def _drain(stream: asyncio.StreamReader) -> None:
    with contextlib.suppress(Exception):
        while await stream.read(65536):
            pass


class ChildStartError(PrimeAgentError):
    def __init__(self, message: str, child: ChildProcess):
        tail = child.stderr_tail().strip().splitlines()[-5:]
        super().__init__(message + (": " + " | ".join(tail) if tail else ""))
        self.child = child
