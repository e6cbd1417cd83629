"""Workspace ``copy`` mode: the sandbox works on a private copy of the project, synced back when
the sandbox stops (docs/docker.md, "Workspace modes").

``WorkspaceCopy.create(project, parent)`` copies the project into ``parent/workspace-copy``
(symlinks as symlinks, owners kept when we run as root, special files skipped) and records a
manifest of what it copied (type, size, mtime, mode) in ``parent/workspace-copy.json``, so a
restarted orchestrator can ``load`` it again. ``parent`` is the session's artifacts directory:
durable, private, on the host.

``sync_back()`` writes the sandbox's changes into the project, as an ``rw`` mount would have,
except where the project itself changed since the copy was taken: then the project's version
stays and the sandbox's version is saved under ``parent/workspace-conflicts/<time>/<path>``. Nothing
the agent wrote is lost: every changed file ends up either in the project or in the conflicts
directory, and the copy is removed only after the sync finished without an error.

Writes into the project never follow a symlink: every parent directory is checked with
``lstat`` (a real directory inside the project), and files and links are put in place with a
temporary name and ``os.replace``, which replaces a link instead of writing through it.
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import logging
import os
import secrets
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from orchestrator.errors import SandboxError, UserError
from orchestrator.sandbox.base import SandboxSpec, WorkspaceMode

__all__ = [
    "CONFLICTS_DIR_NAME",
    "COPY_DIR_NAME",
    "MANIFEST_NAME",
    "WORKSPACE_COPY_MAX_BYTES",
    "SyncReport",
    "WorkspaceCopy",
    "finish_copy",
    "local_workspace",
]

log = logging.getLogger(__name__)

COPY_DIR_NAME = "workspace-copy"
MANIFEST_NAME = "workspace-copy.json"
CONFLICTS_DIR_NAME = "workspace-conflicts"
REPORT_NAME = "workspace-sync.json"
# A project bigger than this is refused in copy mode (use rw or ro): copying it would take
# minutes and the same again in disk space.
WORKSPACE_COPY_MAX_BYTES = 4 * 1024**3
MANIFEST_VERSION = 1
TMP_PREFIX = ".prime-agent-sync-"
TMP_SUFFIX_BYTES = 4
REPORT_LIST_MAX = 200  # paths listed per kind in the report file and the log

Kind = Literal["f", "l", "d"]


@dataclass(frozen=True)
class Entry:
    kind: Kind
    size: int = 0
    mtime_ns: int = 0
    mode: int = 0
    target: str = ""  # symlinks


@dataclass
class SyncReport:
    written: list[str] = field(default_factory=list)  # files, links, dirs put into the project
    deleted: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # saved under conflicts_dir instead
    kept: list[str] = field(default_factory=list)  # deleted by the agent, changed in the project
    conflicts_dir: str = ""

    def summary(self) -> str:
        text = (
            f"{len(self.written)} written, {len(self.deleted)} deleted, "
            f"{len(self.conflicts)} conflicts"
        )
        if self.conflicts:
            text += f" (the sandbox's versions are in {self.conflicts_dir})"
        return text


def _entry(st: os.stat_result, path: Path) -> Entry | None:
    if stat.S_ISLNK(st.st_mode):
        return Entry("l", target=os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", mode=stat.S_IMODE(st.st_mode))
    if stat.S_ISREG(st.st_mode):
        return Entry("f", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return None  # fifos, sockets, devices: not copied


def _lentry(path: Path) -> Entry | None:
    try:
        return _entry(path.lstat(), path)
    except FileNotFoundError:
        return None


def _same(a: Entry | None, b: Entry | None) -> bool:
    """Unchanged, as far as a sync cares (a directory's mtime changes with its contents)."""
    if a is None or b is None:
        return a is b
    if a.kind != b.kind:
        return False
    if a.kind == "d":
        return a.mode == b.mode
    return a == b


def _walk(root: Path) -> list[tuple[str, Path, os.stat_result]]:
    """(relative path, path, lstat) of everything under ``root``, parents before children."""
    out: list[tuple[str, Path, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            out.append((str(path.relative_to(root)), path, path.lstat()))
    return out


class WorkspaceCopy:
    """A project's private copy and the manifest of what it was copied from."""

    def __init__(self, project: Path, parent: Path, manifest: dict[str, Entry]):
        self.project = project
        self.parent = parent
        self.copy_dir = parent / COPY_DIR_NAME
        self.manifest = manifest

    # --- copy in ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        project: Path,
        parent: Path,
        *,
        max_bytes: int = WORKSPACE_COPY_MAX_BYTES,
        owner: tuple[int, int] | None = None,
    ) -> WorkspaceCopy:
        """Copy ``project`` into ``parent/workspace-copy``. An earlier copy that was never
        synced back (an orchestrator crash) is synced first, so its work is not lost. With
        ``owner`` (uid, gid; root only) the whole copy is given to that user: the docker
        sandbox's, which may not be able to read the project itself (docker_user.py)."""
        project = project.resolve()
        parent.mkdir(parents=True, exist_ok=True)
        earlier = cls.load(parent)
        if earlier is not None:
            log.warning("workspace copy: syncing back a copy left by an earlier sandbox")
            finish_copy(earlier)
            if earlier.copy_dir.exists():
                raise SandboxError(
                    f"a workspace copy from an earlier sandbox could not be synced back: "
                    f"{earlier.copy_dir}"
                )
        walked = _walk(project)
        total = sum(st.st_size for _, _, st in walked if stat.S_ISREG(st.st_mode))
        if total > max_bytes:
            raise UserError(
                f"workspace mode copy: {project} holds {total // 1024**2} MiB, more than "
                f"{max_bytes // 1024**2} MiB; use --workspace rw or ro"
            )
        copy = cls(project, parent, {})
        tmp = parent / f"{COPY_DIR_NAME}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _copy_dir_node(project, tmp, project.stat())
            for rel, path, st in walked:
                entry = _entry(st, path)
                if entry is None:
                    continue
                _copy_node(path, tmp / rel, st, entry)
                copy.manifest[rel] = entry
            # Directory times last: writing into a directory changes its mtime.
            for rel, _path, st in reversed(walked):
                if stat.S_ISDIR(st.st_mode):
                    os.utime(tmp / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
            if owner is not None:
                _give_tree(tmp, owner)
            tmp.rename(copy.copy_dir)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SandboxError(f"workspace copy of {project} failed: {exc}") from exc
        copy._save_manifest()
        return copy

    @classmethod
    def load(cls, parent: Path) -> WorkspaceCopy | None:
        """The copy a previous sandbox left in ``parent``, or None."""
        try:
            data = json.loads((parent / MANIFEST_NAME).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SandboxError(f"unreadable workspace manifest in {parent}: {exc}") from exc
        manifest = {rel: Entry(**fields) for rel, fields in data["entries"].items()}
        copy = cls(Path(data["project"]), parent, manifest)
        return copy if copy.copy_dir.is_dir() else None

    def _save_manifest(self) -> None:
        data = {
            "version": MANIFEST_VERSION,
            "project": str(self.project),
            "entries": {rel: asdict(e) for rel, e in self.manifest.items()},
        }
        tmp = self.parent / f"{MANIFEST_NAME}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.parent / MANIFEST_NAME)

    # --- sync back ----------------------------------------------------------------------------

    def sync_back(self) -> SyncReport:
        """Write the sandbox's changes into the project (see the module docstring)."""
        # A fresh directory per sync: nothing in it that we did not put there ourselves.
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        conflicts_dir = self.parent / CONFLICTS_DIR_NAME / f"{stamp}-{secrets.token_hex(2)}"
        report = SyncReport(conflicts_dir=str(conflicts_dir))
        walked = _walk(self.copy_dir)
        now = {rel: _entry(st, path) for rel, path, st in walked}
        # 1. What the agent deleted (or replaced by another type), deepest first.
        cleared: set[str] = set()  # gone from the project now, as the agent wanted
        for rel in sorted(self.manifest, key=lambda r: r.count("/"), reverse=True):
            was = self.manifest[rel]
            left = now.get(rel)
            if left is not None and left.kind == was.kind:
                continue
            target = self.project / rel
            if not self._inside(target):
                continue
            current = _lentry(target)
            if current is None:
                continue
            if not _same(current, was):
                report.kept.append(rel)  # the project changed it: the project's version stays
                continue
            try:
                if current.kind == "d":
                    target.rmdir()  # only when empty: anything the user added stays
                else:
                    target.unlink()
                cleared.add(rel)
                if left is None:
                    report.deleted.append(rel)
            except OSError:
                report.kept.append(rel)
        # 2. What the agent wrote, parents first.
        blocked: list[str] = []  # directories whose contents go to the conflicts dir
        for rel, path, _ in walked:
            entry = now[rel]
            if entry is None:
                continue
            before = None if rel in cleared else self.manifest.get(rel)
            if _same(entry, before) and not any(_under(rel, b) for b in blocked):
                continue
            target = self.project / rel
            current = _lentry(target) if self._inside(target) else None
            conflict = any(_under(rel, b) for b in blocked) or not self._inside(target)
            if not conflict and not _same(current, before):
                # Both sides changed it: fine when they agree, a conflict otherwise.
                conflict = not _agree(current, entry, target, path)
                if not conflict:
                    continue
            if not conflict and entry.kind == "d":
                if current is not None and current.kind != "d":
                    conflict = not _remove_quietly(target)
                if not conflict:
                    try:
                        owner = _project_owner(target)
                        target.mkdir(exist_ok=True)
                        _copy_meta(path, target, owner)
                        report.written.append(rel)
                        continue
                    except OSError:
                        conflict = True
            elif not conflict:
                if current is not None and current.kind == "d":
                    conflict = not _remove_quietly(target)
                if not conflict:
                    _put(path, target, entry, _project_owner(target))
                    report.written.append(rel)
                    continue
            if entry.kind == "d":
                blocked.append(rel)
                (conflicts_dir / rel).mkdir(parents=True, exist_ok=True)
            else:
                (conflicts_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                _put(path, conflicts_dir / rel, entry)
                report.conflicts.append(rel)
        return report

    def _inside(self, target: Path) -> bool:
        """Every parent of ``target`` up to the project is a real directory (no symlink)."""
        parent = target.parent
        while parent != self.project:
            try:
                if not stat.S_ISDIR(parent.lstat().st_mode):
                    return False
            except FileNotFoundError:
                return False
            if parent == parent.parent:
                return False
            parent = parent.parent
        return True

    def remove(self) -> None:
        shutil.rmtree(self.copy_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.parent / MANIFEST_NAME).unlink()


def finish_copy(copy: WorkspaceCopy) -> SyncReport | None:
    """Sync back, write the report next to the copy, remove the copy; on an error keep the
    copy (nothing lost) and log where it is. Never raises."""
    try:
        report = copy.sync_back()
    except OSError as exc:
        log.error(
            "workspace copy: syncing back to %s failed (%s); the sandbox's files are kept in %s",
            copy.project,
            exc,
            copy.copy_dir,
        )
        return None
    data = asdict(report)
    for key in ("written", "deleted", "conflicts", "kept"):
        data[key] = data[key][:REPORT_LIST_MAX]
    with contextlib.suppress(OSError):
        (copy.parent / REPORT_NAME).write_text(json.dumps(data, indent=1))
    copy.remove()
    if report.conflicts or report.kept:
        log.warning("workspace copy synced back to %s: %s", copy.project, report.summary())
    else:
        log.info("workspace copy synced back to %s: %s", copy.project, report.summary())
    return report


# --- file operations ---------------------------------------------------------------------------


def _under(rel: str, directory: str) -> bool:
    return rel.startswith(directory + "/")


def _agree(current: Entry | None, entry: Entry, target: Path, source: Path) -> bool:
    if current is None or current.kind != entry.kind:
        return False
    if entry.kind == "d":
        return True
    if entry.kind == "l":
        return current.target == entry.target
    return current.size == entry.size and filecmp.cmp(target, source, shallow=False)


def _remove_quietly(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    except OSError:
        return False
    return True


def _chown_like(path: Path, st: os.stat_result) -> None:
    # Only root can give files away; as the user they are ours already.
    if os.geteuid() == 0:
        os.lchown(path, st.st_uid, st.st_gid)


def _give_tree(root: Path, owner: tuple[int, int]) -> None:
    """Every node under ``root`` (and ``root``) owned by ``owner``, links themselves."""
    uid, gid = owner
    os.lchown(root, uid, gid)
    for _rel, path, _st in _walk(root):
        os.lchown(path, uid, gid)


def _project_owner(target: Path) -> os.stat_result:
    """Whose a path synced back into the project becomes: the owner of what it replaces, else
    of its directory (never the sandbox's uid that wrote the copy)."""
    try:
        return target.lstat()
    except FileNotFoundError:
        return target.parent.lstat()


def _copy_meta(source: Path, target: Path, owner: os.stat_result | None = None) -> None:
    st = source.lstat()
    os.chmod(target, stat.S_IMODE(st.st_mode))
    _chown_like(target, owner or st)


def _copy_dir_node(source: Path, target: Path, st: os.stat_result) -> None:
    target.mkdir()
    os.chmod(target, stat.S_IMODE(st.st_mode))
    _chown_like(target, st)


def _copy_node(source: Path, target: Path, st: os.stat_result, entry: Entry) -> None:
    if entry.kind == "d":
        _copy_dir_node(source, target, st)
    elif entry.kind == "l":
        os.symlink(entry.target, target)
        _chown_like(target, st)
    else:
        shutil.copy2(source, target, follow_symlinks=False)
        _chown_like(target, st)


def _put(source: Path, target: Path, entry: Entry, owner: os.stat_result | None = None) -> None:
    """Put ``source`` (a file or link) at ``target`` atomically, replacing a link there
    instead of writing through it; owned like ``owner`` (default: like ``source``)."""
    tmp = target.parent / f"{TMP_PREFIX}{secrets.token_hex(TMP_SUFFIX_BYTES)}"
    try:
        if entry.kind == "l":
            os.symlink(entry.target, tmp)
        else:
            shutil.copy2(source, tmp, follow_symlinks=False)
        _chown_like(tmp, owner or source.lstat())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


# --- the local backend ---------------------------------------------------------------------------

LOCAL_RO_WARNING = (
    "prime-agent: warning: workspace mode ro cannot be enforced by the local backend "
    "(no isolation): the workspace stays writable"
)


def local_workspace(
    spec: SandboxSpec, mode: WorkspaceMode, *, warn: bool
) -> tuple[SandboxSpec, WorkspaceCopy | None]:
    """The local backend's view of a workspace mode: ``copy`` runs the kernel in a private copy
    (at the copy's own path: a plain process cannot see it at the project's path) and returns
    it for syncing back at stop; ``ro`` cannot be enforced and logs a one-line warning (when
    ``warn``); ``rw`` is the project itself."""
    if mode == "ro" and warn:
        log.warning(LOCAL_RO_WARNING)
    if mode != "copy":
        return spec, None
    copy = WorkspaceCopy.create(spec.cwd, spec.artifacts_dir)
    return replace(spec, cwd=copy.copy_dir), copy
