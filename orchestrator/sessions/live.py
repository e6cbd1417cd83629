"""One live session inside the orchestrator: its loop, inbox, sandbox and driver task.

The driver is the only code that runs turns for a session, one at a time. Input arrives on
two queues: *steer* messages are injected at the next model call of the running turn (the loop
asks through ``LoopHooks``); *follow-up* inputs start the next turn once the current one ends.
A message that arrives while a turn is finishing would otherwise be stranded in the steer
queue, so the driver moves leftovers to the front of the follow-up queue after each turn.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.agent.loop import AgentLoop, TurnOutcome
from orchestrator.models.registry import ResolvedModel
from orchestrator.sandbox.base import Sandbox, SandboxSpec
from orchestrator.store.db import SessionRecord
from orchestrator.store.events import UserMessagePayload

__all__ = ["Inbound", "LiveSession", "child_id_for"]

SessionState = Literal["running", "idle", "completed", "error", "aborted", "deleted"]


def child_id_for(session_id: str) -> str:
    """The short id a parent's model sees for a child (stable: derived from the session id)."""
    return "sub-" + session_id.removeprefix("s-")[:8]


@dataclass
class Inbound:
    payload: UserMessagePayload
    mode: Literal["steer", "follow_up"] = "follow_up"


@dataclass
class LiveSession:
    record: SessionRecord
    model: ResolvedModel
    spec: SandboxSpec
    loop: AgentLoop | None = None
    state: SessionState = "idle"
    steer: list[Inbound] = field(default_factory=list)
    follow: collections.deque[Inbound] = field(default_factory=collections.deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None
    sandbox_task: asyncio.Task[Sandbox] | None = None
    last_outcome: TurnOutcome | None = None
    replied_to_parent: bool = False
    turns: int = 0
    # Harness notes for the model, injected at the next model call like steer messages but
    # not counted as pending input (they start no turn): e.g. "the REPL namespace is fresh".
    notes: list[UserMessagePayload] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name or self.record.id

    @property
    def pending(self) -> int:
        return len(self.steer) + len(self.follow)

    def take_steering(self) -> list[UserMessagePayload]:
        notes, self.notes = self.notes, []
        taken, self.steer = self.steer, []
        return [*notes, *(item.payload for item in taken)]

    def queued_message_ids(self) -> set[str]:
        """Message ids waiting in memory (not yet recorded): redelivery must not add them twice."""
        return {
            item.payload.message_id
            for item in (*self.steer, *self.follow)
            if item.payload.message_id is not None
        }

    def ensure_sandbox(self, start: Callable[[], Awaitable[Sandbox]]) -> asyncio.Task[Sandbox]:
        if self.sandbox_task is None:
            self.sandbox_task = asyncio.ensure_future(start())
        return self.sandbox_task
