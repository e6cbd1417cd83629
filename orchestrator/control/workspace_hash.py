"""What autonomous gates need from the workspace: a content hash, and a bounded gate report.

A failed gate (``--autonomous-gate CMD``) is not run again while the workspace is unchanged:
re-running ``pytest`` on the same files only burns minutes to print the same failure. "Unchanged"
is ``workspace_hash``: a SHA-256 over every file a person would call part of the project, i.e.
tracked plus untracked files that are not ignored. Timestamps are never hashed (a ``touch`` or a
checkout of the same content changes nothing), contents and the executable bit are.

Which files:

- In a git work tree, ``git ls-files -z --cached --others --exclude-standard`` run in ``root``
  (no shell, ``GIT_TIMEOUT_S``). A tracked file that was deleted is hashed as absent, so deleting
  it changes the hash and restoring it changes it back.
- Anywhere else, a walk of the tree that skips ``.git`` directories. Also when git is missing,
  times out or refuses the directory: the walk sees ignored files too, so at worst a gate runs
  once too often, never once too few. Empty directories count in neither case, as in git (which
  does not list fifos or sockets either; the walk does).

Each path is hashed with its kind: a regular file's content (streamed in ``HASH_CHUNK_BYTES``
chunks, never whole in memory) and its executable bit; a symlink's target text (a link is never
followed, and neither is a path whose parent directory became a link: that path counts as
absent); a directory listed by git (a submodule) as a directory; anything else (a fifo, a socket)
as its kind only, never opened for reading.

Bounded: at most ``MAX_FILES`` paths (in sorted order) and ``MAX_TOTAL_BYTES`` bytes of content
are read. A file that no longer fits the byte budget contributes its path, mode and size instead
of its content; paths past ``MAX_FILES`` are left out. Either way the hash ends with a marker
(and the number of paths listed) and ``WorkspaceDigest.truncated`` is true, saying that some
edits (same-size rewrites of big files, edits past the file limit) may not change the hash.

``bound_gate_output`` keeps a failed gate's output within ``GATE_OUTPUT_MAX_CHARS`` for the
agent: the head (where the first error usually is) and the tail (where the summary is), with
``[... N chars cut ...]`` between them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "GATE_OUTPUT_MAX_CHARS",
    "GIT_TIMEOUT_S",
    "HASH_CHUNK_BYTES",
    "HASH_VERSION",
    "MAX_FILES",
    "MAX_TOTAL_BYTES",
    "WorkspaceDigest",
    "bound_gate_output",
    "workspace_digest",
    "workspace_hash",
]

GATE_OUTPUT_MAX_CHARS = 6000
GIT_TIMEOUT_S = 30
HASH_CHUNK_BYTES = 1024 * 1024
MAX_FILES = 100_000
MAX_TOTAL_BYTES = 512 * 1024 * 1024
HASH_VERSION = b"prime-agent-workspace-hash-v1"

_SEP = b"\0"  # no path or link target contains NUL, so records cannot run into each other
_GIT_LS_FILES = ("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
_SKIPPED_DIR = b".git"

# One-byte record kinds.
_FILE = b"f"
_EXECUTABLE = b"x"
_SIZE_ONLY = b"s"  # a file over the byte budget: size instead of content
_LINK = b"l"
_DIRECTORY = b"d"
_ABSENT = b"-"
_OTHER = b"o"
_UNREADABLE = b"e"
_TRUNCATED = b"T"


@dataclass(frozen=True)
class WorkspaceDigest:
    """A workspace's hash and how it was taken."""

    digest: str  # hex SHA-256
    files: int  # paths hashed
    content_bytes: int  # bytes of file content read
    truncated: bool  # a bound was hit: some changes may not change the digest
    source: Literal["git", "walk"]


def workspace_hash(root: Path) -> str:
    """The hex content hash of ``root``'s tracked and untracked files (module docstring)."""
    return workspace_digest(root).digest


def workspace_digest(
    root: Path, *, max_files: int = MAX_FILES, max_total_bytes: int = MAX_TOTAL_BYTES
) -> WorkspaceDigest:
    """Hash ``root`` and say how: which listing, how much was read, whether a bound cut it."""
    root_bytes = os.fsencode(root)
    listed = _git_paths(root)
    source: Literal["git", "walk"] = "git"
    if listed is None:
        source = "walk"
        listed = sorted(_walk_paths(root_bytes, limit=max_files + 1))
    hasher = _Hasher(root_bytes, max_total_bytes)
    hasher.outer.update(HASH_VERSION + _SEP)
    for rel in listed[:max_files]:
        hasher.add(rel)
    truncated = hasher.cut or len(listed) > max_files
    if truncated:
        hasher.outer.update(_TRUNCATED + _SEP + str(len(listed)).encode() + _SEP)
    return WorkspaceDigest(
        digest=hasher.outer.hexdigest(),
        files=min(len(listed), max_files),
        content_bytes=hasher.read,
        truncated=truncated,
        source=source,
    )


# --- listing -------------------------------------------------------------------------------------


def _git_paths(root: Path) -> list[bytes] | None:
    """Tracked plus untracked, not ignored paths relative to ``root``, sorted; None when git
    cannot tell (not a work tree, no git, too slow)."""
    try:
        proc = subprocess.run(
            _GIT_LS_FILES,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=GIT_TIMEOUT_S,
            check=False,
            # ls-files may refresh the index; a gate check must not take git's lock from a user.
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    # A conflicted path is listed once per stage: one record each is enough.
    return sorted({path for path in proc.stdout.split(_SEP) if path})


def _walk_paths(root: bytes, *, limit: int) -> Iterator[bytes]:
    """Relative paths of everything but directories under ``root``, skipping ``.git``, never
    following a link; stops after ``limit`` paths."""
    count = 0
    pending = [b""]
    while pending:
        rel_dir = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as entries:
                children = sorted(entries, key=lambda entry: entry.name)
        except OSError:
            continue  # unreadable or gone: its files cannot be hashed either way
        for entry in children:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if entry.name != _SKIPPED_DIR:
                    pending.append(rel)
                continue
            yield rel
            count += 1
            if count >= limit:
                return


# --- hashing -------------------------------------------------------------------------------------


class _Hasher:
    """The outer hash and the byte budget while records are added in path order."""

    def __init__(self, root: bytes, max_total_bytes: int):
        self.root = root
        self.outer = hashlib.sha256()
        self.left = max_total_bytes
        self.read = 0
        self.cut = False
        self._real_dirs: dict[bytes, bool] = {}

    def add(self, rel: bytes) -> None:
        kind, extra = self._record(rel)
        self.outer.update(kind + _SEP + rel + _SEP + extra)

    def _record(self, rel: bytes) -> tuple[bytes, bytes]:
        if not self._parents_real(rel):
            return _ABSENT, b""
        path = os.path.join(self.root, rel)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return _ABSENT, b""
        except OSError as exc:
            return _UNREADABLE, _errno_name(exc)
        if stat.S_ISLNK(info.st_mode):
            try:
                return _LINK, os.readlink(path) + _SEP
            except OSError as exc:
                return _UNREADABLE, _errno_name(exc)
        if stat.S_ISDIR(info.st_mode):
            return _DIRECTORY, b""
        if not stat.S_ISREG(info.st_mode):
            return _OTHER, b""
        return self._file(path, info)

    def _file(self, path: bytes, info: os.stat_result) -> tuple[bytes, bytes]:
        kind = _EXECUTABLE if info.st_mode & stat.S_IXUSR else _FILE
        size_only = _SIZE_ONLY + kind, str(info.st_size).encode() + _SEP
        if info.st_size > self.left:
            self.cut = True
            return size_only
        try:
            # O_NOFOLLOW and O_NONBLOCK: a link or fifo swapped in since lstat is not read.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return _UNREADABLE, _errno_name(exc)
        inner = hashlib.sha256()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return _OTHER, b""
            while chunk := os.read(fd, min(HASH_CHUNK_BYTES, self.left + 1)):
                self.left -= len(chunk)
                self.read += len(chunk)
                if self.left < 0:  # it grew past the budget while we read it
                    self.left = 0
                    self.cut = True
                    return size_only
                inner.update(chunk)
        except OSError as exc:
            return _UNREADABLE, _errno_name(exc)
        finally:
            os.close(fd)
        return kind, inner.digest()

    def _parents_real(self, rel: bytes) -> bool:
        """Every directory between ``root`` and ``rel`` is a real directory, not a link."""
        parts = rel.split(b"/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = b"/".join(parts[:depth])
            known = self._real_dirs.get(parent)
            if known is None:
                try:
                    known = stat.S_ISDIR(os.lstat(os.path.join(self.root, parent)).st_mode)
                except OSError:
                    known = False
                self._real_dirs[parent] = known
            if not known:
                return False
        return True


def _errno_name(exc: OSError) -> bytes:
    """``EACCES`` and the like: stable across locales, unlike the message."""
    name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return name.encode() + _SEP


# --- gate output ---------------------------------------------------------------------------------


def bound_gate_output(text: str, limit: int = GATE_OUTPUT_MAX_CHARS) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail (half each) joined
    by a ``[... N chars cut ...]`` line; never longer than ``limit``."""
    if limit < 0:
        raise ValueError("limit must not be negative")
    if len(text) <= limit:
        return text
    # The marker for the whole text is at least as long as the one for the part actually cut.
    keep = limit - len(_cut_marker(len(text)))
    if keep <= 0:
        return text[:limit]
    head = keep // 2
    tail = keep - head
    return text[:head] + _cut_marker(len(text) - keep) + text[len(text) - tail :]


def _cut_marker(cut: int) -> str:
    return f"\n[... {cut} chars cut ...]\n"
