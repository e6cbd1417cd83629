"""Autonomous decisions (orchestrator/control/autonomous.py) over a real Store, with a sandbox
double that answers each gate cell with a scripted report line (what the kernel would print),
and the gate report parsing of orchestrator/control/gates.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel, ValidationError

from orchestrator.cli import common
from orchestrator.control import autonomous as module
from orchestrator.control.autonomous import (
    AUTONOMOUS_MAX_TOKENS,
    AUTONOMOUS_MAX_TURNS,
    AUTONOMOUS_TIMEOUT_MS,
    CONTINUATION_PROMPT,
    EXIT_CODES,
    EXIT_GATE_FAILED,
    EXIT_TIME_LIMIT,
    EXIT_TOKEN_LIMIT,
    EXIT_TURN_LIMIT,
    GATE_COMMAND_MAX_CHARS,
    GATE_TIMEOUT_S,
    MAX_GATES,
    STOP_REASONS,
    AutonomousPolicy,
    Autonomy,
    Continue,
    Stop,
    exit_code_for,
)
from orchestrator.control.gates import GATE_REPORT_MARKER, parse_gate_report, run_gate
from orchestrator.control.workspace_hash import GATE_OUTPUT_MAX_CHARS
from orchestrator.errors import SandboxError, SandboxStartError
from orchestrator.ids import new_session_id
from orchestrator.sandbox.base import CellError, CellResult, Sandbox
from orchestrator.store.autonomy import AutonomyRow, select_autonomy, turn_tokens
from orchestrator.store.db import Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    EventType,
    NoticePayload,
    TurnEndPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.queries import SessionRecord

DOCS = Path(__file__).resolve().parents[2] / "docs" / "control.md"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
GATE = "pytest -q"


# --- doubles ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def report(exit_code: int | None, output: str = "", *, timed_out: bool = False) -> dict[str, Any]:
    """What the gate cell prints after its marker (gates.py ``_KERNEL_SOURCE``)."""
    return {
        "exit_code": exit_code,
        "timed_out": timed_out,
        "error": None,
        "head": output,
        "tail": "",
        "missing": 0,
        "dropped_bytes": 0,
        "duration_ms": 12.5,
    }


class ScriptedSandbox(Sandbox):
    """Answers each gate cell with the next scripted report (or cell result)."""

    def __init__(self, script: list[dict[str, Any] | CellResult] | None = None) -> None:
        self.script = list(script or [])
        self.cells: list[str] = []

    async def execute(
        self, code: str, *, timeout_s: float, cell_id: str, on_output: Any = None
    ) -> CellResult:
        self.cells.append(code)
        item = self.script.pop(0)
        if isinstance(item, CellResult):
            return item
        return CellResult(status="ok", stdout="\n" + GATE_REPORT_MARKER + json.dumps(item) + "\n")

    async def interrupt(self) -> None:
        return None

    async def restart_kernel(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def is_alive(self) -> bool:
        return True


@dataclass
class Target:
    """The live session as ``Autonomy.after_turn`` sees it."""

    store: Store
    session_id: str
    box: ScriptedSandbox
    workspace: Path | None
    cwd: str = "/kernel/workspace"
    sandbox_error: SandboxError | None = None
    recorded: list[str] = field(default_factory=list)

    async def sandbox(self) -> Sandbox:
        if self.sandbox_error is not None:
            raise self.sandbox_error
        return self.box

    async def record(self, type_: EventType, payload: BaseModel) -> Any:
        self.recorded.append(type_)
        return await self.store.append(self.session_id, type_, payload)

    def workspace_dir(self) -> Path | None:
        return self.workspace


# --- fixtures --------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "db" / "prime-agent.duckdb") as opened:
        yield opened


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return root


async def new_session(store: Store, tmp_path: Path) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd=str(tmp_path), model="openai/fake", backend="local")
    )
    return sid


async def play_turn(
    store: Store,
    sid: str,
    *,
    input: int = 100,
    output: int = 20,
    cache_read: int = 0,
    cache_write: int = 0,
    reason: str = "completed",
    refine_tokens: int = 0,
) -> None:
    """One turn's events as the agent loop records them, ending with ``turn_end``."""
    await store.append(sid, "user_message", UserMessagePayload(text="work"))
    usage = UsagePayload(
        provider="fake",
        model="fake",
        input=input,
        output=output,
        cache_read=cache_read,
        cache_write=cache_write,
    )
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(text="done", provider="fake", model="fake", usage=usage),
    )
    await store.append(sid, "usage", usage)
    if refine_tokens:
        planning = UsagePayload(
            provider="fake", model="fake", input=refine_tokens, purpose="refine"
        )
        await store.append(sid, "usage", planning)
    await store.append(sid, "turn_end", TurnEndPayload(reason=reason))


async def events_of(store: Store, sid: str, type_: str) -> list[dict[str, Any]]:
    return [event.payload for event in await store.events(sid) if event.type == type_]


async def setup(
    store: Store,
    tmp_path: Path,
    clock: Clock,
    policy: AutonomousPolicy,
    *,
    script: list[dict[str, Any] | CellResult] | None = None,
    workspace: Path | None = None,
) -> tuple[Autonomy, Target]:
    sid = await new_session(store, tmp_path)
    autonomy = Autonomy(store, clock=clock)
    await autonomy.enable(sid, policy)
    return autonomy, Target(store, sid, ScriptedSandbox(script), workspace)


# --- policy and constants ----------------------------------------------------------------------


def test_policy_defaults_are_the_spec_limits() -> None:
    policy = AutonomousPolicy()
    assert policy.gates == []
    assert policy.max_turns == AUTONOMOUS_MAX_TURNS == 12
    assert policy.max_tokens == AUTONOMOUS_MAX_TOKENS == 80_000
    assert policy.timeout_ms == AUTONOMOUS_TIMEOUT_MS == 30 * 60 * 1000
    assert policy.gate_timeout_s == GATE_TIMEOUT_S == 300
    assert policy.continuation_prompt is None


def test_policy_round_trips_through_json() -> None:
    policy = AutonomousPolicy(gates=["pytest -q", "ruff check ."], max_turns=3, gate_timeout_s=5)
    again = AutonomousPolicy.model_validate(json.loads(json.dumps(policy.model_dump(mode="json"))))
    assert again == policy


@pytest.mark.parametrize(
    "fields",
    [
        {"gates": [""]},
        {"gates": ["   "]},
        {"gates": ["x" * (GATE_COMMAND_MAX_CHARS + 1)]},
        {"gates": ["echo \0"]},
        {"gates": ["pytest", "pytest"]},
        {"gates": [f"true {i}" for i in range(MAX_GATES + 1)]},
        {"gates": "pytest"},
        {"max_turns": 0},
        {"max_turns": "12"},
        {"max_turns": 1.5},
        {"max_tokens": 0},
        {"timeout_ms": -1},
        {"gate_timeout_s": 0},
        {"gate_timeout_s": "5"},
        {"continuation_prompt": "  "},
        {"unknown": 1},
    ],
)
def test_policy_rejects(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        AutonomousPolicy.model_validate(fields)


def test_policy_is_frozen() -> None:
    with pytest.raises(ValidationError):
        AutonomousPolicy().max_turns = 3  # type: ignore[misc]


def test_exit_codes_match_docs_and_cli() -> None:
    assert set(EXIT_CODES) == set(STOP_REASONS)
    table = dict(re.findall(r"^\| `(\w+)`[^|]*\| (\d+)", DOCS.read_text(), flags=re.M))
    assert {reason: int(code) for reason, code in table.items()} == dict(EXIT_CODES)
    assert (EXIT_TURN_LIMIT, EXIT_TOKEN_LIMIT, EXIT_TIME_LIMIT, EXIT_GATE_FAILED) == (3, 4, 5, 6)
    assert EXIT_CODES["gate_passed"] == common.EXIT_OK
    assert EXIT_CODES["model_error"] == common.EXIT_ERROR
    assert EXIT_CODES["aborted"] == common.EXIT_ABORTED
    assert EXIT_CODES["stuck"] == common.EXIT_STUCK
    limits = [
        "turn_limit",
        "token_limit",
        "time_limit",
        "gate_failed",
        "model_error",
        "stuck",
        "aborted",
    ]
    codes = [EXIT_CODES[reason] for reason in limits]  # type: ignore[index]
    assert len(set(codes)) == len(codes) and common.EXIT_USAGE not in codes
    assert exit_code_for("turn_limit") == 3
    assert exit_code_for("no such reason") == common.EXIT_ERROR
    assert Stop("gate_failed").exit_code == EXIT_GATE_FAILED


def test_public_surface() -> None:
    for name in module.__all__:
        assert hasattr(module, name), name


# --- not autonomous --------------------------------------------------------------------------


async def test_no_row_or_disabled_means_no_decision(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    sid = await new_session(store, tmp_path)
    autonomy = Autonomy(store, clock=clock)
    target = Target(store, sid, ScriptedSandbox(), None)
    await play_turn(store, sid)
    assert await autonomy.after_turn(target, "completed") is None
    await autonomy.enable(sid, AutonomousPolicy())
    row = await autonomy.disable(sid)
    assert row is not None and row.enabled is False
    assert await autonomy.after_turn(target, "completed") is None
    stored = await autonomy.get(sid)
    assert stored is not None and stored.turns_used == 0


async def test_enable_starts_a_fresh_run(store: Store, tmp_path: Path, clock: Clock) -> None:
    autonomy, target = await setup(store, tmp_path, clock, AutonomousPolicy(max_turns=1))
    await play_turn(store, target.session_id)
    assert isinstance(await autonomy.after_turn(target, "completed"), Stop)
    clock.advance(minutes=5)
    row = await autonomy.enable(target.session_id, AutonomousPolicy(max_turns=2))
    stored = await autonomy.get(target.session_id)
    assert stored == row
    assert (stored.turns_used, stored.tokens_used, stored.stop_reason) == (0, 0, None)
    assert stored.started_at == clock.now and stored.gate_state == {}
    await play_turn(store, target.session_id)
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)


# --- without gates ---------------------------------------------------------------------------


async def test_without_gates_it_continues_until_the_turn_limit(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    autonomy, target = await setup(store, tmp_path, clock, AutonomousPolicy(max_turns=3))
    sid = target.session_id
    for turn in (1, 2):
        await play_turn(store, sid)
        decision = await autonomy.after_turn(target, "completed")
        assert isinstance(decision, Continue)
        assert decision.text.startswith(CONTINUATION_PROMPT)
        assert f"turn {turn} of 3" in decision.text
    await play_turn(store, sid)
    decision = await autonomy.after_turn(target, "completed")
    assert decision == Stop("turn_limit", "3 of 3 turns used")
    assert decision.exit_code == EXIT_TURN_LIMIT
    row = await autonomy.get(sid)
    assert row is not None
    assert (row.turns_used, row.tokens_used, row.continuations_used) == (3, 360, 2)
    assert (row.stop_reason, row.stopped_at) == ("turn_limit", clock.now)
    [stop] = await events_of(store, sid, "autonomous_stop")
    assert stop["reason"] == "turn_limit" and stop["turns"] == 3 and stop["tokens"] == 360
    assert stop["gates"] == [] and stop["children"] == {}
    assert (await store.events(sid))[-1].type == "autonomous_stop"
    # Stopped: later turns are not counted and decide nothing.
    await play_turn(store, sid)
    assert await autonomy.after_turn(target, "completed") is None
    assert (await autonomy.get(sid)) == row


async def test_custom_continuation_prompt(store: Store, tmp_path: Path, clock: Clock) -> None:
    policy = AutonomousPolicy(continuation_prompt="Keep going, verify with the tests.")
    autonomy, target = await setup(store, tmp_path, clock, policy)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Continue)
    assert decision.text.startswith("Keep going, verify with the tests.")


async def test_token_limit_counts_input_output_and_cache_write(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    autonomy, target = await setup(store, tmp_path, clock, AutonomousPolicy(max_tokens=1000))
    sid = target.session_id
    # 300 + 100 + 50 = 450 (cache reads and the refiner's planning call are not counted)
    await play_turn(
        store, sid, input=300, output=100, cache_read=5000, cache_write=50, refine_tokens=9999
    )
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    row = await autonomy.get(sid)
    assert row is not None and row.tokens_used == 450
    await play_turn(store, sid, input=500, output=50, cache_write=0)
    decision = await autonomy.after_turn(target, "completed")
    assert decision == Stop("token_limit", "1,000 of 1,000 tokens used")
    assert isinstance(decision, Stop) and decision.exit_code == EXIT_TOKEN_LIMIT
    [stop] = await events_of(store, sid, "autonomous_stop")
    assert stop["tokens"] == 1000 and stop["turns"] == 2


async def test_time_limit_reads_the_clock(store: Store, tmp_path: Path, clock: Clock) -> None:
    autonomy, target = await setup(store, tmp_path, clock, AutonomousPolicy(timeout_ms=60_000))
    await play_turn(store, target.session_id)
    clock.advance(seconds=59)
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    clock.advance(seconds=2)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Stop) and decision.reason == "time_limit"
    assert decision.exit_code == EXIT_TIME_LIMIT
    [stop] = await events_of(store, target.session_id, "autonomous_stop")
    assert stop["elapsed_s"] == 61.0


async def test_limits_are_checked_turns_then_tokens_then_time(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    policy = AutonomousPolicy(max_turns=1, max_tokens=1, timeout_ms=1)
    autonomy, target = await setup(store, tmp_path, clock, policy)
    clock.advance(seconds=10)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Stop) and decision.reason == "turn_limit"
    policy = AutonomousPolicy(max_turns=5, max_tokens=1, timeout_ms=1)
    autonomy, target = await setup(store, tmp_path, clock, policy)
    clock.advance(seconds=10)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Stop) and decision.reason == "token_limit"


@pytest.mark.parametrize(
    ("outcome", "reason", "code"),
    [
        ("error", "model_error", 1),
        ("budget_exceeded", "model_error", 1),
        ("compaction_failed", "model_error", 1),
        ("aborted", "aborted", 130),
    ],
)
async def test_a_failed_turn_stops_the_run(
    store: Store, tmp_path: Path, clock: Clock, outcome: str, reason: str, code: int
) -> None:
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(store, tmp_path, clock, policy)
    await play_turn(store, target.session_id, reason=outcome)
    decision = await autonomy.after_turn(target, outcome)
    assert isinstance(decision, Stop)
    assert (decision.reason, decision.exit_code) == (reason, code)
    assert target.box.cells == []  # gates do not run after a failed turn
    [stop] = await events_of(store, target.session_id, "autonomous_stop")
    assert stop["reason"] == reason and stop["turns"] == 1
    assert stop["gates"] == [
        {"command": GATE, "status": "not_run", "attempts": 0, "exit_code": None}
    ]


@pytest.mark.parametrize(("gate_exit", "reason", "code"), [(0, "gate_passed", 0), (1, "stuck", 7)])
async def test_a_stuck_turn_runs_the_gates_once_and_stops(
    store: Store, tmp_path: Path, clock: Clock, gate_exit: int, reason: str, code: int
) -> None:
    # A small model fixed the file, then kept quoting its fix until the guard stopped the
    # turn: the gates say whether the work is done; a stuck run never continues.
    script: list[dict[str, Any] | CellResult] = [report(gate_exit, "output")]
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    await play_turn(store, target.session_id, reason="stuck")
    decision = await autonomy.after_turn(target, "stuck")
    assert isinstance(decision, Stop)
    assert (decision.reason, decision.exit_code) == (reason, code)
    assert len(target.box.cells) == 1
    [stop] = await events_of(store, target.session_id, "autonomous_stop")
    assert stop["reason"] == reason


async def test_a_stuck_turn_without_gates_stops_stuck(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    autonomy, target = await setup(store, tmp_path, clock, AutonomousPolicy())
    await play_turn(store, target.session_id, reason="stuck")
    decision = await autonomy.after_turn(target, "stuck")
    assert isinstance(decision, Stop) and decision.reason == "stuck"


# --- gates -----------------------------------------------------------------------------------


async def test_scripted_agent_fixes_a_failing_gate_on_the_second_try(
    store: Store, tmp_path: Path, clock: Clock, workspace: Path
) -> None:
    failure = "F\n    assert add(2, 2) == 4\nE   assert 0 == 4\n1 failed in 0.01s\n"
    script: list[dict[str, Any] | CellResult] = [report(1, failure), report(0, "1 passed")]
    policy = AutonomousPolicy(gates=[GATE], gate_timeout_s=30)
    autonomy, target = await setup(
        store, tmp_path, clock, policy, script=script, workspace=workspace
    )
    sid = target.session_id

    await play_turn(store, sid, input=1000, output=200)
    first = await autonomy.after_turn(target, "completed")
    assert isinstance(first, Continue)
    assert "attempt 1" in first.text and f"`{GATE}`" in first.text
    assert "exited with 1" in first.text and "assert 0 == 4" in first.text
    assert "/kernel/workspace" in target.box.cells[0]  # the gate runs in the kernel's cwd

    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")  # the agent's fix
    await play_turn(store, sid, input=1500, output=300)
    second = await autonomy.after_turn(target, "completed")
    assert second == Stop("gate_passed", "1 gate passed")
    assert isinstance(second, Stop) and second.exit_code == 0

    results = await events_of(store, sid, "gate_result")
    assert [(r["passed"], r["exit_code"], r["attempt"], r["skipped"]) for r in results] == [
        (False, 1, 1, False),
        (True, 0, 2, False),
    ]
    assert results[0]["output"] == failure and results[0]["workspace_hash"]
    assert results[1]["duration_ms"] == 12.5
    [stop] = await events_of(store, sid, "autonomous_stop")
    assert stop["reason"] == "gate_passed" and stop["turns"] == 2 and stop["tokens"] == 3000
    assert stop["gates"] == [{"command": GATE, "status": "passed", "attempts": 2, "exit_code": 0}]
    assert target.recorded == ["gate_result", "gate_result", "autonomous_stop"]
    row = await autonomy.get(sid)
    assert row is not None
    assert (row.turns_used, row.tokens_used, row.continuations_used) == (2, 3000, 1)
    assert row.gate_state == {GATE: {"attempts": 0, "last_exit": 0, "failed_hash": None}}


async def test_unchanged_workspace_skips_the_failed_gate(
    store: Store, tmp_path: Path, clock: Clock, workspace: Path
) -> None:
    script: list[dict[str, Any] | CellResult] = [report(1, "boom"), report(0, "ok")]
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(
        store, tmp_path, clock, policy, script=script, workspace=workspace
    )
    sid = target.session_id
    await play_turn(store, sid)
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    assert len(target.box.cells) == 1

    # The agent changed nothing (a touch does not count): the gate is not run again.
    (workspace / "calc.py").touch()
    await play_turn(store, sid)
    skipped = await autonomy.after_turn(target, "completed")
    assert isinstance(skipped, Continue)
    assert "not run again" in skipped.text and "has not changed" in skipped.text
    assert "exit 1" in skipped.text and "attempt 2" in skipped.text
    assert len(target.box.cells) == 1
    results = await events_of(store, sid, "gate_result")
    assert results[-1]["skipped"] is True and results[-1]["passed"] is False
    assert results[-1]["exit_code"] is None and results[-1]["attempt"] == 2
    assert results[-1]["workspace_hash"] == results[0]["workspace_hash"]

    # A change: it runs again.
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    await play_turn(store, sid)
    assert await autonomy.after_turn(target, "completed") == Stop("gate_passed", "1 gate passed")
    assert len(target.box.cells) == 2
    assert [r["attempt"] for r in await events_of(store, sid, "gate_result")] == [1, 2, 3]


async def test_without_a_workspace_dir_a_failed_gate_always_runs_again(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    script: list[dict[str, Any] | CellResult] = [report(2, "a"), report(2, "a"), report(0)]
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    for _ in range(2):
        await play_turn(store, target.session_id)
        assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    await play_turn(store, target.session_id)
    assert isinstance(await autonomy.after_turn(target, "completed"), Stop)
    assert len(target.box.cells) == 3
    results = await events_of(store, target.session_id, "gate_result")
    assert [r["workspace_hash"] for r in results] == [None, None, None]


async def test_the_first_failure_ends_the_pass(store: Store, tmp_path: Path, clock: Clock) -> None:
    script: list[dict[str, Any] | CellResult] = [report(0), report(1, "lint"), *[report(0)] * 3]
    policy = AutonomousPolicy(gates=["make build", "ruff check .", "pytest"])
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Continue) and "`ruff check .` exited with 1" in decision.text
    assert len(target.box.cells) == 2
    await play_turn(store, target.session_id)
    assert await autonomy.after_turn(target, "completed") == Stop("gate_passed", "3 gates passed")
    assert len(target.box.cells) == 5  # every gate runs again, in order
    [stop] = await events_of(store, target.session_id, "autonomous_stop")
    assert [g["status"] for g in stop["gates"]] == ["passed", "passed", "passed"]


async def test_a_gate_still_failing_at_a_limit_stops_with_gate_failed(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    script: list[dict[str, Any] | CellResult] = [report(1, "x"), report(1, "x")]
    policy = AutonomousPolicy(gates=[GATE, "ruff check ."], max_turns=2)
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    await play_turn(store, target.session_id)
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Stop)
    assert decision.reason == "gate_failed" and decision.exit_code == EXIT_GATE_FAILED
    assert "2 of 2 turns used" in decision.detail and f"`{GATE}` exited with 1" in decision.detail
    [stop] = await events_of(store, target.session_id, "autonomous_stop")
    assert stop["gates"] == [
        {"command": GATE, "status": "failed", "attempts": 2, "exit_code": 1},
        {"command": "ruff check .", "status": "not_run", "attempts": 0, "exit_code": None},
    ]


async def test_gates_that_pass_past_a_limit_still_pass(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    policy = AutonomousPolicy(gates=[GATE], max_tokens=10)
    autonomy, target = await setup(store, tmp_path, clock, policy, script=[report(0)])
    await play_turn(store, target.session_id, input=5000)
    assert await autonomy.after_turn(target, "completed") == Stop("gate_passed", "1 gate passed")


async def test_a_gate_that_timed_out_or_could_not_report_is_a_failure(
    store: Store, tmp_path: Path, clock: Clock
) -> None:
    died = CellResult(
        status="error",
        error=CellError(ename="KernelDied", evalue="the kernel died", traceback="kernel died"),
    )
    script: list[dict[str, Any] | CellResult] = [report(None, "slow", timed_out=True), died]
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Continue) and f"`{GATE}` timed out" in decision.text
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Continue) and "could not run" in decision.text
    assert "kernel died" in decision.text
    results = await events_of(store, target.session_id, "gate_result")
    assert [(r["timed_out"], r["exit_code"]) for r in results] == [(True, None), (False, None)]


async def test_no_sandbox_is_a_failed_gate_that_is_not_held_back(
    store: Store, tmp_path: Path, clock: Clock, workspace: Path
) -> None:
    policy = AutonomousPolicy(gates=[GATE])
    autonomy, target = await setup(
        store, tmp_path, clock, policy, script=[report(0)], workspace=workspace
    )
    target.sandbox_error = SandboxStartError("docker is not running")
    await play_turn(store, target.session_id)
    decision = await autonomy.after_turn(target, "completed")
    assert isinstance(decision, Continue) and "docker is not running" in decision.text
    [result] = await events_of(store, target.session_id, "gate_result")
    assert result["workspace_hash"] is None and result["exit_code"] is None
    # The workspace did not change, but the gate never ran: it is tried again.
    target.sandbox_error = None
    await play_turn(store, target.session_id)
    assert await autonomy.after_turn(target, "completed") == Stop("gate_passed", "1 gate passed")
    assert len(target.box.cells) == 1


async def test_counters_survive_a_restart(store: Store, tmp_path: Path, clock: Clock) -> None:
    script: list[dict[str, Any] | CellResult] = [report(1, "x")]
    path = store.path
    policy = AutonomousPolicy(gates=[GATE], max_turns=2)
    autonomy, target = await setup(store, tmp_path, clock, policy, script=script)
    sid = target.session_id
    await play_turn(store, sid, input=40, output=2)
    assert isinstance(await autonomy.after_turn(target, "completed"), Continue)
    await store.close()

    async with await Store.open(path) as reopened:
        again = Autonomy(reopened, clock=clock)
        row = await again.get(sid)
        assert row is not None and (row.turns_used, row.tokens_used) == (1, 42)
        assert row.gate_state[GATE]["attempts"] == 1 and row.gate_state[GATE]["last_exit"] == 1
        box = ScriptedSandbox([report(1, "x")])
        target = Target(reopened, sid, box, None)
        await play_turn(reopened, sid, input=40, output=2)
        decision = await again.after_turn(target, "completed")
        assert isinstance(decision, Stop) and decision.reason == "gate_failed"
        row = await again.get(sid)
        assert row is not None and (row.turns_used, row.tokens_used) == (2, 84)
        assert row.gate_state[GATE]["attempts"] == 2


# --- store -----------------------------------------------------------------------------------


async def test_turn_tokens_reads_the_last_turn_only(store: Store, tmp_path: Path) -> None:
    sid = await new_session(store, tmp_path)
    assert await store.read(lambda con: turn_tokens(con, sid)) == 0
    await play_turn(store, sid, input=10, output=1)
    assert await store.read(lambda con: turn_tokens(con, sid)) == 11
    await store.append(sid, "notice", NoticePayload(text="between turns"))
    await play_turn(store, sid, input=20, output=2, cache_write=3)
    assert await store.read(lambda con: turn_tokens(con, sid)) == 25


async def test_row_round_trip(store: Store, tmp_path: Path) -> None:
    from orchestrator.store.autonomy import update_autonomy, upsert_autonomy

    sid = await new_session(store, tmp_path)
    row = AutonomyRow(session_id=sid, policy={"gates": ["a"]}, started_at=T0, updated_at=T0)
    await store.transaction(lambda con: upsert_autonomy(con, row))
    assert await store.read(lambda con: select_autonomy(con, sid)) == row
    state = {"a": {"attempts": 1, "last_exit": 2, "failed_hash": "ab"}}
    updated = await store.transaction(
        lambda con: update_autonomy(con, sid, gate_state=state, stop_reason="gate_failed")
    )
    assert updated is not None and updated.gate_state == state
    assert updated.stop_reason == "gate_failed" and updated.stopped
    assert updated.updated_at > T0 and updated.to_wire()["started_at"] == T0.isoformat()
    with pytest.raises(ValueError, match="session_id"):
        await store.transaction(lambda con: update_autonomy(con, sid, session_id="x"))
    assert (
        await store.transaction(lambda con: update_autonomy(con, "nobody", enabled=False)) is None
    )


# --- gate reports ----------------------------------------------------------------------------


def test_parse_gate_report_takes_the_last_report_at_a_line_start() -> None:
    first = json.dumps(report(1))
    last = json.dumps(report(0))
    text = f"noise {GATE_REPORT_MARKER}{first}\n{GATE_REPORT_MARKER}{{broken\n"
    assert parse_gate_report(text) is None
    text += f"{GATE_REPORT_MARKER}{first}\nmore\n{GATE_REPORT_MARKER}{last}\n"
    assert parse_gate_report(text) == report(0)
    assert parse_gate_report(f"{GATE_REPORT_MARKER}[1]") is None


async def test_run_gate_bounds_and_cleans_the_reported_output() -> None:
    big = {
        **report(1),
        "head": "\x1b[31mE\x1b[0m" + "h" * GATE_OUTPUT_MAX_CHARS,
        "tail": "t" * GATE_OUTPUT_MAX_CHARS,
        "missing": 50_000,
        "dropped_bytes": 7,
    }
    gate = await run_gate(ScriptedSandbox([big]), GATE, cwd="/w", timeout_s=5, cell_id="g")
    assert gate.exit_code == 1 and not gate.passed
    assert len(gate.output) <= GATE_OUTPUT_MAX_CHARS
    assert gate.output.startswith("[output over") and "\x1b" not in gate.output
    assert "chars cut" in gate.output and gate.output.rstrip().endswith("t")


async def test_run_gate_reads_the_artifact_when_the_report_line_was_cut(tmp_path: Path) -> None:
    artifact = tmp_path / "cell.txt"
    artifact.write_text(
        f"===== stdout =====\n\n{GATE_REPORT_MARKER}{json.dumps(report(0, 'ok'))}\n"
    )
    cut = CellResult(
        status="ok",
        stdout=f"\n{GATE_REPORT_MARKER}{{...truncated",
        truncated_chars=100,
        artifact_path=artifact,
    )
    gate = await run_gate(ScriptedSandbox([cut]), GATE, cwd="/w", timeout_s=5, cell_id="g")
    assert gate.passed and gate.output == "ok"


async def test_run_gate_survives_an_unusable_sandbox() -> None:
    class Broken(ScriptedSandbox):
        async def execute(
            self, code: str, *, timeout_s: float, cell_id: str, on_output: Any = None
        ) -> CellResult:
            raise SandboxError("the gateway is gone")

    gate = await run_gate(Broken(), GATE, cwd="/w", timeout_s=5, cell_id="g")
    assert gate.exit_code is None and not gate.passed and "the gateway is gone" in gate.output
