"""What ``prime-agent doctor`` checks: which sandbox backends work here (docker, bwrap, local,
what ``--backend auto`` picks, and whether the cluster of ``[kubernetes]`` answers), the
control socket, the daemon's NATS server, the database's integrity and orphaned sandboxes
(containers and local gateways).

Each check returns ``Finding`` lines; a finding with ``problem`` set makes doctor exit 1 unless
``--fix`` repaired it. Fixes only remove what nothing owns: a stale socket whose lock is free,
containers of orchestrators that are gone, local gateways marked by a daemon that no longer
answers. The database is never changed here (nothing is ever deleted from it; a missing leaf
pointer is rebuilt by the next read-write open), and a NATS server a crashed daemon left is not
an orphan: it holds undelivered agent messages and the next daemon adopts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import duckdb

from orchestrator.paths import Paths
from orchestrator.sandbox.base import SandboxRef

__all__ = [
    "Finding",
    "check_backends",
    "check_bwrap_sandboxes",
    "check_database",
    "check_local_sandboxes",
    "check_nats",
    "check_socket",
    "database_problems",
]

# Problems listed per kind before "... and N more".
MAX_LISTED: Final = 5


@dataclass
class Finding:
    area: str
    text: str
    problem: bool = False
    fixed: bool = False

    def line(self) -> str:
        mark = " (fixed)" if self.fixed else ""
        return f"{self.area}: {self.text}{mark}"


def check_backends(
    docker_status: Callable[[], tuple[bool, str]],
    bwrap_status: Callable[[], tuple[bool, str]],
    *,
    image: str,
    kubernetes_status: Callable[[], tuple[bool, str]],
    namespace: str,
) -> list[Finding]:
    """One line per backend, usable or why not, then what ``auto`` picks
    (``sandbox/choice.py``): a problem only when ``auto`` refuses (no sandbox works here).
    Kubernetes comes last and is never a problem: only ``--backend kubernetes`` picks it."""
    from orchestrator.errors import UserError
    from orchestrator.sandbox.choice import NO_SANDBOX_FIXES, choose_backend

    docker = docker_status()
    bwrap = bwrap_status()
    findings = [
        Finding("backend", _usable("docker", docker, f"session image {image}")),
        Finding("backend", _usable("bwrap", bwrap, "bubblewrap runs a sandbox here")),
        Finding("backend", "local usable with --backend local only: it does NOT isolate sessions"),
    ]
    try:
        picked = choose_backend(
            "auto", lambda: docker, lambda: bwrap, kubernetes_status=kubernetes_status
        )
    except UserError:  # why each is not usable is on its line above
        findings.append(
            Finding("backend", f"auto refuses (no sandbox here): {NO_SANDBOX_FIXES}", problem=True)
        )
    else:
        findings.append(Finding("backend", f"auto picks {picked.name}"))
    usable, why = kubernetes_status()
    findings.append(
        Finding(
            "backend",
            f"kubernetes usable with --backend kubernetes only (namespace {namespace})"
            if usable
            else f"kubernetes not usable (only --backend kubernetes picks it): {why}",
        )
    )
    return findings


def _usable(name: str, status: tuple[bool, str], detail: str) -> str:
    usable, why = status
    return f"{name} usable ({detail})" if usable else f"{name} not usable: {why}"


def check_socket(paths: Paths, daemon: dict[str, Any] | None, *, fix: bool) -> Finding:
    """The daemon answering on its socket, or a stale socket file (removable when its lock is
    free: no daemon holds it)."""
    from orchestrator.api.server import default_socket_path
    from orchestrator.api.socket_file import LOCK_FILE_SUFFIX

    sock = default_socket_path(paths)
    if daemon is not None:
        return Finding("socket", f"daemon running (pid {daemon.get('pid')}, {sock})")
    if not sock.exists():
        return Finding("socket", f"no daemon ({sock} absent)")
    lock = sock.with_name(sock.name + LOCK_FILE_SUFFIX)
    if not _lock_free(lock):
        return Finding(
            "socket", f"{sock}: its lock is held but nothing answers (a daemon starting?)", True
        )
    finding = Finding("socket", f"stale socket {sock} (no daemon holds it)", problem=True)
    if fix:
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        finding.fixed = True
    return finding


def _lock_free(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock if we took it
    return True


def check_nats(paths: Paths, daemon: dict[str, Any] | None) -> Finding:
    """The daemon's embedded NATS server (instance ``daemon``)."""
    from orchestrator.bus.server import EmbeddedNats
    from orchestrator.daemon.bus import DAEMON_NATS_INSTANCE

    server = EmbeddedNats.from_paths(paths, instance=DAEMON_NATS_INSTANCE)
    pid = server.running_pid()
    if pid is None:
        state = "not running" if daemon is None else "not running (the daemon uses another)"
        return Finding("nats", state)
    if daemon is None:
        return Finding(
            "nats",
            f"server pid {pid} left by a daemon that is gone; it keeps undelivered agent "
            "messages and the next daemon start adopts it",
        )
    return Finding("nats", f"server running (pid {pid})")


def database_problems(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Broken links in the store: each kind counted, the first few listed."""
    checks = [
        (
            "session leaf pointing at no event of its session",
            "SELECT s.id FROM sessions s WHERE s.leaf_event_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM events e WHERE e.id = s.leaf_event_id AND e.session_id = s.id)",
        ),
        (
            "event whose parent is not an event of its session",
            "SELECT e.id FROM events e WHERE e.parent_event_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM events p WHERE p.id = e.parent_event_id "
            "AND p.session_id = e.session_id)",
        ),
        (
            "subagent whose parent session is missing",
            "SELECT s.id FROM sessions s WHERE s.parent_id IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM sessions p WHERE p.id = s.parent_id)",
        ),
        (
            "session with a duplicate event seq",
            "SELECT session_id FROM events GROUP BY session_id, seq HAVING count(*) > 1",
        ),
        (
            "usage row without its usage event",
            "SELECT u.event_id FROM usage u WHERE NOT EXISTS "
            "(SELECT 1 FROM events e WHERE e.id = u.event_id)",
        ),
    ]
    found = []
    for what, sql in checks:
        ids = [str(row[0]) for row in con.execute(sql).fetchall()]
        if ids:
            shown = ", ".join(ids[:MAX_LISTED])
            more = f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else ""
            found.append(f"{len(ids)} {what}: {shown}{more}")
    return found


def _counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    sessions = con.execute("SELECT count(*) FROM sessions").fetchone()
    events = con.execute("SELECT count(*) FROM events").fetchone()
    return int(sessions[0] if sessions else 0), int(events[0] if events else 0)


async def check_database(paths: Paths, daemon: dict[str, Any] | None) -> list[Finding]:
    """Integrity of the DuckDB file; while a daemon runs it holds the file (not checked)."""
    from orchestrator.errors import PrimeAgentError
    from orchestrator.store.db import Store

    path = paths.database_file
    if daemon is not None:
        return [Finding("database", f"{path} is held by the daemon (stop it to check the file)")]
    if not path.exists():
        return [Finding("database", f"no database yet ({path})")]
    try:
        store = await Store.open(path, read_only=True)
    except PrimeAgentError as exc:
        return [Finding("database", f"cannot open {path}: {exc}", problem=True)]
    try:
        problems = await store.read(database_problems)
        sessions, events = await store.read(_counts)
    finally:
        await store.close()
    if not problems:
        return [Finding("database", f"ok ({sessions} sessions, {events} events, {path})")]
    return [Finding("database", p, problem=True) for p in problems]


def check_local_sandboxes(
    paths: Paths, daemon: dict[str, Any] | None, *, fix: bool
) -> list[Finding]:
    """Local gateways marked by this user's daemon while no daemon runs: orphans (a daemon
    that runs adopts or removes its own at start)."""
    from orchestrator.api.server import default_socket_path
    from orchestrator.sandbox.local import owned_gateways

    if daemon is not None:
        return [Finding("local sandboxes", "owned by the running daemon")]
    gateways = owned_gateways(str(default_socket_path(paths)))
    if not gateways:
        return [Finding("local sandboxes", "no orphaned gateway")]
    findings = []
    for info, runtime_dir in gateways:
        finding = Finding(
            "local sandboxes",
            f"orphaned gateway pid {info.pid} ({runtime_dir}) of a daemon that is gone",
            problem=True,
        )
        if fix:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(info.pid, signal.SIGKILL)  # its group: gateway and kernel
            finding.fixed = True
        findings.append(finding)
    return findings


def check_bwrap_sandboxes(
    paths: Paths, daemon: dict[str, Any] | None, *, fix: bool
) -> list[Finding]:
    """bwrap sandboxes marked by this user's daemon while no daemon runs: orphans, as
    ``check_local_sandboxes`` finds gateways. ``--fix`` removes each as the next daemon would
    (its pid namespace, cgroup and runtime dir: ``BwrapBackend.remove``)."""
    from orchestrator.api.server import default_socket_path
    from orchestrator.sandbox.bwrap import BACKEND_NAME, BwrapBackend
    from orchestrator.sandbox.bwrap_owned import owned_sandboxes

    if daemon is not None:
        return [Finding("bwrap sandboxes", "owned by the running daemon")]
    found = owned_sandboxes(str(default_socket_path(paths)))
    if not found:
        return [Finding("bwrap sandboxes", "no orphaned sandbox")]
    findings = []
    for info, runtime_dir in found:
        finding = Finding(
            "bwrap sandboxes",
            f"orphaned sandbox pid {info.pid} ({runtime_dir}) of a daemon that is gone",
            problem=True,
        )
        if fix:
            ref = SandboxRef(BACKEND_NAME, str(info.pid), "", "", "", "", runtime_dir)
            asyncio.run(BwrapBackend(pool_size=0).remove(ref))
            finding.fixed = True
        findings.append(finding)
    return findings
