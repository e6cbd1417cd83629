"""The bwrap sandbox's mount plan and command line (pure: no process, no file is touched).

``BwrapPlan`` says what the sandbox sees; ``bwrap_argv`` turns it into bubblewrap's arguments in
the order bubblewrap applies them (a later mount lies over an earlier one): system directories,
``/etc`` allowlist, synthesized files, ``/proc``, ``/dev``, the size-capped tmpfs ``/tmp`` and
home, then the session's binds (the interpreter environment, the workspace, the socket, outputs,
snapshot and skill directories), the tmpfs that hide orchestrator directories inside the
workspace, and last ``--remount-ro /``. docs/bwrap.md explains each choice.

The host-dependent inputs (which of ``/bin``, ``/lib64``... are symlinks, which ``/etc`` files
exist) are read by ``host_system_layout`` and ``present_etc_files``, kept apart so the plan is
testable anywhere (tests/unit/test_bwrap_argv.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = [
    "BIND_STAGE_DIR",
    "ETC_FILES",
    "ETC_NETWORK_FILES",
    "HOME_TMPFS_BYTES",
    "SANDBOX_HOSTNAME",
    "SYSTEM_DIRS",
    "TMP_TMPFS_BYTES",
    "Bind",
    "BwrapPlan",
    "DataFile",
    "bwrap_argv",
    "group_text",
    "host_system_layout",
    "hosts_text",
    "passwd_text",
    "present_etc_files",
    "staged",
]

MIB: Final = 1024 * 1024
TMP_TMPFS_BYTES: Final = 512 * MIB  # docker_run's TMPFS_TMP
HOME_TMPFS_BYTES: Final = 256 * MIB  # docker_run's TMPFS_HOME
TMP_MODE: Final = "1777"
HOME_MODE: Final = "0700"  # the sandbox user's own (bwrap makes it theirs)
HIDDEN_MODE: Final = "0000"
SANDBOX_HOSTNAME: Final = "sandbox"
SANDBOX_USER: Final = "sandbox"
# Read-only from the host, as they are: /usr, and the top-level system entries (symlinks into
# /usr on merged-/usr systems, directories elsewhere).
USR_DIR: Final = "/usr"
SYSTEM_DIRS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The /etc files a Python kernel and its tools need; nothing else of /etc is visible.
ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki",
    "/etc/alternatives",
    "/etc/os-release",
    "/etc/protocols",
    "/etc/services",
    "/etc/gai.conf",
    "/etc/mime.types",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/python3.12",
    "/etc/python3.13",
)
ETC_NETWORK_FILES: Final = ("/etc/resolv.conf",)  # only with the host's network
# Where the bind sources are staged as root (docs/bwrap.md, "Running as which uid").
BIND_STAGE_DIR: Final = "stage"


@dataclass(frozen=True)
class Bind:
    """A host directory (or file) at ``dest`` inside; read-only unless ``writable``."""

    source: str
    dest: str
    writable: bool = False


@dataclass(frozen=True)
class DataFile:
    """A read-only file inside whose content bwrap reads from the pipe ``fd``."""

    fd: int
    dest: str


@dataclass(frozen=True)
class BwrapPlan:
    """Everything a bwrap sandbox sees and runs; ``bwrap_argv`` renders it.

    Invariants: ``binds`` are applied in order after ``/tmp`` and the home tmpfs (so a bind
    may lie under ``/tmp``); ``hidden`` come after every bind (an empty tmpfs over an
    orchestrator directory inside the workspace); the root is read-only at the end.
    """

    uid: int
    gid: int
    command: tuple[str, ...]
    chdir: str
    home: str
    # /bin, /lib64...: a symlink target (copied as a symlink) or None (a directory, ro-bound).
    system: Mapping[str, str | None] = field(default_factory=dict)
    etc_files: tuple[str, ...] = ()
    data_files: tuple[DataFile, ...] = ()
    binds: tuple[Bind, ...] = ()
    hidden: tuple[str, ...] = ()
    network: bool = False
    die_with_parent: bool = False
    info_fd: int | None = None
    unset_env: tuple[str, ...] = ()
    tmp_bytes: int = TMP_TMPFS_BYTES
    home_bytes: int = HOME_TMPFS_BYTES


def bwrap_argv(bwrap: str, plan: BwrapPlan) -> list[str]:
    """bubblewrap's command line for ``plan`` (``bwrap`` is the program's path)."""
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        *(() if plan.network else ("--unshare-net",)),
        "--disable-userns",  # no nested user namespace: no way back to capabilities
        "--cap-drop",
        "ALL",
        "--new-session",  # no TIOCSTI into a terminal outside
        *(("--die-with-parent",) if plan.die_with_parent else ()),
        "--uid",
        str(plan.uid),
        "--gid",
        str(plan.gid),
        "--hostname",
        SANDBOX_HOSTNAME,
        "--ro-bind",
        USR_DIR,
        USR_DIR,
    ]
    for path, target in sorted(plan.system.items()):
        argv += ["--symlink", target, path] if target is not None else ["--ro-bind", path, path]
    for path in plan.etc_files:
        argv += ["--ro-bind", path, path]
    for data in plan.data_files:
        argv += ["--ro-bind-data", str(data.fd), data.dest]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(plan.tmp_bytes), "--perms", TMP_MODE, "--tmpfs", "/tmp"]
    argv += ["--size", str(plan.home_bytes), "--perms", HOME_MODE, "--tmpfs", plan.home]
    for bind in plan.binds:
        argv += ["--bind" if bind.writable else "--ro-bind", bind.source, bind.dest]
    for path in plan.hidden:
        argv += ["--perms", HIDDEN_MODE, "--tmpfs", path]
    argv += ["--remount-ro", "/"]
    if plan.info_fd is not None:
        argv += ["--info-fd", str(plan.info_fd)]
    for name in plan.unset_env:
        argv += ["--unsetenv", name]
    argv += ["--chdir", plan.chdir, "--", *plan.command]
    return argv


def staged(
    binds: Sequence[Bind], stage_root: Path
) -> tuple[tuple[Bind, ...], list[tuple[str, str]]]:
    """``binds`` with each source replaced by a mount point under ``stage_root`` (one numbered
    entry per bind), and the (host source, mount point) pairs to bind there first.

    As root the sandbox's bwrap runs as the unprivileged sandbox uid, which cannot reach a
    source under a 0700 directory (a venv under /root, a workspace under pytest's tmp). The
    backend bind-mounts every source at its mount point in a private mount namespace of the
    bwrap process (still root), and bwrap binds from there.
    """
    out: list[Bind] = []
    pairs: list[tuple[str, str]] = []
    for index, bind in enumerate(binds):
        point = str(stage_root / str(index))
        pairs.append((bind.source, point))
        out.append(Bind(point, bind.dest, bind.writable))
    return tuple(out), pairs


def passwd_text(uid: int, gid: int, home: str) -> str:
    """/etc/passwd inside: the sandbox user (``getpass``, ``~`` and ssh-like tools need one)."""
    return f"{SANDBOX_USER}:x:{uid}:{gid}:{SANDBOX_USER}:{home}:/bin/sh\n"


def group_text(gid: int) -> str:
    return f"{SANDBOX_USER}:x:{gid}:\n"


def hosts_text() -> str:
    return f"127.0.0.1\tlocalhost {SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost\n"


def host_system_layout(entries: Iterable[str] = SYSTEM_DIRS) -> dict[str, str | None]:
    """The host's ``entries`` that exist: a symlink's target, or None for a directory."""
    layout: dict[str, str | None] = {}
    for entry in entries:
        if os.path.islink(entry):
            layout[entry] = os.readlink(entry)
        elif os.path.isdir(entry):
            layout[entry] = None
    return layout


def present_etc_files(network: bool) -> tuple[str, ...]:
    """The allowlisted /etc entries that exist here (with ``/etc/resolv.conf`` when the
    sandbox shares the host's network)."""
    names = ETC_FILES + (ETC_NETWORK_FILES if network else ())
    return tuple(name for name in names if os.path.exists(name))
