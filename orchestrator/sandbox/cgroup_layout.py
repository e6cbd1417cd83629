"""Where the daemon puts its sandboxes' cgroups, and how it makes them.

Every sandbox group is ``<parent>/<name>`` with ``parent`` a directory named ``prime-agent``:

- cgroup v1: ``<own>/prime-agent`` in each controller's tree, ``<own>`` being this process's
  group there (``/proc/self/cgroup``). v1 has no rule against processes in inner groups, so the
  parent may sit right under our own group.
- cgroup v2 (``v2_parent``): the unified tree forbids a group that holds processes from
  handing domain controllers (memory, pids, cpu) to children — the *no-internal-processes
  rule* — except at the root. So our own group (which holds this daemon) can never be the
  parent. In order:
  1. ``<own>`` is already our leaf ``prime-agent-daemon`` (rule 3 ran before, in this
     process): its sibling ``prime-agent`` is the parent.
  2. As root: ``<root>/prime-agent`` (the root cgroup is exempt from the rule; we enable the
     controllers in the root's and the parent's ``cgroup.subtree_control``).
  3. Our own group is delegated to us (systemd's ``user.delegate``/``trusted.delegate`` xattr,
     i.e. a unit with ``Delegate=yes``; or we are root at the root of a cgroup namespace, a
     container's delegated tree): every process of our group moves into the leaf
     ``<own>/prime-agent-daemon`` — they are all this unit's —, then ``<own>`` enables the
     controllers and ``<own>/prime-agent`` is the parent.
  Else no v2 group (a plain user shell on a systemd host: ``confinement`` uses a transient
  scope instead). None of this has run for real on a v2 host here: the machine this was built
  on has cgroup v1 (unit tests lay a tree out like cgroupfs in a temporary directory).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox import cgroupfs
from orchestrator.sandbox.cgroupfs import Hierarchy

__all__ = [
    "DAEMON_LEAF",
    "PARENT_NAME",
    "group_name",
    "make_group",
    "parents",
    "v1_group_dir",
    "v2_parent",
]

PARENT_NAME: Final = "prime-agent"
DAEMON_LEAF: Final = "prime-agent-daemon"
GROUP_NAME_MAX: Final = 64
GROUP_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
# The controllers a sandbox group wants, in the order they are enabled (memory is required).
V2_WANTED: Final = (cgroupfs.V2_MEMORY, cgroupfs.V2_PIDS, cgroupfs.V2_CPU)
DELEGATE_XATTRS: Final = ("user.delegate", "trusted.delegate")
SUBTREE_CONTROL: Final = "cgroup.subtree_control"
PROCS_FILE: Final = "cgroup.procs"


def group_name(name: str) -> str:
    """``name`` as a safe directory name (letters, digits, ``_``, ``-``; at most 64)."""
    safe = GROUP_NAME_UNSAFE.sub("-", name)[:GROUP_NAME_MAX].strip("-")
    if not safe:
        raise SandboxStartError(f"sandbox name {name!r} gives no usable cgroup name")
    return safe


def v1_group_dir(tree: Hierarchy, name: str) -> Path:
    return tree.own_dir / PARENT_NAME / name


def make_group(directory: Path) -> None:
    """Create ``directory`` (and its parent); an existing empty one is reused.

    OSError when we may not; ``SandboxStartError`` when it exists and holds processes (a
    sandbox of that name runs: never share its group)."""
    directory.parent.mkdir(exist_ok=True)
    try:
        directory.mkdir()
    except FileExistsError:
        busy = cgroupfs.read_pids(directory / PROCS_FILE)
        if busy:
            raise SandboxStartError(
                f"cgroup {directory} still holds processes {busy[:5]}: a sandbox of that name runs"
            ) from None


def v2_parent(tree: Hierarchy, *, euid: int, own_pid: int) -> tuple[Path | None, str]:
    """The v2 parent of our sandbox groups (set up to hand them the controllers), or None
    and why not. See the module docstring for the rules."""
    own = tree.own_dir
    if own.name == DAEMON_LEAF and (own.parent / PARENT_NAME).is_dir():
        return own.parent / PARENT_NAME, ""
    if euid == 0 and cgroupfs.writable_dir(tree.mount_point):
        parent = tree.mount_point / PARENT_NAME
        if _hand_down(tree.mount_point) and _make_parent(parent):
            return parent, ""
    if not cgroupfs.writable_dir(own):
        return None, f"our group {own} is not writable (not delegated to us)"
    at_ns_root = own == tree.mount_point and euid == 0
    if not (at_ns_root or delegated(own)):
        return None, f"our group {own} is not delegated to us"
    leaf = own / DAEMON_LEAF
    try:
        leaf.mkdir(exist_ok=True)
        for pid in cgroupfs.read_pids(own / PROCS_FILE) or [own_pid]:
            with contextlib.suppress(ProcessLookupError):
                (leaf / PROCS_FILE).write_text(str(pid))
    except OSError as exc:
        return None, f"cannot move our processes into {leaf} ({exc.strerror or exc})"
    parent = own / PARENT_NAME
    if _hand_down(own) and _make_parent(parent):
        return parent, ""
    return None, f"cannot enable the memory controller under {own}"


def delegated(directory: Path) -> bool:
    """True when systemd marked ``directory`` as delegated (``Delegate=yes``)."""
    for attr in DELEGATE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(directory, attr) == b"1":
                return True
    return False


def _hand_down(directory: Path) -> bool:
    """Enable the wanted controllers for ``directory``'s children; True when memory is on.

    One write with all of them (the kernel takes it whole or not at all), else one each."""
    available = cgroupfs.read_controllers(directory / "cgroup.controllers")
    wanted = [c for c in V2_WANTED if c in available]
    control = directory / SUBTREE_CONTROL
    try:
        control.write_text(" ".join(f"+{c}" for c in wanted))
    except OSError:
        for controller in wanted:
            with contextlib.suppress(OSError):
                control.write_text(f"+{controller}")
    return cgroupfs.V2_MEMORY in cgroupfs.read_controllers(control)


def _make_parent(parent: Path) -> bool:
    try:
        parent.mkdir(exist_ok=True)
    except OSError:
        return False
    return _hand_down(parent)


def parents(found: Sequence[Hierarchy], *, euid: int) -> list[Path]:
    """Every existing ``prime-agent`` parent directory in ``found`` (for ``sweep``)."""
    candidates: list[Path] = []
    for tree in found:
        candidates.append(tree.own_dir / PARENT_NAME)
        if tree.version == 2:
            candidates.append(tree.own_dir.parent / PARENT_NAME)
            if euid == 0:
                candidates.append(tree.mount_point / PARENT_NAME)
    unique: list[Path] = []
    for candidate in candidates:
        if candidate not in unique and candidate.is_dir():
            unique.append(candidate)
    return unique
