"""The kernel's ``goal`` without NATS: argument checks before any request, the exact wire
args, reply decoding, host errors as their runtime classes; then the kernel object against
the real ``goal.*`` handlers (a client that calls them in-process, through JSON) on a real
store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.bus.router import HostRequestError
from orchestrator.control import goals as host_goals
from orchestrator.control.goals import Goals
from orchestrator.runtime import LAZY_HELPERS, RUNTIME_NAMES
from orchestrator.runtime import goal as kernel_goal
from orchestrator.runtime.errors import (
    Conflict,
    InternalHostError,
    InvalidArgument,
    NotFound,
    error_from_reply,
)
from orchestrator.runtime.goal import Goal, GoalCompletion, GoalRecord, goal
from orchestrator.runtime.host import HostClient
from orchestrator.store import goals as goal_store
from orchestrator.store.db import Store
from tests.unit.test_goals import FakeLive, StandInOrchestrator, new_target, usage
from tests.unit.test_runtime_api import RecordingClient


def wire_goal(**changes: Any) -> dict[str, Any]:
    row = {
        "id": "g-01",
        "session_id": "s-root",
        "objective": "ship it",
        "token_budget": 1_000,
        "tokens_used": 250,
        "status": "active",
        "continuations": 2,
        "last_reason": "continued",
        "created_at": "2025-01-01T00:00:00+00:00",
        "updated_at": "2025-01-01T00:05:00+00:00",
        "completed_at": None,
        "tokens_remaining": 750,
    }
    row.update(changes)
    return row


def test_mirrored_constants_equal_the_hosts() -> None:
    assert kernel_goal.OBJECTIVE_MAX_CHARS == host_goals.OBJECTIVE_MAX_CHARS
    assert kernel_goal.TOKEN_BUDGET_MAX == host_goals.TOKEN_BUDGET_MAX
    assert kernel_goal.GOAL_STATUSES == goal_store.GOAL_STATUSES


def test_goal_is_a_lazy_runtime_name() -> None:
    assert "goal" in RUNTIME_NAMES
    assert LAZY_HELPERS["goal"] == ("orchestrator.runtime.goal", "goal")
    assert isinstance(goal, Goal) and "goal.create" in repr(goal)


async def test_create_sends_the_trimmed_objective_and_the_budget_only_when_given() -> None:
    client = RecordingClient({"goal.create": {"goal": wire_goal()}})
    record = await Goal(client).create("  ship it \n", token_budget=1_000)
    await Goal(client).create("ship it")
    assert [r[:2] for r in client.requests] == [
        ("goal.create", {"objective": "ship it", "token_budget": 1_000}),
        ("goal.create", {"objective": "ship it"}),
    ]
    assert record == GoalRecord(
        id="g-01",
        objective="ship it",
        status="active",
        token_budget=1_000,
        tokens_used=250,
        tokens_remaining=750,
        continuations=2,
        last_reason="continued",
        created_at="2025-01-01T00:00:00+00:00",
        updated_at="2025-01-01T00:05:00+00:00",
    )
    assert record.active and record.record["session_id"] == "s-root"


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda g: g.create(""), InvalidArgument, "objective is empty"),
        (lambda g: g.create(" \t"), InvalidArgument, "objective is empty"),
        (lambda g: g.create("x" * 4_001), InvalidArgument, "limit is 4,000"),
        (lambda g: g.create(42), TypeError, "objective must be a str"),
        (lambda g: g.create("o", token_budget=0), InvalidArgument, "between 1 and"),
        (lambda g: g.create("o", token_budget=10**12 + 1), InvalidArgument, "between 1 and"),
        (lambda g: g.create("o", token_budget=True), TypeError, "must be an int"),
        (lambda g: g.create("o", token_budget="5"), TypeError, "must be an int"),
        (lambda g: g.create("o", budget=5), TypeError, "unsupported keyword argument"),
        (lambda g: g.get(session="s"), TypeError, "unsupported keyword argument"),
        (lambda g: g.complete(force=True), TypeError, "unsupported keyword argument"),
    ],
)
def test_arguments_are_checked_before_anything_is_sent(
    call: Any, error: type[Exception], words: str
) -> None:
    client = RecordingClient()
    with pytest.raises(error, match=words):
        call(Goal(client))
    assert client.requests == []


async def test_an_objective_at_the_limit_after_trimming_is_sent() -> None:
    client = RecordingClient({"goal.create": {"goal": wire_goal()}})
    await Goal(client).create("  " + "y" * 4_000 + "  ")
    assert client.requests[0][1] == {"objective": "y" * 4_000}


async def test_get_and_complete_decode_their_replies() -> None:
    client = RecordingClient({"goal.get": {"goal": None}})
    assert await Goal(client).get() is None
    client.replies["goal.get"] = {"goal": wire_goal(status="paused", token_budget=None)}
    got = await Goal(client).get()
    assert got is not None and got.status == "paused" and not got.active
    assert got.token_budget is None

    report = "Goal complete. Tokens used: 250 of a budget of 1,000 (750 remaining)."
    done = wire_goal(status="complete", completed_at="2025-01-02T00:00:00+00:00")
    client.replies["goal.complete"] = {"goal": done, "report": report}
    completion = await Goal(client).complete()
    assert isinstance(completion, GoalCompletion)
    assert str(completion) == repr(completion) == report
    assert completion.goal.status == "complete" and completion.goal.completed_at
    assert [r[:2] for r in client.requests] == [
        ("goal.get", {}),
        ("goal.get", {}),
        ("goal.complete", {}),
    ]


@pytest.mark.parametrize(
    ("request_type", "reply"),
    [
        ("goal.create", {}),
        ("goal.create", {"goal": {"id": "g-1"}}),
        ("goal.create", []),
        ("goal.get", {"goal": "g-1"}),
        ("goal.complete", {"goal": wire_goal()}),
        ("goal.complete", {"report": "done"}),
    ],
)
async def test_malformed_replies_are_internal_errors(request_type: str, reply: Any) -> None:
    client = RecordingClient({request_type: reply})
    calls = {
        "goal.create": lambda g: g.create("o"),
        "goal.get": lambda g: g.get(),
        "goal.complete": lambda g: g.complete(),
    }
    with pytest.raises(InternalHostError):
        await calls[request_type](Goal(client))


async def test_host_refusals_are_their_runtime_classes() -> None:
    client = RecordingClient(
        {
            "goal.create": error_from_reply({"code": "conflict", "message": "has a goal"}),
            "goal.complete": error_from_reply({"code": "not_found", "message": "no open goal"}),
        }
    )
    with pytest.raises(Conflict, match="has a goal"):
        await Goal(client).create("o")
    with pytest.raises(NotFound, match="no open goal"):
        await Goal(client).complete()


# --- the kernel object against the real handlers --------------------------------------------


class ServiceClient(HostClient):
    """Calls the ``goal.*`` handlers in-process as ``caller``, through JSON both ways, and
    turns a refusal into the error the kernel would get."""

    def __init__(self, handlers: Mapping[str, Any], caller: str) -> None:
        super().__init__(environ={})
        self.handlers = handlers
        self.caller = caller

    async def request(
        self,
        request_type: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        sent = json.loads(json.dumps(dict(args or {})))
        try:
            result = await self.handlers[request_type](self.caller, sent)
        except HostRequestError as exc:
            raise error_from_reply({"code": exc.code, "message": exc.message}) from None
        return json.loads(json.dumps(result))


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "store.duckdb")
    try:
        yield s
    finally:
        await s.close()


async def test_kernel_goal_against_the_handlers(store: Store) -> None:
    from orchestrator.control.goal_service import GoalService

    orch = StandInOrchestrator(store, Goals(store))
    target = await new_target(store)
    orch.sessions[target.session_id] = FakeLive(target.session_id)
    kernel = Goal(ServiceClient(GoalService(orch).handlers(), target.session_id))  # type: ignore[arg-type]

    assert await kernel.get() is None
    made = await kernel.create("  write the report ", token_budget=5_000)
    assert (made.objective, made.status, made.tokens_remaining) == (
        "write the report",
        "active",
        5_000,
    )
    assert made.last_reason == "created by agent"
    with pytest.raises(Conflict, match="already has a goal"):
        await kernel.create("another")
    with pytest.raises(InvalidArgument, match="limit"):
        await ServiceClient(GoalService(orch).handlers(), target.session_id).request(
            "goal.create", {"objective": "z" * 4_001}
        )

    await usage(target, 1_000, 200)
    done = await kernel.complete()
    assert done.goal.status == "complete" and done.goal.tokens_used == 1_200
    assert "1,200 of a budget of 5,000 (3,800 remaining)" in done.report
    got = await kernel.get()
    assert got is not None and got.id == made.id and got.status == "complete"
    with pytest.raises(NotFound):
        await kernel.complete()
