"""Provider gates (models/provider_gate.py) on a fake clock: the connection cap, request and
token rates, the order a call passes them in, and a Retry-After shared by every caller."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.models.provider_gate import (
    ProviderGates,
    ProviderLimits,
    TokenBucket,
    estimate_tokens,
)
from tests.fake_clock import FakeClock


def test_a_bucket_says_how_long_until_what_was_taken_is_there() -> None:
    clock = FakeClock()
    bucket = TokenBucket(per_minute=60, clock=clock)  # 1 a second, 60 saved up
    assert bucket.take(60) == 0.0
    assert bucket.take(3) == pytest.approx(3.0)  # behind the first 60
    clock.now = 3.0
    assert bucket.take(1) == pytest.approx(1.0)
    bucket.give_back(1)
    assert bucket.take(1) == pytest.approx(1.0)
    assert bucket.take(10_000) > 0  # more than a minute's worth: the whole bucket, not forever


async def test_requests_per_minute_spread_calls_out() -> None:
    clock = FakeClock()
    gates = ProviderGates(clock, clock.sleep)
    gates.configure("openai", ProviderLimits(requests_per_minute=6))  # one per 10 s, 6 saved
    started: list[float] = []
    for _ in range(8):
        async with gates.gate("openai").call(0):
            started.append(clock.now)
    assert started[:6] == [0.0] * 6
    assert started[6:] == pytest.approx([10.0, 20.0])


async def test_a_call_takes_its_slot_before_its_rate_tokens() -> None:
    """Calls queued on the connection cap do not hold rate tokens while they wait, so when
    slots free up they still pay the rate instead of bursting."""
    clock = FakeClock()
    gates = ProviderGates(clock, clock.sleep)
    gates.configure("k", ProviderLimits(connections=1, tokens_per_minute=600))  # 10/s
    gate = gates.gate("k")
    order: list[tuple[str, float]] = []
    release = asyncio.Event()

    async def call(name: str, tokens: int) -> None:
        async with gate.call(tokens) as used:
            order.append((name, clock.now))
            if name == "first":
                await release.wait()
            used(tokens)

    first = asyncio.create_task(call("first", 600))  # the whole minute's tokens
    await asyncio.sleep(0)
    second = asyncio.create_task(call("second", 100))
    await asyncio.sleep(0)
    assert order == [("first", 0.0)]  # the second waits on the slot, holding no tokens
    release.set()
    await asyncio.gather(first, second)
    assert order[1][0] == "second" and order[1][1] == pytest.approx(10.0)


async def test_the_token_bucket_is_trued_up_to_what_a_call_used() -> None:
    clock = FakeClock()
    gates = ProviderGates(clock, clock.sleep)
    gates.configure("k", ProviderLimits(tokens_per_minute=600))
    gate = gates.gate("k")
    async with gate.call(500) as used:
        used(50)  # the estimate was high: 450 come back
    async with gate.call(500):
        pass
    assert clock.now == 0.0


async def test_a_retry_after_holds_every_later_call() -> None:
    clock = FakeClock()
    gates = ProviderGates(clock, clock.sleep)
    gate = gates.gate("http://127.0.0.1:9/v1")  # no limits: it still shares Retry-After
    gate.pause(30)
    async with gates.gate("http://127.0.0.1:9/v1/").call(0):
        assert clock.now == pytest.approx(30.0)
    async with gates.gate("other").call(0):  # another endpoint is not held
        assert clock.now == pytest.approx(30.0)


def test_config_limits_apply_when_they_change_and_a_sweeps_hold_until_then() -> None:
    gates = ProviderGates()
    gates.configure_from_config("openai", ProviderLimits(connections=2))
    gates.configure("openai", ProviderLimits(connections=8))  # a sweep's
    gates.configure_from_config("openai", ProviderLimits(connections=2))  # config unchanged
    assert gates.gate("openai").limits.connections == 8
    gates.configure_from_config("openai", ProviderLimits(connections=3))  # config edited
    assert gates.gate("openai").limits.connections == 3


def test_the_estimate_counts_text_parts() -> None:
    messages = [
        {"role": "system", "content": "x" * 400},
        {"role": "user", "content": [{"type": "text", "text": "y" * 400}, {"type": "image"}]},
    ]
    assert estimate_tokens(messages) == 201
