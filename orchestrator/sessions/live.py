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
from orchestrator.store.lifecycle import SessionStatus

__all__ = ["Inbound", "LiveSession", "RunStop", "child_id_for"]


def child_id_for(session_id: str) -> str:
    """The short id a parent's model sees for a child (stable: derived from the session id)."""
    return "sub-" + session_id.removeprefix("s-")[:8]


@dataclass
class Inbound:
    payload: UserMessagePayload
    mode: Literal["steer", "follow_up"] = "follow_up"


@dataclass(frozen=True)
class RunStop:
    """How an autonomous or goal run ended (docs/control.md): its typed reason, a line of
    detail and the exit code print mode ends with."""

    reason: str
    detail: str
    exit_code: int


@dataclass
class LiveSession:
    record: SessionRecord
    model: ResolvedModel
    spec: SandboxSpec
    loop: AgentLoop | None = None
    # Its lifecycle state (store/lifecycle.py), written through to its row. Only the
    # orchestrator changes it, each change checked by ``lifecycle.transition``.
    state: SessionStatus = "idle"
    steer: list[Inbound] = field(default_factory=list)
    follow: collections.deque[Inbound] = field(default_factory=collections.deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None
    sandbox_task: asyncio.Task[Sandbox] | None = None
    last_outcome: TurnOutcome | None = None
    replied_to_parent: bool = False
    turns: int = 0
    # Harness notes recorded at the start of the next turn, before its input (so the input
    # stays the last thing the model reads); not pending input: they start no turn.
    notes: list[UserMessagePayload] = field(default_factory=list)
    # Ids of messages submitted here and not yet recorded: queued, or taken by the loop and
    # not committed yet. Redelivery skips them (the store does not have them yet).
    inflight: set[str] = field(default_factory=set)
    # Long-horizon runs (sessions/post_turn.py): the goal this session is being continued for,
    # and how its autonomous or goal run stopped (None while it runs, or for other sessions).
    goal_run: str | None = None
    run_stop: RunStop | None = None
    # Set by a cascading abort (``Orchestrator.abort_tree``) and by a turn that spent the
    # session's budget: queued input that is not the user's (subagent reports, notices,
    # continuations) waits for the next user input instead of starting a turn on its own, so
    # an aborted or spent tree stays stopped.
    held: bool = False
    # The seq of its newest durable event handed to the sink (None until one is, in this
    # process). Transient events are stamped with it (``Stream.after``): a client whose replay
    # already holds a newer event knows the transient is about something it has whole.
    pushed_seq: int | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name or self.record.id

    @property
    def pending(self) -> int:
        return len(self.steer) + len(self.follow)

    @property
    def has_work(self) -> bool:
        """Queued input that starts (or continues) a turn; held input waits for the user's."""
        if self.steer:
            return True
        if not self.held:
            return bool(self.follow)
        return any(item.payload.source == "user" for item in self.follow)

    def take_steering(self) -> list[UserMessagePayload]:
        taken, self.steer = self.steer, []
        return [item.payload for item in taken]

    def take_pending(self) -> list[Inbound]:
        """All queued input, steer messages first, then the follow-ups; none stays queued.
        Their message ids stay in ``inflight``: the input is not recorded yet, and whoever
        takes it submits it again."""
        taken = [*self.steer, *self.follow]
        self.steer.clear()
        self.follow.clear()
        return taken

    def accept(self, item: Inbound) -> None:
        """Queue ``item``; its message id stays in ``inflight`` until it is recorded."""
        if item.payload.message_id is not None:
            self.inflight.add(item.payload.message_id)
        if item.mode == "steer" and self.state == "running":
            self.steer.append(item)
        else:
            self.follow.append(item)
        self.wake.set()

    def ensure_sandbox(self, start: Callable[[], Awaitable[Sandbox]]) -> asyncio.Task[Sandbox]:
        if self.sandbox_task is None:
            self.sandbox_task = asyncio.ensure_future(start())
        return self.sandbox_task
