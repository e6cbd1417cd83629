"""The DuckDB store: migrations, committed appends, group commit, tree, usage, locking, faults."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from orchestrator.errors import StoreError, StoreLocked, UserError
from orchestrator.ids import new_session_id
from orchestrator.sessions.live import child_id_for
from orchestrator.store import db as store_db
from orchestrator.store.db import CURRENT_LEAF, EventRecord, SessionRecord, Store
from orchestrator.store.events import (
    NoticePayload,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.migrate import latest_schema_version, load_migrations
from orchestrator.store.queries import format_cost

REPO_ROOT = Path(__file__).resolve().parents[2]
CONCURRENT_SESSIONS = 5
CONCURRENT_APPENDS = 200
# Far fewer transactions than rows proves batching; the exact count depends on thread timing.
MAX_COMMITS_FOR_BURST = CONCURRENT_APPENDS // 4
SUBPROCESS_TIMEOUT_S = 60
TMPFS_BYTES = 4 * 1024 * 1024
BIG_PAYLOAD_CHARS = 100_000
# The space freed must exceed what can wait in the commit log (INGEST_MAX_BYTES): those rows
# need room in DuckDB's own WAL before the log can be emptied (docs/store.md, R6).
FILLER_BYTES = 2 * store_db.INGEST_MAX_BYTES


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "prime-agent.duckdb"


async def new_session(store: Store, *, name: str | None = None, root: str | None = None) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(
            id=sid,
            root_id=root or sid,
            parent_id=root,
            depth=1 if root else 0,
            name=name,
            cwd="/work",
            model="fake/model",
            backend="local",
        )
    )
    return sid


def note(text: str) -> NoticePayload:
    return NoticePayload(text=text)


def raw_rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# -- migrations ----------------------------------------------------------------------------------


def test_migration_files_are_numbered_without_gaps() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == list(range(1, len(versions) + 1))
    assert latest_schema_version() == versions[-1]


async def test_fresh_file_is_migrated_with_private_modes(db_path: Path) -> None:
    store = await Store.open(db_path)
    await store.close()
    assert stat.S_IMODE(db_path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db_path.stat().st_mode) == store_db.DATABASE_FILE_MODE
    assert raw_rows(db_path, "SELECT version FROM schema_version") == [
        (v,) for v in range(1, latest_schema_version() + 1)
    ]
    tables = {r[0] for r in raw_rows(db_path, "SELECT table_name FROM duckdb_tables()")}
    assert {"schema_version", "sessions", "events", "usage"} <= tables
    indexes = {r[0] for r in raw_rows(db_path, "SELECT index_name FROM duckdb_indexes()")}
    assert "events_session_seq" in indexes


async def test_reopen_is_idempotent_and_keeps_data(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        await store.append(sid, "notice", note("kept"))
    for _ in range(2):
        async with await Store.open(db_path) as store:
            assert [e.payload["text"] for e in await store.events(sid)] == ["kept"]
    assert raw_rows(db_path, "SELECT version FROM schema_version") == [
        (v,) for v in range(1, latest_schema_version() + 1)
    ]


async def test_newer_schema_is_refused_with_upgrade_message(db_path: Path) -> None:
    await (await Store.open(db_path)).close()
    con = duckdb.connect(str(db_path))
    con.execute("INSERT INTO schema_version VALUES (99, now())")
    con.close()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="upgrade prime-agent") as info:
            await Store.open(db_path, read_only=read_only)
        assert "99" in str(info.value)
    # A refused open releases the file: the next one is not told it is locked.
    con = duckdb.connect(str(db_path))
    con.execute("DELETE FROM schema_version WHERE version = 99")
    con.close()
    await (await Store.open(db_path)).close()


async def test_read_only_open_of_missing_file_is_a_store_error(db_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        await Store.open(db_path, read_only=True)


async def test_garbage_file_is_a_store_error(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not a database" * 1000)
    with pytest.raises(StoreError, match="cannot open database"):
        await Store.open(db_path)


# -- appends -------------------------------------------------------------------------------------


async def test_acknowledged_appends_are_committed(db_path: Path) -> None:
    store = await Store.open(db_path)
    sid = await new_session(store)
    records = [await store.append(sid, "notice", note(f"n{i}")) for i in range(3)]
    await store.close()
    assert [r.seq for r in records] == [1, 2, 3]
    assert [r.parent_event_id for r in records] == [None, records[0].id, records[1].id]
    rows = raw_rows(db_path, "SELECT seq, id, parent_event_id, payload FROM events ORDER BY seq")
    assert [(r[0], r[1], r[2]) for r in rows] == [(r.seq, r.id, r.parent_event_id) for r in records]
    async with await Store.open(db_path, read_only=True) as ro:
        assert await ro.events(sid) == records
        session = await ro.get_session(sid)
        assert session is not None and session.leaf_event_id == records[-1].id


async def test_acknowledged_appends_survive_a_killed_process(db_path: Path) -> None:
    """R1: a process that dies without close() loses nothing it acknowledged."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from pathlib import Path
        from orchestrator.ids import new_session_id
        from orchestrator.store.db import SessionRecord, Store
        from orchestrator.store.events import NoticePayload

        async def main():
            store = await Store.open(Path({str(db_path)!r}))
            sid = new_session_id()
            await store.create_session(SessionRecord(id=sid, root_id=sid, cwd="/", model="m",
                                                     backend="local"))
            print(sid, flush=True)
            for i in range(20):
                rec = await store.append(sid, "notice", NoticePayload(text=str(i)))
                print(rec.id, flush=True)
            os._exit(0)  # no close(): no checkpoint, only the WAL has the rows

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=True,
    )
    sid, *acknowledged = done.stdout.split()
    async with await Store.open(db_path, read_only=True) as store:
        assert [e.id for e in await store.events(sid)] == acknowledged


async def test_concurrent_appends_across_sessions(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sids = [await new_session(store) for _ in range(CONCURRENT_SESSIONS)]
        before = store.statistics()
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(store.append(sids[i % CONCURRENT_SESSIONS], "notice", note(str(i))))
                for i in range(CONCURRENT_APPENDS)
            ]
        acked = [t.result() for t in tasks]
        after = store.statistics()
        assert after.rows - before.rows == CONCURRENT_APPENDS
        # Group commit: the burst went out in far fewer transactions than rows.
        assert after.commits - before.commits <= MAX_COMMITS_FOR_BURST
        assert after.largest_batch > 1
        for sid in sids:
            events = await store.events(sid)
            per_session = CONCURRENT_APPENDS // CONCURRENT_SESSIONS
            assert [e.seq for e in events] == list(range(1, per_session + 1))
            # Default parent = leaf at write time, so each session is one chain in seq order.
            assert [e.parent_event_id for e in events] == [None] + [e.id for e in events[:-1]]
            session = await store.get_session(sid)
            assert session is not None and session.leaf_event_id == events[-1].id
            assert await store.active_path(sid) == events
        stored = [e.id for sid in sids for e in await store.events(sid)]
        assert sorted(r.id for r in acked) == sorted(stored)


STEP_PAIRS = 5
BETWEEN_RECORDS_S = 0.02


async def test_appends_made_together_commit_in_one_transaction(db_path: Path) -> None:
    """A step's records (assistant_message and usage, gathered) are one commit, every time:
    they reach the writer together, not as two racing submissions."""
    async with await Store.open(db_path) as store:
        sid = await new_session(store)

        async def after_other_work(text: str) -> EventRecord:
            # What a step does between its two records, in the same loop iteration, with the
            # GIL released: time in which a writer handed the first append alone commits it.
            time.sleep(BETWEEN_RECORDS_S)
            return await store.append(sid, "notice", note(text))

        for i in range(STEP_PAIRS):
            before = store.statistics()
            first, second = await asyncio.gather(
                store.append(sid, "notice", note(f"a{i}")), after_other_work(f"b{i}")
            )
            after = store.statistics()
            assert after.commits - before.commits == 1, f"pair {i} took two commits"
            assert (first.seq + 1, first.id) == (second.seq, second.parent_event_id)


async def test_a_read_submitted_after_appends_sees_them(db_path: Path) -> None:
    """Held appends are queued before any later call: a read never overtakes them."""
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        appended = asyncio.ensure_future(store.append(sid, "notice", note("first")))
        await asyncio.sleep(0)  # the append is submitted (held) but its iteration goes on
        seen = await store.events(sid)
        assert [e.payload["text"] for e in seen] == ["first"]
        assert (await appended).seq == 1


async def test_seq_resumes_from_the_database_after_reopen(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        for i in range(3):
            await store.append(sid, "notice", note(str(i)))
    async with await Store.open(db_path) as store:
        rec = await store.append(sid, "notice", note("again"))
        assert rec.seq == 4
        assert rec.parent_event_id == (await store.events(sid))[2].id


async def test_append_checks_its_arguments(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        with pytest.raises(TypeError, match="UserMessagePayload"):
            await store.append(sid, "user_message", note("wrong model"))
        with pytest.raises(ValueError, match="unknown event type"):
            await store.append(sid, "bogus", note("x"))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="out of range"):
            await store.append(sid, "usage", UsagePayload(provider="p", model="m", input=2**64))
        with pytest.raises(ValueError, match="JSON"):
            nan = UsagePayload(provider="p", model="m", cost_usd=float("nan"))
            await store.append(sid, "usage", nan)
        assert await store.events(sid) == []


async def test_one_bad_request_does_not_fail_its_batch(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        other = await new_session(store)
        results = await asyncio.gather(
            store.append(sid, "notice", note("ok 1")),
            store.append(new_session_id(), "notice", note("no such session")),
            store.append(other, "notice", note("x"), parent_event_id="not-an-event"),
            store.append(sid, "tool_result", ToolResultPayload(tool_call_id="c", text="a\udc80b")),
            return_exceptions=True,
        )
        assert isinstance(results[1], StoreError) and "unknown session" in str(results[1])
        assert isinstance(results[2], StoreError) and "not an event" in str(results[2])
        assert [e.seq for e in await store.events(sid)] == [1, 2]
        assert (await store.events(sid))[1].payload["text"] == "a\ufffdb"
        assert await store.events(other) == []


async def test_disk_error_fails_only_that_batch(db_path: Path) -> None:
    """R6: a failed commit answers its callers with StoreError; the writer keeps going."""
    async with await Store.open(db_path) as store:
        a, b = await new_session(store), await new_session(store)
        first = await store.append(a, "notice", note("before"))

        def fail_once() -> None:
            store._before_commit = None
            raise OSError(errno.ENOSPC, "No space left on device")

        store._before_commit = fail_once
        failed = await asyncio.gather(
            store.append(a, "notice", note("lost a")),
            store.append(b, "notice", note("lost b")),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreError) for r in failed)
        assert "No space left on device" in str(failed[0])
        assert store.statistics().failed_commits == 1
        # No gap, no phantom leaf: the failed rows never happened.
        later_a = await store.append(a, "notice", note("after"))
        later_b = await store.append(b, "notice", note("after"))
        assert (later_a.seq, later_a.parent_event_id) == (2, first.id)
        assert (later_b.seq, later_b.parent_event_id) == (1, None)
        assert [e.payload["text"] for e in await store.events(a)] == ["before", "after"]


async def test_lost_connection_is_reopened_and_loses_nothing(db_path: Path) -> None:
    """After DuckDB invalidates the connection, the store reopens it and replays the commit
    log: the rows committed meanwhile reach the tables, in order, without a gap."""
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        first = await store.append(sid, "notice", note("before"))

        def drop() -> None:
            assert store._con is not None
            store._con.close()

        await store._call_raw(drop)  # on the writer thread, like every DuckDB call
        during = await store.append(sid, "notice", note("during"))
        later = await store.append(sid, "notice", note("after"))
        assert (during.seq, during.parent_event_id) == (2, first.id)
        assert (later.seq, later.parent_event_id) == (3, during.id)
        events = await store.events(sid)
        assert [e.payload["text"] for e in events] == ["before", "during", "after"]
        assert (await store.get_session(sid)).leaf_event_id == later.id  # type: ignore[union-attr]


def _mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(where)],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    return done.returncode == 0


async def test_disk_full_fails_appends_then_recovers(tmp_path: Path) -> None:
    """R6 on a real full disk: StoreError, the writer survives, the file opens cleanly."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt):
        pytest.skip("needs root and a tmpfs mount")
    try:
        path = mnt / "state" / "db.duckdb"
        filler = mnt / "filler"
        filler.write_bytes(b"\0" * FILLER_BYTES)
        store = await Store.open(path)
        sid = await new_session(store)
        big = note("x" * BIG_PAYLOAD_CHARS)
        acked: list[str] = []
        with pytest.raises(StoreError, match="No space left on device"):
            for _ in range(TMPFS_BYTES // BIG_PAYLOAD_CHARS + 1):
                acked.append((await store.append(sid, "notice", big)).id)
        filler.unlink()  # space comes back: the same store carries on, without a gap
        after = await store.append(sid, "notice", note("small"))
        assert (after.seq, after.parent_event_id) == (len(acked) + 1, acked[-1])
        acked.append(after.id)
        await store.close()  # its checkpoint may fail for lack of space; nothing is lost
        async with await Store.open(path, read_only=True) as ro:
            assert [e.id for e in await ro.events(sid)] == acked
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=SUBPROCESS_TIMEOUT_S)


async def test_close_flushes_pending_appends_and_is_idempotent(db_path: Path) -> None:
    store = await Store.open(db_path)
    sid = await new_session(store)
    tasks = [asyncio.create_task(store.append(sid, "notice", note(str(i)))) for i in range(10)]
    await asyncio.sleep(0)  # the tasks submit their appends
    await store.close()
    await store.close()
    assert [t.result().seq for t in tasks] == list(range(1, 11))
    with pytest.raises(StoreError, match="closed"):
        await store.append(sid, "notice", note("late"))
    assert raw_rows(db_path, "SELECT count(*) FROM events") == [(10,)]


# -- sessions ------------------------------------------------------------------------------------


async def test_sessions_create_update_list_find(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        a = await new_session(store, name="alpha")
        b = await new_session(store, name="beta", root=a)
        with pytest.raises(StoreError, match="already exists"):
            await store.create_session(
                SessionRecord(id=a, root_id=a, cwd="/", model="m", backend="local")
            )
        with pytest.raises(UserError):
            await store.create_session(
                SessionRecord(id="../x", root_id="../x", cwd="/", model="m", backend="local")
            )
        before = await store.get_session(b)
        updated = await store.update_session(b, status="running", sandbox_ref="ctr-1")
        assert before is not None
        assert (updated.status, updated.sandbox_ref, updated.root_id) == ("running", "ctr-1", a)
        assert updated.updated_at >= before.updated_at
        with pytest.raises(TypeError, match="cannot change root_id"):
            await store.update_session(b, root_id=b)
        with pytest.raises(ValueError, match="unknown session status"):
            await store.update_session(b, status="sleeping")
        with pytest.raises(StoreError, match="unknown session"):
            await store.update_session(new_session_id(), status="idle")
        assert [s.id for s in await store.list_sessions()] == [a, b]
        assert await store.get_session(new_session_id()) is None

        found = await store.find_session(b)
        assert found is not None and found.id == b
        found = await store.find_session("beta")
        assert found is not None and found.id == b
        found = await store.find_session(a[:9])
        if a[:9] != b[:9]:
            assert found is not None and found.id == a
        with pytest.raises(UserError, match="matches 2 sessions"):
            await store.find_session("s-")
        assert await store.find_session("s-%") is None
        assert await store.find_session("nobody") is None
        # A subagent by the id `agents` shows for it (its rlm child id).
        child = new_session_id()
        await store.create_session(
            SessionRecord(
                id=child, root_id=a, parent_id=a, depth=1, cwd="/work", model="fake/model",
                backend="local", rlm_child_id=child_id_for(child),
            )
        )  # fmt: skip
        found = await store.find_session(child_id_for(child))
        assert found is not None and found.id == child


async def test_branch_by_moving_the_leaf_and_active_path(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        other = await new_session(store)
        a = await store.append(sid, "user_message", UserMessagePayload(text="a"))
        b = await store.append(sid, "notice", note("b"))
        c = await store.append(sid, "notice", note("c"))
        assert [e.id for e in await store.active_path(sid)] == [a.id, b.id, c.id]

        await store.update_session(sid, leaf_event_id=b.id)
        d = await store.append(sid, "notice", note("d"))
        assert d.parent_event_id == b.id
        assert [e.id for e in await store.active_path(sid)] == [a.id, b.id, d.id]
        assert [e.id for e in await store.events(sid)] == [a.id, b.id, c.id, d.id]

        # Explicit parent: continue the abandoned branch without moving the leaf first.
        e = await store.append(sid, "notice", note("e"), parent_event_id=c.id)
        assert [x.id for x in await store.active_path(sid)] == [a.id, b.id, c.id, e.id]
        root = await store.append(sid, "notice", note("new root"), parent_event_id=None)
        assert [x.id for x in await store.active_path(sid)] == [root.id]
        assert (await store.append(sid, "notice", note("f"))).parent_event_id == root.id

        with pytest.raises(StoreError, match="not an event of session"):
            await store.append(other, "notice", note("x"), parent_event_id=a.id)
        with pytest.raises(StoreError, match="not an event of session"):
            await store.update_session(other, leaf_event_id=a.id)
        await store.update_session(sid, leaf_event_id=None)
        assert await store.active_path(sid) == []
        assert (await store.append(sid, "notice", note("g"))).parent_event_id is None

        assert await store.get_event(b.id) == b
        assert await store.get_event("missing") is None
        page = await store.events(sid, after_seq=2, limit=2)
        assert [x.seq for x in page] == [3, 4]
        assert CURRENT_LEAF is store_db.CURRENT_LEAF


async def test_read_only_store_reads_but_refuses_writes(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await new_session(store)
        await store.append(sid, "notice", note("x"))
    async with await Store.open(db_path, read_only=True) as ro:
        assert ro.read_only
        assert len(await ro.events(sid)) == 1
        with pytest.raises(StoreError, match="read-only"):
            await ro.append(sid, "notice", note("y"))
        with pytest.raises(StoreError, match="read-only"):
            await ro.update_session(sid, status="idle")


# -- usage ---------------------------------------------------------------------------------------


async def test_usage_rollup_never_counts_unknown_cost_as_zero(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        root = await new_session(store)
        child = await new_session(store, root=root)
        idle = await new_session(store)

        def call(cost: float | None, model: str = "gpt-x") -> UsagePayload:
            return UsagePayload(
                provider="openai",
                model=model,
                input=100,
                output=10,
                cache_read=5,
                cache_write=1,
                cost_usd=cost,
                latency_ms=250.0,
            )

        await store.append(root, "usage", call(0.01))
        await store.append(root, "usage", call(0.02, model="gpt-y"))
        await store.append(root, "usage", call(None))
        await store.append(child, "usage", call(None))

        by_id = {u.session_id: u for u in await store.usage_summary()}
        r = by_id[root]
        assert (r.calls, r.input, r.output, r.cache_read, r.cache_write) == (3, 300, 30, 15, 3)
        assert r.cost_usd == pytest.approx(0.03)
        assert r.unknown_cost_calls == 1 and not r.cost_known
        assert r.latency_ms == pytest.approx(750.0)
        assert r.models == ("gpt-x", "gpt-y")
        assert format_cost(r) == "$0.0300 + unknown (1 call)"

        c = by_id[child]
        assert (c.calls, c.cost_usd, c.unknown_cost_calls, c.root_id) == (1, None, 1, root)
        assert format_cost(c) == "unknown (1 call)"

        i = by_id[idle]
        assert (i.calls, i.cost_usd, i.unknown_cost_calls, i.models) == (0, None, 0, ())
        assert i.cost_known and format_cost(i) == "$0.0000"

        only = await store.usage_summary([child])
        assert [u.session_id for u in only] == [child]
    # The usage rows take root_id from the session (the child's is its root), not the payload.
    assert sorted(str(r[0]) for r in raw_rows(db_path, "SELECT root_id FROM usage")) == [root] * 4


# -- locking -------------------------------------------------------------------------------------


async def test_second_process_gets_store_locked_with_one_line(db_path: Path) -> None:
    async with await Store.open(db_path):
        script = textwrap.dedent(
            f"""
            import asyncio, sys
            from pathlib import Path
            from orchestrator.store.db import Store

            async def main(read_only):
                try:
                    await Store.open(Path({str(db_path)!r}), read_only=read_only)
                except Exception as exc:
                    print(type(exc).__name__ + ": " + str(exc))

            asyncio.run(main(sys.argv[1] == "ro"))
            """
        )
        for mode in ("rw", "ro"):
            done = subprocess.run(
                [sys.executable, "-c", script, mode],
                capture_output=True,
                text=True,
                cwd=REPO_ROOT,
                timeout=SUBPROCESS_TIMEOUT_S,
                check=True,
            )
            out = done.stdout.strip()
            assert out == (
                f"StoreLocked: database {db_path} is in use by another prime-agent process "
                f"(PID {os.getpid()}); wait for it to finish or stop it"
            ), out


async def test_second_open_in_the_same_process_is_refused(db_path: Path) -> None:
    async with await Store.open(db_path):
        with pytest.raises(StoreLocked, match="already open in this process"):
            await Store.open(db_path)
        with pytest.raises(StoreLocked):
            await Store.open(db_path, read_only=True)
    await (await Store.open(db_path)).close()  # released on close


def test_public_surface() -> None:
    assert set(store_db.__all__) == {
        "CURRENT_LEAF",
        "DATABASE_FILE_MODE",
        "GROUP_COMMIT_MAX_ROWS",
        "GROUP_COMMIT_WINDOW_S",
        "INGEST_DELAY_S",
        "INGEST_MAX_BYTES",
        "INGEST_MAX_ROWS",
        "LOGGED_TABLES",
        "UPDATABLE_SESSION_FIELDS",
        "EventRecord",
        "SessionRecord",
        "Store",
        "StoreStatistics",
        "UsageSummary",
    }


async def test_every_earlier_schema_version_migrates(tmp_path: Path) -> None:
    """R7: a database left at each earlier version opens, migrates, and keeps its rows."""
    import duckdb

    migrations = load_migrations()
    for upto in range(1, len(migrations)):
        path = tmp_path / f"v{upto}.duckdb"
        con = duckdb.connect(str(path))
        for m in migrations[:upto]:
            con.execute(m.sql)
            con.execute("INSERT INTO schema_version VALUES (?, now())", [m.version])
        con.execute(
            "INSERT INTO sessions (id, root_id, depth, cwd, model, backend, status, "
            "created_at, updated_at) VALUES ('s-0000000000aa', 's-0000000000aa', 0, '/', "
            "'m', 'local', 'idle', now(), now())"
        )
        con.close()
        store = await Store.open(path)
        try:
            record = await store.get_session("s-0000000000aa")
            assert record is not None and record.model == "m"
        finally:
            await store.close()
        versions = raw_rows(path, "SELECT version FROM schema_version ORDER BY version")
        assert versions == [(v,) for v in range(1, latest_schema_version() + 1)]
