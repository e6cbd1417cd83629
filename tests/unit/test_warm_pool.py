"""The warm pool's hand-out (sandbox/pool.py) with stand-in sandboxes: a pooled sandbox taken
out of the pool is either handed out or stopped, even when the acquire is cancelled mid-setup
(the leak a sweep's quick trials hit: a gateway alive after the daemon stopped)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.pool import WarmPool


class Pooled:
    def __init__(self) -> None:
        self.assigning = asyncio.Event()
        self.release = asyncio.Event()
        self.stopped = False

    async def assign(self, spec: SandboxSpec) -> None:
        self.assigning.set()
        await self.release.wait()

    async def is_alive(self) -> bool:
        return True

    async def stop(self) -> None:
        self.stopped = True


def _spec(tmp_path: Path) -> SandboxSpec:
    return SandboxSpec(session_id="s-x", cwd=tmp_path, artifacts_dir=tmp_path, die_with_parent=True)


async def test_an_acquire_cancelled_mid_setup_stops_the_pooled_sandbox(tmp_path: Path) -> None:
    made: list[Pooled] = []

    async def start_idle(die_with_parent: bool) -> Pooled:
        made.append(Pooled())
        return made[-1]

    async def cold_start(spec: SandboxSpec) -> Pooled:
        raise AssertionError("the pooled one was ready")

    pool: WarmPool[Pooled] = WarmPool(start_idle, cold_start, size=1, die_with_parent=True)
    await pool.wait_ready(timeout_s=5)
    first = made[0]
    acquiring = asyncio.create_task(pool.acquire(_spec(tmp_path)))
    await first.assigning.wait()
    acquiring.cancel()
    await asyncio.wait({acquiring})
    assert acquiring.cancelled()
    assert first.stopped  # not handed out, not back in the pool: stopped
    await pool.close()
