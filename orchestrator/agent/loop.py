"""The turn loop: prompt -> model -> ipython cells -> ... -> final answer.

Every step is appended to the store (and so committed) before anything downstream sees it: the
JSON stream, the progress display and the next model call all read committed records (R1).
Streaming text deltas are the only non-durable output; the final assistant message is durable.

Compaction (``compaction.py``, docs/compaction.md) happens only between steps, never while a
cell runs: before a model call when one was requested or the context passed its threshold, and
after a context-overflow error from the provider (then the call is retried exactly once). A
compaction that fails stops the turn with reason ``compaction_failed`` and an ``error`` event of
kind ``compaction``. One lock covers a turn and a compaction asked for between turns, so the two
never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from orchestrator.agent.compaction import (
    CompactionFailed,
    CompactionOutcome,
    Compactor,
    NothingToCompact,
    Reason,
)
from orchestrator.agent.context import ContextBuilder, estimate_tokens
from orchestrator.agent.fenced import extract_fenced_call
from orchestrator.agent.prompts import FENCED_TURN_REMINDER, IPYTHON_TOOL
from orchestrator.agent.shaping import shape_cell_result
from orchestrator.agent.stuck import RepeatGuard, Verdict, repeat_notice, stuck_message
from orchestrator.errors import EmptyReply, ModelError, SandboxError
from orchestrator.ids import new_tool_call_id
from orchestrator.models.client import ContextOverflow, ModelClient, ModelReply, RetryInfo
from orchestrator.models.registry import ResolvedModel
from orchestrator.models.reply import DeltaKind
from orchestrator.sandbox.base import Sandbox
from orchestrator.settings import DEFAULT_CONTEXT_WINDOW, Settings
from orchestrator.store.events import (
    AbortedPayload,
    AssistantMessagePayload,
    ErrorPayload,
    ModelChangePayload,
    NoticePayload,
    RetryPayload,
    ToolCall,
    ToolResultPayload,
    TurnEndPayload,
    UserMessagePayload,
)

__all__ = ["AgentLoop", "EventSink", "LoopHooks", "Recorder", "TurnOutcome"]

TOOL_NAME = "ipython"
StopReason = Literal[
    "completed",
    "error",
    "aborted",
    "max_steps",
    "budget_exceeded",
    "compaction_failed",
    "stuck",
]
# The error event kinds of the two ways context handling can stop a turn.
COMPACTION_ERROR_KIND = "compaction"
OVERFLOW_ERROR_KIND = "context_overflow"
MODEL_ERROR_KIND = "model"
STUCK_ERROR_KIND = "stuck"
# An empty reply (no text, no tool call) is asked for again this many times, then it is an
# error (``EmptyReply``): never a completed answer.
EMPTY_REPLY_RETRIES = 1
# The tool schema as the model is sent it: counted in every prompt's size (``_fixed_tokens``),
# encoded once here rather than at every step.
TOOL_SCHEMA_JSON = json.dumps(IPYTHON_TOOL)
EMPTY_REPLY_REASON = "the model sent an empty reply (no text, no tool call)"


class Recorder(Protocol):
    """Appends one event durably and returns its record (``store.append`` bound to a session)."""

    async def __call__(self, type_: str, payload: Any) -> Any: ...


EventSink = Callable[[dict[str, Any]], None]


class LoopHooks(Protocol):
    """What the session manager lets the loop ask before each model call."""

    def take_steering(self) -> list[UserMessagePayload]:
        """Messages to inject now (steer mode), in order; they are recorded by the loop."""
        ...

    def budget_stop(self) -> str | None:
        """Why the session may not make another model call (budget spent), or None."""
        ...


@dataclass
class TurnOutcome:
    reason: StopReason
    final_text: str = ""
    error: BaseException | None = None

    @property
    def error_class(self) -> str | None:
        """The typed class of a model error that ended the turn (``ModelError.error_class``)."""
        found = getattr(self.error, "error_class", None)
        return found if isinstance(found, str) else None


@dataclass
class _Call:
    id: str
    name: str
    arguments: str


@dataclass
class _Parsed:
    """A tool call's arguments: the code to run, or (``code`` None) why it is malformed."""

    code: str | None
    timeout_s: float = 0.0
    error: str = ""
    status: str = ""


class AgentLoop:
    def __init__(
        self,
        *,
        session_id: str,
        client: ModelClient,
        system_prompt: str,
        get_sandbox: Callable[[], Awaitable[Sandbox]],
        record: Recorder,
        settings: Settings,
        context: ContextBuilder,
        sink: EventSink | None = None,
        hooks: LoopHooks | None = None,
        peek_sandbox: Callable[[], Sandbox | None] | None = None,
        refresh_prompt: Callable[[], Awaitable[str]] | None = None,
    ):
        self.session_id = session_id
        # Rebuilds the system prompt at each turn's start (a harness write, a model switch
        # show from the next turn on, never in the middle of one: docs/harness.md).
        self.refresh_prompt = refresh_prompt
        self.client = client
        self.system_prompt = system_prompt
        self.get_sandbox = get_sandbox
        self.record = record
        self.settings = settings
        self.context = context
        self.sink = sink
        self.hooks = hooks
        self._fenced = client.model.tool_protocol == "fenced"
        self._lock = asyncio.Lock()  # one turn, or one compaction between turns, at a time
        self._turn_event_id: str | None = None  # the user message of the turn in flight
        # What holds the loop now: a prompt must not arrive while a cell runs or the context
        # is being compacted (the scheduler defers heartbeats then; docs/control.md).
        self.activity: Literal["idle", "turn", "cell", "compacting"] = "idle"
        self._repeats = RepeatGuard()  # this turn's run of repeated calls (agent/stuck.py)
        # When the running cell times out (time.monotonic()), None between cells: host
        # requests that may be slow (an MCP call, docs/mcp.md) end before it.
        self.cell_deadline: float | None = None
        self.compactor = Compactor(
            settings=settings.compaction,
            context=context,
            complete=lambda messages: self.client.complete(messages, on_retry=self._on_retry),
            record=record,
            window=self._context_window,
            fixed_tokens=self._fixed_tokens,
            model=lambda: self.client.model.selector,
            peek_sandbox=peek_sandbox,
        )

    async def _append(self, type_: str, payload: Any) -> Any:
        rec = await self.record(type_, payload)
        self.context.add(type_, payload, event_id=getattr(rec, "id", None))
        return rec

    @property
    def busy(self) -> bool:
        """A turn (or a compaction) holds the loop."""
        return self._lock.locked()

    def _fixed_tokens(self) -> int:
        """System prompt and tool schema: sent with every call, counted in every prompt."""
        tools = "" if self._fenced else TOOL_SCHEMA_JSON
        return estimate_tokens(self.system_prompt) + estimate_tokens(tools)

    async def _context_window(self) -> int:
        """The model's window: from config, else litellm's bundled model map, else the default."""
        model = self.client.model
        if model.context_window is not None:
            return model.context_window
        from orchestrator.models.price_map import model_entry

        # The first look reads the map (~30 ms): on a thread, never on a shared loop.
        info = await asyncio.to_thread(model_entry, model.litellm_model, model.name)
        window = info.get("max_input_tokens") if isinstance(info, dict) else None
        return int(window) if isinstance(window, int) and window > 0 else DEFAULT_CONTEXT_WINDOW

    async def compact_now(self, instructions: str | None = None) -> CompactionOutcome:
        """``/compact`` between turns: compact at once (waits for a turn that holds the loop).
        Raises ``CompactionFailed`` (``NothingToCompact`` when the context is short)."""
        async with self._lock, self._doing("compacting"):
            try:
                return await self.compactor.compact("manual", instructions, turn_event_id=None)
            except CompactionFailed as exc:
                if not isinstance(exc, NothingToCompact):
                    await self.record(
                        "error", ErrorPayload(kind=COMPACTION_ERROR_KIND, message=str(exc))
                    )
                raise

    async def switch_model(self, model: ResolvedModel) -> None:
        """Use ``model`` from the next model call on; recorded as a ``model_change`` event."""
        before = self.client.model
        self.client = ModelClient(model, self.settings)
        self._fenced = model.tool_protocol == "fenced"
        await self._append(
            "model_change",
            ModelChangePayload(
                model=model.selector,
                previous=before.selector,
                # The endpoint is part of the switch (the embedded model's is per start).
                api_base=None if model.embedded else model.api_base,
                previous_api_base=None if before.embedded else before.api_base,
            ),
        )

    @contextlib.asynccontextmanager
    async def _doing(self, what: Literal["turn", "cell", "compacting"]) -> AsyncIterator[None]:
        before, self.activity = self.activity, what
        try:
            yield
        finally:
            self.activity = before

    def _emit(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink({"session_id": self.session_id, **event})

    async def run(
        self,
        prompt: str | UserMessagePayload,
        *,
        source: Literal["user", "parent", "agent", "harness"] = "user",
    ) -> TurnOutcome:
        first = prompt if isinstance(prompt, UserMessagePayload) else None
        async with self._lock, self._doing("turn"):
            if self.refresh_prompt is not None:
                self.system_prompt = await self.refresh_prompt()
            rec = await self._append(
                "user_message", first or UserMessagePayload(text=str(prompt), source=source)
            )
            self._turn_event_id = getattr(rec, "id", None)
            self._repeats = RepeatGuard(self._repeats.limit)
            try:
                outcome = await self._steps()
                await self._append(
                    "turn_end",
                    TurnEndPayload(reason=outcome.reason, error_class=outcome.error_class),
                )
                return outcome
            except asyncio.CancelledError:
                # Record the abort even though we are being cancelled: shield the write.
                await asyncio.shield(self._append("aborted", AbortedPayload(reason="interrupted")))
                raise
            finally:
                self._turn_event_id = None

    async def _steps(self) -> TurnOutcome:
        for _ in range(self.settings.max_turn_steps):
            if self.hooks is not None:
                for message in self.hooks.take_steering():
                    await self._append("user_message", message)
                reason = self.hooks.budget_stop()
                if reason is not None:
                    await self._append("error", ErrorPayload(kind="budget", message=reason))
                    return TurnOutcome(reason="budget_exceeded", final_text=reason)
            stopped = await self._compact_if_due()
            if stopped is not None:
                return stopped
            answer = await self._answer()
            if isinstance(answer, TurnOutcome):
                return answer
            reply, calls, text, fenced = answer.reply, answer.calls, answer.text, answer.fenced
            stop: Literal["stop", "tool_calls", "length"] = (
                "tool_calls" if calls else ("length" if reply.finish_reason == "length" else "stop")
            )
            reply_message = AssistantMessagePayload(
                text=text,
                tool_calls=[ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls],
                stop_reason=stop,
                provider=reply.usage.provider,
                model=reply.usage.model,
                usage=reply.usage,
                fenced=fenced,
                thinking=reply.thinking or None,
            )
            # Both appends are queued before either commits, so the store's group commit
            # writes them in one transaction (in this order): one fsync per step saved.
            await asyncio.gather(
                self._append("assistant_message", reply_message),
                self.record("usage", reply.usage),
            )
            if not calls:
                return TurnOutcome(reason="completed", final_text=text)
            for index, call in enumerate(calls):
                stuck = await self._run_call(call)
                if stuck is not None:
                    return await self._stuck(stuck, calls[index + 1 :])
        await self._append(
            "error",
            ErrorPayload(
                kind="max_steps",
                message=f"stopped after {self.settings.max_turn_steps} model calls in one turn",
            ),
        )
        return TurnOutcome(reason="max_steps")

    async def _answer(self) -> _Answer | TurnOutcome:
        """One model call that gives something: an empty reply is asked for again
        (``EMPTY_REPLY_RETRIES``), then it is an error; a model error stops the turn."""
        for attempt in range(1, EMPTY_REPLY_RETRIES + 2):
            got = await self._reply()
            if isinstance(got, TurnOutcome):
                return got
            calls, text, fenced = self._calls_from(got.text, got.tool_calls)
            if calls or text.strip():
                return _Answer(got, calls, text, fenced)
            # Spent tokens count even for nothing; the empty reply stays out of the history.
            await self.record("usage", got.usage)
            if attempt <= EMPTY_REPLY_RETRIES:
                retry = RetryInfo(attempt=attempt, delay_s=0.0, reason=EMPTY_REPLY_REASON)
                await self._on_retry(retry)
        failed = EmptyReply(f"{EMPTY_REPLY_REASON}, {EMPTY_REPLY_RETRIES + 1} times in a row")
        return await self._model_failed(failed)

    async def _reply(self) -> ModelReply | TurnOutcome:
        """One model call; a context overflow compacts and retries it exactly once."""
        try:
            return await self._call_model()
        except ContextOverflow as exc:
            # Compact, then retry this call exactly once; a second overflow stops the turn.
            stopped = await self._compact("overflow", None)
            if stopped is not None:
                return stopped
            try:
                return await self._call_model()
            except ContextOverflow as again:
                text = f"the context is still too long after compacting: {again} ({exc})"
                await self._append(
                    "error",
                    ErrorPayload(
                        kind=OVERFLOW_ERROR_KIND, message=text, error_class=again.error_class
                    ),
                )
                return TurnOutcome(reason="error", error=again)
            except ModelError as failed:
                return await self._model_failed(failed)
        except ModelError as exc:
            return await self._model_failed(exc)

    async def _model_failed(self, exc: ModelError) -> TurnOutcome:
        """A model error ends the turn (typed); the session takes the next message."""
        await self._append(
            "error",
            ErrorPayload(kind=MODEL_ERROR_KIND, message=str(exc), error_class=exc.error_class),
        )
        return TurnOutcome(reason="error", error=exc)

    async def _stuck(self, verdict: Verdict, rest: list[_Call]) -> TurnOutcome:
        """The turn stops: the same (or a malformed) call came ``limit`` times in a row."""
        message = stuck_message(verdict)
        for call in rest:  # every tool call needs a result, or providers reject the history
            await self._tool_error(call, f"[notice] not run: the turn {message}", "not_run")
        await self._append("error", ErrorPayload(kind=STUCK_ERROR_KIND, message=message))
        return TurnOutcome(reason="stuck", final_text=message)

    def _request_messages(self) -> list[dict[str, Any]]:
        """The system prompt and the context; a fenced model whose context ends with a message
        to it (a task, a steer, a gate's verdict) reads ``FENCED_TURN_REMINDER`` after it, in
        this request only: the stored message and the context stay as they are."""
        messages = [{"role": "system", "content": self.system_prompt}, *self.context.messages]
        entries = self.context.entries
        if self._fenced and entries and entries[-1].user:
            last = messages[-1]
            content = last.get("content")
            if isinstance(content, str):
                messages[-1] = {**last, "content": content + FENCED_TURN_REMINDER}
        return messages

    async def _call_model(self) -> ModelReply:
        return await self.client.complete(
            self._request_messages(),
            tools=None if self._fenced else [IPYTHON_TOOL],
            temperature=0.0 if self.client.model.embedded else None,
            on_delta=self._on_delta,
            on_retry=self._on_retry,
        )

    def _on_delta(self, piece: str, kind: DeltaKind) -> None:
        """A piece of the reply as the model streams it, for clients that follow the stream."""
        self._emit(
            {"type": "thinking_delta" if kind == "thinking" else "text_delta", "delta": piece}
        )

    async def _compact_if_due(self) -> TurnOutcome | None:
        """At a step boundary: a requested compaction, or one the threshold calls for."""
        pending = self.compactor.take_pending()
        if pending is not None:
            return await self._compact(pending.reason, pending.instructions)
        if await self.compactor.over_threshold():
            return await self._compact("threshold", None)
        return None

    async def _compact(self, reason: Reason, instructions: str | None) -> TurnOutcome | None:
        """Compact now; a failure stops the turn (fail safe: never a retry loop)."""
        self._emit({"type": "compaction_start", "reason": reason})
        try:
            async with self._doing("compacting"):
                await self.compactor.compact(
                    reason, instructions, turn_event_id=self._turn_event_id
                )
        except NothingToCompact as exc:
            if reason in ("manual", "requested"):  # asked for, but nothing to do: carry on
                await self.record("notice", NoticePayload(text=f"compaction skipped: {exc}"))
                return None
            return await self._compaction_failed(exc)
        except CompactionFailed as exc:
            return await self._compaction_failed(exc)
        return None

    async def _compaction_failed(self, exc: CompactionFailed) -> TurnOutcome:
        message = f"{exc.reason}: {exc}"
        await self._append("error", ErrorPayload(kind=COMPACTION_ERROR_KIND, message=message))
        return TurnOutcome(reason="compaction_failed", final_text=message, error=exc)

    async def _on_retry(self, info: RetryInfo) -> None:
        await self.record(
            "retry", RetryPayload(attempt=info.attempt, delay_s=info.delay_s, reason=info.reason)
        )

    def _calls_from(self, text: str, native: list[ToolCall]) -> tuple[list[_Call], str, bool]:
        if native:
            return [_Call(c.id, c.name, c.arguments) for c in native], text, False
        if not self._fenced:
            return [], text, False
        found = extract_fenced_call(text)
        if found is None:
            return [], text, False
        code, _before = found
        call = _Call(new_tool_call_id(), TOOL_NAME, json.dumps({"code": code}))
        # The whole reply stays in the history: the model sees what it wrote.
        return [call], text, True

    async def _run_call(self, call: _Call) -> Verdict | None:
        """Run one call; a ``Verdict`` when it is the one that makes the turn stuck."""
        async with self._doing("cell"):
            return await self._run_cell(call)

    def _parse(self, call: _Call) -> _Parsed:
        if call.name != TOOL_NAME:
            return _Parsed(
                None,
                error=f"unknown tool {call.name!r}: the only tool is ipython",
                status="unknown_tool",
            )
        try:
            args = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return _Parsed(
                None,
                error=f"the tool arguments are not valid JSON ({exc.msg} at char {exc.pos}); "
                'call ipython with arguments like {"code": "print(1)"}',
                status="invalid_arguments",
            )
        code = args.get("code") if isinstance(args, dict) else None
        if not isinstance(code, str):
            return _Parsed(
                None,
                error='the ipython tool needs a string argument "code"',
                status="invalid_arguments",
            )
        timeout = self.settings.cell_timeout_s
        asked = args.get("timeout")
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
            timeout = min(float(asked), self.settings.cell_timeout_ceiling_s)
        return _Parsed(code, timeout_s=timeout)

    async def _run_cell(self, call: _Call) -> Verdict | None:
        self._emit({"type": "tool_start", "tool_call_id": call.id, "arguments": call.arguments})
        parsed = self._parse(call)
        verdict = self._repeats.observe(parsed.code)
        if verdict.action == "stop":
            text = f"[notice] {stuck_message(verdict)}; this call was not run"
            await self._tool_error(call, text, "stuck")
            return verdict
        notice = repeat_notice(verdict, self._repeats.limit)
        if parsed.code is None:
            await self._tool_error(call, _noticed(notice, parsed.error), parsed.status)
            return None
        started = time.monotonic()
        try:
            sandbox = await self.get_sandbox()
            self.cell_deadline = time.monotonic() + parsed.timeout_s
            try:
                result = await sandbox.execute(
                    parsed.code,
                    timeout_s=parsed.timeout_s,
                    cell_id=call.id,
                    on_output=lambda stream, text: self._emit(
                        {
                            "type": "tool_output",
                            "tool_call_id": call.id,
                            "stream": stream,
                            "delta": text,
                        }
                    ),
                )
            finally:
                self.cell_deadline = None
        except asyncio.CancelledError:
            await asyncio.shield(self._abort_cell(call, started))
            raise
        except SandboxError as exc:
            self._repeats.forget()  # not the model's loop: the same cell is a fair retry
            await self._tool_error(
                call, _noticed(notice, f"the sandbox failed: {exc}"), "sandbox_error"
            )
            return None
        if result.kernel_restarted:
            self._repeats.forget()
        await self._append(
            "tool_result",
            ToolResultPayload(
                tool_call_id=call.id,
                text=_noticed(notice, shape_cell_result(result)),
                is_error=result.status != "ok",
                status=result.status,
                duration_ms=result.duration_ms,
                artifact=str(result.artifact_path) if result.artifact_path else None,
                kernel_restarted=result.kernel_restarted,
            ),
        )
        return None

    async def _abort_cell(self, call: _Call, started: float) -> None:
        # Every tool call in the history gets a result, or providers reject the next request.
        try:
            sandbox = await self.get_sandbox()
            await sandbox.interrupt()
        except Exception:  # the sandbox may be what failed; the record below still matters
            pass
        await self._append(
            "tool_result",
            ToolResultPayload(
                tool_call_id=call.id,
                text="[notice] the cell was interrupted by the user",
                is_error=True,
                status="aborted",
                duration_ms=(time.monotonic() - started) * 1000.0,
            ),
        )

    async def _tool_error(self, call: _Call, message: str, status: str) -> None:
        await self._append(
            "tool_result",
            ToolResultPayload(tool_call_id=call.id, text=message, is_error=True, status=status),
        )


@dataclass
class _Answer:
    """A model reply that has something in it: its tool calls (native or fenced) and text."""

    reply: ModelReply
    calls: list[_Call]
    text: str
    fenced: bool


def _noticed(notice: str, text: str) -> str:
    return f"{notice}\n{text}" if notice else text
