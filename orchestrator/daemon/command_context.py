"""What a daemon command may use of the daemon that answers it (the seam below the handler).

``handler.py`` (``DaemonHandler``) dispatches each command to a function in one of the
``*_commands.py`` modules and passes it the daemon. Those modules see the daemon only as a
``CommandContext``: the orchestrator, the store, the settings, and the two things only a daemon
can do for a command (start a model's endpoint, choose a sandbox backend). ``DaemonControl``
(``handler.py``) extends this Protocol with what the handler itself needs (readiness, shutdown,
the socket), so the daemon that satisfies one satisfies both.

The orchestrator, too, is seen through a port: ``SessionControl`` lists the operations a
command may ask of it (``Orchestrator`` satisfies it). A command finds a loaded session with
``loaded`` / ``loaded_sessions`` and changes one only through a named operation
(``begin_goal_run``, ``start_autonomous_run``, ``take_pending``...): never through the
orchestrator's session table, its store or a ``LiveSession`` field. It may read what a session
shows (its record, state, queued-input count, last outcome). ``tests/unit/test_daemon_port.py``
fails on a command that reaches past the port.

Dependencies point one way: ``handler`` imports the command modules, the command modules import
this one, and none of them imports ``handler``.
"""

from __future__ import annotations

from typing import Any, Protocol

from orchestrator.control.autonomous import AutonomousPolicy, Autonomy
from orchestrator.control.goals import Goals
from orchestrator.control.scheduler import Scheduler
from orchestrator.harness.refine import Refiner
from orchestrator.models.registry import ResolvedModel
from orchestrator.sandbox.base import Sandbox
from orchestrator.sandbox.choice import BackendChoice
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.session_target import SessionTarget
from orchestrator.settings import Settings
from orchestrator.store.autonomy import AutonomyRow
from orchestrator.store.db import SessionRecord, Store

__all__ = ["CommandContext", "SessionControl"]


class SessionControl(Protocol):
    """The orchestrator as a daemon command sees it (``sessions.manager.Orchestrator``)."""

    # -- the controllers a command talks to (docs/control.md, docs/harness.md) --------------

    @property
    def goals(self) -> Goals: ...

    @property
    def autonomy(self) -> Autonomy: ...

    @property
    def refiner(self) -> Refiner: ...

    @property
    def scheduler(self) -> Scheduler | None:
        """The daemon's scheduler, once it runs (a change of a schedule pokes it)."""
        ...

    # -- finding, loading and unloading sessions -------------------------------------------

    def loaded(self, session_id: str) -> LiveSession | None:
        """The session when it is loaded, else None (never loads it)."""
        ...

    def loaded_sessions(self) -> list[LiveSession]:
        """Every loaded session (a copy: loads and unloads may follow)."""
        ...

    async def load_session_id(self, session_id: str) -> LiveSession:
        """The session, loaded from the store when it is not (``SessionNotLoadable``)."""
        ...

    async def unload(self, live: LiveSession, *, stop_later: bool = False) -> None:
        """Take a quiet session and its loaded descendants out of memory (``stop_later``:
        without waiting for their sandboxes to stop)."""
        ...

    async def rename(self, session_id: str, name: str) -> SessionRecord:
        """Give a session (loaded or not) its display name; its row as it is now."""
        ...

    # -- input --------------------------------------------------------------------------------

    def submit(self, live: LiveSession, item: Inbound) -> str:
        """Queue input for ``live``; "delivered" (a turn starts now) or "queued"."""
        ...

    def take_pending(self, live: LiveSession) -> list[Inbound]:
        """Take ``live``'s queued input out (an unloaded session's, to submit it again)."""
        ...

    # -- sandboxes ----------------------------------------------------------------------------

    async def sandbox_of(self, live: LiveSession) -> Sandbox:
        """``live``'s sandbox, started when it has none."""
        ...

    async def restart_sandbox(self, live: LiveSession) -> Sandbox:
        """A new sandbox for a loaded session, nothing else."""
        ...

    def sandbox_failure(self, session_id: str) -> dict[str, Any] | None:
        """``{failures, error}`` while the session's sandbox is marked failed, else None."""
        ...

    def forget_sandbox(self, session_id: str) -> None:
        """An unloaded session's next load starts its sandbox from a clean slate."""
        ...

    # -- long-horizon runs and the harness -------------------------------------------------

    def session_target(self, live: LiveSession) -> SessionTarget:
        """``live`` as the goal, autonomy and refine controllers see it."""
        ...

    def begin_goal_run(self, live: LiveSession, goal_id: str) -> None:
        """``live`` is continued for the goal ``goal_id`` from now on."""
        ...

    async def start_autonomous_run(self, session_id: str, policy: AutonomousPolicy) -> AutonomyRow:
        """Autonomous mode on: a new run (a loaded session's previous stop is forgotten)."""
        ...

    def harness_changed(self, owner: str) -> None:
        """Entries of ``owner`` changed: prompts built from them are rebuilt at next use."""
        ...


class CommandContext(Protocol):
    """The daemon as a command handler function sees it (``service.Daemon`` satisfies it)."""

    settings: Settings

    @property
    def orch(self) -> SessionControl: ...

    @property
    def store(self) -> Store: ...

    def settings_for_new_session(self) -> tuple[Settings, str | None]:
        """config.toml as it is now, for a new session; and a notice naming the sections that
        changed but apply only after a restart (``ConfigError``: the file no longer parses)."""
        ...

    async def endpoint_for(self, model: ResolvedModel) -> ResolvedModel:
        """The model with a live endpoint (starts the embedded model once, lazily)."""
        ...

    async def choose_backend(self, requested: str | None) -> BackendChoice:
        """auto / docker / bwrap / local for a new session (``UserError``: bad or unusable;
        ``local`` comes with its not-isolated warning for the reply)."""
        ...
