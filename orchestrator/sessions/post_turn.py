"""Post-turn work: what runs after every turn (docs/design.md, "One turn, as data", step 5;
docs/control.md).

In this order:

1. the refiner's boundary work (planned refinements apply, measured outcomes come due);
2. the session's goal: while it is active, a continuation (or, at its budget, the wrap-up)
   goes back to the agent; a goal completed in this turn ends a goal run (``goal_complete``);
3. otherwise autonomous mode: gates run, and the agent is continued or the run stops with a
   typed reason.

A continuation is queued as a ``follow_up`` harness message before the driver looks at the
session's queue, so a continued session never looks idle in between (a print-mode run waiting
for quiet does not end early). Nothing continues while the session's descendants are still
working: their reports start its next turn, and the post-turn work runs again after it.

A run that stops (autonomous or goal) gets ``live.run_stop`` — what ``wait_quiet`` and print
mode turn into the exit code — and its descendants still working are cancelled first,
explicitly, with the final ``autonomous_stop`` event saying which. Each part's failure is
logged and stops only that part: the session's driver never dies of post-turn work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Final, Protocol, TypeVar

from orchestrator.agent.loop import TurnOutcome
from orchestrator.control.autonomous import (
    EXIT_CODES,
    AutonomousPolicy,
    Autonomy,
    Continue,
    Stop,
    StopReason,
)
from orchestrator.control.goals import Goals, start_text
from orchestrator.harness.refine import Refiner
from orchestrator.sessions.live import Inbound, LiveSession, RunStop
from orchestrator.sessions.session_target import SessionTarget
from orchestrator.store.events import AutonomousStopPayload, UserMessagePayload

__all__ = ["GOAL_BUDGET_STOP", "PostTurnHost", "after_turn"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# The stop reason of a goal run that ended at its token budget (after the wrap-up turn).
GOAL_BUDGET_STOP: Final[StopReason] = "token_limit"
GOAL_STOPS: Final[dict[str, StopReason]] = {
    "complete": "goal_complete",
    "budget_limited": GOAL_BUDGET_STOP,
}


class PostTurnHost(Protocol):
    """What the post-turn work needs from the orchestrator that runs the session
    (``Orchestrator``): the three controllers, the session as they see it, and its queue."""

    @property
    def refiner(self) -> Refiner: ...

    @property
    def goals(self) -> Goals: ...

    @property
    def autonomy(self) -> Autonomy: ...

    def session_target(self, live: LiveSession) -> SessionTarget: ...

    def submit(self, live: LiveSession, item: Inbound) -> str:
        """Queue input for ``live``; "delivered" (a turn starts now) or "queued"."""
        ...


async def _guarded(what: str, live: LiveSession, work: Awaitable[_T]) -> _T | None:
    try:
        return await work
    except Exception:
        log.exception("post-turn %s of %s failed", what, live.id)
        return None


def _continue(orch: PostTurnHost, live: LiveSession, text: str) -> None:
    message = UserMessagePayload(text=text, source="harness")
    orch.submit(live, Inbound(message, mode="follow_up"))


async def after_turn(orch: PostTurnHost, live: LiveSession, outcome: TurnOutcome) -> None:
    target = orch.session_target(live)
    await _guarded("refine", live, orch.refiner.at_boundary(target))
    text = await _guarded("goal", live, orch.goals.after_turn(target, outcome.reason))
    if text is not None:
        goal = await orch.goals.get(live.id)
        if goal is not None:
            live.goal_run = goal.id  # a goal run: it ends when this goal does
        _continue(orch, live, text)
        return
    if live.goal_run is not None and await _goal_end(orch, live, target, live.goal_run):
        return
    decision = await _guarded("autonomy", live, orch.autonomy.after_turn(target, outcome.reason))
    if isinstance(decision, Continue):
        if not target.children_working():
            _continue(orch, live, decision.text)
    elif isinstance(decision, Stop):
        live.run_stop = RunStop(decision.reason, decision.detail, decision.exit_code)


async def _goal_end(
    orch: PostTurnHost, live: LiveSession, target: SessionTarget, goal_id: str
) -> bool:
    """The goal this session was continued for continues no more: when it completed or hit
    its budget (after the wrap-up turn) the goal run ends, says so in its final event, and
    True is returned. A paused or waiting goal keeps the run (False)."""
    goal = await orch.goals.get(live.id)
    if goal is None or goal.id != goal_id or goal.status not in GOAL_STOPS:
        return goal is not None and goal.id == goal_id and goal.status != "cleared"
    live.goal_run = None
    reason = GOAL_STOPS[goal.status]
    children = await target.settle_children()
    await target.record(
        "autonomous_stop",
        AutonomousStopPayload(
            reason=reason,
            detail=f"goal {goal.id} {goal.status}",
            tokens=goal.tokens_used,
            children=children,
        ),
    )
    live.run_stop = RunStop(reason, f"goal {goal.status}", EXIT_CODES[reason])
    return True


async def begin_run(
    orch: PostTurnHost,
    live: LiveSession,
    *,
    autonomous: AutonomousPolicy | None = None,
    goal: tuple[str, int | None] | None = None,
) -> str | None:
    """Put a new session under long-horizon control before its first turn: autonomous mode
    (counters from zero) and/or a goal (``--goal``). Returns the goal's start text, for a run
    that has no task of its own to start with."""
    if autonomous is not None:
        await orch.autonomy.enable(live.id, autonomous)
    if goal is None:
        return None
    objective, budget = goal
    row = await orch.goals.create(orch.session_target(live), objective, budget, source="user")
    live.goal_run = row.id
    return start_text(row)


def first_input(live: LiveSession, task: str, goal_start: str | None) -> Inbound:
    """A run's first input: its task, with the goal's start text as a harness note before it;
    or, with no task, the goal's start text itself."""
    if not task.strip() and goal_start is not None:
        return Inbound(UserMessagePayload(text=goal_start, source="harness"))
    if goal_start is not None:
        live.notes.append(UserMessagePayload(text=goal_start, source="harness"))
    return Inbound(UserMessagePayload(text=task))
