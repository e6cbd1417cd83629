"""The sandbox contract: one interface, several backends (local, docker, kubernetes).

A *backend* creates, lists, adopts and removes sandboxes. A *sandbox* is one session's isolated
REPL: a Jupyter Kernel Gateway with exactly one kernel that has the in-kernel runtime preloaded.
Kernel lifecycle (start/restart/stop) is kept apart from a single execution, as jupyter_client
does.

Conformance tests in ``tests/integration/test_sandbox_conformance.py`` run against every backend.
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from orchestrator.errors import SandboxError, SandboxStartError
from orchestrator.sandbox.mounts import ExtraMount

__all__ = [
    "PYTHONPATH_ENV",
    "SANDBOX_LOG_TAIL_LINES",
    "WORKSPACE_MODES",
    "CellError",
    "CellResult",
    "CellStatus",
    "OutputListener",
    "PodDetails",
    "PodEvent",
    "ResourceLimits",
    "Sandbox",
    "SandboxBackend",
    "SandboxInfo",
    "SandboxListener",
    "SandboxRef",
    "SandboxSpec",
    "SilentRunner",
    "WorkspaceMode",
    "checked_skill_dirs",
    "with_import_path",
]

# Called with (stream, text) for each piece of a running cell's output, cleaned as the result
# will hold it (stdout, stderr, result, display, traceback); for live views only.
OutputListener = Callable[[str, str], None]

log = logging.getLogger(__name__)

CellStatus = Literal["ok", "error", "timeout", "aborted", "kernel_died"]

# How the session's project directory reaches its sandbox (docs/docker.md, "Workspace modes"):
# rw bind, ro bind, or a private copy synced back when the sandbox stops.
WorkspaceMode = Literal["rw", "ro", "copy"]
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("rw", "ro", "copy")
PYTHONPATH_ENV = "PYTHONPATH"
# ``Sandbox.info`` returns at most this many of the sandbox's last log lines.
SANDBOX_LOG_TAIL_LINES: Final = 20


@dataclass(frozen=True)
class ResourceLimits:
    """A sandbox's limits (containers); a field left None takes the backend's default."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None

    def over(self, default: ResourceLimits) -> ResourceLimits:
        """These limits, with ``default``'s value wherever one of ours is None."""
        return ResourceLimits(
            memory_bytes=default.memory_bytes if self.memory_bytes is None else self.memory_bytes,
            cpus=default.cpus if self.cpus is None else self.cpus,
            pids=default.pids if self.pids is None else self.pids,
        )


@dataclass(frozen=True)
class SandboxSpec:
    """What a session asks of its sandbox."""

    session_id: str
    cwd: Path
    artifacts_dir: Path  # where full cell outputs are written (host side)
    env: Mapping[str, str] = field(default_factory=dict)  # extra kernel env (no secrets!)
    labels: Mapping[str, str] = field(default_factory=dict)
    # True for runs without a daemon: the gateway and kernel die when this process dies.
    # False for the daemon's sandboxes: they outlive a daemon crash and the next daemon adopts
    # them (the backend reports them to its ``listener``, which records them).
    die_with_parent: bool = True
    # The session's sandbox policy; None = the backend's default (Settings.sandbox). A child's
    # spec copies its parent's unless the spawn says otherwise.
    image: str | None = None  # "session", "rust", "cuda" or an image tag (docker only)
    workspace: WorkspaceMode | None = None
    limits: ResourceLimits | None = None
    network: bool | None = None  # outside network (docker: bridge instead of none)
    # Host directory for the session's namespace snapshots (docs/snapshots.md); None = no
    # snapshots. A local kernel uses it as it is; a docker container has it mounted at a fixed
    # path (``Sandbox.kernel_snapshot_dir``).
    snapshot_dir: Path | None = None
    # Directories of Python-backed skills (orchestrator/harness/skills.py). Each one is itself
    # an entry of the kernel's import path (PYTHONPATH), so ``import <skill>`` works; the
    # docker backend mounts each read-only (docs/harness.md, "Skills"). Part of the policy: a
    # child's spec copies its parent's.
    skill_dirs: tuple[Path, ...] = ()
    # Host directories shown at more paths inside (``sandbox/mounts.py``; docker only): part
    # of the policy, so a child has its parent's.
    mounts: tuple[ExtraMount, ...] = ()


def checked_skill_dirs(dirs: Sequence[Path]) -> tuple[Path, ...]:
    """``SandboxSpec.skill_dirs`` resolved; ``SandboxStartError`` for one that is not a
    directory (a bind mount would create it empty, and an import would fail far from here)."""
    checked = []
    for directory in dirs:
        resolved = directory.resolve()
        if not resolved.is_dir():
            raise SandboxStartError(f"skill directory {directory} does not exist")
        if os.pathsep in str(resolved):  # it would split into two PYTHONPATH entries
            raise SandboxStartError(f"skill directory {directory} has {os.pathsep!r} in its path")
        checked.append(resolved)
    return tuple(checked)


def with_import_path(env: Mapping[str, str], entries: Sequence[str]) -> dict[str, str]:
    """``env`` with ``entries`` put first on its PYTHONPATH (kept when ``entries`` is empty)."""
    result = dict(env)
    if entries:
        tail = [result[PYTHONPATH_ENV]] if result.get(PYTHONPATH_ENV) else []
        result[PYTHONPATH_ENV] = os.pathsep.join([*entries, *tail])
    return result


@dataclass(frozen=True)
class SandboxRef:
    """Enough to find a sandbox again (after a restart of the orchestrator)."""

    backend: str
    ref: str  # backend-specific: pid, container id, pod name
    session_id: str
    url: str  # kernel gateway base URL, e.g. http://127.0.0.1:PORT
    kernel_id: str  # "" while the sandbox is starting
    token: str = field(repr=False)
    # Host-side private directory of the sandbox (local: the gateway's runtime dir; docker: the
    # directory holding its sockets); removed with the sandbox.
    runtime_dir: str = ""


class SandboxListener(Protocol):
    """Told about every sandbox whose ``SandboxSpec.die_with_parent`` is False: the daemon
    records them so that its successor can adopt them (``orchestrator/sessions/adoption.py``).

    ``sandbox_up`` comes as soon as there is something to clean up (a process, a container;
    ``kernel_id`` still empty), again when the kernel is ready and when a pooled sandbox is
    handed to a session; ``sandbox_down`` after the sandbox is gone. Neither may raise.
    """

    async def sandbox_up(self, ref: SandboxRef) -> None: ...

    async def sandbox_down(self, ref: SandboxRef) -> None: ...


@dataclass(frozen=True)
class CellError:
    ename: str
    evalue: str
    traceback: str  # ANSI stripped, joined lines


@dataclass
class CellResult:
    """One execution, already bounded: every text field is at most the output cap."""

    status: CellStatus
    stdout: str = ""
    stderr: str = ""
    result: str = ""  # text/plain repr of the last expression
    display: str = ""  # text/plain of display_data messages, joined
    error: CellError | None = None
    duration_ms: float = 0.0
    truncated_chars: int = 0  # total chars left out of the fields above
    artifact_path: Path | None = None  # full, untruncated output (only when something was cut)
    artifact_bytes: int = 0  # its size
    kernel_restarted: bool = False
    notice: str = ""  # e.g. "cell timed out after 600 s; kernel restarted, namespace lost"


@dataclass(frozen=True)
class PodEvent:
    """One core/v1 Event about a pod (``k8s_pod_info.py``): ``kind`` is ``Normal`` or
    ``Warning``, ``count`` how often it happened, ``at`` when it last did (aware UTC)."""

    at: datetime | None
    kind: str
    reason: str
    message: str
    count: int = 1


@dataclass(frozen=True)
class PodDetails:
    """What a Kubernetes sandbox adds to ``SandboxInfo``: where the pod runs, how it fares,
    its newest events (oldest first) and its resource use from metrics.k8s.io, or in
    ``metrics`` why there is none ("no metrics server")."""

    namespace: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    node: str | None = None
    ip: str | None = None
    restarts: int = 0
    events: tuple[PodEvent, ...] = ()
    cpu_millicores: float | None = None  # over the metrics window (1000 = one CPU busy)
    metrics: str = ""  # "" when cpu and memory come from metrics.k8s.io, else why not


@dataclass(frozen=True)
class SandboxInfo:
    """What a sandbox can tell about itself now (the control API's ``sandbox_info``); a field
    a backend cannot know is None. ``cpu_seconds`` is the CPU time used since it started (all
    its processes), ``memory_bytes`` what it holds now (RSS, or the container's usage)."""

    name: str  # "pid 1234", a container's name, a pod's name
    image: str | None = None
    state: str = "unknown"  # "running", "exited", ... (the backend's word)
    started_at: datetime | None = None  # aware UTC
    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    log_tail: tuple[str, ...] = ()  # at most SANDBOX_LOG_TAIL_LINES, oldest first
    pod: PodDetails | None = None  # the kubernetes backend's pod; None for other backends


class SilentRunner(Protocol):
    """Runs host code in the kernel silently (no history, no output, not a model cell) and
    returns the ``execute_reply`` content; raises ``SandboxError`` when it fails."""

    def __call__(
        self,
        code: str,
        *,
        user_expressions: Mapping[str, str] | None = ...,
        timeout_s: float,
    ) -> Awaitable[dict[str, Any]]: ...


class Sandbox(abc.ABC):
    """One session's REPL. Executions are serialized by the caller (one cell at a time)."""

    ref: SandboxRef
    # Awaited after every kernel (re)start inside this sandbox once the session's cwd and env
    # are in place, before any cell runs there: the gateway's restart of a dead kernel, a
    # timeout's restart, a replaced container. It gets a runner that takes no lock (it runs
    # inside an execution). The session manager revives the namespace here (docs/snapshots.md).
    after_kernel_start: Callable[[SilentRunner], Awaitable[None]] | None = None
    # Where this sandbox's kernel sees ``spec.snapshot_dir``; None = at the host's path (a local
    # kernel). The docker backend mounts it at one fixed path in every container.
    kernel_snapshot_dir: str | None = None

    async def run_silent(
        self, code: str, *, user_expressions: Mapping[str, str] | None = None, timeout_s: float
    ) -> dict[str, Any]:
        """Run host code between cells (serialized with them), silently; see ``SilentRunner``."""
        raise SandboxError(f"{type(self).__name__} cannot run host code")

    @abc.abstractmethod
    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        cell_id: str,
        on_output: OutputListener | None = None,
    ) -> CellResult:
        """Run ``code``; on timeout interrupt, and restart the kernel if it does not stop in time.

        Never raises for problems inside the cell; raises ``SandboxError`` only when the sandbox
        itself is unusable and could not be recovered. ``on_output`` sees the cell's output as
        it arrives, cleaned (``OutputListener``); the result holds it all the same.
        """

    @abc.abstractmethod
    async def interrupt(self) -> None: ...

    @abc.abstractmethod
    async def restart_kernel(self) -> None:
        """Restart the kernel (namespace lost) and wait until it answers kernel_info."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop gateway and kernel; leaves no process, container or pod behind. Idempotent."""

    @abc.abstractmethod
    async def is_alive(self) -> bool: ...

    async def info(self) -> SandboxInfo:
        """Name, state and resource use, as far as the backend knows them (this default
        knows only whether the kernel answers). Never raises for a sandbox that is gone."""
        try:
            alive = await self.is_alive()
        except Exception:
            alive = False
        name = self.ref.ref or self.ref.session_id
        return SandboxInfo(name=name, state="running" if alive else "stopped")


class SandboxBackend(abc.ABC):
    name: str
    # Set by the daemon before the first ``create``; None = nothing is recorded (print mode).
    listener: SandboxListener | None = None

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox and return when its kernel answers kernel_info (runtime loaded)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every sandbox this backend object started and still owns (pool included)."""

    async def adopt(self, ref: SandboxRef, spec: SandboxSpec) -> Sandbox:
        """Re-attach to a sandbox a previous orchestrator started (``ref`` as its listener was
        told) for the session of ``spec``; its kernel (namespace included) is kept. A kernel in
        the middle of a cell is interrupted first. Raises ``SandboxError`` when the sandbox is
        gone or does not answer; the caller then ``remove``s it. The adopted sandbox is owned
        by this backend from now on (``close`` stops it)."""
        raise SandboxError(f"the {self.name} backend cannot adopt sandboxes")

    async def remove(self, ref: SandboxRef) -> None:
        """Remove what is left of a recorded sandbox that is not adopted (never raises for a
        sandbox that is already gone)."""
        return None

    async def remove_unknown(self, known: set[str]) -> int:
        """Remove sandboxes this daemon's predecessors started that carry our labels but are
        not among ``known`` (recorded refs); returns how many were removed."""
        return 0

    async def _report_up(self, ref: SandboxRef) -> None:
        if self.listener is not None:
            await _quietly(self.listener.sandbox_up(ref), "recording", ref)

    async def _report_down(self, ref: SandboxRef) -> None:
        if self.listener is not None:
            await _quietly(self.listener.sandbox_down(ref), "forgetting", ref)


async def _quietly(work: Awaitable[None], what: str, ref: SandboxRef) -> None:
    # A failed record costs adoption after a crash, never the sandbox itself.
    try:
        await work
    except Exception:
        log.exception("%s sandbox %s/%s failed", what, ref.backend, ref.ref)
