"""One streaming attempt against an OpenAI-compatible endpoint, without litellm.

The embedded model, vLLM, llama.cpp, Ollama's ``/v1`` and any ``openai/NAME --api-base URL``
speak the same chat-completions protocol, and litellm adds ~10 ms of client work per call (its
cost calculator and logging callbacks that walk the whole history after every call) plus
seconds and ~200 MB to import. This transport posts the request with http1.py, reads the SSE
stream a network piece at a time (sse.py, under one idle timer per stream: idle_timeout.py),
and turns every failure into the same ``AttemptFailed`` kinds that litellm_stream.py derives
from litellm's exceptions, so retries, usage and cost are the same whichever transport a
session uses (tests/integration/test_model_clients.py runs both against
the scripted model).

Connections are kept alive in one pool per event loop (``close_pools`` closes the pool of the
running loop at shutdown).

An attempt has three parts: the request (``OpenAIStream.request``: URL, headers, body), the
exchange (``exchange``: the HTTP request and the SSE stream, giving a ``RawReply``), and the
reply (usage and cost, on the caller's side). The exchange is the part a daemon can hand to a
model-call worker process (call_workers.py), so a stream's parsing does not run on the loop its
sessions share; the request and the reply stay with the session.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.call_records import ToolCall
from orchestrator.models import http1
from orchestrator.models.cost import usage_record
from orchestrator.models.idle_timeout import IdleTimeout
from orchestrator.models.message_json import messages_json
from orchestrator.models.registry import OPENAI_COMPATIBLE_PROVIDERS, ResolvedModel
from orchestrator.models.reply import (
    AttemptFailed,
    FailureKind,
    ModelReply,
    OnDelta,
    ToolCallParts,
    joined_calls,
    retry_after_s,
)
from orchestrator.models.sse import SseData
from orchestrator.settings import Settings

__all__ = [
    "Exchange",
    "OpenAIStream",
    "RawReply",
    "StreamRequest",
    "close_pools",
    "exchange",
    "wire_model_name",
]

ERROR_TEXT_MAX: Final = 300
HTTP_BAD_REQUEST: Final = 400
HTTP_UNAUTHORIZED: Final = 401
HTTP_FORBIDDEN: Final = 403
HTTP_NOT_FOUND: Final = 404
HTTP_PAYLOAD_TOO_LARGE: Final = 413
HTTP_TOO_MANY_REQUESTS: Final = 429
HTTP_SERVER_ERROR: Final = 500
SSE_DONE: Final = "[DONE]"
CHAT_PATH: Final = "/chat/completions"
# Where a stream's delta carries the model's reasoning, by provider habit.
REASONING_KEYS: Final = ("reasoning_content", "reasoning")
# What servers say when the prompt does not fit (OpenAI, vLLM, llama.cpp, Ollama).
_OVERFLOW_MARKERS: Final = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "exceeds the available context",
    "prompt is too long",
    "too many tokens",
)


async def close_pools() -> None:
    """Close the running loop's kept-alive connections (the next call opens new ones)."""
    http1.close_pool()


def wire_model_name(model: ResolvedModel) -> str:
    """The ``model`` field the server sees: the name without its provider prefix."""
    provider, sep, rest = model.litellm_model.partition("/")
    return rest if sep and provider in OPENAI_COMPATIBLE_PROVIDERS else model.litellm_model


def _short(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:ERROR_TEXT_MAX]


def _error_text(body: bytes) -> tuple[str, str]:
    """(message, code) from an OpenAI-shaped error body, else the body's first line."""
    raw = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(raw)
    except ValueError:
        return _short(raw), ""
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return _short(str(error.get("message") or "")), str(error.get("code") or "")
    if isinstance(error, str):
        return _short(error), ""
    return _short(raw), ""


def _status_failure(response: http1.Response, body: bytes) -> AttemptFailed:
    status = response.status
    message, code = _error_text(body)
    lowered = f"{code} {message}".lower()
    kind: FailureKind
    if status in (HTTP_BAD_REQUEST, HTTP_PAYLOAD_TOO_LARGE) and any(
        marker in lowered for marker in _OVERFLOW_MARKERS
    ):
        kind, reason = "context_overflow", message
    elif status in (HTTP_UNAUTHORIZED, HTTP_FORBIDDEN):
        kind, reason = "auth", message
    elif status == HTTP_NOT_FOUND:
        kind, reason = "not_found", message
    elif status == HTTP_TOO_MANY_REQUESTS:
        return AttemptFailed(
            "rate_limited",
            f"rate limited (429): {message}",
            status=status,
            retry_after_s=retry_after_s(response.headers.get("retry-after")),
        )
    elif status >= HTTP_SERVER_ERROR:
        kind, reason = "server_error", f"server error ({status}): {message}"
    else:
        kind, reason = "bad_request", f"{status}: {message}"
    return AttemptFailed(kind, reason, status=status)


def _transport_failure(exc: http1.HttpFailure, streaming: bool) -> AttemptFailed:
    if exc.stage == "connect":
        return AttemptFailed("connection", f"connection failed: {exc}", connected=False)
    if streaming:  # the body broke off after the reply had begun
        return AttemptFailed("stream_cut", f"stream broke off: {exc}")
    return AttemptFailed("connection", f"connection failed: {exc}")


@dataclass(frozen=True)
class StreamRequest:
    """One attempt's HTTP request (the key is in ``headers``: never logged, never on disk)."""

    url: str
    headers: dict[str, str]
    body: bytes
    idle_s: float  # the longest wait for the response, and between two pieces of the stream


@dataclass(frozen=True)
class RawReply:
    """What the stream said, before usage becomes a record with a cost."""

    text: str
    tool_calls: list[ToolCall]
    finish: str
    usage: dict[str, Any] | None  # the server's usage object; None when it sent none
    thinking: str = ""  # reasoning deltas (``reasoning_content`` or ``reasoning``)


# Runs one exchange: ``exchange`` below, in this loop, or a model-call worker's.
Exchange = Callable[[StreamRequest, OnDelta | None], Awaitable[RawReply]]


async def exchange(request: StreamRequest, on_delta: OnDelta | None) -> RawReply:
    """Post ``request`` and read its stream; ``AttemptFailed`` for every failure."""
    idle = request.idle_s
    streaming = False
    try:
        async with asyncio.timeout(idle):
            response = await http1.pool().post(request.url, request.body, request.headers)
        try:
            if response.status >= HTTP_BAD_REQUEST:
                async with asyncio.timeout(idle):
                    body = await response.read()
                raise _status_failure(response, body)
            streaming = True
            return await _read(response, on_delta, idle)
        finally:
            response.release()
    except TimeoutError:
        raise AttemptFailed("timeout", "timed out waiting for the model") from None
    except http1.HttpFailure as exc:
        raise _transport_failure(exc, streaming) from exc


async def _read(response: http1.Response, on_delta: OnDelta | None, idle_s: float) -> RawReply:
    reply = _StreamedReply(on_delta)
    sse = SseData()
    try:
        async with IdleTimeout(idle_s) as idle:  # each piece within idle_s of the last
            async for piece in response.chunks():
                idle.touch()
                for data in sse.feed(piece):
                    reply.take(data)
        for data in sse.end():
            reply.take(data)
    except (TimeoutError, http1.HttpFailure):
        if not reply.done:
            raise  # a server that holds the connection open after [DONE] costs nothing
    if reply.finish is None:
        raise AttemptFailed("stream_cut", "stream ended before the reply was complete")
    return RawReply(
        "".join(reply.text),
        joined_calls(reply.calls),
        reply.finish,
        reply.usage,
        "".join(reply.thinking),
    )


class OpenAIStream:
    def __init__(
        self, model: ResolvedModel, settings: Settings, exchanger: Exchange = exchange
    ) -> None:
        self.model = model
        self.settings = settings
        self._url = (model.api_base or "").rstrip("/") + CHAT_PATH
        self._headers = {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}
        self._exchange = exchanger

    def body(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
    ) -> bytes:
        """The request as JSON; the messages last, joined from what each already encoded
        (message_json.py: the context's messages are not encoded again at every call)."""
        fields: dict[str, Any] = {
            "model": wire_model_name(self.model),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.model.max_output_tokens,
        }
        if tools:
            fields["tools"] = tools
        if temperature is not None:
            fields["temperature"] = temperature
        head = json.dumps(fields)  # "{...}": the messages go in before its closing brace
        return messages_json(messages, before=f'{head[:-1]}, "messages": ', after="}").encode()

    def request(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
    ) -> StreamRequest:
        return StreamRequest(
            self._url,
            self._headers,
            self.body(messages, tools, temperature),
            self.settings.model_stream_idle_timeout_s,
        )

    async def attempt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
        on_delta: OnDelta | None,
    ) -> ModelReply:
        raw = await self._exchange(self.request(messages, tools, temperature), on_delta)
        reply = await self._reply(raw, messages)
        reply.thinking = raw.thinking
        return reply

    async def _reply(self, raw: RawReply, messages: list[dict[str, Any]]) -> ModelReply:
        joined, tool_calls, finish, usage = raw.text, raw.tool_calls, raw.finish, raw.usage
        if usage is None:
            return ModelReply(
                joined, tool_calls, finish, await self._counted(messages, joined, tool_calls)
            )
        details = usage.get("prompt_tokens_details")
        return ModelReply(
            text=joined,
            tool_calls=tool_calls,
            finish_reason=finish,
            usage=usage_record(
                self.model,
                prompt=_count(usage, "prompt_tokens"),
                output=_count(usage, "completion_tokens"),
                cache_read=_count(details, "cached_tokens"),
                cache_write=_count(usage, "cache_creation_input_tokens"),
            ),
        )

    async def _counted(
        self, messages: list[dict[str, Any]], text: str, tool_calls: list[Any]
    ) -> Any:
        """The server sent no usage (some ignore include_usage): count with litellm's offline
        tokenizer, as the litellm transport does (the one use of litellm here; rare)."""
        from orchestrator.models.lite import ensure_litellm

        litellm = await ensure_litellm()
        name = self.model.litellm_model
        plain = [dict(m) for m in messages]  # litellm may edit what it is given
        prompt = int(litellm.token_counter(model=name, messages=plain))
        completion = text + "".join(c.arguments for c in tool_calls)
        output = int(litellm.token_counter(model=name, text=completion))
        return usage_record(self.model, prompt=prompt, output=output, cache_read=0, cache_write=0)


class _StreamedReply:
    """What the stream's payloads said so far; ``done`` once ``[DONE]`` came (what follows it is
    read, so the connection can be reused, but not taken)."""

    __slots__ = ("calls", "done", "finish", "on_delta", "text", "thinking", "usage")

    def __init__(self, on_delta: OnDelta | None) -> None:
        self.on_delta = on_delta
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, ToolCallParts] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False

    def take(self, data: str) -> None:
        if self.done:
            return
        if data == SSE_DONE:
            self.done = True
            return
        chunk = _parse_chunk(data)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict):
                thought = _reasoning(choice)
                if thought:
                    self.thinking.append(thought)
                    if self.on_delta is not None:
                        self.on_delta(thought, "thinking")
                piece = _add_choice(choice, self.text, self.calls)
                if piece and self.on_delta is not None:
                    self.on_delta(piece, "text")
                if choice.get("finish_reason"):
                    self.finish = str(choice["finish_reason"])


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise AttemptFailed(
            "bad_response", f"unreadable reply from the server: {_short(data)}"
        ) from None
    if not isinstance(chunk, dict):
        raise AttemptFailed("bad_response", f"unreadable reply from the server: {_short(data)}")
    error = chunk.get("error")
    if error is not None:  # an error sent inside the stream (OpenRouter, vLLM)
        message = error.get("message") if isinstance(error, dict) else error
        raise AttemptFailed(
            "server_error", f"the server broke off the reply: {_short(str(message))}"
        )
    return chunk


def _add_choice(
    choice: dict[str, Any], text: list[str], calls: dict[int, ToolCallParts]
) -> str | None:
    """Take one choice's delta into ``text`` and ``calls``; the text piece it carried."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return None
    for tc in delta.get("tool_calls") or []:
        _add_call(calls, tc)
    piece = delta.get("content")
    if isinstance(piece, str) and piece:
        text.append(piece)
        return piece
    return None


def _reasoning(choice: dict[str, Any]) -> str | None:
    """A delta's reasoning piece: ``reasoning_content`` (DeepSeek, vLLM, the embedded server)
    or ``reasoning`` (OpenRouter, Ollama)."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return None
    for key in REASONING_KEYS:
        piece = delta.get(key)
        if isinstance(piece, str) and piece:
            return piece
    return None


def _add_call(calls: dict[int, ToolCallParts], tc: Any) -> None:
    if not isinstance(tc, dict):
        return
    index = tc.get("index")
    parts = calls.setdefault(index if isinstance(index, int) else 0, ToolCallParts())
    if tc.get("id"):
        parts.id = str(tc["id"])
    fn = tc.get("function")
    if isinstance(fn, dict):
        if fn.get("name"):
            parts.name = str(fn["name"])
        if fn.get("arguments"):
            parts.arguments.append(str(fn["arguments"]))


def _count(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, dict) else None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
