"""Sessions known to have no side-table rows skip their reads (store/sessions_with_rows.py).

A turn's end asks the goals, autonomy and refinements tables about its session. The index
answers "none" from memory for sessions that never had a row; these tests pin that it never
answers "none" for a session that has one: rows from before (a restart), rows inserted while
its first query runs, and each writer's inserts.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
import pytest_asyncio

from orchestrator.control.autonomous import AutonomousPolicy, Autonomy
from orchestrator.control.goals import Goals
from orchestrator.ids import new_session_id
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.sessions_with_rows import SessionsWithRows, distinct_sessions_query

# A bound for a thread to reach a point, not a wait: it is there in microseconds.
REACH_TIMEOUT_S = 30.0


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(tmp_path / "prime-agent.duckdb")
    yield opened
    await opened.close()


async def _session(store: Store) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/", model="m", backend="local")
    )
    return sid


def _count_side_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    read_side = store.read_side

    async def counted(fn: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        calls.append(1)
        return await read_side(fn)

    monkeypatch.setattr(store, "read_side", counted)
    return calls


async def test_a_session_without_a_goal_ends_its_turns_without_reading(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet, busy = await _session(store), await _session(store)
    goals = Goals(store)
    reads = _count_side_reads(store, monkeypatch)
    for _ in range(3):
        assert await goals.current(quiet) is None
    assert len(reads) == 1  # the index's one query, then nothing per turn
    # A goal created through the writer is seen at once, and read from the table.
    target = _Target(store, busy)
    await goals.create(target, "ship it", source="user")
    current = await goals.current(busy)
    assert current is not None and current.objective == "ship it"
    assert len(reads) == 2


async def test_goals_and_runs_from_before_a_restart_are_found(store: Store) -> None:
    sid, other = await _session(store), await _session(store)
    await Goals(store).create(_Target(store, sid), "keep going", source="user")
    await Autonomy(store).enable(sid, AutonomousPolicy())
    # A new orchestrator over the same store: its indexes start from the tables.
    goals, runs = Goals(store), Autonomy(store)
    current = await goals.current(sid)
    assert current is not None and current.objective == "keep going"
    run = await runs.get(sid)
    assert run is not None and run.enabled
    assert await goals.current(other) is None and await runs.get(other) is None


async def test_an_add_made_while_the_first_query_runs_is_not_lost(store: Store) -> None:
    """The writer adds a session while the index's first query is on the writer thread (its
    answer cannot hold the row yet): the merged set must still hold it."""
    sid = new_session_id()
    inside, release = threading.Event(), threading.Event()
    query = distinct_sessions_query("goals")

    def held(con: duckdb.DuckDBPyConnection) -> set[str]:
        found = query(con)
        inside.set()
        release.wait(REACH_TIMEOUT_S)
        return found

    index = SessionsWithRows(store, held)
    first = asyncio.ensure_future(index.may_have(new_session_id()))
    assert await asyncio.to_thread(inside.wait, REACH_TIMEOUT_S)
    index.add(sid)
    release.set()
    assert await first is False
    assert await index.may_have(sid) is True


@pytest.mark.parametrize("table", ["goals", "autonomy", "refinements"])
async def test_the_first_query_names_every_session_with_rows(store: Store, table: str) -> None:
    sid = await _session(store)
    found = await store.read_side(distinct_sessions_query(table))
    assert sid not in found
    index = SessionsWithRows(store, distinct_sessions_query(table))
    assert await index.may_have(sid) is False
    index.add(sid)
    assert await index.may_have(sid) is True


class _Target:
    """A session as goals see it: events go to the real store."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store, self.session_id = store, session_id

    async def record(self, type_: Any, payload: Any) -> Any:
        return await self.store.append(self.session_id, type_, payload)

    def children_working(self) -> bool:
        return False
