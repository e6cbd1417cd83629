"""Warm pool: sandboxes started ahead of time, so a new session's first cell does not wait for
a gateway and a kernel to boot (~1-2 s on a small machine).

An idle pooled sandbox belongs to no session; ``acquire(spec)`` hands one over (``assign``
runs a small setup execution: cwd, env) and wakes the background filler to start a
replacement. When none is ready, or the one at hand is dead or wants a different
``die_with_parent``, ``acquire`` falls back to a cold start. Start failures back off
exponentially, so a broken installation does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.settings import WARM_POOL_SIZE

__all__ = [
    "POOL_RETRY_BASE_DELAY_S",
    "POOL_RETRY_MAX_DELAY_S",
    "PoolStatistics",
    "Poolable",
    "WarmPool",
]

log = logging.getLogger(__name__)

POOL_RETRY_BASE_DELAY_S = 1.0  # after a failed start: 1, 2, 4, ... s
POOL_RETRY_MAX_DELAY_S = 60.0


class Poolable(Protocol):
    async def assign(self, spec: SandboxSpec) -> None: ...

    async def is_alive(self) -> bool: ...

    async def stop(self) -> None: ...


P = TypeVar("P", bound=Poolable)


@dataclass(frozen=True)
class PoolStatistics:
    size: int
    ready: int
    starting: bool
    hits: int  # acquires served from the pool
    misses: int  # acquires that fell back to a cold start
    start_failures: int


class WarmPool(Generic[P]):
    """Keeps ``size`` idle sandboxes ready; see the module docstring.

    ``start_idle(die_with_parent)`` starts one idle sandbox; ``cold_start(spec)`` starts one for
    a session directly.
    """

    def __init__(
        self,
        start_idle: Callable[[bool], Awaitable[P]],
        cold_start: Callable[[SandboxSpec], Awaitable[P]],
        *,
        size: int = WARM_POOL_SIZE,
        die_with_parent: bool = True,
    ):
        if size < 0:
            raise ValueError("pool size must be >= 0")
        self.size = size
        self.die_with_parent = die_with_parent
        self._start_idle = start_idle
        self._cold_start = cold_start
        self._ready: deque[P] = deque()
        self._need = asyncio.Event()
        self._changed = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._starting = False
        self._closed = False
        self._hits = 0
        self._misses = 0
        self._failures = 0

    def start(self) -> None:
        """Begin filling in the background; idempotent. Needs a running event loop."""
        if self._filler is None and not self._closed and self.size > 0:
            self._need.set()
            self._filler = asyncio.get_running_loop().create_task(
                self._fill(), name="warm-pool-filler"
            )

    async def acquire(self, spec: SandboxSpec) -> P:
        """A sandbox for ``spec``: a pooled one when ready (at once), else a cold start."""
        if self._closed:
            raise SandboxError("warm pool is closed")
        if spec.die_with_parent == self.die_with_parent:
            while self._ready:
                candidate = self._ready.popleft()
                self._need.set()
                try:
                    if await candidate.is_alive():
                        await candidate.assign(spec)
                        self._hits += 1
                        return candidate
                except SandboxError as exc:
                    log.warning("warm pool: a pooled sandbox failed its setup: %s", exc)
                except BaseException:
                    # Cancelled mid-setup (the session was unloaded while its sandbox was
                    # being assigned): out of the pool and not handed out, so stopped here or
                    # nowhere. Shielded: a second cancellation must not leave it running.
                    await asyncio.shield(candidate.stop())
                    raise
                await candidate.stop()
        self._misses += 1
        return await self._cold_start(spec)

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until the pool is full (daemon start, tests, benchmarks)."""
        self.start()
        async with asyncio.timeout(timeout_s):
            while len(self._ready) < self.size:
                self._changed.clear()
                await self._changed.wait()

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            size=self.size,
            ready=len(self._ready),
            starting=self._starting,
            hits=self._hits,
            misses=self._misses,
            start_failures=self._failures,
        )

    async def close(self) -> None:
        """Stop filling and stop every idle sandbox."""
        self._closed = True
        filler, self._filler = self._filler, None
        if filler is not None:
            filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filler
        idle = list(self._ready)
        self._ready.clear()
        async with asyncio.TaskGroup() as tg:
            for sandbox in idle:
                tg.create_task(sandbox.stop())

    async def _fill(self) -> None:
        consecutive_failures = 0
        while not self._closed:
            await self._need.wait()
            self._need.clear()
            while not self._closed and len(self._ready) < self.size:
                self._starting = True
                try:
                    sandbox = await self._start_idle(self.die_with_parent)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    consecutive_failures += 1
                    self._failures += 1
                    delay = min(
                        POOL_RETRY_MAX_DELAY_S,
                        POOL_RETRY_BASE_DELAY_S * 2 ** (consecutive_failures - 1),
                    )
                    log.warning("warm pool: start failed (retry in %.0f s): %s", delay, exc)
                    await asyncio.sleep(delay)
                    continue
                finally:
                    self._starting = False
                consecutive_failures = 0
                if self._closed:
                    await sandbox.stop()
                    return
                self._ready.append(sandbox)
                self._changed.set()
