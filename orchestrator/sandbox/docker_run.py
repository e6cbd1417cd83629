"""How a docker sandbox's container is made: command, mounts, labels, limits, confinement.

``run_container`` is ``DockerSandbox.start``'s docker call (run in a thread); the constants are
the container's side of the contract with the session image (images/session/Dockerfile).
docs/docker.md ("A container", "Network policy") and docs/snapshots.md explain the choices.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.errors import SandboxStartError
from orchestrator.runtime.wire import ENV_NATS_URL
from orchestrator.sandbox.base import SandboxSpec, checked_skill_dirs, with_import_path
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
from orchestrator.sandbox.output import ARTIFACT_SUBDIR

if TYPE_CHECKING:
    from orchestrator.sandbox.docker import DockerSandbox

__all__ = [
    "CONTAINER_HOME",
    "CONTAINER_NATS_PORT",
    "CONTAINER_SKILLS_DIR",
    "CONTAINER_SNAPSHOT_DIR",
    "CONTAINER_SOCKET_DIR",
    "GATEWAY_HOST_URL",
    "GATEWAY_SOCKET",
    "KERNEL_BASE_ENV",
    "NATS_SOCKET",
    "SANDBOX_UID",
    "SOCKET_DIR_MODE",
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

# Inside the container (images/session/Dockerfile).
CONTAINER_HOME = "/home/sandbox"
CONTAINER_SOCKET_DIR = "/run/prime-agent"
CONTAINER_GATEWAY_RUNTIME = "/tmp/prime-agent-gateway"
CONTAINER_NATS_PORT = 4222
CONTAINER_PYTHON = "/opt/prime-agent/bin/python"
# Python-backed skills: each skill directory read-only at CONTAINER_SKILLS_DIR/<its name>.
CONTAINER_SKILLS_DIR = "/opt/prime-agent/skills"
GATEWAY_SOCKET = "gateway.sock"
NATS_SOCKET = "nats.sock"
GATEWAY_HOST_URL = "http://localhost"  # Host header only: requests travel over the socket
KERNEL_BASE_ENV = {
    "HOME": CONTAINER_HOME,
    "LANG": "C.UTF-8",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "TMPDIR": "/tmp",
}
SOCKET_DIR_MODE = 0o777  # the container's uid creates gateway.sock here; the parent is 0700
SNAPSHOT_DIR_MODE = 0o777  # the container's uid writes snapshots here; the parent is 0700
OUTPUTS_DIR_MODE = 0o777  # the container's uid writes cell outputs here; the parent is 0700


def nats_target(env: Mapping[str, str]) -> tuple[str, int] | None:
    url = env.get(ENV_NATS_URL, "")
    if not url:
        return None
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or CONTAINER_NATS_PORT


def outputs_dir(runtime_dir: Path) -> Path:
    """The container's cell-output directory on the host (``<runtime dir>/outputs``), mounted
    at the same path inside: a path in a tool result opens on both sides (docs/sandbox.md)."""
    return runtime_dir / ARTIFACT_SUBDIR


def container_env(spec_env: Mapping[str, str]) -> dict[str, str]:
    """The kernel's session env as seen inside: NATS through the in-container relay."""
    env = dict(spec_env)
    if ENV_NATS_URL in env:
        env[ENV_NATS_URL] = f"nats://127.0.0.1:{CONTAINER_NATS_PORT}"
    return env


def skill_mount_point(directory: Path) -> str:
    """Where a skill directory appears in the container."""
    return f"{CONTAINER_SKILLS_DIR}/{directory.name}"


def skill_mounts(skill_dirs: tuple[Path, ...]) -> dict[Path, str]:
    """Host skill directory -> its path in the container (``SandboxStartError`` for one that is
    missing: docker would create an empty directory in its place, or for two of one name)."""
    mounts: dict[Path, str] = {}
    for directory in checked_skill_dirs(skill_dirs):
        inside = skill_mount_point(directory)
        if inside in mounts.values():
            raise SandboxStartError(f"two skill directories are named {directory.name}")
        mounts[directory] = inside
    return mounts


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


def session_env(spec: SandboxSpec) -> dict[str, str]:
    """The kernel's session env inside (``container_env``), with the mounted skill directories
    first on PYTHONPATH (also seen by the kernel's child processes)."""
    entries = [skill_mount_point(directory) for directory in spec.skill_dirs]
    return with_import_path(container_env(spec.env), entries)


def gpu_requests(gpus: str) -> list[Any]:
    """Docker's ``--gpus``: "" none, "all" every GPU, N that many (the NVIDIA container
    runtime must be installed; without it the start fails with the engine's one-line error)."""
    if not gpus:
        return []
    from docker.types import DeviceRequest

    count = GPU_COUNT_ALL if gpus == "all" else int(gpus)
    return [DeviceRequest(count=count, capabilities=[["gpu"]])]


def run_container(sandbox: DockerSandbox, socket_dir: Path) -> str:
    """Create and start ``sandbox``'s container (docs/docker.md, "A container"); its id."""
    backend = sandbox.backend
    spec = sandbox.spec
    command = [
        CONTAINER_PYTHON,
        "-P",
        "-m",
        "orchestrator.sandbox.gateway_main",
        "--runtime-dir",
        CONTAINER_GATEWAY_RUNTIME,
        "--unix-socket",
        f"{CONTAINER_SOCKET_DIR}/{GATEWAY_SOCKET}",
        "--relay",
        f"{CONTAINER_NATS_PORT}={CONTAINER_SOCKET_DIR}/{NATS_SOCKET}",
    ]
    for name in sorted(session_env(spec)):
        command += ["--env-allow", name]
    # The workspace appears at the project's own path in every mode (paths in prompts mean
    # the same on both sides); in copy mode that path shows the private copy.
    workspace = str(spec.cwd)
    mode = backend.workspace_for(spec)
    source = sandbox.workspace_copy.copy_dir if sandbox.workspace_copy is not None else spec.cwd
    outputs = outputs_dir(socket_dir.parent)
    outputs.mkdir(exist_ok=True)
    outputs.chmod(OUTPUTS_DIR_MODE)
    mounts = {
        str(socket_dir): {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"},
        str(source): {"bind": workspace, "mode": "ro" if mode == "ro" else "rw"},
        str(outputs): {"bind": str(outputs), "mode": "rw"},
    }
    skills = skill_mount_specs(spec.skill_dirs)
    image = backend.image_for(spec)
    # Checked first: containers.run would try to pull a missing image from a registry.
    if not image_exists(image, backend.docker):
        raise SandboxStartError(f"the sandbox image {image} is missing: {image_hint(image)}")
    limits = backend.limits_for(spec)
    assert limits.memory_bytes is not None and limits.cpus is not None
    assert limits.pids is not None
    # Namespace snapshots: the session's directory (or a pooled container's slot) at one
    # fixed path inside; the kernel is told that path (docs/snapshots.md).
    snapshots = sandbox.slot or spec.snapshot_dir
    if snapshots is not None:
        snapshots.chmod(SNAPSHOT_DIR_MODE)
        mounts[str(snapshots)] = {"bind": CONTAINER_SNAPSHOT_DIR, "mode": "rw"}
        sandbox.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
    labels = {
        LABEL_OWNER: str(os.getuid()),
        LABEL_SESSION: spec.session_id,
        LABEL_ROOT: spec.labels.get("root", spec.session_id),
        LABEL_INSTANCE: backend.instance,
        LABEL_HOST_PID: str(os.getpid()),
        LABEL_HOST_DIR: str(socket_dir.parent),
        **({LABEL_STATE_DIR: str(backend.state_dir)} if backend.state_dir else {}),
        **({LABEL_DAEMON: backend.daemon_socket} if backend.daemon_socket else {}),
        **({LABEL_SNAPSHOT_SLOT: str(sandbox.slot)} if sandbox.slot is not None else {}),
    }
    name = f"{CONTAINER_NAME_PREFIX}{spec.session_id[:40]}-{secrets.token_hex(3)}"
    uid, gid = container_user(source)  # docker_user.py
    errors = docker_errors()
    try:
        container = backend.docker.containers.run(
            image,
            command,
            name=name,
            detach=True,
            labels=labels,
            # From scratch: nothing of the orchestrator's environment (R16).
            environment={TOKEN_ENV: sandbox.token, "LANG": "C.UTF-8", "HOME": CONTAINER_HOME},
            user=f"{uid}:{gid}",
            working_dir=workspace,
            network_mode="bridge" if backend.network_for(spec) else "none",
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,  # no swap: an OOM is an OOM
            nano_cpus=int(limits.cpus * NANO_CPUS_PER_CPU),
            pids_limit=limits.pids,
            device_requests=gpu_requests(backend.gpus),
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
            backend.docker.containers.get(name).remove(force=True)
        raise SandboxStartError(str(translate_error(exc, "starting a container"))) from exc
    return str(container.id)
