"""What every confined sandbox (docker container, bwrap sandbox) shares with its host side.

A confined sandbox has no route to the host: its kernel gateway listens on a Unix socket in a
host directory bound at ``CONTAINER_SOCKET_DIR``, and NATS goes through the in-sandbox relay
(127.0.0.1:``CONTAINER_NATS_PORT`` inside -> ``NATS_SOCKET`` -> the host's NATS). Cell outputs
live in the sandbox's own host directory, bound at the same path inside; skills are bound
read-only under ``CONTAINER_SKILLS_DIR``. These are the paths and helpers both backends use
(docker_run.py re-exports them for the docker side), how the host reaches the gateway
(``gateway_client``, ``start_kernel``), and ``ConfinedPolicy``, the session policy both
backends apply; nothing here imports a backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from orchestrator.errors import SandboxStartError
from orchestrator.runtime.wire import ENV_NATS_URL
from orchestrator.sandbox.base import (
    ResourceLimits,
    SandboxSpec,
    WorkspaceMode,
    checked_skill_dirs,
    with_import_path,
)
from orchestrator.sandbox.docker_user import container_user, workspace_problem
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.output import ARTIFACT_SUBDIR

__all__ = [
    "CONTAINER_GATEWAY_RUNTIME",
    "CONTAINER_HOME",
    "CONTAINER_NATS_PORT",
    "CONTAINER_SKILLS_DIR",
    "CONTAINER_SOCKET_DIR",
    "GATEWAY_HOST_URL",
    "GATEWAY_MODULE",
    "GATEWAY_SOCKET",
    "KERNEL_BASE_ENV",
    "NATS_SOCKET",
    "OUTPUTS_DIR_MODE",
    "SNAPSHOT_DIR_MODE",
    "SOCKET_DIR_MODE",
    "SOCKET_SUBDIR",
    "ConfinedPolicy",
    "container_env",
    "gateway_client",
    "gateway_command",
    "gateway_url",
    "nats_target",
    "outputs_dir",
    "session_env",
    "skill_mount_point",
    "skill_mounts",
    "start_kernel",
]

# Inside the sandbox (images/session/Dockerfile; the bwrap backend builds the same layout).
CONTAINER_HOME: Final = "/home/sandbox"
CONTAINER_SOCKET_DIR: Final = "/run/prime-agent"
CONTAINER_GATEWAY_RUNTIME: Final = "/tmp/prime-agent-gateway"
CONTAINER_NATS_PORT: Final = 4222
# Python-backed skills: each skill directory read-only at CONTAINER_SKILLS_DIR/<its name>.
CONTAINER_SKILLS_DIR: Final = "/opt/prime-agent/skills"
GATEWAY_MODULE: Final = "orchestrator.sandbox.gateway_main"
GATEWAY_SOCKET: Final = "gateway.sock"
NATS_SOCKET: Final = "nats.sock"
GATEWAY_HOST_URL: Final = "http://localhost"  # Host header only: requests travel over the socket
# On the host: the sandbox's socket directory (gateway.sock, nats.sock) in its runtime dir,
# bound at CONTAINER_SOCKET_DIR.
SOCKET_SUBDIR: Final = "sock"
KERNEL_BASE_ENV: Final = {
    "HOME": CONTAINER_HOME,
    "LANG": "C.UTF-8",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "TMPDIR": "/tmp",
}
SOCKET_DIR_MODE: Final = 0o777  # the sandbox's uid creates gateway.sock here; the parent is 0700
SNAPSHOT_DIR_MODE: Final = 0o777  # the sandbox's uid writes snapshots here; the parent is 0700
OUTPUTS_DIR_MODE: Final = 0o777  # the sandbox's uid writes cell outputs here; the parent is 0700


def gateway_command(python: str, env_names: list[str] | tuple[str, ...]) -> list[str]:
    """The sandbox's one command: the gateway on the bound socket, with the NATS relay;
    ``env_names`` are the kernel env names the gateway lets through (``--env-allow``)."""
    command = [
        python,
        "-P",
        "-m",
        GATEWAY_MODULE,
        "--runtime-dir",
        CONTAINER_GATEWAY_RUNTIME,
        "--unix-socket",
        f"{CONTAINER_SOCKET_DIR}/{GATEWAY_SOCKET}",
        "--relay",
        f"{CONTAINER_NATS_PORT}={CONTAINER_SOCKET_DIR}/{NATS_SOCKET}",
    ]
    for name in sorted(env_names):
        command += ["--env-allow", name]
    return command


def gateway_client(socket_dir: Path, token: str) -> KernelGatewayClient:
    """The host's client of the gateway listening on ``GATEWAY_SOCKET`` in ``socket_dir``."""
    return KernelGatewayClient(GATEWAY_HOST_URL, token, uds=str(socket_dir / GATEWAY_SOCKET))


def gateway_url(socket_dir: Path) -> str:
    """That gateway as a ``SandboxRef`` names it: the URL and the socket it travels over."""
    return f"{GATEWAY_HOST_URL} (unix:{socket_dir / GATEWAY_SOCKET})"


async def start_kernel(client: KernelGatewayClient, cwd: Path, env: Mapping[str, str]) -> None:
    """Start the sandbox's kernel in ``cwd`` with ``KERNEL_BASE_ENV`` and the session's ``env``
    over it (the gateway's kernels are rooted at "/"), connect, and wait until it answers."""
    await client.start_kernel(env={**KERNEL_BASE_ENV, **env}, path=str(cwd).lstrip("/"))
    await client.connect()
    await client.wait_ready()


def nats_target(env: Mapping[str, str]) -> tuple[str, int] | None:
    """(host, port) of the session's NATS from its kernel env; None when it has none."""
    url = env.get(ENV_NATS_URL, "")
    if not url:
        return None
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or CONTAINER_NATS_PORT


def outputs_dir(runtime_dir: Path) -> Path:
    """The sandbox's cell-output directory on the host (``<runtime dir>/outputs``), bound at
    the same path inside: a path in a tool result opens on both sides (docs/sandbox.md)."""
    return runtime_dir / ARTIFACT_SUBDIR


def container_env(spec_env: Mapping[str, str]) -> dict[str, str]:
    """The kernel's session env as seen inside: NATS through the in-sandbox relay."""
    env = dict(spec_env)
    if ENV_NATS_URL in env:
        env[ENV_NATS_URL] = f"nats://127.0.0.1:{CONTAINER_NATS_PORT}"
    return env


def skill_mount_point(directory: Path) -> str:
    """Where a skill directory appears in the sandbox."""
    return f"{CONTAINER_SKILLS_DIR}/{directory.name}"


def skill_mounts(skill_dirs: tuple[Path, ...]) -> dict[Path, str]:
    """Host skill directory -> its path in the sandbox (``SandboxStartError`` for one that is
    missing: a bind would create an empty directory in its place, or for two of one name)."""
    mounts: dict[Path, str] = {}
    for directory in checked_skill_dirs(skill_dirs):
        inside = skill_mount_point(directory)
        if inside in mounts.values():
            raise SandboxStartError(f"two skill directories are named {directory.name}")
        mounts[directory] = inside
    return mounts


def session_env(spec: SandboxSpec, *, relayed: bool = True) -> dict[str, str]:
    """The kernel's session env inside, with the bound skill directories first on PYTHONPATH
    (also seen by the kernel's child processes). ``relayed``: NATS through the in-sandbox relay
    (``container_env``); False for a sandbox on the host's network, which uses the URL as is."""
    entries = [skill_mount_point(directory) for directory in spec.skill_dirs]
    env = container_env(spec.env) if relayed else dict(spec.env)
    return with_import_path(env, entries)


class ConfinedPolicy:
    """A confined backend's policy for one session: the spec's own choice where it makes one,
    else the backend's defaults (workspace mode, limits, network); and whether the sandbox's
    user can enter the workspace at all. ``DockerBackend`` and ``BwrapBackend`` set the
    defaults in their ``__init__``."""

    workspace_mode: WorkspaceMode
    memory_bytes: int
    cpus: float
    pids_limit: int
    network: bool

    def workspace_for(self, spec: SandboxSpec) -> WorkspaceMode:
        return spec.workspace or self.workspace_mode

    def limits_for(self, spec: SandboxSpec) -> ResourceLimits:
        default = ResourceLimits(self.memory_bytes, self.cpus, self.pids_limit)
        return spec.limits.over(default) if spec.limits is not None else default

    def network_for(self, spec: SandboxSpec) -> bool:
        return self.network if spec.network is None else spec.network

    def check_workspace(self, spec: SandboxSpec) -> None:
        """``SandboxStartError`` in one line when the sandbox's user cannot enter the
        workspace (it would fail deep in the gateway): what to do instead
        (``docker_user.workspace_problem``)."""
        uid, gid = container_user(spec.cwd)
        problem = workspace_problem(spec.cwd, uid, gid, self.workspace_for(spec))
        if problem is not None:
            raise SandboxStartError(problem)
