"""This state directory's instance id: what marks the containers a daemon (or a print-mode run)
of this state directory starts, so that it reaps, adopts and force-removes only its own.

Two setups of one user on one machine (CI and the user's own runs, each with its own
``XDG_DATA_HOME``) each have a daemon; both see every container of the uid. The instance id is
created once, at random, in ``<data dir>/instance-id`` (0600, ``O_EXCL``: two processes racing
read the winner's) and never changes, so a restarted daemon recognizes its predecessor's
containers, and another setup's are not its to touch (docs/docker.md, "Lifecycle").

``read_instance_id`` never creates: ``prime-agent doctor`` uses it to tell whether a labelled
container's state directory still holds that instance (its daemon could adopt it) or is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Final

from orchestrator.errors import UserError
from orchestrator.paths import Paths, ensure_private_dir

__all__ = ["INSTANCE_FILE_MODE", "INSTANCE_FILE_NAME", "instance_id", "read_instance_id"]

INSTANCE_FILE_NAME: Final = "instance-id"
INSTANCE_FILE_MODE: Final = 0o600
INSTANCE_ID_BYTES: Final = 8  # 16 hex digits
INSTANCE_ID_MAX_CHARS: Final = 64  # a longer file is not ours


def _valid(text: str) -> bool:
    return 0 < len(text) <= INSTANCE_ID_MAX_CHARS and text.isalnum()


def read_instance_id(data_dir: Path) -> str | None:
    """The instance id stored in ``data_dir``, or None (none yet, unreadable, or not one)."""
    try:
        text = (data_dir / INSTANCE_FILE_NAME).read_text(encoding="ascii").strip()
    except (OSError, UnicodeError):
        return None
    return text if _valid(text) else None


def instance_id(paths: Paths | None = None) -> str:
    """This state directory's instance id, created on first use."""
    data_dir = (paths or Paths.from_env()).data_dir
    found = read_instance_id(data_dir)
    if found is not None:
        return found
    ensure_private_dir(data_dir)
    path = data_dir / INSTANCE_FILE_NAME
    new = secrets.token_hex(INSTANCE_ID_BYTES)
    # Written whole under a private name, then linked into place: a racing reader never sees
    # a half-written file, and the link fails when another process was first.
    tmp = data_dir / f".{INSTANCE_FILE_NAME}.{os.getpid()}.{new}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, INSTANCE_FILE_MODE)
    try:
        os.write(fd, f"{new}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        found = read_instance_id(data_dir)
        if found is None:
            raise UserError(
                f"{path} does not hold an instance id; remove it (a new one is made)"
            ) from None
        return found
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return new
