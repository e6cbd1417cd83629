"""The sandbox contract: one interface, several backends (local, docker, kubernetes).

A *backend* creates, lists, adopts and removes sandboxes. A *sandbox* is one session's isolated
REPL: a Jupyter Kernel Gateway with exactly one kernel that has the in-kernel runtime preloaded.
Kernel lifecycle (start/restart/stop) is kept apart from a single execution, as jupyter_client
does.

Conformance tests in ``tests/integration/test_sandbox_conformance.py`` run against every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "CellError",
    "CellResult",
    "CellStatus",
    "Sandbox",
    "SandboxBackend",
    "SandboxRef",
    "SandboxSpec",
]

CellStatus = Literal["ok", "error", "timeout", "aborted", "kernel_died"]


@dataclass(frozen=True)
class SandboxSpec:
    """What a session asks of its sandbox."""

    session_id: str
    cwd: Path
    artifacts_dir: Path  # where full cell outputs are written (host side)
    env: Mapping[str, str] = field(default_factory=dict)  # extra kernel env (no secrets!)
    labels: Mapping[str, str] = field(default_factory=dict)
    # True for runs without a daemon: the gateway and kernel die when this process dies.
    die_with_parent: bool = True


@dataclass(frozen=True)
class SandboxRef:
    """Enough to find a sandbox again (after a restart of the orchestrator)."""

    backend: str
    ref: str  # backend-specific: pid, container id, pod name
    session_id: str
    url: str  # kernel gateway base URL, e.g. http://127.0.0.1:PORT
    kernel_id: str
    token: str = field(repr=False)


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
    kernel_restarted: bool = False
    notice: str = ""  # e.g. "cell timed out after 600 s; kernel restarted, namespace lost"


class Sandbox(abc.ABC):
    """One session's REPL. Executions are serialized by the caller (one cell at a time)."""

    ref: SandboxRef

    @abc.abstractmethod
    async def execute(self, code: str, *, timeout_s: float, cell_id: str) -> CellResult:
        """Run ``code``; on timeout interrupt, and restart the kernel if it does not stop in time.

        Never raises for problems inside the cell; raises ``SandboxError`` only when the sandbox
        itself is unusable and could not be recovered.
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


class SandboxBackend(abc.ABC):
    name: str

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox and return when its kernel answers kernel_info (runtime loaded)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every sandbox this backend object started and still owns (pool included)."""
