"""``prime-agent --mode acp``: an Agent Client Protocol agent on stdio (docs/acp.md).

JSON-RPC 2.0, one message per line on stdout (nothing else is ever written there; diagnostics
go to stderr), through the ``agent-client-protocol`` package. The session itself lives in the
daemon, like every other: ``session/new`` creates a root session there (in the client's
``cwd``), ``session/prompt`` runs one turn of it, ``session/cancel`` aborts it and its
subagents, ``session/close`` lets it go (it stays in the store, and ``prime-agent attach`` can
follow it). One session per connection, one turn at a time, as the reference does.

Turn lifecycle (Prime Agent's ``_meta``, ``acp_updates.META_NAMESPACE``): every update carries
``promptTurnId`` (the turn that caused it; 0 when none did), ``eventSequence`` (strictly
increasing over the connection, in delivery order) and ``phase``. When the root's turn ends,
the agent publishes a ``responseBoundary`` update (``outcome`` ``result`` or ``error``,
``terminalQuiescenceExpected``), then an ``event`` with ``quiescence``
(``outstandingSubagents``, ``remainingAutonomousContinuations``) as observed, then answers
the prompt; once the whole tree is quiet (every subagent finished) it publishes the
``terminalQuiescence`` update, and the next prompt waits for it. Subagents appear as
``session_info_update``s with ``subagents: [{id, sessionName, status, model, depth}]``, their
``promptTurnId`` the turn that spawned them (0 once that turn's terminal update is out).

Stop reasons: ``end_turn``; ``cancelled`` (``session/cancel``); ``max_tokens`` (a token budget
spent); ``max_turn_requests`` (``--max-turns`` reached, or an autonomous run's turn or time
limit). A failed turn answers with a JSON-RPC error after its ``error`` boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event, Stream
from orchestrator.api.wire import CAP_STREAM, CLIENT_CAPABILITIES
from orchestrator.cli.acp_updates import (
    META_NAMESPACE,
    GateTally,
    meta,
    running_cell_update,
    subagent_update,
    updates_for_event,
)
from orchestrator.cli.protocol_stdio import claim_stdout, open_stdio

__all__ = ["AcpOptions", "PrimeAgentAcp", "serve"]

AGENT_NAME: Final = "prime-agent"
AGENT_TITLE: Final = "Prime Agent"
# How long a tree may take to go quiet after a turn before its terminal update (a long-running
# subagent is normal; this only bounds a waiter nobody cancels).
TERMINAL_WAIT_S: Final = 86_400.0
_TURN_STOPS: Final = {
    "completed": "end_turn",
    "stuck": "end_turn",
    "aborted": "cancelled",
    "max_steps": "max_turn_requests",
    "budget_exceeded": "max_tokens",
}
_AUTONOMOUS_STOPS: Final = {
    "gate_passed": "end_turn",
    "goal_complete": "end_turn",
    "completed": "end_turn",
    "gate_failed": "end_turn",
    "stuck": "end_turn",
    "turn_limit": "max_turn_requests",
    "time_limit": "max_turn_requests",
    "token_limit": "max_tokens",
    "aborted": "cancelled",
}
_FAILED: Final = frozenset({"error", "model_error", "compaction_failed"})
_CHILD_DONE: Final = {"completed": "done", "aborted": "cancelled", "error": "error"}
# The daemon's streamed pieces of a reply, as the session updates they become.
_CHUNK_OF_DELTA: Final = {
    "text_delta": "agent_message_chunk",
    "thinking_delta": "agent_thought_chunk",
}
_STREAMED_UPDATES: Final = frozenset(_CHUNK_OF_DELTA.values())


@dataclass(frozen=True)
class AcpOptions:
    """What the command line chose for the sessions this agent creates."""

    model: str | None = None
    api_base: str | None = None
    socket_path: str | None = None  # --daemon-socket
    settings: Mapping[str, Any] | None = None  # SessionSettings fields
    autonomous: Mapping[str, Any] | None = None
    client_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Turn:
    number: int
    done: asyncio.Future[tuple[str, str | None]]  # (reason, error text)
    autonomous: bool
    cancelled: bool = False


@dataclass
class _Child:
    acp_id: str
    origin: int  # the turn that spawned it
    info: dict[str, Any] = field(default_factory=dict)
    status: str = "running"


class _Producer:
    """The one publisher of a session's updates: stamps each with its turn, sequence and phase,
    and sends them in the order they were stamped."""

    def __init__(self, agent: PrimeAgentAcp, session_id: str):
        self._agent = agent
        self._session_id = session_id
        self._sequence = 0
        self._lock = asyncio.Lock()
        self.turns = 0

    async def publish(
        self,
        update: dict[str, Any],
        turn: int,
        phase: str = "event",
        outcome: str | None = None,
    ) -> None:
        from acp.schema import SessionNotification

        async with self._lock:
            self._sequence += 1
            envelope = dict(update.get("_meta") or {})
            ours = dict(envelope.get(META_NAMESPACE) or {})
            ours.update(promptTurnId=turn, eventSequence=self._sequence, phase=phase)
            if outcome is not None:
                ours["outcome"] = outcome
            envelope[META_NAMESPACE] = ours
            stamped = {**update, "_meta": envelope}
            note = SessionNotification.model_validate(
                {"sessionId": self._session_id, "update": stamped}
            )
            await self._agent.conn.session_update(session_id=self._session_id, update=note.update)


class PrimeAgentAcp:
    """The ACP agent: one daemon session per connection."""

    def __init__(self, options: AcpOptions):
        self.options = options
        self.conn: Any = None
        self._control: ControlClient | None = None
        self._session: str | None = None
        self._producer: _Producer | None = None
        self._pump: asyncio.Task[None] | None = None
        self._turn: _Turn | None = None
        self._terminal: asyncio.Task[None] | None = None
        self._children: dict[str, _Child] = {}
        self._sealed: set[int] = set()  # turns whose terminal update is out
        self._cells: dict[str, str] = {}
        self._outputs: dict[str, str] = {}  # a running cell's output so far, by call id
        self._held_outputs: list[Stream] = []  # cell output that overtook its tool call
        self._last_error: str | None = None
        self._gates = GateTally()  # the autonomous gates of the prompt turn under way
        self._root_seq = 0  # the newest root event handled
        # (after, text, update kind) until that event is out
        self._held_deltas: list[tuple[int, str, str]] = []
        self._streamed_after: set[int] = set()  # the `after` of each delta sent

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    # -- ACP methods -------------------------------------------------------------------------

    async def initialize(self, protocol_version: int, **_: Any) -> Any:
        from acp import PROTOCOL_VERSION
        from acp.schema import InitializeResponse

        from orchestrator.cli.acp_mcp import ACP_MCP_CAPABILITIES
        from orchestrator.cli.first_word import version_line

        return InitializeResponse.model_validate(
            {
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {
                    "loadSession": False,
                    "promptCapabilities": {"image": False, "embeddedContext": True},
                    "sessionCapabilities": {"close": {}},
                    "mcpCapabilities": ACP_MCP_CAPABILITIES,
                },
                "agentInfo": {
                    "name": AGENT_NAME,
                    "title": AGENT_TITLE,
                    "version": version_line().rsplit(" ", 1)[-1],
                },
                "_meta": meta(),
            }
        )

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **_: Any) -> Any:
        from acp import RequestError
        from acp.schema import NewSessionResponse

        from orchestrator.cli.acp_mcp import acp_mcp_servers, merged_mcp_servers
        from orchestrator.errors import UserError

        if self._session is not None:
            raise RequestError.invalid_request(
                {
                    "message": "prime-agent ACP mode hosts one session per connection; "
                    "start another prime-agent process for a second session"
                }
            )
        try:  # the client's MCP servers: run by the daemon for this session (docs/mcp.md)
            settings = merged_mcp_servers(self.options.settings, acp_mcp_servers(mcp_servers))
        except UserError as exc:
            raise RequestError.invalid_params({"message": str(exc)}) from None
        control = await self._connect()
        options = self.options
        created = await control.call(
            "create_session",
            cwd=str(Path(cwd).expanduser().resolve()),
            model=options.model,
            api_base=options.api_base,
            settings=settings,
            autonomous=dict(options.autonomous) if options.autonomous is not None else None,
            client_env=dict(options.client_env) or None,
        )
        session = str(created["session"])
        if created.get("warning"):
            print(f"prime-agent: warning: {created['warning']}", file=sys.stderr)
        await control.call("attach", session=session, cursor=0, family=True)
        self._session = session
        self._producer = _Producer(self, session)
        self._pump = asyncio.create_task(self._route(control, session))
        return NewSessionResponse.model_validate({"sessionId": session})

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> Any:
        from acp import RequestError
        from acp.schema import PromptResponse

        control, producer = self._ours(session_id)
        if self._terminal is not None:  # the previous turn's terminal update goes out first
            await asyncio.shield(self._terminal)
        if self._turn is not None:
            raise RequestError.invalid_request(
                {"message": "a prompt turn is already running for this ACP session"}
            )
        producer.turns += 1
        turn = _Turn(
            producer.turns,
            asyncio.get_running_loop().create_future(),
            autonomous=self.options.autonomous is not None,
        )
        self._turn = turn
        self._last_error = None
        self._gates = GateTally()
        try:
            await control.call("prompt", session=session_id, text=_prompt_text(prompt))
            reason, error = await turn.done
        finally:
            self._turn = None
        failed = reason in _FAILED
        outcome = "error" if failed else "result"
        outstanding = sum(1 for c in self._children.values() if c.status == "running")
        await producer.publish(
            {
                "sessionUpdate": "session_info_update",
                "_meta": meta(terminalQuiescenceExpected=True),
            },
            turn.number,
            "responseBoundary",
            outcome,
        )
        autonomous, remaining = await self._autonomous_meta()
        quiescence = {
            "outstandingSubagents": outstanding,
            "remainingAutonomousContinuations": remaining,
        }
        await producer.publish(
            {
                "sessionUpdate": "session_info_update",
                "_meta": meta(**autonomous, quiescence=quiescence),
            },
            turn.number,
        )
        self._terminal = asyncio.create_task(self._terminal_update(turn.number, outcome))
        if failed:
            raise RequestError.internal_error(
                {"message": f"prime-agent turn failed: {error or reason}"}
            )
        stops = _AUTONOMOUS_STOPS if turn.autonomous else _TURN_STOPS
        stop = "cancelled" if turn.cancelled else stops.get(reason, "end_turn")
        return PromptResponse.model_validate({"stopReason": stop})

    async def cancel(self, session_id: str, **_: Any) -> None:
        if session_id != self._session or self._control is None:
            return
        if self._turn is not None:
            self._turn.cancelled = True
        with contextlib.suppress(Exception):
            await self._control.call("abort", session=session_id)

    async def close_session(self, session_id: str, **_: Any) -> Any:
        from acp import RequestError
        from acp.schema import CloseSessionResponse

        if session_id != self._session:
            raise RequestError.invalid_params({"message": f"unknown ACP session: {session_id}"})
        await self.cancel(session_id)
        await self._release()
        return CloseSessionResponse()

    async def shutdown(self) -> None:
        """The client went away: stop the running turn, leave the session in the store."""
        if self._session is not None and self._turn is not None:
            await self.cancel(self._session)
        await self._release()
        if self._control is not None:
            await self._control.close()

    # -- the daemon's side -------------------------------------------------------------------

    async def _connect(self) -> ControlClient:
        if self._control is None or self._control.closed:
            if self.options.socket_path is None:
                from orchestrator.cli.connect import require_daemon

                await asyncio.to_thread(require_daemon, "ACP mode")
            # With the stream capability: text deltas arrive as the model writes them.
            self._control = await ControlClient.connect(
                self.options.socket_path, capabilities=(*CLIENT_CAPABILITIES, CAP_STREAM)
            )
        return self._control

    def _ours(self, session_id: str) -> tuple[ControlClient, _Producer]:
        from acp import RequestError

        if session_id != self._session or self._control is None or self._producer is None:
            raise RequestError.invalid_params({"message": f"unknown ACP session: {session_id}"})
        return self._control, self._producer

    async def _release(self) -> None:
        for task in (self._pump, self._terminal):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._control is not None and self._session is not None:
            with contextlib.suppress(Exception):
                await self._control.call("detach", session=self._session)
        self._session = self._producer = self._pump = self._terminal = None
        self._children.clear()
        self._sealed.clear()

    async def _terminal_update(self, turn: int, outcome: str) -> None:
        """Once the whole tree is quiet: the turn's terminal-quiescence update."""
        control, producer = self._ours(self._session or "")
        with contextlib.suppress(Exception):
            await control.call("wait_quiet", session=self._session, timeout_s=TERMINAL_WAIT_S)
        self._sealed.add(turn)
        autonomous, remaining = await self._autonomous_meta()
        quiescence = {"outstandingSubagents": 0, "remainingAutonomousContinuations": remaining}
        await producer.publish(
            {
                "sessionUpdate": "session_info_update",
                "_meta": meta(**autonomous, quiescence=quiescence),
            },
            turn,
            "terminalQuiescence",
            outcome,
        )

    async def _autonomous_meta(self) -> tuple[dict[str, Any], int]:
        """({"autonomous": ...} for a session started with --autonomous, else {}; the
        continuations its run has left), from the daemon's counters and the gates seen."""
        if self.options.autonomous is None or self._control is None or self._session is None:
            return {}, 0
        try:
            answer = await self._control.call("autonomous", session=self._session, action="status")
        except Exception:  # the meta is telemetry: never a reason to fail the turn
            return {}, 0
        state = answer.get("autonomous") or {}
        limits = state.get("limits") or {}
        turns = int(state.get("turns") or 0)
        remaining = max(0, int(limits.get("max_turns") or 0) - turns)
        return {"autonomous": self._gates.meta(state)}, remaining

    async def _route(self, control: ControlClient, root: str) -> None:
        """Every pushed event of the tree, mapped and published in arrival order."""
        async for item in control.events():
            if isinstance(item, Stream):
                if item.session == root:
                    await self._root_delta(item)
                continue
            if not isinstance(item, Event):
                continue
            try:
                if item.session == root:
                    await self._root_event(item.event)
                else:
                    await self._child_event(control, item.session, item.event)
            except Exception as exc:  # one bad event must not end the stream
                print(f"prime-agent: acp: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _current_turn(self) -> int:
        return self._turn.number if self._turn is not None else 0

    async def _root_delta(self, delta: Stream) -> None:
        """A text delta of the reply being written, streamed as a message chunk — after the
        durable event it follows (deltas travel apart from events, and may overtake the last
        one), and the stored reply then sends no second copy of its text. A running cell's
        output becomes its in-progress ``tool_call_update``."""
        text = delta.event.get("delta")
        if delta.event.get("type") == "tool_output" and isinstance(text, str) and text:
            await self._cell_output(delta, text)
            return
        kind = _CHUNK_OF_DELTA.get(str(delta.event.get("type")))
        if kind is None or not isinstance(text, str) or not text:
            return
        after = delta.after or 0
        if after > self._root_seq:  # the event it follows has not been handled yet
            self._held_deltas.append((after, text, kind))
            return
        await self._publish_delta(after, text, kind)

    async def _cell_output(self, delta: Stream, text: str) -> None:
        call_id = str(delta.event.get("tool_call_id") or "")
        if (delta.after or 0) > self._root_seq:
            self._held_outputs.append(delta)  # its tool_call is not out yet
            return
        if call_id not in self._cells:
            return  # the cell ended already (its result went out), or was never ours
        assert self._producer is not None
        so_far = self._outputs.get(call_id, "") + text
        self._outputs[call_id] = so_far
        update = running_cell_update(call_id, self._cells[call_id], so_far)
        await self._producer.publish(update, self._current_turn())

    async def _publish_delta(self, after: int, text: str, kind: str) -> None:
        assert self._producer is not None
        self._streamed_after.add(after)
        chunk = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
        await self._producer.publish(chunk, self._current_turn())

    async def _root_event(self, event: Mapping[str, Any]) -> None:
        assert self._producer is not None
        kind = event.get("type")
        payload = event.get("payload") or {}
        seq = int(event.get("seq") or 0)
        streamed = False
        if kind == "assistant_message":  # its deltas followed an earlier event
            streamed = any(after < seq for after in self._streamed_after)
            self._streamed_after = {after for after in self._streamed_after if after >= seq}
        for update in updates_for_event(event, self._cells):
            if streamed and update["sessionUpdate"] in _STREAMED_UPDATES:
                continue  # its text (and thinking) went out as deltas
            await self._producer.publish(update, self._current_turn())
        self._root_seq = max(self._root_seq, seq)
        while self._held_deltas and self._held_deltas[0][0] <= self._root_seq:
            await self._publish_delta(*self._held_deltas.pop(0))
        while self._held_outputs and (self._held_outputs[0].after or 0) <= self._root_seq:
            held = self._held_outputs.pop(0)
            await self._cell_output(held, str(held.event.get("delta")))
        if kind == "tool_result" and isinstance(payload, Mapping):
            self._outputs.pop(str(payload.get("tool_call_id") or ""), None)
        if kind == "error" and isinstance(payload, Mapping):
            self._last_error = str(payload.get("message") or payload.get("kind") or "error")
        if kind == "gate_result" and isinstance(payload, Mapping):
            self._gates.record(payload)
        turn = self._turn
        if turn is None or turn.done.done():
            return
        if kind == "turn_end" and not turn.autonomous:
            reason = str(payload.get("reason") or "completed")
            turn.done.set_result((reason, self._last_error))
        elif kind == "aborted":  # an aborted turn records this instead of its turn_end
            turn.done.set_result(("aborted", None))
        elif kind == "autonomous_stop":
            reason = str(payload.get("reason") or "completed")
            if reason == "gate_failed" and payload.get("limit"):
                reason = str(payload["limit"])  # a limit ended it, a gate still failing
            turn.done.set_result((reason, str(payload.get("detail") or self._last_error or "")))

    async def _child_event(
        self, control: ControlClient, session: str, event: Mapping[str, Any]
    ) -> None:
        assert self._producer is not None
        child = self._children.get(session)
        kind = event.get("type")
        if child is None:
            row = (await control.call("get_session", session=session))["session"]
            child = _Child(
                acp_id=str(row.get("rlm_child_id") or session),
                origin=self._current_turn(),
                info={
                    "sessionName": row.get("name"),
                    "model": row.get("model"),
                    "depth": row.get("depth"),
                },
            )
            self._children[session] = child
        elif kind == "user_message" and child.status != "running":
            child.status = "running"
        elif kind not in ("turn_end", "aborted"):
            return
        if kind == "aborted":
            child.status = "cancelled"
        elif kind == "turn_end":
            reason = str((event.get("payload") or {}).get("reason") or "completed")
            child.status = _CHILD_DONE.get(reason, "error" if reason in _FAILED else "done")
        turn = 0 if child.origin in self._sealed else child.origin
        update = subagent_update({"id": child.acp_id, "status": child.status, **child.info})
        await self._producer.publish(update, turn)


def _prompt_text(blocks: list[Any]) -> str:
    """The prompt's text: text blocks, embedded text resources (their URI first), links."""
    parts: list[str] = []
    for block in blocks:
        data = block.model_dump(by_alias=True) if hasattr(block, "model_dump") else block
        if not isinstance(data, Mapping):
            continue
        kind = data.get("type")
        if kind == "text" and isinstance(data.get("text"), str):
            parts.append(data["text"])
        elif kind == "resource" and isinstance(data.get("resource"), Mapping):
            resource = data["resource"]
            if isinstance(resource.get("text"), str):
                uri = f"{resource['uri']}\n" if resource.get("uri") else ""
                parts.append(f"{uri}{resource['text']}")
        elif kind == "resource_link" and isinstance(data.get("uri"), str):
            parts.append(data["uri"])
    return "\n".join(parts)


async def _serve(options: AcpOptions, protocol_fd: int) -> None:
    from acp import run_agent

    agent = PrimeAgentAcp(options)
    reader, writer = await open_stdio(protocol_fd)
    try:
        # The package's Agent protocol lists every optional method; the connection answers
        # method_not_found for those an agent does not define (authenticate, load_session...).
        # session/close is still "unstable" in the package: it is routed only when asked for.
        await run_agent(cast(Any, agent), writer, reader, use_unstable_protocol=True)
    finally:
        await agent.shutdown()


def serve(options: AcpOptions) -> int:
    """Run the agent until the client closes stdin; the exit code."""
    asyncio.run(_serve(options, claim_stdout()))
    return 0
