"""``prime-agent --mode acp`` driven by the ``agent-client-protocol`` package's own client, as
an editor or an evaluation harness drives it: a real process on stdio, a real daemon, the
scripted model over HTTP (issue 20, docs/acp.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block

from orchestrator.cli.acp_updates import GATE_NOT_RERUN, META_NAMESPACE
from orchestrator.testing import FakeModelServer
from tests.helpers import model_behind_a_daemon

TURN_TIMEOUT_S = 120.0
SCRIPT = """
repeat forever:
    when "spawn one":
        code: h = await rlm("child task", name="helper"); print("spawned", h.name)
    when "spawned":
        text: waiting for the helper
    when "[task from parent]":
        slow 1
        text: child done
    when "compute":
        code:
            print(6 * 7)
    when "42":
        think: The cell printed it.
        text: The answer is 42.
    when "slowly":
        slow 60
        text: too late
    else: text: noted
"""


class _Recorder:
    """The ACP client side: keeps every session/update it is sent, in order."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update.model_dump(by_alias=True, exclude_none=True))
        self.changed.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("session/request_permission")

    def on_connect(self, conn: Any) -> None:
        pass

    async def until(self, predicate: Any) -> None:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            while not predicate(self.updates):
                self.changed.clear()
                await self.changed.wait()


def _ours(update: dict[str, Any]) -> dict[str, Any]:
    return dict((update.get("_meta") or {}).get(META_NAMESPACE) or {})


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with model_behind_a_daemon(monkeypatch, SCRIPT) as srv:
        yield srv


@asynccontextmanager
async def _agent(
    model: FakeModelServer, cwd: Path, *extra: str
) -> AsyncIterator[tuple[Any, _Recorder]]:
    recorder = _Recorder()
    args = ["-m", "orchestrator", "--mode", "acp", "--model", "openai/fake"]
    args += ["--api-base", model.url, *extra]
    async with spawn_agent_process(
        lambda _agent: recorder, sys.executable, *args, env=dict(os.environ), cwd=cwd
    ) as (conn, _process):
        yield conn, recorder


async def test_a_turn_streams_its_cell_and_answer_and_ends_with_the_lifecycle(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with _agent(model, tmp_path) as (conn, seen):
        hello = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        assert hello.agent_info.name == "prime-agent"
        assert hello.agent_capabilities.session_capabilities.close is not None
        session = await conn.new_session(cwd=str(tmp_path))
        with pytest.raises(RequestError):  # one session per connection
            await conn.new_session(cwd=str(tmp_path))
        async with asyncio.timeout(TURN_TIMEOUT_S):
            answer = await conn.prompt(
                session_id=session.session_id, prompt=[text_block("compute")]
            )
        assert answer.stop_reason == "end_turn"
        await seen.until(
            lambda ups: any(_ours(u).get("phase") == "terminalQuiescence" for u in ups)
        )
    kinds = [u["sessionUpdate"] for u in seen.updates]
    call = next(u for u in seen.updates if u["sessionUpdate"] == "tool_call")
    assert (call["kind"], call["status"], call["title"]) == (
        "execute",
        "in_progress",
        "print(6 * 7)",
    )
    assert call["rawInput"] == {"code": "print(6 * 7)"}
    assert call["content"][0]["content"]["text"] == "```python\nprint(6 * 7)\n```"
    done = next(u for u in seen.updates if u["sessionUpdate"] == "tool_call_update")
    assert done["status"] == "completed" and done["toolCallId"] == call["toolCallId"]
    assert done["content"][-1]["content"]["text"].strip() == "42"
    # The answer streamed as the model wrote it (deltas), after the cell's update, and once:
    # no second copy when the stored reply arrives.
    tail = seen.updates[kinds.index("tool_call_update") + 1 :]
    said = [
        u["content"]["text"] for u in seen.updates if u["sessionUpdate"] == "agent_message_chunk"
    ]
    assert "".join(said) == "The answer is 42."
    # Its reasoning came first, as thought chunks, also once.
    thought = [
        u["content"]["text"] for u in seen.updates if u["sessionUpdate"] == "agent_thought_chunk"
    ]
    assert "".join(thought) == "The cell printed it."
    assert kinds.index("agent_thought_chunk") < len(kinds) - kinds[::-1].index(
        "agent_message_chunk"
    )
    assert "".join(
        u["content"]["text"] for u in tail if u["sessionUpdate"] == "agent_message_chunk"
    ) == ("The answer is 42.")
    assert kinds.index("tool_call") < kinds.index("tool_call_update")
    # Every update: the turn that caused it, a strictly increasing sequence, a phase.
    stamps = [_ours(u) for u in seen.updates]
    assert [s["eventSequence"] for s in stamps] == list(range(1, len(stamps) + 1))
    assert {s["promptTurnId"] for s in stamps} == {1}
    phases = [s["phase"] for s in stamps]
    assert phases[-3:] == ["responseBoundary", "event", "terminalQuiescence"]
    boundary, observed, terminal = stamps[-3:]
    assert boundary["outcome"] == "result" and boundary["terminalQuiescenceExpected"] is True
    assert observed["quiescence"] == {
        "outstandingSubagents": 0,
        "remainingAutonomousContinuations": 0,
    }
    assert terminal["outcome"] == "result"


async def test_a_subagent_is_reported_and_the_terminal_update_waits_for_it(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with _agent(model, tmp_path) as (conn, seen):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(tmp_path))
        async with asyncio.timeout(TURN_TIMEOUT_S):
            answer = await conn.prompt(
                session_id=session.session_id, prompt=[text_block("spawn one")]
            )
        assert answer.stop_reason == "end_turn"
        await seen.until(
            lambda ups: any(_ours(u).get("phase") == "terminalQuiescence" for u in ups)
        )
    stamps = [_ours(u) for u in seen.updates]
    subagents = [s["subagents"][0] for s in stamps if "subagents" in s]
    assert subagents[0]["id"].startswith("sub-") and subagents[0]["sessionName"] == "helper"
    assert subagents[0]["status"] == "running" and subagents[-1]["status"] == "done"
    phases = [s["phase"] for s in stamps]
    # The child finished after the root's turn: its "done" comes before the terminal update.
    done_at = max(
        i for i, s in enumerate(stamps) if s.get("subagents", [{}])[0].get("status") == "done"
    )
    assert phases.index("responseBoundary") < phases.index("terminalQuiescence")
    assert done_at < phases.index("terminalQuiescence")


async def test_cancel_stops_the_running_turn(model: FakeModelServer, tmp_path: Path) -> None:
    async with _agent(model, tmp_path) as (conn, _seen):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(tmp_path))
        asked = len(model.requests)
        turn = asyncio.create_task(
            conn.prompt(session_id=session.session_id, prompt=[text_block("answer slowly")])
        )
        async with asyncio.timeout(TURN_TIMEOUT_S):
            while len(model.requests) == asked:  # the slow model call is in flight
                await asyncio.sleep(0.05)
            await conn.cancel(session_id=session.session_id)
            answer = await turn
        assert answer.stop_reason == "cancelled"
        # The session takes the next prompt.
        async with asyncio.timeout(TURN_TIMEOUT_S):
            again = await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
        assert again.stop_reason == "end_turn"
        await conn.close_session(session_id=session.session_id)


AUTONOMOUS_TURNS = 3


async def test_an_autonomous_turn_reports_its_gates_and_counters_in_meta(
    model: FakeModelServer, tmp_path: Path
) -> None:
    """--autonomous with a gate the agent never satisfies: the turn ends at the turn limit
    (max_turn_requests, as Prime Agent says it, though a gate was still failing), and the
    completion and terminal updates carry Prime Agent's ``autonomous`` object: the counters,
    the gate's attempts and how it last failed."""
    gate = ["--autonomous-gate", "test -f never.txt"]
    limits = ["--autonomous-max-turns", str(AUTONOMOUS_TURNS)]
    async with _agent(model, tmp_path, "--autonomous", *gate, *limits) as (conn, seen):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(tmp_path))
        async with asyncio.timeout(TURN_TIMEOUT_S):
            answer = await conn.prompt(
                session_id=session.session_id, prompt=[text_block("keep going")]
            )
        assert answer.stop_reason == "max_turn_requests"
        await seen.until(
            lambda ups: any(_ours(u).get("phase") == "terminalQuiescence" for u in ups)
        )
    closing = [_ours(u) for u in seen.updates if "quiescence" in _ours(u)]
    assert len(closing) == 2  # the completion update and the terminal one
    for ours in closing:
        auto = ours["autonomous"]
        assert auto["enabled"] is True and auto["turnsUsed"] == AUTONOMOUS_TURNS
        assert auto["continuationsUsed"] == AUTONOMOUS_TURNS - 1 and auto["tokensUsed"] > 0
        # The gate failed at every turn (or was not run again on an unchanged workspace).
        assert auto["gateAttempt"] == AUTONOMOUS_TURNS
        assert auto["gateFailure"] in ("exited 1", GATE_NOT_RERUN)
        assert ours["quiescence"]["remainingAutonomousContinuations"] == 0
