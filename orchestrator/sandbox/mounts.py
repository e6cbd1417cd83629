"""Extra mounts: a host directory shown at one more path inside a session's sandbox.

A Harbor / Terminal-Bench task expects its files at fixed paths — the environment's working
directory (``/app``), the verifier's tests at ``/tests`` and its reward under ``/logs`` — while
our sandboxes show the workspace at the project's own path. An ``ExtraMount`` binds a host
directory at such a path. Only the docker backend makes them (``docker_run.run_container``);
the others refuse a spec that has any, in one line, rather than run without them.

Who may ask: a client of the daemon's 0600 socket, when it creates a root session (the same
user, who could point ``cwd`` anywhere already). A child shares its parent's sandbox policy and
cannot add any, so nothing running inside a sandbox can widen what it sees.

Invariants (``check_mounts``), so a mount can never hide or replace what the sandbox needs:

- the source is an absolute, existing directory on the host;
- the target is an absolute, normalised path, not ``/``, and neither inside nor above the
  paths the sandbox itself uses (``RESERVED_TARGETS``: the runtime, its sockets, ``/tmp``,
  the home, snapshots, and the system directories); nor inside or above the workspace;
- no two mounts share a target.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from orchestrator.errors import SandboxStartError

__all__ = ["MAX_MOUNTS", "RESERVED_TARGETS", "ExtraMount", "check_mounts"]

MAX_MOUNTS: Final = 8
# Paths inside a sandbox that a mount may not cover, hide or sit inside.
RESERVED_TARGETS: Final = (
    "/bin",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib64",
    "/opt/prime-agent",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var/lib/prime-agent",
)


@dataclass(frozen=True)
class ExtraMount:
    source: Path  # a host directory
    target: str  # where the sandbox shows it
    read_only: bool = False


def _overlaps(a: str, b: str) -> bool:
    """``a`` is ``b``, or one of them lies inside the other."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def check_mounts(mounts: Iterable[ExtraMount], workspace: Path) -> tuple[ExtraMount, ...]:
    """``mounts`` when they keep the invariants above; else ``SandboxStartError`` naming the
    first that does not."""
    checked: list[ExtraMount] = []
    seen: set[str] = set()
    for mount in mounts:
        target = mount.target
        if not target.startswith("/") or posixpath.normpath(target) != target or target == "/":
            raise SandboxStartError(
                f"mount target {target!r} must be an absolute, normalised path other than /"
            )
        for reserved in RESERVED_TARGETS:
            if _overlaps(target, reserved):
                raise SandboxStartError(
                    f"mount target {target} overlaps {reserved}, which the sandbox itself uses"
                )
        if _overlaps(target, str(workspace)):
            raise SandboxStartError(f"mount target {target} overlaps the workspace {workspace}")
        if target in seen:
            raise SandboxStartError(f"two mounts share the target {target}")
        seen.add(target)
        if not mount.source.is_absolute() or not mount.source.is_dir():
            raise SandboxStartError(f"mount source {mount.source} is not an existing directory")
        checked.append(mount)
    if len(checked) > MAX_MOUNTS:
        raise SandboxStartError(f"{len(checked)} mounts; a sandbox may have {MAX_MOUNTS}")
    return tuple(checked)
