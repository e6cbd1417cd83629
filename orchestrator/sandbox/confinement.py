"""Holding a process tree started without a container to a sandbox's ``ResourceLimits``.

``confine(name, limits, uid=...)`` picks the best mechanism this host offers, in this order
(docs/limits.md says which host gives which):

- ``cgroup-v2``: a group ``<parent>/prime-agent/<name>`` in the unified tree with ``memory.max``,
  ``memory.swap.max = 0``, ``pids.max``, ``cpu.max``. Where the parent may be is decided by
  ``cgroup_layout.v2_parent`` (the no-internal-processes rule is explained there).
- ``cgroup-v1``: one group ``<own>/prime-agent/<name>`` per controller, under this process's
  own group in that controller: ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes``
  where swap accounting exists: no swap), ``pids.max``, ``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``; usage from ``memory.usage_in_bytes`` and ``cpuacct.usage``.
- ``systemd-scope``: no cgroup is writable but systemd runs: ``argv_prefix`` is a
  ``systemd-run [--user] --scope -p MemoryMax= -p TasksMax= -p CPUQuota= --`` that puts the
  sandbox in a transient scope (not run for real on the machine this was built on).
- ``rlimit``: ``RLIMIT_AS`` for memory and ``RLIMIT_NPROC`` for pids, set in the child; no cpu
  limit (there is no rlimit for a share of a cpu). ``warning`` says so in one line.

A cgroup kind lacking a controller falls back to the rlimit for that limit alone (pids) or
names it in ``missing`` (cpus). A limit left None in ``ResourceLimits`` is not asked for and so
never missing.

Invariants: ``preexec`` runs in the child between fork and exec, before any uid drop (first in
``procs.start_child``'s preexec), does only os calls on values prepared by ``confine`` (no
parsing, no logging), and raises when it cannot join a group (a sandbox never runs unconfined
by accident). ``record()`` holds the group paths; ``reopen`` finds them again after a daemon
kill -9 (None when they are gone); ``remove`` is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.sandbox import cgroup_layout, cgroupfs
from orchestrator.sandbox.base import ResourceLimits
from orchestrator.sandbox.cgroupfs import Hierarchy

__all__ = [
    "KINDS",
    "Confinement",
    "ConfinementKind",
    "LimitUsage",
    "confine",
    "reopen",
    "sweep",
]

log = logging.getLogger(__name__)

ConfinementKind = Literal["cgroup-v1", "cgroup-v2", "systemd-scope", "rlimit"]
KINDS: Final[tuple[ConfinementKind, ...]] = ("cgroup-v1", "cgroup-v2", "systemd-scope", "rlimit")
WARNING_PREFIX: Final = "prime-agent: "
RECORD_VERSION: Final = 1
# The limits by their ResourceLimits field name (what ``missing`` lists).
MEMORY: Final = "memory_bytes"
PIDS: Final = "pids"
CPUS: Final = "cpus"
# v1 cfs: the period we set and the smallest quota the kernel accepts (microseconds).
CFS_PERIOD_US: Final = 100_000
CFS_MIN_QUOTA_US: Final = 1_000
NS_PER_S: Final = 1_000_000_000
US_PER_S: Final = 1_000_000
# remove(): how long to wait for the group's processes to die, and the poll interval.
REMOVE_TIMEOUT_S: Final = 10.0
REMOVE_POLL_S: Final = 0.02
PROCS_FILE: Final = "cgroup.procs"
KILL_FILE: Final = "cgroup.kill"  # v2 on Linux >= 5.14: kills the whole group at once
JOIN_SELF: Final = b"0"  # written to cgroup.procs: "the writing process"


@dataclass(frozen=True)
class LimitUsage:
    """What a confined tree uses now; None where this confinement cannot tell."""

    memory_bytes: int | None
    memory_limit_bytes: int | None
    cpu_seconds: float | None


class ConfinementRecord(BaseModel):
    """``Confinement.record()``'s JSON: enough to find the group again (``reopen``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int = RECORD_VERSION
    name: str
    kind: ConfinementKind
    missing: tuple[str, ...] = ()
    warning: str = ""
    argv_prefix: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # group directories (cgroup kinds)
    memory_usage_file: str = ""
    memory_limit_file: str = ""
    cpu_usage_file: str = ""  # v1 cpuacct.usage (ns) or v2 cpu.stat (usage_usec)
    scope_unit: str = ""
    scope_user: bool = False


class Confinement:
    """One sandbox's limits on this host (see the module docstring for the kinds).

    ``groups``: the group directories this confinement made (one per v1 controller, one for
    v2; empty otherwise); ``preexec`` joins each and sets ``rlimits``. Built by ``confine`` or
    ``reopen`` only.
    """

    def __init__(
        self,
        *,
        name: str,
        kind: ConfinementKind,
        missing: Sequence[str] = (),
        warning: str = "",
        argv_prefix: Sequence[str] = (),
        groups: Sequence[Path] = (),
        rlimits: Sequence[tuple[int, int]] = (),
        memory_usage_file: Path | None = None,
        memory_limit_file: Path | None = None,
        cpu_usage_file: Path | None = None,
        scope_unit: str = "",
        scope_user: bool = False,
    ) -> None:
        self.name = name
        self.kind: ConfinementKind = kind
        self.missing: tuple[str, ...] = tuple(missing)
        self.warning = warning
        self.argv_prefix: tuple[str, ...] = tuple(argv_prefix)
        self.groups: tuple[Path, ...] = tuple(groups)
        self.rlimits: tuple[tuple[int, int], ...] = tuple(rlimits)
        self._memory_usage_file = memory_usage_file
        self._memory_limit_file = memory_limit_file
        self._cpu_usage_file = cpu_usage_file
        self._scope_unit = scope_unit
        self._scope_user = scope_user
        # Prepared for preexec: it must not build paths or strings after fork.
        self._join_files: tuple[bytes, ...] = tuple(
            os.fsencode(group / PROCS_FILE) for group in self.groups
        )

    def __repr__(self) -> str:
        return f"Confinement(name={self.name!r}, kind={self.kind!r}, missing={self.missing!r})"

    # -- in the child ------------------------------------------------------------------------

    def preexec(self) -> None:
        """Join every group and set the rlimits: in the child between fork and exec, while
        still privileged. Raises OSError when a group cannot be joined (the start fails)."""
        for path in self._join_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, JOIN_SELF)
            finally:
                os.close(fd)
        for which, value in self.rlimits:
            resource.setrlimit(which, (value, value))

    # -- on the host side --------------------------------------------------------------------

    def usage(self) -> LimitUsage:
        """Memory in use, its limit, and cpu time spent by the group (None where unknown)."""
        if self.kind == "systemd-scope":
            from orchestrator.sandbox import systemd_scope

            return systemd_scope.usage(self._scope_unit, user=self._scope_user)
        memory = limit = None
        cpu: float | None = None
        if self._memory_usage_file is not None:
            memory = cgroupfs.read_int(self._memory_usage_file)
        if self._memory_limit_file is not None:
            limit = cgroupfs.read_int(self._memory_limit_file)
        if self._cpu_usage_file is not None:
            cpu = _cpu_seconds(self._cpu_usage_file)
        return LimitUsage(memory_bytes=memory, memory_limit_bytes=limit, cpu_seconds=cpu)

    def pids(self) -> list[int]:
        """Every process in the group (cgroup kinds and a scope; empty for rlimits)."""
        if self.kind == "systemd-scope":
            from orchestrator.sandbox import systemd_scope

            return systemd_scope.pids(self._scope_unit, user=self._scope_user)
        found: set[int] = set()
        for group in self.groups:
            found.update(cgroupfs.read_pids(group / PROCS_FILE))
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process in the group (a no-op for rlimits: there is no group)."""
        if self.kind == "systemd-scope":
            from orchestrator.sandbox import systemd_scope

            systemd_scope.kill(self._scope_unit, user=self._scope_user)
            return
        for group in self.groups:
            kill_file = group / KILL_FILE
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
        """Kill every process in the group, wait until it is empty, remove its directories.

        Idempotent and never raises: a group already gone is fine; one that will not empty in
        ``timeout_s`` (a process stuck in the kernel) is logged and left for ``sweep``.
        Blocks up to ``timeout_s``; call it from a worker thread in async code.
        """
        if self.kind == "systemd-scope":
            from orchestrator.sandbox import systemd_scope

            systemd_scope.stop(self._scope_unit, user=self._scope_user)
            return
        if not self.groups:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            self.kill_all()
            if not self.pids():
                break
            if time.monotonic() >= deadline:
                log.warning("cgroup of %s still has processes %s; left", self.name, self.pids())
                return
            time.sleep(REMOVE_POLL_S)
        for group in self.groups:
            _rmdir_until_gone(group, deadline)

    def record(self) -> str:
        """A JSON string for the sandbox's runtime dir: ``reopen`` rebuilds this from it."""
        return ConfinementRecord(
            name=self.name,
            kind=self.kind,
            missing=self.missing,
            warning=self.warning,
            argv_prefix=self.argv_prefix,
            groups=tuple(str(group) for group in self.groups),
            memory_usage_file=str(self._memory_usage_file or ""),
            memory_limit_file=str(self._memory_limit_file or ""),
            cpu_usage_file=str(self._cpu_usage_file or ""),
            scope_unit=self._scope_unit,
            scope_user=self._scope_user,
        ).model_dump_json()


def _rmdir_until_gone(group: Path, deadline: float) -> None:
    """rmdir ``group``; an exiting task may keep it busy a moment after cgroup.procs empties."""
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("cannot remove cgroup %s: %s; left", group, exc)
                return
        time.sleep(REMOVE_POLL_S)


def _cpu_seconds(path: Path) -> float | None:
    """v1 ``cpuacct.usage`` (nanoseconds) or v2 ``cpu.stat``'s ``usage_usec``."""
    if path.name == "cpu.stat":
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "usage_usec" and value.strip().isdigit():
                return int(value) / US_PER_S
        return None
    nanoseconds = cgroupfs.read_int(path)
    return None if nanoseconds is None else nanoseconds / NS_PER_S


# -- choosing -----------------------------------------------------------------------------------


def confine(
    name: str,
    limits: ResourceLimits,
    *,
    uid: int,
    hierarchies: Sequence[Hierarchy] | None = None,
    systemd: bool | None = None,
) -> Confinement:
    """Make the confinement for sandbox ``name`` whose processes run as host ``uid``.

    Creates its cgroup now (the caller starts the process with ``preexec`` and calls
    ``remove`` when done). ``hierarchies``: the cgroup trees to use (None = this host's,
    ``cgroupfs.host_hierarchies()``; ``[]`` forces the fallbacks); ``systemd``: whether a
    transient scope may be used (None = detect). ``SandboxStartError`` for a bad name or a
    group of that name that still holds processes.
    """
    group_name = cgroup_layout.group_name(name)
    found = cgroupfs.host_hierarchies() if hierarchies is None else list(hierarchies)
    reasons: list[str] = []
    v2 = next((h for h in found if h.version == 2 and cgroupfs.V2_MEMORY in h.controllers), None)
    if v2 is not None:
        made = _confine_v2(name, group_name, limits, v2, uid=uid, reasons=reasons)
        if made is not None:
            return made
    v1_memory = next((h for h in found if h.version == 1 and "memory" in h.controllers), None)
    if v1_memory is not None:
        made = _confine_v1(name, group_name, limits, found, uid=uid, reasons=reasons)
        if made is not None:
            return made
    if not found:
        reasons.append("none mounted")
    elif v2 is None and v1_memory is None:
        reasons.append("no memory controller mounted")
    from orchestrator.sandbox import systemd_scope

    use_scope = systemd_scope.available() if systemd is None else systemd
    if use_scope:
        return systemd_scope.confinement(name, group_name, limits)
    return _confine_rlimits(name, limits, uid=uid, why="; ".join(reasons))


def _confine_v1(
    name: str,
    group_name: str,
    limits: ResourceLimits,
    found: Sequence[Hierarchy],
    *,
    uid: int,
    reasons: list[str],
) -> Confinement | None:
    """One group per needed v1 controller; None (with a reason) when memory is not writable."""
    made: list[Path] = []

    def group_for(controller: str) -> Path | None:
        tree = next((h for h in found if h.version == 1 and controller in h.controllers), None)
        if tree is None:
            return None
        directory = cgroup_layout.v1_group_dir(tree, group_name)
        if directory in made:
            return directory
        try:
            cgroup_layout.make_group(directory)
        except OSError as exc:
            reasons.append(f"cannot create {directory} ({exc.strerror or exc})")
            return None
        made.append(directory)
        return directory

    def undo() -> None:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()

    memory_dir = group_for("memory")
    if memory_dir is None:
        undo()
        return None
    notes: list[str] = []
    missing: list[str] = []
    rlimits: list[tuple[int, int]] = []
    cpu_usage: Path | None = None
    try:
        if limits.memory_bytes is not None:
            _write(memory_dir / "memory.limit_in_bytes", limits.memory_bytes)
            memsw = memory_dir / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                _write(memsw, limits.memory_bytes)
            else:
                notes.append("no swap accounting: swap not limited")
        if limits.pids is not None:
            pids_dir = group_for("pids")
            if pids_dir is not None:
                _write(pids_dir / "pids.max", limits.pids)
            else:
                _pids_by_rlimit(limits.pids, uid, rlimits, missing, notes, "no pids cgroup")
        if limits.cpus is not None:
            cpu_dir = group_for("cpu")
            if cpu_dir is not None:
                _write(cpu_dir / "cpu.cfs_period_us", CFS_PERIOD_US)
                quota = max(CFS_MIN_QUOTA_US, round(limits.cpus * CFS_PERIOD_US))
                _write(cpu_dir / "cpu.cfs_quota_us", quota)
            else:
                missing.append(CPUS)
                notes.append("no cpu limit (no cpu cgroup)")
        acct_dir = group_for("cpuacct")
        if acct_dir is not None:
            cpu_usage = acct_dir / "cpuacct.usage"
    except OSError as exc:
        undo()
        reasons.append(f"cannot set cgroup v1 limits ({exc.strerror or exc})")
        return None
    return Confinement(
        name=name,
        kind="cgroup-v1",
        missing=missing,
        warning=_warning("cgroup v1", notes) if notes else "",
        groups=made,
        rlimits=rlimits,
        memory_usage_file=memory_dir / "memory.usage_in_bytes",
        memory_limit_file=memory_dir / "memory.limit_in_bytes",
        cpu_usage_file=cpu_usage,
    )


def _confine_v2(
    name: str,
    group_name: str,
    limits: ResourceLimits,
    tree: Hierarchy,
    *,
    uid: int,
    reasons: list[str],
) -> Confinement | None:
    """A group in the unified tree; None (with a reason) where we may not make one."""
    parent, why = cgroup_layout.v2_parent(tree, euid=os.geteuid(), own_pid=os.getpid())
    if parent is None:
        reasons.append(f"cgroup v2: {why}")
        return None
    directory = parent / group_name
    try:
        cgroup_layout.make_group(directory)
    except OSError as exc:
        reasons.append(f"cannot create {directory} ({exc.strerror or exc})")
        return None
    available = cgroupfs.read_controllers(directory / "cgroup.controllers")
    notes: list[str] = []
    missing: list[str] = []
    rlimits: list[tuple[int, int]] = []
    try:
        if limits.memory_bytes is not None:
            _write(directory / "memory.max", limits.memory_bytes)
            swap = directory / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            else:
                notes.append("no swap accounting: swap not limited")
        if limits.pids is not None:
            if cgroupfs.V2_PIDS in available:
                _write(directory / "pids.max", limits.pids)
            else:
                _pids_by_rlimit(limits.pids, uid, rlimits, missing, notes, "no pids controller")
        if limits.cpus is not None:
            if cgroupfs.V2_CPU in available:
                quota = max(CFS_MIN_QUOTA_US, round(limits.cpus * CFS_PERIOD_US))
                (directory / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
            else:
                missing.append(CPUS)
                notes.append("no cpu limit (no cpu controller)")
    except OSError as exc:
        with contextlib.suppress(OSError):
            directory.rmdir()
        reasons.append(f"cannot set cgroup v2 limits ({exc.strerror or exc})")
        return None
    return Confinement(
        name=name,
        kind="cgroup-v2",
        missing=missing,
        warning=_warning("cgroup v2", notes) if notes else "",
        groups=(directory,),
        rlimits=rlimits,
        memory_usage_file=directory / "memory.current",
        memory_limit_file=directory / "memory.max",
        cpu_usage_file=directory / "cpu.stat",
    )


def _confine_rlimits(name: str, limits: ResourceLimits, *, uid: int, why: str) -> Confinement:
    """The last resort: address space and process count per uid; never a cpu limit."""
    notes: list[str] = []
    missing: list[str] = []
    rlimits: list[tuple[int, int]] = []
    if limits.memory_bytes is not None:
        rlimits.append((resource.RLIMIT_AS, limits.memory_bytes))
        notes.append("memory via RLIMIT_AS only (address space, not resident memory)")
    if limits.pids is not None:
        _pids_by_rlimit(limits.pids, uid, rlimits, missing, notes, "")
    if limits.cpus is not None:
        missing.append(CPUS)
        notes.append("no cpu limit")
    return Confinement(
        name=name,
        kind="rlimit",
        missing=missing,
        warning=_warning(f"no usable cgroup ({why or 'none found'})", notes) if notes else "",
        rlimits=rlimits,
    )


def _pids_by_rlimit(
    pids: int,
    uid: int,
    rlimits: list[tuple[int, int]],
    missing: list[str],
    notes: list[str],
    context: str,
) -> None:
    """RLIMIT_NPROC for the pids limit: it counts every task of the real uid on the host, so
    the value is the limit plus what ``uid`` runs already; root ignores it (no limit)."""
    prefix = f"{context}: " if context else ""
    if uid == 0:
        missing.append(PIDS)
        notes.append(f"{prefix}no pids limit (RLIMIT_NPROC is not enforced for root)")
        return
    rlimits.append((resource.RLIMIT_NPROC, pids + tasks_of_uid(uid)))
    notes.append(f"{prefix}pids via RLIMIT_NPROC (shared by every process of uid {uid})")


def tasks_of_uid(uid: int) -> int:
    """How many tasks (threads) whose real uid is ``uid`` run now (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as fh:
                real_uid = threads = None
                for line in fh:
                    if line.startswith("Uid:"):
                        real_uid = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if real_uid == uid and threads is not None:
            count += threads
    return count


def _warning(why: str, notes: Sequence[str]) -> str:
    """The one-line warning: why, then each limit that is weaker or missing."""
    return f"{WARNING_PREFIX}{why}: {', '.join(notes)}".replace("\n", " ")


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))


# -- finding again ------------------------------------------------------------------------------


def reopen(record: str) -> Confinement | None:
    """The confinement ``record`` describes, if its group still exists (after a daemon kill
    -9); None when it is gone or the record is unreadable. An rlimit record has no group and
    always reopens (its limits live on in the processes)."""
    try:
        data = ConfinementRecord.model_validate_json(record)
    except ValidationError:
        return None
    if data.version != RECORD_VERSION:
        return None
    groups = tuple(Path(group) for group in data.groups)
    if data.kind in ("cgroup-v1", "cgroup-v2") and not all(group.is_dir() for group in groups):
        return None
    if data.kind == "systemd-scope":
        from orchestrator.sandbox import systemd_scope

        if not systemd_scope.exists(data.scope_unit, user=data.scope_user):
            return None
    return Confinement(
        name=data.name,
        kind=data.kind,
        missing=data.missing,
        warning=data.warning,
        argv_prefix=data.argv_prefix,
        groups=groups,
        memory_usage_file=Path(data.memory_usage_file) if data.memory_usage_file else None,
        memory_limit_file=Path(data.memory_limit_file) if data.memory_limit_file else None,
        cpu_usage_file=Path(data.cpu_usage_file) if data.cpu_usage_file else None,
        scope_unit=data.scope_unit,
        scope_user=data.scope_user,
    )


def sweep(hierarchies: Sequence[Hierarchy] | None = None) -> list[Path]:
    """Remove empty leftover sandbox groups under our ``prime-agent`` parent in every tree
    (a group with processes is some live sandbox's and is kept); returns those removed."""
    found = cgroupfs.host_hierarchies() if hierarchies is None else list(hierarchies)
    removed: list[Path] = []
    for parent in cgroup_layout.parents(found, euid=os.geteuid()):
        try:
            children = [entry for entry in parent.iterdir() if entry.is_dir()]
        except OSError:
            continue
        for child in children:
            if cgroupfs.read_pids(child / PROCS_FILE):
                continue
            try:
                child.rmdir()
            except OSError:
                continue
            removed.append(child)
    return removed
