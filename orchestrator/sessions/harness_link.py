"""A live session as the ``Refiner`` sees it (``RefineTarget``, docs/harness.md).

The planning call uses the session's current model through its own ``ModelClient`` (so a
model switch applies to refine too) and its usage is recorded on the session like any other
model call: a refinement's tokens and cost show in ``usage`` and roll up the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.models.client import ModelReply
from orchestrator.sessions.live import LiveSession

if TYPE_CHECKING:
    from orchestrator.sessions.manager import Orchestrator

__all__ = ["SessionRefineTarget"]


class SessionRefineTarget:
    def __init__(self, orch: Orchestrator, live: LiveSession, changed: Callable[[str], None]):
        self._orch = orch
        self._live = live
        self._changed = changed

    @property
    def session_id(self) -> str:
        return self._live.id

    @property
    def root_id(self) -> str:
        return self._live.record.root_id

    @property
    def refine_enabled(self) -> bool:
        return self._live.record.refine_enabled

    def busy(self) -> bool:
        loop = self._live.loop
        return self._live.state == "running" or (loop is not None and loop.busy)

    async def complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        loop = self._live.loop
        if loop is None:
            raise RuntimeError(f"session {self._live.id} is not loaded")
        return await loop.client.complete(messages)

    async def record(self, type_: str, payload: Any) -> Any:
        return await self._orch.record(self._live, type_, payload)

    def harness_changed(self) -> None:
        self._changed(self._live.record.root_id)
