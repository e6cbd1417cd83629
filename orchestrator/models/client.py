"""Streaming model calls through litellm, with bounded retries and typed errors.

One ``ModelClient.complete`` call = one logical model call: it may make several HTTP attempts
(429 honouring Retry-After, 5xx, timeouts, a stream cut before its finish reason), reports each
retry through ``on_retry`` so it becomes an event, and ends in a ``ModelReply`` or one of the
``ModelError`` subclasses. litellm's own retries are off so that every attempt is visible.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.call_records import ToolCall, UsagePayload
from orchestrator.errors import (
    MissingCredentials,
    ModelError,
    ModelNotFound,
    ModelUnreachable,
    ProviderError,
)
from orchestrator.models.cost import call_cost
from orchestrator.models.lite import ensure_litellm
from orchestrator.models.registry import ResolvedModel
from orchestrator.settings import Settings

__all__ = ["ContextOverflow", "ModelClient", "ModelReply", "RetryInfo"]

HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500
CONNECT_TIMEOUT_S = 30.0
ERROR_TEXT_MAX = 300


class ContextOverflow(ProviderError):
    """The provider says the prompt is longer than the model's window."""


@dataclass
class ModelReply:
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str
    usage: UsagePayload


@dataclass(frozen=True)
class RetryInfo:
    attempt: int  # the attempt that failed, 1-based
    delay_s: float
    reason: str


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


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


def _retry_after_s(exc: BaseException) -> float | None:
    raw = _header(exc, "retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


CHAIN_DEPTH_MAX = 12


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


class ModelClient:
    def __init__(self, model: ResolvedModel, settings: Settings):
        self.model = model
        self.settings = settings
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        on_delta: Callable[[str], None] | None = None,
        on_retry: Callable[[RetryInfo], Awaitable[None]] | None = None,
    ) -> ModelReply:
        litellm = await ensure_litellm()
        attempts = self.settings.model_max_retries + 1
        connection_failures = 0
        last: BaseException | None = None
        for attempt in range(1, attempts + 1):
            started = time.monotonic()
            try:
                reply = await self._attempt(litellm, messages, tools, temperature, on_delta)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # translated below
                if not isinstance(exc, Exception):
                    raise
                last = exc
                retryable, reason = self._classify(litellm, exc)
                if _is_connect_failure(exc):
                    connection_failures += 1
                if not retryable or attempt == attempts:
                    break
                delay = self._delay(exc, attempt)
                if delay is None:
                    break  # the server asked for a wait longer than we allow
                if on_retry is not None:
                    await on_retry(RetryInfo(attempt=attempt, delay_s=delay, reason=reason))
                await self._sleep(delay)
                continue
            reply.usage.latency_ms = (time.monotonic() - started) * 1000.0
            return reply
        assert last is not None
        raise self._translate(litellm, last, connection_failures == attempts, attempt)

    def _delay(self, exc: BaseException, attempt: int) -> float | None:
        asked = _retry_after_s(exc) if _status(exc) == HTTP_TOO_MANY_REQUESTS else None
        if asked is not None:
            return asked if asked <= self.settings.retry_max_delay_s else None
        backoff: float = min(
            self.settings.retry_base_delay_s * (2 ** (attempt - 1)),
            self.settings.retry_max_delay_s,
        )
        return backoff

    def _classify(self, litellm: Any, exc: BaseException) -> tuple[bool, str]:
        retryable, reason, _ = self._classify_typed(litellm, exc)
        return retryable, reason

    def _classify_typed(self, litellm: Any, exc: BaseException) -> tuple[bool, str, str]:
        """(retryable, a reason for the retry event, the error class of ``ModelError``)."""
        if isinstance(exc, _StreamCut):
            return True, "stream ended before the reply was complete", "stream_cut"
        if _is_connect_failure(exc):
            return True, f"connection failed: {_short(exc)}", "connection"
        if isinstance(exc, TimeoutError | litellm.Timeout):
            return True, "timed out waiting for the model", "timeout"
        if isinstance(exc, litellm.ContextWindowExceededError):
            return False, "context window exceeded", "context_overflow"
        if isinstance(exc, litellm.AuthenticationError | litellm.NotFoundError):
            return False, _short(exc), "rejected"
        if _caused_by(exc, json.JSONDecodeError):  # a body that does not parse
            return True, f"unreadable reply from the server: {_short(exc)}", "bad_response"
        status = _status(exc)
        if status == HTTP_TOO_MANY_REQUESTS or isinstance(exc, litellm.RateLimitError):
            return True, f"rate limited (429): {_short(exc)}", "rate_limited"
        if any(k.__name__ == "MidStreamFallbackError" for k in type(exc).__mro__):
            return True, f"stream broke off: {_short(exc)}", "stream_cut"
        if status is not None and status >= HTTP_SERVER_ERROR:
            return True, f"server error ({status}): {_short(exc)}", "server_error"
        if isinstance(exc, litellm.APIConnectionError):
            return True, f"connection failed: {_short(exc)}", "connection"
        return False, _short(exc), "bad_request"

    def _translate(
        self, litellm: Any, exc: BaseException, never_connected: bool, attempts: int
    ) -> ModelError:
        where = self.model.api_base or self.model.provider
        if isinstance(exc, litellm.ContextWindowExceededError):
            return ContextOverflow(_short(exc), status=_status(exc), error_class="context_overflow")
        if isinstance(exc, litellm.AuthenticationError):
            return MissingCredentials(
                f"{where} rejected the API key for {self.model.selector}: check the key"
            )
        if isinstance(exc, litellm.NotFoundError):
            return ModelNotFound(f"{where} does not serve model {self.model.name!r}")
        if never_connected:
            return ModelUnreachable(
                f"cannot reach the model endpoint {where}: {_short(exc)}; "
                "check --api-base and that the server is running"
            )
        retryable, reason, error_class = self._classify_typed(litellm, exc)
        if retryable and _status(exc) == HTTP_TOO_MANY_REQUESTS and self._delay(exc, 1) is None:
            reason += f" (asked to wait longer than {self.settings.retry_max_delay_s:g} s)"
        return ProviderError(
            f"{self.model.selector}: {reason} (gave up after {attempts} "
            f"attempt{'' if attempts == 1 else 's'})",
            status=_status(exc),
            error_class=error_class,
        )

    async def _attempt(
        self,
        litellm: Any,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
        on_delta: Callable[[str], None] | None,
    ) -> ModelReply:
        kwargs: dict[str, Any] = {
            "model": self.model.litellm_model,
            "messages": messages,
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
        calls: dict[int, _ToolCallParts] = {}
        finish: str | None = None
        usage_obj: Any = None
        iterator = stream.__aiter__()
        while True:
            try:
                async with asyncio.timeout(idle):
                    chunk = await iterator.__anext__()
            except StopAsyncIteration:
                break
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                usage_obj = usage
            for choice in getattr(chunk, "choices", None) or []:
                delta = getattr(choice, "delta", None)
                if delta is not None:
                    piece = getattr(delta, "content", None)
                    if piece:
                        text.append(piece)
                        if on_delta is not None:
                            on_delta(piece)
                    for tc in getattr(delta, "tool_calls", None) or []:
                        index = getattr(tc, "index", None)
                        parts = calls.setdefault(
                            index if isinstance(index, int) else 0, _ToolCallParts()
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
        tool_calls = [
            ToolCall(
                id=p.id or f"call_{i}", name=p.name or "ipython", arguments="".join(p.arguments)
            )
            for i, p in sorted(calls.items())
        ]
        return ModelReply(
            text=joined,
            tool_calls=tool_calls,
            finish_reason=finish,
            usage=self._usage(litellm, usage_obj, messages, joined, tool_calls),
        )

    def _usage(
        self,
        litellm: Any,
        usage: Any,
        messages: list[dict[str, Any]],
        text: str,
        tool_calls: list[ToolCall],
    ) -> UsagePayload:
        def num(obj: Any, name: str) -> int:
            value = getattr(obj, name, None) if obj is not None else None
            return int(value) if isinstance(value, int | float) else 0

        if usage is not None:
            prompt = num(usage, "prompt_tokens")
            output = num(usage, "completion_tokens")
            cache_read = num(getattr(usage, "prompt_tokens_details", None), "cached_tokens")
            cache_write = num(usage, "cache_creation_input_tokens")
        else:
            # The server sent no usage (some OpenAI-compatible servers ignore include_usage):
            # count locally with litellm's offline tokenizer rather than record nothing.
            prompt = int(litellm.token_counter(model=self.model.litellm_model, messages=messages))
            completion = text + "".join(c.arguments for c in tool_calls)
            output = int(litellm.token_counter(model=self.model.litellm_model, text=completion))
            cache_read = cache_write = 0
        uncached = max(0, prompt - cache_read - cache_write)
        return UsagePayload(
            provider=self.model.provider,
            model=self.model.name,
            input=uncached,
            output=output,
            cache_read=cache_read,
            cache_write=cache_write,
            cost_usd=call_cost(
                self.model,
                input=uncached,
                output=output,
                cache_read=cache_read,
                cache_write=cache_write,
            ),
        )
