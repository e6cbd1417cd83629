"""The ``bwrap`` backend: one bubblewrap sandbox per session, where there is no Docker.

The host starts ONE process per sandbox: ``bwrap <plan> -- python -m gateway_main ...`` with
the docker backend's container command (confined.gateway_command), so the sandbox is reached
the same way a container is (docs/bwrap.md):

- The kernel gateway listens on ``gateway.sock`` in the host directory ``<runtime>/sock``,
  bound at ``/run/prime-agent``; the host's ``KernelGatewayClient`` connects with ``uds=``.
  No port is published anywhere.
- No network (``--unshare-net``: a loopback of its own) unless the policy's network is on.
  NATS goes through the in-sandbox relay (127.0.0.1:4222 inside -> ``nats.sock`` -> this
  backend's ``serve_unix_to_tcp`` -> the session's NATS). With the host's network the kernel
  uses the NATS URL as it is.
- What the sandbox sees is ``bwrap_argv.BwrapPlan``: the system read-only, a short /etc
  allowlist, our interpreter environment read-only, a private /tmp and home, its own /proc,
  the workspace per mode, the outputs, snapshot and skill directories. Nothing else of the
  host (config, data and state directories, the DuckDB file, NATS state, the docker socket,
  other workspaces, the host's /proc and /tmp).
- Who runs it: as root, the unprivileged sandbox uid (``docker_user.container_user``), both on
  the host and inside (``--uid``); otherwise the user. The switch happens in the child between
  fork and exec (``Launch.preexec``): join the limits (``confinement``), bind the sources into
  a private mount namespace (root only: the sandbox uid may not reach them), drop the uid.
- Limits: ``confinement.confine`` (a cgroup where the host has one, else rlimits with a
  one-line warning, logged once per backend).
- Adoption: a daemon's sandbox (``die_with_parent`` False) outlives a daemon kill -9; the next
  daemon finds the same bwrap process (``adopt``), reconnects to its socket, serves its NATS
  socket again and reopens its cgroup (``confinement.reopen``).
- Stop leaves nothing: SIGTERM the gateway, grace, SIGKILL the sandbox's pid 1 (the kernel
  then kills every process of its pid namespace), remove the cgroup, the runtime directory.

This module holds the sandbox and backend classes, on top of the two below it:
``bwrap_launch.py`` (how the bwrap child is launched: ``Launch.preexec``, the interpreter
binds) and ``bwrap_owned.py`` (which sandboxes exist on the host and whose, finding one and
killing it); neither imports this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError
from orchestrator.file_modes import user_umask
from orchestrator.procs import ChildProcess, ChildStartError, start_child
from orchestrator.sandbox import proctree
from orchestrator.sandbox.base import (
    SANDBOX_LOG_TAIL_LINES,
    SandboxBackend,
    SandboxInfo,
    SandboxRef,
    SandboxSpec,
    WorkspaceMode,
    checked_skill_dirs,
)
from orchestrator.sandbox.bwrap_argv import (
    BIND_STAGE_DIR,
    Bind,
    BwrapPlan,
    DataFile,
    bwrap_argv,
    group_text,
    host_system_layout,
    hosts_text,
    passwd_text,
    present_etc_files,
    staged,
)
from orchestrator.sandbox.bwrap_launch import (
    Launch,
    interpreter_binds,
    orchestrator_dirs_under,
    pipe_with,
)
from orchestrator.sandbox.bwrap_owned import (
    CONFINEMENT_FILE_NAME,
    INFO_FILE_NAME,
    RUNTIME_DIR_PREFIX,
    find_bwrap,
    find_init,
    kill_sandbox,
    own_runtime_dir,
    owned_sandboxes,
    owner_mark,
    read_info,
    runtime_base,
    sweep_stale,
    wait_gone,
)
from orchestrator.sandbox.bwrap_probe import BWRAP_PROGRAM
from orchestrator.sandbox.confined import (
    CONTAINER_HOME,
    CONTAINER_SOCKET_DIR,
    GATEWAY_HOST_URL,
    NATS_SOCKET,
    OUTPUTS_DIR_MODE,
    SNAPSHOT_DIR_MODE,
    SOCKET_DIR_MODE,
    SOCKET_SUBDIR,
    ConfinedPolicy,
    gateway_client,
    gateway_command,
    gateway_url,
    nats_target,
    outputs_dir,
    session_env,
    skill_mounts,
)
from orchestrator.sandbox.confinement import Confinement, confine, reopen
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.docker_user import ROOT_UID, container_user
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_main import TOKEN_ENV
from orchestrator.sandbox.gateway_sandbox import GatewaySandbox
from orchestrator.sandbox.local import (
    LOG_TAIL_READ_BYTES,
    OWNER_ENV,
    SOURCE_ROOT,
    AdoptedGateway,
    check_spec,
    read_ready_line,
    tail_text,
)
from orchestrator.sandbox.reattach import reattach_within
from orchestrator.sandbox.relay import serve_unix_to_tcp
from orchestrator.sandbox.workspace import WorkspaceCopy, finish_copy
from orchestrator.settings import (
    INTERRUPT_GRACE_S,
    OUTPUT_STREAM_CAP_CHARS,
    PROCESS_STOP_GRACE_S,
    SANDBOX_CPUS,
    SANDBOX_MEMORY_MIB,
    SANDBOX_PIDS_LIMIT,
    SANDBOX_START_TIMEOUT_S,
    SandboxSettings,
    Settings,
)

__all__ = [
    "BACKEND_NAME",
    "DEFAULT_CPUS",
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_PIDS_LIMIT",
    "BwrapBackend",
    "BwrapSandbox",
    "bwrap_path",
]

log = logging.getLogger(__name__)

BACKEND_NAME: Final = "bwrap"
DEFAULT_MEMORY_BYTES: Final = SANDBOX_MEMORY_MIB * 1024**2
DEFAULT_CPUS: Final = SANDBOX_CPUS
DEFAULT_PIDS_LIMIT: Final = SANDBOX_PIDS_LIMIT
TOKEN_BYTES: Final = 32
# Searchable, not listable: the unprivileged bwrap reaches its socket, outputs and stage dirs
# by name; the private files in it (info, log, limits record) are 0600.
RUNTIME_DIR_MODE: Final = 0o711
STAGE_DIR_MODE: Final = 0o755
PRIVATE_FILE_MODE: Final = 0o600
GATEWAY_LOG_NAME: Final = "gateway.log"
DEFAULT_LANG: Final = "C.UTF-8"
SYSTEM_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
POOL_SESSION_ID: Final = "pool"


def bwrap_path() -> str | None:
    """The bubblewrap program on PATH (or its usual place), None when it is not installed."""
    found = shutil.which(BWRAP_PROGRAM)
    if found is None and os.access("/usr/bin/bwrap", os.X_OK):
        found = "/usr/bin/bwrap"
    return found


async def _wait_exit(child: ChildProcess | AdoptedGateway, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the bwrap process to exit by itself."""
    if isinstance(child, AdoptedGateway):
        await wait_gone(child.info, timeout_s)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await child.proc.wait()


class BwrapSandbox(GatewaySandbox):
    """One bwrap sandbox with its gateway and kernel. Cells are serialized by the caller."""

    kernel_snapshot_dir: str | None = None

    def __init__(self, backend: BwrapBackend, spec: SandboxSpec):
        self.backend = backend
        self.spec = spec
        self.output_cap_chars = backend.output_cap_chars
        self.interrupt_grace_s = backend.interrupt_grace_s
        self.runtime_dir: Path | None = None
        self.token = ""
        self.child: ChildProcess | AdoptedGateway | None = None
        self.init: proctree.ProcInfo | None = None  # the sandbox's pid 1, on the host
        self.client: KernelGatewayClient | None = None
        self.confinement: Confinement | None = None
        self.kernel_pid: int | None = None
        self.workspace_copy: WorkspaceCopy | None = None
        self.ref = SandboxRef(BACKEND_NAME, "", spec.session_id, GATEWAY_HOST_URL, "", "")
        self._relay: asyncio.Server | None = None
        self._nats: tuple[str, int] | None = nats_target(spec.env)
        self._stopped = False
        self._lock = asyncio.Lock()
        # What the backend's listener was told is up (daemon-owned sandboxes only).
        self._recorded: SandboxRef | None = None

    @property
    def adopted(self) -> bool:
        return isinstance(self.child, AdoptedGateway)

    @property
    def socket_dir(self) -> Path:
        assert self.runtime_dir is not None
        return self.runtime_dir / SOCKET_SUBDIR

    def _exit_status(self) -> int | None:
        child = self.child
        if child is None:
            return -1
        return child.proc.returncode if isinstance(child, ChildProcess) else child.returncode

    async def _record(self, ref: SandboxRef) -> None:
        if not self.spec.die_with_parent:
            self._recorded = ref
            await self.backend._report_up(ref)

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start bwrap, wait for the gateway's ready line, start the kernel, apply the session."""
        backend = self.backend
        spec = self.spec
        started = time.monotonic()
        runtime_dir = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX, dir=runtime_base()))
        self.runtime_dir = runtime_dir
        runtime_dir.chmod(RUNTIME_DIR_MODE)
        self.socket_dir.mkdir()
        self.socket_dir.chmod(SOCKET_DIR_MODE)
        outputs = outputs_dir(runtime_dir)
        outputs.mkdir()
        outputs.chmod(OUTPUTS_DIR_MODE)
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        root = os.getuid() == ROOT_UID
        mode = backend.workspace_for(spec)
        uid, gid = container_user(spec.cwd)
        if mode == "copy" and self.workspace_copy is None:
            owner = (uid, gid) if root else None  # the sandbox user's copy (docker_user.py)
            self.workspace_copy = await asyncio.to_thread(
                partial(WorkspaceCopy.create, spec.cwd, spec.artifacts_dir, owner=owner)
            )
        self.confinement = await asyncio.to_thread(
            confine, runtime_dir.name, backend.limits_for(spec), uid=uid
        )
        record = runtime_dir / CONFINEMENT_FILE_NAME
        record.write_text(self.confinement.record())
        record.chmod(PRIVATE_FILE_MODE)
        backend._warn_once(self.confinement.warning)
        if not backend.network_for(spec):
            self._relay = await serve_unix_to_tcp(self.socket_dir / NATS_SOCKET, lambda: self._nats)
        argv, launch, fds = self._plan(runtime_dir, uid=uid, gid=gid, root=root)
        log_path = runtime_dir / GATEWAY_LOG_NAME
        try:
            try:
                child = await start_child(
                    argv,
                    env=self._bwrap_env(),
                    cwd=runtime_dir,
                    die_with_parent=spec.die_with_parent,
                    ready_timeout_s=backend.start_timeout_s,
                    stderr_path=log_path,
                    what="bwrap sandbox",
                    ready_line=False,  # stdout is the log (local.py's module docstring)
                    umask=user_umask(),
                    preexec=launch.preexec,
                    pass_fds=fds,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            self.child = child
            log_path.chmod(PRIVATE_FILE_MODE)
            url = gateway_url(self.socket_dir)
            await self._record(self._ref(url, ""))
            child.ready = await read_ready_line(child, log_path, backend.start_timeout_s)
        except ChildStartError as exc:
            raise SandboxStartError(str(exc)) from exc
        booted = time.monotonic()
        init_pid = read_info(runtime_dir)
        self.init = proctree.read_proc(init_pid) if init_pid is not None else None
        client = gateway_client(self.socket_dir, self.token)
        self.client = client
        async with asyncio.timeout(backend.start_timeout_s):
            await self._start_kernel(client)
        self.ref = self._ref(url, client.kernel_id)
        await self._record(self.ref)
        log.info(
            "bwrap sandbox %s: sandbox+gateway %.0f ms, kernel %.0f ms",
            spec.session_id,
            (booted - started) * 1000,
            (time.monotonic() - booted) * 1000,
        )

    def _ref(self, url: str, kernel_id: str) -> SandboxRef:
        assert self.child is not None and self.runtime_dir is not None
        return SandboxRef(
            backend=BACKEND_NAME,
            ref=str(self.child.pid),
            session_id=self.spec.session_id,
            url=url,
            kernel_id=kernel_id,
            token=self.token,
            runtime_dir=str(self.runtime_dir),
        )

    def _session_env(self) -> dict[str, str]:
        return session_env(self.spec, relayed=not self.backend.network_for(self.spec))

    def _bwrap_env(self) -> dict[str, str]:
        """bwrap's environment, which the sandbox inherits (never ours: R16) less the owner
        mark (``--unsetenv``): the token, locale, home, PATH with our interpreter first, and
        PYTHONPATH for the orchestrator package."""
        bin_dir = os.path.dirname(self.backend.python)
        env = {
            TOKEN_ENV: self.token,
            "LANG": DEFAULT_LANG,
            "HOME": CONTAINER_HOME,
            "PATH": f"{bin_dir}{os.pathsep}{SYSTEM_PATH}",
            "PYTHONPATH": SOURCE_ROOT,
        }
        if self.backend.owner:
            env[OWNER_ENV] = owner_mark(self.backend.owner)
        return env

    def _plan(
        self, runtime_dir: Path, *, uid: int, gid: int, root: bool
    ) -> tuple[list[str], Launch, list[int]]:
        """bwrap's command line, the child's launch steps and the fds it inherits."""
        backend = self.backend
        spec = self.spec
        network = backend.network_for(spec)
        mode = backend.workspace_for(spec)
        workspace = self.workspace_copy.copy_dir if self.workspace_copy is not None else spec.cwd
        binds = [
            Bind(str(workspace), str(spec.cwd), writable=mode != "ro"),
            Bind(str(self.socket_dir), CONTAINER_SOCKET_DIR, writable=True),
            Bind(str(outputs_dir(runtime_dir)), str(outputs_dir(runtime_dir)), writable=True),
        ]
        if spec.snapshot_dir is not None:
            spec.snapshot_dir.chmod(SNAPSHOT_DIR_MODE)
            binds.append(Bind(str(spec.snapshot_dir), CONTAINER_SNAPSHOT_DIR, writable=True))
            self.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
        for directory, inside in skill_mounts(spec.skill_dirs).items():
            binds.append(Bind(str(directory), inside))
        # Over the workspace: read-only even where the workspace contains them.
        binds += interpreter_binds()
        hidden = orchestrator_dirs_under(spec.cwd)
        stage: list[tuple[str, str]] = []
        if root:
            stage_root = runtime_dir / BIND_STAGE_DIR
            stage_root.mkdir()
            stage_root.chmod(STAGE_DIR_MODE)
            staged_binds, stage = staged(binds, stage_root)
            for _, point in stage:
                Path(point).mkdir(mode=STAGE_DIR_MODE)
            binds = list(staged_binds)
        data = {
            "/etc/passwd": passwd_text(uid, gid, CONTAINER_HOME),
            "/etc/group": group_text(gid),
            "/etc/hosts": hosts_text(),
            "/etc/hostname": "sandbox\n",
        }
        fds: list[int] = []
        data_files = []
        try:
            for dest, text in data.items():
                fd = pipe_with(text)
                fds.append(fd)
                data_files.append(DataFile(fd, dest))
            info_fd = os.open(
                runtime_dir / INFO_FILE_NAME,
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                PRIVATE_FILE_MODE,
            )
            fds.append(info_fd)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        plan = BwrapPlan(
            uid=uid if root else os.getuid(),
            gid=gid if root else os.getgid(),
            command=tuple(gateway_command(backend.python, list(self._session_env()))),
            chdir=str(spec.cwd),
            home=CONTAINER_HOME,
            system=host_system_layout(),
            etc_files=present_etc_files(network),
            data_files=tuple(data_files),
            binds=tuple(binds),
            hidden=hidden,
            network=network,
            die_with_parent=spec.die_with_parent,
            info_fd=info_fd,
            unset_env=(OWNER_ENV,),
        )
        bwrap = backend.bwrap
        prefix = self.confinement.argv_prefix if self.confinement is not None else ()
        argv = [*prefix, *bwrap_argv(bwrap, plan)]
        launch = Launch(
            confinement=self.confinement,
            stage=[(os.fsencode(s), os.fsencode(p)) for s, p in stage],
            uid=uid if root else None,
            gid=gid,
        )
        return argv, launch, fds

    async def _setup(self) -> None:
        """Put the session's cwd and env in place (after every kernel start and restart)."""
        assert self.client is not None
        await self._apply_session(self.client)

    # --- Sandbox ----------------------------------------------------------------------------

    def _artifact_root(self) -> Path:
        # The outputs dir is bound at the same path inside: a spilled file opens on both sides.
        return self.runtime_dir if self.runtime_dir is not None else self.spec.artifacts_dir

    async def is_alive(self) -> bool:
        if self._stopped or self.client is None or self._exit_status() is not None:
            return False
        return await self.client.kernel_alive()

    async def info(self) -> SandboxInfo:
        return await asyncio.to_thread(self._info)

    def _info(self) -> SandboxInfo:
        pid = self.child.pid if self.child is not None else 0
        alive = not self._stopped and self._exit_status() is None
        proc = proctree.read_proc(pid) if alive else None
        usage = self.confinement.usage() if self.confinement is not None and alive else None
        tree = proctree.tree_usage(pid) if proc is not None else None
        lines: list[str] = []
        if self.runtime_dir is not None:
            text = tail_text(self.runtime_dir / GATEWAY_LOG_NAME, LOG_TAIL_READ_BYTES)
            lines = [line for line in text.splitlines() if line.strip()]
        cpu = usage.cpu_seconds if usage is not None else None
        memory = usage.memory_bytes if usage is not None else None
        return SandboxInfo(
            name=f"pid {pid}",
            state="running" if proc is not None else "exited",
            started_at=proctree.started_at(proc) if proc is not None else None,
            cpu_seconds=cpu if cpu is not None else (tree.cpu_seconds if tree else None),
            memory_bytes=memory if memory is not None else (tree.rss_bytes if tree else None),
            memory_limit_bytes=usage.memory_limit_bytes if usage is not None else None,
            log_tail=tuple(lines[-SANDBOX_LOG_TAIL_LINES:]),
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.backend._owned.discard(self)
        await self._teardown()
        copy, self.workspace_copy = self.workspace_copy, None
        if copy is None and self.adopted and self.backend.workspace_for(self.spec) == "copy":
            with contextlib.suppress(SandboxError):
                copy = await asyncio.to_thread(WorkspaceCopy.load, self.spec.artifacts_dir)
        if copy is not None:  # nothing runs in it any more: sync it back
            await asyncio.to_thread(finish_copy, copy)
        recorded, self._recorded = self._recorded, None
        if recorded is not None:
            await self.backend._report_down(recorded)

    async def _teardown(self) -> None:
        """Stop every process of the sandbox and remove what it had on the host."""
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if self.init is None and self.child is not None and self.runtime_dir is not None:
            self.init = find_init(self.runtime_dir)  # a start that failed before reading it
        await kill_sandbox(self.init, PROCESS_STOP_GRACE_S)
        child = self.child
        if child is not None:
            # bwrap itself exits once it has reaped pid 1; signalled before that, it would
            # leave pid 1 a zombie for the host's init.
            await _wait_exit(child, PROCESS_STOP_GRACE_S)
            await child.stop(PROCESS_STOP_GRACE_S)
        if self.confinement is not None:
            await asyncio.to_thread(self.confinement.remove)
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # --- helpers ----------------------------------------------------------------------------

    def _usable(self) -> KernelGatewayClient:
        if self._stopped or self.client is None:
            raise SandboxError(f"sandbox {self.spec.session_id} is stopped")
        if self._exit_status() is not None:
            raise KernelDied(self._exit_message())
        return self.client

    def _exit_message(self) -> str:
        child = self.child
        tail = child.stderr_tail().strip().splitlines()[-3:] if child is not None else []
        pid = child.pid if child is not None else 0
        return f"bwrap sandbox (pid {pid}) exited with status {self._exit_status()}" + (
            ": " + " | ".join(tail) if tail else ""
        )


class BwrapBackend(ConfinedPolicy, SandboxBackend):
    """Starts ``BwrapSandbox``es (no warm pool yet: ``pool_size`` is accepted and unused).
    A session's policy (its spec's, else this backend's) is ``confined.ConfinedPolicy``."""

    name = BACKEND_NAME

    def __init__(
        self,
        *,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = DEFAULT_CPUS,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        network: bool = False,
        workspace_mode: WorkspaceMode = "rw",
        pool_size: int = 0,
        pool_die_with_parent: bool = True,
        owner: str = "",  # the daemon's socket: marks its bwrap processes (OWNER_ENV)
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        output_cap_chars: int = OUTPUT_STREAM_CAP_CHARS,
        start_timeout_s: float = SANDBOX_START_TIMEOUT_S,
        python: str = sys.executable,
    ):
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.network = network
        self.workspace_mode = workspace_mode
        self.pool_size = pool_size
        self.pool_die_with_parent = pool_die_with_parent
        self.owner = owner
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.start_timeout_s = start_timeout_s
        self.python = python
        self._bwrap = bwrap_path()
        self._owned: set[BwrapSandbox] = set()
        self._closed = False
        self._warned: set[str] = set()
        self._swept = False  # sweep_stale ran (once per backend)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, network: bool = False, **options: Any
    ) -> BwrapBackend:
        """A backend with ``settings``' sandbox policy (workspace mode, limits) and REPL
        settings as its defaults; ``options`` are passed on (owner, pool_size...)."""
        sandbox: SandboxSettings = settings.sandbox
        return cls(
            workspace_mode=sandbox.workspace,
            memory_bytes=sandbox.memory_bytes,
            cpus=sandbox.cpus,
            pids_limit=sandbox.pids_limit,
            network=network,
            interrupt_grace_s=settings.interrupt_grace_s,
            output_cap_chars=settings.output_cap_chars,
            **options,
        )

    @property
    def bwrap(self) -> str:
        if self._bwrap is None:
            raise SandboxStartError(
                "bubblewrap (bwrap) is not installed: install the bubblewrap package "
                "(apt-get install bubblewrap), or choose another --backend"
            )
        return self._bwrap

    def _warn_once(self, warning: str) -> None:
        if warning and warning not in self._warned:
            self._warned.add(warning)
            log.warning("%s", warning)

    # --- SandboxBackend ---------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        if self._closed:
            raise SandboxError("backend is closed")
        check_spec(spec)
        spec = replace(spec, cwd=spec.cwd.resolve(), skill_dirs=checked_skill_dirs(spec.skill_dirs))
        self.bwrap  # noqa: B018 - one clear line when bubblewrap is missing
        self.check_workspace(spec)
        await self._sweep_once()
        sandbox = BwrapSandbox(self, spec)
        try:
            async with asyncio.timeout(self.start_timeout_s * 2):
                await sandbox.start()
        except BaseException as exc:
            await asyncio.shield(sandbox._teardown())
            recorded, sandbox._recorded = sandbox._recorded, None
            if recorded is not None:
                await asyncio.shield(self._report_down(recorded))
            if sandbox.workspace_copy is not None:  # nothing ran in it: no work to keep
                await asyncio.to_thread(sandbox.workspace_copy.remove)
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, TimeoutError):
                raise SandboxStartError(
                    f"bwrap sandbox did not start within {self.start_timeout_s * 2:g} s"
                ) from exc
            if isinstance(exc, (SandboxError, OSError, ValueError, KeyError)):
                raise SandboxStartError(f"bwrap sandbox did not start: {exc!r}") from exc
            raise
        self._owned.add(sandbox)
        return sandbox

    async def _sweep_once(self) -> None:
        """Before this backend's first sandbox: remove what dead sandboxes left."""
        if self._swept:
            return
        self._swept = True
        try:
            removed = await asyncio.to_thread(sweep_stale)
        except OSError as exc:  # tidying only
            log.warning("bwrap: sweeping stale sandbox directories failed: %s", exc)
            return
        if removed:
            log.info("bwrap: removed %d stale sandbox directories", removed)

    async def close(self) -> None:
        self._closed = True
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())

    # --- adoption (the daemon's start-up, orchestrator/sessions/adoption.py) ----------------

    async def adopt(self, ref: SandboxRef, spec: SandboxSpec) -> BwrapSandbox:
        """Reconnect to a sandbox an earlier daemon started: the same bwrap process, its
        gateway socket, its kernel; its NATS socket is served again (that relay died with the
        old daemon) and its limits are reopened. A cell still running is interrupted."""
        if self._closed:
            raise SandboxError("backend is closed")
        runtime_dir = own_runtime_dir(ref.runtime_dir)
        info = find_bwrap(int(ref.ref), runtime_dir) if runtime_dir and ref.ref.isdigit() else None
        if runtime_dir is None or info is None:
            raise SandboxError(f"bwrap sandbox {ref.ref} is gone")
        sandbox = BwrapSandbox(self, spec)
        sandbox.runtime_dir = runtime_dir
        sandbox.token = ref.token
        sandbox.child = AdoptedGateway(info, runtime_dir / GATEWAY_LOG_NAME)
        sandbox.init = find_init(runtime_dir)
        with contextlib.suppress(OSError):
            sandbox.confinement = reopen((runtime_dir / CONFINEMENT_FILE_NAME).read_text())
        if spec.snapshot_dir is not None:
            sandbox.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
        if not self.network_for(spec):
            sandbox._relay = await serve_unix_to_tcp(
                sandbox.socket_dir / NATS_SOCKET, lambda: sandbox._nats
            )
        client = gateway_client(sandbox.socket_dir, ref.token)
        try:
            interrupted = await reattach_within(
                client,
                ref.kernel_id,
                what=f"bwrap sandbox {ref.ref}",
                interrupt_grace_s=self.interrupt_grace_s,
                timeout_s=self.start_timeout_s,
            )
        except SandboxError:  # reattach_within closed the client; the relay goes too
            if sandbox._relay is not None:
                sandbox._relay.close()
            raise
        sandbox.client = client
        client.on_restart = sandbox._setup
        sandbox.ref = replace(ref, session_id=spec.session_id)
        if not spec.die_with_parent:
            sandbox._recorded = sandbox.ref  # its row goes when it stops
        self._owned.add(sandbox)
        log.info(
            "adopted bwrap sandbox %s (bwrap pid %s%s)",
            spec.session_id,
            ref.ref,
            ", its running cell was interrupted" if interrupted else "",
        )
        return sandbox

    async def remove(self, ref: SandboxRef) -> None:
        """Stop a recorded sandbox that is not adopted (only if it is still that very bwrap
        process), remove its cgroup and its runtime dir."""
        runtime_dir = own_runtime_dir(ref.runtime_dir)
        if runtime_dir is None:
            return
        info = find_bwrap(int(ref.ref), runtime_dir) if ref.ref.isdigit() else None
        init = find_init(runtime_dir)  # also when bwrap itself is gone
        await kill_sandbox(init, PROCESS_STOP_GRACE_S)
        if info is not None:
            await wait_gone(info, PROCESS_STOP_GRACE_S)
            await AdoptedGateway(info, runtime_dir / GATEWAY_LOG_NAME).stop(PROCESS_STOP_GRACE_S)
        confinement = None
        with contextlib.suppress(OSError):
            confinement = reopen((runtime_dir / CONFINEMENT_FILE_NAME).read_text())
        if confinement is not None:
            await asyncio.to_thread(confinement.remove)
        shutil.rmtree(runtime_dir, ignore_errors=True)

    async def remove_unknown(self, known: set[str]) -> int:
        """bwrap sandboxes marked with our ``owner`` that are not among ``known`` (recorded
        pids) and not our own children: a daemon killed between starting one and recording
        it."""
        await self._sweep_once()
        if not self.owner:
            return 0
        removed = 0
        for info, runtime_dir in owned_sandboxes(self.owner):
            if str(info.pid) in known or info.ppid == os.getpid():
                continue
            await self.remove(SandboxRef(BACKEND_NAME, str(info.pid), "", "", "", "", runtime_dir))
            removed += 1
        return removed
