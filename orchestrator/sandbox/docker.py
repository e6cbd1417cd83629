"""The ``docker`` backend: one container per session from the session image (images/).

Isolation (docs/docker.md):

- The container runs as a non-root user with every capability dropped, ``no-new-privileges``,
  a read-only root filesystem (tmpfs on /tmp and the home directory), and memory, CPU and pids
  limits. The session's workspace (``spec.cwd``) is bind-mounted read-write at the same path, so
  paths the model sees match the host's.
- No network (``network_mode=none``) unless the backend is created with ``network=True``. The
  container reaches the host through two Unix sockets in a bind-mounted private directory:
  the kernel gateway listens on ``gateway.sock`` (the host's ``KernelGatewayClient`` connects to
  it; no port is published anywhere), and NATS is relayed: ``gateway_main --relay`` listens on
  127.0.0.1:4222 inside the container and forwards to ``nats.sock``, which this backend relays
  to the orchestrator's NATS server. So the only connection a kernel can open is to NATS, as
  its own per-session user (R17, R19).
- Nothing secret enters (R16): the container's environment is built here from scratch (token,
  locale, home); the kernel gets only the session's NATS credentials through the gateway.
- Loss is recoverable (R3): a container that died (killed, OOM of the gateway, wedged by a fork
  bomb) is replaced with a fresh one for the same session on the next cell, with a notice.
- Nothing is left behind (R8): every container carries our labels; ``stop``/``close`` remove
  them, and ``find_orphans``/``remove_orphans`` find those of dead orchestrators.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError, UserError
from orchestrator.procs import pid_alive
from orchestrator.runtime.wire import ENV_NATS_URL
from orchestrator.sandbox.base import CellResult, Sandbox, SandboxBackend, SandboxRef, SandboxSpec
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_main import TOKEN_ENV
from orchestrator.sandbox.images import SESSION_IMAGE, docker_client
from orchestrator.sandbox.output import OutputCollector, artifact_path_for
from orchestrator.sandbox.pool import WarmPool
from orchestrator.sandbox.relay import serve_unix_to_tcp
from orchestrator.settings import (
    INTERRUPT_GRACE_S,
    OUTPUT_STREAM_CAP_CHARS,
    SANDBOX_START_TIMEOUT_S,
    WARM_POOL_SIZE,
)

__all__ = [
    "BACKEND_NAME",
    "LABEL_INSTANCE",
    "LABEL_OWNER",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "DockerBackend",
    "DockerSandbox",
    "OwnedContainer",
    "docker_usable",
    "find_orphans",
    "list_owned",
    "remove_containers",
    "remove_orphans",
]

log = logging.getLogger(__name__)

BACKEND_NAME = "docker"
LABEL_OWNER = "prime-agent.owner"
LABEL_SESSION = "prime-agent.session"
LABEL_ROOT = "prime-agent.root"
LABEL_INSTANCE = "prime-agent.instance"
LABEL_HOST_PID = "prime-agent.host-pid"  # the orchestrator process that started it
DEFAULT_INSTANCE = "main"
CONTAINER_NAME_PREFIX = "prime-agent-"

# Limits (per container). Memory includes the tmpfs pages written by the session.
DEFAULT_MEMORY_BYTES = 2 * 1024**3
DEFAULT_CPUS = 1.0
DEFAULT_PIDS_LIMIT = 256
NANO_CPUS_PER_CPU = 1_000_000_000
TMPFS_TMP = "size=512m,mode=1777"
TMPFS_HOME = "size=256m,mode=1777"

# Inside the container (images/session/Dockerfile).
SANDBOX_UID = 1000  # the image's non-root user
CONTAINER_HOME = "/home/sandbox"
CONTAINER_SOCKET_DIR = "/run/prime-agent"
CONTAINER_GATEWAY_RUNTIME = "/tmp/prime-agent-gateway"
CONTAINER_NATS_PORT = 4222
CONTAINER_PYTHON = "/opt/prime-agent/bin/python"
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

TOKEN_BYTES = 32
READY_POLL_S = 0.02
CONTAINER_CHECK_EVERY_S = 0.5  # while waiting for the gateway: did the container exit?
STOP_TIMEOUT_S = 2  # docker stop: SIGTERM -> this -> SIGKILL
DOCKER_API_TIMEOUT_S = 60
# A cell is given timeout + interrupt grace + this before we stop trusting the container (a fork
# bomb can leave the gateway unable to restart the kernel: no pid left to spawn it).
HANG_ALLOWANCE_S = 20.0
LOG_TAIL_LINES = 5
POOL_SESSION_ID = "pool"
RUNTIME_DIR_PREFIX = "prime-agent-dkr-"

WorkspaceMode = Literal["rw", "ro", "copy"]


@dataclass(frozen=True)
class OwnedContainer:
    id: str
    name: str
    status: str  # docker's: created, running, exited, ...
    session_id: str
    root_id: str
    instance: str
    host_pid: int


def docker_usable(image: str = SESSION_IMAGE) -> tuple[bool, str]:
    """(True, "") when an engine answers and ``image`` exists; else (False, why)."""
    from orchestrator.sandbox.images import image_exists

    try:
        client = docker_client()
        if not image_exists(image, client):
            return False, f"the session image {image} is not built (prime-agent images build)"
    except (UserError, SandboxError) as exc:
        return False, str(exc)
    return True, ""


def _docker_errors() -> Any:
    import docker.errors

    return docker.errors


def _translate(exc: BaseException, what: str) -> SandboxError:
    text = str(exc).strip().splitlines()
    return SandboxError(f"docker: {what}: {text[0] if text else type(exc).__name__}")


def _owned_from(container: Any) -> OwnedContainer:
    labels = container.labels or {}
    try:
        host_pid = int(labels.get(LABEL_HOST_PID, "0"))
    except ValueError:
        host_pid = 0
    return OwnedContainer(
        id=container.id,
        name=container.name,
        status=container.status,
        session_id=labels.get(LABEL_SESSION, ""),
        root_id=labels.get(LABEL_ROOT, ""),
        instance=labels.get(LABEL_INSTANCE, ""),
        host_pid=host_pid,
    )


def list_owned(client: Any | None = None, *, owner: int | None = None) -> list[OwnedContainer]:
    """Every container (running or not) with our labels, for ``owner`` (default: this uid)."""
    client = client or docker_client()
    owner = os.getuid() if owner is None else owner
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL_OWNER}={owner}"})
    except _docker_errors().DockerException as exc:
        raise _translate(exc, "listing containers") from exc
    return [_owned_from(c) for c in found]


def find_orphans(
    client: Any | None = None, *, live_sessions: set[str] | None = None
) -> list[OwnedContainer]:
    """Our containers that nobody owns any more: the orchestrator that started them is gone
    (and, when ``live_sessions`` is given, their session is not one of them: adoptable)."""
    orphans = []
    for owned in list_owned(client):
        if pid_alive(owned.host_pid):
            continue
        if live_sessions is not None and owned.session_id in live_sessions:
            continue
        orphans.append(owned)
    return orphans


def remove_containers(ids: list[str], client: Any | None = None) -> int:
    """Force-remove containers by id; returns how many were removed."""
    client = client or docker_client()
    errors = _docker_errors()
    removed = 0
    for cid in ids:
        try:
            client.containers.get(cid).remove(force=True)
            removed += 1
        except errors.NotFound:
            continue
        except errors.DockerException as exc:
            raise _translate(exc, f"removing {cid[:12]}") from exc
    return removed


def remove_orphans(client: Any | None = None) -> list[OwnedContainer]:
    client = client or docker_client()
    orphans = find_orphans(client)
    remove_containers([o.id for o in orphans], client)
    return orphans


def _nats_target(env: Mapping[str, str]) -> tuple[str, int] | None:
    url = env.get(ENV_NATS_URL, "")
    if not url:
        return None
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or CONTAINER_NATS_PORT


def _container_env(spec_env: Mapping[str, str]) -> dict[str, str]:
    """The kernel's session env as seen inside: NATS through the in-container relay."""
    env = dict(spec_env)
    if ENV_NATS_URL in env:
        env[ENV_NATS_URL] = f"nats://127.0.0.1:{CONTAINER_NATS_PORT}"
    return env


class DockerSandbox(Sandbox):
    """One container with its gateway and kernel. Cells are serialized by the caller."""

    def __init__(self, backend: DockerBackend, spec: SandboxSpec):
        self.backend = backend
        self.spec = spec
        self.container_id = ""
        self.client: KernelGatewayClient | None = None
        self.runtime_dir: Path | None = None
        self.token = ""
        self.kernel_pid: int | None = None
        self.replacements = 0  # containers replaced after a loss (R3)
        self.ref = SandboxRef(BACKEND_NAME, "", spec.session_id, GATEWAY_HOST_URL, "", "")
        self._relay: asyncio.Server | None = None
        self._nats: tuple[str, int] | None = _nats_target(spec.env)
        self._stopped = False
        self._lock = asyncio.Lock()

    # --- container lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Create the container, wait for its gateway, start the kernel, apply the session."""
        self.runtime_dir = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))
        socket_dir = self.runtime_dir / "sock"
        socket_dir.mkdir()
        socket_dir.chmod(SOCKET_DIR_MODE)
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        self._relay = await serve_unix_to_tcp(socket_dir / NATS_SOCKET, lambda: self._nats)
        started = time.monotonic()
        # The docker call runs in a thread that a cancellation would not stop: wait for it
        # anyway, so that a container created meanwhile is known and removed, not leaked.
        run = asyncio.ensure_future(asyncio.to_thread(self._run_container, socket_dir))
        try:
            self.container_id = await asyncio.shield(run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.container_id = await run
            raise
        booted_at = await self._wait_gateway(socket_dir / GATEWAY_SOCKET)
        client = KernelGatewayClient(
            GATEWAY_HOST_URL, self.token, uds=str(socket_dir / GATEWAY_SOCKET)
        )
        self.client = client
        client.on_restart = self._setup
        await client.start_kernel(
            env={**KERNEL_BASE_ENV, **_container_env(self.spec.env)},
            path=str(self.spec.cwd).lstrip("/"),
        )
        await client.connect()
        await client.wait_ready()
        await self._setup()
        self.ref = SandboxRef(
            backend=BACKEND_NAME,
            ref=self.container_id,
            session_id=self.spec.session_id,
            url=f"{GATEWAY_HOST_URL} (unix:{socket_dir / GATEWAY_SOCKET})",
            kernel_id=client.kernel_id,
            token=self.token,
        )
        now = time.monotonic()
        log.info(
            "docker sandbox %s: container+gateway %.0f ms, kernel %.0f ms",
            self.spec.session_id,
            (booted_at - started) * 1000,
            (now - booted_at) * 1000,
        )

    def _run_container(self, socket_dir: Path) -> str:
        backend = self.backend
        spec = self.spec
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
        for name in sorted(spec.env):
            command += ["--env-allow", name]
        workspace = str(spec.cwd)
        mounts = {
            str(socket_dir): {"bind": CONTAINER_SOCKET_DIR, "mode": "rw"},
            workspace: {
                "bind": workspace,
                "mode": "ro" if backend.workspace_mode == "ro" else "rw",
            },
        }
        labels = {
            LABEL_OWNER: str(os.getuid()),
            LABEL_SESSION: spec.session_id,
            LABEL_ROOT: spec.labels.get("root", spec.session_id),
            LABEL_INSTANCE: backend.instance,
            LABEL_HOST_PID: str(os.getpid()),
        }
        name = f"{CONTAINER_NAME_PREFIX}{spec.session_id[:40]}-{secrets.token_hex(3)}"
        errors = _docker_errors()
        try:
            container = backend.docker.containers.run(
                backend.image,
                command,
                name=name,
                detach=True,
                labels=labels,
                # From scratch: nothing of the orchestrator's environment (R16).
                environment={TOKEN_ENV: self.token, "LANG": "C.UTF-8", "HOME": CONTAINER_HOME},
                user=backend.user_for(spec.cwd),
                working_dir=workspace,
                network_mode="bridge" if backend.network else "none",
                mem_limit=backend.memory_bytes,
                memswap_limit=backend.memory_bytes,  # no swap: an OOM is an OOM
                nano_cpus=int(backend.cpus * NANO_CPUS_PER_CPU),
                pids_limit=backend.pids_limit,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": TMPFS_TMP, CONTAINER_HOME: TMPFS_HOME},
                volumes=mounts,
                init=True,  # docker-init as pid 1 forwards signals and reaps
                hostname="sandbox",
            )
        except errors.ImageNotFound as exc:
            raise SandboxStartError(
                f"the session image {backend.image} is missing: run prime-agent images build"
            ) from exc
        except errors.DockerException as exc:
            raise SandboxStartError(str(_translate(exc, "starting a container"))) from exc
        return str(container.id)

    async def _wait_gateway(self, socket_path: Path) -> float:
        """Poll the gateway's socket until it answers; returns the time it did."""
        deadline = time.monotonic() + self.backend.start_timeout_s
        next_check = time.monotonic() + CONTAINER_CHECK_EVERY_S
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path))
        headers = {"Authorization": f"token {self.token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url=GATEWAY_HOST_URL, headers=headers, trust_env=False
        ) as http:
            while True:
                if socket_path.exists():
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get("/api")).status_code == httpx.codes.OK:
                            return time.monotonic()
                now = time.monotonic()
                if now > deadline:
                    raise SandboxStartError(
                        f"the container's kernel gateway did not answer within "
                        f"{self.backend.start_timeout_s:.0f} s: {await self._logs_tail()}"
                    )
                if now > next_check:
                    next_check = now + CONTAINER_CHECK_EVERY_S
                    state = await self._state()
                    if state not in ("running", "created"):
                        raise SandboxStartError(
                            f"the container exited ({state}) before its gateway answered: "
                            f"{await self._logs_tail()}"
                        )
                await asyncio.sleep(READY_POLL_S)

    async def _state(self) -> str:
        """The container's status ("running", "exited", ...), "gone" when removed."""
        errors = _docker_errors()

        def get() -> str:
            try:
                container = self.backend.docker.containers.get(self.container_id)
            except errors.NotFound:
                return "gone"
            state = container.attrs.get("State", {})
            if state.get("OOMKilled"):
                return "oom-killed"
            return str(container.status)

        try:
            return await asyncio.to_thread(get)
        except errors.DockerException as exc:
            raise _translate(exc, "inspecting a container") from exc

    async def _logs_tail(self) -> str:
        def get() -> str:
            try:
                raw = self.backend.docker.containers.get(self.container_id).logs(
                    tail=LOG_TAIL_LINES
                )
            except Exception:  # diagnostics only
                return ""
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            return " | ".join(line for line in text.strip().splitlines() if line)

        return await asyncio.to_thread(get)

    async def _teardown(self) -> None:
        """Remove the container and everything on the host that belonged to it."""
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()
        if self.container_id:
            cid = self.container_id
            errors = _docker_errors()

            def remove() -> None:
                with contextlib.suppress(errors.NotFound):
                    self.backend.docker.containers.get(cid).remove(force=True)

            try:
                await asyncio.to_thread(remove)
            except errors.DockerException as exc:
                log.warning("docker: removing %s failed: %s", cid[:12], exc)
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            self.runtime_dir = None

    async def _replace(self, why: str) -> str:
        """A new container for the same session (R3); returns the notice for the model."""
        log.warning("docker sandbox %s: %s; replacing the container", self.spec.session_id, why)
        await self._teardown()
        try:
            await self.start()
        except SandboxError as exc:
            await self._teardown()
            raise KernelDied(f"{why}; a new container did not start: {exc}") from exc
        self.replacements += 1
        return f"{why}; a new sandbox container was started and the namespace is lost."

    # --- session ----------------------------------------------------------------------------

    async def _setup(self) -> None:
        assert self.client is not None
        env = _container_env(self.spec.env)
        code = (
            "__import__('orchestrator.runtime', fromlist=['session_setup']).session_setup("
            f"{str(self.spec.cwd)!r}, {env!r})"
        )
        reply = await self.client.run_silent(
            code, user_expressions={"pid": "__import__('os').getpid()"}
        )
        pid = reply.get("user_expressions", {}).get("pid", {})
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
            self.kernel_pid = int(pid["data"]["text/plain"])

    async def assign(self, spec: SandboxSpec) -> None:
        """Hand an idle pooled container to a session (its workspace is already mounted)."""
        if spec.cwd != self.spec.cwd:
            raise SandboxError("pooled container has another workspace")
        self.spec = spec
        self._nats = _nats_target(spec.env)
        self.ref = replace(self.ref, session_id=spec.session_id)
        assert self.client is not None
        self.client.unreported_restarts = 0
        await self._setup()

    # --- Sandbox ----------------------------------------------------------------------------

    async def execute(self, code: str, *, timeout_s: float, cell_id: str) -> CellResult:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        async with self._lock:
            if self._stopped:
                raise SandboxError(f"sandbox {self.spec.session_id} is stopped")
            notice = ""
            if self.client is None:  # a replacement failed earlier: try again
                notice = await self._replace("the sandbox container was lost")
            assert self.client is not None
            if not self.client.connected:
                # The socket closed since the last cell: if the container is gone, replace it
                # now and run this cell in the new one (nothing of it ran anywhere).
                state = await self._state()
                if state != "running":
                    notice = await self._replace(f"the sandbox container stopped ({state})")
            assert self.client is not None
            try:
                notice = " ".join(filter(None, [notice, await self.client.prepare()]))
            except SandboxError as exc:
                # Before the cell was sent: the container is gone or wedged. Replace it and run
                # the cell in the new one.
                notice = await self._replace(await self._loss_reason(exc))
            result = await self._run_cell(code, timeout_s=timeout_s, cell_id=cell_id)
            if notice:
                result.notice = f"{notice} {result.notice}".strip()
                result.kernel_restarted = True
            return result

    async def _run_cell(self, code: str, *, timeout_s: float, cell_id: str) -> CellResult:
        assert self.client is not None
        collector = OutputCollector(
            cap_chars=self.backend.output_cap_chars,
            artifact_path=artifact_path_for(self.spec.artifacts_dir, cell_id),
        )
        started = time.monotonic()
        limit = timeout_s + self.backend.interrupt_grace_s + self.backend.hang_allowance_s
        try:
            try:
                async with asyncio.timeout(limit):
                    return await self.client.execute(
                        code,
                        timeout_s=timeout_s,
                        interrupt_grace_s=self.backend.interrupt_grace_s,
                        collector=collector,
                    )
            except TimeoutError:
                why = (
                    f"the cell did not stop and the kernel could not be restarted in {limit:.0f} s"
                )
                status: Literal["timeout", "kernel_died"] = "timeout"
            except SandboxError as exc:
                why = await self._loss_reason(exc)
                status = "kernel_died"
            notice = await self._replace(why)
            return collector.result(
                status,
                duration_ms=(time.monotonic() - started) * 1000,
                kernel_restarted=True,
                notice=notice,
            )
        finally:
            collector.close()

    async def _loss_reason(self, exc: SandboxError) -> str:
        try:
            state = await self._state()
        except SandboxError:
            state = "unknown"
        if state == "running":
            return f"the sandbox stopped answering ({exc})"
        return f"the sandbox container stopped ({state})"

    async def interrupt(self) -> None:
        if self.client is None or self._stopped:
            raise SandboxError(f"sandbox {self.spec.session_id} is not running")
        await self.client.interrupt()

    async def restart_kernel(self) -> None:
        async with self._lock:
            if self.client is None or self._stopped:
                raise SandboxError(f"sandbox {self.spec.session_id} is not running")
            try:
                await self.client.restart()
            except SandboxError as exc:
                await self._replace(await self._loss_reason(exc))
            if self.client is not None:
                self.client.unreported_restarts = 0

    async def is_alive(self) -> bool:
        if self._stopped or self.client is None:
            return False
        return await self.client.kernel_alive()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.backend._owned.discard(self)
        await self._teardown()


class DockerBackend(SandboxBackend):
    """Starts ``DockerSandbox``es from ``image``; a warm pool of idle containers for the
    workspace most recently used (a container's mounts are fixed at creation, so a pooled one
    only fits a session with that same cwd: the usual case for a root and its subagents)."""

    name = BACKEND_NAME

    def __init__(
        self,
        *,
        image: str = SESSION_IMAGE,
        pool_size: int = WARM_POOL_SIZE,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = DEFAULT_CPUS,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        network: bool = False,
        workspace_mode: WorkspaceMode = "rw",
        instance: str = DEFAULT_INSTANCE,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        output_cap_chars: int = OUTPUT_STREAM_CAP_CHARS,
        start_timeout_s: float = SANDBOX_START_TIMEOUT_S,
        hang_allowance_s: float = HANG_ALLOWANCE_S,
        docker: Any | None = None,
    ):
        if workspace_mode == "copy":
            raise UserError("workspace mode 'copy' is not implemented yet; use rw or ro")
        self.docker = docker or docker_client()
        self.image = image
        self.pool_size = pool_size
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.network = network
        self.workspace_mode = workspace_mode
        self.instance = instance
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.start_timeout_s = start_timeout_s
        self.hang_allowance_s = hang_allowance_s
        self._owned: set[DockerSandbox] = set()
        self._closed = False
        self.pool: WarmPool[DockerSandbox] | None = None
        self._pool_cwd: Path | None = None
        self._retired: list[WarmPool[DockerSandbox]] = []

    def user_for(self, cwd: Path) -> str:
        """uid:gid in the container: the workspace's owner (files it writes stay the user's),
        or the image's user when the workspace belongs to root."""
        st = cwd.stat()
        if st.st_uid == 0:
            return f"{SANDBOX_UID}:{SANDBOX_UID}"
        return f"{st.st_uid}:{st.st_gid}"

    def start_pool(self, cwd: Path | None = None) -> None:
        """Begin filling the warm pool for ``cwd`` (default: the last session's workspace)."""
        if cwd is not None:
            self._use_pool_for(cwd.resolve())
        if self.pool is not None and not self._closed:
            self.pool.start()

    def _use_pool_for(self, cwd: Path) -> None:
        if self.pool_size <= 0 or cwd == self._pool_cwd:
            return
        if self.pool is not None:
            self._retired.append(self.pool)
            old = self.pool
            asyncio.get_running_loop().create_task(old.close())
        self._pool_cwd = cwd

        async def start_idle(die_with_parent: bool) -> DockerSandbox:
            spec = SandboxSpec(
                session_id=POOL_SESSION_ID,
                cwd=cwd,
                artifacts_dir=Path(tempfile.gettempdir()),
                die_with_parent=die_with_parent,
            )
            return await self._start_cold(spec)

        self.pool = WarmPool(start_idle, self._start_cold, size=self.pool_size)

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        if self._closed:
            raise SandboxError("backend is closed")
        if not spec.cwd.is_dir():
            raise SandboxStartError(f"session cwd {spec.cwd} is not a directory")
        spec = replace(spec, cwd=spec.cwd.resolve())
        if self.pool_size > 0:
            fits = spec.cwd == self._pool_cwd
            self._use_pool_for(spec.cwd)
            assert self.pool is not None
            self.pool.start()
            sandbox = await (self.pool.acquire(spec) if fits else self._start_cold(spec))
        else:
            sandbox = await self._start_cold(spec)
        self._owned.add(sandbox)
        return sandbox

    async def _start_cold(self, spec: SandboxSpec) -> DockerSandbox:
        sandbox = DockerSandbox(self, spec)
        try:
            async with asyncio.timeout(self.start_timeout_s * 2):
                await sandbox.start()
        except BaseException as exc:
            await sandbox._teardown()  # to the end, even when cancelled (pool closing)
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, (SandboxError, TimeoutError, OSError, ValueError, KeyError)):
                raise SandboxStartError(f"docker sandbox did not start: {exc!r}") from exc
            raise
        return sandbox

    def list_owned(self) -> list[OwnedContainer]:
        """Containers with our labels of this instance (running or not)."""
        return [c for c in list_owned(self.docker) if c.instance == self.instance]

    async def adopt_or_remove(self, live_sessions: set[str]) -> list[OwnedContainer]:
        """On start: containers of dead orchestrators whose session is unknown are removed;
        those of a live session are left for it to adopt. Returns the removed ones."""
        orphans = await asyncio.to_thread(find_orphans, self.docker, live_sessions=live_sessions)
        await asyncio.to_thread(remove_containers, [o.id for o in orphans], self.docker)
        return orphans

    async def close(self) -> None:
        self._closed = True
        pools = [*self._retired, *([self.pool] if self.pool is not None else [])]
        for pool in pools:
            await pool.close()
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())
