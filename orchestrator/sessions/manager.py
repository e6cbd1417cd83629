"""The orchestrator core: every live session of this process, their family and their budgets.

It owns the store, the sandbox backend and (when available) the NATS bus; it starts sessions,
runs each one's driver, delivers messages between them, and knows when a family is quiet.
Host requests from kernels (``rlm(...)``, ``agent_message.send``...) are answered by
``orchestrator/sessions/family.py`` on top of this class.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from orchestrator.agent.context import ContextBuilder
from orchestrator.agent.loop import AgentLoop, EventSink, TurnOutcome
from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt
from orchestrator.control.autonomous import AutonomousPolicy, Autonomy
from orchestrator.control.goals import Goals
from orchestrator.control.scheduler import Scheduler
from orchestrator.errors import PrimeAgentError, SandboxStartError, UserError
from orchestrator.harness.refine import Refiner
from orchestrator.ids import new_event_id, new_session_id
from orchestrator.mcp.hub import McpHub
from orchestrator.models.client import ModelClient
from orchestrator.models.openai_stream import close_pools
from orchestrator.models.registry import (
    OPENAI_BASE_URL_ENV,
    ResolvedModel,
    resolve_model,
    resolve_stored,
    stored_model,
)
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.runtime.wire import REPL_CONTEXT_FILE_ENV
from orchestrator.sandbox.base import Sandbox, SandboxBackend, SandboxSpec
from orchestrator.session_specs import StoredRunSettings
from orchestrator.sessions.budget import BudgetTree, billable_tokens
from orchestrator.sessions.compaction import running_sandbox
from orchestrator.sessions.idle import IdleUnloader
from orchestrator.sessions.live import Inbound, LiveSession, child_id_for
from orchestrator.sessions.notices import (
    NOTICE_GATHER_S,
    gather_notices,
    is_notice,
    notice_message,
)
from orchestrator.sessions.post_turn import after_turn
from orchestrator.sessions.prompting import PromptBuilder, run_prompts, run_skill_paths
from orchestrator.sessions.run_settings import settings_for
from orchestrator.sessions.sandbox_policy import (
    SandboxChoice,
    apply_policy,
    chosen_policy,
    policy_for,
)
from orchestrator.sessions.sandbox_records import ADOPTED_NOTICE, AdoptedSandboxes
from orchestrator.sessions.session_bus import SessionBus
from orchestrator.sessions.session_target import SessionTarget
from orchestrator.sessions.supervisor import SandboxSupervisor
from orchestrator.settings import Settings
from orchestrator.store.autonomy import AutonomyRow
from orchestrator.store.context_queries import read_context_path
from orchestrator.store.db import EventRecord, SessionRecord, Store
from orchestrator.store.events import (
    AbortedPayload,
    NoticePayload,
    RunEndPayload,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.lifecycle import (
    STALE_LIVE_STATUSES,
    TERMINAL_STATES,
    Cause,
    SessionStatus,
    StopState,
    Transition,
    transition,
)

__all__ = [
    "INTERRUPTED_CELL_TEXT",
    "RELOADED_NOTICE",
    "TERMINAL_STATES",
    "FamilyTimeout",
    "ModelResolver",
    "Orchestrator",
    "SessionBus",
    "SessionNotLoadable",
]

log = logging.getLogger(__name__)

NOTICE_PREVIEW_CHARS = 600
# Roots whose creating client's key variables are kept in memory (remember_client_env).
CLIENT_ENV_ROOTS_MAX: Final = 4096
# The recent state changes of every session (``Orchestrator.transitions``), for inspection:
# the oldest go first once this many are kept.
RECENT_TRANSITIONS_MAX: Final = 256
# Under the runtime dir: each MCP server's stderr (docs/mcp.md).
MCP_LOG_SUBDIR: Final = "mcp"
# How a print-mode root ends, by its last outcome's reason (``finish_root``); any other reason
# (a failed run) leaves it inactive: not loaded, and woken by the next message.
RUN_END_STATES: Final[Mapping[str, SessionStatus]] = {
    "completed": "completed",
    "aborted": "aborted",
}
RUN_END_OTHERWISE: Final[SessionStatus] = "inactive"
# Told to the model at the first model call after a session with a REPL history is reloaded
# and has no namespace snapshot (with one, the supervisor's revival note says what came back).
RELOADED_NOTICE: Final = "[notice] this session was reloaded; its REPL namespace starts empty"
# The tool result of a cell that was running when its orchestrator died: every tool call needs
# a result (providers reject the history otherwise) and the outcome is unknown, so it is never
# re-run (R2: no replayed side effects).
INTERRUPTED_CELL_TEXT: Final = (
    "[notice] the orchestrator stopped while this cell was running; its outcome is unknown "
    "(it may have had side effects) and it was not re-run"
)
INTERRUPTED_CELL_STATUS: Final = "interrupted"
RESTART_ABORT_REASON: Final = "orchestrator_restart"
# Bounds the wait for mailbox acks still in flight when the orchestrator closes: an ack lost
# here only costs a deduplicated redelivery at the next start.
ACK_DRAIN_TIMEOUT_S: Final = 5.0

ModelResolver = Callable[[str], Awaitable[ResolvedModel]]
"""Turns a model selector into a usable model (the daemon adds the embedded endpoint): the
embedded model of a stored session, and sessions stored before their endpoint was (0007)."""


class FamilyTimeout(PrimeAgentError):
    """A print-mode run waited too long for its subagents to go quiet."""


class SessionNotLoadable(UserError):
    """The session cannot be loaded: unknown, terminal (deleted, aborted), or closing."""


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
        resolve: ModelResolver | None = None,
        backends: Mapping[str, SandboxBackend] | None = None,
        sandboxes_outlive_us: bool = False,
    ):
        self.store = store
        self.backend = backend  # the default: for sessions created without a backend
        # Every backend a session may use, by name (record.backend); the daemon may add one.
        self.backends: dict[str, SandboxBackend] = {backend.name: backend, **(backends or {})}
        # The daemon's sandboxes outlive it (no die_with_parent) and are adopted by the next
        # daemon; until their session is loaded they wait here (sessions/adoption.py).
        self.die_with_parent = not sandboxes_outlive_us
        self.adopted = AdoptedSandboxes()
        self.settings = settings
        self.paths = paths
        self.bus = bus
        self.sink = sink
        # Every loaded session by id. Only this class adds one (``create_session``, ``_load``)
        # or removes one (``unload``); callers outside the sessions package read it through
        # ``loaded`` and ``loaded_sessions`` and change a session only through the operations
        # below (the daemon's port: ``daemon/command_context.SessionControl``).
        self.sessions: dict[str, LiveSession] = {}
        self.budgets = BudgetTree()
        # root id -> the key variables its creating client sent (remember_client_env)
        self._client_env: collections.OrderedDict[str, dict[str, str]] = collections.OrderedDict()
        self._resolve = resolve or self._resolve_from_settings
        # Notified at every change of a session's state (and after an abort): wait_quiet.
        self._changed = asyncio.Condition()
        # The most recent of those changes, oldest first (store/lifecycle.py).
        self.transitions: collections.deque[Transition] = collections.deque(
            maxlen=RECENT_TRANSITIONS_MAX
        )
        self._closing = False
        self._abort_lock = asyncio.Lock()
        # Sessions being loaded: concurrent wakers (two messages, a message and an attach)
        # share one load instead of building two drivers for one session.
        self._loading: dict[str, asyncio.Future[LiveSession]] = {}
        # Which sessions have a node in the budget tree: a loaded child needs its ancestors'
        # (and siblings') nodes even when those sessions themselves are not loaded.
        self._budgeted: set[str] = set()
        self._budget_lock = asyncio.Lock()
        self._acks: set[asyncio.Task[None]] = set()
        # Sandboxes of unloaded sessions still stopping (``unload(stop_later=True)``): a new
        # load of the session waits for its old sandbox to be gone, and so does ``close``.
        self._sandbox_stops: dict[str, asyncio.Task[None]] = {}
        self.interrupted_turns: list[str] = []  # by recover_interrupted (adoption.py resumes)
        # Start backoff, namespace snapshots and revival (docs/snapshots.md), idle unload.
        self.sandboxes = SandboxSupervisor(paths, debounce_s=settings.snapshot_debounce_s)
        self.idle = IdleUnloader(self, after_s=settings.idle_unload_after_s)
        # The Continual Harness (docs/harness.md): prompts rebuilt after a change, /refine.
        # MCP servers (docs/mcp.md): the config's for every session, a run's for its family.
        self.mcp = McpHub(settings.mcp.servers, log_dir=paths.runtime_dir / MCP_LOG_SUBDIR)
        self.prompts = PromptBuilder(store, paths, settings, mcp=self.mcp)
        self.refiner = Refiner(store, outcome_turns=settings.harness.outcome_turns)
        self.goals = Goals(store)  # docs/control.md
        self.autonomy = Autonomy(store)
        self.scheduler: Scheduler | None = None  # the daemon's (daemon/schedule_link.py)

    async def _resolve_from_settings(self, selector: str) -> ResolvedModel:
        return resolve_model(selector, self.settings)

    def settings_of(self, record: SessionRecord) -> Settings:
        """The settings ``record``'s session runs with: this process's config with what its
        run chose (an eval config's compaction, retries, depth limit: ``run_settings``)."""
        return settings_for(self.settings, record.run_settings)

    # -- the loaded sessions, as callers outside the sessions package see them -----------------

    def loaded(self, session_id: str) -> LiveSession | None:
        """The session when this process has it loaded, else None (this never loads it)."""
        return self.sessions.get(session_id)

    def loaded_sessions(self) -> list[LiveSession]:
        """Every loaded session, in the order it was loaded. A copy: the caller may load and
        unload sessions while it walks the list."""
        return list(self.sessions.values())

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
        backend: str | None = None,
        refine: bool | None = None,
        session_id: str | None = None,
        sandbox: SandboxChoice | None = None,
        run_settings: StoredRunSettings | None = None,
    ) -> LiveSession:
        """A new session (and its driver; its sandbox starts now when ``eager_sandbox``).
        ``refine``: whether it may /refine; None inherits the parent's, or the config's.
        ``session_id``: the id reserved at spawn admission (sessions/admission.py); else new.
        ``run_settings``: what a root's run chose over the config (a child has its parent's)."""
        # A child runs on its parent's backend unless told otherwise.
        backend = backend or (parent.record.backend if parent else self.backend.name)
        if backend not in self.backends:
            raise UserError(f"the {backend} backend is not available here")
        session_id = session_id or new_session_id()
        # The sandbox policy and the model endpoint belong to the session from now on: every
        # later start, wake or adoption uses these, not the loading process's config.
        policy = (
            parent.record.sandbox_policy
            if parent is not None and parent.record.sandbox_policy is not None
            else policy_for(self.backends[backend], self.settings)
        )
        if policy.backend != backend:
            policy = policy.model_copy(update={"backend": backend})
        if parent is None:  # a child's sandbox is its parent's, whatever it asks
            policy = chosen_policy(policy, sandbox)
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
            backend=backend,
            status="idle",
            rlm_child_id=child_id_for(session_id) if parent else None,
            budget_tokens=budget,
            refine_enabled=(
                refine
                if refine is not None
                else parent.record.refine_enabled
                if parent
                else self.settings.harness.refine_enabled
            ),
            model_spec=stored_model(model),
            sandbox_policy=policy,
            run_settings=parent.record.run_settings if parent is not None else run_settings,
        )
        await self.store.create_session(record)
        # The NATS user is created with the sandbox (its only user), not here: a child that
        # never runs a cell costs no bus reload, and admission stays fast.
        spec = self._spec(record)
        if parent is not None:  # a child runs on its parent's image, workspace mode and limits
            p = parent.spec
            spec = dataclasses.replace(
                spec,
                image=p.image,
                workspace=p.workspace,
                limits=p.limits,
                network=p.network,
                skill_dirs=p.skill_dirs,
                mounts=p.mounts,
            )
        live = LiveSession(record=record, model=model, spec=spec)
        self.budgets.add(session_id, parent.id if parent else None, budget)
        self._budgeted.add(session_id)
        self._attach_loop(live, ContextBuilder())
        self.sessions[session_id] = live
        if eager_sandbox:
            live.ensure_sandbox(lambda: self._start_sandbox(live))
        self._start_driver(live)
        return live

    def _spec(self, record: SessionRecord) -> SandboxSpec:
        env = {
            "PRIME_AGENT_DEPTH": str(record.depth),
            "PRIME_AGENT_MAX_DEPTH": str(self.settings_of(record).max_depth),
        }
        chosen = record.run_settings
        if chosen is not None and chosen.repl_context_file:
            env[REPL_CONTEXT_FILE_ENV] = chosen.repl_context_file
        spec = SandboxSpec(
            session_id=record.id,
            cwd=Path(record.cwd),
            artifacts_dir=ensure_private_dir(self.paths.session_artifacts(record.id)),
            env=env,
            labels={"root": record.root_id},
            snapshot_dir=self.sandboxes.snapshot_dir(record.id),
            die_with_parent=self.die_with_parent,
            skill_dirs=self.prompts.skill_dirs(record.cwd, run_skill_paths(record)),
        )
        policy = record.sandbox_policy
        return spec if policy is None else apply_policy(spec, policy)

    def _attach_loop(self, live: LiveSession, context: ContextBuilder) -> None:
        settings = self.settings_of(live.record)
        chosen = live.record.run_settings
        if chosen is not None and chosen.mcp_servers:  # the run's own servers, for its family
            self.mcp.attach(live.record.root_id, chosen.mcp_servers, cwd=live.record.cwd)
        base, appended = run_prompts(live.record)
        live.loop = AgentLoop(
            session_id=live.id,
            client=ModelClient(live.model, settings),
            system_prompt=build_system_prompt(
                EnvironmentFacts(
                    cwd=live.record.cwd, model=live.model.selector, backend=live.record.backend
                ),
                tool_protocol=live.model.tool_protocol,
                base=base,
                appended=appended,
            ),
            get_sandbox=lambda: self.sandbox_of(live),
            record=lambda type_, payload: self.record(live, type_, payload),
            settings=settings,
            context=context,
            sink=self.sink,
            hooks=_Hooks(live, self.budgets),
            peek_sandbox=lambda: running_sandbox(live),  # compaction: kernel listing and drops
            refresh_prompt=lambda: self.prompts.build(live),
        )

    # -- loading sessions from the store (waking) ---------------------------------------------

    async def load_session(self, record: SessionRecord) -> LiveSession:
        """The live session for ``record``, loading it from the store when it is not loaded.

        A loaded session gets its model (through the resolver), its context rebuilt from the
        active path, its budget node (spending from the usage rows) and a driver. It has no
        sandbox until its next cell, and that sandbox is new: the REPL namespace is not
        revived, and the model is told so. Its parent is not loaded (only when it is needed,
        e.g. for a notice). Raises ``SessionNotLoadable`` or the resolver's ``UserError``.
        """
        live = self.sessions.get(record.id)
        if live is not None:
            return live
        future = self._loading.get(record.id)
        if future is None:
            future = asyncio.ensure_future(self._load(record.id))
            self._loading[record.id] = future
            future.add_done_callback(lambda _f: self._loading.pop(record.id, None))
        # shield: one waker giving up (cancelled) must not cancel the load the others wait on.
        return await asyncio.shield(future)

    async def load_session_id(self, session_id: str) -> LiveSession:
        live = self.sessions.get(session_id)
        if live is not None:
            return live
        record = await self.store.get_session(session_id)
        if record is None:
            raise SessionNotLoadable(f"no session {session_id}")
        return await self.load_session(record)

    async def _load(self, session_id: str) -> LiveSession:
        if self._closing:
            raise SessionNotLoadable("the orchestrator is closing")
        stopping = self._sandbox_stops.get(session_id)
        if stopping is not None:  # its last sandbox first (its snapshot, its record)
            await asyncio.wait({stopping})
        record = await self.store.get_session(session_id)  # the row as of now, not the caller's
        if record is None:
            raise SessionNotLoadable(f"no session {session_id}")
        if record.status in TERMINAL_STATES:
            raise SessionNotLoadable(f"session {session_id} is {record.status}")
        record, model = await self._stored_model(record)
        await self._ensure_budgets(record.root_id)
        if session_id in self.sessions:  # created or loaded meanwhile (cannot happen twice)
            return self.sessions[session_id]
        live = LiveSession(record=record, model=model, spec=self._spec(record), state=record.status)
        found = await read_context_path(self.store, session_id)  # back to the last compaction
        closed = await self._close_interrupted_cells(session_id, found.events, sink=True)
        path = found.events + closed
        context = ContextBuilder()
        context.load(found)
        context.extend(closed)
        adopted = await self.adopted.take(session_id)  # its kernel survived a daemon crash
        if adopted is not None:
            live.ensure_sandbox(lambda: self.sandboxes.started(live, _ready(adopted), revive=False))
        revived = adopted is None and self.sandboxes.revive_on_load(
            live, lambda: self._start_sandbox(live)
        )  # with a snapshot: the first turn's note says which names came back
        if any(event.type == "tool_result" for event in path) and not revived:
            note = RELOADED_NOTICE if adopted is None else ADOPTED_NOTICE
            live.notes.append(UserMessagePayload(text=note, source="harness"))
        self._attach_loop(live, context)
        loaded = self._move(live, _resting_state(live), "load")  # before anyone can see it
        self.sessions[session_id] = live
        self._start_driver(live)
        await self._publish(loaded)
        log.info("loaded session %s from the store (%d events on its path)", session_id, len(path))
        return live

    def remember_client_env(self, root_id: str, env: Mapping[str, str]) -> None:
        """The key variables the client that created ``root_id`` sent (``create_session``):
        its family's wakes read them before this process's environment. Memory only, never
        ``OPENAI_BASE_URL`` (the endpoint is stored with the session); the oldest roots are
        forgotten past ``CLIENT_ENV_ROOTS_MAX``."""
        kept = {k: v for k, v in env.items() if k != OPENAI_BASE_URL_ENV}
        if not kept:
            return
        self._client_env[root_id] = kept
        self._client_env.move_to_end(root_id)
        while len(self._client_env) > CLIENT_ENV_ROOTS_MAX:
            self._client_env.popitem(last=False)

    def _client_env_of(self, root_id: str) -> Mapping[str, str] | None:
        kept = self._client_env.get(root_id)
        return None if kept is None else {**os.environ, **kept}

    async def _stored_model(self, record: SessionRecord) -> tuple[SessionRecord, ResolvedModel]:
        """The model ``record`` stored, usable again (its endpoint, never this process's
        ``OPENAI_BASE_URL``); ``MissingCredentials`` when its key's variable is gone.

        A row from before migration 0007 has no spec: it is resolved from its selector with
        this process's config and environment, as it always was, and what that gives (with
        the sandbox policy of its backend here) is stored, so it does not drift again."""
        if record.spec_problem is not None:
            raise SessionNotLoadable(f"session {record.id} cannot be loaded: {record.spec_problem}")
        spec = record.model_spec
        if spec is not None:
            if spec.embedded:  # its endpoint is this process's server
                return record, await self._resolve(spec.selector)
            env = self._client_env_of(record.root_id)
            return record, resolve_stored(spec, self.settings, env=env, session=record.id)
        model = await self._resolve(record.model)
        fields: dict[str, Any] = {"model_spec": stored_model(model)}
        backend = self.backends.get(record.backend)
        if record.sandbox_policy is None and backend is not None:
            fields["sandbox_policy"] = policy_for(backend, self.settings)
        log.info(
            "session %s was stored without its endpoint (before migration 0007): it keeps %s "
            "at %s from now on",
            record.id,
            model.selector,
            model.api_base or "its provider's endpoint",
        )
        return await self.store.update_session(record.id, **fields), model

    async def _ensure_budgets(self, root_id: str) -> None:
        """Budget nodes for every session of the tree, spending from the store's usage rows.

        The whole tree, not just the session: its budget check walks its ancestors, and an
        ancestor's spending includes every descendant, loaded or not.
        """
        async with self._budget_lock:  # two loads in one tree must not add a node twice
            missing = [
                r for r in await self.store.family_sessions(root_id) if r.id not in self._budgeted
            ]
            if not missing:
                return
            # Calls an imported file brought were another installation's: never this budget's.
            summaries = await self.store.usage_summary([r.id for r in missing], imported=False)
            usage = {u.session_id: u for u in summaries}
            for rec in missing:  # parents first (ordered by depth): children link to them
                u = usage.get(rec.id)
                spent = billable_tokens(u.input, u.output, u.cache_write) if u else 0
                self.budgets.add(rec.id, rec.parent_id, rec.budget_tokens, spent)
                self._budgeted.add(rec.id)

    async def _close_interrupted_cells(
        self, session_id: str, path: list[EventRecord], *, sink: bool
    ) -> list[EventRecord]:
        """Record a result for every tool call on ``path`` that has none (its cell was running
        when the orchestrator died): the history is valid again, and the model learns the
        outcome is unknown instead of the cell being re-run."""
        answered = {e.payload.get("tool_call_id") for e in path if e.type == "tool_result"}
        added: list[EventRecord] = []
        for event in path:
            if event.type != "assistant_message":
                continue
            for call in event.payload.get("tool_calls") or []:
                call_id = call.get("id")
                if not isinstance(call_id, str) or call_id in answered:
                    continue
                payload = ToolResultPayload(
                    tool_call_id=call_id,
                    name=str(call.get("name") or "ipython"),
                    text=INTERRUPTED_CELL_TEXT,
                    is_error=True,
                    status=INTERRUPTED_CELL_STATUS,
                )
                rec = await self.store.append(session_id, "tool_result", payload)
                answered.add(call_id)
                added.append(rec)
                if sink:
                    self._push(rec)
        return added

    async def recover_interrupted(self) -> list[str]:
        """At start-up, before anything is loaded: sessions the store still calls running or
        idle belonged to an orchestrator that died. Mark an interrupted turn explicitly
        (``aborted``, plus a result for a cell that was running) and call them inactive."""
        recovered: list[str] = []
        for record in await self.store.list_sessions():
            if record.status not in STALE_LIVE_STATUSES or record.id in self.sessions:
                continue
            try:
                path = (await read_context_path(self.store, record.id)).events
                await self._close_interrupted_cells(record.id, path, sink=False)
                if record.status == "running":
                    await self.store.append(
                        record.id, "aborted", AbortedPayload(reason=RESTART_ABORT_REASON)
                    )
                    self.interrupted_turns.append(record.id)  # resumed after adoption
                await self.set_stored_state(record, "inactive", "recover")
                recovered.append(record.id)
            except Exception:  # one damaged session must not keep the others from recovering
                log.exception("could not recover session %s", record.id)
        return recovered

    async def sandbox_spec(self, record: SessionRecord) -> SandboxSpec:
        """The session's sandbox spec with its bus credentials (adopting a sandbox)."""
        spec = self._spec(record)
        if self.bus is not None:
            creds = await self.bus.credentials_env(record.id)
            spec = dataclasses.replace(spec, env={**spec.env, **creds})
        return spec

    async def _start_sandbox(self, live: LiveSession) -> Sandbox:
        if self.bus is not None:
            creds = await self.bus.credentials_env(live.id)
            live.spec = dataclasses.replace(live.spec, env={**live.spec.env, **creds})
        backend = self.backends.get(live.record.backend)
        if backend is None:  # never a silent fallback: the other backend may not isolate
            raise SandboxStartError(f"the {live.record.backend} backend is not available here")
        return await self.sandboxes.started(live, backend.create(live.spec))

    async def sandbox_of(self, live: LiveSession) -> Sandbox:
        task = await self.sandboxes.task_for(live, lambda: self._start_sandbox(live))
        try:
            return await asyncio.shield(task)
        except SandboxStartError:
            raise
        except Exception as exc:  # a backend bug must still reach the model as an error
            raise SandboxStartError(f"could not start the sandbox: {exc}") from exc

    def sandbox_failure(self, session_id: str) -> dict[str, Any] | None:
        """``{failures, error}`` while the session's sandbox is marked failed (its start backoff
        gave up, until the next prompt or a restart), else None."""
        return self.sandboxes.failure(session_id)

    def forget_sandbox(self, session_id: str) -> None:
        """Drop what the supervisor remembers of an unloaded session's sandbox (failed starts,
        backoff, the snapshot keeper): the session's next load starts from a clean slate."""
        self.sandboxes.forget(session_id)

    async def restart_sandbox(self, live: LiveSession) -> Sandbox:
        """A new sandbox for a loaded session, nothing else (``SandboxSupervisor.restart``): its
        record, context, driver and queued input stay as they are; its loaded descendants keep
        theirs. Raises ``SandboxStartError`` when the new sandbox does not start."""
        return await self.sandboxes.restart(live, lambda: self._start_sandbox(live))

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any:
        rec = await self.store.append(live.id, type_, payload)  # type: ignore[arg-type]
        if isinstance(payload, UsagePayload):
            self.budgets.spend(
                live.id, billable_tokens(payload.input, payload.output, payload.cache_write)
            )
        if isinstance(payload, UserMessagePayload):
            # A batch of notices (sessions/notices.py) records several deliveries at once.
            ids = [payload.message_id] if payload.message_id is not None else []
            for message_id in ids + list(payload.merged_message_ids or ()):
                live.inflight.discard(message_id)  # after the commit: the store has it now
                if self.bus is not None:
                    # Committed first, acked second: a crash in between leaves the message in
                    # both places, and redelivery drops it by message id (exactly once into
                    # context, R4). In the background: the ack is cleanup; a slow bus must not
                    # stall a turn.
                    self._background(self._ack(live.id, message_id))
        self._push(rec)
        return rec

    def _push(self, rec: EventRecord) -> None:
        live = self.sessions.get(rec.session_id)
        if live is not None and (live.pushed_seq is None or rec.seq > live.pushed_seq):
            live.pushed_seq = rec.seq
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

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)

    async def _ack(self, session_id: str, message_id: str) -> None:
        assert self.bus is not None
        try:
            await self.bus.ack_message(session_id, message_id)
        except Exception as exc:  # redelivery deduplicates; the message is already recorded
            log.warning("could not ack message %s of %s: %s", message_id, session_id, exc)

    # -- input ------------------------------------------------------------------------------

    async def deliver(
        self,
        dest: LiveSession,
        payload: UserMessagePayload,
        mode: Literal["steer", "follow_up"] = "follow_up",
    ) -> str:
        """A message for ``dest``: into its durable mailbox first, then into its queue.

        The mailbox put comes first so that a crash at any later moment (queued in memory,
        turn not started, daemon killed) still finds the message at the next start. It is
        acked when ``dest`` records it (``record``). Returns ``submit``'s receipt.
        """
        if dest.state in TERMINAL_STATES:
            raise ValueError(f"session {dest.id} is {dest.state}")
        if payload.message_id is None:
            payload = payload.model_copy(update={"message_id": "m-" + new_event_id()})
        if self.bus is not None:
            assert payload.message_id is not None
            envelope = {
                "id": payload.message_id,
                "mode": mode,
                "payload": payload.model_dump(mode="json"),
            }
            await self.bus.put_message(dest.id, envelope)
        return self.submit(dest, Inbound(payload, mode=mode))

    def submit(self, live: LiveSession, item: Inbound) -> str:
        """Queue input for a session; return "delivered" (it starts a turn now) or "queued"."""
        if live.state in TERMINAL_STATES:
            raise ValueError(f"session {live.id} is {live.state}")
        idle = live.state != "running"
        live.accept(item)
        return "delivered" if idle else "queued"

    def take_pending(self, live: LiveSession) -> list[Inbound]:
        """Take ``live``'s queued input out, steer messages first, then the follow-ups, each in
        order; none is left queued. For a session just unloaded, whose input would be lost with
        the object: the caller ``submit``s it to the session loaded again."""
        return live.take_pending()

    # -- the driver ---------------------------------------------------------------------------

    def _start_driver(self, live: LiveSession) -> None:
        """Run ``live``'s driver. A driver ends only by cancellation (unload, close); one that
        ends with an exception (a bug, e.g. an arrow ``store/lifecycle.py`` does not draw) is
        logged as one line naming the session, with the traceback at debug level."""
        live.driver = asyncio.create_task(self._drive(live), name=f"driver-{live.id}")
        live.driver.add_done_callback(_report_driver_end)

    async def _drive(self, live: LiveSession) -> None:
        assert live.loop is not None
        while True:
            while not live.has_work:
                live.wake.clear()
                await live.wake.wait()
            live.held = False  # the user spoke: what was held runs in order
            item = live.follow.popleft()
            await self._set_state(live, "running", "turn_start")
            outcome: TurnOutcome | None = None
            try:
                if is_notice(item):
                    # Every notice queued now (or, within the gather window, by a sibling that
                    # is finishing) goes into this one turn.
                    await self._await_sibling_notices(live)
                    item = gather_notices(live, item)
                await self.sandboxes.before_turn(live)  # revival note; a failed one retries
                await self._record_notes(live)
                outcome = await live.loop.run(item.payload)
            finally:
                if outcome is None:  # cancelled: the caller decides the state
                    live.last_outcome = TurnOutcome(reason="aborted")
            live.last_outcome = outcome
            live.turns += 1
            if _spent(live):
                # A spent budget ends the run: reports still coming wait for the user's next
                # message (which stops the same way before any model call) instead of each
                # starting a turn that records another budget stop after the run ended.
                live.held = True
            await after_turn(self, live, outcome)
            # Steer messages that arrived after the last model call start the next turn.
            for leftover in reversed(live.steer):
                live.follow.appendleft(leftover)
            live.steer.clear()
            # Tell the parent *before* this session looks settled: otherwise a print-mode run
            # could see the whole tree quiet in between and end before the parent hears.
            failed = outcome.reason not in ("completed", "aborted")  # error, limits, stuck...
            if failed or not live.follow:
                await self._notify_parent(live, outcome)
            if live.has_work:
                continue
            # A failed turn rests like any other: its typed error is in its events (error,
            # turn_end), and the next message starts a turn that calls the model again.
            await self._set_state(live, _resting_state(live), "turn_end")

    # -- post-turn work: harness, goals, autonomous mode (sessions/post_turn.py) ------------

    def harness_changed(self, owner: str) -> None:
        """Entries of ``owner`` changed: prompts built from them are rebuilt at next use."""
        self.prompts.changed(owner)

    def session_target(self, live: LiveSession) -> SessionTarget:
        return SessionTarget(self, live)

    def begin_goal_run(self, live: LiveSession, goal_id: str) -> None:
        """``live`` is continued for the goal ``goal_id`` from now on (a goal run): its post-turn
        work continues it while that goal is active and ends the run, with its ``run_stop``,
        once the goal completes or reaches its budget (sessions/post_turn.py). It starts no
        turn: the caller submits the goal's start text when the session is quiet."""
        live.goal_run = goal_id

    async def start_autonomous_run(self, session_id: str, policy: AutonomousPolicy) -> AutonomyRow:
        """Autonomous mode on for the session: a new run under ``policy``, its counters from
        zero, counted from the session's next turn (``Autonomy.enable``). A loaded session's
        previous run stop is history: its ``run_stop`` is None until this run stops."""
        row = await self.autonomy.enable(session_id, policy)
        live = self.sessions.get(session_id)
        if live is not None:
            live.run_stop = None
        return row

    async def _record_notes(self, live: LiveSession) -> None:
        assert live.loop is not None
        while live.notes:
            note = live.notes.pop(0)
            rec = await self.record(live, "user_message", note)
            live.loop.context.add("user_message", note, event_id=rec.id)

    # -- state changes: each one checked by store/lifecycle.py and announced ---------------------

    def _move(self, live: LiveSession, new: SessionStatus, why: Cause) -> Transition:
        """Change ``live``'s state, checked (``IllegalTransition`` for an arrow the lifecycle
        does not draw); the caller publishes the returned record. The only code that assigns
        ``LiveSession.state``."""
        moved = transition(live.id, live.state, new, why)
        live.state = new
        return moved

    async def _publish(self, moved: Transition) -> None:
        """Write a change of a loaded session to its row and announce it. The write is best
        effort: while the session is loaded its live state is the one that counts."""
        with contextlib.suppress(Exception):
            await self.store.set_status(moved.session_id, moved.new)
        await self._changed_notify(moved)

    async def _set_state(self, live: LiveSession, new: SessionStatus, why: Cause) -> Transition:
        moved = self._move(live, new, why)
        await self._publish(moved)
        return moved

    async def set_stored_state(
        self, record: SessionRecord, new: SessionStatus, why: Cause
    ) -> Transition:
        """Change the state of a session that is not loaded, from its row's: checked, written
        (a failed write raises) and announced."""
        moved = transition(record.id, record.status, new, why)
        await self.store.set_status(record.id, new)
        await self._changed_notify(moved)
        return moved

    async def _changed_notify(self, moved: Transition | None = None) -> None:
        """Wake whoever waits on the sessions (``wait_quiet``). ``moved``: the state change
        that wakes them, logged and kept in ``transitions``."""
        if moved is not None:
            self.transitions.append(moved)
            log.debug("%s", moved)
        async with self._changed:
            self._changed.notify_all()

    async def _notify_parent(self, live: LiveSession, outcome: TurnOutcome) -> None:
        """A child that failed, or finished without replying, tells its parent (docs/spec.md §3).

        A parent that is not loaded (the child was woken after a restart) is loaded for it.
        """
        parent_id = live.record.parent_id
        if parent_id is None:
            return
        parent = self.sessions.get(parent_id)
        if parent is None and not self._closing:
            try:
                parent = await self.load_session_id(parent_id)
            except (SessionNotLoadable, UserError) as exc:
                log.info("not notifying the parent of %s: %s", live.id, exc)
                return
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
        rec = await self.record(parent, "notice", NoticePayload(text=text))
        # Durable like an agent message: a notice queued behind a busy parent survives a crash.
        # Its text reaches the model once, in the parent's next turn, batched with every other
        # notice queued by then (sessions/notices.py); views show the notice event only.
        message = notice_message(text, rec.id)
        try:
            await self.deliver(parent, message)
        except Exception as exc:  # the bus failed: the notice still reaches a live parent
            log.warning("notice for %s not stored durably: %s", parent.id, exc)
            with contextlib.suppress(ValueError):
                self.submit(parent, Inbound(message, mode="follow_up"))

    def _children_running(self, live: LiveSession) -> bool:
        return any(
            s.record.parent_id == live.id and s.state == "running" for s in self.sessions.values()
        )

    async def _await_sibling_notices(self, live: LiveSession) -> None:
        """Up to ``NOTICE_GATHER_S`` while a child of ``live`` still runs: its notice, if it
        is about to finish, joins the batch instead of starting a turn of its own."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NOTICE_GATHER_S
        while self._children_running(live):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            live.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.wake.wait(), remaining)

    # -- quiescence and shutdown --------------------------------------------------------------

    def family(self, root_id: str) -> list[LiveSession]:
        return [s for s in self.sessions.values() if s.record.root_id == root_id]

    def _quiet(self, root_id: str) -> bool:
        root = self.sessions.get(root_id)
        if root is not None and root.state != "running" and _spent(root):
            # The tree's budget is spent (a root's counts every descendant's spending): no
            # session in it may call the model again, so reports still coming change nothing.
            return True
        # A spent session takes no more turns: its queued input waits for nothing.
        return all(
            s.state != "running" and (not s.has_work or _spent(s)) for s in self.family(root_id)
        )

    async def wait_quiet(self, root_id: str, timeout_s: float) -> None:
        """Until no session of the tree runs and no input waits (docs/spec.md §1, print mode)."""
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

    async def rename(self, session_id: str, name: str) -> SessionRecord:
        """Give a session (loaded or not) its display name; its row as it is now."""
        updated = await self.store.update_session(session_id, name=name)
        live = self.sessions.get(session_id)
        if live is not None:
            live.record = updated
        return updated

    async def unload(self, live: LiveSession, *, stop_later: bool = False) -> None:
        """Take a quiet session and its loaded descendants out of memory (docs/spec.md §4).

        Sandboxes stop and NATS users go; everything else is on disk, and ``load_session``
        brings the session back when a prompt, message or attach needs it. ``stop_later``:
        return before the sandboxes have stopped (a print-mode run's answer must not wait
        for them); loading the session again, or ``close``, waits for them.
        """
        for child in [s for s in self.sessions.values() if s.record.parent_id == live.id]:
            await self.unload(child, stop_later=stop_later)
        if live.driver is not None and not live.driver.done():
            live.driver.cancel()
            await asyncio.wait({live.driver})
        if stop_later and live.sandbox_task is not None:
            self._stop_sandbox_later(live)
        else:
            await self._stop_sandbox(live)
        if self.bus is not None:
            with contextlib.suppress(Exception):
                await self.bus.forget(live.id)
        if live.state in ("idle", "running"):  # a completed subagent stays completed
            await self._set_state(live, "inactive", "unload")
        self.sessions.pop(live.id, None)
        if live.record.parent_id is None:
            await self.mcp.detach(live.id)  # the family's own MCP servers; a wake restarts them

    async def abort_turn(self, live: LiveSession, *, state: SessionStatus | None = None) -> bool:
        """Stop the running turn; the session stays loaded, idle and ready for more input.

        ``stop_session`` ends a session for good; a user's abort does not. The driver is
        cancelled (the loop records ``aborted`` and interrupts a running cell, shielded) and a
        fresh driver starts for the same session. Steer messages that never reached the model
        move to the front of the follow-up queue, as between normal turns. ``state``: the
        state it rests in afterwards (default idle, or completed for a subagent).
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
            await self._set_state(live, state or _resting_state(live), "abort")
            self._start_driver(live)
            return True

    async def abort_tree(self, live: LiveSession) -> list[str]:
        """``abort``: stop the running turn of ``live`` and of every loaded descendant.

        Descendants first (deepest first), so no report reaches a parent after its own abort:
        a running descendant's turn is aborted (its ``aborted`` event recorded, its cell
        interrupted) and it is marked ``aborted``. ``live`` itself stays loaded and idle
        (``abort_turn``). Every session of the subtree holds its queued input that is not the
        user's (``LiveSession.held``): nothing starts again on its own, and the tree is quiet.
        When anything was aborted, ``live``'s outcome is ``aborted`` (what print mode reports).
        Returns the ids whose turn was aborted.
        """
        before = live.last_outcome
        if self._tree_running(live):
            # First: a print-mode wait that sees the tree go quiet part-way must read this.
            live.last_outcome = TurnOutcome(reason="aborted")
        live.held = True
        stopped = [sid for child in self._children(live) for sid in await self._abort_below(child)]
        if await self.abort_turn(live):
            stopped.append(live.id)
        if not stopped:
            live.last_outcome = before  # nothing ran after all
        await self._changed_notify()
        return stopped

    def _tree_running(self, live: LiveSession) -> bool:
        return live.state == "running" or any(self._tree_running(c) for c in self._children(live))

    def _children(self, live: LiveSession) -> list[LiveSession]:
        return [s for s in self.sessions.values() if s.record.parent_id == live.id]

    async def _abort_below(self, live: LiveSession) -> list[str]:
        stopped = [sid for child in self._children(live) for sid in await self._abort_below(child)]
        live.held = True
        if await self.abort_turn(live, state="aborted"):
            stopped.append(live.id)
        return stopped

    async def stop_session(self, live: LiveSession, *, state: StopState = "aborted") -> None:
        """Cancel a session and all its descendants; stop their sandboxes (cascade).

        ``aborted``: a running session becomes aborted, a resting one keeps its state (written
        again); ``deleted``: every one of them becomes a tombstone."""
        for child in [s for s in self.sessions.values() if s.record.parent_id == live.id]:
            if child.state != "deleted":
                await self.stop_session(child, state=state)
        if live.driver is not None and not live.driver.done():
            live.driver.cancel()
            with contextlib.suppress(BaseException):
                await live.driver
        if state == "deleted" and live.state != "deleted":
            await self._set_state(live, "deleted", "delete")
        elif live.state == "running":
            await self._set_state(live, "aborted", "stop")
        elif live.state != "deleted":
            await self._set_state(live, live.state, "restate")
        await self._stop_sandbox(live)
        if self.bus is not None:
            with contextlib.suppress(Exception):
                await self.bus.forget(live.id)
            if state == "deleted":  # its queued messages must not wake it at the next start
                with contextlib.suppress(Exception):
                    await self.bus.purge_messages(live.id)
        if live.record.parent_id is None and state == "deleted":
            await self.mcp.detach(live.id)

    def _stop_sandbox_later(self, live: LiveSession) -> None:
        task = asyncio.get_running_loop().create_task(
            self._stop_sandbox(live), name=f"stop-sandbox-{live.id}"
        )
        self._sandbox_stops[live.id] = task

        def done(_task: asyncio.Task[None], session_id: str = live.id) -> None:
            if self._sandbox_stops.get(session_id) is _task:
                del self._sandbox_stops[session_id]

        task.add_done_callback(done)

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
        stop = live.run_stop  # an autonomous or goal run: its stop reason names the end
        text = outcome.final_text if outcome else ""
        error_class = outcome.error_class if outcome is not None else None
        with contextlib.suppress(Exception):
            await self.record(
                live,
                "run_end",
                RunEndPayload(
                    reason=stop.reason if stop else reason,
                    final_text=text,
                    error_class=error_class,
                ),
            )
        # A failed run's session is not loaded any more and wakes for the next message.
        await self._set_state(live, RUN_END_STATES.get(reason, RUN_END_OTHERWISE), "run_end")

    async def close(self) -> None:
        self._closing = True
        await self.idle.close()
        await self.refiner.close()  # planning stops; a planned refinement applies next time
        if self.scheduler is not None:  # a tick claimed now is marked interrupted next start
            await self.scheduler.close()
        for live in list(self.sessions.values()):
            if live.record.parent_id is None:
                with contextlib.suppress(Exception):
                    await self.stop_session(live)
        if self._sandbox_stops:
            await asyncio.wait(set(self._sandbox_stops.values()))
        for name, backend in self.backends.items():  # stops adopted sandboxes not loaded too
            try:
                await backend.close()
            except Exception:
                log.exception("closing the %s backend failed", name)
        if self._acks:
            await asyncio.wait(set(self._acks), timeout=ACK_DRAIN_TIMEOUT_S)
        await self.mcp.close()  # every MCP server this orchestrator started
        await close_pools()  # the model connections kept alive for this loop's sessions


def _resting_state(live: LiveSession) -> SessionStatus:
    """Where a loaded session rests between turns: a subagent completed, a root idle."""
    return "completed" if live.record.parent_id else "idle"


def _spent(live: LiveSession) -> bool:
    outcome = live.last_outcome
    return outcome is not None and outcome.reason == "budget_exceeded"


async def _ready(sandbox: Sandbox) -> Sandbox:
    return sandbox


def _report_driver_end(task: asyncio.Task[None]) -> None:
    """Log a session driver that stopped with an exception (see ``Orchestrator._start_driver``)."""
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error(
        "%s stopped: %s (the session takes no more turns until it is reloaded)",
        task.get_name(),
        error,
    )
    log.debug("%s stopped", task.get_name(), exc_info=error)
