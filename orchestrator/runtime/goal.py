"""``goal``: an objective the harness keeps this session working on (in the kernel).

A goal is an objective and an optional token budget (docs/spec.md §3 "Long-horizon", §7;
docs/control.md). While it is active, after every turn the orchestrator sends a continuation
with the objective, its status and the budget left, until the goal is completed; at the budget
it sends one wrap-up instruction and continues no more. Only set a goal the user asked for.
Nothing here touches the database: each call is one host request, and the goal belongs to the
session whose NATS credentials made it.

Arguments are checked when a method is called, before anything is sent, with the host's limits
(mirrored below; ``tests/unit/test_runtime_goal.py`` pins them to
``orchestrator/control/goals.py``, which this module may not import). The host checks again.

Wire shapes (``args`` -> ``result``; a goal is the host's ``GoalRow.to_wire()``):

- ``goal.create``: ``{objective, token_budget?}`` -> ``{goal}``
- ``goal.get``: ``{}`` -> ``{goal}`` (null when the session never had one)
- ``goal.complete``: ``{}`` -> ``{goal, report}``
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.runtime.arguments import reject_unknown, require_text
from orchestrator.runtime.errors import InternalHostError, InvalidArgument
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_object, field_opt_str, field_str

__all__ = [
    "GOAL_STATUSES",
    "OBJECTIVE_MAX_CHARS",
    "TOKEN_BUDGET_MAX",
    "Goal",
    "GoalCompletion",
    "GoalRecord",
    "goal",
]

# Mirrors of orchestrator/control/goals.py and store/goals.py (pinned equal by a unit test).
OBJECTIVE_MAX_CHARS: Final = 4_000
TOKEN_BUDGET_MAX: Final = 10**12
GOAL_STATUSES: Final = ("active", "paused", "budget_limited", "complete", "cleared", "error")


# --- result types -----------------------------------------------------------------------------


def _opt_int(obj: Any, key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class GoalRecord:
    """The session's goal as the host stored it.

    ``status``: active, paused, budget_limited (the budget is spent: wrap up), complete,
    cleared or error. ``token_budget`` and ``tokens_remaining`` are None without a budget;
    ``continuations``: how many times the harness has re-prompted with it. Times are ISO-8601
    UTC strings. ``record`` keeps every field the host sent.
    """

    id: str
    objective: str
    status: str
    token_budget: int | None = None
    tokens_used: int = 0
    tokens_remaining: int | None = None
    continuations: int = 0
    last_reason: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    completed_at: str | None = None
    record: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def active(self) -> bool:
        return self.status == "active"

    @classmethod
    def from_wire(cls, value: object, where: str) -> GoalRecord:
        obj = as_object(value, where)
        return cls(
            id=field_str(obj, "id", where),
            objective=field_str(obj, "objective", where),
            status=field_str(obj, "status", where),
            token_budget=_opt_int(obj, "token_budget"),
            tokens_used=_opt_int(obj, "tokens_used") or 0,
            tokens_remaining=_opt_int(obj, "tokens_remaining"),
            continuations=_opt_int(obj, "continuations") or 0,
            last_reason=field_opt_str(obj, "last_reason"),
            created_at=field_opt_str(obj, "created_at"),
            updated_at=field_opt_str(obj, "updated_at"),
            completed_at=field_opt_str(obj, "completed_at"),
            record=dict(obj),
        )


@dataclass(frozen=True)
class GoalCompletion:
    """``goal.complete()``: the final budget report (what the cell shows) and the goal."""

    report: str
    goal: GoalRecord

    def __str__(self) -> str:
        return self.report

    def __repr__(self) -> str:
        return self.report


def _goal_of(obj: Any, where: str) -> GoalRecord:
    if "goal" not in obj:
        raise InternalHostError(f"the orchestrator's reply to {where} has no 'goal'")
    return GoalRecord.from_wire(obj["goal"], where)


# --- the goal object --------------------------------------------------------------------------


class Goal(HostBound):
    """This session's goal: the harness re-prompts after each turn until it is complete.

    - ``await goal.create(objective, token_budget=None)`` -> ``GoalRecord``; refused with
      ``Conflict`` while the session has a goal that is active, paused or budget_limited.
      Only create a goal the user asked for.
    - ``await goal.get()`` -> ``GoalRecord`` (the newest, any status) or None
    - ``await goal.complete()`` -> ``GoalCompletion`` (the final budget report): call it only
      when every requirement of the objective is met and verified.
    """

    def __repr__(self) -> str:
        return (
            "<goal: await goal.create(objective, token_budget=None) -> GoalRecord; "
            "await goal.get() -> GoalRecord | None; await goal.complete() -> GoalCompletion>"
        )

    def create(
        self, objective: str, token_budget: int | None = None, **unknown: Any
    ) -> Coroutine[Any, Any, GoalRecord]:
        """Start a goal: ``objective`` (at most 4,000 characters) and an optional budget of
        tokens (input + output of this session's model calls from now on)."""
        where = "goal.create"
        reject_unknown(where, unknown, ("objective", "token_budget"))
        text = require_text(where, "objective", objective).strip()
        if len(text) > OBJECTIVE_MAX_CHARS:
            raise InvalidArgument(
                f"{where}: objective is {len(text):,} characters; the limit is "
                f"{OBJECTIVE_MAX_CHARS:,}"
            )
        args: dict[str, Any] = {"objective": text}
        if token_budget is not None:
            if isinstance(token_budget, bool) or not isinstance(token_budget, int):
                raise TypeError(
                    f"{where}: token_budget must be an int, not {type(token_budget).__name__}"
                )
            if not 1 <= token_budget <= TOKEN_BUDGET_MAX:
                raise InvalidArgument(
                    f"{where}: token_budget must be between 1 and {TOKEN_BUDGET_MAX:,}, "
                    f"not {token_budget:,}"
                )
            args["token_budget"] = token_budget
        return self._create(args)

    async def _create(self, args: dict[str, Any]) -> GoalRecord:
        where = "goal.create"
        return _goal_of(as_object(await self._client().request(where, args), where), where)

    def get(self, **unknown: Any) -> Coroutine[Any, Any, GoalRecord | None]:
        """The session's newest goal (whatever its status), or None if it never had one."""
        reject_unknown("goal.get", unknown, ())
        return self._get()

    async def _get(self) -> GoalRecord | None:
        where = "goal.get"
        obj = as_object(await self._client().request(where, {}), where)
        return None if obj.get("goal") is None else _goal_of(obj, where)

    def complete(self, **unknown: Any) -> Coroutine[Any, Any, GoalCompletion]:
        """Mark the goal complete (only when every requirement is met and verified); the
        answer is the final budget report to give the user. ``NotFound`` without an open
        goal."""
        reject_unknown("goal.complete", unknown, ())
        return self._complete()

    async def _complete(self) -> GoalCompletion:
        where = "goal.complete"
        obj = as_object(await self._client().request(where, {}), where)
        return GoalCompletion(report=field_str(obj, "report", where), goal=_goal_of(obj, where))


goal = Goal()
