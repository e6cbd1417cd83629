"""Confinement's parsing and choices on given text and on trees laid out like cgroupfs.

``/proc/self/cgroup`` and mountinfo parsing run on fixed text; the cgroup v2 layout choice and
the warnings run on directories in tmp_path shaped like a cgroupfs (plain files, so writes are
kept as written). cgroup v2 has not run for real on the machine this was built on (it has v1:
tests/integration/test_confinement.py); see docs/limits.md.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox import cgroup_layout, cgroupfs
from orchestrator.sandbox.base import ResourceLimits
from orchestrator.sandbox.cgroupfs import Hierarchy
from orchestrator.sandbox.confinement import confine, reopen

MIB = 1024**2
LIMITS = ResourceLimits(memory_bytes=64 * MIB, cpus=1.5, pids=32)
UID = 1000
OWN_PID = 4242

# This machine's files (cgroup v1 plus an empty v2 tree at /sys/fs/cgroup/unified).
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/6142
2:cpuacct:/
1:cpu:/
0::/
"""
HYBRID_MOUNTINFO = """\
24 29 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# A systemd host with the unified tree only, and a co-mounted v1 cpu,cpuacct elsewhere.
V2_CGROUP = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope\n"
V2_MOUNTINFO = (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2"
    " rw,nsdelegate,memory_recursiveprot\n"
)
COMOUNTED_CGROUP = "3:cpu,cpuacct:/docker/abc\n2:memory:/docker/abc\n"
COMOUNTED_MOUNTINFO = (
    "40 31 0:40 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
    "41 31 0:41 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
    "42 31 0:42 /docker/xyz /mnt/other\\040tree ro - cgroup cgroup rw,blkio\n"
)


def test_proc_cgroup_parses_v1_named_and_v2_lines() -> None:
    assert cgroupfs.parse_proc_cgroup(HYBRID_CGROUP) == {
        "name=systemd": "/",
        "pids": "/",
        "memory": "/process_api/6142",
        "cpuacct": "/",
        "cpu": "/",
        "": "/",
    }
    assert cgroupfs.parse_proc_cgroup(COMOUNTED_CGROUP)["cpuacct"] == "/docker/abc"
    assert cgroupfs.parse_proc_cgroup("garbage\n") == {}


def test_mountinfo_keeps_cgroup_mounts_with_root_and_unescaped_paths() -> None:
    mounts = cgroupfs.parse_mountinfo(COMOUNTED_MOUNTINFO + HYBRID_MOUNTINFO)
    assert [m.mount_point for m in mounts][:3] == [
        Path("/sys/fs/cgroup/cpu,cpuacct"),
        Path("/sys/fs/cgroup/memory"),
        Path("/mnt/other tree"),
    ]
    assert mounts[0].root == "/docker/abc"
    assert mounts[0].options == frozenset({"rw", "cpu", "cpuacct"})
    assert all(m.fstype in ("cgroup", "cgroup2") for m in mounts)
    assert len(mounts) == 3 + 6  # /proc and the tmpfs are not cgroups


def test_hybrid_host_gives_one_tree_per_v1_controller_and_the_empty_v2() -> None:
    found = cgroupfs.hierarchies(HYBRID_MOUNTINFO, HYBRID_CGROUP, v2_controllers=frozenset())
    by_controllers = {tuple(sorted(t.controllers)): t for t in found if t.version == 1}
    assert set(by_controllers) == {("cpu",), ("cpuacct",), ("memory",), ("pids",)}
    assert by_controllers[("memory",)].own_dir == Path("/sys/fs/cgroup/memory/process_api/6142")
    assert by_controllers[("pids",)].own_dir == Path("/sys/fs/cgroup/pids")
    (v2,) = [t for t in found if t.version == 2]
    assert v2.controllers == frozenset() and v2.own_dir == Path("/sys/fs/cgroup/unified")


def test_a_mounted_subtree_maps_our_group_below_its_root() -> None:
    found = cgroupfs.hierarchies(COMOUNTED_MOUNTINFO, COMOUNTED_CGROUP)
    (cpu,) = [t for t in found if "cpu" in t.controllers]
    assert cpu.controllers == frozenset({"cpu", "cpuacct"})
    assert cpu.own_dir == Path("/sys/fs/cgroup/cpu,cpuacct")
    # blkio's mount is of /docker/xyz and we are in no blkio group: not a usable tree.
    assert [t for t in found if "blkio" in t.controllers] == []


def test_v2_only_host_points_at_our_scope() -> None:
    found = cgroupfs.hierarchies(
        V2_MOUNTINFO, V2_CGROUP, v2_controllers=frozenset({"memory", "pids", "cpu"})
    )
    (v2,) = found
    assert v2.version == 2
    assert v2.own_dir == Path(
        "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/term.scope"
    )


# -- the v2 layout on a tree in tmp_path ---------------------------------------------------------


def _v2_tree(root: Path, own: str) -> Hierarchy:
    """A unified tree with our group at ``own``; the ``prime-agent`` directories the code may
    make are made beforehand with the ``cgroup.controllers`` the kernel would give them."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    own_dir = root / own
    own_dir.mkdir(parents=True, exist_ok=True)
    (own_dir / "cgroup.controllers").write_text("cpu memory pids\n")
    (own_dir / "cgroup.procs").write_text(f"{OWN_PID}\n777\n")
    for parent in (root / "prime-agent", own_dir / "prime-agent"):
        parent.mkdir()
        (parent / "cgroup.controllers").write_text("cpu memory pids\n")
    return Hierarchy(2, root, frozenset({"cpu", "io", "memory", "pids"}), own_dir)


def test_v2_as_root_uses_a_child_of_the_root_cgroup(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path, "system.slice/prime.service")
    parent, why = cgroup_layout.v2_parent(tree, euid=0, own_pid=OWN_PID)
    assert (parent, why) == (tmp_path / "prime-agent", "")
    assert cgroupfs.read_controllers(tmp_path / "cgroup.subtree_control") == {
        "memory",
        "pids",
        "cpu",
    }
    # Nobody was moved: the root cgroup may hold processes and hand down controllers.
    assert (tree.own_dir / "cgroup.procs").read_text() == f"{OWN_PID}\n777\n"


def test_v2_not_root_and_not_delegated_gives_no_group(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path, "user.slice/user-1000.slice/session-2.scope")
    parent, why = cgroup_layout.v2_parent(tree, euid=UID, own_pid=OWN_PID)
    assert parent is None
    assert why == f"our group {tree.own_dir} is not delegated to us"
    assert not (tree.own_dir / cgroup_layout.DAEMON_LEAF).exists()


def test_v2_delegated_group_moves_its_processes_into_a_leaf(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path, "user.slice/user@1000.service/app.slice/prime.service")
    try:
        os.setxattr(tree.own_dir, "user.delegate", b"1")
    except OSError as exc:
        pytest.fail(f"tmp_path takes no user xattrs ({exc}): cannot lay out a delegated group")
    parent, why = cgroup_layout.v2_parent(tree, euid=UID, own_pid=OWN_PID)
    assert (parent, why) == (tree.own_dir / "prime-agent", "")
    leaf = tree.own_dir / cgroup_layout.DAEMON_LEAF
    # A plain file keeps the last pid written; the kernel would list both.
    assert (leaf / "cgroup.procs").read_text() == "777"
    assert cgroupfs.read_controllers(tree.own_dir / "cgroup.subtree_control") == {
        "cpu",
        "memory",
        "pids",
    }
    # The next confine in this daemon sees itself in the leaf and reuses the parent.
    moved = Hierarchy(2, tree.mount_point, tree.controllers, leaf)
    assert cgroup_layout.v2_parent(moved, euid=UID, own_pid=OWN_PID) == (parent, "")


def test_v2_confine_writes_the_limits_in_the_unified_files(tmp_path: Path) -> None:
    tree = _v2_tree(tmp_path, "system.slice/prime.service")
    group = tmp_path / "prime-agent" / "sbx"
    group.mkdir()  # as the kernel would: the files exist when the group does
    (group / "cgroup.controllers").write_text("cpu memory pids\n")
    (group / "memory.swap.max").write_text("max\n")
    made = confine("sbx", LIMITS, uid=UID, hierarchies=[tree])
    assert made.kind == "cgroup-v2"
    assert (made.missing, made.warning, made.groups) == ((), "", (group,))
    assert (group / "memory.max").read_text() == str(64 * MIB)
    assert (group / "memory.swap.max").read_text() == "0"
    assert (group / "pids.max").read_text() == "32"
    assert (group / "cpu.max").read_text() == "150000 100000"
    (group / "memory.current").write_text("1234\n")
    (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 1\n")
    used = made.usage()
    assert (used.memory_bytes, used.memory_limit_bytes, used.cpu_seconds) == (1234, 64 * MIB, 2.5)
    again = reopen(made.record())
    assert again is not None and again.groups == (group,)


# -- warnings -------------------------------------------------------------------------------------


def test_v1_with_memory_only_warns_of_each_weaker_limit(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    tree = Hierarchy(1, memory, frozenset({"memory"}), memory)
    made = confine("sbx", LIMITS, uid=UID, hierarchies=[tree], systemd=False)
    assert made.kind == "cgroup-v1"
    assert made.missing == ("cpus",)
    assert made.warning == (
        "prime-agent: cgroup v1: no swap accounting: swap not limited, no pids cgroup: pids via"
        f" RLIMIT_NPROC (shared by every process of uid {UID}), no cpu limit (no cpu cgroup)"
    )
    (value,) = [v for which, v in made.rlimits if which == resource.RLIMIT_NPROC]
    assert value >= 32
    assert (memory / "prime-agent" / "sbx" / "memory.limit_in_bytes").read_text() == str(64 * MIB)


def test_rlimit_warning_for_root_says_no_pids_limit() -> None:
    made = confine("sbx", LIMITS, uid=0, hierarchies=[], systemd=False)
    assert made.kind == "rlimit"
    assert made.missing == ("pids", "cpus")
    assert made.warning == (
        "prime-agent: no usable cgroup (none mounted): memory via RLIMIT_AS only (address space"
        " per process, not the tree's memory), no pids limit (RLIMIT_NPROC is not enforced for"
        " root), no cpu limit"
    )
    assert made.rlimits == ((resource.RLIMIT_AS, 64 * MIB),)


def test_limits_not_asked_for_are_not_missing() -> None:
    made = confine(
        "sbx", ResourceLimits(memory_bytes=64 * MIB), uid=UID, hierarchies=[], systemd=False
    )
    assert made.missing == ()
    assert "cpu" not in made.warning and "RLIMIT_NPROC" not in made.warning


def test_systemd_scope_is_an_argv_prefix() -> None:
    made = confine("sbx 1", LIMITS, uid=UID, hierarchies=[], systemd=True)
    assert made.kind == "systemd-scope"
    assert (made.missing, made.warning, made.groups, made.rlimits) == ((), "", (), ())
    user = ["--user"] if os.geteuid() != 0 else []
    assert list(made.argv_prefix) == [
        "systemd-run",
        *user,
        "--scope",
        "--quiet",
        "--collect",
        "--unit=prime-agent-sbx-1",
        "-p",
        f"MemoryMax={64 * MIB}",
        "-p",
        "MemorySwapMax=0",
        "-p",
        "TasksMax=32",
        "-p",
        "CPUQuota=150%",
        "--",
    ]
    made.preexec()  # nothing to join: systemd-run does it


def test_group_names_are_made_safe() -> None:
    assert cgroup_layout.group_name("bwrap/../x y") == "bwrap----x-y"
    with pytest.raises(SandboxStartError):
        cgroup_layout.group_name("../")


def test_reopen_of_an_unreadable_or_vanished_record_is_none() -> None:
    assert reopen("not json") is None
    assert reopen('{"name": "x", "kind": "cgroup-v1", "groups": ["/nonexistent/x"]}') is None


def test_reopen_finds_a_group_with_some_directories_left(tmp_path: Path) -> None:
    left = tmp_path / "pids-group"
    left.mkdir()
    gone = tmp_path / "memory-group-gone"
    record = json.dumps({"name": "x", "kind": "cgroup-v1", "groups": [str(gone), str(left)]})
    again = reopen(record)
    assert again is not None and again.groups == (gone, left)
    again.remove()  # what a cut-short remove left, removed now
    assert not left.exists()
