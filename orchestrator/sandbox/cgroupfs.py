"""Where this host's cgroups are: parsing ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.

Pure functions over the text of those two files (unit-tested on given text) plus
``host_hierarchies``, which reads them. A *hierarchy* is one mounted cgroup tree: a v1 mount
carries one or more controllers (``memory``; ``cpu,cpuacct`` when co-mounted), the v2 mount
(``cgroup2``) carries whichever controllers are not bound to a v1 tree (its root's
``cgroup.controllers``). ``Hierarchy.own_dir`` is the directory of the group this process is
in, in that tree — the parent under which the daemon makes its sandboxes' groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "CGROUP2_FSTYPE",
    "CGROUP_FSTYPE",
    "V2_CPU",
    "V2_KEY",
    "V2_MEMORY",
    "V2_PIDS",
    "Hierarchy",
    "MountEntry",
    "hierarchies",
    "host_hierarchies",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_controllers",
    "read_int",
    "read_pids",
    "writable_dir",
]

CGROUP_FSTYPE: Final = "cgroup"
CGROUP2_FSTYPE: Final = "cgroup2"
# The key of the v2 tree in ``parse_proc_cgroup``'s result (its line reads ``0::/path``).
V2_KEY: Final = ""
# v2 controller names (v1 uses the same for these three).
V2_MEMORY: Final = "memory"
V2_PIDS: Final = "pids"
V2_CPU: Final = "cpu"
PROC_SELF_CGROUP: Final = Path("/proc/self/cgroup")
PROC_SELF_MOUNTINFO: Final = Path("/proc/self/mountinfo")
# mountinfo: the optional fields end with this separator; fstype, source, super options follow.
MOUNTINFO_SEPARATOR: Final = "-"
MOUNTINFO_ROOT_FIELD: Final = 3
MOUNTINFO_POINT_FIELD: Final = 4
# v1 mount options that are not controller names.
V1_NON_CONTROLLER_OPTIONS: Final = frozenset(
    {"rw", "ro", "noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods"}
)
V1_NAMED_PREFIX: Final = "name="


@dataclass(frozen=True)
class MountEntry:
    """One cgroup mount: ``root`` is the tree path mounted at ``mount_point``."""

    mount_point: Path
    root: str
    fstype: str
    options: frozenset[str]  # super options


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup tree, seen from this process.

    ``controllers``: what it carries (v1: the mount's controllers; v2: its root's
    ``cgroup.controllers``). ``own_dir``: this process's group in it, as a path under the
    mount point. ``version`` is 1 or 2.
    """

    version: int
    mount_point: Path
    controllers: frozenset[str]
    own_dir: Path

    @property
    def root_dir(self) -> Path:
        return self.mount_point


def unescape_mount_path(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo`` octal."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit() and i + 3 < len(text):
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """The cgroup and cgroup2 mounts listed in a ``/proc/<pid>/mountinfo`` text."""
    entries: list[MountEntry] = []
    for line in text.splitlines():
        fields = line.split()
        if MOUNTINFO_SEPARATOR not in fields:
            continue
        sep = fields.index(MOUNTINFO_SEPARATOR)
        if sep <= MOUNTINFO_POINT_FIELD or len(fields) < sep + 4:
            continue
        fstype = fields[sep + 1]
        if fstype not in (CGROUP_FSTYPE, CGROUP2_FSTYPE):
            continue
        entries.append(
            MountEntry(
                mount_point=Path(unescape_mount_path(fields[MOUNTINFO_POINT_FIELD])),
                root=unescape_mount_path(fields[MOUNTINFO_ROOT_FIELD]),
                fstype=fstype,
                options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return entries


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as controller -> group path.

    v1 lines (``4:memory:/a/b``, ``2:cpu,cpuacct:/``) give one key per controller; a named
    hierarchy (``1:name=systemd:/``) is keyed ``name=systemd``; the v2 line (``0::/path``) is
    keyed ``V2_KEY`` (the empty string).
    """
    groups: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            groups[V2_KEY] = path
            continue
        for controller in controllers.split(","):
            groups[controller] = path
    return groups


def v1_controllers(options: frozenset[str]) -> frozenset[str]:
    """The controllers a v1 mount's super options name (``rw,memory`` -> ``{memory}``)."""
    return frozenset(
        opt
        for opt in options
        if opt not in V1_NON_CONTROLLER_OPTIONS and not opt.startswith(V1_NAMED_PREFIX)
    )


def group_dir(mount: MountEntry, group_path: str) -> Path | None:
    """The directory of ``group_path`` (a ``/proc/self/cgroup`` path) under ``mount``; None
    when the group lies outside the mounted subtree (a mount of a sub-tree elsewhere)."""
    root = mount.root.rstrip("/")
    if root and group_path != root and not group_path.startswith(root + "/"):
        return None
    rel = group_path[len(root) :].strip("/")
    return mount.mount_point / rel if rel else mount.mount_point


def hierarchies(
    mountinfo: str, proc_cgroup: str, *, v2_controllers: frozenset[str] | None = None
) -> list[Hierarchy]:
    """Every cgroup tree this process can place groups in, from the two files' text.

    ``v2_controllers``: the v2 root's ``cgroup.controllers`` when known (given text in tests);
    None reads them from the mount (empty when unreadable). The first mount of each tree wins.
    """
    own = parse_proc_cgroup(proc_cgroup)
    found: list[Hierarchy] = []
    seen: set[frozenset[str]] = set()
    seen_v2 = False
    for mount in parse_mountinfo(mountinfo):
        if mount.fstype == CGROUP2_FSTYPE:
            if seen_v2 or V2_KEY not in own:
                continue
            directory = group_dir(mount, own[V2_KEY])
            if directory is None:
                continue
            controllers = (
                v2_controllers
                if v2_controllers is not None
                else read_controllers(mount.mount_point / "cgroup.controllers")
            )
            found.append(Hierarchy(2, mount.mount_point, controllers, directory))
            seen_v2 = True
            continue
        controllers = v1_controllers(mount.options)
        if not controllers or controllers in seen:
            continue
        paths = {own.get(c) for c in controllers}
        if len(paths) != 1 or None in paths:
            continue
        (path,) = paths
        assert path is not None
        directory = group_dir(mount, path)
        if directory is None:
            continue
        seen.add(controllers)
        found.append(Hierarchy(1, mount.mount_point, controllers, directory))
    return found


def host_hierarchies() -> list[Hierarchy]:
    """``hierarchies`` of this process, read from /proc (empty where /proc has no cgroups)."""
    try:
        mountinfo = PROC_SELF_MOUNTINFO.read_text()
        proc_cgroup = PROC_SELF_CGROUP.read_text()
    except OSError:
        return []
    return hierarchies(mountinfo, proc_cgroup)


def read_controllers(path: Path) -> frozenset[str]:
    """A ``cgroup.controllers`` / ``cgroup.subtree_control`` file as a set; empty if absent."""
    try:
        return frozenset(path.read_text().split())
    except OSError:
        return frozenset()


def read_int(path: Path) -> int | None:
    """The integer in a cgroup file (``max`` and unreadable files give None)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def read_pids(path: Path) -> list[int]:
    """The pids in a ``cgroup.procs`` file (empty when the group is gone)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [int(word) for word in text.split() if word.isdigit()]


def writable_dir(path: Path) -> bool:
    """True when this process may create groups under ``path``."""
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
