"""Host requests ``goal.*`` from kernels (docs/spec.md §3 "Long-horizon", docs/control.md).

The kernel's ``goal`` (``orchestrator/runtime/goal.py``) is thin: the rules live in
``orchestrator/control/goals.py``. The goal belongs to the session whose NATS subject the
request came on (never a payload field), so a child's ``goal.create()`` sets the child's own
goal. Goals go to ``orch.goals`` with the caller as a ``GoalTarget``
(``orch.session_target(live)``); an orchestrator built without them answers ``unknown_request``.

Wire shapes (``args`` -> ``result``; a goal is ``GoalRow.to_wire()``):

- ``goal.create``: ``{objective, token_budget?}`` -> ``{goal}``
- ``goal.get``: ``{}`` -> ``{goal}`` (the newest goal, any status; null if none)
- ``goal.complete``: ``{}`` -> ``{goal, report}`` (the final budget report)

A refused request (a goal is already open, there is none, a bad objective or budget) is a
``GoalError`` whose ``code`` passes to the kernel unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol, cast

from orchestrator.bus.request_args import RequestArgs, parse_args
from orchestrator.bus.router import HostRequestError
from orchestrator.control.goals import Goals, GoalTarget
from orchestrator.errors import GoalError

__all__ = ["AGENT_SOURCE", "GOALS_DISABLED", "GoalCaller", "GoalHost", "GoalService"]

# The source of every goal change made through these requests (the CLI's are "user").
AGENT_SOURCE: Final = "agent"
GOALS_DISABLED: Final = "goals are not enabled here"

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


class CreateArgs(RequestArgs):
    # Bounds (trimmed length, budget range) are checked by ``control.goals`` with its messages.
    objective: str
    token_budget: int | None = None


class _NoArgs(RequestArgs):
    pass


class GoalCaller(Protocol):
    """What the handlers read of the live session a request came from (a ``LiveSession``)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...


class GoalHost(Protocol):
    """What the handlers need of the orchestrator: its live sessions by id.

    ``goals`` and ``session_target`` are optional hooks, looked up when a request needs them:
    an orchestrator without them answers ``unknown_request`` (``GOALS_DISABLED``).
    """

    @property
    def sessions(self) -> Mapping[str, GoalCaller]: ...


def _refused(exc: GoalError) -> HostRequestError:
    return HostRequestError(exc.code, str(exc))


class GoalService:
    """The ``goal.*`` handlers over an ``Orchestrator`` (``.goals``, ``.session_target``)."""

    def __init__(self, orch: GoalHost):
        self.orch = orch

    def handlers(self) -> dict[str, Handler]:
        return {
            "goal.create": self.create,
            "goal.get": self.get,
            "goal.complete": self.complete,
        }

    # -- helpers ----------------------------------------------------------------------------

    def _live(self, session_id: str) -> GoalCaller:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted":
            raise HostRequestError("not_found", f"session {session_id} is not live here")
        return live

    def _goals(self) -> Goals:
        goals = getattr(self.orch, "goals", None)
        if goals is None:
            raise HostRequestError("unknown_request", GOALS_DISABLED)
        return cast(Goals, goals)

    def _target(self, live: GoalCaller) -> GoalTarget:
        make_target = getattr(self.orch, "session_target", None)
        if make_target is None:
            raise HostRequestError("unknown_request", GOALS_DISABLED)
        target: GoalTarget = make_target(live)
        return target

    # -- handlers ---------------------------------------------------------------------------

    async def create(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._live(caller)
        a = parse_args(CreateArgs, "goal.create", args)
        goals = self._goals()
        try:
            row = await goals.create(
                self._target(live), a.objective, a.token_budget, source=AGENT_SOURCE
            )
        except GoalError as exc:
            raise _refused(exc) from None
        return {"goal": row.to_wire()}

    async def get(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._live(caller)
        parse_args(_NoArgs, "goal.get", args)
        row = await self._goals().get(live.id)
        return {"goal": None if row is None else row.to_wire()}

    async def complete(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._live(caller)
        parse_args(_NoArgs, "goal.complete", args)
        goals = self._goals()
        try:
            row, report = await goals.complete_goal(self._target(live), source=AGENT_SOURCE)
        except GoalError as exc:
            raise _refused(exc) from None
        return {"goal": row.to_wire(), "report": report}
