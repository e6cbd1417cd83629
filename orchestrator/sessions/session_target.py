"""A live session as the post-turn controllers see it: the ``RefineTarget`` of the Refiner, the
``GoalTarget`` of goals and the ``AutonomyTarget`` of autonomous mode (docs/harness.md,
docs/control.md).

The planning call of a refinement uses the session's current model through its own
``ModelClient`` (so a model switch applies to refine too) and its usage is recorded on the
session like any other model call: a refinement's tokens and cost show in ``usage`` and roll
up the tree. Gates run in the session's own sandbox (started when it has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from orchestrator.models.client import ModelReply
from orchestrator.sandbox.base import Sandbox
from orchestrator.sessions.live import LiveSession
from orchestrator.store.harness_entry import GLOBAL_OWNER
from orchestrator.store.lifecycle import StopState

__all__ = ["SessionHost", "SessionTarget", "descendants"]


class SessionHost(Protocol):
    """What a ``SessionTarget`` needs from the orchestrator that owns its session
    (``Orchestrator``): the loaded sessions, and the few operations a controller may ask for."""

    @property
    def sessions(self) -> Mapping[str, LiveSession]: ...

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any:
        """Append an event to ``live``'s history; the stored record comes back."""
        ...

    def harness_changed(self, owner: str) -> None:
        """Entries of ``owner`` changed: prompts built from them are rebuilt at next use."""
        ...

    async def sandbox_of(self, live: LiveSession) -> Sandbox:
        """``live``'s sandbox, started when it has none."""
        ...

    async def stop_session(self, live: LiveSession, *, state: StopState = ...) -> None:
        """Cancel ``live`` and its descendants (cascade)."""
        ...


def descendants(sessions: Mapping[str, LiveSession], session_id: str) -> list[LiveSession]:
    """The loaded sessions below ``session_id`` (through loaded parents)."""
    found: list[LiveSession] = []
    for other in sessions.values():
        parent = other.record.parent_id
        while parent is not None and parent != session_id:
            above = sessions.get(parent)
            parent = above.record.parent_id if above is not None else None
        if parent == session_id:
            found.append(other)
    return found


class SessionTarget:
    def __init__(self, orch: SessionHost, live: LiveSession):
        self._orch = orch
        self.live = live

    @property
    def session_id(self) -> str:
        return self.live.id

    @property
    def root_id(self) -> str:
        return self.live.record.root_id

    @property
    def refine_enabled(self) -> bool:
        return self.live.record.refine_enabled

    @property
    def cwd(self) -> str:
        return self.live.record.cwd

    def busy(self) -> bool:
        loop = self.live.loop
        return self.live.state == "running" or (loop is not None and loop.busy)

    def children_working(self) -> bool:
        """A descendant is in a turn or has input waiting: its report will wake this one."""
        return any(
            d.state == "running" or d.follow or d.steer
            for d in descendants(self._orch.sessions, self.live.id)
        )

    async def complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        loop = self.live.loop
        if loop is None:
            raise RuntimeError(f"session {self.live.id} is not loaded")
        return await loop.client.complete(messages)

    async def record(self, type_: str, payload: Any) -> Any:
        return await self._orch.record(self.live, type_, payload)

    def harness_changed(self) -> None:
        self._orch.harness_changed(self.live.record.root_id)
        self._orch.harness_changed(GLOBAL_OWNER)

    async def sandbox(self) -> Sandbox:
        return await self._orch.sandbox_of(self.live)

    def workspace_dir(self) -> Path | None:
        path = Path(self.live.record.cwd)
        return path if path.is_dir() else None

    async def settle_children(self) -> dict[str, str]:
        """Before a run ends: its descendants still working are cancelled (their history
        kept), explicitly; the answer says which (id -> "cancelled"). Those already quiet
        are left as they are."""
        settled: dict[str, str] = {}
        for child in descendants(self._orch.sessions, self.live.id):
            if child.record.parent_id != self.live.id:
                continue  # a grandchild goes with its parent (cascade)
            if child.state == "running" or child.follow or child.steer:
                await self._orch.stop_session(child, state="aborted")
                settled[child.id] = "cancelled"
        return settled
