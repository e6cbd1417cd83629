# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""The spawn quota cannot be raced (issue 15): admissions reserve their slot and budget before
any await, and give them back when the creation fails or is abandoned.

- From a real kernel: ``asyncio.gather`` of 12, then 40, spawns with ``max_live_children=3``
  admits exactly 3 each time, refuses the rest with ``QuotaExceeded``, and the store holds
  exactly the admitted children (none created and then refused); deleting the first three
  frees their slots for the second round. A third round of 5 budgeted spawns, of which the
  root's budget covers 2, admits exactly 2 (the budget is reserved with the slot).
- In process (real store, real fake-model HTTP, no bus): a creation that fails after its store
  row (the artifacts directory cannot be made) and a caller cancelled while its creation waits
  on the store writer both leave a deleted tombstone, no live child, their budget reservation
  released and their slot free for the next spawn.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from orchestrator.bus.router import HostRequestError
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.manager import Orchestrator
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.integration.test_family import FAST, _run, _tool_texts

QUOTA = 3
FIRST_WAVE = 12
SECOND_WAVE = 40
# The third wave: budgeted children, of which the root's budget covers only two.
ROOT_BUDGET = 1_000_000
CHILD_BUDGET = 400_000
BUDGET_WAVE = 5
UNDO_TIMEOUT_S = 30.0
QUIET_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.02

RACE = f"""
repeat forever:
    when "[subagent":
        text: noted
    when "[task from parent]":
        text: cheap child done
    when "race the quota":
        code:
            import asyncio
            from collections import Counter
            def tally(wave, results):
                ok = [r for r in results if not isinstance(r, BaseException)]
                bad = Counter(type(r).__name__ for r in results if isinstance(r, BaseException))
                print(wave, len(ok), sorted(bad.items()))
            tally("first", await asyncio.gather(*[rlm(f"cheap task {{i}}") for i in range({FIRST_WAVE})], return_exceptions=True))
    when "first ":
        code:
            for c in await rlm.list_subagents():
                await rlm.delete_subagent(c.rlm_child_id)
            tally("second", await asyncio.gather(*[rlm(f"cheap task {{i}}") for i in range({SECOND_WAVE})], return_exceptions=True))
    when "second ":
        code:
            for c in await rlm.list_subagents():
                if c.status != "deleted":
                    await rlm.delete_subagent(c.rlm_child_id)
            tally("third", await asyncio.gather(*[rlm(f"costly task {{i}}", budget={CHILD_BUDGET}) for i in range({BUDGET_WAVE})], return_exceptions=True))
    when "third ":
        text: raced
"""


async def test_gathered_spawns_admit_exactly_the_quota_and_create_nothing_else() -> None:
    settings = FAST.with_overrides(max_live_children=QUOTA, session_token_budget=ROOT_BUDGET)
    result, sessions, events, _ = await _run(RACE, "race the quota", settings)
    assert result.outcome.final_text in ("raced", "noted")
    out = _tool_texts(events["race the quota"])
    affordable = ROOT_BUDGET // CHILD_BUDGET
    assert out == [
        f"first {QUOTA} [('QuotaExceeded', {FIRST_WAVE - QUOTA})]",
        f"second {QUOTA} [('QuotaExceeded', {SECOND_WAVE - QUOTA})]",
        f"third {affordable} [('BudgetExceeded', {BUDGET_WAVE - affordable})]",
    ], out
    root = sessions["race the quota"]
    children = [s for s in sessions.values() if s.parent_id == root.id]
    # Exactly the admitted children exist: the first two waves' (deleted) and the third's.
    statuses = sorted(c.status for c in children)
    assert len(children) == 2 * QUOTA + affordable, statuses
    assert statuses.count("deleted") == 2 * QUOTA, statuses
    budgeted = [c for c in children if c.budget_tokens is not None]
    assert [c.budget_tokens for c in budgeted] == [CHILD_BUDGET] * affordable


CHEAP = """
repeat forever:
    when "[subagent":
        text: noted
    else:
        text: done
"""


async def _wait_for(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``predicate`` until it holds (bounded: ``UNDO_TIMEOUT_S``)."""
    try:
        async with asyncio.timeout(UNDO_TIMEOUT_S):
            while not await predicate():
                await asyncio.sleep(POLL_INTERVAL_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _children_by_status(store: Store, parent_id: str) -> dict[str, str]:
    return {s.id: s.status for s in await store.list_sessions() if s.parent_id == parent_id}


async def test_a_failed_or_abandoned_creation_frees_its_slot_and_budget() -> None:
    paths = Paths.from_env()
    settings = FAST.with_overrides(max_live_children=1)
    gate = threading.Event()  # holds the store writer (case 2)
    with FakeModelServer(CHEAP) as srv:

        async def resolve(selector: str) -> ResolvedModel:
            return resolve_model(selector, settings, api_base=srv.url, env={})

        model = await resolve("openai/fake")
        async with await Store.open(paths.database_file) as store:
            orch = Orchestrator(
                store=store,
                backend=LocalBackend(pool_size=0),
                settings=settings,
                paths=paths,
                resolve=resolve,
            )
            family = FamilyService(orch)

            async def no_child_left() -> bool:
                statuses = await _children_by_status(store, root.id)
                held = family._slots.held(root.id)
                return bool(statuses) and set(statuses.values()) == {"deleted"} and not held

            try:
                root = await orch.create_session(
                    model=model, cwd=Path.cwd(), name="boss", budget=1000, eager_sandbox=False
                )
                assert orch.budgets.available(root.id) == 1000

                # 1. The creation fails after the child's row is written: its artifacts
                # directory cannot be made (a file stands where the directory goes).
                artifacts = paths.artifacts_dir
                aside = artifacts.with_name("artifacts.aside")
                artifacts.rename(aside)
                artifacts.write_text("not a directory")
                try:
                    with pytest.raises(HostRequestError) as failed:
                        await family.rlm_run(root.id, {"prompt": "doomed", "budget": 600})
                finally:
                    artifacts.unlink()
                    aside.rename(artifacts)
                assert failed.value.code == "internal"
                assert "nothing was started" in str(failed.value)
                await _wait_for(no_child_left, "the failed child's tombstone")
                assert orch.budgets.available(root.id) == 1000  # the reservation ended

                # 2. The caller gives up while its creation waits on the store writer: the
                # writer is held from the moment the slot is (before the creation's write).
                hold = family._slots.hold
                blockers: list[asyncio.Future[bool]] = []

                def hold_then_stall(parent_id: str, child_id: str, name: str | None) -> None:
                    hold(parent_id, child_id, name)
                    blockers.append(asyncio.ensure_future(store._call_raw(gate.wait)))

                family._slots.hold = hold_then_stall  # type: ignore[method-assign]
                spawn = asyncio.ensure_future(
                    family.rlm_run(root.id, {"prompt": "abandoned", "budget": 600})
                )
                await _wait_for(lambda: _true(bool(blockers)), "the abandoned spawn's slot")
                family._slots.hold = hold  # type: ignore[method-assign]
                spawn.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await spawn
                # Until the creation settles, the half-made child keeps its slot and budget.
                assert len(family._slots.held(root.id)) == 1
                assert orch.budgets.available(root.id) == 400
                gate.set()
                await blockers[0]
                await _wait_for(no_child_left, "the abandoned child's tombstone")
                assert orch.budgets.available(root.id) == 1000

                # 3. Both slots are free: a new spawn is admitted and runs.
                handle = await family.rlm_run(root.id, {"prompt": "welcome", "budget": 600})
                assert orch.budgets.available(root.id) == 400
                await orch.wait_quiet(root.record.root_id, QUIET_TIMEOUT_S)
                statuses = await _children_by_status(store, root.id)
            finally:
                gate.set()
                await orch.close()
            events = {s: await store.events(s) for s in statuses}
    assert sorted(statuses.values()).count("deleted") == 2 and len(statuses) == 3
    assert statuses[handle["session_id"]] != "deleted"
    # Only the admitted child ever reached its model: the others never ran.
    ran = [s for s, evs in events.items() if any(e.type == "assistant_message" for e in evs)]
    assert ran == [handle["session_id"]]


async def _true(value: bool) -> bool:
    return value
