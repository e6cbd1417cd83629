"""``prime-agent --mode rpc``: Prime Agent's JSONL RPC protocol on stdio (docs/rpc.md).

Commands arrive on stdin, one JSON object a line; each gets one ``response`` line
(``{"id"?, "type": "response", "command", "success", "data"?, "error"?}``, the ``id`` echoed
when given), and the session's activity streams as event lines. Framing is strict JSONL:
records split on LF only, a trailing CR is dropped, and U+2028 / U+2029 inside strings are
never line breaks (the reader splits bytes, and what we write escapes them).

The session lives in the daemon (started when none runs): one is created idle at start in
the current directory; ``new_session``, ``fork`` and ``clone`` switch to another. Our stored
events become the reference's: ``agent_start`` when a prompt starts a run, ``turn_start`` /
``turn_end`` (one assistant reply and its tool results), ``message_start`` / ``message_end``
(pi ``AgentMessage``s, as session files hold them) with ``message_update`` between them while
the model writes a reply (``thinking_start`` / ``_delta`` / ``_end`` for its reasoning, then
``text_start``, ``text_delta``..., ``text_end``, from the daemon's transient deltas; a reply
whose deltas were lost is sent whole),
``tool_execution_start`` / ``_end``, ``compaction_start`` / ``_end``, ``auto_retry_start`` /
``_end``, and ``agent_end`` with the run's messages when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from orchestrator.api.client import ControlClient
from orchestrator.api.errors import ApiCommandError
from orchestrator.api.messages import Event, Stream
from orchestrator.api.wire import CAP_STREAM, CLIENT_CAPABILITIES
from orchestrator.cli.protocol_stdio import claim_stdout, open_stdio

__all__ = ["RpcOptions", "RpcServer", "serve_rpc"]

LINE_END: Final = b"\n"
CARRIAGE_RETURN: Final = b"\r"
MS_PER_S: Final = 1000
_STREAMING: Final = frozenset({"steer", "followUp"})
_RUN_ENDS: Final = frozenset({"turn_end", "aborted"})
# The daemon's streamed pieces of a reply, as the content blocks they grow.
_BLOCK_OF_DELTA: Final = {"text_delta": "text", "thinking_delta": "thinking"}


@dataclass(frozen=True)
class RpcOptions:
    cwd: str
    model: str | None = None
    api_base: str | None = None
    socket_path: str | None = None
    settings: Mapping[str, Any] | None = None
    client_env: Mapping[str, str] = field(default_factory=dict)


def _ms(ts: Any) -> int:
    if isinstance(ts, str):
        with contextlib.suppress(ValueError):
            return int(datetime.fromisoformat(ts).timestamp() * MS_PER_S)
    return 0


def _message(event: Mapping[str, Any]) -> dict[str, Any] | None:
    from orchestrator.store.jsonl import pi_message

    payload = event.get("payload")
    if not isinstance(payload, dict):
        return None
    return pi_message(str(event.get("type")), payload, _ms(event.get("ts")))


class RpcServer:
    """One client on stdio, one session at a time in the daemon."""

    def __init__(
        self, options: RpcOptions, control: ControlClient, write: Callable[[str], Awaitable[None]]
    ):
        self.options = options
        self.control = control
        self._write = write
        self.session: str | None = None
        self.messages: list[dict[str, Any]] = []  # the session's, oldest first
        self.running = False  # a run (a prompt and what it caused) is under way
        self._run_messages: list[dict[str, Any]] = []
        self._turn_open = False
        self._turn_results: list[dict[str, Any]] = []
        self._turn_message: dict[str, Any] | None = None
        self._compacting = False
        self._last_retry = 0
        # The reply being written: its blocks so far (thinking, text), streamed as
        # message_update (None: no reply is being streamed).
        self._partial: list[dict[str, str]] | None = None
        self._seq = 0  # the newest durable event handled: deltas that follow a later one wait
        self._held: list[Stream] = []  # stream items waiting for the event they follow
        # A running cell's output so far (tool_execution_update carries all of it), by call.
        self._cell_output: dict[str, str] = {}
        # The calls of the open turn that have no result yet: call id -> (tool name, args).
        # The turn ends when it is empty (or on abort, which drops what is left).
        self._cell_calls: dict[str, tuple[str, Any]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "prompt": self._prompt,
            "steer": lambda c: self._queue(c, "steer"),
            "follow_up": lambda c: self._queue(c, "follow_up"),
            "abort": self._abort,
            "new_session": self._new_session,
            "get_state": self._state,
            "get_messages": self._messages,
            "set_model": self._set_model,
            "get_available_models": self._models,
            "compact": self._compact,
            "fork": self._fork,
            "clone": self._clone,
            "get_session_stats": self._stats,
            "get_last_assistant_text": self._last_text,
            "set_session_name": self._set_name,
            "get_commands": self._commands,
            "refine": self._refine,
        }

    # -- lines ---------------------------------------------------------------------------------

    async def emit(self, obj: Mapping[str, Any]) -> None:
        # ensure_ascii escapes U+2028/U+2029 too: no reader can split a record on them.
        await self._write(json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n")

    async def handle_line(self, raw: bytes) -> None:
        raw = raw.removesuffix(CARRIAGE_RETURN)
        if not raw.strip():
            return
        try:
            command = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            await self.emit(_response(None, "parse", False, error=f"invalid JSON: {exc}"))
            return
        if not isinstance(command, dict):
            await self.emit(_response(None, "parse", False, error="a command is a JSON object"))
            return
        kind = str(command.get("type") or "")
        ident = command.get("id")
        handler = self._handlers.get(kind)
        if handler is None:
            await self.emit(_response(ident, kind, False, error=f"Unknown command: {kind}"))
            return
        try:
            data = await handler(command)
        except (ApiCommandError, RpcRefused) as exc:
            message = exc.message if isinstance(exc, ApiCommandError) else str(exc)
            await self.emit(_response(ident, kind, False, error=message))
            return
        await self.emit(_response(ident, kind, True, data=data))

    # -- the session -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._open(await self._create())

    async def _create(self) -> str:
        options = self.options
        created = await self.control.call(
            "create_session",
            cwd=options.cwd,
            model=options.model,
            api_base=options.api_base,
            settings=dict(options.settings) if options.settings else None,
            client_env=dict(options.client_env) or None,
        )
        if created.get("warning"):
            print(f"prime-agent: warning: {created['warning']}", file=sys.stderr)
        return str(created["session"])

    async def _open(self, session: str) -> None:
        """Follow ``session`` from its first event (its history fills ``messages``)."""
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        if self.session is not None:
            with contextlib.suppress(ApiCommandError):
                await self.control.call("detach", session=self.session)
        self.session, self.messages, self.running = session, [], False
        self._partial, self._seq, self._held = None, 0, []
        self._cell_output, self._cell_calls = {}, {}
        attached = await self.control.call("attach", session=session, cursor=0)
        for event in attached.get("events") or []:
            message = _message(event)
            if message is not None:
                self.messages.append(message)
        self._pump = asyncio.create_task(self._route(session))

    async def _route(self, session: str) -> None:
        async for item in self.control.events():
            if not isinstance(item, Event | Stream) or item.session != session:
                continue
            try:
                if isinstance(item, Stream):
                    await self._on_delta(item)
                else:
                    await self._on_durable(item.event)
            except Exception as exc:  # one odd event must not end the stream
                print(f"prime-agent: rpc: {type(exc).__name__}: {exc}", file=sys.stderr)

    async def _on_durable(self, event: Mapping[str, Any]) -> None:
        """A stored event, then the deltas that waited for it."""
        await self._on_event(event)
        self._seq = max(self._seq, int(event.get("seq") or 0))
        while self._held and (self._held[0].after or 0) <= self._seq:
            await self._on_delta(self._held.pop(0))

    async def _on_delta(self, item: Stream) -> None:
        """A piece of the reply (its thinking or its text) as the model writes it, or of a
        running cell's output; it waits for the durable event it follows (stream items
        travel apart from events, and may overtake it)."""
        text = item.event.get("delta")
        if not isinstance(text, str) or not text:
            return
        if (item.after or 0) > self._seq:
            self._held.append(item)
            return
        kind = _BLOCK_OF_DELTA.get(str(item.event.get("type")))
        if kind is not None:
            await self._stream(kind, text)
        elif item.event.get("type") == "tool_output":
            await self._cell_update(str(item.event.get("tool_call_id") or ""), text)

    async def _cell_update(self, call_id: str, delta: str) -> None:
        """``tool_execution_update``: the cell's output so far (a client replaces its view)."""
        if call_id not in self._cell_calls:
            return  # its start went out before we followed the session, or never will
        name, args = self._cell_calls[call_id]
        so_far = self._cell_output.get(call_id, "") + delta
        self._cell_output[call_id] = so_far
        await self.emit(
            {
                "type": "tool_execution_update",
                "toolCallId": call_id,
                "toolName": name,
                "args": args,
                "partialResult": {"content": [{"type": "text", "text": so_far}], "details": {}},
            }
        )

    async def _stream(self, kind: str, delta: str) -> None:
        """``kind``'s block grows by ``delta``; a new kind ends the block before it."""
        if self._partial is None:
            if not self._turn_open:
                await self._open_turn()
            self._partial = []
            await self.emit({"type": "message_start", "message": _partial_reply([])})
        blocks = self._partial
        if not blocks or blocks[-1]["type"] != kind:
            if blocks:
                await self._end_block()
            blocks.append({"type": kind, kind: ""})
            await self._update({"type": f"{kind}_start", "contentIndex": len(blocks) - 1})
        blocks[-1][kind] += delta
        index = len(blocks) - 1
        await self._update({"type": f"{kind}_delta", "contentIndex": index, "delta": delta})

    async def _end_block(self) -> None:
        assert self._partial
        block = self._partial[-1]
        kind = block["type"]
        index = len(self._partial) - 1
        await self._update({"type": f"{kind}_end", "contentIndex": index, "content": block[kind]})

    async def _update(self, event: dict[str, Any]) -> None:
        partial = _partial_reply(self._partial or [])
        await self.emit(
            {
                "type": "message_update",
                "message": partial,
                "assistantMessageEvent": {**event, "partial": partial},
            }
        )

    async def _on_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        payload = event.get("payload") if isinstance(event.get("payload"), dict) else {}
        assert isinstance(payload, dict)
        message = _message(event)
        if kind == "user_message":
            if not self.running:
                self.running, self._run_messages = True, []
                await self.emit({"type": "agent_start"})
            await self._open_turn()
        elif kind == "assistant_message" and not self._turn_open:
            await self._open_turn()
        if message is not None:
            self.messages.append(message)
            self._run_messages.append(message)
            if kind == "assistant_message" and self._partial is not None:  # it was streamed
                if self._partial:
                    await self._end_block()
                self._partial = None
            else:
                await self.emit({"type": "message_start", "message": message})
            await self.emit({"type": "message_end", "message": message})
        if kind == "assistant_message" and message is not None:
            self._turn_message = message
            for block in message.get("content") or []:
                if block.get("type") == "toolCall":
                    self._cell_calls[block["id"]] = (block["name"], block["arguments"])
                    await self.emit(
                        {
                            "type": "tool_execution_start",
                            "toolCallId": block["id"],
                            "toolName": block["name"],
                            "args": block["arguments"],
                        }
                    )
            if not self._cell_calls:
                await self._close_turn()
        elif kind == "tool_result" and message is not None:
            self._cell_calls.pop(str(message["toolCallId"]), None)
            self._cell_output.pop(str(message["toolCallId"]), None)
            self._turn_results.append(message)
            await self.emit(
                {
                    "type": "tool_execution_end",
                    "toolCallId": message["toolCallId"],
                    "toolName": message["toolName"],
                    "result": {"content": message["content"], "details": message["details"]},
                    "isError": message["isError"],
                }
            )
            if not self._cell_calls:
                await self._close_turn()
        elif kind == "retry":
            self._last_retry = int(payload.get("attempt") or 0)
            await self.emit(
                {
                    "type": "auto_retry_start",
                    "attempt": self._last_retry,
                    "maxAttempts": payload.get("max_attempts"),
                    "delayMs": int(float(payload.get("delay_s") or 0) * MS_PER_S),
                    "errorMessage": payload.get("reason"),
                }
            )
        elif kind == "compaction":
            reason = payload.get("reason")
            await self.emit({"type": "compaction_start", "reason": reason})
            await self.emit(
                {
                    "type": "compaction_end",
                    "reason": reason,
                    "result": {
                        "summary": payload.get("summary"),
                        "firstKeptEntryId": payload.get("first_kept_event_id"),
                        "tokensBefore": payload.get("tokens_before"),
                        "details": {},
                    },
                    "aborted": False,
                    "willRetry": False,
                }
            )
        elif kind in _RUN_ENDS and self.running:
            if self._last_retry:
                await self.emit(
                    {
                        "type": "auto_retry_end",
                        "success": kind == "turn_end",
                        "attempt": self._last_retry,
                    }
                )
                self._last_retry = 0
            await self._close_turn()
            self.running = False
            await self.emit({"type": "agent_end", "messages": self._run_messages})

    async def _open_turn(self) -> None:
        await self._close_turn()
        self._turn_open = True
        await self.emit({"type": "turn_start"})

    async def _close_turn(self) -> None:
        if not self._turn_open:
            return
        self._turn_open = False
        results, self._turn_results = self._turn_results, []
        message, self._turn_message = self._turn_message, None
        self._cell_calls.clear()
        self._cell_output.clear()
        await self.emit({"type": "turn_end", "message": message, "toolResults": results})

    # -- commands --------------------------------------------------------------------------------

    def _text(self, command: Mapping[str, Any]) -> str:
        text = command.get("message")
        if not isinstance(text, str) or not text.strip():
            raise RpcRefused("message must be a non-empty string")
        if command.get("images"):
            raise RpcRefused("images are not supported by this agent")
        return text

    async def _prompt(self, command: dict[str, Any]) -> None:
        text = self._text(command)
        behaviour = command.get("streamingBehavior")
        if behaviour is not None and behaviour not in _STREAMING:
            raise RpcRefused("streamingBehavior must be 'steer' or 'followUp'")
        if self.running and behaviour is None:
            raise RpcRefused(
                "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') "
                "to queue the message."
            )
        mode = "steer" if behaviour == "steer" else "follow_up"
        await self.control.call("prompt", session=self.session, text=text, mode=mode)

    async def _queue(self, command: dict[str, Any], mode: str) -> None:
        await self.control.call("prompt", session=self.session, text=self._text(command), mode=mode)

    async def _abort(self, _: dict[str, Any]) -> None:
        await self.control.call("abort", session=self.session)

    async def _new_session(self, _: dict[str, Any]) -> dict[str, Any]:
        await self._open(await self._create())
        return {"cancelled": False}

    async def _row(self) -> dict[str, Any]:
        return dict((await self.control.call("get_session", session=self.session))["session"])

    async def _state(self, _: dict[str, Any]) -> dict[str, Any]:
        row = await self._row()
        state: dict[str, Any] = {
            "model": _model_object(str(row.get("model") or ""), None),
            "thinkingLevel": "off",
            "isStreaming": self.running,
            "isCompacting": self._compacting,
            "steeringMode": "all",
            "followUpMode": "one-at-a-time",
            "sessionFile": None,
            "sessionId": self.session,
            "autoCompactionEnabled": True,
            "messageCount": len(self.messages),
            "unfinishedActionCount": int(row.get("pending") or 0),
            "sessionActions": {
                "queuedCount": int(row.get("pending") or 0),
                "steering": [],
                "followUps": [],
            },
        }
        if row.get("name"):
            state["sessionName"] = row["name"]
        return state

    async def _messages(self, _: dict[str, Any]) -> dict[str, Any]:
        return {"messages": list(self.messages)}

    async def _set_model(self, command: dict[str, Any]) -> dict[str, Any] | None:
        provider, model_id = command.get("provider"), command.get("modelId")
        if not isinstance(provider, str) or not isinstance(model_id, str):
            raise RpcRefused("set_model needs provider and modelId")
        selector = f"{provider}/{model_id}"
        await self.control.call("set_model", session=self.session, model=selector)
        return _model_object(selector, None)

    async def _models(self, _: dict[str, Any]) -> dict[str, Any]:
        from orchestrator.cli.client_config import load_client_config
        from orchestrator.paths import Paths

        config = load_client_config(Paths.from_env().config_file)
        row = await self._row()
        names = dict.fromkeys([str(row.get("model") or ""), *sorted(config.models)])
        return {"models": [_model_object(n, config.models.get(n)) for n in names if n]}

    async def _compact(self, command: dict[str, Any]) -> dict[str, Any]:
        self._compacting = True
        try:
            done = await self.control.call(
                "compact", session=self.session, instructions=command.get("customInstructions")
            )
        finally:
            self._compacting = False
        if not done.get("compacted") and not done.get("scheduled"):
            raise RpcRefused(str(done.get("message") or done.get("reason") or "nothing to compact"))
        return {
            "summary": None,  # the compaction_end event carries it
            "firstKeptEntryId": None,
            "tokensBefore": done.get("tokens_before"),
            "details": {"scheduled": bool(done.get("scheduled"))},
        }

    async def _fork(self, command: dict[str, Any]) -> dict[str, Any]:
        entry = command.get("entryId")
        forked = await self.control.call("fork", session=self.session, event=entry)
        text = next(
            (
                str(m["content"][0]["text"])
                for m in reversed(self.messages)
                if m.get("role") == "user" and m.get("content")
            ),
            "",
        )
        await self._open(str(forked.get("session") or forked.get("id")))
        return {"text": text, "cancelled": False}

    async def _clone(self, _: dict[str, Any]) -> dict[str, Any]:
        cloned = await self.control.call("clone", session=self.session)
        await self._open(str(cloned.get("session") or cloned.get("id")))
        return {"cancelled": False}

    async def _stats(self, _: dict[str, Any]) -> dict[str, Any]:
        usage = (await self.control.call("get_usage", session=self.session)).get("usage") or [{}]
        own = (usage[0] or {}).get("own") or {}
        roles = [m.get("role") for m in self.messages]
        calls = sum(
            1
            for m in self.messages
            if m.get("role") == "assistant"
            for b in m.get("content") or []
            if b.get("type") == "toolCall"
        )
        tokens = {
            "input": int(own.get("input") or 0),
            "output": int(own.get("output") or 0),
            "cacheRead": int(own.get("cache_read") or 0),
            "cacheWrite": int(own.get("cache_write") or 0),
        }
        tokens["total"] = sum(tokens.values())
        return {
            "sessionFile": None,
            "sessionId": self.session,
            "userMessages": roles.count("user"),
            "assistantMessages": roles.count("assistant"),
            "toolCalls": calls,
            "toolResults": roles.count("toolResult"),
            "totalMessages": len(self.messages),
            "tokens": tokens,
            "cost": float(own.get("cost_usd") or 0.0),
        }

    async def _last_text(self, _: dict[str, Any]) -> dict[str, Any]:
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                texts = [b["text"] for b in message.get("content") or [] if b.get("type") == "text"]
                return {"text": "".join(texts)}
        return {"text": None}

    async def _set_name(self, command: dict[str, Any]) -> None:
        name = command.get("name")
        if not isinstance(name, str):
            raise RpcRefused("set_session_name needs a name")
        await self.control.call("set_session_name", session=self.session, name=name)

    async def _commands(self, _: dict[str, Any]) -> dict[str, Any]:
        # Our slash commands are the TUI's and the CLI's; none are templates or extensions.
        return {"commands": []}

    async def _refine(self, command: dict[str, Any]) -> Any:
        return await self.control.call(
            "refine", session=self.session, instructions=command.get("instructions")
        )


class RpcRefused(Exception):
    """A command refused before it reached the daemon (its response carries this text)."""


def _partial_reply(blocks: list[dict[str, str]]) -> dict[str, Any]:
    """The assistant message being written, as far as it goes (its thinking and text)."""
    return {"role": "assistant", "content": [dict(block) for block in blocks]}


def _response(
    ident: Any, command: str, success: bool, *, data: Any = None, error: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "response", "command": command, "success": success}
    if ident is not None:
        out["id"] = ident
    if data is not None:
        out["data"] = data
    if error is not None:
        out["error"] = error
    return out


def _model_object(selector: str, declared: Any) -> dict[str, Any] | None:
    """A pi ``Model`` for one of our selectors (provider/name)."""
    if not selector:
        return None
    provider, _, name = selector.partition("/")
    return {
        "id": name or selector,
        "name": name or selector,
        "api": "openai-completions",
        "provider": provider,
        "baseUrl": getattr(declared, "api_base", None) or "",
        "reasoning": False,
        "input": ["text"],
        "contextWindow": getattr(declared, "context_window", None),
        "maxTokens": None,
    }


async def _serve(options: RpcOptions, protocol_fd: int) -> None:
    if options.socket_path is None:
        from orchestrator.cli.connect import require_daemon

        await asyncio.to_thread(require_daemon, "RPC mode")
    reader, writer = await open_stdio(protocol_fd)
    lock = asyncio.Lock()

    async def write(line: str) -> None:
        async with lock:
            writer.write(line.encode("utf-8"))
            await writer.drain()

    # With the stream capability: the reply's text deltas arrive as the model writes them.
    capabilities = (*CLIENT_CAPABILITIES, CAP_STREAM)
    async with await ControlClient.connect(
        options.socket_path, capabilities=capabilities
    ) as control:
        server = RpcServer(options, control, write)
        await server.start()
        buffer = b""
        while chunk := await reader.read(1 << 16):
            buffer += chunk
            while LINE_END in buffer:  # LF only: U+2028 inside a string is not a break
                line, buffer = buffer.split(LINE_END, 1)
                await server.handle_line(line)
        if buffer:
            await server.handle_line(buffer)
        if server.running and server.session is not None:  # the client left mid-run
            with contextlib.suppress(ApiCommandError):
                await control.call("abort", session=server.session)


def serve_rpc(options: RpcOptions) -> int:
    """Serve the client on stdio until it closes stdin; the exit code."""
    asyncio.run(_serve(options, claim_stdout()))
    return 0
