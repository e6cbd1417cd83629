"""Process trees from ``/proc`` (Linux; elsewhere every function sees no processes).

Stdlib only and cheap to import: ``gateway_main`` uses it to sweep its descendants on the way
out and to reap orphans it adopted as a child subreaper; ``local`` uses it as the host-side
backstop that makes ``stop()`` leave nothing behind; the kernel runs ``kill_forked_copies`` after
a cell that timed out (see ``gateway.KernelGatewayClient.execute``).

A pid is identified by (pid, start time) so that a sweep never signals a process that reused
the pid of one that already exited.

``tree_usage`` and ``started_at`` measure a process tree for the control API's
``sandbox_info`` (a local sandbox is its gateway process and everything below it).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

__all__ = [
    "ProcInfo",
    "ProcUsage",
    "children",
    "descendants",
    "is_running",
    "kill_all",
    "kill_forked_copies",
    "read_proc",
    "started_at",
    "sweep_descendants",
    "tree_usage",
]

PROC = "/proc"
# Fields of /proc/<pid>/stat counted from the one after "(comm)" (the state, field 3): utime,
# stime, cutime, cstime (fields 14-17, clock ticks) and rss (field 24, pages).
_CPU_FIELDS: Final = (11, 12, 13, 14)
_RSS_FIELD: Final = 21
_BOOT_TIME_KEY: Final = "btime"
_START_FIELD: Final = 19
SWEEP_ROUNDS: Final = 5  # kill passes: a forking process can add members mid-sweep


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # one letter; "Z" is a zombie (exited, not yet reaped)
    start_time: int  # clock ticks since boot; with pid, a unique identity


@dataclass(frozen=True)
class ProcUsage:
    """CPU time and resident memory of a process tree."""

    cpu_seconds: float  # user + system, its reaped children's included
    rss_bytes: int


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt ... starttime(22) ..."; comm
    # may hold spaces and parentheses, so split after the last ")".
    return raw[raw.rfind(")") + 2 :].split()


def read_proc(pid: int) -> ProcInfo | None:
    rest = _stat_fields(pid)
    if rest is None:
        return None
    try:
        return ProcInfo(
            pid=pid,
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            state=rest[0],
            start_time=int(rest[_START_FIELD]),
        )
    except (IndexError, ValueError):
        return None


def _all() -> list[ProcInfo]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    out = []
    for name in names:
        if name.isdigit():
            info = read_proc(int(name))
            if info is not None:
                out.append(info)
    return out


def children(pid: int) -> list[ProcInfo]:
    """Direct children of ``pid``, zombies included.

    Reads ``/proc/<pid>/task/*/children`` (a few small files) instead of scanning all of
    ``/proc``: the gateway calls this every second, and a host may run a hundred gateways.
    """
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return []
    pids: set[int] = set()
    for tid in tasks:
        try:
            with open(f"{PROC}/{pid}/task/{tid}/children") as fh:
                pids.update(int(part) for part in fh.read().split())
        except (OSError, ValueError):
            # No CONFIG_PROC_CHILDREN: fall back to the full scan.
            return [info for info in _all() if info.ppid == pid]
    out = []
    for child in pids:
        info = read_proc(child)
        if info is not None and info.ppid == pid:
            out.append(info)
    return out


def descendants(pid: int) -> list[ProcInfo]:
    """Every descendant of ``pid`` (children first, then theirs), zombies included."""
    out: list[ProcInfo] = []
    frontier = [pid]
    seen = {pid}
    while frontier:
        nxt = []
        for parent in frontier:
            for child in children(parent):
                if child.pid not in seen:
                    seen.add(child.pid)
                    out.append(child)
                    nxt.append(child.pid)
        frontier = nxt
    return out


def is_running(info: ProcInfo) -> bool:
    """True while this very process (same start time) exists and is not a zombie."""
    now = read_proc(info.pid)
    return now is not None and now.start_time == info.start_time and now.state != "Z"


def kill_all(procs: list[ProcInfo], sig: int) -> int:
    """Send ``sig`` to each process that is still the one we saw; return how many got it."""
    sent = 0
    for info in procs:
        if info.state == "Z" or not is_running(info):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(info.pid, sig)
            sent += 1
    return sent


def sweep_descendants(pid: int) -> int:
    """SIGKILL every descendant of ``pid`` (a few passes, for one that forks meanwhile);
    return how many were killed."""
    killed: set[int] = set()
    for _ in range(SWEEP_ROUNDS):
        found = descendants(pid)
        if not kill_all(found, signal.SIGKILL):
            break
        killed.update(info.pid for info in found if info.state != "Z")
    return len(killed)


def tree_usage(pid: int) -> ProcUsage | None:
    """CPU seconds and RSS of ``pid`` and its descendants (None when ``pid`` is gone). A live
    process's CPU time counts its reaped children's too (cutime, cstime), so a short-lived
    command run by the kernel is counted once it has exited."""
    ticks = 0
    pages = 0
    found = False
    for member in [pid, *(p.pid for p in descendants(pid))]:
        rest = _stat_fields(member)
        if rest is None:
            continue
        try:
            ticks += sum(int(rest[i]) for i in _CPU_FIELDS)
            pages += int(rest[_RSS_FIELD])
        except (IndexError, ValueError):
            continue
        found = found or member == pid
    if not found:
        return None
    return ProcUsage(ticks / os.sysconf("SC_CLK_TCK"), pages * os.sysconf("SC_PAGE_SIZE"))


def started_at(info: ProcInfo) -> datetime | None:
    """When the process started (aware UTC), from the boot time and its start time."""
    try:
        with open(f"{PROC}/stat") as fh:
            boot = next(
                int(line.split()[1]) for line in fh if line.startswith(_BOOT_TIME_KEY + " ")
            )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return datetime.fromtimestamp(boot + info.start_time / os.sysconf("SC_CLK_TCK"), UTC)


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _uptime_ticks() -> int | None:
    try:
        with open(f"{PROC}/uptime") as fh:
            return int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return None


def kill_forked_copies(started_within_s: float) -> int:
    """SIGKILL the copies of this process that ``fork()`` made in the last ``started_within_s``
    seconds; return how many were killed.

    A copy is a process with this process's exact command line (a fork without exec keeps it;
    a kernel's includes its unique connection file) that started inside the window: a fork bomb
    or fork-started workers of the cell that timed out, still running after the interrupt
    stopped the kernel itself. Copies made before the window (a pool from an earlier cell) are
    left alone. Copies that are our children are reaped here; the rest were adopted by the
    gateway, which reaps them.
    """
    me = os.getpid()
    mine = _cmdline(me)
    now = _uptime_ticks()
    if mine is None or now is None:
        return 0
    since = now - int(started_within_s * os.sysconf("SC_CLK_TCK"))
    killed: set[int] = set()
    children_killed: set[int] = set()
    for _ in range(SWEEP_ROUNDS):
        copies = [
            info
            for info in _all()
            if info.pid != me
            and info.state != "Z"
            and info.start_time >= since
            and _cmdline(info.pid) == mine
        ]
        if not kill_all(copies, signal.SIGKILL):
            break
        killed.update(info.pid for info in copies)
        children_killed.update(info.pid for info in copies if info.ppid == me)
    for pid in children_killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return len(killed)
