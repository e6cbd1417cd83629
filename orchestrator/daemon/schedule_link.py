"""The daemon's scheduler (docs/control.md): heartbeats and schedules put their prompts into
their sessions, waking them when they are inactive.

- **Deliver**: the session is loaded (woken) if needed and the prompt is submitted the way the
  schedule says (``steer`` into a running turn, ``follow_up`` after it), as a harness message
  for heartbeats and a user message for the user's own schedules; a ``schedule_tick`` event
  records it.
- **Defer** while the session runs a cell or compacts (``AgentLoop.activity``): a prompt then
  would interrupt nothing useful and could be lost in a compaction.
- **Crash**: a tick claimed by a daemon that died before delivering it is marked interrupted at
  the next start (and recorded on its session), never delivered again.
- **Idle unload** leaves a session with an active heartbeat loaded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from orchestrator.control.scheduler import Scheduler
from orchestrator.sessions.live import Inbound
from orchestrator.store.events import ScheduleTickPayload, UserMessagePayload
from orchestrator.store.schedules import DispatchRow, ScheduleRow

if TYPE_CHECKING:
    from orchestrator.sessions.manager import Orchestrator

__all__ = ["HEARTBEAT_SOURCES", "deferred", "make_scheduler", "record_interrupted", "tick_text"]

log = logging.getLogger(__name__)

HEARTBEAT_SOURCES: Final = frozenset({"heartbeat", "rlm_heartbeat"})
DEFERRING_ACTIVITIES: Final = frozenset({"cell", "compacting"})


def tick_text(schedule: ScheduleRow) -> str:
    """What the session reads: the prompt, marked with where it came from."""
    kind = "heartbeat" if schedule.source in HEARTBEAT_SOURCES else "schedule"
    label = f" {schedule.label}" if schedule.label else ""
    return f"[{kind}{label}: {schedule.spec}] {schedule.prompt}"


def make_scheduler(orch: Orchestrator) -> Scheduler:
    async def deliver(schedule: ScheduleRow, dispatch: DispatchRow) -> bool:
        live = await orch.load_session_id(schedule.session_id)
        source = "harness" if schedule.source in HEARTBEAT_SOURCES else "user"
        message = UserMessagePayload(text=tick_text(schedule), source=source)
        orch.submit(live, Inbound(message, mode=schedule.delivery))
        await orch.record(
            live,
            "schedule_tick",
            ScheduleTickPayload(
                schedule_id=schedule.id,
                dispatch_id=dispatch.id,
                status="delivered",
                label=schedule.label,
            ),
        )
        return True

    return Scheduler(orch.store, deliver=deliver, defer=lambda sid: deferred(orch, sid))


def deferred(orch: Orchestrator, session_id: str) -> bool:
    """A tick for this session waits: it runs a cell or compacts its context right now."""
    live = orch.sessions.get(session_id)
    loop = live.loop if live is not None else None
    return loop is not None and loop.activity in DEFERRING_ACTIVITIES


async def record_interrupted(orch: Orchestrator, rows: list[DispatchRow]) -> None:
    """A ``schedule_tick`` (interrupted) on each session whose claimed tick a crash left."""
    for row in rows:
        try:
            await orch.store.append(
                row.session_id,
                "schedule_tick",
                ScheduleTickPayload(
                    schedule_id=row.schedule_id, dispatch_id=row.id, status="interrupted"
                ),
            )
        except Exception:
            log.exception("could not record the interrupted tick %s", row.id)
