"""Host requests from kernels: subagents (``rlm``), messages and observation (docs/spec.md §3).

Every handler gets the caller's session id from the NATS subject the request arrived on (the
router guarantees it), never from the payload. Limits are enforced here, by the host, whatever
the model writes: depth, the live-children quota, budgets, the family rule, message size,
pending count and rate (R11, R18).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.bus.router import HostRequestError
from orchestrator.control.goal_service import GoalService
from orchestrator.control.schedule_service import ScheduleService
from orchestrator.errors import BusError, UserError
from orchestrator.harness.service import HarnessService
from orchestrator.ids import new_event_id, new_session_id
from orchestrator.models.client import ModelClient
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.sessions.admission import SpawnSlots
from orchestrator.sessions.history_service import HistoryService
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import TERMINAL_STATES, Orchestrator, SessionNotLoadable
from orchestrator.sessions.mcp_service import McpService
from orchestrator.store.db import SessionRecord
from orchestrator.store.events import UserMessagePayload

__all__ = ["FamilyService", "TokenBucket"]

NAME_MAX = 64
SLUG_WORDS = 4
SLUG_MAX = 32
FIND_MODELS_LIMIT_MAX = 20
OBSERVE_LIMIT_MAX = 100
OBSERVE_CHARS_MAX = 20_000
OBSERVE_PREVIEW_CHARS = 400
THINKING_LEVELS = frozenset({"off", "minimal", "low", "medium", "high", "xhigh", "max"})
RLM_RUN_ARGS = frozenset({"prompt", "name", "model", "thinking", "budget"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]


def _bad(message: str) -> HostRequestError:
    return HostRequestError("invalid_argument", message)


def _now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


def _slug(text: str) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())[:SLUG_WORDS]
    return "-".join(words)[:SLUG_MAX].strip("-") or "task"


class TokenBucket:
    """``rate`` tokens per second, burst ``rate``; ``take()`` returns seconds to wait or None."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.tokens = rate
        self.clock = clock
        self.stamp = clock()

    def take(self) -> float | None:
        now = self.clock()
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate


@dataclass(frozen=True)
class _Target:
    """A family member as the store knows it, with its live session when it is loaded.

    Family lookups read the store, so members that are not loaded in this orchestrator
    (inactive after a restart, finished in an earlier run) are found and woken on demand.
    """

    record: SessionRecord
    live: LiveSession | None
    relationship: Literal["parent", "sibling", "child"]

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def name(self) -> str:
        return self.record.name or self.record.id

    @property
    def state(self) -> str:
        return self.live.state if self.live is not None else self.record.status

    def matches(self, selector: str) -> bool:
        return selector in (self.record.name, self.record.id, self.record.rlm_child_id)


class FamilyService:
    def __init__(self, orch: Orchestrator):
        self.orch = orch
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._query_slots: dict[str, asyncio.Semaphore] = {}
        self._slots = SpawnSlots()  # spawn admissions in progress (sessions/admission.py)
        self._undoing: set[asyncio.Task[None]] = set()  # failed spawns being cleaned up
        self.mcp = McpService(orch)

    def handlers(self) -> dict[str, Handler]:
        return {
            "rlm.run": self.rlm_run,
            "rlm.list_subagents": self.rlm_list_subagents,
            "rlm.delete_subagent": self.rlm_delete_subagent,
            "rlm.find_models": self.rlm_find_models,
            "rlm.query": self.rlm_query,
            "rlm.query_batched": self.rlm_query_batched,
            "agent_message.send": self.message_send,
            "agent_message.list_agents": self.message_list_agents,
            "agent_observe.list": self.observe_list,
            "agent_observe.get": self.observe_get,
            "agent_observe.recent": self.observe_recent,
            # history.* and compact.* (orchestrator/sessions/history_service.py)
            **HistoryService(self.orch).handlers(),
            **HarnessService(self.orch).handlers(),
            # goal.* and rlm_heartbeat.* (docs/control.md)
            **GoalService(self.orch).handlers(),
            **ScheduleService(self.orch).handlers(),  # harness.*, refine.* (orchestrator/harness)
            **self.mcp.handlers(),  # mcp.* (docs/mcp.md)
        }

    # -- helpers ----------------------------------------------------------------------------

    def _caller(self, session_id: str) -> LiveSession:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted":
            raise HostRequestError("not_found", f"session {session_id} is not live here")
        return live

    def _member(self, record: SessionRecord, relationship: Any) -> _Target:
        return _Target(record, self.orch.sessions.get(record.id), relationship)

    async def _tree(self, live: LiveSession) -> list[SessionRecord]:
        return await self.orch.store.family_sessions(live.record.root_id)

    async def _children(self, live: LiveSession) -> list[_Target]:
        return [self._member(r, "child") for r in await self._tree(live) if r.parent_id == live.id]

    async def _siblings(self, live: LiveSession) -> list[_Target]:
        if live.record.parent_id is None:
            # Roots are unrelated to each other (docs/spec.md §3, R18): another user's session,
            # maybe in another project, is nobody's sibling.
            return []
        return [
            self._member(r, "sibling")
            for r in await self._tree(live)
            if r.parent_id == live.record.parent_id and r.id != live.id
        ]

    async def _parent(self, live: LiveSession) -> _Target | None:
        parent_id = live.record.parent_id
        if parent_id is None:
            return None
        loaded = self.orch.sessions.get(parent_id)
        if loaded is not None:
            return _Target(loaded.record, loaded, "parent")
        record = await self.orch.store.get_session(parent_id)
        return self._member(record, "parent") if record is not None else None

    async def _family(self, live: LiveSession) -> list[_Target]:
        out: list[_Target] = []
        parent = await self._parent(live)
        if parent is not None:
            out.append(parent)
        out += await self._siblings(live)
        out += await self._children(live)
        return [t for t in out if t.state != "deleted"]

    async def _find_in_family(self, live: LiveSession, selector: str) -> _Target:
        if not isinstance(selector, str) or not selector.strip():
            raise _bad("target must be a non-empty name or id")
        for target in await self._family(live):
            if target.matches(selector):
                return target
        raise HostRequestError(
            "not_family",
            f"{selector!r} is not your parent, sibling or child (see agent_message.list_agents())",
        )

    async def _wake(self, target: _Target) -> LiveSession:
        """The target's live session, loading it from the store when it is not loaded."""
        if target.live is not None:
            return target.live
        try:
            return await self.orch.load_session(target.record)
        except SessionNotLoadable as exc:
            raise HostRequestError("not_found", str(exc)) from None
        except UserError as exc:  # its model cannot be resolved any more
            raise HostRequestError(
                "model_unavailable", f"{target.name} cannot be woken: {exc}"
            ) from None

    @staticmethod
    def _describe(s: LiveSession | _Target, relationship: str | None = None) -> dict[str, Any]:
        target = s if isinstance(s, _Target) else _Target(s.record, s, "child")
        out: dict[str, Any] = {
            "name": target.name,
            "session_id": target.id,
            "rlm_child_id": target.record.rlm_child_id,
            "status": target.state,
            "depth": target.record.depth,
            "model": target.live.model.selector if target.live else target.record.model,
        }
        if relationship:
            out["relationship"] = relationship
        return out

    # -- rlm --------------------------------------------------------------------------------

    async def rlm_run(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        parent = self._caller(caller_id)
        unknown = set(args) - RLM_RUN_ARGS
        if unknown:
            raise _bad(f"unknown arguments: {', '.join(sorted(unknown))}")
        prompt = args.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _bad("prompt must be a non-empty string")
        thinking = args.get("thinking")
        if thinking is not None and thinking not in THINKING_LEVELS:
            raise _bad(f"thinking must be one of {', '.join(sorted(THINKING_LEVELS))}")
        budget = args.get("budget")
        if budget is not None and (
            not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0
        ):
            raise _bad("budget must be a positive number of tokens")
        settings = self.orch.settings_of(parent.record)  # its run's depth limit, if it chose one
        # The depth is the parent's record (fixed at its creation): no race to guard.
        if parent.record.depth + 1 > settings.max_depth:
            raise HostRequestError(
                "depth_limit",
                f"depth limit reached: this session is at depth {parent.record.depth} and the "
                f"maximum depth is {settings.max_depth}; do the work here instead",
            )
        name = args.get("name")
        if name is not None:
            if not isinstance(name, str) or not name.strip():
                raise _bad("name must be a non-empty string")
            name = name.strip()
            if len(name) > NAME_MAX or _CONTROL.search(name):
                raise _bad(f"name must be at most {NAME_MAX} printable characters")
        model = parent.model
        if args.get("model") is not None:
            model = self._resolve_model(args["model"], parent)
        stored = await self._children(parent)  # the last await before the child is reserved
        child_id = self._admit(parent, stored, name, budget)
        child = await self._create_child(parent, child_id, prompt, name, model, budget)
        self.orch.submit(
            child,
            Inbound(
                UserMessagePayload(
                    text=prompt, source="parent", sender=parent.id, sender_label="parent"
                )
            ),
        )
        return {
            "rlm_child_id": child.record.rlm_child_id,
            "name": child.name,
            "session_id": child.id,
            "model": model.selector,
        }

    def _admit(
        self, parent: LiveSession, stored: list[_Target], name: str | None, budget: int | None
    ) -> str:
        """Check the quota, the name and the budget, and reserve all three for a new child id.

        Synchronous on purpose (no ``await`` from the checks to the reservation): concurrent
        spawns of one parent see each other's held slots and budget nodes. The children are
        those of the store read (``stored``), the loaded ones (created since that read) and
        the held slots (being created), counted once each by id.
        """
        settings = self.orch.settings
        held = self._slots.held(parent.id)
        loaded = [
            _Target(s.record, s, "child")
            for s in self.orch.sessions.values()
            if s.record.parent_id == parent.id
        ]
        live_ids = {c.id for c in (*stored, *loaded) if c.state not in TERMINAL_STATES}
        live_ids.update(held)
        if len(live_ids) >= settings.max_live_children:
            raise HostRequestError(
                "quota_exceeded",
                f"spawn quota reached: {len(live_ids)} live children (maximum "
                f"{settings.max_live_children}); delete finished ones with rlm.delete_subagent",
            )
        if name is not None:
            taken = {c.record.name for c in (*stored, *loaded) if c.state != "deleted"}
            if name in taken or name in held.values():
                raise _bad(f"a subagent named {name!r} already exists")
        budgets = self.orch.budgets
        if budget is not None:
            problem = budgets.can_reserve(parent.id, budget)
            if problem is not None:
                raise HostRequestError("budget_exceeded", problem)
        elif budgets.exhausted(parent.id) is not None:
            raise HostRequestError("budget_exceeded", budgets.exhausted(parent.id) or "")
        child_id = new_session_id()
        self._slots.hold(parent.id, child_id, name)
        budgets.add(child_id, parent.id, budget)  # reserved now; the creation adds it again
        return child_id

    async def _create_child(
        self,
        parent: LiveSession,
        child_id: str,
        prompt: str,
        name: str | None,
        model: ResolvedModel,
        budget: int | None,
    ) -> LiveSession:
        """The child's session, or an error after which nothing of it is left running."""
        slug = _slug(prompt)
        creation = asyncio.ensure_future(
            self.orch.create_session(
                model=model,
                cwd=parent.spec.cwd,
                name=name,
                # Default name: a slug of the prompt plus the child's short id (unique).
                name_for=lambda short_id: f"{slug}-{short_id}",
                parent=parent,
                budget=budget,
                eager_sandbox=False,  # started at the child's first cell (or from the warm pool)
                session_id=child_id,
            )
        )
        try:
            # Shielded: a caller that gives up (the router's deadline) must not cut the
            # creation between its store row and its registration; the undo settles it.
            child = await asyncio.shield(creation)
        except BaseException as exc:
            # The slot stays held until the undo is done: the half-made child counts.
            task = asyncio.ensure_future(self._undo_spawn(creation, parent.id, child_id))
            self._undoing.add(task)
            task.add_done_callback(self._undoing.discard)
            if isinstance(exc, Exception):
                log.warning("subagent %s of %s could not be created: %s", child_id, parent.id, exc)
                raise HostRequestError(
                    "internal", f"the subagent could not be created ({exc}); nothing was started"
                ) from None
            raise
        self._slots.release(parent.id, child_id)  # a live session now: counted as one
        return child

    async def _undo_spawn(
        self, creation: asyncio.Future[LiveSession], parent_id: str, child_id: str
    ) -> None:
        """After a failed or abandoned creation: the child, if it came to exist, is deleted
        (a tombstone row, no driver, no sandbox) and its budget reservation ends."""
        try:
            child: LiveSession | None = await creation
        except BaseException:
            child = None
        try:
            if child is not None:
                await self.orch.stop_session(child, state="deleted")
            elif (record := await self.orch.store.get_session(child_id)) is not None:
                await self.orch.set_stored_state(record, "deleted", "delete")
        except Exception as exc:
            log.warning("could not delete the abandoned subagent %s: %s", child_id, exc)
        finally:
            self.orch.budgets.remove(child_id)
            self._slots.release(parent_id, child_id)

    def _resolve_model(self, selector: Any, parent: LiveSession) -> ResolvedModel:
        if not isinstance(selector, str) or not selector.strip():
            raise _bad("model must be a provider/name string")
        if selector.strip() == parent.model.selector:
            return parent.model
        try:
            return resolve_model(selector.strip(), self.orch.settings)
        except UserError as exc:
            raise HostRequestError("model_unavailable", str(exc)) from None

    async def rlm_list_subagents(self, caller_id: str, args: dict[str, Any]) -> list[Any]:
        parent = self._caller(caller_id)
        records = [r for r in await self.orch.store.list_sessions() if r.parent_id == parent.id]
        usage = {
            u.session_id: u for u in await self.orch.store.usage_summary([r.id for r in records])
        }
        out = []
        for rec in records:
            live = self.orch.sessions.get(rec.id)
            u = usage.get(rec.id)
            out.append(
                {
                    "rlm_child_id": rec.rlm_child_id,
                    "name": rec.name,
                    "session_id": rec.id,
                    "status": live.state if live else rec.status,
                    "model": rec.model,
                    "usage": {
                        "input": u.input if u else 0,
                        "output": u.output if u else 0,
                        "cost_usd": u.cost_usd if u else None,
                        "calls": u.calls if u else 0,
                    },
                }
            )
        return out

    async def rlm_delete_subagent(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        parent = self._caller(caller_id)
        selector = args.get("target")
        for child in await self._children(parent):
            if child.state != "deleted" and isinstance(selector, str) and child.matches(selector):
                if child.live is not None:
                    await self.orch.stop_session(child.live, state="deleted")
                else:
                    await self._delete_unloaded(child.record)
                return {**self._describe(child), "status": "deleted"}
        raise HostRequestError("not_found", f"no subagent {selector!r} among your children")

    async def _delete_unloaded(self, record: SessionRecord) -> None:
        """A child that is not loaded has no driver or sandbox: tombstone it and its
        descendants in the store, and drop their mailboxes (no wake-up at the next start)."""
        tree = await self.orch.store.family_sessions(record.root_id)
        doomed = {record.id}
        for rec in tree:  # parents come before children
            if rec.parent_id in doomed:
                doomed.add(rec.id)
        for rec in tree:
            if rec.id not in doomed:
                continue
            loaded = self.orch.sessions.get(rec.id)
            if loaded is not None:
                await self.orch.stop_session(loaded, state="deleted")
                continue
            await self.orch.set_stored_state(rec, "deleted", "delete")
            await self.orch.adopted.discard(rec.id)  # a sandbox kept from a daemon crash
            if self.orch.bus is not None:
                with contextlib.suppress(Exception):
                    await self.orch.bus.purge_messages(rec.id)

    async def rlm_find_models(self, caller_id: str, args: dict[str, Any]) -> list[dict[str, str]]:
        caller = self._caller(caller_id)
        query = str(args.get("query") or "").strip().lower()
        limit = args.get("limit", 8)
        if not isinstance(limit, int) or not 1 <= limit <= FIND_MODELS_LIMIT_MAX:
            raise _bad(f"limit must be 1..{FIND_MODELS_LIMIT_MAX}")
        selectors = [caller.model.selector, *self.orch.settings.models]
        seen: set[str] = set()
        ranked: list[tuple[int, str]] = []
        for sel in selectors:
            if sel in seen:
                continue
            seen.add(sel)
            low = sel.lower()
            if not query or query in low:
                rank = 0 if low == query else (1 if low.startswith(query) else 2)
                ranked.append((rank, sel))
        ranked.sort()
        out = []
        for _, sel in ranked[:limit]:
            provider, _, name = sel.partition("/")
            out.append({"provider": provider, "id": name, "name": name, "selector": sel})
        return out

    async def rlm_query(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        caller = self._caller(caller_id)
        prompt = args.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _bad("prompt must be a non-empty string")
        model = caller.model
        if args.get("model") is not None:
            model = self._resolve_model(args["model"], caller)
        return {"text": await self._complete(caller, model, prompt)}

    async def rlm_query_batched(self, caller_id: str, args: dict[str, Any]) -> list[Any]:
        caller = self._caller(caller_id)
        prompts = args.get("prompts")
        limit = self.orch.settings.rlm_query_concurrency
        from orchestrator.settings import RLM_QUERY_BATCH_MAX

        if (
            not isinstance(prompts, list)
            or not prompts
            or len(prompts) > RLM_QUERY_BATCH_MAX
            or not all(isinstance(p, str) and p.strip() for p in prompts)
        ):
            raise _bad(f"prompts must be a list of 1..{RLM_QUERY_BATCH_MAX} non-empty strings")
        model = caller.model
        if args.get("model") is not None:
            model = self._resolve_model(args["model"], caller)
        slots = self._query_slots.setdefault(caller.id, asyncio.Semaphore(limit))

        async def one(p: str) -> dict[str, Any]:
            async with slots:
                try:
                    return {"ok": True, "text": await self._complete(caller, model, p)}
                except HostRequestError as exc:
                    return {"ok": False, "error": {"code": exc.code, "message": str(exc)}}

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    async def _complete(self, caller: LiveSession, model: ResolvedModel, prompt: str) -> str:
        problem = self.orch.budgets.exhausted(caller.id)
        if problem is not None:
            raise HostRequestError("budget_exceeded", problem)
        from orchestrator.errors import ModelError

        try:
            reply = await ModelClient(model, self.orch.settings_of(caller.record)).complete(
                [{"role": "user", "content": prompt}]
            )
        except ModelError as exc:
            raise HostRequestError("model_unavailable", str(exc)) from None
        await self.orch.record(caller, "usage", reply.usage)  # accounted to the caller
        return reply.text

    # -- messages ---------------------------------------------------------------------------

    async def message_send(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        sender = self._caller(caller_id)
        allowed = {"message", "receiver_role", "receiver_name", "mode"}
        if set(args) - allowed:
            raise _bad(f"unknown arguments: {', '.join(sorted(set(args) - allowed))}")
        message = args.get("message")
        role = args.get("receiver_role", "parent")
        receiver = args.get("receiver_name")
        mode = args.get("mode", "steer")
        settings = self.orch.settings
        if not isinstance(message, str) or not message.strip():
            raise _bad("message must be a non-empty string")
        if len(message.encode("utf-8")) > settings.message_max_bytes:
            raise _bad(f"message is larger than {settings.message_max_bytes} bytes")
        if mode not in ("steer", "follow_up"):
            raise _bad("mode must be 'steer' or 'follow_up'")
        if role == "parent":
            if receiver is not None:
                raise _bad("receiver_name is not allowed for the parent")
            parent = await self._parent(sender)
            if parent is None:
                raise HostRequestError("not_found", "a root session has no parent")
            target = parent
        elif role in ("sibling", "child"):
            if not isinstance(receiver, str) or not receiver:
                raise _bad(f"receiver_name is required for a {role}")
            pool = await (self._siblings(sender) if role == "sibling" else self._children(sender))
            match = [t for t in pool if t.state != "deleted" and t.matches(receiver)]
            if not match:
                raise HostRequestError("not_family", f"you have no {role} named {receiver!r}")
            target = match[0]
        else:
            raise _bad("receiver_role must be 'parent', 'sibling' or 'child'")
        if target.state in TERMINAL_STATES:
            raise HostRequestError("not_found", f"{target.name} is {target.state}")
        # A member that is not loaded (inactive, or finished in an earlier run) is woken: the
        # message starts its next turn like any idle session's.
        dest = await self._wake(target)
        if dest.state in TERMINAL_STATES:
            raise HostRequestError("not_found", f"{dest.name} is {dest.state}")
        if dest.pending >= settings.message_pending_max:
            raise HostRequestError(
                "quota_exceeded",
                f"{dest.name} already has {dest.pending} messages waiting; let it read them first",
            )
        bucket = self._buckets.setdefault(
            (sender.id, dest.id), TokenBucket(settings.message_rate_per_s)
        )
        wait = bucket.take()
        if wait is not None:
            raise HostRequestError(
                "rate_limited", f"too many messages to {dest.name}; retry in {wait:.2f} s", wait
            )
        label = {
            "parent": f"child {sender.name} ({sender.record.rlm_child_id})",
            "child": "parent",
            "sibling": f"sibling {sender.name}",
        }[target.relationship]
        message_id = "m-" + new_event_id()
        payload = UserMessagePayload(
            text=message,
            source="agent",
            sender=sender.id,
            sender_label=label,
            message_id=message_id,
        )
        try:
            # Durable first (the recipient's JetStream mailbox), then queued: R4.
            status = await self.orch.deliver(dest, payload, mode=mode)
        except BusError as exc:
            raise HostRequestError(
                "internal", f"the message could not be stored, nothing was sent: {exc}"
            ) from None
        except ValueError as exc:  # too large once encoded, or the target just stopped
            raise HostRequestError("invalid_argument", str(exc)) from None
        if target.relationship == "parent":
            sender.replied_to_parent = True
        return {"id": message_id, "status": status, "target": dest.name, "at": _now_iso()}

    async def message_list_agents(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        parent = await self._parent(live)
        siblings = await self._siblings(live)
        children = await self._children(live)
        return {
            "self": self._describe(live),
            "parent": self._describe(parent) if parent else None,
            "siblings": [self._describe(s) for s in siblings if s.state != "deleted"],
            "children": [self._describe(s) for s in children if s.state != "deleted"],
        }

    # -- observation (read-only) ------------------------------------------------------------

    async def _observed(self, target: _Target) -> dict[str, Any]:
        events = await self.orch.store.events(target.id)
        talk = [e for e in events if e.type in ("user_message", "assistant_message")]
        last = next((e for e in reversed(events) if e.type == "assistant_message"), None)
        preview = str(last.payload.get("text", "")) if last is not None else ""
        return {
            **self._describe(target, target.relationship),
            "streaming": target.state == "running",
            "message_count": len(talk),
            "pending_count": target.live.pending if target.live is not None else 0,
            "latest_preview": preview[:OBSERVE_PREVIEW_CHARS],
        }

    async def observe_list(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        return {"agents": [await self._observed(t) for t in await self._family(live)]}

    async def observe_get(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        target = await self._find_in_family(self._caller(caller_id), args.get("target"))  # type: ignore[arg-type]
        return await self._observed(target)

    async def observe_recent(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        target = await self._find_in_family(self._caller(caller_id), args.get("target"))  # type: ignore[arg-type]
        limit = args.get("limit", 8)
        max_chars = args.get("max_chars", 800)
        if not isinstance(limit, int) or not 1 <= limit <= OBSERVE_LIMIT_MAX:
            raise _bad(f"limit must be 1..{OBSERVE_LIMIT_MAX}")
        if not isinstance(max_chars, int) or not 1 <= max_chars <= OBSERVE_CHARS_MAX:
            raise _bad(f"max_chars must be 1..{OBSERVE_CHARS_MAX}")
        roles = {"user_message": "user", "assistant_message": "assistant", "tool_result": "tool"}
        events = await self.orch.store.events(target.id)
        wanted = [e for e in events if e.type in roles]
        return {
            "messages": [
                {
                    "role": roles[e.type],
                    "text": str(e.payload.get("text", ""))[:max_chars],
                    "at": e.ts.isoformat(),
                    "seq": e.seq,
                }
                for e in wanted[-limit:]
            ]
        }
