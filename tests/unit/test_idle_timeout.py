"""orchestrator/models/idle_timeout.py: fires ``idle_s`` after the last touch, and a touch costs
no timer (the reason it exists: docs/benchmarks.md, "Where a step's host CPU goes").

The loop's clock is a fake the test moves, so nothing here waits for real time: each
``_turns()`` lets the loop run the timers that are due at the fake time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

from orchestrator.models.idle_timeout import IdleTimeout

IDLE_S: Final = 10.0
LOOP_TURNS: Final = 3  # enough for a due timer to fire and the cancellation to land


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Clock]:
    fake = Clock()
    monkeypatch.setattr(asyncio.get_running_loop(), "time", fake)
    yield fake


async def _turns() -> None:
    for _ in range(LOOP_TURNS):
        await asyncio.sleep(0)


async def _forever() -> None:
    await asyncio.Event().wait()  # only a cancellation ends it


async def test_untouched_it_fires_idle_s_after_entry(clock: Clock) -> None:
    entered = clock.now
    with pytest.raises(TimeoutError):
        async with IdleTimeout(IDLE_S):
            clock.now += IDLE_S
            await _forever()
    assert clock.now == entered + IDLE_S


async def test_each_touch_moves_the_deadline(clock: Clock) -> None:
    reached = []
    with pytest.raises(TimeoutError):
        async with IdleTimeout(IDLE_S) as idle:
            for _ in range(3):  # 3 × 0.6 idle_s: past the first deadline, touched in between
                clock.now += IDLE_S * 0.6
                idle.touch()
                await _turns()
                reached.append(clock.now)
            last_touch = clock.now
            clock.now += IDLE_S * 0.9
            await _turns()
            reached.append(clock.now)  # not yet
            clock.now = last_touch + IDLE_S
            await _forever()
    assert len(reached) == 4 and clock.now == last_touch + IDLE_S


async def test_a_block_that_ends_in_time_is_not_cancelled(clock: Clock) -> None:
    async with IdleTimeout(IDLE_S) as idle:
        idle.touch()
    clock.now += IDLE_S * 2
    await _turns()  # the timer was cancelled with the block: nothing to cancel us now


async def test_touches_arm_no_timer(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    async with IdleTimeout(IDLE_S) as idle:
        for _ in range(1000):
            idle.touch()
            await asyncio.sleep(0)
    assert len(armed) == 1  # the one timer, armed on entry; a touch only notes the time
    armed.clear()
    async with IdleTimeout(IDLE_S) as idle:  # touched through two idle periods: two re-arms
        for _ in range(2):
            clock.now += IDLE_S * 0.9
            idle.touch()
            clock.now += IDLE_S * 0.2
            await _turns()
    assert len(armed) == 3
