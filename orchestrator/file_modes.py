"""Owner-only modes for what the orchestrator keeps on disk (R15): files 0600, directories 0700.

The daemon (and a print-mode run) write their state with the process umask: the DuckDB file and
its ``.wal`` (which DuckDB removes at a checkpoint and creates again on the next write), the
nats-server's JetStream store and logs (the server is our child and inherits the umask), the
daemon's log, artifacts. ``use_private_umask`` sets ``PRIVATE_UMASK`` once for the process, so
every file created later is private too; a child that writes the user's own files (a local
sandbox's gateway and kernel: the agent's files in the workspace) gets the umask the process
started with back (``user_umask``, passed to ``procs.start_child``).

``tighten_state`` chmods what an earlier version left with the default modes (the log, the
database and its WAL, the NATS directories, artifacts and snapshot roots), at daemon start.
What a sandbox writes for itself keeps its own modes: a docker container's snapshot directory
is 0777 on purpose (docs/snapshots.md), inside the 0700 data directory.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

from orchestrator.paths import Paths

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PRIVATE_UMASK",
    "tighten_state",
    "use_private_umask",
    "user_umask",
]

PRIVATE_UMASK: Final = 0o077
PRIVATE_FILE_MODE: Final = 0o600
PRIVATE_DIR_MODE: Final = 0o700
NATS_SUBDIR: Final = "nats"  # bus/server.py's STORE_SUBDIR, under both data and runtime dirs
SNAPSHOTS_SUBDIR: Final = "snapshots"  # sessions/snapshots.py's SNAPSHOTS_DIR_NAME
WAL_SUFFIX: Final = ".wal"

_user_umask: int | None = None  # the umask this process started with, once changed


def use_private_umask() -> None:
    """Make every file this process (and its children) creates owner-only; idempotent."""
    global _user_umask
    previous = os.umask(PRIVATE_UMASK)
    if _user_umask is None:
        _user_umask = previous


def user_umask() -> int | None:
    """The umask to give a child that writes the user's files: the one the process started
    with, or None when it was never changed (the child inherits it as it is)."""
    return _user_umask


def _tighten(path: Path) -> None:
    """Group and other bits off ``path`` (not following a symlink); gone is fine."""
    with contextlib.suppress(OSError):
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            return
        mode = stat.S_IMODE(st.st_mode)
        if mode & PRIVATE_UMASK:
            os.chmod(path, mode & ~PRIVATE_UMASK)


def _tighten_tree(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    _tighten(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            _tighten(Path(dirpath) / name)


def tighten_state(paths: Paths, *, log_file: Path | None = None) -> None:
    """Owner-only modes on the state an earlier version left readable (see the docstring)."""
    database = paths.database_file
    for path in (
        paths.data_dir,
        paths.runtime_dir,
        database,
        database.with_name(database.name + WAL_SUFFIX),
        paths.artifacts_dir,
        paths.data_dir / SNAPSHOTS_SUBDIR,
        *([log_file] if log_file is not None else []),
    ):
        _tighten(path)
    for nats in (paths.data_dir / NATS_SUBDIR, paths.runtime_dir / NATS_SUBDIR):
        _tighten_tree(nats)
