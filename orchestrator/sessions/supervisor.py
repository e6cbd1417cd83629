"""Each session's sandbox over its lifetime: started with bounded backoff, kept, revived.

The session manager asks ``SandboxSupervisor`` for the sandbox task of a session before every
cell (``task_for``) and routes every new sandbox through it (``started``). The supervisor:

- wraps each sandbox in a ``KeptSandbox`` (``sessions/snapshots.py``): debounced namespace
  snapshots, revival in every new kernel, a last snapshot before the sandbox stops;
- starts a new sandbox when the last one is ``lost`` (gone between or during cells);
- lets at most ``start_slots`` sandboxes start at once (``START_SLOTS``, one per CPU, at
  least ``START_SLOTS_MIN``): a start is CPU work (a gateway and a kernel import), so twenty
  at once on two cores made every one of them slow and some time out ("timed out during
  opening handshake"); in turns, the first sessions get theirs at once and none times out;
- backs off after a failed start (``START_BACKOFF_BASE_S``, doubling, at most
  ``START_BACKOFF_MAX_S``) and after ``START_MAX_FAILURES`` failures in a row marks the
  *sandbox* failed (``failure``; ``sandbox_info`` shows it): no more attempts until new input
  starts a turn (``before_turn``) or ``sandbox restart`` (``restart``). The session itself
  stays ``idle``: it takes the next message like after any failed turn;
- replaces a loaded session's sandbox on demand (``restart``: the ``sandbox_control restart``
  of the daemon): the current sandbox stops with its last snapshot, a new one starts and the
  namespace is revived there. Only the sandbox changes: the session, its context, driver and
  queued input are not touched;
- on a wake from the store, starts the sandbox at once when a snapshot exists, so that the
  first turn's harness note can say which names came back (``revive_on_load``).

docs/snapshots.md describes the whole mechanism.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import SandboxStartError
from orchestrator.paths import Paths
from orchestrator.sandbox.base import Sandbox
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.snapshots import KeptSandbox, NamespaceKeeper, snapshot_dir_for
from orchestrator.settings import SANDBOX_START_TIMEOUT_S, SNAPSHOT_DEBOUNCE_S
from orchestrator.store.events import UserMessagePayload

__all__ = [
    "START_BACKOFF_BASE_S",
    "START_BACKOFF_MAX_S",
    "START_MAX_FAILURES",
    "SandboxSupervisor",
]

log = logging.getLogger(__name__)

START_BACKOFF_BASE_S: Final = 1.0  # after the n-th failed start in a row: 1, 2, 4 ... s
START_BACKOFF_MAX_S: Final = 60.0
START_MAX_FAILURES: Final = 3  # failed starts in a row before the sandbox is marked failed
# How long a woken session's first turn waits for its sandbox (and revival) before the model
# is called anyway (the revival notice then comes with the first cell's result).
REVIVAL_WAIT_S: Final = SANDBOX_START_TIMEOUT_S
NOTE_PREFIX: Final = "[notice] "
START_SLOTS_MIN: Final = 2  # sandbox starts at once, however few CPUs
START_SLOTS: Final = max(START_SLOTS_MIN, os.cpu_count() or START_SLOTS_MIN)


@dataclass
class _Session:
    keeper: NamespaceKeeper
    failures: int = 0  # failed starts in a row
    retry_at: float = 0.0  # loop time before which no new start is tried
    failed: bool = False
    awaiting_revival: bool = False  # woken with a snapshot: the first turn waits for it
    last_error: str = field(default="")


class SandboxSupervisor:
    """See the module docstring. The attributes are the bounds (tests shorten them)."""

    def __init__(self, paths: Paths, *, debounce_s: float = SNAPSHOT_DEBOUNCE_S):
        self.paths = paths
        self.debounce_s = debounce_s
        self.backoff_base_s = START_BACKOFF_BASE_S
        self.backoff_max_s = START_BACKOFF_MAX_S
        self.max_failures = START_MAX_FAILURES
        self.start_slots = START_SLOTS
        self._sessions: dict[str, _Session] = {}
        # Invariant: at most ``start_slots`` awaits of a backend's ``create`` run at once (the
        # gate is made at the first start, so a test may change ``start_slots`` before it).
        self._start_gate: asyncio.Semaphore | None = None

    # --- per-session state ------------------------------------------------------------------

    def snapshot_dir(self, session_id: str) -> Path:
        return snapshot_dir_for(self.paths, session_id)

    def keeper(self, session_id: str) -> NamespaceKeeper:
        return self._session(session_id).keeper

    def _session(self, session_id: str) -> _Session:
        state = self._sessions.get(session_id)
        if state is None:
            keeper = NamespaceKeeper(self.snapshot_dir(session_id), debounce_s=self.debounce_s)
            state = self._sessions[session_id] = _Session(keeper)
        return state

    def forget(self, session_id: str) -> None:
        """The session left memory (unloaded); a wake starts from a clean slate."""
        self._sessions.pop(session_id, None)

    def is_failed(self, session_id: str) -> bool:
        """The session's sandbox gave up starting (until the next prompt or a restart)."""
        state = self._sessions.get(session_id)
        return state is not None and state.failed

    def failure(self, session_id: str) -> dict[str, Any] | None:
        """``{failures, error}`` while the session's sandbox is marked failed, else None."""
        state = self._sessions.get(session_id)
        if state is None or not state.failed:
            return None
        return {"failures": state.failures, "error": state.last_error}

    # --- starting ---------------------------------------------------------------------------

    async def started(
        self, live: LiveSession, create: Awaitable[Sandbox], *, revive: bool = True
    ) -> Sandbox:
        """Await ``create`` (a new sandbox for ``live``) and keep it; count a failure.

        ``revive=False`` for an adopted sandbox: its kernel kept the namespace.
        """
        state = self._session(live.id)
        try:
            sandbox = await self._in_turn(create) if revive else await create
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._failed_start(live, state, exc) from exc
        state.failures = 0
        state.retry_at = 0.0
        keeper = state.keeper
        keeper.keep = lambda: live.state != "deleted"
        kept = KeptSandbox(sandbox, keeper)
        if revive:
            await keeper.revive(sandbox.run_silent, new_sandbox=True)
        else:
            await keeper.adopt(sandbox.run_silent)
        return kept

    async def _in_turn(self, create: Awaitable[Sandbox]) -> Sandbox:
        """Await ``create`` once one of the ``start_slots`` is free."""
        if self._start_gate is None:
            self._start_gate = asyncio.Semaphore(self.start_slots)
        try:
            await self._start_gate.acquire()
        except BaseException:
            if inspect.iscoroutine(create):
                create.close()  # never started: no "never awaited" warning
            raise
        try:
            return await create
        finally:
            self._start_gate.release()

    def _failed_start(self, live: LiveSession, state: _Session, exc: Exception) -> Exception:
        loop = asyncio.get_running_loop()
        state.failures += 1
        delay = min(self.backoff_base_s * 2 ** (state.failures - 1), self.backoff_max_s)
        state.retry_at = loop.time() + delay
        state.last_error = str(exc)
        log.warning("sandbox of %s did not start (%d in a row): %s", live.id, state.failures, exc)
        if state.failures >= self.max_failures:
            state.failed = True
            return SandboxStartError(
                f"{exc}; the sandbox failed to start {state.failures} times in a row, so it is "
                "marked failed: stop running cells; it is tried again at the next prompt"
            )
        return SandboxStartError(
            f"{exc} (failed start {state.failures} of {self.max_failures}; the next cell "
            f"tries again after {delay:g} s)"
        )

    async def task_for(
        self, live: LiveSession, start: Callable[[], Awaitable[Sandbox]]
    ) -> asyncio.Task[Sandbox]:
        """The session's sandbox task for the next cell: the current one, or a new start when
        the last start failed (after its backoff) or the sandbox was lost. Raises
        ``SandboxStartError`` while the sandbox is marked failed."""
        state = self._session(live.id)
        task = live.sandbox_task
        if task is not None and task.done() and _spent(task):
            live.sandbox_task = None
        if live.sandbox_task is None:
            if state.failed:
                raise SandboxStartError(
                    f"the sandbox is marked failed: it did not start {state.failures} times "
                    f"in a row (last error: {state.last_error}); it is tried again at the next "
                    "prompt"
                )
            wait = state.retry_at - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)  # the backoff; the cell waits for it
        return live.ensure_sandbox(start)

    async def restart(self, live: LiveSession, start: Callable[[], Awaitable[Sandbox]]) -> Sandbox:
        """Replace the session's sandbox: the current one stops (``KeptSandbox.stop`` takes the
        last snapshot when the namespace changed since the previous one), the failed mark and
        the backoff are cleared, and ``start`` makes the new one (revived from the snapshot;
        the model reads "This session got a new sandbox" and what came back). Returns the new
        sandbox once it is up; raises ``SandboxStartError`` when it does not start (counted
        like any failed start).

        The new start takes the session's sandbox slot at once, and it waits for the old
        sandbox to be gone first: a cell that comes meanwhile waits for the new sandbox, and
        never runs in the old one nor starts a third. A sandbox still starting is awaited, then
        stopped (a second restart meanwhile replaces the first one's sandbox in turn).
        """
        state = self._session(live.id)
        state.failed = False
        state.failures = 0
        state.retry_at = 0.0
        state.last_error = ""
        state.awaiting_revival = True  # a turn that starts meanwhile reads the revival first
        old = live.sandbox_task

        async def replace() -> Sandbox:
            if old is not None:  # shielded: the old sandbox stops even if this start is cancelled
                await asyncio.shield(_retire(old))
            return await start()

        task = live.sandbox_task = asyncio.ensure_future(replace())
        await asyncio.wait({task})  # not cancelled with the caller: the slot holds it now
        if task.cancelled():  # the session was unloaded or stopped meanwhile
            raise SandboxStartError("the sandbox restart was cancelled: the session was stopped")
        error = task.exception()
        if error is None:
            return task.result()
        if isinstance(error, SandboxStartError):
            raise error
        raise SandboxStartError(f"could not start the sandbox: {error}") from error

    # --- waking and turns -------------------------------------------------------------------

    def revive_on_load(self, live: LiveSession, start: Callable[[], Awaitable[Sandbox]]) -> bool:
        """A session loaded from the store: when it has a snapshot, start its sandbox now (the
        namespace is revived there) and return True; the first turn's note says what came
        back. False: no snapshot, the REPL starts empty."""
        state = self._session(live.id)
        if not state.keeper.has_snapshot():
            return False
        state.awaiting_revival = True
        live.ensure_sandbox(start)
        return True

    async def before_turn(self, live: LiveSession) -> None:
        """At the start of every turn (new input): a failed sandbox may be tried again, and a
        revival notice becomes a harness note the model reads before the input."""
        state = self._session(live.id)
        if state.failed:
            log.info("session %s: new input, its failed sandbox is tried again", live.id)
            state.failed = False
            state.failures = 0
            state.retry_at = 0.0
        task = live.sandbox_task
        if state.awaiting_revival and task is not None:
            state.awaiting_revival = False
            with contextlib.suppress(Exception):  # a failed start is retried at the next cell
                async with asyncio.timeout(REVIVAL_WAIT_S):
                    await asyncio.shield(task)
        notice = state.keeper.take_notice()
        if notice:
            live.notes.append(UserMessagePayload(text=NOTE_PREFIX + notice, source="harness"))

    # --- snapshots on demand ----------------------------------------------------------------

    async def snapshot_now(self, live: LiveSession) -> dict[str, Any] | None:
        """Snapshot the session's namespace now if its sandbox is up (idle unload, tests)."""
        task = live.sandbox_task
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        sandbox = task.result()
        if not isinstance(sandbox, KeptSandbox) or sandbox.lost:
            return None
        state = self._session(live.id)
        await state.keeper.cancel()
        return await state.keeper.save(sandbox)

    async def flush(self, live: LiveSession) -> None:
        """Snapshot when a cell ran since the last snapshot (before an unload)."""
        if self._session(live.id).keeper.dirty:
            await self.snapshot_now(live)

    async def flush_adopted(self, live: LiveSession) -> None:
        """Snapshot the namespace of a just-loaded session's adopted sandbox (intact, but no
        cell ran here to mark it changed) before it is unloaded unused."""
        task = live.sandbox_task
        if task is None:
            return
        with contextlib.suppress(Exception):  # a lost sandbox: nothing to save
            await asyncio.shield(task)
        await self.snapshot_now(live)


async def _retire(task: asyncio.Task[Sandbox]) -> None:
    """Stop the sandbox of ``task`` once its start has ended (a failed start left none)."""
    await asyncio.wait({task})
    if task.cancelled() or task.exception() is not None:
        return
    with contextlib.suppress(Exception):  # a sandbox that fails to stop is gone for us anyway
        await task.result().stop()


def _spent(task: asyncio.Task[Sandbox]) -> bool:
    """A finished sandbox task that is of no more use: its start failed, or it was lost."""
    if task.cancelled() or task.exception() is not None:
        return True
    sandbox = task.result()
    return isinstance(sandbox, KeptSandbox) and sandbox.lost
