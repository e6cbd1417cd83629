"""A sandbox whose kernel is reached through one ``KernelGatewayClient`` (local, bwrap,
kubernetes).

What such a sandbox does per call is the same whatever holds the gateway (a child process, a
bwrap namespace): a cell, host code and a restart take ``_lock`` (one at a time, whatever the
caller does); a cell is written through an ``OutputCollector`` whose full output goes to
``_artifact_root()``; a restart the gateway did on its own since the last cell is reported on
the next result. What differs is how a gone sandbox is told apart from a failing call:
``_usable`` (the client, or ``SandboxError``/``KernelDied`` before anything is sent) and
``_exit_status``/``_exit_message`` (a ``SandboxError`` raised mid-call becomes ``KernelDied``
when the sandbox itself has exited).

``apply_session`` is what every sandbox over a gateway runs after each kernel start and
restart (the docker sandbox too, which handles its calls itself: it replaces a lost container).
``GatewaySandbox._start_kernel`` is the end of a bwrap or kubernetes sandbox's start, once its
gateway answers: the kernel started with the session's env, the session applied in it, and
applied again after every restart (``_apply_session``).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import KernelDied, SandboxError
from orchestrator.sandbox.base import CellResult, OutputListener, Sandbox, SandboxSpec
from orchestrator.sandbox.confined import start_kernel
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.output import OutputCollector, artifact_path_for

__all__ = ["GatewaySandbox", "apply_session"]

# The host's half of ``orchestrator.runtime.session_setup``: the call it runs in the kernel, and
# the user expression that reads the kernel's pid back.
SESSION_SETUP_CALL: Final = (
    "__import__('orchestrator.runtime', fromlist=['session_setup']).session_setup"
)
KERNEL_PID_EXPRESSION: Final = "__import__('os').getpid()"


async def apply_session(
    client: KernelGatewayClient,
    cwd: Path,
    env: Mapping[str, str],
    *,
    import_path: Sequence[str] = (),
) -> int | None:
    """Put a session's ``cwd`` and ``env`` in place in ``client``'s kernel (after every kernel
    start and restart: a pooled kernel started before its session was known, a restarted one
    forgot them) and return the kernel's pid, None when the reply does not carry it.
    ``import_path``: entries put first on ``sys.path`` where missing (a pooled kernel started
    before its session had them on its PYTHONPATH)."""
    code = f"{SESSION_SETUP_CALL}({str(cwd)!r}, {dict(env)!r})"
    if import_path:
        code = (
            f"__import__('sys').path[:0] = [p for p in {list(import_path)!r} "
            "if p not in __import__('sys').path]\n" + code
        )
    reply = await client.run_silent(code, user_expressions={"pid": KERNEL_PID_EXPRESSION})
    pid = reply.get("user_expressions", {}).get("pid", {})
    try:
        return int(pid["data"]["text/plain"])
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


class GatewaySandbox(Sandbox):
    """The calls of ``Sandbox`` over one gateway client; subclasses say when it is usable."""

    # All four are set by the subclass's __init__. ``_lock``: one execution / restart at a time.
    spec: SandboxSpec
    _lock: asyncio.Lock

    # Each text field of a result is cut to this many characters (the rest goes to a file).
    output_cap_chars: int
    # How long an interrupted cell may take to stop before its kernel is restarted.
    interrupt_grace_s: float
    # The kernel's pid as its last session setup reported it (None: not known).
    kernel_pid: int | None = None

    @abc.abstractmethod
    def _usable(self) -> KernelGatewayClient:
        """The client, or ``SandboxError`` (stopped) / ``KernelDied`` (gone) at once."""

    @abc.abstractmethod
    def _exit_status(self) -> int | None:
        """None while whatever holds the gateway runs; its exit status once it has exited."""

    @abc.abstractmethod
    def _exit_message(self) -> str:
        """One line: what exited, its status and the last lines of its log."""

    def _explain(self, exc: SandboxError) -> SandboxError:
        """``exc`` raised during a call, or ``KernelDied`` when the sandbox has exited."""
        if self._exit_status() is not None:
            return KernelDied(self._exit_message())
        return exc

    def _artifact_root(self) -> Path:
        """Where a cell's full output is written (host side)."""
        return self.spec.artifacts_dir

    def _session_env(self) -> dict[str, str]:
        """The kernel's session env as seen inside (for ``_start_kernel``)."""
        raise NotImplementedError(f"{type(self).__name__} starts its kernel itself")

    def _import_path(self) -> Sequence[str]:
        """Entries a kernel must have first on ``sys.path`` (``apply_session``)."""
        return ()

    async def _apply_session(self, client: KernelGatewayClient) -> None:
        """Put the session's cwd and env in place in ``client``'s kernel (after every kernel
        start and restart), then revive its namespace (``after_kernel_start``)."""
        pid = await apply_session(
            client, self.spec.cwd, self._session_env(), import_path=self._import_path()
        )
        if pid is not None:
            self.kernel_pid = pid
        if self.after_kernel_start is not None:  # namespace revival (docs/snapshots.md)
            await self.after_kernel_start(client.run_silent)

    async def _start_kernel(self, client: KernelGatewayClient) -> None:
        """Start the kernel through ``client`` (its gateway answers) and apply the session;
        every restart the gateway reports applies it again."""
        client.on_restart = partial(self._apply_session, client)
        await start_kernel(client, self.spec.cwd, self._session_env())
        await self._apply_session(client)

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
            client = self._usable()
            try:
                notice = await client.prepare()
                collector = OutputCollector(
                    cap_chars=self.output_cap_chars,
                    artifact_path=artifact_path_for(self._artifact_root(), cell_id),
                    listener=on_output,
                )
                try:
                    result = await client.execute(
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

    async def run_silent(
        self, code: str, *, user_expressions: Mapping[str, str] | None = None, timeout_s: float
    ) -> dict[str, Any]:
        async with self._lock:
            client = self._usable()
            try:
                return await client.run_silent(
                    code, user_expressions=user_expressions, timeout_s=timeout_s
                )
            except SandboxError as exc:
                raise self._explain(exc) from exc

    async def interrupt(self) -> None:
        client = self._usable()
        try:
            await client.interrupt()
        except SandboxError as exc:
            raise self._explain(exc) from exc

    async def restart_kernel(self) -> None:
        async with self._lock:
            client = self._usable()
            try:
                await client.restart()
            except SandboxError as exc:
                raise self._explain(exc) from exc
            client.unreported_restarts = 0
