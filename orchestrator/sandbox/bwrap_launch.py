"""How a bwrap sandbox is launched as a child process: what the child does between fork and
exec, and the host paths its plan needs (docs/bwrap.md, "Running as which uid").

- ``Launch.preexec``: join the limits (``confinement``) while still privileged; as root, bind
  the sources into a private mount namespace at stage points the sandbox uid can reach
  (bwrap resolves every bind source by path); then drop to the sandbox's uid and gid.
- ``interpreter_binds``: our interpreter environment, read-only at its own paths.
- ``orchestrator_dirs_under``: the orchestrator's own directories inside a workspace, which
  the sandbox must not see.
- ``pipe_with``: a pipe holding a synthesized file for ``--ro-bind-data``.

The sandbox and backend classes (``bwrap.py``) build the plan and start the child with these.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator.paths import Paths
from orchestrator.sandbox.bwrap_argv import USR_DIR, Bind
from orchestrator.sandbox.confinement import Confinement
from orchestrator.sandbox.local import SOURCE_ROOT

__all__ = [
    "Launch",
    "interpreter_binds",
    "orchestrator_dirs_under",
    "pipe_with",
]

# Linux mount(2)/unshare(2) flags (<sys/mount.h>, <sched.h>) for the root-only bind staging.
CLONE_NEWNS: Final = 0x00020000
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_SLAVE: Final = 1 << 19


def _under(path: Path, root: Path) -> bool:
    return path != root and path.is_relative_to(root)


def interpreter_binds() -> list[Bind]:
    """Our interpreter environment, read-only at its own paths: the venv (``sys.prefix``),
    the base installation when it is not under /usr, and the orchestrator package."""
    paths = [Path(sys.prefix).resolve()]
    base = Path(sys.base_prefix).resolve()
    if base not in paths and not (base == Path(USR_DIR) or _under(base, Path(USR_DIR))):
        paths.append(base)
    package = Path(SOURCE_ROOT) / "orchestrator"
    if not any(package == p or _under(package, p) for p in paths):
        paths.append(package)
    return [Bind(str(p), str(p)) for p in paths]


def _orchestrator_dirs() -> list[Path]:
    """The orchestrator's config, data, cache and runtime directories (never visible)."""
    paths = Paths.from_env()
    return [paths.config_dir, paths.data_dir, paths.cache_dir, paths.runtime_dir]


def orchestrator_dirs_under(workspace: Path) -> tuple[str, ...]:
    """The orchestrator's config, data, cache and runtime directories that lie inside
    ``workspace``: the plan covers them (``BwrapPlan.hidden``), so the sandbox never sees
    them although it sees the workspace."""
    return tuple(str(d) for d in _orchestrator_dirs() if _under(d, workspace))


def pipe_with(text: str) -> int:
    """A pipe's read end holding ``text`` (small: it fits the pipe buffer) for --ro-bind-data."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, text.encode())
    finally:
        os.close(write_fd)
    return read_fd


@dataclass
class Launch:
    """What the bwrap child needs between fork and exec, prepared before the fork (the preexec
    builds no object and no string: os and libc calls only)."""

    confinement: Confinement | None
    stage: list[tuple[bytes, bytes]]  # (host source, mount point): root only
    uid: int | None  # drop to this uid:gid (root only); None = stay who we are
    gid: int

    def __post_init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._unshare = libc.unshare
        self._mount = libc.mount

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def preexec(self) -> None:
        """Run in the child between fork and exec (``procs.start_child(preexec=…)``): join
        the limits, stage the bind sources (root only), drop the uid."""
        if self.confinement is not None:
            self.confinement.preexec()  # join the cgroup, set rlimits: still privileged
        if self.stage:
            # A private mount namespace of this one process (and so of the sandbox made from
            # it): the sources appear at mount points the sandbox uid can reach. Slave, so
            # nothing we mount here propagates back to the host.
            self._check(self._unshare(CLONE_NEWNS), "unshare")
            self._check(self._mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount")
            for source, point in self.stage:
                self._check(self._mount(source, point, None, MS_BIND | MS_REC, None), "bind")
        if self.uid is not None:
            os.setgroups([])
            os.setgid(self.gid)
            os.setuid(self.uid)
