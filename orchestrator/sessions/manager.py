"""The orchestrator core: every live session of this process, their family and their budgets.

It owns the store, the sandbox backend and (when available) the NATS bus; it starts sessions,
runs each one's driver, delivers messages between them, and knows when a family is quiet.
Host requests from kernels (``rlm(...)``, ``agent_message.send``...) are answered by
``orchestrator/sessions/family.py`` on top of this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.agent.loop import AgentLoop, EventSink, TurnOutcome
from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt
from orchestrator.errors import PrimeAgentError, SandboxStartError
from orchestrator.ids import new_session_id
from orchestrator.models.client import ModelClient
from orchestrator.models.registry import ResolvedModel
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from orchestrator.sessions.budget import BudgetTree, billable_tokens
from orchestrator.sessions.context import ContextBuilder
from orchestrator.sessions.live import Inbound, LiveSession, child_id_for
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import (
    NoticePayload,
    RunEndPayload,
    UsagePayload,
    UserMessagePayload,
)

__all__ = ["TERMINAL_STATES", "FamilyTimeout", "Orchestrator", "SessionBus"]

log = logging.getLogger(__name__)

NOTICE_PREVIEW_CHARS = 600
TERMINAL_STATES = frozenset({"error", "aborted", "deleted"})


class FamilyTimeout(PrimeAgentError):
    """A print-mode run waited too long for its subagents to go quiet."""


class SessionBus:
    """What the manager needs from the bus; ``None`` bus = sessions without host requests."""

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        raise NotImplementedError

    async def forget(self, session_id: str) -> None:
        raise NotImplementedError


@dataclass
class _Hooks:
    session: LiveSession
    budgets: BudgetTree

    def take_steering(self) -> list[UserMessagePayload]:
        return self.session.take_steering()

    def budget_stop(self) -> str | None:
        return self.budgets.exhausted(self.session.id)


class Orchestrator:
    def __init__(
        self,
        *,
        store: Store,
        backend: SandboxBackend,
        settings: Settings,
        paths: Paths,
        bus: SessionBus | None = None,
        sink: EventSink | None = None,
    ):
        self.store = store
        self.backend = backend
        self.settings = settings
        self.paths = paths
        self.bus = bus
        self.sink = sink
        self.sessions: dict[str, LiveSession] = {}
        self.budgets = BudgetTree()
        self._changed = asyncio.Condition()
        self._closing = False
        self._abort_lock = asyncio.Lock()

    # -- creating sessions ------------------------------------------------------------------

    async def create_session(
        self,
        *,
        model: ResolvedModel,
        cwd: Path,
        name: str | None,
        parent: LiveSession | None = None,
        budget: int | None = None,
        eager_sandbox: bool = True,
        name_for: Callable[[str], str] | None = None,
    ) -> LiveSession:
        session_id = new_session_id()
        if name is None and name_for is not None:
            name = name_for(child_id_for(session_id))
        record = SessionRecord(
            id=session_id,
            root_id=parent.record.root_id if parent else session_id,
            parent_id=parent.id if parent else None,
            name=name,
            depth=parent.record.depth + 1 if parent else 0,
            cwd=str(cwd),
            model=model.selector,
            backend=self.backend.name,
            status="idle",
            rlm_child_id=child_id_for(session_id) if parent else None,
            budget_tokens=budget,
        )
        await self.store.create_session(record)
        # The NATS user is created with the sandbox (its only user), not here: a child that
        # never runs a cell costs no bus reload, and admission stays fast.
        env = {
            "PRIME_AGENT_DEPTH": str(record.depth),
            "PRIME_AGENT_MAX_DEPTH": str(self.settings.max_depth),
        }
        spec = SandboxSpec(
            session_id=session_id,
            cwd=cwd,
            artifacts_dir=ensure_private_dir(self.paths.session_artifacts(session_id)),
            env=env,
            labels={"root": record.root_id},
        )
        live = LiveSession(record=record, model=model, spec=spec)
        self.budgets.add(session_id, parent.id if parent else None, budget)
        live.loop = AgentLoop(
            session_id=session_id,
            client=ModelClient(model, self.settings),
            system_prompt=build_system_prompt(
                EnvironmentFacts(cwd=str(cwd), model=model.selector, backend=self.backend.name),
                tool_protocol=model.tool_protocol,
            ),
            get_sandbox=lambda: self._sandbox(live),
            record=lambda type_, payload: self.record(live, type_, payload),
            settings=self.settings,
            context=ContextBuilder(),
            sink=self.sink,
            hooks=_Hooks(live, self.budgets),
        )
        self.sessions[session_id] = live
        if eager_sandbox:
            live.ensure_sandbox(lambda: self._start_sandbox(live))
        live.driver = asyncio.create_task(self._drive(live), name=f"driver-{session_id}")
        return live

    async def _start_sandbox(self, live: LiveSession) -> Sandbox:
        if self.bus is not None:
            creds = await self.bus.credentials_env(live.id)
            live.spec = dataclasses.replace(live.spec, env={**live.spec.env, **creds})
        return await self.backend.create(live.spec)

    async def _sandbox(self, live: LiveSession) -> Sandbox:
        task = live.ensure_sandbox(lambda: self._start_sandbox(live))
        try:
            return await asyncio.shield(task)
        except SandboxStartError:
            raise
        except Exception as exc:  # a backend bug must still reach the model as an error
            raise SandboxStartError(f"could not start the sandbox: {exc}") from exc

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any:
        rec = await self.store.append(live.id, type_, payload)  # type: ignore[arg-type]
        if isinstance(payload, UsagePayload):
            self.budgets.spend(
                live.id, billable_tokens(payload.input, payload.output, payload.cache_write)
            )
        if self.sink is not None:
            self.sink(
                {
                    "type": rec.type,
                    "session_id": rec.session_id,
                    "seq": rec.seq,
                    "id": rec.id,
                    "parent_id": rec.parent_event_id,
                    "ts": rec.ts.isoformat(),
                    "payload": rec.payload,
                }
            )
        return rec

    # -- input ------------------------------------------------------------------------------

    def submit(self, live: LiveSession, item: Inbound) -> str:
        """Queue input for a session; return "delivered" (it starts a turn now) or "queued"."""
        if live.state in TERMINAL_STATES:
            raise ValueError(f"session {live.id} is {live.state}")
        idle = live.state != "running"
        if item.mode == "steer" and not idle:
            live.steer.append(item)
        else:
            live.follow.append(item)
        live.wake.set()
        return "delivered" if idle else "queued"

    # -- the driver ---------------------------------------------------------------------------

    async def _drive(self, live: LiveSession) -> None:
        assert live.loop is not None
        while True:
            while not live.follow:
                live.wake.clear()
                await live.wake.wait()
            item = live.follow.popleft()
            await self._set_state(live, "running")
            outcome: TurnOutcome | None = None
            try:
                outcome = await live.loop.run(item.payload)
            finally:
                if outcome is None:  # cancelled: the caller decides the state
                    live.last_outcome = TurnOutcome(reason="aborted")
            live.last_outcome = outcome
            live.turns += 1
            # Steer messages that arrived after the last model call start the next turn.
            for leftover in reversed(live.steer):
                live.follow.appendleft(leftover)
            live.steer.clear()
            # Tell the parent *before* this session looks settled: otherwise a print-mode run
            # could see the whole tree quiet in between and end before the parent hears.
            failed = outcome.reason in ("error", "budget_exceeded", "max_steps")
            if failed or not live.follow:
                await self._notify_parent(live, outcome)
            if failed:
                await self._set_state(live, "error")
                if outcome.reason == "budget_exceeded":
                    return  # spent: no more turns for this session
                continue
            if live.follow:
                continue
            await self._set_state(live, "completed" if live.record.parent_id else "idle")

    async def _set_state(self, live: LiveSession, state: str) -> None:
        live.state = state  # type: ignore[assignment]
        with contextlib.suppress(Exception):
            await self.store.update_session(live.id, status=state)
        await self._changed_notify()

    async def _changed_notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _notify_parent(self, live: LiveSession, outcome: TurnOutcome) -> None:
        """A child that failed, or finished without replying, tells its parent (SPEC.md §3)."""
        parent = self.sessions.get(live.record.parent_id or "")
        if parent is None or parent.state in TERMINAL_STATES:
            return
        label = f"subagent {live.name} ({live.record.rlm_child_id})"
        if outcome.reason == "completed":
            if live.replied_to_parent:
                live.replied_to_parent = False
                return
            preview = (outcome.final_text or "").strip()[:NOTICE_PREVIEW_CHARS]
            text = f"[{label} finished without messaging you. Its last reply:]\n{preview}"
        else:
            detail = outcome.final_text or (str(outcome.error) if outcome.error else "")
            text = f"[{label} stopped: {outcome.reason}. {detail}]".strip()
        await self.record(parent, "notice", NoticePayload(text=text))
        self.submit(
            parent,
            Inbound(UserMessagePayload(text=text, source="harness"), mode="follow_up"),
        )

    # -- quiescence and shutdown --------------------------------------------------------------

    def family(self, root_id: str) -> list[LiveSession]:
        return [s for s in self.sessions.values() if s.record.root_id == root_id]

    def _quiet(self, root_id: str) -> bool:
        return all(s.state != "running" and not s.pending for s in self.family(root_id))

    async def wait_quiet(self, root_id: str, timeout_s: float) -> None:
        """Until no session of the tree runs and no input waits (SPEC.md print mode)."""
        try:
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: self._quiet(root_id))
        except TimeoutError:
            busy = [s.name for s in self.family(root_id) if s.state == "running" or s.pending]
            raise FamilyTimeout(
                f"gave up waiting {timeout_s:.0f} s for the session tree to go quiet "
                f"(still busy: {', '.join(busy[:5])})"
            ) from None

    async def abort_turn(self, live: LiveSession) -> bool:
        """Stop the running turn; the session stays loaded, idle and ready for more input.

        ``stop_session`` ends a session for good; a user's abort does not. The driver is
        cancelled (the loop records ``aborted`` and interrupts a running cell, shielded) and a
        fresh driver starts for the same session. Steer messages that never reached the model
        move to the front of the follow-up queue, as between normal turns.
        """
        async with self._abort_lock:  # two aborts at once must not start two drivers
            driver = live.driver
            if live.state != "running" or driver is None or driver.done():
                return False
            driver.cancel()
            # asyncio.wait, not `await driver`: the driver's CancelledError must not be
            # mistaken for (or swallow) a cancellation of the caller itself.
            await asyncio.wait({driver})
            for leftover in reversed(live.steer):
                live.follow.appendleft(leftover)
            live.steer.clear()
            await self._set_state(live, "completed" if live.record.parent_id else "idle")
            live.driver = asyncio.create_task(self._drive(live), name=f"driver-{live.id}")
            return True

    async def stop_session(self, live: LiveSession, *, state: str = "aborted") -> None:
        """Cancel a session and all its descendants; stop their sandboxes (cascade)."""
        for child in [s for s in self.sessions.values() if s.record.parent_id == live.id]:
            if child.state != "deleted":
                await self.stop_session(child, state=state)
        if live.driver is not None and not live.driver.done():
            live.driver.cancel()
            with contextlib.suppress(BaseException):
                await live.driver
        if live.state != "deleted":
            await self._set_state(live, state if live.state == "running" else live.state)
            if state == "deleted":
                await self._set_state(live, "deleted")
        await self._stop_sandbox(live)
        if self.bus is not None:
            with contextlib.suppress(Exception):
                await self.bus.forget(live.id)

    async def _stop_sandbox(self, live: LiveSession) -> None:
        task = live.sandbox_task
        if task is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            sandbox = await task
            await sandbox.stop()

    async def finish_root(self, live: LiveSession) -> None:
        """End of a print-mode run: stop the whole tree, then record run_end (last event)."""
        await self.stop_session(live)
        outcome = live.last_outcome
        reason = outcome.reason if outcome is not None else "aborted"
        with contextlib.suppress(Exception):
            await self.record(
                live,
                "run_end",
                RunEndPayload(reason=reason, final_text=outcome.final_text if outcome else ""),
            )
        final = {"completed": "completed", "aborted": "aborted"}.get(reason, "error")
        await self._set_state(live, final)

    async def close(self) -> None:
        self._closing = True
        for live in list(self.sessions.values()):
            if live.record.parent_id is None:
                with contextlib.suppress(Exception):
                    await self.stop_session(live)
        with contextlib.suppress(Exception):
            await self.backend.close()
