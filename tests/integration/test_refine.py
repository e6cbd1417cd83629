"""``/refine`` end to end over a real DuckDB file and the scripted model over real HTTP
(issue 7): a plan that creates, updates and deletes applies with source ``refine`` and
versions; rollback restores the exact earlier versions (and can itself be rolled back); an
edit whose target the kernel changed while the plan was made is rejected while the others
apply; truncated and invalid plans change nothing and say why; a disabled session and a
second request are refused; the measured outcome is written once N turns have passed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, TypeVar

import duckdb
import pytest
from pydantic import BaseModel

from orchestrator.errors import HarnessNotFound
from orchestrator.harness.outcome import outcome_line
from orchestrator.harness.proposals import accept_proposal
from orchestrator.harness.refine import INTERRUPTED, USER_TRIGGER, Refiner
from orchestrator.ids import new_session_id
from orchestrator.models.client import ModelClient, ModelReply
from orchestrator.models.registry import resolve_model
from orchestrator.settings import ModelConfig, Settings
from orchestrator.store.db import Store
from orchestrator.store.events import (
    ErrorPayload,
    EventType,
    RetryPayload,
    ToolResultPayload,
    TurnEndPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.harness import select_entry, select_log, select_versions, write_entry
from orchestrator.store.harness_entry import GLOBAL_OWNER, EntryWrite, HarnessEntry
from orchestrator.store.proposals import select_proposals
from orchestrator.store.queries import SessionRecord
from orchestrator.store.refinements import RefinementRow, select_refinement
from orchestrator.testing import FakeModelServer

MODEL: Final = "openai/fake"
WAIT_S: Final = 30.0
PLAN_USAGE: Final = "usage in=300 out=50"
# Prices per million tokens, so the planning call has a known cost.
INPUT_PER_MTOK: Final = 1.0
OUTPUT_PER_MTOK: Final = 2.0
PLAN_COST: Final = (300 * INPUT_PER_MTOK + 50 * OUTPUT_PER_MTOK) / 1_000_000
# What an entry IS (as opposed to which write made it): a rollback must restore all of these.
STATE_FIELDS: Final = tuple(
    f.name
    for f in fields(HarnessEntry)
    if f.name not in ("version", "source", "reason", "session_id", "refinement_id", "updated_at")
)

_T = TypeVar("_T")


@dataclass
class Target:
    """The session as the refiner sees it: the model call goes to the fake server."""

    session_id: str
    root_id: str
    store: Store
    client: ModelClient
    refine_enabled: bool = True
    running: bool = False  # a turn is in progress: apply waits for at_boundary
    hold: asyncio.Event | None = None  # when set, complete() waits for it
    changed: int = 0
    notices: list[str] = field(default_factory=list)
    noticed: asyncio.Event = field(default_factory=asyncio.Event)

    def busy(self) -> bool:
        return self.running

    async def complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        if self.hold is not None:
            await self.hold.wait()
        return await self.client.complete(messages)

    async def record(self, type_: EventType, payload: BaseModel) -> Any:
        if type_ == "notice":
            self.notices.append(str(getattr(payload, "text", "")))
            self.noticed.set()
        return await self.store.append(self.session_id, type_, payload)

    def harness_changed(self) -> None:
        self.changed += 1


@dataclass
class World:
    store: Store
    server: FakeModelServer
    target: Target
    refiner: Refiner

    async def read(self, fn: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        return await self.store.read(fn)

    async def write(
        self, action: Any, write: EntryWrite, *, owner: str | None = None, **kw: Any
    ) -> HarnessEntry:
        return await self.store.transaction(
            lambda con: write_entry(
                con,
                owner=owner or self.target.root_id,
                action=action,
                write=write,
                expected_version=kw.get("expected_version"),
                source=kw.get("source", "user"),
                reason=kw.get("reason", "seed"),
                session_id=None,
            )
        )

    async def head(self, kind: str, entry_id: str) -> HarnessEntry | None:
        owner = self.target.root_id
        return await self.read(
            lambda con: select_entry(con, owner, kind, entry_id, include_deleted=True)
        )

    async def versions(self, kind: str, entry_id: str) -> list[HarnessEntry]:
        owner = self.target.root_id
        return await self.read(lambda con: select_versions(con, owner, kind, entry_id))

    async def log(self) -> list[HarnessEntry]:
        return await self.read(lambda con: select_log(con, None, limit=1000))

    async def row(self, refinement_id: str) -> RefinementRow:
        row = await self.read(lambda con: select_refinement(con, refinement_id))
        assert row is not None
        return row

    async def turn_end(
        self,
        *,
        errors: int = 0,
        tool_errors: int = 0,
        retries: int = 0,
        usage: tuple[int, int, float | None] | None = None,
    ) -> None:
        """One turn's worth of events, as the loop records them."""
        sid = self.target.session_id
        for _ in range(errors):
            await self.store.append(sid, "error", ErrorPayload(kind="provider", message="boom"))
        for _ in range(tool_errors):
            await self.store.append(
                sid,
                "tool_result",
                ToolResultPayload(tool_call_id="c", text="Traceback", is_error=True),
            )
        for n in range(retries):
            await self.store.append(
                sid, "retry", RetryPayload(attempt=n + 1, delay_s=0.0, reason="429")
            )
        if usage is not None:
            tokens_in, tokens_out, cost = usage
            await self.store.append(
                sid,
                "usage",
                UsagePayload(
                    provider="openai",
                    model="fake",
                    input=tokens_in,
                    output=tokens_out,
                    cost_usd=cost,
                ),
            )
        await self.store.append(sid, "turn_end", TurnEndPayload(reason="completed"))

    async def refine(
        self, instructions: str | None = None, *, scope: Any = "local"
    ) -> RefinementRow:
        """Request a refinement and wait for its notice (applied, or failed)."""
        self.target.noticed.clear()
        answer = await self.refiner.request(
            self.target, instructions=instructions, scope=scope, trigger="manual"
        )
        assert answer["scheduled"] is True, answer
        await asyncio.wait_for(self.target.noticed.wait(), WAIT_S)
        return await self.row(answer["id"])


def script(plan: dict[str, Any] | str, *extra: str) -> str:
    text = plan if isinstance(plan, str) else json.dumps(plan)
    return "\n".join([f"text: {text}", PLAN_USAGE, *extra])


@pytest.fixture
async def world(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[World]:
    cfg = Settings(
        models={
            MODEL: ModelConfig(
                input_cost_per_mtok=INPUT_PER_MTOK, output_cost_per_mtok=OUTPUT_PER_MTOK
            )
        },
        model_max_retries=0,
        retry_base_delay_s=0.01,
    )
    store = await Store.open(tmp_path / "prime.duckdb")
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/", model=MODEL, backend="local")
    )
    await store.append(
        sid, "user_message", UserMessagePayload(text="the tests keep failing: use pytest -q")
    )
    server = FakeModelServer(getattr(request, "param", "")).start()
    client = ModelClient(resolve_model(MODEL, cfg, api_base=server.url, env={}), cfg)
    refiner = Refiner(store, outcome_turns=2)
    try:
        yield World(store, server, Target(sid, sid, store, client), refiner)
    finally:
        await refiner.close()
        server.close()
        await store.close()


def state(entry: HarnessEntry | None) -> dict[str, Any]:
    assert entry is not None
    return {name: getattr(entry, name) for name in STATE_FIELDS}


SKILL: Final = {
    "action": "create",
    "kind": "skill",
    "title": "Run tests",
    "content": "Runs the test suite quietly.",
    "reference": {"type": "python", "import": "tools.testing", "callable": "run_tests"},
    "arguments": {"path": "the folder to test"},
    "reason": "the command was typed by hand four times",
}
MIXED_PLAN: Final = {
    "summary": "Remember how to test",
    "rationale": "pytest was run wrongly",
    "expectedOutcome": "fewer failed runs",
    "edits": [
        SKILL,
        {
            "action": "update",
            "kind": "prompt",
            "id": "style",
            "content": "Use pytest -q.",
            "reason": "noise",
        },
        {"action": "delete", "kind": "memory", "id": "stale_path", "reason": "the path is gone"},
    ],
}


@pytest.mark.parametrize("world", [script(MIXED_PLAN)], indirect=True)
async def test_a_plan_applies_with_versions_and_rolls_back_exactly(world: World) -> None:
    await world.write(
        "create",
        EntryWrite(
            kind="prompt", id="style", title="Style", content="Be brief.", metadata={"tags": ["x"]}
        ),
    )
    style_v2 = await world.write(
        "update", EntryWrite(kind="prompt", id="style", path="policy/tests")
    )
    stale = await world.write(
        "create", EntryWrite(kind="memory", id="stale_path", title="Path", content="/old")
    )
    await world.write(
        "create",
        EntryWrite(kind="memory", id="note", title="Global note", content="hi"),
        owner=GLOBAL_OWNER,
    )
    await world.turn_end()
    await world.turn_end()

    row = await world.refine()
    assert row.status == "applied", row.error
    assert row.summary == "Remember how to test" and row.expected_outcome == "fewer failed runs"
    assert row.turn_index == 2 and row.trigger == "manual" and row.owner == world.target.root_id
    assert [(e["action"], e["id"], e["baseline_version"], e["applied"]) for e in row.edits] == [
        ("create", "run_tests", None, True),
        ("update", "style", 2, True),
        ("delete", "stale_path", 1, True),
    ]
    assert [(e["before_version"], e["after_version"]) for e in row.edits] == [
        (None, 1),
        (2, 3),
        (1, 2),
    ]
    assert world.target.changed == 1
    assert world.target.notices == [f"refinement {row.id}: 3 edits applied: Remember how to test"]

    skill, style, tomb = (
        await world.head("skill", "run_tests"),
        await world.head("prompt", "style"),
        await world.head("memory", "stale_path"),
    )
    for entry in (skill, style, tomb):
        assert entry is not None and entry.source == "refine" and entry.refinement_id == row.id
    assert skill is not None and skill.reference["callable"] == "run_tests" and skill.version == 1
    assert style is not None and style.content == "Use pytest -q." and style.path == "policy/tests"
    assert style.metadata == {"tags": ["x"]} and style.version == 3
    assert tomb is not None and tomb.deleted and tomb.version == 2

    # the planner saw the evidence and the harness
    sent = world.server.requests[-1]["messages"][-1]["content"]
    assert "the tests keep failing: use pytest -q" in sent
    assert "[local:style] Style (policy/tests, v2): Be brief." in sent
    assert "[global:note] Global note" in sent
    events = await world.store.events(world.target.session_id)
    usage = [e for e in events if e.type == "usage"]
    assert len(usage) == 1 and usage[0].payload["input"] == 300

    after_refine = {
        k: state(await world.head(*k))
        for k in [("skill", "run_tests"), ("prompt", "style"), ("memory", "stale_path")]
    }
    back = await world.refiner.rollback(row.id, session_id=world.target.session_id, source="user")
    assert back.rollback_of == row.id and back.status == "applied" and back.trigger == "rollback"
    assert [(e["action"], e["id"], e["applied"]) for e in back.edits] == [
        ("create", "stale_path", True),
        ("update", "style", True),
        ("delete", "run_tests", True),
    ]
    assert [(e["before_version"], e["after_version"]) for e in back.edits] == [
        (2, 3),
        (3, 4),
        (1, 2),
    ]
    assert state(await world.head("prompt", "style")) == state(style_v2)
    assert state(await world.head("memory", "stale_path")) == state(stale)
    gone = await world.head("skill", "run_tests")
    assert gone is not None and gone.deleted and state(gone) | {"deleted": False} == state(skill)
    for kind, entry_id in [("skill", "run_tests"), ("prompt", "style"), ("memory", "stale_path")]:
        head = await world.head(kind, entry_id)
        assert head is not None and head.refinement_id == back.id and head.source == "user"

    again = await world.refiner.rollback(back.id, session_id=None, source="user")
    assert again.rollback_of == back.id and all(e["applied"] for e in again.edits)
    for key, expected in after_refine.items():
        assert state(await world.head(*key)) == expected
    with pytest.raises(HarnessNotFound):
        await world.refiner.rollback("r-unknown", session_id=None, source="user")
    assert world.refiner.status(world.target.session_id)["last"]["id"] == again.id


CONFLICT_PLAN: Final = {
    "summary": "Tidy memories",
    "edits": [
        {
            "action": "update",
            "kind": "memory",
            "id": "alpha",
            "content": "alpha by refine",
            "reason": "r",
        },
        {
            "action": "update",
            "kind": "memory",
            "id": "beta",
            "content": "beta by refine",
            "reason": "r",
        },
        {"action": "create", "kind": "memory", "title": "Gamma", "content": "new", "reason": "r"},
    ],
}


@pytest.mark.parametrize("world", [script(CONFLICT_PLAN)], indirect=True)
async def test_an_entry_the_kernel_changed_meanwhile_is_rejected_and_the_rest_apply(
    world: World,
) -> None:
    await world.write("create", EntryWrite(kind="memory", id="alpha", title="Alpha", content="a"))
    await world.write("create", EntryWrite(kind="memory", id="beta", title="Beta", content="b"))
    world.target.running = True  # a turn runs: the plan waits for the boundary
    answer = await world.refiner.request(
        world.target, instructions="tidy", scope="local", trigger="kernel"
    )
    await world.refiner.wait_planning()
    assert world.refiner.status(world.target.session_id)["pending"] == [answer["id"]]
    assert (await world.row(answer["id"])).status == "planned"
    kernel = await world.write(
        "update",
        EntryWrite(kind="memory", id="alpha", content="alpha by kernel"),
        source="agent",
        expected_version=1,
    )

    world.target.running = False
    [row] = await world.refiner.at_boundary(world.target)
    assert [(e["id"], e["applied"]) for e in row.edits] == [
        ("alpha", False),
        ("beta", True),
        ("gamma", True),
    ]
    assert (
        row.edits[0]["error"]
        == "entry changed during planning: planned against v1, the store has v2"
    )
    assert world.target.notices == [
        f"refinement {row.id}: 2 edits applied, 1 rejected (entry changed during planning)"
    ]
    assert await world.head("memory", "alpha") == kernel  # the kernel's write is not lost
    assert (await world.head("memory", "beta")).content == "beta by refine"  # type: ignore[union-attr]
    assert await world.refiner.at_boundary(world.target) == []  # applied once only
    status = world.refiner.status(world.target.session_id)
    assert status["pending"] == [] and status["in_flight"] is None
    assert status["last"] == {
        "id": row.id,
        "status": "applied",
        "summary": "Tidy memories",
        "error": None,
        "applied": 2,
        "rejected": 1,
    }

    # the kernel moves beta on: its restore is refused, gamma's still happens
    moved = await world.write(
        "update", EntryWrite(kind="memory", id="beta", content="beta again"), source="agent"
    )
    back = await world.refiner.rollback(row.id, session_id=None, source="user")
    assert [(e["id"], e["applied"]) for e in back.edits] == [("gamma", True), ("beta", False)]
    assert back.edits[1]["error"].startswith(
        "entry changed since the refinement: it left v2, the store has v3"
    )
    assert await world.head("memory", "beta") == moved
    gamma = await world.head("memory", "gamma")
    assert gamma is not None and gamma.deleted


BAD_PLANS: Final = [
    (script(MIXED_PLAN, "finish length"), "output budget exhausted"),
    (script(json.dumps(MIXED_PLAN)[:-30]), "output budget exhausted"),
    (script("I would rather not change anything."), "not JSON: the reply has no JSON object"),
    (
        script(
            {
                "summary": "x",
                "edits": [
                    SKILL,
                    {
                        "action": "create",
                        "kind": "tool",
                        "title": "T",
                        "content": "c",
                        "reason": "r",
                    },
                ],
            }
        ),
        "edit 2: kind: ",
    ),
    (
        script(
            {
                "summary": "x",
                "edits": [
                    {
                        "action": "update",
                        "kind": "prompt",
                        "id": "base_system_prompt",
                        "content": "c",
                        "reason": "r",
                    }
                ],
            }
        ),
        "edit 1: id: 'base_system_prompt' is the immutable base prompt",
    ),
]


@pytest.mark.parametrize(("world", "why"), BAD_PLANS, indirect=["world"])
async def test_a_truncated_or_invalid_plan_changes_nothing_and_says_why(
    world: World, why: str
) -> None:
    await world.write(
        "create", EntryWrite(kind="prompt", id="style", title="Style", content="Be brief.")
    )
    await world.write(
        "create", EntryWrite(kind="memory", id="stale_path", title="Path", content="/old")
    )
    before = await world.log()

    row = await world.refine()
    assert row.status == "failed" and row.error is not None and row.error.startswith(why)
    assert "\n" not in row.error and row.edits == []
    assert await world.log() == before  # every version, every head field: untouched
    assert world.target.changed == 0
    assert world.target.notices == [f"refinement {row.id} failed: {row.error}; nothing changed"]
    events = await world.store.events(world.target.session_id)
    assert [e.type for e in events].count("usage") == 1  # the failed call still cost tokens
    last = world.refiner.status(world.target.session_id)["last"]
    assert last["status"] == "failed" and last["error"] == row.error


EMPTY_PLAN_FOREVER: Final = "repeat forever:\n" + "".join(
    f"    {line}\n" for line in script({"summary": "s", "edits": []}).splitlines()
)


@pytest.mark.parametrize("world", [EMPTY_PLAN_FOREVER], indirect=True)
async def test_refused_requests_an_empty_plan_and_a_stop_mid_plan(world: World) -> None:
    target = world.target
    target.refine_enabled = False
    assert await world.refiner.request(
        target, instructions=None, scope="local", trigger="manual"
    ) == {"scheduled": False, "reason": "refine is disabled for this session"}
    target.refine_enabled = True

    target.hold = asyncio.Event()
    first = await world.refiner.request(target, instructions=None, scope="global", trigger="manual")
    second = await world.refiner.request(target, instructions=None, scope="local", trigger="manual")
    assert second == {
        "scheduled": False,
        "reason": f"refinement {first['id']} is already being planned",
    }
    assert world.refiner.status(target.session_id)["in_flight"] == first["id"]
    target.hold.set()
    await asyncio.wait_for(target.noticed.wait(), WAIT_S)
    row = await world.row(first["id"])
    assert row.status == "applied" and row.edits == [] and row.owner == GLOBAL_OWNER
    assert target.notices == [f"refinement {row.id}: no change (s)"] and target.changed == 0

    target.hold = asyncio.Event()  # never set: the daemon stops while this plan is made
    third = await world.refiner.request(target, instructions=None, scope="local", trigger="manual")
    await world.refiner.close()
    stopped = await world.row(third["id"])
    assert stopped.status == "failed" and stopped.error == INTERRUPTED


@pytest.mark.parametrize("world", [script({"summary": "s", "edits": []})], indirect=True)
async def test_the_outcome_is_measured_after_n_turns(world: World) -> None:
    # turn 1, before the refinement: two errors, a retry, 1,200 tokens
    await world.turn_end(errors=1, tool_errors=1, retries=1, usage=(1000, 200, 0.002))
    row = await world.refine()
    assert row.turn_index == 1 and row.outcome is None
    await world.turn_end(usage=(500, 100, 0.001))
    assert await world.refiner.at_boundary(world.target) == []  # one turn after: not due
    await world.turn_end(tool_errors=1, usage=(400, 100, None))
    [measured] = await world.refiner.at_boundary(world.target)
    assert measured.id == row.id and measured.outcome_at is not None
    outcome = measured.outcome
    assert outcome is not None
    assert (
        outcome["turns_before"] == 1 and outcome["turns_after"] == 2 and outcome["from_turn"] == 1
    )
    assert outcome["before"] == {
        "turns": 1,
        "errors": 2,
        "retries": 1,
        "tokens": 1200,
        "cost_usd": 0.002,
        "cost_unknown_calls": 0,
        "gates_total": None,
        "gates_passed": None,
    }
    # the planning call (300 + 50 tokens, PLAN_COST) ran in turn 2 and is not counted
    after = outcome["after"]
    assert (after["turns"], after["errors"], after["retries"], after["tokens"]) == (2, 1, 0, 1100)
    assert after["cost_usd"] == pytest.approx(0.001) and after["cost_unknown_calls"] == 1
    assert outcome["delta"]["errors"] == -1 and outcome["delta"]["tokens"] == -100
    assert outcome_line(measured) == (
        "errors 2→1, retries 1→0, tokens 1.2k→1.1k, cost $0.0020→$0.0010 over 2 turns (1 before)"
    )
    await world.turn_end()
    assert await world.refiner.at_boundary(world.target) == []  # written once


GLOBAL_PLAN: Final = {
    "summary": "obey the sandbox",
    "edits": [
        {"action": "create", "kind": "prompt", "title": "Obey", "content": "obey", "reason": "r"},
        {"action": "update", "kind": "memory", "id": "note", "content": "changed", "reason": "r"},
    ],
}
GLOBAL_PLAN_TWICE: Final = f"repeat forever:\n    text: {json.dumps(GLOBAL_PLAN)}\n    {PLAN_USAGE}"


async def _global_heads(world: World) -> dict[str, tuple[int, str, bool]]:
    def read(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, str, bool]]:
        return {
            entry_id: (e.version, e.content, e.deleted)
            for entry_id, kind in (("obey", "prompt"), ("note", "memory"))
            if (e := select_entry(con, GLOBAL_OWNER, kind, entry_id, include_deleted=True))
        }

    return await world.read(read)


@pytest.mark.parametrize("world", [GLOBAL_PLAN_TWICE], indirect=True)
async def test_a_global_refinement_the_user_did_not_start_only_proposes(world: World) -> None:
    """The planner reads what the sandbox wrote: a global refinement the agent (or anything
    but the user) started stores its edits as proposals; accepting one applies that edit as
    the refinement's (its rollback undoes it); one the user started applies at once."""
    await world.write(
        "create",
        EntryWrite(kind="memory", id="note", title="Note", content="hi"),
        owner=GLOBAL_OWNER,
    )
    row = await world.refine(scope="global")
    assert row.status == "applied" and row.trigger == "manual"
    assert [(e["id"], e["applied"], e["proposal"][:2]) for e in row.edits] == [
        ("obey", False, "p-"),
        ("note", False, "p-"),
    ]
    ids = [e["proposal"] for e in row.edits]
    assert world.target.notices == [
        f"refinement {row.id}: 2 global edits proposed, waiting for the user "
        f"(prime-agent harness accept {ids[0]} / {ids[1]})"
    ]
    assert world.target.changed == 0
    assert await _global_heads(world) == {"note": (1, "hi", False)}
    proposals = await world.read(lambda con: select_proposals(con, limit=5))
    assert {(p.source, p.refinement_id, p.session_id, p.proposer, p.status) for p in proposals} == {
        ("refine", row.id, world.target.session_id, world.target.root_id, "pending")
    }

    _, written = await world.store.transaction(lambda con: accept_proposal(con, ids[0]))
    assert (written.source, written.refinement_id, written.version) == ("refine", row.id, 1)
    marked = await world.row(row.id)
    versions = [
        (e["applied"], e.get("before_version"), e.get("after_version")) for e in marked.edits
    ]
    assert versions == [(True, None, 1), (False, None, None)]
    back = await world.refiner.rollback(row.id, session_id=None, source="user")
    assert [(e["id"], e["applied"]) for e in back.edits] == [("obey", True)]
    assert await _global_heads(world) == {"obey": (2, "obey", True), "note": (1, "hi", False)}

    world.target.noticed.clear()
    asked = await world.refiner.request(
        world.target, instructions=None, scope="global", trigger=USER_TRIGGER
    )
    await asyncio.wait_for(world.target.noticed.wait(), WAIT_S)
    direct = await world.row(asked["id"])
    assert [(e["id"], e["applied"]) for e in direct.edits] == [("obey", True), ("note", True)]
    assert await _global_heads(world) == {"obey": (3, "obey", False), "note": (2, "changed", False)}


async def test_a_boundary_of_a_session_without_refinements_reads_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every turn of every session crosses a boundary. The refiner learns once which sessions
    have refinement rows (one side read: it does not force the step's rows into the tables);
    a boundary of any other session then costs no round trip to the store at all."""
    calls: list[str] = []
    read, transaction = world.store.read_side, world.store.transaction

    async def counted_read(fn: Any) -> Any:
        calls.append("read")
        return await read(fn)

    async def counted_transaction(fn: Any) -> Any:
        calls.append("transaction")
        return await transaction(fn)

    monkeypatch.setattr(world.store, "read_side", counted_read)
    monkeypatch.setattr(world.store, "transaction", counted_transaction)
    await world.turn_end()
    assert await world.refiner.at_boundary(world.target) == []
    await world.turn_end()
    assert await world.refiner.at_boundary(world.target) == []
    assert calls == ["read"]  # the index's first query, nothing per boundary
