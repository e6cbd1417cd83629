"""The daemon's answers to the long-horizon commands (docs/control.md): ``schedule_add``,
``schedule_list``, ``schedule_cancel``, ``heartbeat``, ``goal`` and ``autonomous``.

Each is a thin call into ``orchestrator/control`` (the same code the kernel's ``goal`` and
``rlm_heartbeat`` requests use), with the user as the source. A refused request (a bad spec, a
goal already open, an unknown schedule) is a one-line ``invalid_argument`` / ``not_found`` /
``conflict`` error; a change wakes the scheduler at once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import (
    Autonomous,
    Goal,
    Heartbeat,
    JsonObject,
    ScheduleAdd,
    ScheduleCancel,
    ScheduleList,
)
from orchestrator.api.wire import E_BUSY, E_CONFLICT, E_INVALID_ARGUMENT, E_NOT_FOUND
from orchestrator.control import schedule_service
from orchestrator.control.autonomous import AutonomousPolicy
from orchestrator.control.goals import start_text
from orchestrator.daemon.command_context import CommandContext, SessionControl
from orchestrator.errors import UserError
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import TERMINAL_STATES
from orchestrator.store.autonomy import AutonomyRow
from orchestrator.store.db import SessionRecord
from orchestrator.store.events import UserMessagePayload
from orchestrator.store.goals import GoalRow
from orchestrator.store.queries import utcnow
from orchestrator.store.timespec import HEARTBEAT_COMMAND

__all__ = [
    "autonomous",
    "autonomous_state",
    "goal",
    "heartbeat",
    "schedule_add",
    "schedule_cancel",
    "schedule_list",
]

_CODES: Final = {"not_found": E_NOT_FOUND, "conflict": E_CONFLICT}
# Statuses in which a session takes no more turns: autonomous mode cannot be turned on there.
_ENDED: Final = TERMINAL_STATES
_POLICY_FIELDS: Final = ("gates", "max_turns", "max_tokens", "timeout_ms")
ELAPSED_DECIMALS: Final = 3


def _refused(exc: UserError) -> ApiCommandError:
    code = _CODES.get(str(getattr(exc, "code", "")), E_INVALID_ARGUMENT)
    return ApiCommandError(code, str(exc))


def _poke(daemon: CommandContext) -> None:
    scheduler = daemon.orch.scheduler
    if scheduler is not None:
        scheduler.poke()


async def schedule_add(
    daemon: CommandContext, rec: SessionRecord, command: ScheduleAdd
) -> JsonObject:
    try:
        row = await schedule_service.add_schedule(
            daemon.store,
            rec.id,
            command.spec,
            command.prompt,
            label=command.label,
            delivery=command.delivery,
            poke=lambda: _poke(daemon),
        )
    except UserError as exc:
        raise _refused(exc) from None
    return {"schedule": row.to_wire(), "line": schedule_service.describe(row)}


async def schedule_list(
    daemon: CommandContext, rec: SessionRecord | None, command: ScheduleList
) -> JsonObject:
    rows = await schedule_service.list_schedules(
        daemon.store,
        session_id=rec.id if rec is not None else None,
        include_inactive=command.include_inactive,
    )
    return {
        "schedules": [row.to_wire() for row in rows],
        "lines": [schedule_service.describe(row) for row in rows],
    }


async def schedule_cancel(daemon: CommandContext, command: ScheduleCancel) -> JsonObject:
    try:
        row = await schedule_service.cancel_schedule(
            daemon.store, command.id, poke=lambda: _poke(daemon)
        )
    except UserError as exc:
        raise _refused(exc) from None
    return {"schedule": row.to_wire(), "line": schedule_service.describe(row)}


async def heartbeat(daemon: CommandContext, rec: SessionRecord, command: Heartbeat) -> JsonObject:
    try:
        result = await schedule_service.heartbeat_command(
            daemon.store,
            rec.id,
            f"{HEARTBEAT_COMMAND} {command.text}",
            poke=lambda: _poke(daemon),
        )
    except UserError as exc:
        raise _refused(exc) from None
    schedule = result.schedule.to_wire() if result.schedule is not None else None
    return {"action": result.action, "schedule": schedule, "message": result.message}


async def goal(daemon: CommandContext, live: LiveSession, command: Goal) -> JsonObject:
    orch = daemon.orch
    target = orch.session_target(live)
    try:
        match command.action:
            case "set":
                if not command.objective:
                    raise UserError("say the objective: /goal OBJECTIVE")
                row = await orch.goals.create(
                    target, command.objective, command.token_budget, source="user"
                )
                orch.begin_goal_run(live, row.id)
                _start(orch, live, row)
            case "pause":
                row = await orch.goals.pause(target)
            case "resume":
                row = await orch.goals.resume(target)
                if row.status == "active" and not _busy(live):
                    orch.begin_goal_run(live, row.id)
                    _start(orch, live, row)
            case "clear":
                row = await orch.goals.clear(target)
            case _:
                found = await orch.goals.get(live.id)
                return {"session": live.id, "goal": found.to_wire() if found else None}
    except UserError as exc:
        raise _refused(exc) from None
    return {"session": live.id, "goal": row.to_wire()}


def _busy(live: LiveSession) -> bool:
    return live.state == "running" or live.pending > 0


def _start(orch: SessionControl, live: LiveSession, row: GoalRow) -> None:
    """A goal set or resumed on a quiet session starts its turn now (a busy one continues
    at its next turn boundary)."""
    if _busy(live):
        return
    orch.submit(live, Inbound(UserMessagePayload(text=start_text(row), source="harness")))


def autonomous_state(row: AutonomyRow | None, now: datetime) -> JsonObject:
    """A session's autonomous mode as ``autonomous`` answers it: ``mode`` is ``on`` while a
    run is enabled and has not stopped; the counters, limits and gates of its last run (none:
    zeros and nulls)."""
    if row is None:
        return {
            "mode": "off",
            "turns": 0,
            "tokens": 0,
            "continuations": 0,
            "elapsed_s": None,
            "limits": None,
            "gates": [],
            "started_at": None,
            "stop_reason": None,
            "stop_detail": None,
        }
    policy = AutonomousPolicy.model_validate(row.policy)
    # A stopped run's clock stopped with it; one turned off, when it was turned off.
    until = row.stopped_at or (row.updated_at if not row.enabled else now)
    return {
        "mode": "on" if row.enabled and not row.stopped else "off",
        "turns": row.turns_used,
        "tokens": row.tokens_used,
        "continuations": row.continuations_used,
        "elapsed_s": round(max(0.0, (until - row.started_at).total_seconds()), ELAPSED_DECIMALS),
        "limits": {
            "max_turns": policy.max_turns,
            "max_tokens": policy.max_tokens,
            "timeout_ms": policy.timeout_ms,
        },
        "gates": list(policy.gates),
        "started_at": row.started_at.isoformat(),
        "stop_reason": row.stop_reason,
        "stop_detail": row.stop_detail,
    }


async def autonomous(daemon: CommandContext, rec: SessionRecord, command: Autonomous) -> JsonObject:
    """``/autonomous on|off|status`` for an existing session (docs/control.md): ``on`` starts a
    run with the limits and gates given (the rest the defaults; counters from zero), counted
    from the session's next turn; ``off`` ends it (its counters stay readable)."""
    orch = daemon.orch
    given: dict[str, Any] = {
        name: value for name in _POLICY_FIELDS if (value := getattr(command, name)) is not None
    }
    if given and command.action != "on":
        raise ApiCommandError(
            E_INVALID_ARGUMENT, f"{', '.join(given)} only go with action on, not {command.action}"
        )
    live = orch.loaded(rec.id)
    row: AutonomyRow | None
    if command.action == "on":
        status = live.state if live is not None else rec.status
        if status in _ENDED:
            raise ApiCommandError(E_BUSY, f"session {rec.id} is {status} and takes no turns")
        try:
            policy = AutonomousPolicy.model_validate(given)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"]
            raise ApiCommandError(E_INVALID_ARGUMENT, f"autonomous: {message}") from None
        row = await orch.start_autonomous_run(rec.id, policy)  # the previous stop is history
    elif command.action == "off":
        row = await orch.autonomy.disable(rec.id)
    else:
        row = await orch.autonomy.get(rec.id)
    return {"session": rec.id, "autonomous": autonomous_state(row, utcnow())}
