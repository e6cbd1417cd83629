"""How a docker sandbox's container is made: command, mounts, labels, limits, confinement.

``run_container`` is ``DockerSandbox.start``'s docker call (run in a thread): the sandbox
describes the container it wants in a ``ContainerRequest`` (its backend's policy for its spec
already applied), so nothing here knows the backend (``docker.py`` imports this module, never
the reverse). The constants are the container's side of the contract with the session image
(images/session/Dockerfile) and the layout of its host directory. docs/docker.md ("A
container", "Network policy") and docs/snapshots.md explain the choices.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox.base import ResourceLimits, SandboxSpec, WorkspaceMode
from orchestrator.sandbox.confined import (
    CONTAINER_GATEWAY_RUNTIME,
    CONTAINER_HOME,
    CONTAINER_NATS_PORT,
    CONTAINER_SKILLS_DIR,
    CONTAINER_SOCKET_DIR,
    GATEWAY_HOST_URL,
    GATEWAY_SOCKET,
    KERNEL_BASE_ENV,
    NATS_SOCKET,
    OUTPUTS_DIR_MODE,
    SNAPSHOT_DIR_MODE,
    SOCKET_DIR_MODE,
    SOCKET_SUBDIR,
    container_env,
    gateway_command,
    nats_target,
    outputs_dir,
    session_env,
    skill_mount_point,
    skill_mounts,
)
from orchestrator.sandbox.docker_owned import (
    LABEL_DAEMON,
    LABEL_HOST_DIR,
    LABEL_HOST_PID,
    LABEL_INSTANCE,
    LABEL_OWNER,
    LABEL_ROOT,
    LABEL_SESSION,
    LABEL_SNAPSHOT_SLOT,
    LABEL_STATE_DIR,
    docker_errors,
    translate_error,
)
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.docker_user import SANDBOX_UID, container_user
from orchestrator.sandbox.gateway_main import TOKEN_ENV
from orchestrator.sandbox.images import image_exists, image_hint
from orchestrator.sandbox.mounts import ExtraMount

__all__ = [  # the shared layout of confined.py is re-exported
    "CONTAINER_GATEWAY_RUNTIME",
    "CONTAINER_HOME",
    "CONTAINER_NATS_PORT",
    "CONTAINER_SKILLS_DIR",
    "CONTAINER_SNAPSHOT_DIR",
    "CONTAINER_SOCKET_DIR",
    "GATEWAY_HOST_URL",
    "GATEWAY_SOCKET",
    "KERNEL_BASE_ENV",
    "NATS_SOCKET",
    "OUTPUTS_DIR_MODE",
    "RUNTIME_DIR_PREFIX",
    "SANDBOX_UID",
    "SNAPSHOT_DIR_MODE",
    "SOCKET_DIR_MODE",
    "SOCKET_SUBDIR",
    "ContainerRequest",
    "container_env",
    "nats_target",
    "outputs_dir",
    "run_container",
    "session_env",
    "skill_mount_point",
    "skill_mount_specs",
    "skill_mounts",
]

CONTAINER_NAME_PREFIX = "prime-agent-"
NANO_CPUS_PER_CPU = 1_000_000_000
GPU_COUNT_ALL = -1  # a DeviceRequest count meaning every GPU
TMPFS_TMP = "size=512m,mode=1777"
# The home directory is the container user's own (uid=, gid=: some engines give a tmpfs the
# image directory's root-owned 0755 whatever the mode; any uid must be able to write HOME).
TMPFS_HOME = "size=256m,mode=1777,uid={uid},gid={gid}"

# The container's side of the sandbox layout (confined.py, shared with the bwrap backend).
CONTAINER_PYTHON = "/opt/prime-agent/bin/python"

# A sandbox's host directory: ``<temp dir>/<RUNTIME_DIR_PREFIX>XXXX``, removed with its
# container. Its ``SOCKET_SUBDIR`` (gateway.sock, nats.sock) is mounted at CONTAINER_SOCKET_DIR;
# its outputs directory (``outputs_dir``) at its own path.
RUNTIME_DIR_PREFIX: Final = "prime-agent-dkr-"


@dataclass(frozen=True)
class ContainerRequest:
    """One sandbox's container as ``run_container`` makes it: its session's spec with the
    backend's policy applied (the spec's own settings win), and who owns it (its labels)."""

    spec: SandboxSpec
    image: str
    workspace_mode: WorkspaceMode
    # What is mounted at ``spec.cwd``: the project itself, or its private copy (copy mode).
    workspace_source: Path
    limits: ResourceLimits  # every field set (the backend's defaults fill the spec's gaps)
    network: bool
    gpus: str  # docker's --gpus: "" none, "all", or a count
    token: str  # the gateway's
    instance: str  # LABEL_INSTANCE
    state_dir: Path | None  # LABEL_STATE_DIR, when known
    daemon_socket: str  # LABEL_DAEMON; "" = not a daemon's
    # A pooled container's snapshot slot (LABEL_SNAPSHOT_SLOT), mounted in place of
    # ``spec.snapshot_dir`` until the container is assigned (docker_slots.py).
    slot: Path | None = None

    @property
    def snapshots(self) -> Path | None:
        """The host directory mounted at CONTAINER_SNAPSHOT_DIR, if any."""
        return self.slot or self.spec.snapshot_dir


def skill_mount_specs(skill_dirs: tuple[Path, ...]) -> list[Any]:
    """Docker ``Mount``s of the skill directories: bind, read-only (a skill is the user's code,
    never the agent's to change). Unlike ``volumes``, a bind ``Mount`` of a missing source is
    an error, never an empty directory made for it."""
    if not skill_dirs:
        return []
    from docker.types import Mount

    return [
        Mount(target=inside, source=str(directory), type="bind", read_only=True)
        for directory, inside in skill_mounts(skill_dirs).items()
    ]


def extra_mount_specs(extra: tuple[ExtraMount, ...]) -> list[Any]:
    """Docker ``Mount``s of a session's extra mounts (checked by the backend, mounts.py)."""
    from docker.types import Mount

    return [
        Mount(target=m.target, source=str(m.source), type="bind", read_only=m.read_only)
        for m in extra
    ]


def gpu_requests(gpus: str) -> list[Any]:
    """Docker's ``--gpus``: "" none, "all" every GPU, N that many (the NVIDIA container
    runtime must be installed; without it the start fails with the engine's one-line error)."""
    if not gpus:
        return []
    from docker.types import DeviceRequest

    count = GPU_COUNT_ALL if gpus == "all" else int(gpus)
    return [DeviceRequest(count=count, capabilities=[["gpu"]])]


def run_container(docker: Any, request: ContainerRequest, socket_dir: Path) -> str:
    """Create and start ``request``'s container with the engine client ``docker``
    (docs/docker.md, "A container"); its id. ``socket_dir`` is the sandbox's socket directory
    (``<host dir>/SOCKET_SUBDIR``)."""
    spec = request.spec
    command = gateway_command(CONTAINER_PYTHON, list(session_env(spec)))
    # The workspace appears at the project's own path in every mode (paths in prompts mean
    # the same on both sides); in copy mode that path shows the private copy.
    workspace = str(spec.cwd)
    mode = request.workspace_mode
    source = request.workspace_source
    outputs = outputs_dir(socket_dir.parent)
    outputs.mkdir(exist_ok=True)
    outputs.chmod(OUTPUTS_DIR_MODE)
    mounts = {
        str(socket_dir): {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"},
        str(source): {"bind": workspace, "mode": "ro" if mode == "ro" else "rw"},
        str(outputs): {"bind": str(outputs), "mode": "rw"},
    }
    # Mount objects, not ``volumes`` entries: an extra mount may show the workspace itself at
    # a second path (a Harbor task's /app), and ``volumes`` is keyed by the source.
    skills = skill_mount_specs(spec.skill_dirs) + extra_mount_specs(spec.mounts)
    image = request.image
    # Checked first: containers.run would try to pull a missing image from a registry.
    if not image_exists(image, docker):
        raise SandboxStartError(f"the sandbox image {image} is missing: {image_hint(image)}")
    limits = request.limits
    assert limits.memory_bytes is not None and limits.cpus is not None
    assert limits.pids is not None
    # Namespace snapshots: the session's directory (or a pooled container's slot) at one
    # fixed path inside; the sandbox tells its kernel that path (docs/snapshots.md).
    snapshots = request.snapshots
    if snapshots is not None:
        snapshots.chmod(SNAPSHOT_DIR_MODE)
        mounts[str(snapshots)] = {"bind": CONTAINER_SNAPSHOT_DIR, "mode": "rw"}
    labels = {
        LABEL_OWNER: str(os.getuid()),
        LABEL_SESSION: spec.session_id,
        LABEL_ROOT: spec.labels.get("root", spec.session_id),
        LABEL_INSTANCE: request.instance,
        LABEL_HOST_PID: str(os.getpid()),
        LABEL_HOST_DIR: str(socket_dir.parent),
        **({LABEL_STATE_DIR: str(request.state_dir)} if request.state_dir else {}),
        **({LABEL_DAEMON: request.daemon_socket} if request.daemon_socket else {}),
        **({LABEL_SNAPSHOT_SLOT: str(request.slot)} if request.slot is not None else {}),
    }
    name = f"{CONTAINER_NAME_PREFIX}{spec.session_id[:40]}-{secrets.token_hex(3)}"
    uid, gid = container_user(source)  # docker_user.py
    errors = docker_errors()
    try:
        container = docker.containers.run(
            image,
            command,
            name=name,
            detach=True,
            labels=labels,
            # From scratch: nothing of the orchestrator's environment (R16).
            environment={TOKEN_ENV: request.token, "LANG": "C.UTF-8", "HOME": CONTAINER_HOME},
            user=f"{uid}:{gid}",
            working_dir=workspace,
            network_mode="bridge" if request.network else "none",
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,  # no swap: an OOM is an OOM
            nano_cpus=int(limits.cpus * NANO_CPUS_PER_CPU),
            pids_limit=limits.pids,
            device_requests=gpu_requests(request.gpus),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/tmp": TMPFS_TMP, CONTAINER_HOME: TMPFS_HOME.format(uid=uid, gid=gid)},
            volumes=mounts,
            mounts=skills,
            init=True,  # docker-init as pid 1 forwards signals and reaps
            hostname="sandbox",
        )
    except errors.ImageNotFound as exc:
        raise SandboxStartError(
            f"the sandbox image {image} is missing: {image_hint(image)}"
        ) from exc
    except errors.DockerException as exc:
        # `run` creates before it starts: a start that fails (a missing GPU runtime, a bad
        # mount) leaves a created container behind unless it is removed here.
        with contextlib.suppress(errors.DockerException):
            docker.containers.get(name).remove(force=True)
        raise SandboxStartError(str(translate_error(exc, "starting a container"))) from exc
    return str(container.id)
