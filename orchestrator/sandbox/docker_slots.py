"""Namespace snapshots of docker sessions: one mount point, pool slots and their handover.

Every docker container mounts its session's snapshot directory (``<data>/snapshots/<id>``,
docs/snapshots.md) at ONE fixed path inside, ``CONTAINER_SNAPSHOT_DIR``; the host tells the
kernel that path (``Sandbox.kernel_snapshot_dir``), never the host's. A container's mounts are
fixed at creation, and a pooled container does not know its session yet, so it gets a fresh
private **slot** instead: ``<data>/snapshots/.pool/<random>`` (``new_slot``), mounted there.

When the pool hands the container to session S, ``hand_over`` makes the slot S's directory: a
bind mount follows the directory (its inode), not its path, so the slot may be renamed while
mounted and the container then writes into ``snapshots/S``:

1. S's committed snapshot (``CURRENT`` and its generation) is hard-linked (copied where a link
   is refused) into the slot, ``CURRENT`` last and atomically: the slot now holds a valid copy,
   and S is untouched.
2. The slot and S are exchanged in one ``renameat2(RENAME_EXCHANGE)``: ``snapshots/S`` is now
   the mounted directory; at every instant ``snapshots/S`` held a valid snapshot.
3. The old S directory (now at the slot's path) is removed.

A crash at any step leaves ``snapshots/S`` valid and at most a stray ``.pool/`` entry;
``sweep_slots`` removes those that no container names (``LABEL_SNAPSHOT_SLOT``). Where the
filesystem has no ``RENAME_EXCHANGE`` the exchange is two renames (a crash between them leaves
S's snapshot only under ``.pool/``; logged).

Why nothing else can write S meanwhile: the handover runs inside ``DockerBackend.create`` for
S, before its sandbox is returned, so before the session's revival and first cell. A session
asks for a new sandbox only when it has none that works (first start, wake, a lost one that was
stopped), and snapshots are only written by ``NamespaceKeeper.save`` through the session's one
sandbox, serialized with its cells: no save of S is running while S's next sandbox is created.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Final

from orchestrator.runtime.snapshot import CURRENT_FILE, read_manifest

__all__ = [
    "CONTAINER_SNAPSHOT_DIR",
    "SLOTS_DIR_NAME",
    "SLOT_SWEEP_MIN_AGE_S",
    "hand_over",
    "new_slot",
    "remove_slot",
    "sweep_slots",
]

log = logging.getLogger(__name__)

# Inside every docker container: its session's snapshot directory (read-only root filesystem:
# docker creates the mount point). Not under a tmpfs, not the workspace.
CONTAINER_SNAPSHOT_DIR: Final = "/var/lib/prime-agent/snapshot"
# Under the snapshots root; never a session id (those are "s-" + 12 characters).
SLOTS_DIR_NAME: Final = ".pool"
SLOTS_DIR_MODE: Final = 0o700
# The container's uid writes the slot (the workspace owner's or the image's): like the session
# directories it is mounted at, open inside 0700 parents.
SLOT_DIR_MODE: Final = 0o777
SLOT_TOKEN_BYTES: Final = 8
# A slot younger than this may belong to a container being created right now (by this or
# another orchestrator sharing the data directory): the sweep leaves it.
SLOT_SWEEP_MIN_AGE_S: Final = 600.0
TMP_POINTER_SUFFIX: Final = ".handover"

_AT_FDCWD: Final = -100
_RENAME_EXCHANGE: Final = 2
_NO_EXCHANGE: Final = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP)


def slots_dir(snapshot_root: Path) -> Path:
    return snapshot_root / SLOTS_DIR_NAME


def new_slot(snapshot_root: Path) -> Path:
    """A fresh, empty slot directory for one pooled container."""
    parent = slots_dir(snapshot_root)
    parent.mkdir(parents=True, exist_ok=True, mode=SLOTS_DIR_MODE)
    os.chmod(parent, SLOTS_DIR_MODE)
    slot = parent / secrets.token_hex(SLOT_TOKEN_BYTES)
    slot.mkdir(mode=SLOTS_DIR_MODE)
    os.chmod(slot, SLOT_DIR_MODE)
    return slot


def remove_slot(slot: Path) -> None:
    shutil.rmtree(slot, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # pickles are never rewritten in place: sharing is safe
    except OSError:  # another filesystem, protected_hardlinks (a file of the container's uid)
        shutil.copy2(source, target)


def _copy_committed(source: Path, slot: Path) -> None:
    """``source``'s committed snapshot into ``slot``, ``CURRENT`` last and atomically."""
    manifest = read_manifest(source)
    if manifest is None:
        return  # nothing committed (or nothing readable): nothing to carry over
    generation = str(manifest.get("generation", ""))
    if not generation or Path(generation).name != generation:
        return
    target = slot / generation
    target.mkdir()
    for entry in (source / generation).iterdir():
        if entry.is_file() and not entry.is_symlink():
            _link_or_copy(entry, target / entry.name)
    _fsync_dir(target)
    pointer = slot / f"{CURRENT_FILE}{TMP_POINTER_SUFFIX}"
    with open(pointer, "wb") as fh:
        fh.write(generation.encode())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, slot / CURRENT_FILE)
    _fsync_dir(slot)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically; False where the system cannot (then nothing moved)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), ctypes.c_uint(_RENAME_EXCHANGE)
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, f"exchanging {a} and {b}: {os.strerror(code)}")


def hand_over(slot: Path, target: Path) -> None:
    """Make the mounted ``slot`` the session's snapshot directory ``target`` (see the module
    docstring); ``target``'s snapshot is kept. Raises ``OSError`` before the exchange (then
    ``target`` is as it was and the slot is the caller's to remove)."""
    target.mkdir(parents=True, exist_ok=True, mode=SLOTS_DIR_MODE)
    _copy_committed(target, slot)
    if not _exchange(slot, target):
        log.info("snapshot handover: no RENAME_EXCHANGE here, two renames instead")
        os.rename(target, slot.with_name(f"{slot.name}.old"))
        os.rename(slot, target)
        slot = slot.with_name(f"{slot.name}.old")
    with contextlib.suppress(OSError):  # done: the rest is tidying up
        _fsync_dir(target.parent)
    remove_slot(slot)  # the old session directory


def sweep_slots(
    snapshot_root: Path, in_use: set[str], *, min_age_s: float = SLOT_SWEEP_MIN_AGE_S
) -> int:
    """Remove ``.pool/`` entries no container names (``in_use``: their ``LABEL_SNAPSHOT_SLOT``
    values) and older than ``min_age_s``: left by a crash. Returns how many."""
    parent = slots_dir(snapshot_root)
    if not parent.is_dir():
        return 0
    removed = 0
    now = time.time()
    for entry in parent.iterdir():
        if str(entry) in in_use:
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - entry.lstat().st_mtime < min_age_s:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()
            removed += 1
    if removed:
        log.info("removed %d stray snapshot slot(s) under %s", removed, parent)
    return removed
