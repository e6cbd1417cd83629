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

The scheduler sees the orchestrator as a ``TickHost`` (what delivering a tick needs) and
writes to the store it is given, never to the orchestrator's.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol

from orchestrator.control.scheduler import Scheduler
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.store.db import Store
from orchestrator.store.events import ScheduleTickPayload, UserMessagePayload
from orchestrator.store.schedules import DispatchRow, ScheduleRow

__all__ = [
    "HEARTBEAT_SOURCES",
    "TickHost",
    "deferred",
    "make_scheduler",
    "record_interrupted",
    "tick_text",
]

log = logging.getLogger(__name__)

HEARTBEAT_SOURCES: Final = frozenset({"heartbeat", "rlm_heartbeat"})
DEFERRING_ACTIVITIES: Final = frozenset({"cell", "compacting"})


class TickHost(Protocol):
    """What delivering a tick needs of the orchestrator (``Orchestrator``)."""

    def loaded(self, session_id: str) -> LiveSession | None:
        """The session when it is loaded, else None (never loads it)."""
        ...

    async def load_session_id(self, session_id: str) -> LiveSession:
        """The session, loaded (woken) from the store when it is not."""
        ...

    def submit(self, live: LiveSession, item: Inbound) -> str:
        """Queue input for ``live``; "delivered" (a turn starts now) or "queued"."""
        ...

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any:
        """Append an event to ``live``'s history."""
        ...


def tick_text(schedule: ScheduleRow) -> str:
    """What the session reads: the prompt, marked with where it came from."""
    kind = "heartbeat" if schedule.source in HEARTBEAT_SOURCES else "schedule"
    label = f" {schedule.label}" if schedule.label else ""
    return f"[{kind}{label}: {schedule.spec}] {schedule.prompt}"


def make_scheduler(orch: TickHost, store: Store) -> Scheduler:
    """The scheduler over ``store`` (its schedules and dispatches), delivering into ``orch``."""

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

    return Scheduler(store, deliver=deliver, defer=lambda sid: deferred(orch, sid))


def deferred(orch: TickHost, session_id: str) -> bool:
    """A tick for this session waits: it runs a cell or compacts its context right now."""
    live = orch.loaded(session_id)
    loop = live.loop if live is not None else None
    return loop is not None and loop.activity in DEFERRING_ACTIVITIES


async def record_interrupted(store: Store, rows: list[DispatchRow]) -> None:
    """A ``schedule_tick`` (interrupted) on each session whose claimed tick a crash left."""
    for row in rows:
        try:
            await store.append(
                row.session_id,
                "schedule_tick",
                ScheduleTickPayload(
                    schedule_id=row.schedule_id, dispatch_id=row.id, status="interrupted"
                ),
            )
        except Exception:
            log.exception("could not record the interrupted tick %s", row.id)
