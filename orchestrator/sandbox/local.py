"""The ``local`` backend: one Kernel Gateway child process per session, on loopback.

No isolation beyond the process boundary: the kernel runs with the user's rights (the CLI says
so). What this backend does guarantee:

- Secrets stay out (R16): the gateway starts with an environment built from an allowlist
  (never the parent's environment), and every kernel is created with an explicit ``env``.
- Nothing is left behind (R8): the gateway is a child subreaper that sweeps its descendants on
  exit, ``stop()`` sweeps them again from the host side, and with ``die_with_parent`` the
  gateway (and through it the kernel) dies with this process, even on SIGKILL.
- A warm pool (``WarmPool``) hides the ~1-2 s start behind the first cell.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError
from orchestrator.procs import ChildProcess, ChildStartError, start_child
from orchestrator.sandbox import proctree
from orchestrator.sandbox.base import (
    CellResult,
    Sandbox,
    SandboxBackend,
    SandboxRef,
    SandboxSpec,
)
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_main import BASE_KERNEL_ENV_NAMES, TOKEN_ENV
from orchestrator.sandbox.output import OutputCollector, artifact_path_for
from orchestrator.sandbox.pool import WarmPool
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
    "LocalBackend",
    "LocalSandbox",
    "gateway_env",
    "kernel_env",
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


def gateway_env(token: str, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The gateway child's environment: allowlisted names from ``parent`` plus our own."""
    parent = os.environ if parent is None else parent
    env = {name: parent[name] for name in GATEWAY_ENV_ALLOWLIST if parent.get(name)}
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
    return env


def kernel_env(spec_env: Mapping[str, str], gateway: Mapping[str, str]) -> dict[str, str]:
    """The ``env`` of POST /api/kernels: sane basics from the gateway's env, then the spec's."""
    env = {name: gateway[name] for name in BASE_KERNEL_ENV_NAMES if gateway.get(name)}
    env.update(spec_env)
    return env


def _relative_to_root(path: Path) -> str:
    # The gateway's kernel manager has root_dir "/" and takes the cwd as an API path.
    return str(path.resolve()).lstrip("/")


class LocalSandbox(Sandbox):
    """One gateway child process and its kernel. Cells are serialized by the caller."""

    def __init__(
        self,
        *,
        spec: SandboxSpec,
        child: ChildProcess,
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
        )
        self._stopped = False
        self._lock = asyncio.Lock()  # one execution / restart at a time, whatever the caller
        self.on_stop: Callable[[LocalSandbox], None] | None = None  # the backend forgets us
        client.on_restart = self._setup

    @property
    def gateway_pid(self) -> int:
        return self.child.pid

    # --- session ----------------------------------------------------------------------------

    async def _setup(self) -> None:
        """Put the session's cwd and env in place (after every kernel start and restart)."""
        code = (
            "__import__('orchestrator.runtime', fromlist=['session_setup']).session_setup("
            f"{str(self.spec.cwd)!r}, {dict(self.spec.env)!r})"
        )
        reply = await self.client.run_silent(
            code, user_expressions={"pid": "__import__('os').getpid()"}
        )
        pid = reply.get("user_expressions", {}).get("pid", {})
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            self.kernel_pid = int(pid["data"]["text/plain"])

    async def assign(self, spec: SandboxSpec) -> None:
        """Hand an idle pooled sandbox to a session: apply its cwd and env."""
        self.spec = spec
        self.ref = replace(self.ref, session_id=spec.session_id)
        # A death while idle in the pool cost the new session nothing: do not report it.
        self.client.unreported_restarts = 0
        await self._setup()

    # --- Sandbox ----------------------------------------------------------------------------

    async def execute(self, code: str, *, timeout_s: float, cell_id: str) -> CellResult:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        async with self._lock:
            self._check_usable()
            try:
                notice = await self.client.prepare()
                collector = OutputCollector(
                    cap_chars=self.output_cap_chars,
                    artifact_path=artifact_path_for(self.spec.artifacts_dir, cell_id),
                )
                try:
                    result = await self.client.execute(
                        code,
                        timeout_s=timeout_s,
                        interrupt_grace_s=self.interrupt_grace_s,
                        collector=collector,
                    )
                finally:
                    collector.close()
            except SandboxError as exc:
                raise self._explain(exc) from exc
            if notice:
                result.notice = f"{notice} {result.notice}".strip()
                result.kernel_restarted = True
            return result

    async def interrupt(self) -> None:
        self._check_usable()
        try:
            await self.client.interrupt()
        except SandboxError as exc:
            raise self._explain(exc) from exc

    async def restart_kernel(self) -> None:
        async with self._lock:
            self._check_usable()
            try:
                await self.client.restart()
            except SandboxError as exc:
                raise self._explain(exc) from exc
            self.client.unreported_restarts = 0

    async def is_alive(self) -> bool:
        if self._stopped or self.child.proc.returncode is not None:
            return False
        return await self.client.kernel_alive()

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

    # --- helpers ----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.ref.session_id} is stopped")
        if self.child.proc.returncode is not None:
            raise KernelDied(self._gateway_exit_message())

    def _explain(self, exc: SandboxError) -> SandboxError:
        if self.child.proc.returncode is not None:
            return KernelDied(self._gateway_exit_message())
        return exc

    def _gateway_exit_message(self) -> str:
        tail = self.child.stderr_tail().strip().splitlines()[-3:]
        return (
            f"kernel gateway (pid {self.child.pid}) exited with status "
            f"{self.child.proc.returncode}" + (": " + " | ".join(tail) if tail else "")
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
    ):
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
        _check_spec(spec)
        spec = replace(spec, cwd=spec.cwd.resolve())
        if self.pool is not None:
            self.pool.start()
            sandbox = await self.pool.acquire(spec)
        else:
            sandbox = await self._start_cold(spec)
        self._owned.add(sandbox)
        sandbox.on_stop = self._owned.discard
        return sandbox

    async def close(self) -> None:
        self._closed = True
        if self.pool is not None:
            await self.pool.close()
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())

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
        env = gateway_env(token)
        argv = [
            self.python,
            "-P",  # never import from the cwd
            "-m",
            "orchestrator.sandbox.gateway_main",
            "--runtime-dir",
            str(runtime_dir),
            "--python",
            self.python,
        ]
        if spec.die_with_parent:
            argv.append("--die-with-parent")
        for name in sorted(spec.env):
            argv += ["--env-allow", name]
        child: ChildProcess | None = None
        client: KernelGatewayClient | None = None
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
                )
            except ChildStartError as exc:
                raise SandboxStartError(str(exc)) from exc
            booted = time.monotonic()
            client = KernelGatewayClient(f"http://127.0.0.1:{int(child.ready['port'])}", token)
            async with asyncio.timeout(self.start_timeout_s):
                await client.start_kernel(
                    env=kernel_env(spec.env, env), path=_relative_to_root(spec.cwd)
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
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, (SandboxError, TimeoutError, OSError, ValueError, KeyError)):
                raise SandboxStartError(f"local sandbox did not start: {exc!r}") from exc
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


def _check_spec(spec: SandboxSpec) -> None:
    if not spec.cwd.is_dir():
        raise SandboxStartError(f"session cwd {spec.cwd} is not a directory")
    for name, value in spec.env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise SandboxStartError(f"invalid environment variable name or value: {name!r}")
