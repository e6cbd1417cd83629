"""The daemon's answers to control commands: a ``CommandHandler`` over the ``Orchestrator``.

Reads (``list_sessions``, ``get_session``, ``get_usage``, ``attach`` replays) come from the
store, so they show every session the database knows, live in this daemon or not. Writes
(``create_session``, ``prompt``, ``abort``, ``send_message``) act on live sessions through the
orchestrator. Every event a client sees was committed first (R1): ``attach`` replays rows from
DuckDB, and live events are pushed by the orchestrator's sink only after ``Store.append`` returned.

``attach`` answers with the events after the client's cursor, bounded by
``ATTACH_REPLAY_MAX_EVENTS`` and ``ATTACH_REPLAY_MAX_BYTES`` (the whole answer must fit in one
control line). When more were missed, the answer is a snapshot instead: the session row plus
the newest events that fit, marked ``snapshot: true``; the client replaces its local state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import ValidationError

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.journal import JOURNAL_FILE_NAME
from orchestrator.api.protocol import (
    Abort,
    Attach,
    Autonomous,
    Branch,
    Clone,
    Command,
    Compact,
    CreateSession,
    Detach,
    ExportSession,
    Fork,
    GetSession,
    GetUsage,
    Goal,
    HarnessAccept,
    HarnessEdit,
    HarnessList,
    HarnessLog,
    HarnessReject,
    Heartbeat,
    ImportSession,
    JsonObject,
    ListSessions,
    Ping,
    Prompt,
    RecordEvalResult,
    Refine,
    RefineRollback,
    RunCheck,
    SandboxControl,
    SandboxInfo,
    ScheduleAdd,
    ScheduleCancel,
    ScheduleList,
    SendMessage,
    SetModel,
    SetSessionName,
    Shutdown,
    SweepAddCells,
    SweepCancel,
    SweepClose,
    SweepList,
    SweepOpen,
    SweepStatus,
    SweepTrialFinish,
    SweepTrialStart,
    Tree,
    WaitQuiet,
)
from orchestrator.api.server import ClientInfo, CommandHandler, SessionSnapshot, package_version
from orchestrator.api.wire import E_BUSY, E_INVALID_ARGUMENT, E_NOT_FOUND, E_SHUTTING_DOWN
from orchestrator.control.autonomous import AutonomousPolicy
from orchestrator.control.gates import run_gate
from orchestrator.daemon import (
    control_commands,
    eval_commands,
    harness_commands,
    run_choices,
    sandbox_commands,
    sweep_commands,
    tree_commands,
)
from orchestrator.daemon.command_context import CommandContext, SessionControl
from orchestrator.errors import SandboxError, SandboxStartError, UserError
from orchestrator.ids import new_event_id
from orchestrator.models.lite import ensure_litellm
from orchestrator.models.registry import (
    OPENAI_BASE_URL_ENV,
    ResolvedModel,
    resolve_model,
    resolving_needs_litellm,
)
from orchestrator.sandbox.mounts import ExtraMount, check_mounts
from orchestrator.session_specs import StoredMount, StoredRunSettings
from orchestrator.sessions.accounting import UsageNode, build_usage_forest
from orchestrator.sessions.compaction import compact_session
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import (
    TERMINAL_STATES,
    FamilyTimeout,
    SessionNotLoadable,
)
from orchestrator.sessions.post_turn import begin_run, first_input
from orchestrator.sessions.sandbox_policy import SandboxChoice
from orchestrator.store.db import EventRecord, SessionRecord
from orchestrator.store.events import RunEndPayload, UserMessagePayload
from orchestrator.store.queries import UsageSummary, select_last_event_times

__all__ = [
    "ATTACH_REPLAY_MAX_BYTES",
    "ATTACH_REPLAY_MAX_EVENTS",
    "SESSION_NAME_MAX_CHARS",
    "DaemonControl",
    "DaemonHandler",
    "event_dict",
]

log = logging.getLogger(__name__)

# An attach replays at most this many missed events; past it the client gets a snapshot.
ATTACH_REPLAY_MAX_EVENTS: Final = 1000
# ... and at most this many bytes of event JSON: half the 1 MiB line cap (MAX_LINE_BYTES),
# leaving room for the session row and the envelope.
ATTACH_REPLAY_MAX_BYTES: Final = 512 * 1024
# A default session name is the task's first line, cut to this length (as print mode does).
SESSION_NAME_MAX_CHARS: Final = 64
# A rejected path is quoted back this far (it may be huge).
MAX_SHOWN_PATH_CHARS: Final = 200
# Exports hold the whole conversation: private to the user, like the database.
EXPORT_FILE_MODE: Final = 0o600
# A session's parent chain is walked at most this deep when routing family events (a guard
# against a damaged tree; real trees are MAX_DEPTH + 1 deep).
LINEAGE_MAX_DEPTH: Final = 64
# How long run_check waits for the session's tree to go quiet before it answers busy.
CHECK_QUIET_WAIT_S: Final = 5.0


class HandlerSessionControl(SessionControl, Protocol):
    """The orchestrator as the handler sees it (``Orchestrator``): what every command may ask
    (``SessionControl``) plus creating and waking sessions, print mode's quiet wait and its
    last event."""

    async def create_session(
        self,
        *,
        model: ResolvedModel,
        cwd: Path,
        name: str | None,
        budget: int | None,
        backend: str | None,
        refine: bool | None,
        sandbox: SandboxChoice | None,
        run_settings: StoredRunSettings | None,
    ) -> LiveSession:
        """A new root session and its driver (its sandbox starts now); ``run_settings``: what
        its run chose over the config, for its family only."""
        ...

    async def load_session(self, record: SessionRecord) -> LiveSession:
        """The live session for ``record``, loaded from the store when it is not loaded."""
        ...

    def remember_client_env(self, root_id: str, env: Mapping[str, str]) -> None:
        """The client's key variables for ``root_id``'s family, in memory only."""
        ...

    async def wait_quiet(self, root_id: str, timeout_s: float) -> None:
        """Until no session of the tree runs and no input waits (``FamilyTimeout``)."""
        ...

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any:
        """Append an event to ``live``'s history (pushed to attached clients)."""
        ...


class DaemonControl(CommandContext, Protocol):
    """What the handler needs from the daemon that owns it (``service.Daemon``): what every
    command may use (``CommandContext``) plus readiness, the socket and shutdown, and the
    orchestrator with what only the handler asks of it (``HandlerSessionControl``)."""

    socket_path: Path
    started_monotonic: float

    @property
    def orch(self) -> HandlerSessionControl: ...

    @property
    def ready(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    async def wait_ready(self) -> None: ...

    async def abort_tree(self, live: LiveSession) -> list[str]:
        """Stop the running turns of ``live`` and its descendants; ``live`` stays idle and
        addressable. The ids whose turn was aborted."""
        ...

    def request_shutdown(self) -> None: ...


def event_dict(rec: EventRecord) -> JsonObject:
    """An event as clients see it: the same shape the orchestrator's sink pushes live."""
    return {
        "type": rec.type,
        "session_id": rec.session_id,
        "seq": rec.seq,
        "id": rec.id,
        "parent_id": rec.parent_event_id,
        "ts": rec.ts.isoformat(),
        "payload": rec.payload,
    }


def _session_dict(rec: SessionRecord, live: LiveSession | None) -> JsonObject:
    return {
        "id": rec.id,
        "name": rec.name,
        # A live session's state is the truth; the row can lag by one status write.
        "status": live.state if live is not None else rec.status,
        "live": live is not None,
        "depth": rec.depth,
        "backend": rec.backend,
        "model": rec.model,
        "parent_id": rec.parent_id,
        "root_id": rec.root_id,
        "rlm_child_id": rec.rlm_child_id,
        "cwd": rec.cwd,
        "forked_from": rec.forked_from,  # fork/clone: the session it was copied from
        "forked_at": rec.forked_at,
        "refine_enabled": rec.refine_enabled,
        "created_at": rec.created_at.isoformat(),
        "updated_at": rec.updated_at.isoformat(),
    }


def model_env(client_env: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """Where a new session's model reads its key and ``OPENAI_BASE_URL``: with a client's
    environment, that first and the daemon's for the rest — but never the daemon's
    ``OPENAI_BASE_URL``, which would send the client's history to an endpoint it did not name;
    without one (the TUI, other clients), the daemon's own (None)."""
    if client_env is None:
        return None
    env = {k: v for k, v in os.environ.items() if k != OPENAI_BASE_URL_ENV}
    env.update(client_env)
    return env


def _policy(command: CreateSession) -> AutonomousPolicy | None:
    """The autonomous policy a ``create_session`` asks for, checked before anything exists."""
    if command.autonomous is None:
        return None
    try:
        return AutonomousPolicy.model_validate(command.autonomous.model_dump(exclude_none=True))
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise ApiCommandError(E_INVALID_ARGUMENT, f"autonomous: {message}") from None


def _mounts(command: CreateSession, cwd: Path) -> tuple[StoredMount, ...] | None:
    """The extra mounts a ``create_session`` asks for, checked before anything exists
    (sandbox/mounts.py); a backend without containers refuses them when it starts one."""
    if not command.mounts:
        return None
    asked = [ExtraMount(Path(m.source), m.target, m.read_only) for m in command.mounts]
    try:
        checked = check_mounts(asked, cwd.resolve())
    except SandboxStartError as exc:
        raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None
    return tuple(
        StoredMount(source=str(m.source), target=m.target, read_only=m.read_only) for m in checked
    )


async def _begin_run(
    daemon: DaemonControl,
    live: LiveSession,
    policy: AutonomousPolicy | None,
    command: CreateSession,
) -> str | None:
    """Autonomous mode and a goal for a new session (docs/control.md)."""
    goal = None
    if command.goal is not None:
        goal = (command.goal.objective, command.goal.token_budget)
    try:
        return await begin_run(daemon.orch, live, autonomous=policy, goal=goal)
    except UserError as exc:
        raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None


def _flatten(nodes: list[UsageNode]) -> dict[str, UsageNode]:
    out: dict[str, UsageNode] = {}
    stack = list(nodes)
    while stack:
        node = stack.pop()
        out[node.session.id] = node
        stack.extend(node.children)
    return out


def _live_status(node: JsonObject, loaded: Callable[[str], LiveSession | None]) -> None:
    """A usage node's status and sandbox (and its children's) as the live sessions have them
    now."""
    live = loaded(str(node.get("session_id")))
    if live is not None:
        node["status"] = live.state
        node["sandbox"] = sandbox_commands.sandbox_name(live)
    for child in node.get("children") or []:
        _live_status(child, loaded)


def _json_size(obj: object) -> int:
    return len(json.dumps(obj, ensure_ascii=False, default=str).encode())


class DaemonHandler(CommandHandler):
    def __init__(self, daemon: DaemonControl):
        self.daemon = daemon
        self.cpu = sandbox_commands.CpuMeter()  # sandbox_info's CPU percent between calls

    # ---------------------------------------------------------------------------- dispatch

    async def handle(self, client: ClientInfo, command: Command) -> Any:
        if isinstance(command, Ping):
            if command.wait_ready and not self.daemon.stopping:
                await self.daemon.wait_ready()
            return self._ping()
        if self.daemon.stopping and not isinstance(command, Shutdown | Detach):
            raise ApiCommandError(E_SHUTTING_DOWN, "the daemon is stopping")
        await self.daemon.wait_ready()
        match command:
            case ListSessions():
                return await self._list_sessions(command)
            case GetSession():
                return await self._get_session(command.session, command.recent)
            case CreateSession():
                return await self._create_session(command)
            case Prompt():
                return await self._submit(command.session, command.text, command.mode)
            case SendMessage():
                return await self._submit(command.session, command.text, "follow_up")
            case Abort():
                return await self._abort(command.session)
            case Attach():
                return await self._attach(command.session, command.cursor, command.family)
            case Detach():
                return {"detached": True, "session": command.session}
            case GetUsage():
                return await self._usage(command)
            case ExportSession():
                return await self._export(command.session, command.path)
            case Tree():
                rec = await self._record(command.session)
                return await tree_commands.tree_page(self.daemon, rec, command)
            case Branch():
                rec = await self._record(command.session)
                return await tree_commands.branch(self.daemon, rec, command)
            case Fork() | Clone():
                rec = await self._record(command.session)
                return await tree_commands.copy(self.daemon, rec, command)
            case ImportSession():
                return await tree_commands.import_file(self.daemon, command)
            case Compact():  # now when idle, at the next step boundary when in a turn
                live = await self._live(command.session)
                return {"session": live.id, **await compact_session(live, command.instructions)}
            case SetModel():
                live = await self._live(command.session)
                return await harness_commands.set_model(self.daemon, live, command)
            case Refine():
                live = await self._live(command.session)
                return await harness_commands.refine(self.daemon, live, command)
            case RefineRollback():
                return await harness_commands.rollback(self.daemon, command)
            case HarnessAccept() | HarnessReject():
                return await harness_commands.decide(self.daemon, command)
            case HarnessLog() | HarnessList() | HarnessEdit():
                named = await self._record(command.session) if command.session else None
                return await harness_commands.by_record(self.daemon, named, command)
            case ScheduleAdd():
                return await control_commands.schedule_add(
                    self.daemon, await self._record(command.session), command
                )
            case ScheduleList():
                named = await self._record(command.session) if command.session else None
                return await control_commands.schedule_list(self.daemon, named, command)
            case ScheduleCancel():
                return await control_commands.schedule_cancel(self.daemon, command)
            case Heartbeat():
                rec = await self._record(command.session)
                return await control_commands.heartbeat(self.daemon, rec, command)
            case Goal():
                live = await self._live(command.session)
                return await control_commands.goal(self.daemon, live, command)
            case SandboxInfo():  # never wakes the session
                rec = await self._record(command.session)
                return await sandbox_commands.sandbox_info(self.daemon, self.cpu, rec)
            case SandboxControl():
                rec = await self._record(command.session)
                return await sandbox_commands.sandbox_control(self.daemon, self.cpu, rec, command)
            case Autonomous():
                rec = await self._record(command.session)
                return await control_commands.autonomous(self.daemon, rec, command)
            case WaitQuiet():
                return await self._wait_quiet(command.session, command.timeout_s, command.release)
            case SetSessionName():
                return await self._set_session_name(command)
            case RunCheck():
                return await self._run_check(command)
            case RecordEvalResult():
                rec = await self._record(command.session)
                return await eval_commands.record_eval_result(self.daemon, rec, command)
            case (
                SweepOpen()
                | SweepAddCells()
                | SweepTrialStart()
                | SweepTrialFinish()
                | SweepStatus()
                | SweepList()
                | SweepCancel()
                | SweepClose()
            ):
                return await sweep_commands.handle_sweep(self.daemon, command, self._abort)
            case Shutdown():
                return self._shutdown(command.force)
        raise AssertionError(f"unhandled command {command.type}")  # pragma: no cover

    async def _export(self, selector: str, path_text: str) -> JsonObject:
        """The session as pi v3 JSONL, written to ``path`` (0600, replaced atomically)."""
        from orchestrator.store.jsonl import export_session_jsonl

        rec = await self._record(selector)
        path = Path(path_text)
        try:
            usable = path.is_absolute() and path.parent.is_dir() and not path.is_dir()
        except (OSError, ValueError):
            usable = False
        if not usable:
            shown = path_text[:MAX_SHOWN_PATH_CHARS]
            raise ApiCommandError(E_INVALID_ARGUMENT, f"cannot write an export to {shown!r}")
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, EXPORT_FILE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                await export_session_jsonl(self.daemon.store, rec.id, fh)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise ApiCommandError(E_INVALID_ARGUMENT, f"cannot write {path}: {exc}") from None
        return {"session": rec.id, "path": str(path), "bytes": path.stat().st_size}

    async def _wait_quiet(self, selector: str, timeout_s: float, release: bool) -> JsonObject:
        """Print mode through the daemon: the tree's quiet point and the root's last outcome."""
        live = await self._live(selector)
        orch = self.daemon.orch
        try:
            await orch.wait_quiet(live.record.root_id, timeout_s)
        except FamilyTimeout as exc:
            raise ApiCommandError(E_BUSY, str(exc)) from None
        outcome = live.last_outcome
        error = outcome.error if outcome is not None else None
        stop = live.run_stop
        result: JsonObject = {
            # An autonomous or goal run: how it stopped and the exit code (docs/control.md).
            "stop_reason": stop.reason if stop is not None else None,
            "stop_detail": stop.detail if stop is not None else None,
            "exit_code": stop.exit_code if stop is not None else None,
            "session": live.id,
            "reason": outcome.reason if outcome is not None else "none",
            "final_text": outcome.final_text if outcome is not None else "",
            "error": str(error) if error is not None else None,
            "error_class": outcome.error_class if outcome is not None else None,
            # The CLI maps this to exit code 2 (the user can fix it), as in-process runs do.
            "user_error": isinstance(error, UserError),
        }
        if outcome is not None:
            # The run's last event, as an in-process print-mode run records it; pushed to the
            # client before this answer (same queue), so a JSON stream ends with it.
            ended = stop.reason if stop is not None else outcome.reason
            payload = RunEndPayload(
                reason=ended, final_text=outcome.final_text, error_class=outcome.error_class
            )
            await orch.record(live, "run_end", payload)
        if release and live.record.parent_id is None:
            # The answer goes out while the tree's sandboxes stop (~0.3 s): a print-mode run
            # exits on it. Loading the session again waits for them (Orchestrator.unload).
            await orch.unload(live, stop_later=True)
        return result

    async def _set_session_name(self, command: SetSessionName) -> JsonObject:
        name = command.name.strip()
        if not name:
            raise ApiCommandError(E_INVALID_ARGUMENT, "a session name must not be blank")
        rec = await self._record(command.session)
        await self.daemon.orch.rename(rec.id, name)
        return {"session": rec.id, "name": name}

    async def _run_check(self, command: RunCheck) -> JsonObject:
        """A command in a quiet session's sandbox (a sweep's verifier); never while its tree
        works, so the check sees what the agent left, not a workspace being changed."""
        live = await self._live(command.session)
        orch = self.daemon.orch
        try:
            await orch.wait_quiet(live.record.root_id, CHECK_QUIET_WAIT_S)
        except FamilyTimeout:
            raise ApiCommandError(
                E_BUSY, f"session {live.id} is working: a check runs once its tree is quiet"
            ) from None
        try:
            sandbox = await orch.sandbox_of(live)
        except SandboxError as exc:
            raise ApiCommandError(E_INVALID_ARGUMENT, f"no sandbox: {exc}") from None
        gate = await run_gate(
            sandbox,
            command.command,
            cwd=live.record.cwd,
            timeout_s=command.timeout_s,
            cell_id=f"check-{new_event_id()}",
        )
        if command.release and live.record.parent_id is None:
            await orch.unload(live, stop_later=True)
        return {
            "exit_code": gate.exit_code,
            "passed": gate.passed,
            "timed_out": gate.timed_out,
            "output": gate.output,
            "duration_ms": round(gate.duration_ms, 1),
        }

    async def snapshot(self, client: ClientInfo, session: str) -> SessionSnapshot | None:
        """A slow client that was resynced gets the same tail an attach without cursor gets."""
        rec = await self.daemon.store.get_session(session)
        if rec is None:
            return None
        data = await self._replay(rec, None)
        return SessionSnapshot(cursor=int(data["cursor"]), data=data)

    def ancestors(self, session: str) -> Sequence[str]:
        """Parent chain of a loaded session, then its root: family attaches get its events."""
        try:
            orch = self.daemon.orch
        except ApiCommandError:  # still starting
            return ()
        live = orch.loaded(session)
        if live is None:
            return ()
        chain: list[str] = []
        parent = live.record.parent_id
        while parent is not None and len(chain) < LINEAGE_MAX_DEPTH:
            chain.append(parent)
            above = orch.loaded(parent)
            parent = above.record.parent_id if above is not None else None
        if live.record.root_id != live.id and live.record.root_id not in chain:
            chain.append(live.record.root_id)
        return chain

    def journal_path(self) -> Path | None:
        """The idempotency journal lives next to the socket (private runtime directory)."""
        return self.daemon.socket_path.parent / JOURNAL_FILE_NAME

    # ---------------------------------------------------------------------------- helpers

    async def _record(self, selector: str) -> SessionRecord:
        """A session by id, unique id prefix or name (as the CLI accepts them)."""
        try:
            rec = await self.daemon.store.find_session(selector)
        except UserError as exc:  # several match
            raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None
        if rec is None:
            raise ApiCommandError(E_NOT_FOUND, f"no session matches {selector!r}")
        return rec

    async def _live(self, selector: str) -> LiveSession:
        """The session, loaded (woken) from the store when this daemon has not loaded it.

        A loaded session's exact id is answered from memory: an exact id wins outright in
        ``find_session`` too, and the store read (plus the ingest it forces) was most of a
        prompt's cost on the writer thread with many sessions busy.
        """
        live = self.daemon.orch.loaded(selector)
        if live is not None:
            return live
        return await self._wake(await self._record(selector))

    async def _wake(self, rec: SessionRecord) -> LiveSession:
        live = self.daemon.orch.loaded(rec.id)
        if live is not None:
            return live
        try:
            return await self.daemon.orch.load_session(rec)
        except SessionNotLoadable as exc:
            raise ApiCommandError(E_BUSY, f"session {rec.id} cannot be woken: {exc}") from None
        except UserError as exc:  # its model cannot be resolved with this daemon's config
            raise ApiCommandError(E_BUSY, f"session {rec.id} cannot be woken: {exc}") from None

    # ---------------------------------------------------------------------------- commands

    def _ping(self) -> JsonObject:
        ready = self.daemon.ready and not self.daemon.stopping
        sessions = self.daemon.orch.loaded_sessions() if ready else []
        live = [s for s in sessions if s.state not in TERMINAL_STATES]
        return {
            "pong": True,
            "ready": ready,
            "pid": os.getpid(),
            "version": package_version(),
            "socket": str(self.daemon.socket_path),
            "uptime_s": round(time.monotonic() - self.daemon.started_monotonic, 3),
            "sessions": len(live),
            "running": sum(1 for s in live if s.state == "running"),
            "stopping": self.daemon.stopping,
        }

    async def _sessions_and_usage(
        self, root_id: str | None
    ) -> tuple[list[SessionRecord], list[UsageSummary]]:
        """The sessions of one tree (by its root's id) and their usage, or the whole store's.

        A TUI chat asks for its own tree every second; reading one tree keeps that cost the
        tree's, not the store's (a multi-day run leaves thousands of sessions behind). Trees
        are closed under ``parent_id`` (a fork starts a new root), so a tree's forest equals
        that tree in the whole store's forest.
        """
        store = self.daemon.store
        if root_id is None:
            return await store.list_sessions(), await store.usage_summary()
        records = await store.family_sessions(root_id)
        return records, await store.usage_summary([rec.id for rec in records])

    async def _list_sessions(self, command: ListSessions) -> JsonObject:
        scope = None
        if command.parent is not None:
            parent = await self.daemon.store.get_session(command.parent)
            scope = parent.root_id if parent is not None else None
        records, summaries = await self._sessions_and_usage(scope)
        nodes = _flatten(build_usage_forest(records, summaries))
        last = await self.daemon.store.read(select_last_event_times)  # one query for all
        records.sort(key=lambda rec: (rec.created_at, rec.id))  # oldest first
        matching = [
            rec
            for rec in records
            if not (command.roots_only and rec.parent_id is not None)
            and (command.cwd is None or rec.cwd == command.cwd)
            and (command.parent is None or rec.parent_id == command.parent)
        ]
        chosen = matching[-command.limit :] if command.limit else matching
        rows = []
        for rec in chosen:
            live = self.daemon.orch.loaded(rec.id)
            row = _session_dict(rec, live)
            when = last.get(rec.id)
            row["last_activity"] = when.isoformat() if when is not None else None
            # What a loaded session's loop is doing, and its queued input (docs/tui.md).
            loop = live.loop if live is not None else None
            row["activity"] = loop.activity if loop is not None else None
            row["pending"] = live.pending if live is not None else 0
            node = nodes.get(rec.id)
            if node is not None:
                row["usage"] = {"own": node.own.as_dict(), "total": node.total.as_dict()}
            rows.append(row)
        return {"sessions": rows, "total": len(matching)}

    async def _get_session(self, selector: str, recent: int) -> JsonObject:
        rec = await self._record(selector)
        live = self.daemon.orch.loaded(rec.id)
        row = _session_dict(rec, live)
        if live is not None:
            row["pending"] = live.pending
            row["turns"] = live.turns
        result: JsonObject = {"session": row}
        if recent:
            # The newest events that fit the replay bound; `cursor` is the newest seq, from
            # which a client can attach to get only what follows.
            newest = await self.daemon.store.recent_events(rec.id, recent)
            budget = ATTACH_REPLAY_MAX_BYTES
            kept: deque[JsonObject] = deque()
            for event in reversed([event_dict(e) for e in newest]):
                size = _json_size(event)
                if size > budget:
                    break
                budget -= size
                kept.appendleft(event)
            result["events"] = list(kept)
            result["cursor"] = newest[-1].seq if newest else 0
        return result

    async def _create_session(self, command: CreateSession) -> JsonObject:
        daemon = self.daemon
        cwd = Path(command.cwd)
        try:
            usable = cwd.is_absolute() and cwd.is_dir()
        except (OSError, ValueError):  # NUL bytes, a name too long for the filesystem
            usable = False
        if not usable:
            shown = command.cwd[:MAX_SHOWN_PATH_CHARS]
            raise ApiCommandError(E_INVALID_ARGUMENT, f"cwd {shown!r} is not an absolute directory")
        policy = _policy(command)
        mounts = _mounts(command, cwd)
        chosen = command.settings  # a run's own choices (an eval config): this session only
        try:
            settings, notice = daemon.settings_for_new_session()  # config.toml as it is now
            if chosen is not None:
                settings = run_choices.model_settings(settings, command.model, chosen)
            choice = await daemon.choose_backend(command.backend)
            if resolving_needs_litellm(command.model, settings):
                await ensure_litellm()  # its first import must not stall the daemon's loop
            model = resolve_model(
                command.model,
                settings,
                api_base=command.api_base,
                env=model_env(command.client_env),
            )
            model = await daemon.endpoint_for(model)
        except UserError as exc:
            raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None
        task = (command.task or "").strip()
        name = command.name or (task.splitlines()[0][:SESSION_NAME_MAX_CHARS] if task else None)
        budget = settings.session_token_budget
        if chosen is not None and chosen.session_token_budget is not None:
            budget = chosen.session_token_budget
        live = await daemon.orch.create_session(
            model=model,
            cwd=cwd.resolve(),
            name=name,
            budget=budget,
            backend=choice.name,
            refine=command.refine
            if command.refine is not None
            else settings.harness.refine_enabled,
            sandbox=SandboxChoice(
                image=command.image,
                workspace=command.workspace,
                network=command.network,
                memory_bytes=run_choices.memory_bytes(chosen),
                cpus=chosen.cpus if chosen is not None else None,
                mounts=mounts,
            ),
            run_settings=run_choices.stored_run_settings(chosen),
        )
        if command.client_env:  # its family's wakes read the key from here, not our env
            daemon.orch.remember_client_env(live.id, command.client_env)
        start = await _begin_run(daemon, live, policy, command)
        status = None
        if task or start is not None:
            status = daemon.orch.submit(live, first_input(live, command.task or "", start))
        return {
            "session": live.id,
            "name": live.record.name,
            "model": model.selector,
            "backend": live.record.backend,
            "prompt": status,
            "warning": choice.warning or None,  # local: NOT isolated (the CLI and TUI show it)
            "notice": notice,  # config.toml changed where only a restart applies it
        }

    async def _submit(self, selector: str, text: str, mode: str) -> JsonObject:
        if not text.strip():
            raise ApiCommandError(E_INVALID_ARGUMENT, "the text is empty")
        live = await self._live(selector)
        if live.driver is None or live.driver.done():
            raise ApiCommandError(E_BUSY, f"session {live.id} is {live.state} and takes no input")
        item = Inbound(
            UserMessagePayload(text=text), mode="steer" if mode == "steer" else "follow_up"
        )
        try:
            status = self.daemon.orch.submit(live, item)
        except ValueError as exc:  # a terminal session (aborted, deleted, error)
            raise ApiCommandError(E_BUSY, str(exc)) from None
        return {"session": live.id, "status": status}

    async def _abort(self, selector: str) -> JsonObject:
        rec = await self._record(selector)
        live = self.daemon.orch.loaded(rec.id)
        if live is None:  # not loaded: no turn runs, and waking it only to abort is pointless
            return {"session": rec.id, "aborted": False, "status": rec.status, "sessions": []}
        # Cascades: the turns of its running descendants are aborted too (children first).
        aborted = await self.daemon.abort_tree(live)
        return {
            "session": live.id,
            "aborted": bool(aborted),
            "status": live.state,
            "sessions": aborted,
        }

    async def _attach(self, selector: str, cursor: int | None, family: bool) -> JsonObject:
        rec = await self._record(selector)
        if rec.id != selector:
            # The server attached the client under the name it sent; events are broadcast under
            # the id, so a prefix or name would attach to nothing. Ask for the id.
            raise ApiCommandError(E_INVALID_ARGUMENT, f"attach by session id ({rec.id})")
        if rec.status not in TERMINAL_STATES:
            # Attaching wakes an inactive session (docs/spec.md §4). The history is readable even
            # when it cannot be woken, so a failure only costs the wake-up.
            try:
                await self._wake(rec)
            except ApiCommandError as exc:
                log.info("attach did not wake %s: %s", rec.id, exc)
            rec = await self._record(rec.id)
        result = await self._replay(rec, cursor)
        if family:
            # Descendants that exist already (the server routes their future events here):
            # the client attaches to each for what they recorded before.
            result["family"] = await self._descendants(rec)
        return result

    async def _descendants(self, rec: SessionRecord) -> list[str]:
        tree = await self.daemon.store.family_sessions(rec.root_id)  # parents before children
        inside = {rec.id}
        out: list[str] = []
        for member in tree:
            if member.parent_id in inside:
                inside.add(member.id)
                out.append(member.id)
        return out

    async def _replay(self, rec: SessionRecord, cursor: int | None) -> JsonObject:
        """Events after ``cursor``, or a bounded snapshot when there are too many (see module)."""
        store = self.daemon.store
        after = cursor or 0
        # Only the newest ATTACH_REPLAY_MAX_EVENTS are read (an indexed, bounded query): the
        # cost does not grow with the history. ``seq`` is dense per session (1, 2, 3 ...), so
        # when the tail is full the number missed is the distance from the cursor.
        newest = await store.recent_events(rec.id, ATTACH_REPLAY_MAX_EVENTS)
        tail = [e for e in newest if e.seq > after]
        missed = len(tail) if len(tail) < ATTACH_REPLAY_MAX_EVENTS else int(tail[-1].seq) - after
        events = [event_dict(e) for e in tail]
        budget = ATTACH_REPLAY_MAX_BYTES
        kept: deque[JsonObject] = deque()
        for event in reversed(events):
            size = _json_size(event)
            if size > budget:
                break
            budget -= size
            kept.appendleft(event)
        snapshot = len(kept) < missed
        last = int(tail[-1].seq) if tail else (cursor or 0)
        live = self.daemon.orch.loaded(rec.id)
        return {
            "session": _session_dict(rec, live),
            "cursor": last,
            "snapshot": snapshot,
            "missed": missed,
            "events": list(kept),
        }

    async def _usage(self, command: GetUsage) -> JsonObject:
        rec = await self._record(command.session) if command.session is not None else None
        records, summaries = await self._sessions_and_usage(rec.root_id if rec else None)
        orch = self.daemon.orch
        paged = command.rows and command.rows_limit is not None
        out = []
        if not paged:  # a page of rows carries no forest (nor builds one)
            forest = build_usage_forest(records, summaries)
            if rec is None:
                nodes = forest[-command.limit :] if command.limit else forest
            else:
                node = _flatten(forest).get(rec.id)
                nodes = [node] if node is not None else []
            for node in nodes:
                data = node.as_dict()
                if not command.tree:
                    data["children"] = []
                _live_status(data, orch.loaded)
                out.append(data)
        result: JsonObject = {"usage": out}
        if command.rows:
            # Per-session rows for `prime-agent usage`: the selected session, or every one;
            # with `rows_limit`, one page of them and how many there are.
            chosen = [s for s in summaries if rec is None or s.session_id == rec.id]
            if command.rows_limit is not None:
                result["rows_total"] = len(chosen)
                chosen = chosen[command.rows_offset : command.rows_offset + command.rows_limit]
            by_id = {r.id: r for r in records}
            rows = []
            for summary in chosen:
                row = asdict(summary)
                known = by_id.get(summary.session_id)
                loaded = orch.loaded(summary.session_id)
                status = known.status if known is not None else ""
                row["status"] = loaded.state if loaded is not None else status
                row["name"] = known.name if known is not None else None
                rows.append(row)
            result["rows"] = rows
        return result

    def _shutdown(self, force: bool) -> JsonObject:
        if self.daemon.stopping:
            return {"stopping": True, "pid": os.getpid(), "aborting": []}
        running = [s.id for s in self.daemon.orch.loaded_sessions() if s.state == "running"]
        if running and not force:
            raise ApiCommandError(
                E_BUSY,
                f"{len(running)} session(s) are running ({', '.join(running[:3])}); "
                "use force to abort them",
            )
        # Answer first: the daemon stops after this response has been queued.
        asyncio.get_running_loop().call_soon(self.daemon.request_shutdown)
        return {"stopping": True, "pid": os.getpid(), "aborting": running}
