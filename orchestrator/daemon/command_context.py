"""What a daemon command may use of the daemon that answers it (the seam below the handler).

``handler.py`` (``DaemonHandler``) dispatches each command to a function in one of the
``*_commands.py`` modules and passes it the daemon. Those modules see the daemon only as a
``CommandContext``: the orchestrator, the store, the settings, and the two things only a daemon
can do for a command (start a model's endpoint, choose a sandbox backend). ``DaemonControl``
(``handler.py``) extends this Protocol with what the handler itself needs (readiness, shutdown,
the socket), so the daemon that satisfies one satisfies both.

Dependencies point one way: ``handler`` imports the command modules, the command modules import
this one, and none of them imports ``handler``.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.models.registry import ResolvedModel
from orchestrator.sandbox.choice import BackendChoice
from orchestrator.sessions.manager import Orchestrator
from orchestrator.settings import Settings
from orchestrator.store.db import Store

__all__ = ["CommandContext"]


class CommandContext(Protocol):
    """The daemon as a command handler function sees it (``service.Daemon`` satisfies it)."""

    settings: Settings

    @property
    def orch(self) -> Orchestrator: ...

    @property
    def store(self) -> Store: ...

    async def endpoint_for(self, model: ResolvedModel) -> ResolvedModel:
        """The model with a live endpoint (starts the embedded model once, lazily)."""
        ...

    async def choose_backend(self, requested: str | None) -> BackendChoice:
        """auto / docker / bwrap / local for a new session (``UserError``: bad or unusable;
        ``local`` comes with its not-isolated warning for the reply)."""
        ...
