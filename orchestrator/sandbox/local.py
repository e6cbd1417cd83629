"""The ``local`` backend: one Kernel Gateway child process per session, on loopback.

No isolation beyond the process boundary: the kernel runs with the user's rights (the CLI says
so). What this backend does guarantee:

- Secrets stay out (R16): the gateway starts with an environment built from an allowlist
  (never the parent's environment), and every kernel is created with an explicit ``env``.
- Nothing is left behind (R8): the gateway is a child subreaper that sweeps its descendants on
  exit, ``stop()`` sweeps them again from the host side, and with ``die_with_parent`` the
  gateway (and through it the kernel) dies with this process, even on SIGKILL.
- Without ``die_with_parent`` (the daemon's sandboxes) the gateway outlives a crash of this
  process: it is reported to the backend's ``listener`` (recorded in the store) and the next
  daemon ``adopt``s it (same kernel, namespace intact) or ``remove``s it (R2, R8).
- A warm pool (``WarmPool``) hides the ~1-2 s start behind the first cell.

The gateway's stdout is its log file, not a pipe: a gateway that outlives us must not write
into a pipe nobody reads (its kernel inherits that descriptor, and ipykernel echoes fd-level
output there; a broken pipe would stop that echo thread and block the next writer). So the
ready line ``{"port": N, "pid": P}`` is read from the log file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
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
    with_import_path,
)
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_main import (
    BASE_KERNEL_ENV_NAMES,
    DEVICE_ENV_NAMES,
    TOKEN_ENV,
)
from orchestrator.sandbox.gateway_sandbox import GatewaySandbox
from orchestrator.sandbox.pool import WarmPool
from orchestrator.sandbox.reattach import reattach_within
from orchestrator.sandbox.workspace import WorkspaceCopy, finish_copy, local_workspace
from orchestrator.settings import (
    INTERRUPT_GRACE_S,
    OUTPUT_STREAM_CAP_CHARS,
    PROCESS_STOP_GRACE_S,
    SANDBOX_START_TIMEOUT_S,
    WARM_POOL_SIZE,
)

__all__ = [
    "BACKEND_NAME",
    "GATEWAY_ENV_ALLOWLIST",
    "AdoptedGateway",
    "LocalBackend",
    "LocalSandbox",
    "check_spec",
    "gateway_env",
    "kernel_env",
    "owned_gateways",
    "read_ready_line",
    "session_env",
    "tail_text",
]

log = logging.getLogger(__name__)

BACKEND_NAME = "local"
# The gateway's whole environment comes from these names (plus what we set). Nothing else from
# the orchestrator's environment (provider keys, tokens, credentials) reaches the sandbox.
GATEWAY_ENV_ALLOWLIST = ("PATH", *BASE_KERNEL_ENV_NAMES)
DEFAULT_LANG = "C.UTF-8"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
TOKEN_BYTES = 32
RUNTIME_DIR_PREFIX = "prime-agent-sbx-"
GATEWAY_LOG_NAME = "gateway.log"
POOL_SESSION_ID = "pool"  # placeholder session of an idle pooled sandbox
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
GATEWAY_MODULE: Final = "orchestrator.sandbox.gateway_main"
READY_LINE_PREFIX: Final = b'{"port"'  # gateway_main's ready line, in its log
READY_POLL_S: Final = 0.01  # reading the log for the ready line
STDERR_TAIL_BYTES: Final = 4096
# ``info()`` reads at most this much of the end of the gateway's log for its last lines.
LOG_TAIL_READ_BYTES: Final = 64 * 1024
ADOPTED_STOP_POLL_S: Final = 0.05  # an adopted gateway is not our child: no waitpid
OWNER_ENV: Final = "PRIME_AGENT_SANDBOX_OWNER"  # the daemon's socket (gateway_env)
RUNTIME_DIR_FLAG: Final = "--runtime-dir"


def gateway_env(
    token: str, parent: Mapping[str, str] | None = None, *, owner: str = ""
) -> dict[str, str]:
    """The gateway child's environment: allowlisted names from ``parent`` plus our own.

    ``owner`` (the daemon's socket) marks the gateway as the daemon's, like a container label:
    a later daemon finds and removes an unrecorded one (``LocalBackend.remove_unknown``). Only
    the gateway's own environment carries it; kernels get an explicit env (``kernel_env``).
    """
    parent = os.environ if parent is None else parent
    env = {name: parent[name] for name in GATEWAY_ENV_ALLOWLIST if parent.get(name)}
    # The user's choice of accelerators on this host holds in a local sandbox too; passed even
    # when empty (an empty CUDA_VISIBLE_DEVICES means "no GPU", not "every GPU").
    env.update({name: parent[name] for name in DEVICE_ENV_NAMES if name in parent})
    # The interpreter's bin dir first: ``python``/``pip`` in %%bash are the kernel's own.
    bin_dir = os.path.dirname(sys.executable)
    path = env.get("PATH", DEFAULT_PATH)
    if bin_dir not in path.split(os.pathsep):
        path = bin_dir + os.pathsep + path
    env["PATH"] = path
    env.setdefault("LANG", DEFAULT_LANG)
    env.setdefault("HOME", os.path.expanduser("~"))
    # gateway_main must import from our source tree even when the package is not installed.
    env["PYTHONPATH"] = SOURCE_ROOT
    env[TOKEN_ENV] = token
    if owner:
        env[OWNER_ENV] = owner
    return env


def kernel_env(spec_env: Mapping[str, str], gateway: Mapping[str, str]) -> dict[str, str]:
    """The ``env`` of POST /api/kernels: sane basics from the gateway's env, then the spec's."""
    env = {name: gateway[name] for name in BASE_KERNEL_ENV_NAMES if gateway.get(name)}
    env.update(spec_env)
    return env


def session_env(spec: SandboxSpec) -> dict[str, str]:
    """The session's kernel env: ``spec.env`` with its skill directories first on PYTHONPATH
    (also seen by the kernel's child processes: a skill's CLI, ``python`` in %%bash)."""
    return with_import_path(spec.env, [str(d) for d in spec.skill_dirs])


def _relative_to_root(path: Path) -> str:
    # The gateway's kernel manager has root_dir "/" and takes the cwd as an API path.
    return str(path.resolve()).lstrip("/")


def tail_text(path: Path, max_bytes: int = STDERR_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _gateway_info(pid: int, log_path: Path, alive: bool) -> SandboxInfo:
    """A local sandbox as ``info()`` shows it: the gateway process and its descendants (the
    kernel and whatever it runs) from /proc, the last lines of the gateway's log."""
    proc = proctree.read_proc(pid) if alive else None
    usage = proctree.tree_usage(pid) if proc is not None else None
    lines = [line for line in tail_text(log_path, LOG_TAIL_READ_BYTES).splitlines() if line.strip()]
    return SandboxInfo(
        name=f"pid {pid}",
        state="running" if usage is not None else "exited",
        started_at=proctree.started_at(proc) if proc is not None else None,
        cpu_seconds=usage.cpu_seconds if usage is not None else None,
        memory_bytes=usage.rss_bytes if usage is not None else None,
        log_tail=tuple(lines[-SANDBOX_LOG_TAIL_LINES:]),
    )


def _own_runtime_dir(recorded: str) -> Path | None:
    """``recorded`` when it is one of our runtime dirs (a direct child of the temp dir with our
    prefix), else None: a path read back from the database is never removed blindly."""
    if not recorded:
        return None
    path = Path(recorded)
    temp = Path(tempfile.gettempdir()).resolve()
    if path.parent.resolve() != temp or not path.name.startswith(RUNTIME_DIR_PREFIX):
        return None
    return path


def _find_gateway(ref: SandboxRef) -> proctree.ProcInfo | None:
    """The recorded gateway process if it still runs and is the same one: our gateway module
    with the recorded runtime dir on its command line, leading its own process group (a
    reused pid is never signalled)."""
    try:
        pid = int(ref.ref)
    except ValueError:
        return None
    info = proctree.read_proc(pid)
    if info is None or info.state == "Z" or info.pgid != pid:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if GATEWAY_MODULE.encode() not in argv or ref.runtime_dir.encode() not in argv:
        return None
    return info


def owned_gateways(owner: str) -> list[tuple[proctree.ProcInfo, str]]:
    """Gateways marked by the daemon on socket ``owner`` (``prime-agent doctor``)."""
    return _owned_gateways(owner)


def _owned_gateways(owner: str) -> list[tuple[proctree.ProcInfo, str]]:
    """Running gateway processes whose environment carries ``OWNER_ENV=owner``, with their
    runtime dirs (from /proc: readable for our own uid only, which is the point)."""
    marker = f"{OWNER_ENV}={owner}".encode()
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            if GATEWAY_MODULE.encode() not in argv:
                continue
            if marker not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            runtime_dir = argv[argv.index(RUNTIME_DIR_FLAG.encode()) + 1].decode()
        except (OSError, ValueError, IndexError):
            continue
        info = proctree.read_proc(int(name))
        if info is not None and info.state != "Z" and info.pgid == info.pid:
            found.append((info, runtime_dir))
    return found


class AdoptedGateway:
    """A gateway process an earlier orchestrator started (it outlived that process).

    Not our child, so there is no exit status to wait for: liveness is "the same process (pid
    and start time) still runs", and stopping signals its process group and polls.
    """

    def __init__(self, info: proctree.ProcInfo, log_path: Path):
        self.info = info
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; its real status is its new parent's to collect, so -1."""
        return None if proctree.is_running(self.info) else -1

    def stderr_tail(self) -> str:
        return tail_text(self.log_path)

    async def stop(self, grace_s: float = PROCESS_STOP_GRACE_S) -> None:
        """SIGTERM to the group (the gateway stops its kernel and sweeps) -> grace -> SIGKILL."""
        if proctree.is_running(self.info):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.info.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace_s
            while proctree.is_running(self.info) and loop.time() < deadline:
                await asyncio.sleep(ADOPTED_STOP_POLL_S)
        # The leader may be gone while members of its group linger: sweep the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.info.pid, signal.SIGKILL)


class LocalSandbox(GatewaySandbox):
    """One gateway child process and its kernel. Cells are serialized by the caller."""

    def __init__(
        self,
        *,
        spec: SandboxSpec,
        child: ChildProcess | AdoptedGateway,
        client: KernelGatewayClient,
        runtime_dir: Path,
        token: str,
        interrupt_grace_s: float,
        output_cap_chars: int,
    ):
        self.spec = spec
        self.child = child
        self.client = client
        self.runtime_dir = runtime_dir
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.kernel_pid: int | None = None
        self.ref = SandboxRef(
            backend=BACKEND_NAME,
            ref=str(child.pid),
            session_id=spec.session_id,
            url=client.base_url,
            kernel_id=client.kernel_id,
            token=token,
            runtime_dir=str(runtime_dir),
        )
        self._stopped = False
        self._lock = asyncio.Lock()  # one execution / restart at a time, whatever the caller
        self.on_stop: Callable[[LocalSandbox], None] | None = None  # the backend forgets us
        # Set when the sandbox outlives us (not die_with_parent): it reports up/down there.
        self.recorder: LocalBackend | None = None
        # Workspace mode copy: the private copy the kernel runs in, synced back at stop.
        self.workspace_copy: WorkspaceCopy | None = None
        client.on_restart = self._setup

    @property
    def gateway_pid(self) -> int:
        return self.child.pid

    @property
    def adopted(self) -> bool:
        """Started by an earlier orchestrator process and adopted by this one."""
        return isinstance(self.child, AdoptedGateway)

    def _exit_status(self) -> int | None:
        child = self.child
        return child.proc.returncode if isinstance(child, ChildProcess) else child.returncode

    # --- session ----------------------------------------------------------------------------

    def _session_env(self) -> dict[str, str]:
        return session_env(self.spec)

    def _import_path(self) -> list[str]:
        return [str(d) for d in self.spec.skill_dirs]  # a pooled kernel may lack them

    async def _setup(self) -> None:
        """Put the session's cwd and env in place (after every kernel start and restart)."""
        await self._apply_session(self.client)

    async def assign(self, spec: SandboxSpec) -> None:
        """Hand an idle pooled sandbox to a session: apply its cwd and env."""
        self.spec = spec
        self.ref = replace(self.ref, session_id=spec.session_id)
        # A death while idle in the pool cost the new session nothing: do not report it.
        self.client.unreported_restarts = 0
        await self._setup()
        if self.recorder is not None:
            await self.recorder._report_up(self.ref)

    # --- Sandbox ----------------------------------------------------------------------------

    async def is_alive(self) -> bool:
        if self._stopped or self._exit_status() is not None:
            return False
        return await self.client.kernel_alive()

    async def info(self) -> SandboxInfo:
        alive = not self._stopped and self._exit_status() is None
        log_path = self.runtime_dir / GATEWAY_LOG_NAME
        return await asyncio.to_thread(_gateway_info, self.child.pid, log_path, alive)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.on_stop is not None:
            self.on_stop(self)
        # Host-side backstop: remember every process of this sandbox now, so that whatever
        # escapes the gateway's own sweep (it may be SIGKILLed before it runs) is killed below.
        snapshot = proctree.descendants(self.child.pid)
        with contextlib.suppress(Exception):
            await self.client.close()
        # SIGTERM -> the gateway kills its kernel and sweeps its descendants -> grace -> SIGKILL.
        await self.child.stop(PROCESS_STOP_GRACE_S)
        proctree.kill_all(snapshot, signal.SIGKILL)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        copy, self.workspace_copy = self.workspace_copy, None
        if copy is not None:  # nothing runs in it any more: sync it back
            await asyncio.to_thread(finish_copy, copy)
        if self.recorder is not None:
            await self.recorder._report_down(self.ref)

    # --- helpers ----------------------------------------------------------------------------

    def _usable(self) -> KernelGatewayClient:
        if self._stopped:
            raise SandboxError(f"sandbox {self.ref.session_id} is stopped")
        if self._exit_status() is not None:
            raise KernelDied(self._exit_message())
        return self.client

    def _exit_message(self) -> str:
        tail = self.child.stderr_tail().strip().splitlines()[-3:]
        return f"kernel gateway (pid {self.child.pid}) exited with status {self._exit_status()}" + (
            ": " + " | ".join(tail) if tail else ""
        )


class LocalBackend(SandboxBackend):
    """Starts ``LocalSandbox``es; keeps a warm pool of ``pool_size`` idle ones when asked.

    The pool starts filling on ``start_pool()`` (or the first ``create``); ``create`` takes a
    pooled sandbox when one is ready and its ``die_with_parent`` matches, else starts one cold.
    """

    name = BACKEND_NAME

    def __init__(
        self,
        *,
        pool_size: int = WARM_POOL_SIZE,
        pool_die_with_parent: bool = True,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        output_cap_chars: int = OUTPUT_STREAM_CAP_CHARS,
        start_timeout_s: float = SANDBOX_START_TIMEOUT_S,
        python: str = sys.executable,
        workspace_mode: WorkspaceMode = "rw",  # ro only warns; copy: workspace.py
        owner: str = "",  # the daemon's socket: marks its gateways (gateway_env)
    ):
        self.owner = owner
        self.workspace_mode = workspace_mode
        self._warned_ro = False
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.start_timeout_s = start_timeout_s
        self.python = python
        self._owned: set[LocalSandbox] = set()
        self._closed = False
        self.pool: WarmPool[LocalSandbox] | None = None
        if pool_size > 0:
            self.pool = WarmPool(
                self._start_pooled,
                self._start_cold,
                size=pool_size,
                die_with_parent=pool_die_with_parent,
            )

    def start_pool(self) -> None:
        """Begin filling the warm pool in the background (needs a running event loop)."""
        if self.pool is not None and not self._closed:
            self.pool.start()

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        if self._closed:
            raise SandboxError("backend is closed")
        check_spec(spec)
        spec = replace(spec, cwd=spec.cwd.resolve(), skill_dirs=checked_skill_dirs(spec.skill_dirs))
        mode = spec.workspace or self.workspace_mode
        spec, copy = await asyncio.to_thread(
            local_workspace, spec, mode, warn=mode == "ro" and not self._warned_ro
        )
        self._warned_ro = self._warned_ro or mode == "ro"
        try:
            if self.pool is not None:
                self.pool.start()
                sandbox = await self.pool.acquire(spec)
            else:
                sandbox = await self._start_cold(spec)
        except BaseException:
            if copy is not None:  # nothing ran in it: no work to keep
                await asyncio.to_thread(copy.remove)
            raise
        sandbox.workspace_copy = copy
        self._own(sandbox)
        return sandbox

    async def close(self) -> None:
        self._closed = True
        if self.pool is not None:
            await self.pool.close()
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())

    # --- adoption (the daemon's start-up, orchestrator/sessions/adoption.py) ----------------

    async def adopt(self, ref: SandboxRef, spec: SandboxSpec) -> LocalSandbox:
        """Reconnect to a gateway an earlier daemon started (loopback URL + token), same
        kernel; a cell still running there is interrupted (``reattach``)."""
        if self._closed:
            raise SandboxError("backend is closed")
        runtime_dir = _own_runtime_dir(ref.runtime_dir)
        info = _find_gateway(ref) if runtime_dir is not None else None
        if runtime_dir is None or info is None:
            raise SandboxError(f"gateway {ref.ref} is gone")
        client = KernelGatewayClient(ref.url, ref.token)
        interrupted = await reattach_within(
            client,
            ref.kernel_id,
            what=f"gateway {ref.ref}",
            interrupt_grace_s=self.interrupt_grace_s,
            timeout_s=self.start_timeout_s,
        )
        sandbox = LocalSandbox(
            spec=spec,
            child=AdoptedGateway(info, runtime_dir / GATEWAY_LOG_NAME),
            client=client,
            runtime_dir=runtime_dir,
            token=ref.token,
            interrupt_grace_s=self.interrupt_grace_s,
            output_cap_chars=self.output_cap_chars,
        )
        self._own(sandbox)
        if not spec.die_with_parent:
            sandbox.recorder = self  # its row goes when it stops
        log.info(
            "adopted local sandbox %s (gateway pid %s%s)",
            spec.session_id,
            ref.ref,
            ", its running cell was interrupted" if interrupted else "",
        )
        return sandbox

    async def remove(self, ref: SandboxRef) -> None:
        """Stop a recorded gateway that is not adopted (only if it is still that very
        process) and remove its runtime dir."""
        runtime_dir = _own_runtime_dir(ref.runtime_dir)
        info = _find_gateway(ref) if runtime_dir is not None else None
        if info is not None:
            snapshot = proctree.descendants(info.pid)
            await AdoptedGateway(info, Path(ref.runtime_dir) / GATEWAY_LOG_NAME).stop()
            proctree.kill_all(snapshot, signal.SIGKILL)
        if runtime_dir is not None:
            shutil.rmtree(runtime_dir, ignore_errors=True)

    async def remove_unknown(self, known: set[str]) -> int:
        """Gateways marked with our ``owner`` that are not among ``known`` (recorded pids) and
        not our own children: a daemon killed between spawning one and recording it."""
        if not self.owner:
            return 0
        removed = 0
        for info, runtime_dir in _owned_gateways(self.owner):
            if str(info.pid) in known or info.ppid == os.getpid():
                continue
            await self.remove(SandboxRef(BACKEND_NAME, str(info.pid), "", "", "", "", runtime_dir))
            removed += 1
        return removed

    def _own(self, sandbox: LocalSandbox) -> None:
        self._owned.add(sandbox)
        sandbox.on_stop = self._owned.discard

    async def _start_cold(self, spec: SandboxSpec) -> LocalSandbox:
        return await self._start(spec, pooled=False)

    async def _start_pooled(self, die_with_parent: bool) -> LocalSandbox:
        runtime_home = Path(tempfile.gettempdir())
        spec = SandboxSpec(
            session_id=POOL_SESSION_ID,
            cwd=runtime_home,
            artifacts_dir=runtime_home,
            die_with_parent=die_with_parent,
        )
        return await self._start(spec, pooled=True)

    async def _start(self, spec: SandboxSpec, *, pooled: bool) -> LocalSandbox:
        started = time.monotonic()
        runtime_dir = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX))
        token = secrets.token_urlsafe(TOKEN_BYTES)
        env = gateway_env(token, owner=self.owner)
        argv = [
            self.python,
            "-P",  # never import from the cwd
            "-m",
            GATEWAY_MODULE,
            RUNTIME_DIR_FLAG,
            str(runtime_dir),
            "--python",
            self.python,
        ]
        if spec.die_with_parent:
            argv.append("--die-with-parent")
        for name in sorted(session_env(spec)):
            argv += ["--env-allow", name]
        child: ChildProcess | None = None
        client: KernelGatewayClient | None = None
        early: SandboxRef | None = None  # reported as soon as there is a process to clean up
        try:
            try:
                child = await start_child(
                    argv,
                    env=env,
                    cwd=runtime_dir,
                    die_with_parent=spec.die_with_parent,
                    ready_timeout_s=self.start_timeout_s,
                    stderr_path=runtime_dir / GATEWAY_LOG_NAME,
                    what="kernel gateway",
                    ready_line=False,  # stdout is the log (module docstring)
                    # The agent's files in the workspace are the user's: the user's umask, not
                    # the daemon's private one (orchestrator/file_modes.py).
                    umask=user_umask(),
                )
                child.ready = await read_ready_line(
                    child, runtime_dir / GATEWAY_LOG_NAME, self.start_timeout_s
                )
            except ChildStartError as exc:
                raise SandboxStartError(str(exc)) from exc
            booted = time.monotonic()
            url = f"http://127.0.0.1:{int(child.ready['port'])}"
            if not spec.die_with_parent:
                early = SandboxRef(
                    BACKEND_NAME, str(child.pid), spec.session_id, url, "", token, str(runtime_dir)
                )
                await self._report_up(early)
            client = KernelGatewayClient(url, token)
            async with asyncio.timeout(self.start_timeout_s):
                await client.start_kernel(
                    env=kernel_env(session_env(spec), env), path=_relative_to_root(spec.cwd)
                )
                await client.connect()
                await client.wait_ready()
                sandbox = LocalSandbox(
                    spec=spec,
                    child=child,
                    client=client,
                    runtime_dir=runtime_dir,
                    token=token,
                    interrupt_grace_s=self.interrupt_grace_s,
                    output_cap_chars=self.output_cap_chars,
                )
                await sandbox._setup()
        except BaseException as exc:
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
            if child is not None:
                await child.stop()
            shutil.rmtree(runtime_dir, ignore_errors=True)
            if early is not None:
                await asyncio.shield(self._report_down(early))
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, (SandboxError, TimeoutError, OSError, ValueError, KeyError)):
                raise SandboxStartError(f"local sandbox did not start: {exc!r}") from exc
            raise
        if early is not None:
            sandbox.recorder = self
            try:
                await self._report_up(sandbox.ref)
            except BaseException:
                # Cancelled while its record was written (a warm pool closed at shutdown): the
                # sandbox is running and nobody else holds it, so it stops here or nowhere.
                await asyncio.shield(sandbox.stop())
                raise
        ready = time.monotonic()
        log.info(
            "local sandbox %s%s: gateway %.0f ms, kernel %.0f ms",
            spec.session_id,
            " (pool)" if pooled else "",
            (booted - started) * 1000,
            (ready - booted) * 1000,
        )
        return sandbox


async def read_ready_line(child: ChildProcess, log_path: Path, timeout_s: float) -> dict[str, Any]:
    """The gateway's ready line, from its log (its stdout); ``ChildStartError`` when it exits
    first or stays silent past ``timeout_s`` (the child is stopped then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    offset = 0
    partial = b""
    while True:
        try:
            with open(log_path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            data = b""
        offset += len(data)
        *lines, partial = (partial + data).split(b"\n")
        for line in lines:
            if line.startswith(READY_LINE_PREFIX):
                with contextlib.suppress(ValueError):
                    ready = json.loads(line)
                    if isinstance(ready, dict):
                        return ready
        if child.proc.returncode is not None:
            await child.stop()
            raise ChildStartError("kernel gateway exited before it was ready", child)
        if loop.time() >= deadline:
            await child.stop()
            raise ChildStartError(
                f"kernel gateway did not become ready in {timeout_s:.0f} s", child
            )
        await asyncio.sleep(READY_POLL_S)


def check_spec(spec: SandboxSpec) -> None:
    """``SandboxStartError`` for a spec no gateway process can start with: a cwd that is not a
    directory, an environment variable name or value that ``execve`` cannot carry."""
    if not spec.cwd.is_dir():
        raise SandboxStartError(f"session cwd {spec.cwd} is not a directory")
    if spec.mounts:  # only a container can show a directory at another path (mounts.py)
        raise SandboxStartError(
            "this session asks for extra mounts (a Harbor task's /app, /tests, /logs): "
            "they need the docker backend"
        )
    for name, value in spec.env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise SandboxStartError(f"invalid environment variable name or value: {name!r}")
