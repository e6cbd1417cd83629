"""The commit log in front of DuckDB's tables (orchestrator/store/commit_log.py, store/db.py).

An append is durable once its batch is a line of the commit log; the rows reach the tables
later, many batches per DuckDB transaction, and always before a read. These tests pin that:
what a killed process left only in the log comes back on the next open (read-only too), a
torn or damaged line is skipped, a replay of rows already in the tables adds nothing, and the
tables see one transaction for many steps rather than one per append.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from orchestrator.errors import StoreError
from orchestrator.ids import new_session_id
from orchestrator.store import db as store_db
from orchestrator.store.commit_log import (
    COMMIT_LOG_FILE_MODE,
    CommitLog,
    LoggedRow,
    commit_log_path,
)
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import NoticePayload
from orchestrator.store.queries import to_db_ts, utcnow

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 60
KILLED_STEPS = 12
# Far longer than any test: rows reach the tables only when something asks for them.
NEVER_S = 3600.0
SMALL_ROW_CAP = 5
APPENDS_PAST_CAP = 3 * SMALL_ROW_CAP


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "prime-agent.duckdb"


async def _session(store: Store) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/", model="m", backend="local")
    )
    return sid


def _kill_mid_run(db_path: Path) -> tuple[str, list[str]]:
    """A process appends steps (a notice and a usage each), sets the session running, then
    dies without close()."""
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from pathlib import Path
        from orchestrator.ids import new_session_id
        from orchestrator.store import db as store_db
        from orchestrator.store.db import SessionRecord, Store
        from orchestrator.store.events import NoticePayload, UsagePayload

        store_db.INGEST_DELAY_S = {NEVER_S}

        async def main():
            store = await Store.open(Path({str(db_path)!r}))
            sid = new_session_id()
            await store.create_session(
                SessionRecord(id=sid, root_id=sid, cwd="/", model="m", backend="local")
            )
            print(sid, flush=True)
            for i in range({KILLED_STEPS}):
                note, usage = await asyncio.gather(
                    store.append(sid, "notice", NoticePayload(text=str(i))),
                    store.append(sid, "usage", UsagePayload(provider="p", model="m", input=i,
                                                            cost_usd=0.5)),
                )
                print(note.id, usage.id, flush=True)
            await store.set_status(sid, "running")
            assert store.statistics().pending == 2 * {KILLED_STEPS} + 1, store.statistics()
            os._exit(0)  # no close(): the rows are in the commit log only

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
    return sid, acknowledged


async def test_rows_only_in_the_log_come_back_after_a_kill(db_path: Path) -> None:
    """R1 through the log: a read-only open after the kill sees every acknowledged row, the
    usage rows, the leaf and the status change; a torn last line (a write that never
    returned) is left out."""
    sid, acknowledged = _kill_mid_run(db_path)
    log = commit_log_path(db_path)
    assert log.stat().st_size > 0
    with open(log, "ab") as f:
        f.write(b'0badc0de [["torn')  # a crash in the middle of the next write
    async with await Store.open(db_path, read_only=True) as ro:
        events = await ro.events(sid)
        assert [e.id for e in events] == acknowledged
        assert [e.seq for e in events] == list(range(1, len(acknowledged) + 1))
        session = await ro.get_session(sid)
        assert session is not None and session.leaf_event_id == acknowledged[-1]
        assert session.status == "running"
        (usage,) = await ro.usage_summary([sid])
        assert usage.input == sum(range(KILLED_STEPS))
    assert log.stat().st_size == 0  # replayed, then emptied
    async with await Store.open(db_path) as store:
        nxt = await store.append(sid, "notice", NoticePayload(text="next"))
        assert (nxt.seq, nxt.parent_event_id) == (len(acknowledged) + 1, acknowledged[-1])


async def test_a_replay_of_rows_already_in_the_tables_adds_nothing(db_path: Path) -> None:
    """The log is emptied after each ingest without a sync; if that is lost in a crash, the
    next open meets lines whose rows are in the tables, and skips them."""
    store_log = commit_log_path(db_path)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        appended = [
            (await store.append(sid, "notice", NoticePayload(text=str(i)))).id for i in "ab"
        ]
        kept = store_log.read_bytes()
        assert kept  # both lines, not yet in the tables
        await store.events(sid)  # the read moves them into the tables
        assert store_log.read_bytes() == b""
    store_log.write_bytes(kept)  # as if the emptying had not reached the disk
    async with await Store.open(db_path) as store:
        assert [e.id for e in await store.events(sid)] == appended
        assert (await store.append(sid, "notice", NoticePayload(text="c"))).seq == len(appended) + 1


async def test_a_status_change_commits_to_the_log_not_to_the_tables(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn changes its session's status twice: each is a log commit, like an append, with
    no DuckDB job of its own (it used to be an UPDATE plus two reads, ~4.5 ms of writer CPU,
    and an early ingest); the next read sees it."""
    monkeypatch.setattr(store_db, "INGEST_DELAY_S", NEVER_S)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        before = store.statistics()
        await store.set_status(sid, "running")
        await store.append(sid, "notice", NoticePayload(text="step"))
        await store.set_status(sid, "idle")
        middle = store.statistics()
        assert middle.commits - before.commits == 3
        assert (middle.calls, middle.ingests) == (before.calls, before.ingests)
        session = await store.get_session(sid)
        assert session is not None and session.status == "idle"
        assert store.statistics().ingests == before.ingests + 1
        with pytest.raises(StoreError, match="unknown session"):
            await store.set_status(new_session_id(), "idle")
        with pytest.raises(ValueError, match="unknown session status"):
            await store.set_status(sid, "sleeping")  # type: ignore[arg-type]


async def test_a_side_read_leaves_the_committed_rows_in_the_log(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_side`` (a read of a table the log never writes: a turn's end checks goals,
    autonomy and refinements) runs without forcing an ingest; ``read`` forces one."""
    monkeypatch.setattr(store_db, "INGEST_DELAY_S", NEVER_S)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        await store.append(sid, "notice", NoticePayload(text="step"))
        before = store.statistics()
        goals = await store.read_side(
            lambda con: con.execute("SELECT count(*) FROM goals").fetchone()
        )
        assert goals == (0,)
        after = store.statistics()
        assert (
            (after.ingests, after.pending)
            == (before.ingests, before.pending)
            == (
                before.ingests,
                1,
            )
        )
        await store.read(lambda con: con.execute("SELECT count(*) FROM goals").fetchone())
        assert (store.statistics().ingests, store.statistics().pending) == (before.ingests + 1, 0)


async def test_a_replayed_status_line_does_not_undo_a_later_update(db_path: Path) -> None:
    """If emptying the log after an ingest is lost, a replayed status line is older than a
    direct ``update_session`` made after it, and leaves that one in place."""
    store_log = commit_log_path(db_path)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        await store.set_status(sid, "running")
        kept = store_log.read_bytes()
        assert kept
        await store.update_session(sid, status="completed")  # ingests the line first
    store_log.write_bytes(kept)  # as if the emptying had not reached the disk
    async with await Store.open(db_path) as store:
        session = await store.get_session(sid)
        assert session is not None and session.status == "completed"


async def test_many_steps_reach_the_tables_in_one_transaction(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends commit to the log; the tables get one transaction, when a read needs it."""
    monkeypatch.setattr(store_db, "INGEST_DELAY_S", NEVER_S)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        before = store.statistics()
        for i in range(KILLED_STEPS):
            await store.append(sid, "notice", NoticePayload(text=str(i)))
        middle = store.statistics()
        assert middle.commits - before.commits == KILLED_STEPS
        assert (middle.ingests - before.ingests, middle.pending) == (0, KILLED_STEPS)
        assert len(await store.events(sid)) == KILLED_STEPS
        after = store.statistics()
        assert (after.ingests - before.ingests, after.pending) == (1, 0)


async def test_a_full_log_is_ingested_without_waiting_for_a_read(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_db, "INGEST_DELAY_S", NEVER_S)
    monkeypatch.setattr(store_db, "INGEST_MAX_ROWS", SMALL_ROW_CAP)
    async with await Store.open(db_path) as store:
        sid = await _session(store)
        for i in range(APPENDS_PAST_CAP):
            await store.append(sid, "notice", NoticePayload(text=str(i)))
        # The writer ingests right after it answers the append that filled the cap, so the
        # last one may still be under way when the caller reads the counters.
        stats = store.statistics()
        assert stats.ingests >= APPENDS_PAST_CAP // SMALL_ROW_CAP - 1
        assert stats.pending <= SMALL_ROW_CAP


async def test_the_log_is_private(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        await store.append(await _session(store), "notice", NoticePayload(text="secret"))
        mode = stat.S_IMODE(commit_log_path(db_path).stat().st_mode)
        assert mode == COMMIT_LOG_FILE_MODE == 0o600


def _row(seq: int, text: str) -> LoggedRow:
    payload = json.dumps({"text": text})
    return LoggedRow("s", "s", seq, f"e{seq}", None, "notice", to_db_ts(utcnow()), payload)


def test_damaged_lines_are_skipped_and_whole_ones_kept(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "x.commits")
    log.append([_row(1, "one")])
    log.append([_row(2, "two"), _row(3, "three")])
    good = (tmp_path / "x.commits").read_bytes()
    lines = good.split(b"\n")
    flipped = lines[0].replace(b"one", b"ONE")  # same length, wrong checksum
    not_rows = b"%08x %s" % (zlib.crc32(b"{}"), b"{}")
    (tmp_path / "x.commits").write_bytes(b"\n".join([flipped, not_rows, lines[1], b"half"]))
    log.close()
    assert [[r.seq for r in batch] for batch in CommitLog(tmp_path / "x.commits").read()] == [
        [2, 3]
    ]


def test_a_failed_write_leaves_no_bytes_behind(tmp_path: Path) -> None:
    """A batch whose sync fails is not acknowledged and must not be replayed or glue onto the
    next line."""
    path = tmp_path / "x.commits"
    log = CommitLog(path)
    log.append([_row(1, "kept")])

    def fail() -> None:
        raise OSError("injected")

    with pytest.raises(OSError, match="injected"):
        log.append([_row(2, "never acknowledged")], fail)
    log.append([_row(2, "the real second")])
    batches = CommitLog(path).read()
    assert [json.loads(b[0].payload_json)["text"] for b in batches] == ["kept", "the real second"]
    assert os.path.getsize(path) == log.size
