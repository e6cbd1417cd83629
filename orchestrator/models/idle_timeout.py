"""A timeout that starts over at each sign of progress, at no timer cost per sign.

A model stream must be given up when it goes quiet for ``model_stream_idle_timeout_s``, and a
reply arrives in tens to hundreds of pieces. An ``asyncio.timeout`` around each piece schedules
a timer and cancels it again every time (a heap push, a cancelled handle the loop pops later):
under 20 sessions in one daemon that was the largest single cost of the event loop thread per
step (docs/benchmarks.md, "Where a step's host CPU goes").

Here ``touch`` only notes the loop's time. One timer is armed for the last touch + ``idle_s``;
when it fires it looks whether a touch came since and, if so, arms itself again for the new
deadline. The timeout therefore fires when a fresh timeout per piece would (``idle_s`` after
the last touch), while a stream that keeps arriving costs one timer per ``idle_s``.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["IdleTimeout"]


class IdleTimeout:
    """``async with IdleTimeout(idle_s) as idle: ... idle.touch() ...``: the block is cancelled
    (``TimeoutError`` at its end, as ``asyncio.timeout`` raises it) once ``idle_s`` passed
    since entering it or since the last ``touch``."""

    __slots__ = ("_handle", "_idle_s", "_last", "_loop", "_timeout")

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeout: asyncio.Timeout | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._last = 0.0

    async def __aenter__(self) -> IdleTimeout:
        loop = self._loop = asyncio.get_running_loop()
        self._timeout = asyncio.timeout(None)
        await self._timeout.__aenter__()
        self._last = loop.time()
        self._handle = loop.call_at(self._last + self._idle_s, self._check)
        return self

    def touch(self) -> None:
        """Progress: the deadline is ``idle_s`` from now (checked when the timer fires)."""
        assert self._loop is not None, "touch outside the async with"
        self._last = self._loop.time()

    def _check(self) -> None:
        assert self._loop is not None and self._timeout is not None
        deadline = self._last + self._idle_s
        if self._loop.time() >= deadline:
            self._handle = None
            self._timeout.reschedule(deadline)  # in the past: the block is cancelled now
        else:
            self._handle = self._loop.call_at(deadline, self._check)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._timeout is not None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._timeout.__aexit__(exc_type, exc, tb)  # raises TimeoutError if it fired
