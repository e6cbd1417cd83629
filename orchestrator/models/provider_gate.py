"""One gate per model endpoint, shared by every session of the process: a cap on calls in
flight, request and token rates, and the endpoint's Retry-After (docs/sweeps.md).

A call passes the gate in a fixed order: it first takes a **connection slot** (a semaphore),
then waits out a **pause** (the latest Retry-After any call to this endpoint was given), then
takes a **request token** and its estimated **input tokens** from two token buckets. Taking
the slot first means calls that queued on the cap do not burst when slots free up: each still
pays the rates. After the reply the token bucket is trued up to the tokens really used.

A 429 with Retry-After pauses every later call to the endpoint, not only the one retried:
many sessions against one account share its quota, so one session's rate limit is everyone's.

The gate is keyed by endpoint: the ``api_base`` when the model has one, else the provider.
Limits come from config.toml's ``[providers."KEY"]`` tables and from a sweep file's
``providers`` section (``configure``: the newest setting of a key wins, for the process's life).
Without limits a gate only shares Retry-After. Time and sleep are injectable (tests use a fake
clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from orchestrator.settings import ProviderLimitsConfig

__all__ = [
    "SECONDS_PER_MINUTE",
    "ProviderGate",
    "ProviderGates",
    "ProviderLimits",
    "TokenBucket",
    "estimate_tokens",
    "gate_key",
    "provider_gates",
]

SECONDS_PER_MINUTE: Final = 60.0

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class ProviderLimits:
    connections: int | None = None  # calls in flight
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None  # input and output tokens

    @classmethod
    def of(cls, config: ProviderLimitsConfig) -> ProviderLimits:
        """config.toml's (or a sweep file's) ``[providers."KEY"]`` table."""
        return cls(config.connections, config.requests_per_minute, config.tokens_per_minute)


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up (a minute's worth). ``take``
    takes now and answers how long to wait before the taken tokens are really there (the
    level may go negative: later takers wait behind it, in order)."""

    def __init__(self, per_minute: float, clock: Clock) -> None:
        self.rate = per_minute / SECONDS_PER_MINUTE
        self.capacity = per_minute
        self._clock = clock
        self._level = per_minute
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now

    def take(self, amount: float) -> float:
        """Take ``amount``; seconds until the bucket covers it (0 when it does now)."""
        self._refill()
        # More than a minute's worth in one take can never be covered: take the whole bucket.
        amount = min(amount, self.capacity)
        self._level -= amount
        return 0.0 if self._level >= 0 else -self._level / self.rate

    def give_back(self, amount: float) -> None:
        """Return tokens taken but not used (or take more, with a negative amount)."""
        self._refill()
        self._level = min(self.capacity, self._level + amount)


class ProviderGate:
    def __init__(self, limits: ProviderLimits, clock: Clock, sleep: Sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._paused_until = 0.0
        self.limits = limits
        self._slots: asyncio.Semaphore | None = None
        self._requests: TokenBucket | None = None
        self._tokens: TokenBucket | None = None
        self.configure(limits)

    def configure(self, limits: ProviderLimits) -> None:
        self.limits = limits
        self._slots = asyncio.Semaphore(limits.connections) if limits.connections else None
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        self._requests = TokenBucket(rpm, self._clock) if rpm else None
        self._tokens = TokenBucket(tpm, self._clock) if tpm else None

    def pause(self, seconds: float) -> None:
        """A Retry-After: no call to this endpoint starts for ``seconds``."""
        self._paused_until = max(self._paused_until, self._clock() + seconds)

    @property
    def counts_tokens(self) -> bool:
        """Whether a call must say how many tokens it will send (``call``'s estimate)."""
        return self._tokens is not None

    @property
    def paused_for(self) -> float:
        return max(0.0, self._paused_until - self._clock())

    @contextlib.asynccontextmanager
    async def call(self, estimated_tokens: int) -> AsyncIterator[Callable[[int], None]]:
        """Hold a slot for one call; yields ``used(tokens)`` to true the token bucket up."""
        slots, requests, tokens = self._slots, self._requests, self._tokens
        if slots is not None:
            await slots.acquire()
        try:
            while (wait := self.paused_for) > 0:
                await self._sleep(wait)
            wait = max(
                requests.take(1) if requests is not None else 0.0,
                tokens.take(estimated_tokens) if tokens is not None else 0.0,
            )
            if wait > 0:
                await self._sleep(wait)
            while (wait := self.paused_for) > 0:  # a 429 landed while this call waited
                await self._sleep(wait)

            def used(actual: int) -> None:
                if tokens is not None:
                    tokens.give_back(estimated_tokens - actual)

            yield used
        finally:
            if slots is not None:
                slots.release()


def gate_key(provider: str, api_base: str | None) -> str:
    return (api_base or provider).rstrip("/")


def estimate_tokens(messages: list[dict[str, object]], chars_per_token: int = 4) -> int:
    """A rough count of what ``messages`` send (their text at ``chars_per_token``): only
    computed for a gate that counts tokens, as it walks the whole history."""
    chars = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(str(part.get("text", ""))) for part in content if isinstance(part, dict)
            )
    return chars // chars_per_token + 1


class ProviderGates:
    """The process's gates, by ``gate_key``."""

    def __init__(self, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock = clock
        self._sleep = sleep
        self._gates: dict[str, ProviderGate] = {}
        self._limits: dict[str, ProviderLimits] = {}
        self._from_config: dict[str, ProviderLimits] = {}

    def configure(self, key: str, limits: ProviderLimits) -> None:
        key = key.rstrip("/")
        self._limits[key] = limits
        if key in self._gates:
            self._gates[key].configure(limits)

    def configure_from_config(self, key: str, limits: ProviderLimits) -> None:
        """config.toml's limits for ``key``, applied when they change (so a sweep's limits
        for the same key hold until config.toml says otherwise)."""
        key = key.rstrip("/")
        if self._from_config.get(key) != limits:
            self._from_config[key] = limits
            self.configure(key, limits)

    def gate(self, key: str) -> ProviderGate:
        key = key.rstrip("/")
        found = self._gates.get(key)
        if found is None:
            limits = self._limits.get(key, ProviderLimits())
            found = self._gates[key] = ProviderGate(limits, self._clock, self._sleep)
        return found

    def limits(self) -> dict[str, ProviderLimits]:
        return dict(self._limits)


_process_gates: ProviderGates | None = None


def provider_gates() -> ProviderGates:
    """The gates every ``ModelClient`` of this process shares."""
    global _process_gates
    if _process_gates is None:
        _process_gates = ProviderGates()
    return _process_gates
