"""One streaming attempt through litellm: the transport for every provider that is not a plain
OpenAI-compatible endpoint (Anthropic, Gemini, Bedrock, ...), and for any endpoint when
``model_client = "litellm"`` in config.toml.

litellm's own retries are off (``ModelClient`` retries, so every attempt is an event), and its
exceptions become ``AttemptFailed`` here, so nothing above this module knows litellm's classes.
litellm is imported on a thread the first time (models/lite.py): seconds, never on a loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final

from orchestrator.models.cost import usage_record
from orchestrator.models.idle_timeout import IdleTimeout
from orchestrator.models.lite import ensure_litellm
from orchestrator.models.registry import ResolvedModel
from orchestrator.models.reply import (
    AttemptFailed,
    FailureKind,
    ModelReply,
    OnDelta,
    ToolCallParts,
    joined_calls,
    retry_after_s,
)
from orchestrator.settings import Settings

__all__ = ["LitellmStream"]

HTTP_TOO_MANY_REQUESTS: Final = 429
HTTP_SERVER_ERROR: Final = 500
ERROR_TEXT_MAX: Final = 300
CHAIN_DEPTH_MAX: Final = 12


class _StreamCut(Exception):
    """The stream ended without a finish reason."""


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _header(exc: BaseException, name: str) -> str | None:
    for holder in (getattr(exc, "response", None), exc):
        headers = getattr(holder, "headers", None)
        if headers is None and holder is exc:
            headers = getattr(exc, "litellm_response_headers", None)
        if headers is not None:
            try:
                value = headers.get(name)
            except Exception:
                value = None
            if value is not None:
                return str(value)
    return None


def _is_connect_failure(exc: BaseException) -> bool:
    """True when no connection was made at all (refused, DNS, unreachable).

    litellm reports these as a 500 "Connection error."; the cause chain tells the truth.
    """
    current: BaseException | None = exc
    for _ in range(CHAIN_DEPTH_MAX):
        if current is None:
            return False
        if isinstance(current, ConnectionRefusedError | ConnectionResetError):
            return isinstance(current, ConnectionRefusedError)
        if type(current).__name__ in ("ConnectError", "ClientConnectorError", "gaierror"):
            return True
        current = current.__cause__ or current.__context__
    return False


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    """True when ``kind`` is somewhere in ``exc``'s cause chain (not ``exc`` itself)."""
    current = exc.__cause__ or exc.__context__
    for _ in range(CHAIN_DEPTH_MAX):
        if current is None:
            return False
        if isinstance(current, kind):
            return True
        current = current.__cause__ or current.__context__
    return False


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # litellm prefixes messages with its exception path; keep what the provider said.
    for prefix in ("litellm.", "OpenAIException - ", "AnthropicException - "):
        if text.startswith(prefix) and " - " in text:
            text = text.split(" - ", 1)[1]
    return text[:ERROR_TEXT_MAX]


def _failure(litellm: Any, exc: BaseException) -> AttemptFailed:
    status = _status(exc)
    kind: FailureKind
    if isinstance(exc, _StreamCut):
        kind, reason = "stream_cut", "stream ended before the reply was complete"
    elif _is_connect_failure(exc):
        return AttemptFailed(
            "connection", f"connection failed: {_short(exc)}", status=status, connected=False
        )
    elif isinstance(exc, TimeoutError | litellm.Timeout):
        kind, reason = "timeout", "timed out waiting for the model"
    elif isinstance(exc, litellm.ContextWindowExceededError):
        kind, reason = "context_overflow", _short(exc)
    elif isinstance(exc, litellm.AuthenticationError):
        kind, reason = "auth", _short(exc)
    elif isinstance(exc, litellm.NotFoundError):
        kind, reason = "not_found", _short(exc)
    elif _caused_by(exc, json.JSONDecodeError):  # a body that does not parse
        kind, reason = "bad_response", f"unreadable reply from the server: {_short(exc)}"
    elif status == HTTP_TOO_MANY_REQUESTS or isinstance(exc, litellm.RateLimitError):
        return AttemptFailed(
            "rate_limited",
            f"rate limited (429): {_short(exc)}",
            status=status,
            retry_after_s=retry_after_s(_header(exc, "retry-after")),
        )
    elif any(k.__name__ == "MidStreamFallbackError" for k in type(exc).__mro__):
        kind, reason = "stream_cut", f"stream broke off: {_short(exc)}"
    elif status is not None and status >= HTTP_SERVER_ERROR:
        kind, reason = "server_error", f"server error ({status}): {_short(exc)}"
    elif isinstance(exc, litellm.APIConnectionError):
        kind, reason = "connection", f"connection failed: {_short(exc)}"
    else:
        kind, reason = "bad_request", _short(exc)
    return AttemptFailed(kind, reason, status=status)


class LitellmStream:
    def __init__(self, model: ResolvedModel, settings: Settings) -> None:
        self.model = model
        self.settings = settings

    async def attempt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
        on_delta: OnDelta | None,
    ) -> ModelReply:
        litellm = await ensure_litellm()
        try:
            return await self._attempt(litellm, messages, tools, temperature, on_delta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _failure(litellm, exc) from exc

    async def _attempt(
        self,
        litellm: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
        on_delta: OnDelta | None,
    ) -> ModelReply:
        kwargs: dict[str, Any] = {
            "model": self.model.litellm_model,
            # Copies: litellm may edit them, and the context's messages are EncodedMessages
            # that refuse edits (message_json.py).
            "messages": [dict(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.model.max_output_tokens,
            "num_retries": 0,
            "max_retries": 0,
            "timeout": self.settings.model_stream_idle_timeout_s,
        }
        if self.model.api_base:
            kwargs["api_base"] = self.model.api_base
        if self.model.api_key:
            kwargs["api_key"] = self.model.api_key
        if tools:
            kwargs["tools"] = tools
        if temperature is not None:
            kwargs["temperature"] = temperature
        idle = self.settings.model_stream_idle_timeout_s

        async with asyncio.timeout(idle):
            stream = await litellm.acompletion(**kwargs)
        text: list[str] = []
        thinking: list[str] = []
        calls: dict[int, ToolCallParts] = {}
        finish: str | None = None
        usage_obj: Any = None
        async with IdleTimeout(idle) as quiet:  # each chunk within idle of the one before
            async for chunk in stream:
                quiet.touch()
                usage = getattr(chunk, "usage", None)
                if usage is not None:
                    usage_obj = usage
                for choice in getattr(chunk, "choices", None) or []:
                    delta = getattr(choice, "delta", None)
                    if delta is not None:
                        # litellm names every provider's reasoning ``reasoning_content``.
                        thought = getattr(delta, "reasoning_content", None)
                        if isinstance(thought, str) and thought:
                            thinking.append(thought)
                            if on_delta is not None:
                                on_delta(thought, "thinking")
                        piece = getattr(delta, "content", None)
                        if piece:
                            text.append(piece)
                            if on_delta is not None:
                                on_delta(piece, "text")
                        for tc in getattr(delta, "tool_calls", None) or []:
                            index = getattr(tc, "index", None)
                            parts = calls.setdefault(
                                index if isinstance(index, int) else 0, ToolCallParts()
                            )
                            if getattr(tc, "id", None):
                                parts.id = tc.id
                            fn = getattr(tc, "function", None)
                            if fn is not None:
                                if getattr(fn, "name", None):
                                    parts.name = fn.name
                                if getattr(fn, "arguments", None):
                                    parts.arguments.append(fn.arguments)
                    if getattr(choice, "finish_reason", None):
                        finish = str(choice.finish_reason)
        if finish is None:
            raise _StreamCut()
        joined = "".join(text)
        tool_calls = joined_calls(calls)
        if usage_obj is None:
            # The server sent no usage (some OpenAI-compatible servers ignore include_usage):
            # count locally with litellm's offline tokenizer rather than record nothing.
            prompt = int(
                litellm.token_counter(
                    model=self.model.litellm_model, messages=[dict(m) for m in messages]
                )
            )
            completion = joined + "".join(c.arguments for c in tool_calls)
            output = int(litellm.token_counter(model=self.model.litellm_model, text=completion))
            usage = usage_record(
                self.model, prompt=prompt, output=output, cache_read=0, cache_write=0
            )
        else:
            usage = usage_record(
                self.model,
                prompt=_count(usage_obj, "prompt_tokens"),
                output=_count(usage_obj, "completion_tokens"),
                cache_read=_count(
                    getattr(usage_obj, "prompt_tokens_details", None), "cached_tokens"
                ),
                cache_write=_count(usage_obj, "cache_creation_input_tokens"),
            )
        return ModelReply(
            text=joined,
            tool_calls=tool_calls,
            finish_reason=finish,
            usage=usage,
            thinking="".join(thinking),
        )


def _count(obj: Any, name: str) -> int:
    value = getattr(obj, name, None) if obj is not None else None
    return int(value) if isinstance(value, int | float) else 0
