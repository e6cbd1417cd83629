"""The long-horizon flags of a run (``--autonomous*``, ``--goal``, ``--goal-budget``;
docs/control.md), gathered once and handed either to an in-process run (``RunOptions``) or to
the daemon (``create_session``). Any ``--autonomous-*`` flag turns autonomous mode on, as in
the reference. The policy is validated here, so a bad value is one line before anything
starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.control.autonomous import AutonomousPolicy

__all__ = ["Controls", "controls_from_flags"]


@dataclass(frozen=True)
class Controls:
    autonomous: dict[str, Any] | None = None  # AutonomousSpec fields given (None: off)
    goal: dict[str, Any] | None = None  # {objective, token_budget?}

    def policy(self) -> AutonomousPolicy | None:
        if self.autonomous is None:
            return None
        from pydantic import ValidationError

        from orchestrator.control.autonomous import AutonomousPolicy

        try:
            return AutonomousPolicy.model_validate(self.autonomous)
        except ValidationError as exc:
            raise UserError(f"--autonomous: {exc.errors()[0]['msg']}") from None

    def goal_pair(self) -> tuple[str, int | None] | None:
        if self.goal is None:
            return None
        return str(self.goal["objective"]), self.goal.get("token_budget")


def controls_from_flags(
    autonomous: bool,
    gates: list[str] | None,
    max_turns: int | None,
    max_tokens: int | None,
    timeout_ms: int | None,
    goal: str | None,
    goal_budget: int | None,
) -> Controls:
    limits = {"max_turns": max_turns, "max_tokens": max_tokens, "timeout_ms": timeout_ms}
    given = {k: v for k, v in limits.items() if v is not None}
    spec: dict[str, Any] | None = None
    if autonomous or gates or given:
        spec = {"gates": list(gates or []), **given}
    if goal_budget is not None and goal is None:
        raise UserError("--goal-budget needs --goal OBJECTIVE")
    goal_spec: dict[str, Any] | None = None
    if goal is not None:
        if not goal.strip():
            raise UserError("--goal needs an objective")
        goal_spec = {"objective": goal.strip()}
        if goal_budget is not None:
            goal_spec["token_budget"] = goal_budget
    controls = Controls(spec, goal_spec)
    controls.policy()  # a bad value is one line now
    return controls
