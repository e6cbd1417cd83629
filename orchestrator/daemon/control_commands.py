"""The daemon's answers to the long-horizon commands (docs/control.md): ``schedule_add``,
``schedule_list``, ``schedule_cancel``, ``heartbeat`` and ``goal``.

Each is a thin call into ``orchestrator/control`` (the same code the kernel's ``goal`` and
``rlm_heartbeat`` requests use), with the user as the source. A refused request (a bad spec, a
goal already open, an unknown schedule) is a one-line ``invalid_argument`` / ``not_found`` /
``conflict`` error; a change wakes the scheduler at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import (
    E_CONFLICT,
    E_INVALID_ARGUMENT,
    E_NOT_FOUND,
    Goal,
    Heartbeat,
    JsonObject,
    ScheduleAdd,
    ScheduleCancel,
    ScheduleList,
)
from orchestrator.control import schedule_service
from orchestrator.control.goals import start_text
from orchestrator.control.timespec import HEARTBEAT_COMMAND
from orchestrator.errors import UserError
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.store.db import SessionRecord
from orchestrator.store.events import UserMessagePayload
from orchestrator.store.goals import GoalRow

if TYPE_CHECKING:
    from orchestrator.daemon.handler import DaemonControl
    from orchestrator.sessions.manager import Orchestrator

__all__ = ["goal", "heartbeat", "schedule_add", "schedule_cancel", "schedule_list"]

_CODES: Final = {"not_found": E_NOT_FOUND, "conflict": E_CONFLICT}


def _refused(exc: UserError) -> ApiCommandError:
    code = _CODES.get(str(getattr(exc, "code", "")), E_INVALID_ARGUMENT)
    return ApiCommandError(code, str(exc))


def _poke(daemon: DaemonControl) -> None:
    scheduler = daemon.orch.scheduler
    if scheduler is not None:
        scheduler.poke()


async def schedule_add(
    daemon: DaemonControl, rec: SessionRecord, command: ScheduleAdd
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
    daemon: DaemonControl, rec: SessionRecord | None, command: ScheduleList
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


async def schedule_cancel(daemon: DaemonControl, command: ScheduleCancel) -> JsonObject:
    try:
        row = await schedule_service.cancel_schedule(
            daemon.store, command.id, poke=lambda: _poke(daemon)
        )
    except UserError as exc:
        raise _refused(exc) from None
    return {"schedule": row.to_wire(), "line": schedule_service.describe(row)}


async def heartbeat(daemon: DaemonControl, rec: SessionRecord, command: Heartbeat) -> JsonObject:
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


async def goal(daemon: DaemonControl, live: LiveSession, command: Goal) -> JsonObject:
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
                live.goal_run = row.id
                _start(orch, live, row)
            case "pause":
                row = await orch.goals.pause(target)
            case "resume":
                row = await orch.goals.resume(target)
                if row.status == "active" and not _busy(live):
                    live.goal_run = row.id
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
    return live.state == "running" or bool(live.follow) or bool(live.steer)


def _start(orch: Orchestrator, live: LiveSession, row: GoalRow) -> None:
    """A goal set or resumed on a quiet session starts its turn now (a busy one continues
    at its next turn boundary)."""
    if _busy(live):
        return
    orch.submit(live, Inbound(UserMessagePayload(text=start_text(row), source="harness")))
