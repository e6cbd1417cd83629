"""Directory trees as tar streams, both ways, for moving files between the host and a pod.

Used on both sides of the gateway's files endpoint (``gateway_files.py`` in the pod,
``pod_files.py`` on the host), so it imports only the stdlib and ``orchestrator.errors``.

``pack`` writes a tree as a PAX tar: regular files, directories and symlinks (as links, never
followed); fifos, sockets and devices are left out. Each member carries its exact mtime in
nanoseconds (``MTIME_NS_KEY``), which a plain tar float would round: the workspace sync-back
compares mtimes to the nanosecond (``workspace.py``).

``unpack`` is the careful half: a member name must be relative and stay inside the
destination (no absolute path, no ``..``), every parent it is written under must be a real
directory there (``lstat``: never a symlink), a file or link is put in place under a temporary
name and ``os.replace``d (replacing a link, never writing through one), only the three member
kinds are accepted, and the regular files together may hold at most ``max_bytes``. Modes are
kept without set-id bits; owners are not (the writer's uid owns everything it unpacks).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Final

from orchestrator.errors import SandboxError

__all__ = [
    "FILES_MAX_BYTES",
    "FILES_PATH",
    "MTIME_NS_KEY",
    "clear_dir",
    "pack",
    "safe_relative",
    "unpack",
]

# The gateway's files endpoint (gateway_files.py serves it, pod_files.py calls it).
FILES_PATH: Final = "/prime-agent/files"
# The most one transfer may carry in regular files' bytes: the workspace volume's default size.
FILES_MAX_BYTES: Final = 4 * 1024**3
MTIME_NS_KEY: Final = "PRIMEAGENT.mtime_ns"
COPY_CHUNK_BYTES: Final = 1024**2
TMP_PREFIX: Final = ".prime-agent-unpack-"
TMP_SUFFIX_BYTES: Final = 4
MODE_BITS: Final = 0o777  # set-uid, set-gid and sticky bits are not carried over
NS_PER_S: Final = 1_000_000_000
WRITE_BITS: Final = 0o222


def safe_relative(name: str) -> PurePosixPath:
    """``name`` as a relative path inside its root (``.`` for the root itself);
    ``SandboxError`` for an absolute path or one with ``..``."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\x00" in name:
        raise SandboxError(f"path {name!r} leaves its directory")
    return path


def _walk(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative path, path, lstat) under ``root``, parents first, never following links."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            yield str(path.relative_to(root)), path, path.lstat()


def _member(name: str, path: Path, st: os.stat_result) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode) & MODE_BITS
    info.mtime = st.st_mtime_ns // NS_PER_S
    info.pax_headers = {MTIME_NS_KEY: str(st.st_mtime_ns)}
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    else:
        return None  # fifos, sockets, devices
    return info


def pack(source: Path, out: IO[bytes], *, max_bytes: int = FILES_MAX_BYTES) -> int:
    """Write ``source`` (a directory: its contents; a file or link: that one member, named by
    its own name) to ``out`` as a tar stream; returns the bytes of regular files written.
    ``SandboxError`` past ``max_bytes``."""
    top = source.lstat()
    if stat.S_ISDIR(top.st_mode):
        entries: Iterator[tuple[str, Path, os.stat_result]] = _walk(source)
    else:
        entries = iter([(source.name, source, top)])
    total = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path, st in entries:
            info = _member(name, path, st)
            if info is None:
                continue
            if info.isreg():
                total += info.size
                if total > max_bytes:
                    raise SandboxError(f"{source} holds more than {max_bytes // 1024**2} MiB")
                try:
                    with path.open("rb") as data:
                        tar.addfile(info, data)
                except FileNotFoundError:
                    continue  # removed while we walked
            else:
                tar.addfile(info)
    return total


def _mtime_ns(info: tarfile.TarInfo) -> int:
    exact = info.pax_headers.get(MTIME_NS_KEY, "")
    return int(exact) if exact.isdigit() else int(info.mtime) * NS_PER_S


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _parents_are_dirs(dest: Path, rel: PurePosixPath) -> bool:
    """Every directory between ``dest`` and ``rel``'s last part is a real directory."""
    current = dest
    for part in rel.parts[:-1]:
        current = current / part
        if not _real_dir(current):
            return False
    return True


def _put(tar: tarfile.TarFile, info: tarfile.TarInfo, target: Path, *, read_only: bool) -> None:
    tmp = target.parent / f"{TMP_PREFIX}{secrets.token_hex(TMP_SUFFIX_BYTES)}"
    try:
        if info.issym():
            os.symlink(info.linkname, tmp)
        else:
            data = tar.extractfile(info)
            assert data is not None
            with data, open(tmp, "xb") as out:
                shutil.copyfileobj(data, out, COPY_CHUNK_BYTES)
            os.chmod(tmp, info.mode & (MODE_BITS & ~WRITE_BITS if read_only else MODE_BITS))
            mtime = _mtime_ns(info)
            os.utime(tmp, ns=(mtime, mtime))
        if _real_dir(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def unpack(
    stream: IO[bytes],
    dest: Path,
    *,
    max_bytes: int = FILES_MAX_BYTES,
    read_only: bool = False,
) -> int:
    """Unpack the tar ``stream`` into the directory ``dest`` (see the module docstring);
    returns the bytes of regular files written. A ``SandboxError`` (a member that is not
    safe, too many bytes) stops it part-way: what was written stays. ``read_only``: every file
    and directory written loses its write bits once all is in place."""
    if not _real_dir(dest):
        raise SandboxError(f"{dest} is not a directory")
    total = 0
    dir_times: list[tuple[Path, int, int]] = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for info in tar:
            rel = safe_relative(info.name)
            if rel == PurePosixPath("."):
                dir_times.append((dest, info.mode & MODE_BITS, _mtime_ns(info)))
                continue
            if not _parents_are_dirs(dest, rel):
                raise SandboxError(f"{info.name!r} lies under something that is not a directory")
            target = dest.joinpath(*rel.parts)
            if info.isdir():
                if not _real_dir(target):
                    with contextlib.suppress(FileNotFoundError):
                        target.unlink()
                    target.mkdir()
                dir_times.append((target, info.mode & MODE_BITS, _mtime_ns(info)))
            elif info.isreg() or info.issym():
                total += info.size
                if total > max_bytes:
                    raise SandboxError(f"more than {max_bytes // 1024**2} MiB of files")
                _put(tar, info, target, read_only=read_only)
            else:
                raise SandboxError(f"{info.name!r} is neither a file, a directory nor a link")
    for directory, mode, mtime in reversed(dir_times):  # children's writes first
        mode = mode & ~WRITE_BITS if read_only else mode | stat.S_IWUSR
        os.chmod(directory, mode | stat.S_IXUSR)
        os.utime(directory, ns=(mtime, mtime))
    return total


def clear_dir(directory: Path) -> None:
    """Remove everything inside ``directory`` (links themselves, never what they point to),
    also what an earlier ``unpack(read_only=True)`` left without write bits."""
    for dirpath, dirnames, _files in os.walk(directory, followlinks=False):
        for name in dirnames:
            path = Path(dirpath) / name
            if _real_dir(path):
                os.chmod(path, stat.S_IMODE(path.lstat().st_mode) | stat.S_IRWXU)
    for entry in list(directory.iterdir()):
        if _real_dir(entry):
            shutil.rmtree(entry)
        else:
            entry.unlink()
