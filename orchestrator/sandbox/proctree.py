"""Process trees from ``/proc`` (Linux; elsewhere every function sees no processes).

Stdlib only and cheap to import: ``gateway_main`` uses it to sweep its descendants on the way
out and to reap orphans it adopted as a child subreaper; ``local`` uses it as the host-side
backstop that makes ``stop()`` leave nothing behind.

A pid is identified by (pid, start time) so that a sweep never signals a process that reused
the pid of one that already exited.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

__all__ = [
    "ProcInfo",
    "children",
    "descendants",
    "is_running",
    "kill_all",
    "read_proc",
]

PROC = "/proc"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # one letter; "Z" is a zombie (exited, not yet reaped)
    start_time: int  # clock ticks since boot; with pid, a unique identity


def read_proc(pid: int) -> ProcInfo | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt ... starttime(22) ..."; comm
    # may hold spaces and parentheses, so split after the last ")".
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcInfo(
            pid=pid, ppid=int(rest[1]), pgid=int(rest[2]), state=rest[0], start_time=int(rest[19])
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
