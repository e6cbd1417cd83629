"""What crosses between the host and a session pod, and when (docs/kubernetes.md, "Files
between host and pod").

A pod cannot mount the host: what docker and bwrap bind, a ``KubernetesSandbox`` copies through
its gateway's files endpoint (``pod_files.PodFiles``):

- **workspace**: in modes ``copy`` and ``rw`` the project is copied into a host-side
  ``WorkspaceCopy`` (the manifest the sync-back compares with) and from there into the pod at
  ``spec.cwd``; when the sandbox stops the pod's workspace is pulled into that copy and
  ``finish_copy`` syncs it back into the project, conflicts kept aside, as docker's copy mode
  does. ``rw`` cannot be a live view on a pod: it is the same copy. ``ro``: copied in, never
  back.
- **skills**: each skill directory into ``CONTAINER_SKILLS_DIR/<name>`` without write bits.
- **snapshots**: the session's committed snapshot into ``CONTAINER_SNAPSHOT_DIR`` before the
  kernel's namespace is revived; after a save, the pod's committed generation is pulled back
  into ``spec.snapshot_dir`` (``pull_snapshot``) the same way the kernel commits one: the
  generation first, ``CURRENT`` replaced last, older generations removed after. So a snapshot
  outlives its pod (OOM, eviction) and a new pod revives from it.
- **cell outputs**: the host's artifact of a cell (``OutputCollector``) is written under the
  sandbox's outputs directory, which has the same path on the host and in the pod
  (``POD_OUTPUTS_DIR/<pod>``), and is copied in after the cell: the path a tool result names
  opens in the next cell. A stream the kernel spilled is written in the pod already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Final

from orchestrator.errors import SandboxError, SandboxStartError
from orchestrator.runtime.snapshot import (
    CURRENT_FILE,
    GENERATION_PREFIX,
    TMP_PREFIX,
    read_manifest,
)
from orchestrator.sandbox.base import SandboxSpec, WorkspaceMode
from orchestrator.sandbox.confined import CONTAINER_SKILLS_DIR, skill_mounts
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.k8s_manifests import POD_OUTPUTS_DIR
from orchestrator.sandbox.pod_files import PodFiles
from orchestrator.sandbox.workspace import WorkspaceCopy, finish_copy

__all__ = [
    "outputs_home",
    "outputs_path",
    "pull_snapshot",
    "pull_workspace",
    "push_output",
    "push_skills",
    "push_snapshot",
    "push_workspace",
    "remove_outputs_home",
]

log = logging.getLogger(__name__)

# On the host: POD_OUTPUTS_DIR is shared by every user's pods, like /tmp (each sandbox's own
# directory in it is private).
OUTPUTS_PARENT_MODE: Final = 0o1777
OUTPUTS_HOME_MODE: Final = 0o700
PULLED_SUFFIX: Final = ".pulled"
PULL_TOKEN_BYTES: Final = 4


# --- cell outputs ---------------------------------------------------------------------------


def outputs_path(pod: str) -> Path:
    """Where pod ``pod``'s outputs directory is, on the host and inside."""
    return Path(POD_OUTPUTS_DIR) / pod


def outputs_home(pod: str) -> Path:
    """The host side of pod ``pod``'s outputs directory, made private: the same path the pod
    has in its outputs volume (``SandboxStartError`` when the shared parent is not a real
    directory)."""
    parent = Path(POD_OUTPUTS_DIR)
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=OUTPUTS_PARENT_MODE)
        parent.chmod(OUTPUTS_PARENT_MODE)  # past the umask
    if not stat.S_ISDIR(parent.lstat().st_mode):
        raise SandboxStartError(f"{parent} is not a directory: remove it")
    home = outputs_path(pod)
    home.mkdir(mode=OUTPUTS_HOME_MODE, exist_ok=True)
    return home


def remove_outputs_home(home: Path) -> None:
    shutil.rmtree(home, ignore_errors=True)


async def push_output(files: PodFiles, artifact: Path) -> None:
    """Copy the host's artifact of a cell to the same path in the pod."""
    where = artifact.parent.relative_to(POD_OUTPUTS_DIR)
    await files.push(artifact, POD_OUTPUTS_DIR, str(where))


# --- workspace ------------------------------------------------------------------------------


async def push_workspace(
    files: PodFiles, spec: SandboxSpec, mode: WorkspaceMode
) -> WorkspaceCopy | None:
    """Copy the project into the pod's workspace; the host-side copy to sync back into at the
    end (``copy`` and ``rw``), None for ``ro``."""
    if mode == "ro":
        await files.push(spec.cwd, str(spec.cwd))
        return None
    copy = await asyncio.to_thread(WorkspaceCopy.create, spec.cwd, spec.artifacts_dir)
    try:
        await files.push(copy.copy_dir, str(spec.cwd))
    except BaseException:
        await asyncio.to_thread(copy.remove)  # nothing ran in it: no work to keep
        raise
    return copy


async def pull_workspace(files: PodFiles, copy: WorkspaceCopy, cwd: Path) -> None:
    """Pull the pod's workspace into ``copy`` and sync it back into the project. Never raises:
    a pod whose workspace cannot be read any more (gone, failed) is logged, its copy removed."""
    pulled = copy.parent / f"{copy.copy_dir.name}{PULLED_SUFFIX}"
    await asyncio.to_thread(shutil.rmtree, pulled, True)
    try:
        found = await files.pull(str(cwd), ".", pulled)
    except SandboxError as exc:
        found = False
        log.error("workspace: the pod's files could not be copied back to %s: %s", cwd, exc)
    if not found:
        await asyncio.to_thread(shutil.rmtree, pulled, True)
        await asyncio.to_thread(copy.remove)
        return

    def swap_and_sync() -> None:
        shutil.rmtree(copy.copy_dir)
        pulled.rename(copy.copy_dir)
        finish_copy(copy)

    await asyncio.to_thread(swap_and_sync)


# --- skills ---------------------------------------------------------------------------------


async def push_skills(files: PodFiles, skill_dirs: tuple[Path, ...]) -> None:
    """Each skill directory into the pod at the path the prompt names, without write bits."""
    for directory, inside in skill_mounts(skill_dirs).items():
        name = inside.removeprefix(f"{CONTAINER_SKILLS_DIR}/")
        await files.push(directory, CONTAINER_SKILLS_DIR, name, clear=True, read_only=True)


# --- snapshots ------------------------------------------------------------------------------


async def push_snapshot(files: PodFiles, snapshot_dir: Path) -> None:
    """The session's committed snapshot into the pod (nothing when it has none)."""
    if read_manifest(snapshot_dir) is not None:
        await files.push(snapshot_dir, CONTAINER_SNAPSHOT_DIR, clear=True)


def _generation(current: Path) -> str | None:
    try:
        name = current.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    ok = name.startswith(GENERATION_PREFIX) and "/" not in name
    return name if ok else None


def _commit(snapshot_dir: Path, staging: Path, generation: str) -> None:
    """``staging`` holds ``CURRENT`` and its generation: put them in ``snapshot_dir`` as the
    kernel commits a snapshot (generation, then ``CURRENT`` atomically, then the rest goes)."""
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    target = snapshot_dir / generation
    if target.exists():
        shutil.rmtree(target)
    (staging / generation).rename(target)
    os.replace(staging / CURRENT_FILE, snapshot_dir / CURRENT_FILE)  # the commit point
    for entry in snapshot_dir.iterdir():
        stale = entry.name.startswith((GENERATION_PREFIX, TMP_PREFIX)) and entry.name != generation
        if stale and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


async def pull_snapshot(files: PodFiles, snapshot_dir: Path) -> bool:
    """Pull the pod's committed snapshot into ``snapshot_dir`` when it is not there yet;
    True when one was pulled."""
    tail = secrets.token_hex(PULL_TOKEN_BYTES)
    staging = snapshot_dir.parent / f"{TMP_PREFIX}{snapshot_dir.name}-{tail}"
    try:
        if not await files.pull(CONTAINER_SNAPSHOT_DIR, CURRENT_FILE, staging):
            return False
        generation = _generation(staging / CURRENT_FILE)
        if generation is None:
            return False
        if _generation(snapshot_dir / CURRENT_FILE) == generation:
            return False  # the host has it already
        if not await files.pull(CONTAINER_SNAPSHOT_DIR, generation, staging / generation):
            return False  # replaced by a newer one meanwhile: the next pull takes that
        await asyncio.to_thread(_commit, snapshot_dir, staging, generation)
        return True
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
