"""Who the sandbox container runs as, and whether that user can use the workspace.

- A non-root host user: the container runs as that user's ``uid:gid`` (as development
  containers do), so what the agent writes in a bind-mounted workspace belongs to the user; the
  image's HOME (a tmpfs, mode 1777) and ``USER``/``LOGNAME`` work for any uid.
- Root (this machine, CI): never root inside. The workspace owner's ``uid:gid`` when that is
  not root (``sudo`` in a user's project), else the image's user (``SANDBOX_UID``).

``workspace_problem`` says in one line why that user cannot enter the workspace (a root-owned
``mktemp -d`` is 0700) and what to do: ``--workspace copy`` (the private copy is given to the
sandbox's user: ``WorkspaceCopy.create(owner=...)``), or chmod/chown. Without it the start would
fail deep inside the gateway (``POST /api/kernels: HTTP 500 ... Permission denied``). The
user's directory is never chmodded behind their back.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from orchestrator.sandbox.base import WorkspaceMode

__all__ = ["SANDBOX_UID", "container_user", "workspace_problem"]

SANDBOX_UID: Final = 1000  # the image's non-root user (images/session/Dockerfile)
ROOT_UID: Final = 0
# Permission bits: read + search (enter) for the owner, the group, the others.
OWNER_RX: Final = stat.S_IRUSR | stat.S_IXUSR
GROUP_RX: Final = stat.S_IRGRP | stat.S_IXGRP
OTHER_RX: Final = stat.S_IROTH | stat.S_IXOTH


def container_user(
    workspace: Path, *, host_uid: int | None = None, host_gid: int | None = None
) -> tuple[int, int]:
    """(uid, gid) the container runs as for ``workspace`` (see the module docstring)."""
    uid = os.getuid() if host_uid is None else host_uid
    gid = os.getgid() if host_gid is None else host_gid
    if uid != ROOT_UID:
        return uid, gid
    st = workspace.stat()
    if st.st_uid != ROOT_UID:
        return st.st_uid, st.st_gid
    return SANDBOX_UID, SANDBOX_UID


def _can_enter(st: os.stat_result, uid: int, gid: int) -> bool:
    """``uid:gid`` (no supplementary groups: the container has none of the host's) may list
    and enter a directory with ``st``."""
    if uid == st.st_uid:
        return st.st_mode & OWNER_RX == OWNER_RX
    if gid == st.st_gid:
        return st.st_mode & GROUP_RX == GROUP_RX
    return st.st_mode & OTHER_RX == OTHER_RX


def workspace_problem(workspace: Path, uid: int, gid: int, mode: WorkspaceMode) -> str | None:
    """One line saying why the sandbox's ``uid`` cannot enter ``workspace`` and what to do;
    None when it can (or in ``copy`` mode, whose copy is made the sandbox user's)."""
    if mode == "copy":
        return None
    st = workspace.stat()
    if _can_enter(st, uid, gid):
        return None
    return (
        f"the workspace {workspace} (owner uid {st.st_uid}, mode "
        f"{stat.S_IMODE(st.st_mode):04o}) is not accessible to the sandbox's user "
        f"(uid {uid}): run with --workspace copy, or let that user in "
        f"(chmod o+rx {workspace}, or chown {uid} {workspace})"
    )
