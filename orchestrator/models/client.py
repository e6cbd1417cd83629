"""Streaming model calls with bounded retries and typed errors.

One ``ModelClient.complete`` call = one logical model call: it may make several HTTP attempts
(429 honouring Retry-After, 5xx, timeouts, a stream cut before its finish reason), reports each
retry through ``on_retry`` so it becomes an event, and ends in a ``ModelReply`` or one of the
``ModelError`` subclasses.

An attempt goes through one of two transports (models/reply.py is their contract): the lean
OpenAI-compatible client (openai_stream.py) when the endpoint speaks that protocol — the
embedded model, ``openai/NAME`` with an ``api_base`` —, else litellm (litellm_stream.py), which
stays the layer for every other provider. ``model_client = "litellm"`` in config.toml sends
everything through litellm. The retry and error rules below see only ``AttemptFailed`` kinds,
so both transports behave the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from orchestrator.errors import (
    MissingCredentials,
    ModelError,
    ModelNotFound,
    ModelUnreachable,
    ProviderError,
)
from orchestrator.models.cost import lookup_prices
from orchestrator.models.provider_gate import (
    ProviderLimits,
    estimate_tokens,
    gate_key,
    provider_gates,
)
from orchestrator.models.registry import ResolvedModel
from orchestrator.models.reply import RETRYABLE, AttemptFailed, ModelReply, OnDelta, RetryInfo
from orchestrator.settings import Settings

__all__ = ["ContextOverflow", "ModelClient", "ModelReply", "RetryInfo", "Transport"]


class ContextOverflow(ProviderError):
    """The provider says the prompt is longer than the model's window."""


class Transport(Protocol):
    async def attempt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float | None,
        on_delta: OnDelta | None,
    ) -> ModelReply: ...


def transport_for(model: ResolvedModel, settings: Settings) -> Transport:
    if settings.model_client == "auto" and model.speaks_openai:
        from orchestrator.models.call_workers import installed
        from orchestrator.models.openai_stream import OpenAIStream, exchange

        workers = installed()  # a daemon's model-call workers, when it runs any
        return OpenAIStream(model, settings, workers.exchanger() if workers else exchange)
    from orchestrator.models.litellm_stream import LitellmStream

    return LitellmStream(model, settings)


class ModelClient:
    def __init__(self, model: ResolvedModel, settings: Settings):
        self.model = model
        self.settings = settings
        self.transport = transport_for(model, settings)
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._prices_looked_up = False
        key = gate_key(model.provider, model.api_base)
        gates = provider_gates()
        limits = settings.providers.get(key)
        if limits is not None:
            gates.configure_from_config(key, ProviderLimits.of(limits))
        self.gate = gates.gate(key)

    async def _look_up_prices(self) -> None:
        """A reply's cost needs the model's prices, and the first look reads litellm's price
        map (~30-70 ms, once per process: models/price_map.py). Done on a thread before the
        first call, so it never stalls the event loop every session of a daemon shares."""
        if not self._prices_looked_up:
            await asyncio.to_thread(lookup_prices, self.model)
            self._prices_looked_up = True

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        on_delta: OnDelta | None = None,
        on_retry: Callable[[RetryInfo], Awaitable[None]] | None = None,
    ) -> ModelReply:
        await self._look_up_prices()
        attempts = self.settings.model_max_retries + 1
        connection_failures = 0
        last: AttemptFailed | None = None
        gate = self.gate
        estimate = estimate_tokens(messages) if gate.counts_tokens else 0
        for attempt in range(1, attempts + 1):
            try:
                async with gate.call(estimate) as used:
                    started = time.monotonic()
                    reply = await self.transport.attempt(messages, tools, temperature, on_delta)
                    used(reply.usage.input + reply.usage.output)
            except AttemptFailed as exc:
                last = exc
                asked = exc.retry_after_s if exc.kind == "rate_limited" else None
                if asked and asked <= self.settings.retry_max_delay_s:
                    # Every session's next call to it waits too (a wait longer than we allow
                    # fails this call at once, and holds no one).
                    gate.pause(asked)
                if not exc.connected:
                    connection_failures += 1
                if exc.kind not in RETRYABLE or attempt == attempts:
                    break
                delay = self._delay(exc, attempt)
                if delay is None:
                    break  # the server asked for a wait longer than we allow
                if on_retry is not None:
                    await on_retry(RetryInfo(attempt=attempt, delay_s=delay, reason=exc.reason))
                await self._sleep(delay)
                continue
            reply.usage.latency_ms = (time.monotonic() - started) * 1000.0
            return reply
        assert last is not None
        raise self._translate(last, connection_failures == attempts, attempt)

    def _delay(self, exc: AttemptFailed, attempt: int) -> float | None:
        asked = exc.retry_after_s if exc.kind == "rate_limited" else None
        if asked is not None:
            return asked if asked <= self.settings.retry_max_delay_s else None
        backoff: float = min(
            self.settings.retry_base_delay_s * (2 ** (attempt - 1)),
            self.settings.retry_max_delay_s,
        )
        return backoff

    def _translate(self, exc: AttemptFailed, never_connected: bool, attempts: int) -> ModelError:
        where = self.model.api_base or self.model.provider
        if exc.kind == "context_overflow":
            return ContextOverflow(exc.reason, status=exc.status, error_class="context_overflow")
        if exc.kind == "auth":
            return MissingCredentials(
                f"{where} rejected the API key for {self.model.selector}: check the key"
            )
        if exc.kind == "not_found":
            return ModelNotFound(f"{where} does not serve model {self.model.name!r}")
        if never_connected:
            why = exc.reason.removeprefix("connection failed: ")
            return ModelUnreachable(
                f"cannot reach the model endpoint {where}: {why}; "
                "check --api-base and that the server is running"
            )
        reason = exc.reason
        if exc.kind == "rate_limited" and self._delay(exc, 1) is None:
            reason += f" (asked to wait longer than {self.settings.retry_max_delay_s:g} s)"
        return ProviderError(
            f"{self.model.selector}: {reason} (gave up after {attempts} "
            f"attempt{'' if attempts == 1 else 's'})",
            status=exc.status,
            error_class=exc.kind,
        )
