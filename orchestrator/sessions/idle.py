"""Idle unload (docs/spec.md §4): a loaded session that stays quiet is taken out of memory.

A session is *quiet* when it runs no turn, has no queued input and no client is attached to
it. When a session and every loaded descendant have been quiet for ``Settings.idle_unload_*``
(default ``IDLE_UNLOAD_MINUTES``, 30 min), the unloader snapshots their namespaces (while they
are still loaded), then ``Orchestrator.unload``s the subtree: sandboxes stop, NATS users go,
rows say ``inactive`` (a finished child keeps ``completed``, a failed one ``failed``). Any
prompt, message or attach loads it again (new sandbox, namespace revived, notice). A running
child keeps its whole ancestry loaded; a finished child is unloaded on its own and stays
addressable: a message wakes it.

A sandbox adopted after a daemon restart (``adoption.py``) whose session nobody loads is
unloaded the same way once it has waited as long (load, snapshot, unload): a crash does not
leave sandboxes running until the daemon stops.

There is no event for "nothing happened", so a sweep runs every ``IDLE_SWEEP_FRACTION`` of the
idle time (bounded by ``IDLE_SWEEP_MIN_S`` .. ``IDLE_SWEEP_MAX_S``) and compares each session's
(state, turns, queued input) with what it saw last: any change restarts its quiet clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.sandbox_records import AdoptedSandboxes
from orchestrator.sessions.supervisor import SandboxSupervisor

__all__ = [
    "IDLE_SWEEP_FRACTION",
    "IDLE_SWEEP_MAX_S",
    "IDLE_SWEEP_MIN_S",
    "UNLOADABLE_STATES",
    "IdleHost",
    "IdleUnloader",
]

log = logging.getLogger(__name__)

IDLE_SWEEP_FRACTION: Final = 0.25  # sweep period, as a fraction of the idle time
IDLE_SWEEP_MIN_S: Final = 0.05
IDLE_SWEEP_MAX_S: Final = 30.0
# States a session may be unloaded from (its descendants only need to be quiet).
UNLOADABLE_STATES: Final = frozenset({"idle", "completed", "failed"})

_Mark = tuple[str, int, int]  # (state, turns, queued input)


class IdleHost(Protocol):
    """What the unloader needs from the orchestrator whose sessions it watches
    (``Orchestrator``): the loaded sessions, their sandboxes, and load / unload / submit."""

    @property
    def sessions(self) -> Mapping[str, LiveSession]: ...

    @property
    def adopted(self) -> AdoptedSandboxes:
        """Sandboxes adopted after a restart whose session is not loaded yet."""
        ...

    @property
    def sandboxes(self) -> SandboxSupervisor:
        """Namespace snapshots of the loaded sessions' sandboxes."""
        ...

    async def load_session_id(self, session_id: str) -> LiveSession: ...

    async def unload(self, live: LiveSession) -> None:
        """Take a quiet session and its loaded descendants out of memory."""
        ...

    def submit(self, live: LiveSession, item: Inbound) -> str: ...


class IdleUnloader:
    """The sweep task of one orchestrator. ``attached(session_id)`` says whether a client is
    attached (the daemon sets it; without it only activity counts)."""

    def __init__(self, orch: IdleHost, *, after_s: float | None):
        self.orch = orch
        self.after_s = after_s
        self.attached: Callable[[str], bool] = lambda _session_id: False
        self.unloaded = 0  # sessions unloaded so far (statistics, tests)
        self._seen: dict[str, tuple[_Mark, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self.start()

    @property
    def period_s(self) -> float:
        after = self.after_s or IDLE_SWEEP_MAX_S
        return min(IDLE_SWEEP_MAX_S, max(IDLE_SWEEP_MIN_S, after * IDLE_SWEEP_FRACTION))

    def start(self) -> None:
        """Begin sweeping (a no-op without an idle time or outside an event loop)."""
        if self.after_s is None or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._run(), name="idle-unload")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.sweep()
            except Exception:  # one bad sweep must not end idle unloading for good
                log.exception("idle sweep failed")

    # --- the sweep --------------------------------------------------------------------------

    def _busy(self, live: LiveSession) -> bool:
        return live.state == "running" or live.pending > 0 or self.attached(live.id)

    def _quiet_since(self, live: LiveSession, now: float) -> float | None:
        """When the session's current quiet stretch began; None while it is busy."""
        mark: _Mark = (live.state, live.turns, live.pending)
        seen = self._seen.get(live.id)
        if self._busy(live) or seen is None or seen[0] != mark:
            self._seen[live.id] = (mark, now)
        return None if self._busy(live) else self._seen[live.id][1]

    def _unchanged(self, live: LiveSession) -> bool:
        seen = self._seen.get(live.id)
        mark: _Mark = (live.state, live.turns, live.pending)
        return seen is not None and seen[0] == mark and not self._busy(live)

    def _subtree(self, live: LiveSession) -> list[LiveSession]:
        out = [live]
        for session in list(self.orch.sessions.values()):
            if session.record.parent_id == live.id:
                out += self._subtree(session)
        return out

    async def sweep(self, now: float | None = None) -> list[str]:
        """Unload every session whose subtree has been quiet long enough; returns their ids.
        ``now``: a ``time.monotonic()`` value (tests move the clock)."""
        if self.after_s is None:
            return []
        now = time.monotonic() if now is None else now
        sessions = list(self.orch.sessions.values())
        since = {s.id: self._quiet_since(s, now) for s in sessions}
        for gone in set(self._seen) - set(since):
            del self._seen[gone]

        def ripe(session: LiveSession) -> bool:
            stretch = since.get(session.id)
            return stretch is not None and now - stretch >= (self.after_s or 0.0)

        unloaded: list[str] = []
        for live in sorted(sessions, key=lambda s: s.record.depth):  # ancestors first
            if self.orch.sessions.get(live.id) is not live or live.state not in UNLOADABLE_STATES:
                continue
            if all(ripe(s) for s in self._subtree(live)) and await self._unload(live):
                unloaded.append(live.id)
        return unloaded + await self._unload_adopted(now - (self.after_s or 0.0))

    async def _unload_adopted(self, before: float) -> list[str]:
        """A sandbox adopted after a daemon restart whose session nobody has loaded since
        ``before`` is treated like a quiet loaded session: loaded (taking the sandbox, its
        namespace intact), snapshotted and unloaded. Otherwise it would live until the daemon
        stops. A session that cannot be loaded any more just has its sandbox stopped."""
        unloaded: list[str] = []
        for session_id in self.orch.adopted.waiting_since(before):
            try:
                live = await self.orch.load_session_id(session_id)
            except Exception as exc:  # e.g. its model is no longer configured
                log.warning("stopping the adopted sandbox of %s: %s", session_id, exc)
                await self.orch.adopted.discard(session_id)
                continue
            # With work now, or subagents loaded below it, the sweep watches it like any loaded
            # session (an unload would take the subagents along unsnapshotted).
            if self._busy(live) or live.state not in UNLOADABLE_STATES or self._subtree(live)[1:]:
                continue
            await self.orch.sandboxes.flush_adopted(live)
            if self.orch.sessions.get(live.id) is live and not self._busy(live):
                await self.orch.unload(live)
                log.info("unloaded %s: its adopted sandbox waited without use", session_id)
                await self._after_unload([live])
                unloaded.append(session_id)
        return unloaded

    async def _unload(self, live: LiveSession) -> bool:
        tree = self._subtree(live)
        # Snapshot while everything is still loaded (a message arriving now still finds the
        # session and simply makes it busy again); the unload that follows is quick.
        for session in tree:
            await self.orch.sandboxes.flush(session)
        if self.orch.sessions.get(live.id) is not live or not all(map(self._unchanged, tree)):
            return False  # woke up while we were snapshotting
        idle_s = time.monotonic() - self._seen[live.id][1]
        await self.orch.unload(live)
        log.info(
            "unloaded %s (and %d descendants) after %.0f s idle", live.id, len(tree) - 1, idle_s
        )
        await self._after_unload(tree)
        return True

    async def _after_unload(self, tree: list[LiveSession]) -> None:
        self.unloaded += len(tree)
        for session in tree:
            self._seen.pop(session.id, None)
            self.orch.sandboxes.forget(session.id)
            await self._rescue(session)

    async def _rescue(self, session: LiveSession) -> None:
        """Input queued on a session while it was being unloaded would be lost with the
        object: load the session again and hand the input over."""
        leftover = session.take_pending()
        if not leftover:
            return
        with contextlib.suppress(Exception):
            fresh = await self.orch.load_session_id(session.id)
            for item in leftover:
                self.orch.submit(fresh, item)
            log.info("session %s woke up while it was unloaded; input handed over", session.id)
