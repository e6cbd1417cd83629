"""``orchestrator/store/schedules.py`` on a real DuckDB file: a due tick is claimed once (in one
transaction, before delivery), missed ticks fold into one, one-shots complete, and a claim a
crash left open is marked interrupted at the next start and never handed out again."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import pytest_asyncio

from orchestrator.errors import ScheduleSpecError
from orchestrator.store import schedules as ss
from orchestrator.store.db import Store

T0 = dt.datetime(2026, 5, 9, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


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
        "source": "user",
        "prompt": "check the build",
        "now": T0,
    }
    options.update(kw)
    return await store.transaction(lambda con: ss.insert_schedule(con, spec=spec, **options))


async def claim(store: Store, schedule_id: str, now: dt.datetime) -> ss.DispatchRow | None:
    return await store.transaction(lambda con: ss.claim_due(con, schedule_id, now))


async def get(store: Store, schedule_id: str) -> ss.ScheduleRow:
    row = await store.read(lambda con: ss.select_schedule(con, schedule_id))
    assert row is not None
    return row


# --- insert -------------------------------------------------------------------------------------


async def test_insert_computes_the_first_tick_and_keeps_the_canonical_text(store: Store) -> None:
    every = await add(store, "every 30s")
    assert (every.status, every.next_run_at, every.run_count) == ("active", at(30), 0)
    assert every.id.startswith(ss.SCHEDULE_ID_PREFIX) and every.created_at == T0
    once = await add(store, "in 10m")
    # A one-shot is kept as its instant, so the text means the same under any anchor.
    assert once.spec == f"at {at(600).isoformat()}" and once.next_run_at == at(600)
    cron = await add(store, "*/15 * * * *")
    assert cron.spec == "*/15 * * * *" and cron.next_run_at == at(15 * 60)
    assert await get(store, every.id) == every
    assert ss.row_spec(await get(store, once.id)).text == once.spec


async def test_insert_refuses_bad_specs_and_values(store: Store) -> None:
    with pytest.raises(ScheduleSpecError, match="shortest interval"):
        await add(store, "every 5s")
    with pytest.raises(ValueError, match="delivery"):
        await add(store, delivery="later")
    with pytest.raises(ValueError, match="source"):
        await add(store, source="cron")
    assert await store.read(lambda con: ss.select_schedules(con, include_inactive=True)) == []


# --- claim --------------------------------------------------------------------------------------


async def test_a_claim_advances_next_run_at_and_is_never_handed_out_twice(store: Store) -> None:
    row = await add(store, "every 30s")
    assert await claim(store, row.id, at(29)) is None  # not due yet
    first = await claim(store, row.id, at(31))
    assert first is not None
    assert (first.status, first.scheduled_for, first.claimed_at) == ("claimed", at(30), at(31))
    after = await get(store, row.id)
    assert (after.next_run_at, after.run_count, after.last_run_at) == (at(60), 1, at(31))
    # The same tick again: not due any more.
    assert await claim(store, row.id, at(31)) is None
    # The next tick is due but the last one is still being delivered: it waits.
    assert await claim(store, row.id, at(61)) is None
    assert await store.read(lambda con: ss.select_due(con, at(61), 10)) == []
    await store.transaction(lambda con: ss.mark_dispatch(con, first.id, "delivered", now=at(62)))
    second = await claim(store, row.id, at(62))
    assert second is not None and second.scheduled_for == at(60)
    dispatches = await store.read(lambda con: ss.select_dispatches(con, schedule_id=row.id))
    assert [(d.status, d.delivered_at) for d in dispatches] == [
        ("delivered", at(62)),
        ("claimed", None),
    ]


async def test_missed_ticks_fold_into_the_one_late_claim(store: Store) -> None:
    row = await add(store, "every 30s")
    # The daemon was down for ten minutes: twenty ticks missed, one delivery.
    late = await claim(store, row.id, at(600 + 7))
    assert late is not None and late.scheduled_for == at(30)
    after = await get(store, row.id)
    assert (after.next_run_at, after.run_count) == (at(630), 1)  # back on the grid


async def test_a_one_shot_completes_when_claimed(store: Store) -> None:
    row = await add(store, "in 10m")
    dispatch = await claim(store, row.id, at(700))
    assert dispatch is not None and dispatch.scheduled_for == at(600)
    after = await get(store, row.id)
    assert (after.status, after.next_run_at, after.run_count) == ("completed", None, 1)
    assert await claim(store, row.id, at(800)) is None
    live = await store.read(lambda con: ss.select_schedules(con))
    assert live == []
    every = await store.read(lambda con: ss.select_schedules(con, include_inactive=True))
    assert [r.id for r in every] == [row.id]


async def test_paused_and_cancelled_schedules_are_not_claimed(store: Store) -> None:
    row = await add(store, "every 30s")
    await store.transaction(lambda con: ss.update_schedule(con, row.id, status="paused", now=at(1)))
    assert await store.read(lambda con: ss.select_due(con, at(100), 10)) == []
    assert await claim(store, row.id, at(100)) is None
    # Resumed at 100: the next regular tick after now, no burst for what it missed.
    resumed = await store.transaction(
        lambda con: ss.update_schedule(con, row.id, status="active", now=at(100))
    )
    assert (resumed.status, resumed.next_run_at) == ("active", at(120))
    cancelled = await store.transaction(
        lambda con: ss.update_schedule(con, row.id, status="cancelled", now=at(101))
    )
    assert (cancelled.status, cancelled.next_run_at) == ("cancelled", None)
    assert await claim(store, row.id, at(200)) is None
    with pytest.raises(ss.ScheduleError, match="cancelled"):
        await store.transaction(lambda con: ss.update_schedule(con, row.id, prompt="x"))


async def test_a_paused_one_shot_whose_time_passed_falls_due_on_resume(store: Store) -> None:
    row = await add(store, "in 1m")
    await store.transaction(lambda con: ss.update_schedule(con, row.id, status="paused", now=at(1)))
    resumed = await store.transaction(
        lambda con: ss.update_schedule(con, row.id, status="active", now=at(300))
    )
    assert resumed.next_run_at == at(60)
    due = await store.read(lambda con: ss.select_due(con, at(300), 10))
    assert [r.id for r in due] == [row.id]


async def test_update_changes_fields_and_re_anchors_a_new_spec(store: Store) -> None:
    row = await add(store, "every 30s", label="build")
    changed = await store.transaction(
        lambda con: ss.update_schedule(
            con, row.id, spec="every 1m", prompt="run tests", delivery="follow_up", now=at(45)
        )
    )
    assert (changed.spec, changed.created_at, changed.next_run_at) == ("every 1m", at(45), at(105))
    assert (changed.prompt, changed.delivery, changed.label) == ("run tests", "follow_up", "build")
    cleared = await store.transaction(lambda con: ss.update_schedule(con, row.id, label=None))
    assert cleared.label is None and cleared.prompt == "run tests"
    assert await get(store, row.id) == cleared
    with pytest.raises(ss.ScheduleNotFound):
        await store.transaction(lambda con: ss.update_schedule(con, "sch-none", prompt="x"))


async def test_select_due_orders_by_overdue_and_respects_the_limit(store: Store) -> None:
    a = await add(store, "every 1m")
    b = await add(store, "every 30s")
    c = await add(store, "in 1h")
    due = await store.read(lambda con: ss.select_due(con, at(90), 10))
    assert [r.id for r in due] == [b.id, a.id]
    assert [r.id for r in await store.read(lambda con: ss.select_due(con, at(90), 1))] == [b.id]
    assert await store.read(lambda con: ss.next_due_at(con)) == at(30)
    assert await store.read(lambda con: ss.next_due_at(con, exclude=[a.id, b.id])) == at(3600)
    assert c.next_run_at == at(3600)


async def test_select_schedules_filters(store: Store) -> None:
    mine = await add(store, source="rlm_heartbeat", label="x")
    await add(store, session_id="s-b")
    hb = await add(store, source="heartbeat")
    await store.transaction(lambda con: ss.update_schedule(con, hb.id, status="cancelled"))
    rows = await store.read(lambda con: ss.select_schedules(con, session_id="s-a"))
    assert [r.id for r in rows] == [mine.id]
    rows = await store.read(
        lambda con: ss.select_schedules(
            con, session_id="s-a", include_inactive=True, sources=["heartbeat"]
        )
    )
    assert [r.id for r in rows] == [hb.id]
    prefix = mine.id[:-3]
    rows = await store.read(lambda con: ss.select_schedules(con, id_prefix=prefix))
    assert mine.id in [r.id for r in rows]
    assert await store.read(lambda con: ss.count_live(con, "s-a", ["rlm_heartbeat"])) == 1


async def test_active_heartbeats_keep_their_sessions(store: Store) -> None:
    await add(store, session_id="s-user", source="user")
    await add(store, session_id="s-hb", source="heartbeat")
    await add(store, session_id="s-rlm", source="rlm_heartbeat")
    paused = await add(store, session_id="s-paused", source="rlm_heartbeat")
    await store.transaction(lambda con: ss.update_schedule(con, paused.id, status="paused"))
    assert await store.read(ss.active_heartbeat_sessions) == {"s-hb", "s-rlm"}


# --- dispatches and recovery --------------------------------------------------------------------


async def test_mark_dispatch_settles_a_claim_once(store: Store) -> None:
    row = await add(store)
    dispatch = await claim(store, row.id, at(30))
    assert dispatch is not None
    failed = await store.transaction(
        lambda con: ss.mark_dispatch(con, dispatch.id, "failed", "boom\nline two", now=at(31))
    )
    assert failed is not None and (failed.status, failed.detail) == ("failed", "boom line two")
    assert (await get(store, row.id)).last_error == "boom line two"
    again = await store.transaction(lambda con: ss.mark_dispatch(con, dispatch.id, "delivered"))
    assert again is None  # settled: a failed delivery is never turned into anything else
    with pytest.raises(ValueError):
        await store.transaction(lambda con: ss.mark_dispatch(con, dispatch.id, "claimed"))


async def test_recover_marks_every_open_claim_interrupted(store: Store) -> None:
    a = await add(store)
    b = await add(store, "in 1m")
    da = await claim(store, a.id, at(30))
    db = await claim(store, b.id, at(60))
    assert da is not None and db is not None
    await store.transaction(lambda con: ss.mark_dispatch(con, da.id, "delivered"))
    recovered = await store.transaction(ss.recover_interrupted)
    assert [(d.id, d.status) for d in recovered] == [(db.id, "interrupted")]
    assert await store.transaction(ss.recover_interrupted) == []


async def test_kill_during_a_due_tick_is_interrupted_not_replayed(tmp_path: Path) -> None:
    """The claim commits, then the process dies (kill -9) before the dispatch is marked: the
    next daemon opens the same file, marks the claim interrupted and does not hand it out."""
    path = tmp_path / "store.duckdb"
    first = await Store.open(path)
    row = await add(first, "every 30s", source="heartbeat")
    dispatch = await claim(first, row.id, at(31))
    assert dispatch is not None
    # What kill -9 leaves: the committed claim and nothing after it (close only releases the
    # file; every write it could flush is already committed).
    await first.close()

    second = await Store.open(path)
    try:
        recovered = await second.transaction(ss.recover_interrupted)
        assert [(d.id, d.status, d.scheduled_for) for d in recovered] == [
            (dispatch.id, "interrupted", at(30))
        ]
        assert recovered[0].detail == ss.INTERRUPTED_DETAIL
        # The interrupted tick (due at 30) is not due again; the next one (60) is.
        assert await second.read(lambda con: ss.select_due(con, at(59), 10)) == []
        assert await claim(second, row.id, at(59)) is None
        following = await claim(second, row.id, at(61))
        assert following is not None and following.scheduled_for == at(60)
        stored = await second.read(lambda con: ss.select_dispatches(con, schedule_id=row.id))
        assert [d.status for d in stored] == ["interrupted", "claimed"]
    finally:
        await second.close()


async def test_a_spec_that_no_longer_parses_is_cancelled_not_retried(store: Store) -> None:
    row = await add(store)

    def corrupt(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("UPDATE schedules SET spec = 'every 1x' WHERE id = $1", [row.id])

    await store.transaction(corrupt)
    assert await claim(store, row.id, at(30)) is None
    after = await get(store, row.id)
    assert after.status == "cancelled" and after.last_error and "1x" in after.last_error


_KILLED_DAEMON = """
import asyncio, datetime as dt, os, signal, sys
from pathlib import Path
from orchestrator.store import schedules as ss
from orchestrator.store.db import Store

async def main() -> None:
    t0 = dt.datetime(2026, 5, 9, 12, 0, tzinfo=dt.UTC)
    store = await Store.open(Path(sys.argv[1]))
    row = await store.transaction(lambda con: ss.insert_schedule(
        con, session_id="s-a", source="heartbeat", spec="every 30s", prompt="p", now=t0))
    claimed = await store.transaction(
        lambda con: ss.claim_due(con, row.id, t0 + dt.timedelta(seconds=31)))
    print(row.id, claimed.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-delivery: the claim is all that was written

asyncio.run(main())
"""


async def test_a_real_kill_9_after_the_claim_leaves_it_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_DAEMON, str(path), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    schedule_id, dispatch_id = out.decode().split()
    store = await Store.open(path)
    try:
        recovered = await store.transaction(ss.recover_interrupted)
        assert [(d.id, d.status) for d in recovered] == [(dispatch_id, "interrupted")]
        assert await store.read(lambda con: ss.select_due(con, at(59), 10)) == []
        assert (await get(store, schedule_id)).next_run_at == at(60)
    finally:
        await store.close()
