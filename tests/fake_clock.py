"""A clock tests move by hand: ``sleep`` advances it at once (and yields to the loop), so code
that waits on time runs instantly and says how long it would have waited."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)
