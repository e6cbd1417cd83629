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
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import httpx

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError
from orchestrator.instance import instance_id
from orchestrator.paths import Paths
from orchestrator.sandbox.base import (
    CellResult,
    OutputListener,
    ResourceLimits,
    Sandbox,
    SandboxBackend,
    SandboxInfo,
    SandboxRef,
    SandboxSpec,
    WorkspaceMode,
    checked_skill_dirs,
)
from orchestrator.sandbox.confined import (
    ConfinedPolicy,
    gateway_client,
    gateway_url,
    start_kernel,
)
from orchestrator.sandbox.defaults import sandbox_defaults
from orchestrator.sandbox.docker_adopt import reattach_container, remove_recorded, remove_unknown
from orchestrator.sandbox.docker_info import container_info
from orchestrator.sandbox.docker_owned import (
    LABEL_DAEMON,
    LABEL_HOST_DIR,
    LABEL_HOST_PID,
    LABEL_INSTANCE,
    LABEL_OWNER,
    LABEL_ROOT,
    LABEL_SESSION,
    LABEL_STATE_DIR,
    OwnedContainer,
    abandoned,
    docker_errors,
    docker_usable,
    find_orphans,
    list_owned,
    reapable,
    remove_containers,
    remove_orphans,
    translate_error,
)
from orchestrator.sandbox.docker_run import (
    GATEWAY_HOST_URL,
    GATEWAY_SOCKET,
    NATS_SOCKET,
    RUNTIME_DIR_PREFIX,
    SOCKET_DIR_MODE,
    SOCKET_SUBDIR,
    ContainerRequest,
    nats_target,
    run_container,
    session_env,
)
from orchestrator.sandbox.docker_slots import (
    CONTAINER_SNAPSHOT_DIR,
    hand_over,
    new_slot,
    remove_slot,
    sweep_slots,
)
from orchestrator.sandbox.docker_user import container_user
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_sandbox import apply_session
from orchestrator.sandbox.images import SESSION_IMAGE, docker_client, resolve_image
from orchestrator.sandbox.mounts import check_mounts
from orchestrator.sandbox.output import OutputCollector, artifact_path_for
from orchestrator.sandbox.pool import WarmPool
from orchestrator.sandbox.relay import serve_unix_to_tcp
from orchestrator.sandbox.workspace import WorkspaceCopy, finish_copy
from orchestrator.settings import (
    INTERRUPT_GRACE_S,
    OUTPUT_STREAM_CAP_CHARS,
    SANDBOX_CPUS,
    SANDBOX_MEMORY_MIB,
    SANDBOX_PIDS_LIMIT,
    SANDBOX_START_TIMEOUT_S,
    WARM_POOL_SIZE,
    Settings,
)

__all__ = [  # the container helpers of docker_owned.py are re-exported
    "BACKEND_NAME",
    "CONTAINER_SNAPSHOT_DIR",
    "LABEL_DAEMON",
    "LABEL_HOST_DIR",
    "LABEL_HOST_PID",
    "LABEL_INSTANCE",
    "LABEL_OWNER",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "LABEL_STATE_DIR",
    "DockerBackend",
    "DockerSandbox",
    "OwnedContainer",
    "WorkspaceMode",  # defined in base.py; re-exported for older imports
    "abandoned",
    "docker_usable",
    "find_orphans",
    "list_owned",
    "reapable",
    "remove_containers",
    "remove_orphans",
]

log = logging.getLogger(__name__)

BACKEND_NAME = "docker"

# Limits (per container). Memory includes the tmpfs pages written by the session.
# The defaults are Settings.sandbox's (settings.py); a session's SandboxSpec.limits overrides.
DEFAULT_MEMORY_BYTES = SANDBOX_MEMORY_MIB * 1024**2
DEFAULT_CPUS = SANDBOX_CPUS
DEFAULT_PIDS_LIMIT = SANDBOX_PIDS_LIMIT


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
        self._nats: tuple[str, int] | None = nats_target(spec.env)
        self._stopped = False
        self._lock = asyncio.Lock()
        # What the backend's listener was told is up (daemon-owned sandboxes only); told
        # "down" when that container is removed.
        self._recorded: SandboxRef | None = None
        # Workspace mode copy: the private copy mounted at spec.cwd (kept across container
        # replacements), synced back to the project at stop (orchestrator/sandbox/workspace.py).
        self.workspace_copy: WorkspaceCopy | None = None
        # An idle pooled container's snapshot slot, mounted at CONTAINER_SNAPSHOT_DIR until
        # ``assign`` makes it the session's snapshot directory (docker_slots.py).
        self.slot: Path | None = None

    async def _record(self, ref: SandboxRef) -> None:
        if not self.spec.die_with_parent:
            self._recorded = ref
            await self.backend._report_up(ref)

    # --- container lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Create the container, wait for its gateway, start the kernel, apply the session."""
        self.runtime_dir = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))
        socket_dir = self.runtime_dir / SOCKET_SUBDIR
        socket_dir.mkdir()
        socket_dir.chmod(SOCKET_DIR_MODE)
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        if self.backend.workspace_for(self.spec) == "copy" and self.workspace_copy is None:
            # As root, the copy is given to the container's user, who may not be able to read
            # the project itself (a root-owned 0700 directory: docker_user.py).
            owner = container_user(self.spec.cwd) if os.getuid() == 0 else None
            self.workspace_copy = await asyncio.to_thread(
                partial(WorkspaceCopy.create, self.spec.cwd, self.spec.artifacts_dir, owner=owner)
            )
        self._relay = await serve_unix_to_tcp(socket_dir / NATS_SOCKET, lambda: self._nats)
        started = time.monotonic()
        # The docker call runs in a thread that a cancellation would not stop: wait for it
        # anyway, so that a container created meanwhile is known and removed, not leaked.
        request = self._container_request()
        run = asyncio.ensure_future(
            asyncio.to_thread(run_container, self.backend.docker, request, socket_dir)
        )
        try:
            self.container_id = await asyncio.shield(run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.container_id = await run
            raise
        if request.snapshots is not None:  # mounted at the fixed path (docs/snapshots.md)
            self.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
        url = gateway_url(socket_dir)
        await self._record(
            SandboxRef(
                BACKEND_NAME,
                self.container_id,
                self.spec.session_id,
                url,
                "",
                self.token,
                str(self.runtime_dir),
            )
        )
        booted_at = await self._wait_gateway(socket_dir / GATEWAY_SOCKET)
        client = gateway_client(socket_dir, self.token)
        self.client = client
        client.on_restart = self._setup
        await start_kernel(client, self.spec.cwd, session_env(self.spec))
        await self._setup()
        self.ref = SandboxRef(
            backend=BACKEND_NAME,
            ref=self.container_id,
            session_id=self.spec.session_id,
            url=url,
            kernel_id=client.kernel_id,
            token=self.token,
            runtime_dir=str(self.runtime_dir),
        )
        await self._record(self.ref)
        now = time.monotonic()
        log.info(
            "docker sandbox %s: container+gateway %.0f ms, kernel %.0f ms",
            self.spec.session_id,
            (booted_at - started) * 1000,
            (now - booted_at) * 1000,
        )

    def _container_request(self) -> ContainerRequest:
        """The container ``start`` asks for: this sandbox's spec under its backend's policy."""
        backend, spec = self.backend, self.spec
        copy = self.workspace_copy
        return ContainerRequest(
            spec=spec,
            image=backend.image_for(spec),
            workspace_mode=backend.workspace_for(spec),
            workspace_source=copy.copy_dir if copy is not None else spec.cwd,
            limits=backend.limits_for(spec),
            network=backend.network_for(spec),
            gpus=backend.gpus,
            token=self.token,
            instance=backend.instance,
            state_dir=backend.state_dir,
            daemon_socket=backend.daemon_socket,
            slot=self.slot,
        )

    async def _adopt(self, ref: SandboxRef) -> None:
        """Take over ``ref``, the running container of an earlier daemon, for this sandbox's
        session (docker_adopt.py): ``SandboxError`` when it cannot be."""
        backend = self.backend
        found = await reattach_container(
            backend.docker,
            ref,
            instance=backend.instance,
            nats=lambda: self._nats,
            start_timeout_s=backend.start_timeout_s,
            interrupt_grace_s=backend.interrupt_grace_s,
        )
        self.container_id = ref.ref
        self.runtime_dir = found.host_dir
        self.token = ref.token
        self.kernel_snapshot_dir = found.kernel_snapshot_dir
        self._relay = found.relay
        found.client.on_restart = self._setup
        self.client = found.client
        self.ref = SandboxRef(
            backend=ref.backend,
            ref=ref.ref,
            session_id=self.spec.session_id,
            url=ref.url,
            kernel_id=ref.kernel_id,
            token=ref.token,
            runtime_dir=str(found.host_dir),
        )
        if not self.spec.die_with_parent:
            self._recorded = self.ref  # its row is removed when the sandbox stops
        log.info(
            "adopted docker sandbox %s (container %s%s)",
            self.spec.session_id,
            ref.ref[:12],
            ", its running cell was interrupted" if found.interrupted else "",
        )

    async def _wait_gateway(self, socket_path: Path) -> float:
        """Poll the gateway's socket until it answers; returns the time it did."""
        deadline = time.monotonic() + self.backend.start_timeout_s
        next_check = time.monotonic() + CONTAINER_CHECK_EVERY_S
        # Plain HTTP over a Unix socket: no TLS context (its CA bundle costs ~20 ms).
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path), verify=False)
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
        errors = docker_errors()

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
            raise translate_error(exc, "inspecting a container") from exc

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
            errors = docker_errors()

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
        recorded, self._recorded = self._recorded, None
        if recorded is not None:
            await self.backend._report_down(recorded)
        slot, self.slot = self.slot, None
        if slot is not None:  # a pooled container removed unused
            await asyncio.to_thread(remove_slot, slot)

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
        pid = await apply_session(self.client, self.spec.cwd, session_env(self.spec))
        if pid is not None:
            self.kernel_pid = pid
        if self.after_kernel_start is not None:  # namespace revival (docs/snapshots.md)
            await self.after_kernel_start(self.client.run_silent)

    async def assign(self, spec: SandboxSpec) -> None:
        """Hand an idle pooled container to a session (its workspace is already mounted; its
        snapshot slot becomes the session's snapshot directory)."""
        if spec.cwd != self.spec.cwd:
            raise SandboxError("pooled container has another workspace")
        if self.slot is not None:
            try:
                if spec.snapshot_dir is not None:
                    await asyncio.to_thread(hand_over, self.slot, spec.snapshot_dir)
                else:
                    await asyncio.to_thread(remove_slot, self.slot)
                    self.kernel_snapshot_dir = None
            except OSError as exc:  # the slot stays ours: removed when the pool stops this one
                raise SandboxError(f"snapshot directory handover failed: {exc}") from exc
            self.slot = None
        self.spec = spec
        self._nats = nats_target(spec.env)
        self.ref = replace(self.ref, session_id=spec.session_id)
        assert self.client is not None
        self.client.unreported_restarts = 0
        await self._setup()
        if self._recorded is not None:
            await self._record(self.ref)

    # --- Sandbox ----------------------------------------------------------------------------

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        cell_id: str,
        on_output: OutputListener | None = None,
    ) -> CellResult:
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
            result = await self._run_cell(
                code, timeout_s=timeout_s, cell_id=cell_id, on_output=on_output
            )
            if notice:
                result.notice = f"{notice} {result.notice}".strip()
                result.kernel_restarted = True
            return result

    async def _run_cell(
        self, code: str, *, timeout_s: float, cell_id: str, on_output: OutputListener | None
    ) -> CellResult:
        assert self.client is not None
        # Cell outputs live in the container's own directory, mounted at the same path inside
        # (docker_run.outputs_dir): the model opens the path it is told from its REPL.
        root = self.runtime_dir if self.runtime_dir is not None else self.spec.artifacts_dir
        collector = OutputCollector(
            cap_chars=self.backend.output_cap_chars,
            artifact_path=artifact_path_for(root, cell_id),
            listener=on_output,
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

    async def run_silent(
        self, code: str, *, user_expressions: Mapping[str, str] | None = None, timeout_s: float
    ) -> dict[str, Any]:
        async with self._lock:
            if self.client is None or self._stopped:
                raise SandboxError(f"sandbox {self.spec.session_id} is not running")
            return await self.client.run_silent(
                code, user_expressions=user_expressions, timeout_s=timeout_s
            )

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

    async def info(self) -> SandboxInfo:
        running = not self._stopped
        return await asyncio.to_thread(
            container_info, self.backend.docker, self.container_id, running=running
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.backend._owned.discard(self)
        await self._teardown()
        await self._finish_workspace()

    async def _finish_workspace(self) -> None:
        """Copy mode: sync the copy back into the project (after the container is gone, so
        nothing writes meanwhile). An adopted sandbox finds its copy on disk."""
        if self.backend.workspace_for(self.spec) != "copy":
            return
        copy, self.workspace_copy = self.workspace_copy, None
        if copy is None:
            try:
                copy = await asyncio.to_thread(WorkspaceCopy.load, self.spec.artifacts_dir)
            except SandboxError as exc:
                log.error("docker sandbox %s: %s", self.spec.session_id, exc)
                return
        if copy is not None:
            await asyncio.to_thread(finish_copy, copy)


class DockerBackend(ConfinedPolicy, SandboxBackend):
    """Starts ``DockerSandbox``es from ``image``; a warm pool of idle containers for the
    workspace most recently used (a container's mounts are fixed at creation, so a pooled one
    only fits a session with that same cwd: the usual case for a root and its subagents). Its
    snapshot slot becomes the session's snapshot directory at ``assign`` (docker_slots.py)."""

    name = BACKEND_NAME

    def __init__(
        self,
        *,
        image: str = SESSION_IMAGE,
        pool_size: int = WARM_POOL_SIZE,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = DEFAULT_CPUS,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        gpus: str = "",  # "" none, "all", or a count: docker's --gpus (cuda image)
        network: bool = False,
        workspace_mode: WorkspaceMode = "rw",
        pool_die_with_parent: bool = True,
        daemon_socket: str = "",  # the daemon's control socket (LABEL_DAEMON); "" = no daemon
        # LABEL_INSTANCE / LABEL_STATE_DIR: the state directory's instance id (default: that of
        # $XDG_DATA_HOME's, orchestrator/instance.py); only its containers are reaped here.
        instance: str | None = None,
        state_dir: Path | None = None,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        output_cap_chars: int = OUTPUT_STREAM_CAP_CHARS,
        start_timeout_s: float = SANDBOX_START_TIMEOUT_S,
        hang_allowance_s: float = HANG_ALLOWANCE_S,
        docker: Any | None = None,
    ):
        self.docker = docker or docker_client()
        self.image = resolve_image(image)
        self.pool_size = pool_size
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.gpus = gpus
        self.network = network
        self.workspace_mode = workspace_mode
        if instance is None:
            paths = Paths.from_env()
            instance, state_dir = instance_id(paths), paths.data_dir
        self.instance = instance
        self.state_dir = state_dir
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.start_timeout_s = start_timeout_s
        self.hang_allowance_s = hang_allowance_s
        self._owned: set[DockerSandbox] = set()
        self._closed = False
        self.pool: WarmPool[DockerSandbox] | None = None
        self._pool_for: tuple[Path, Path | None] | None = None  # (workspace, snapshots root)
        self._pool_skills: tuple[Path, ...] = ()  # the skill directories its containers mount
        self._swept: set[Path] = set()  # snapshot roots whose stray slots were removed
        self._retired: list[WarmPool[DockerSandbox]] = []
        self.pool_die_with_parent = pool_die_with_parent
        self.daemon_socket = daemon_socket

    @classmethod
    def from_settings(
        cls, settings: Settings, *, network: bool = False, **options: Any
    ) -> DockerBackend:
        """A backend with ``settings``' sandbox policy (image, workspace mode, limits) and
        REPL settings as its defaults; ``options`` are passed on (pool_size, daemon_socket...)."""
        options.setdefault("pool_size", settings.warm_pool_size)
        return cls(
            **sandbox_defaults(settings), gpus=settings.sandbox.gpus, network=network, **options
        )

    # --- a session's policy: its spec's, else this backend's --------------------------------
    # (workspace_for, limits_for, network_for, check_workspace: confined.ConfinedPolicy)

    def image_for(self, spec: SandboxSpec) -> str:
        return resolve_image(spec.image) if spec.image else self.image

    def _pool_key(self, spec: SandboxSpec) -> tuple[Path, Path | None]:
        """(workspace, snapshots root) of the pool that fits ``spec``: a spec without snapshots
        takes a container of any pool for its workspace (its slot is then dropped)."""
        if spec.snapshot_dir is not None:
            return spec.cwd, spec.snapshot_dir.parent
        current = self._pool_for
        return spec.cwd, current[1] if current is not None and current[0] == spec.cwd else None

    def _pool_fits(self, spec: SandboxSpec) -> bool:
        """A pooled container was made with this backend's policy for the pool's workspace (and
        a slot under the session's snapshots root); a copy-mode session needs a fresh copy of
        its own, so it never takes one."""
        default = ResourceLimits(self.memory_bytes, self.cpus, self.pids_limit)
        return (
            self._pool_key(spec) == self._pool_for
            and self.image_for(spec) == self.image
            and self.workspace_for(spec) == self.workspace_mode != "copy"
            and self.limits_for(spec) == default
            and self.network_for(spec) == self.network
            and spec.skill_dirs == self._pool_skills  # mounts are fixed at creation
            and not spec.mounts
        )

    def start_pool(
        self,
        cwd: Path | None = None,
        *,
        snapshot_root: Path | None = None,
        skill_dirs: tuple[Path, ...] = (),
    ) -> None:
        """Begin filling the warm pool for ``cwd`` (default: the last session's workspace);
        with ``snapshot_root`` (``<data>/snapshots``) its containers get snapshot slots, so
        sessions with a snapshot directory there take them; they mount ``skill_dirs``, so only
        sessions with those very skill directories take them."""
        if cwd is not None:
            self._use_pool_for(cwd.resolve(), snapshot_root, checked_skill_dirs(skill_dirs))
        if self.pool is not None and not self._closed:
            self.pool.start()

    def _use_pool_for(
        self, cwd: Path, snapshot_root: Path | None, skill_dirs: tuple[Path, ...] = ()
    ) -> None:
        key = (cwd, snapshot_root)
        same = key == self._pool_for and skill_dirs == self._pool_skills
        if self.pool_size <= 0 or same or self.workspace_mode == "copy":
            return  # copy mode: every session needs a fresh copy, a pooled one cannot help
        if self.pool is not None:
            self._retired.append(self.pool)
            old = self.pool
            asyncio.get_running_loop().create_task(old.close())
        self._pool_for = key
        self._pool_skills = skill_dirs

        async def start_idle(die_with_parent: bool) -> DockerSandbox:
            spec = SandboxSpec(
                session_id=POOL_SESSION_ID,
                cwd=cwd,
                artifacts_dir=Path(tempfile.gettempdir()),
                die_with_parent=die_with_parent,
                skill_dirs=skill_dirs,
            )
            slot = None
            if snapshot_root is not None:
                await self._sweep_slots(snapshot_root)
                slot = await asyncio.to_thread(new_slot, snapshot_root)
            return await self._start_cold(spec, slot=slot)

        self.pool = WarmPool(
            start_idle,
            self._start_cold,
            size=self.pool_size,
            die_with_parent=self.pool_die_with_parent,
        )

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        if self._closed:
            raise SandboxError("backend is closed")
        if not spec.cwd.is_dir():
            raise SandboxStartError(f"session cwd {spec.cwd} is not a directory")
        spec = replace(
            spec,
            cwd=spec.cwd.resolve(),
            skill_dirs=checked_skill_dirs(spec.skill_dirs),
            mounts=check_mounts(spec.mounts, spec.cwd.resolve()),
        )
        self.check_workspace(spec)
        if self.pool_size > 0 and self.workspace_mode != "copy":
            fits = self._pool_fits(spec)
            self._use_pool_for(*self._pool_key(spec), spec.skill_dirs)
            assert self.pool is not None
            self.pool.start()
            sandbox = await (self.pool.acquire(spec) if fits else self._start_cold(spec))
        else:
            sandbox = await self._start_cold(spec)
        self._owned.add(sandbox)
        return sandbox

    async def _start_cold(self, spec: SandboxSpec, *, slot: Path | None = None) -> DockerSandbox:
        sandbox = DockerSandbox(self, spec)
        sandbox.slot = slot  # a pooled container's; removed with it when it fails to start
        try:
            async with asyncio.timeout(self.start_timeout_s * 2):
                await sandbox.start()
        except BaseException as exc:
            await sandbox._teardown()  # to the end, even when cancelled (pool closing)
            if sandbox.workspace_copy is not None:  # nothing ran in it: no work to keep
                await asyncio.to_thread(sandbox.workspace_copy.remove)
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, (SandboxError, TimeoutError, OSError, ValueError, KeyError)):
                raise SandboxStartError(f"docker sandbox did not start: {exc!r}") from exc
            raise
        return sandbox

    async def _sweep_slots(self, snapshot_root: Path) -> None:
        """Once per snapshots root, before its first slot: remove slots a crash left (no
        container of this user names them, whatever its instance)."""
        if snapshot_root in self._swept:
            return
        self._swept.add(snapshot_root)

        def sweep() -> None:
            in_use = {c.snapshot_slot for c in list_owned(self.docker) if c.snapshot_slot}
            sweep_slots(snapshot_root, in_use)

        try:
            await asyncio.to_thread(sweep)
        except (SandboxError, OSError) as exc:  # tidying only: the pool works without it
            log.warning("docker: sweeping snapshot slots failed: %s", exc)

    def list_owned(self) -> list[OwnedContainer]:
        """Containers with our labels of this instance (running or not)."""
        return list_owned(self.docker, instance=self.instance)

    # Adoption by a restarted daemon (R2, R8): orchestrator/sandbox/docker_adopt.py.

    async def adopt(self, ref: SandboxRef, spec: SandboxSpec) -> DockerSandbox:
        sandbox = DockerSandbox(self, spec)
        await sandbox._adopt(ref)
        self._owned.add(sandbox)
        return sandbox

    async def remove(self, ref: SandboxRef) -> None:
        await remove_recorded(self.docker, ref, instance=self.instance)

    async def remove_unknown(self, known: set[str]) -> int:
        return await remove_unknown(
            self.docker, known, instance=self.instance, daemon_socket=self.daemon_socket
        )

    async def close(self) -> None:
        self._closed = True
        pools = [*self._retired, *([self.pool] if self.pool is not None else [])]
        for pool in pools:
            await pool.close()
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())
