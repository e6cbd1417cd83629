"""``orchestrator/control/scheduler.py`` on a real store: a due tick is claimed before it is
delivered and delivered once; a busy session's tick is not claimed until it may be; a poke wakes
the loop; close stops it, and a delivery cut short is found interrupted by the next start.

Time is a fake wall clock the tests move; after each move they ``poke()`` and wait for the
scheduler to settle (``wait_quiet``), so nothing waits on real time except the two tests that
check the loop wakes by itself, and those wait on an event with a bound, not a sleep."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.control import scheduler as scheduler_module
from orchestrator.control.scheduler import DEFER_RETRY_S, MAX_WAIT_S, NOT_DELIVERED, Scheduler
from orchestrator.store import schedules as ss
from orchestrator.store.db import Store
from orchestrator.store.queries import utcnow

T0 = dt.datetime(2026, 5, 9, 12, 0, tzinfo=dt.UTC)
EVENT_BOUND_S = 10.0  # a bound on waiting for an event that should come at once


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class FakeClock:
    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def set(self, seconds: float) -> None:
        self.now = at(seconds)


class Deliveries:
    """The ``deliver`` callback: records each call; can hold it (``gate``), fail it or refuse."""

    def __init__(self) -> None:
        self.calls: list[tuple[ss.ScheduleRow, ss.DispatchRow]] = []
        self.arrived = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.result = True
        self.error: Exception | None = None

    async def __call__(self, row: ss.ScheduleRow, dispatch: ss.DispatchRow) -> bool:
        # The tick was claimed (committed) before anyone tried to deliver it.
        self.calls.append((row, dispatch))
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def ticks(self) -> list[dt.datetime]:
        return [dispatch.scheduled_for for _, dispatch in self.calls]


class Busy:
    """The ``defer`` callback: sessions that compact or run a cell now."""

    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.asked: list[str] = []

    def __call__(self, session_id: str) -> bool:
        self.asked.append(session_id)
        return session_id in self.sessions


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(tmp_path / "store.duckdb")
    try:
        yield opened
    finally:
        await opened.close()


async def add(store: Store, spec: str = "every 30s", **kw: Any) -> ss.ScheduleRow:
    options: dict[str, Any] = {
        "session_id": "s-a",
        "source": "heartbeat",
        "prompt": "check the build",
        "now": T0,
    }
    options.update(kw)
    return await store.transaction(lambda con: ss.insert_schedule(con, spec=spec, **options))


async def dispatches(store: Store, schedule_id: str) -> list[ss.DispatchRow]:
    return await store.read(lambda con: ss.select_dispatches(con, schedule_id=schedule_id))


class Harness:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = FakeClock()
        self.deliver = Deliveries()
        self.busy = Busy()
        self.settled: list[ss.DispatchRow] = []
        self.scheduler = Scheduler(
            store,
            deliver=self.deliver,
            defer=self.busy,
            on_dispatch=self._on_dispatch,
            clock=self.clock,
        )

    async def _on_dispatch(self, row: ss.ScheduleRow, dispatch: ss.DispatchRow) -> None:
        self.settled.append(dispatch)

    async def step(self, seconds: float) -> None:
        """Move the clock to T0 + seconds, wake the scheduler and let it finish."""
        self.clock.set(seconds)
        self.scheduler.poke()
        await self.scheduler.wait_quiet()


@pytest_asyncio.fixture
async def harness(store: Store) -> AsyncIterator[Harness]:
    h = Harness(store)
    try:
        yield h
    finally:
        await h.scheduler.close()


# --- delivery -----------------------------------------------------------------------------------


async def test_due_ticks_are_delivered_once(harness: Harness) -> None:
    row = await add(harness.store, "every 30s")
    assert await harness.scheduler.start() == []
    await harness.scheduler.wait_quiet()
    stats = harness.scheduler.statistics()
    assert harness.deliver.calls == [] and stats.next_wake_at == at(30)
    assert stats.wait_s is not None and 0 < stats.wait_s <= MAX_WAIT_S  # a wait, not a poll

    await harness.step(31)
    assert harness.deliver.ticks == [at(30)]
    delivered_row, dispatch = harness.deliver.calls[0]
    assert (delivered_row.id, delivered_row.prompt, dispatch.claimed_at) == (
        row.id,
        "check the build",
        at(31),
    )
    # Poked again at the same time, and again: nothing new is due.
    await harness.step(31)
    await harness.step(59)
    assert harness.deliver.ticks == [at(30)]
    await harness.step(61)
    assert harness.deliver.ticks == [at(30), at(60)]
    stored = await dispatches(harness.store, row.id)
    assert [(d.status, d.delivered_at) for d in stored] == [
        ("delivered", at(31)),
        ("delivered", at(61)),
    ]
    assert [d.id for d in harness.settled] == [d.id for d in stored]
    stats = harness.scheduler.statistics()
    assert (stats.claimed, stats.delivered, stats.failed, stats.in_flight) == (2, 2, 0, 0)
    assert stats.next_wake_at == at(90)


async def test_a_one_shot_is_delivered_once_and_completes(harness: Harness) -> None:
    row = await add(harness.store, "in 1m", delivery="follow_up")
    await harness.scheduler.start()
    await harness.step(3600)
    await harness.step(7200)
    assert harness.deliver.ticks == [at(60)]
    assert harness.deliver.calls[0][0].delivery == "follow_up"
    after = await harness.store.read(lambda con: ss.select_schedule(con, row.id))
    assert after is not None and after.status == "completed"
    assert harness.scheduler.statistics().next_wake_at is None


async def test_every_due_schedule_is_claimed_in_one_pass_across_sessions(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "CLAIM_BATCH", 2)  # several batches in one pass
    rows = [await add(harness.store, "every 30s", session_id=f"s-{i}") for i in range(5)]
    await harness.scheduler.start()
    await harness.step(30)
    assert sorted(r.session_id for r, _ in harness.deliver.calls) == sorted(
        r.session_id for r in rows
    )


async def test_busy_sessions_at_the_head_of_the_queue_do_not_hold_up_the_others(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "CLAIM_BATCH", 2)
    for i in range(3):  # the most overdue ones, all busy
        await add(harness.store, "every 10s", session_id=f"s-busy-{i}")
        harness.busy.sessions.add(f"s-busy-{i}")
    free = await add(harness.store, "every 30s", session_id="s-free")
    await harness.scheduler.start()
    await harness.step(31)
    assert [r.id for r, _ in harness.deliver.calls] == [free.id]
    stats = harness.scheduler.statistics()
    assert stats.deferred == 3 and stats.wait_s == DEFER_RETRY_S


async def test_a_tick_still_being_delivered_folds_the_ticks_due_meanwhile(
    harness: Harness,
) -> None:
    row = await add(harness.store, "every 30s")
    harness.deliver.gate = asyncio.Event()
    await harness.scheduler.start()
    harness.clock.set(31)
    harness.scheduler.poke()
    async with asyncio.timeout(EVENT_BOUND_S):
        await harness.deliver.arrived.wait()
    # Ticks 60 and 90 fall due while the first delivery hangs; nothing else is claimed.
    harness.clock.set(95)
    harness.scheduler.poke()
    harness.deliver.gate.set()
    await harness.scheduler.wait_quiet()
    assert harness.deliver.ticks == [at(30), at(60)]
    after = await harness.store.read(lambda con: ss.select_schedule(con, row.id))
    assert after is not None and (after.next_run_at, after.run_count) == (at(120), 2)


# --- deferral -----------------------------------------------------------------------------------


async def test_a_busy_session_is_not_claimed_until_it_may_be(harness: Harness) -> None:
    row = await add(harness.store, "every 30s")
    other = await add(harness.store, "every 30s", session_id="s-free")
    harness.busy.sessions.add("s-a")
    await harness.scheduler.start()
    await harness.step(31)
    # Only the free session got its tick; the busy one's is not even claimed.
    assert [r.session_id for r, _ in harness.deliver.calls] == ["s-free"]
    assert await dispatches(harness.store, row.id) == []
    stats = harness.scheduler.statistics()
    assert stats.deferred == 1
    assert stats.next_wake_at == at(31) + dt.timedelta(seconds=DEFER_RETRY_S)
    # Still busy a little later: still not claimed.
    await harness.step(33)
    assert await dispatches(harness.store, row.id) == []
    # Free again: the tick due at 30 (and the one at 60, missed meanwhile) arrive as one.
    harness.busy.sessions.clear()
    await harness.step(65)
    mine = [d for r, d in harness.deliver.calls if r.id == row.id]
    assert [d.scheduled_for for d in mine] == [at(30)]
    after = await harness.store.read(lambda con: ss.select_schedule(con, row.id))
    assert after is not None and after.next_run_at == at(90)
    assert other.id in {r.id for r, _ in harness.deliver.calls}


async def test_a_failing_defer_check_defers(harness: Harness) -> None:
    row = await add(harness.store, "every 30s")

    def broken(_session_id: str) -> bool:
        raise RuntimeError("no idea")

    h = Scheduler(harness.store, deliver=harness.deliver, defer=broken, clock=harness.clock)
    try:
        await h.start()
        harness.clock.set(31)
        h.poke()
        await h.wait_quiet()
        assert harness.deliver.calls == [] and await dispatches(harness.store, row.id) == []
    finally:
        await h.close()


# --- failures -----------------------------------------------------------------------------------


async def test_a_failed_delivery_is_recorded_and_never_retried(harness: Harness) -> None:
    row = await add(harness.store, "every 30s")
    harness.deliver.error = RuntimeError("sandbox would not start")
    await harness.scheduler.start()
    await harness.step(31)
    harness.deliver.error = None
    harness.deliver.result = False
    await harness.step(45)  # nothing due: the failed tick is not handed out again
    assert harness.deliver.ticks == [at(30)]
    await harness.step(61)
    harness.deliver.result = True
    await harness.step(91)
    assert harness.deliver.ticks == [at(30), at(60), at(90)]
    stored = await dispatches(harness.store, row.id)
    assert [(d.status, d.detail) for d in stored] == [
        ("failed", "RuntimeError: sandbox would not start"),
        ("failed", NOT_DELIVERED),
        ("delivered", None),
    ]
    after = await harness.store.read(lambda con: ss.select_schedule(con, row.id))
    assert after is not None and after.last_error == NOT_DELIVERED
    stats = harness.scheduler.statistics()
    assert (stats.delivered, stats.failed) == (1, 2)


async def test_an_outcome_the_store_refused_is_recorded_at_the_next_pass(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = await add(harness.store, "every 30s")
    real = ss.mark_dispatch
    refusals = [RuntimeError("disk full")]

    def flaky(*args: Any, **kwargs: Any) -> ss.DispatchRow | None:
        if refusals:
            raise refusals.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(ss, "mark_dispatch", flaky)
    await harness.scheduler.start()
    await harness.step(31)
    stored = await dispatches(harness.store, row.id)
    assert [(d.status, d.delivered_at) for d in stored] == [("delivered", at(31))]
    assert [d.id for d in harness.settled] == [stored[0].id]
    await harness.step(61)  # the schedule is not stuck behind the open claim
    assert harness.deliver.ticks == [at(30), at(60)]


async def test_start_marks_open_claims_interrupted_and_does_not_replay_them(
    harness: Harness,
) -> None:
    row = await add(harness.store, "every 30s")
    left = await harness.store.transaction(lambda con: ss.claim_due(con, row.id, at(31)))
    assert left is not None
    harness.clock.set(40)
    recovered = await harness.scheduler.start()
    assert [(d.id, d.status) for d in recovered] == [(left.id, "interrupted")]
    await harness.scheduler.wait_quiet()
    assert harness.deliver.calls == []
    assert harness.scheduler.statistics().recovered == 1
    await harness.step(61)
    assert harness.deliver.ticks == [at(60)]
    with pytest.raises(RuntimeError):
        await harness.scheduler.start()


# --- waking and stopping ------------------------------------------------------------------------


async def test_a_poke_wakes_a_scheduler_that_waits_for_nothing(store: Store) -> None:
    deliver = Deliveries()
    scheduler = Scheduler(store, deliver=deliver, defer=lambda _sid: False)
    try:
        await scheduler.start()
        await scheduler.wait_quiet()
        assert scheduler.statistics().next_wake_at is None  # nothing scheduled: the capped wait
        assert scheduler.statistics().wait_s == MAX_WAIT_S
        # Anchored 11 s ago on a 10 s grid: due now. Without the poke it would wait 60 s.
        await add(store, "every 10s", now=utcnow() - dt.timedelta(seconds=11))
        scheduler.poke()
        async with asyncio.timeout(EVENT_BOUND_S):
            await deliver.arrived.wait()
        assert len(deliver.calls) == 1
    finally:
        await scheduler.close()


async def test_the_loop_wakes_by_itself_when_the_next_tick_falls_due(store: Store) -> None:
    deliver = Deliveries()
    scheduler = Scheduler(store, deliver=deliver, defer=lambda _sid: False)
    try:
        # The first tick is 50 ms away; nobody pokes.
        await add(store, "every 10s", now=utcnow() - dt.timedelta(seconds=9.95))
        await scheduler.start()
        async with asyncio.timeout(EVENT_BOUND_S):
            await deliver.arrived.wait()
        assert len(deliver.calls) == 1
        dispatch = deliver.calls[0][1]
        assert dispatch.claimed_at >= dispatch.scheduled_for  # claimed when due, not before
    finally:
        await scheduler.close()


async def test_close_stops_the_loop(harness: Harness) -> None:
    await add(harness.store, "every 30s")
    await harness.scheduler.start()
    await harness.scheduler.wait_quiet()
    await harness.scheduler.close()
    await harness.scheduler.close()  # idempotent
    harness.clock.set(31)
    harness.scheduler.poke()
    await harness.scheduler.wait_quiet()  # returns at once: nothing runs
    assert harness.deliver.calls == []
    with pytest.raises(RuntimeError):
        await harness.scheduler.start()


async def test_close_cuts_a_hanging_delivery_and_the_next_start_finds_it_interrupted(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler_module, "CLOSE_GRACE_S", 0.01)
    row = await add(harness.store, "every 30s")
    harness.deliver.gate = asyncio.Event()  # never set: the session never takes it
    await harness.scheduler.start()
    harness.clock.set(31)
    harness.scheduler.poke()
    async with asyncio.timeout(EVENT_BOUND_S):
        await harness.deliver.arrived.wait()
    await harness.scheduler.close()
    assert harness.scheduler.statistics().in_flight == 0
    stored = await dispatches(harness.store, row.id)
    assert [d.status for d in stored] == ["claimed"]

    again = Scheduler(
        harness.store, deliver=Deliveries(), defer=lambda _sid: False, clock=harness.clock
    )
    try:
        recovered = await again.start()
        assert [(d.id, d.status) for d in recovered] == [(stored[0].id, "interrupted")]
    finally:
        await again.close()


# --- idle unload ----------------------------------------------------------------------------------


async def test_an_active_heartbeat_keeps_its_session_loaded(harness: Harness) -> None:
    hb = await add(harness.store, "every 30s", session_id="s-hb", source="rlm_heartbeat")
    await add(harness.store, "every 30s", session_id="s-user", source="user")
    await harness.scheduler.start()
    await harness.scheduler.wait_quiet()
    assert harness.scheduler.keeps_loaded("s-hb")
    assert not harness.scheduler.keeps_loaded("s-user")
    assert harness.scheduler.pinned_sessions == frozenset({"s-hb"})
    await harness.store.transaction(lambda con: ss.update_schedule(con, hb.id, status="paused"))
    harness.scheduler.poke()
    await harness.scheduler.wait_quiet()
    assert not harness.scheduler.keeps_loaded("s-hb")
