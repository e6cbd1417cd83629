"""The scheduler: puts the prompts of due heartbeats and schedules into their sessions.

One task per daemon (``Scheduler.start``). It sleeps until the earliest ``next_run_at`` (or until
``poke()`` says a schedule was added or changed), then for each due schedule:

1. **Defer** while the session is busy in a way a prompt must not interrupt (``defer(session_id)``
   is true: it compacts, or a cell runs). The tick is *not claimed*; it is looked at again after
   ``DEFER_RETRY_S`` (or at the next poke), and ticks that fall due meanwhile fold into it.
2. **Claim** it in one transaction (``store.schedules.claim_due``): a ``claimed`` dispatch is
   written and ``next_run_at`` moves on, so the tick is handed out once.
3. **Deliver** it (``deliver(schedule, dispatch)``, in its own task so a slow session wake does
   not hold up the others) and mark the dispatch ``delivered``, or ``failed`` with the error. A
   failed delivery is never retried: it was claimed, and we cannot know how far it got.

A crash between 2 and 3 leaves the claim open; ``start()`` first marks every open claim
``interrupted`` and returns them (the daemon records a ``schedule_tick`` event for each) rather
than replay a prompt that may already have been delivered.

**Time.** ``next_run_at`` is wall-clock time (``clock``), while the wait is on the loop's
monotonic clock; the wait is capped at ``MAX_WAIT_S`` so that a wall-clock jump (or a fake clock
in tests) is noticed within that long. There is no polling: between ticks the task waits on an
``asyncio.Event``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import duckdb

from orchestrator.store import schedules as schedule_store
from orchestrator.store.db import Store
from orchestrator.store.queries import utcnow
from orchestrator.store.schedules import DispatchRow, DispatchStatus, ScheduleRow

__all__ = [
    "CLAIM_BATCH",
    "CLOSE_GRACE_S",
    "DEFER_RETRY_S",
    "ERROR_RETRY_S",
    "MAX_WAIT_S",
    "NOT_DELIVERED",
    "Scheduler",
    "SchedulerStatistics",
]

log = logging.getLogger(__name__)

# A due tick of a session that is compacting or running a cell is looked at again this much
# later (sooner if something pokes the scheduler).
DEFER_RETRY_S: Final = 5.0
# The longest single wait: bounds how late a wall-clock jump is noticed.
MAX_WAIT_S: Final = 60.0
# Ticks claimed per pass; a pass that fills it is followed at once by another.
CLAIM_BATCH: Final = 32
# After a pass failed (the store refused), the next try.
ERROR_RETRY_S: Final = 5.0
# close() lets deliveries in flight finish this long before cancelling them (a cancelled one
# stays claimed, and the next start marks it interrupted).
CLOSE_GRACE_S: Final = 5.0
# The dispatch detail when deliver() answers False.
NOT_DELIVERED: Final = "the session did not take the prompt"

Deliver = Callable[[ScheduleRow, DispatchRow], Awaitable[bool]]
Defer = Callable[[str], bool]
OnDispatch = Callable[[ScheduleRow, DispatchRow], Awaitable[None] | None]


@dataclass(frozen=True)
class _Outcome:
    """What became of one claimed tick, until it is recorded."""

    row: ScheduleRow
    dispatch: DispatchRow
    status: DispatchStatus
    detail: str | None
    at: dt.datetime


@dataclass(frozen=True)
class SchedulerStatistics:
    """Counters of one scheduler (``Scheduler.statistics()``), for tests and doctor."""

    passes: int  # looks at the due schedules
    claimed: int  # ticks claimed
    delivered: int  # claimed ticks delivered
    failed: int  # claimed ticks whose delivery failed (never retried)
    deferred: int  # due ticks left unclaimed (for now) because their session was busy
    recovered: int  # open claims marked interrupted at start
    in_flight: int  # deliveries running now
    next_wake_at: dt.datetime | None  # when the loop looks again (None: only when poked)
    wait_s: float | None  # the timeout of the loop's current (or last) wait


class Scheduler:
    """Due heartbeats and schedules of one store (module docstring).

    ``deliver(schedule, dispatch)`` puts ``schedule.prompt`` into ``schedule.session_id`` the
    way ``schedule.delivery`` says (waking the session if needed) and answers True once it was
    taken. ``defer(session_id)`` is true while that session compacts or runs a cell.
    ``on_dispatch(schedule, dispatch)`` (optional) hears of every settled dispatch (delivered or
    failed), e.g. to record a ``schedule_tick`` event. ``clock`` gives aware UTC wall time;
    ``tz`` is the zone whose wall clock cron expressions are read on.
    """

    def __init__(
        self,
        store: Store,
        *,
        deliver: Deliver,
        defer: Defer,
        on_dispatch: OnDispatch | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        tz: dt.tzinfo = dt.UTC,
    ) -> None:
        self._store = store
        self._deliver = deliver
        self._defer = defer
        self._on_dispatch = on_dispatch
        self._clock = clock
        self._tz = tz
        self._wake = asyncio.Event()
        self._settled = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._in_pass = False
        self._closed = False
        # schedule id -> (its deferred tick, when it is looked at again)
        self._deferred: dict[str, tuple[dt.datetime | None, dt.datetime]] = {}
        self._pinned: frozenset[str] = frozenset()
        # dispatch id -> a delivery outcome the store has not taken yet
        self._unsettled: dict[str, _Outcome] = {}
        self._passes = 0
        self._claimed = 0
        self._delivered = 0
        self._failed = 0
        self._deferrals = 0
        self._recovered = 0
        self._next_wake_at: dt.datetime | None = None
        self._wait_s: float | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> list[DispatchRow]:
        """Mark the claims a previous daemon left open ``interrupted`` (returned, oldest first,
        for the daemon to record), then start the loop. Call once, before any delivery."""
        if self._task is not None or self._closed:
            raise RuntimeError("the scheduler was already started")
        recovered = await self._store.transaction(schedule_store.recover_interrupted)
        self._recovered = len(recovered)
        self._wake.set()  # the first pass is due now (wait_quiet waits for it)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="scheduler")
        return recovered

    def poke(self) -> None:
        """A schedule was added or changed: look at the schedules again now."""
        self._wake.set()

    async def close(self) -> None:
        """Stop the loop; deliveries in flight get ``CLOSE_GRACE_S`` to finish. Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        if self._deliveries:
            await asyncio.wait(set(self._deliveries), timeout=CLOSE_GRACE_S)
        for delivery in set(self._deliveries):
            delivery.cancel()
        if self._deliveries:
            await asyncio.wait(set(self._deliveries))
        async with self._settled:
            self._settled.notify_all()

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            passes=self._passes,
            claimed=self._claimed,
            delivered=self._delivered,
            failed=self._failed,
            deferred=self._deferrals,
            recovered=self._recovered,
            in_flight=len(self._deliveries),
            next_wake_at=self._next_wake_at,
            wait_s=self._wait_s,
        )

    def keeps_loaded(self, session_id: str) -> bool:
        """Whether the session has an active heartbeat, as of the last pass (which follows
        every poke): idle unload asks this and leaves such a session loaded."""
        return session_id in self._pinned

    @property
    def pinned_sessions(self) -> frozenset[str]:
        """Sessions with an active heartbeat, as of the last pass."""
        return self._pinned

    async def wait_quiet(self) -> None:
        """Return once no pass is due or running and no delivery is in flight (tests; a
        daemon's orderly shutdown). Returns at once when the loop is not running."""
        while self._task is not None and not self._task.done():
            if self._deliveries:
                await asyncio.wait(set(self._deliveries))
                continue
            if not (self._in_pass or self._wake.is_set()):
                return
            async with self._settled:
                await self._settled.wait()

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._in_pass = True
            try:
                wake_at = await self._pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # one failed pass must not end scheduling for good
                log.exception("scheduler pass failed")
                wake_at = self._clock() + dt.timedelta(seconds=ERROR_RETRY_S)
            finally:
                self._in_pass = False
                self._passes += 1
            self._next_wake_at = wake_at
            timeout = self._timeout(wake_at)
            self._wait_s = timeout
            async with self._settled:
                self._settled.notify_all()
            if timeout == 0.0:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def _timeout(self, wake_at: dt.datetime | None) -> float:
        if wake_at is None:
            return MAX_WAIT_S
        seconds = (wake_at - self._clock()).total_seconds()
        return min(MAX_WAIT_S, max(0.0, seconds))

    async def _pass(self) -> dt.datetime | None:
        """Claim and start delivering what is due; returns when to look again."""
        for outcome in list(self._unsettled.values()):
            await self._settle(outcome)
        now = self._clock()
        # Every pass asks again (a poke after a cell ends delivers at once); a tick counts as
        # deferred once, however often it is asked about.
        before, self._deferred = self._deferred, {}
        while True:
            skip = list(self._deferred)
            due = await self._store.read(
                functools.partial(
                    schedule_store.select_due, now=now, limit=CLAIM_BATCH, exclude=skip
                )
            )
            for row in due:
                if self._deferred_now(row.session_id):
                    retry = now + dt.timedelta(seconds=DEFER_RETRY_S)
                    self._deferred[row.id] = (row.next_run_at, retry)
                    if before.get(row.id, (None, None))[0] != row.next_run_at:
                        self._deferrals += 1
                    continue
                claim = await self._claim(row.id, now)
                if claim is not None:
                    self._start_delivery(*claim)
            # Each row of the batch was claimed, deferred (excluded from here on) or changed
            # meanwhile (no longer due), so the next batch holds other rows: this ends.
            if len(due) < CLAIM_BATCH:
                break
        exclude = list(self._deferred)
        pinned, next_due = await self._store.read(
            lambda con: (
                schedule_store.active_heartbeat_sessions(con),
                schedule_store.next_due_at(con, exclude=exclude),
            )
        )
        self._pinned = frozenset(pinned)
        retries = [retry for _, retry in self._deferred.values()]
        candidates = [t for t in (next_due, *retries) if t is not None]
        return min(candidates) if candidates else None

    def _deferred_now(self, session_id: str) -> bool:
        try:
            return bool(self._defer(session_id))
        except Exception:  # unsure whether it is busy: wait rather than interrupt it
            log.exception("defer(%s) failed; the tick waits", session_id)
            return True

    async def _claim(
        self, schedule_id: str, now: dt.datetime
    ) -> tuple[ScheduleRow, DispatchRow] | None:
        tz = self._tz

        def claim(con: duckdb.DuckDBPyConnection) -> tuple[ScheduleRow, DispatchRow] | None:
            dispatch = schedule_store.claim_due(con, schedule_id, now, tz=tz)
            if dispatch is None:
                return None
            # The row as claimed (after the claim: prompt and delivery as they are now).
            row = schedule_store.select_schedule(con, schedule_id)
            return None if row is None else (row, dispatch)

        claim_result = await self._store.transaction(claim)
        if claim_result is not None:
            self._claimed += 1
        return claim_result

    def _start_delivery(self, row: ScheduleRow, dispatch: DispatchRow) -> None:
        task = asyncio.get_running_loop().create_task(
            self._delivery(row, dispatch), name=f"schedule-delivery-{dispatch.id}"
        )
        self._deliveries.add(task)
        task.add_done_callback(self._delivery_done)

    def _delivery_done(self, task: asyncio.Task[None]) -> None:
        self._deliveries.discard(task)
        # The schedule is no longer in flight: its next tick may be due already.
        if not self._closed:
            self.poke()

    async def _delivery(self, row: ScheduleRow, dispatch: DispatchRow) -> None:
        status: DispatchStatus
        detail: str | None = None
        try:
            delivered = await self._deliver(row, dispatch)
        except asyncio.CancelledError:
            raise  # left claimed: the next start marks it interrupted
        except Exception as exc:
            log.warning("schedule %s: delivery of %s failed: %s", row.id, dispatch.id, exc)
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        else:
            status = "delivered" if delivered else "failed"
            detail = None if delivered else NOT_DELIVERED
        if status == "delivered":
            self._delivered += 1
        else:
            self._failed += 1
        await self._settle(_Outcome(row, dispatch, status, detail, self._clock()))

    async def _settle(self, outcome: _Outcome) -> None:
        """Record a delivery's outcome; if the store refuses, the next pass tries again (an
        open claim would keep its schedule from firing until the next daemon start)."""
        try:
            settled = await self._store.transaction(
                lambda con: schedule_store.mark_dispatch(
                    con, outcome.dispatch.id, outcome.status, outcome.detail, now=outcome.at
                )
            )
        except Exception:
            log.exception(
                "schedule %s: could not record dispatch %s; retrying at the next pass",
                outcome.row.id,
                outcome.dispatch.id,
            )
            self._unsettled[outcome.dispatch.id] = outcome
            return
        self._unsettled.pop(outcome.dispatch.id, None)
        if settled is None or self._on_dispatch is None:
            return
        try:
            result = self._on_dispatch(outcome.row, settled)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_dispatch failed for %s", outcome.dispatch.id)
