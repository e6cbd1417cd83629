"""A failed turn never kills its session; runaway loops stop (docs/agent-loop.md).

In process, with the real orchestrator, a real DuckDB file, real local kernels and the scripted
model over real HTTP:

- each model fault (500, a 429 asking for longer than we wait, a garbage body, a cut stream, a
  stall past the idle timeout) ends the turn with typed ``error`` and ``turn_end`` events; the
  session rests ``idle`` and its next message calls the model again, also after an unload and
  a wake from the store (what ``--resume`` and ``send`` do through the daemon);
- a sandbox that exhausts its start backoff is marked failed, the session is not: it stays
  ``idle``, and the next prompt tries the sandbox again;
- the same cell (or a malformed call) ``STUCK_REPEAT_LIMIT`` times in a row: a notice in the
  results first, then the turn stops ``stuck``, after a bounded number of model calls;
- an empty reply is asked for again once; a second one is an error, never an answer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.agent.stuck import STUCK_REPEAT_LIMIT, normalise_code
from orchestrator.errors import EmptyReply
from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.runner import RunOptions, RunResult, run_session
from orchestrator.sessions.supervisor import START_MAX_FAILURES
from orchestrator.settings import Settings
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.integration.test_snapshots import harness, new_session

pytestmark = pytest.mark.timeout(300)

# Short enough that a stalled reply times out quickly; long enough for a cold first call.
IDLE_TIMEOUT_S: Final = 3.0
SETTINGS: Final = Settings(
    retry_base_delay_s=0.01,
    model_max_retries=1,
    model_stream_idle_timeout_s=IDLE_TIMEOUT_S,
    cell_timeout_s=60.0,
    snapshot_debounce_s=0.05,
)
ATTEMPTS: Final = SETTINGS.model_max_retries + 1
STALL_S: Final = 60  # a reply that never comes within the test (closing the server ends it)
BACKOFF_S: Final = 0.05

# fault directive -> the error class the failed turn records, and the model calls it costs
FAULTS: Final = {
    "500": ("500", "server_error", ATTEMPTS),
    "429": ("429 retry-after=3600", "rate_limited", 1),  # longer than we wait: no retry
    "garbage": ("garbage", "bad_response", ATTEMPTS),
    "cut": ("text: partial words here\n        cut 2", "stream_cut", ATTEMPTS),
    "stall": (f"slow {STALL_S}", "timeout", ATTEMPTS),
}


def _fault_script(step: str) -> str:
    return f"""
repeat forever:
    when "FAULT-NOW":
        {step}
    when "next please": text: back again
    when "after the wake": text: awake and well
"""


def _turn_ends(events: list[Any]) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.type == "turn_end"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_failed_turn_leaves_the_session_ready_for_the_next_message(fault: str) -> None:
    step, error_class, calls = FAULTS[fault]
    async with harness(_fault_script(step), settings=SETTINGS) as h:
        live = await new_session(h, eager=False)
        live = await h.prompt(live, "FAULT-NOW")
        events = await h.events(live)
        assert _turn_ends(events)[-1] == {"reason": "error", "error_class": error_class}
        error = [e.payload for e in events if e.type == "error"][-1]
        assert error["kind"] == "model" and error["error_class"] == error_class
        assert len(h.srv.requests) == calls
        assert live.state == "idle"
        row = await h.store.get_session(live.id)
        assert row is not None and row.status == "idle"

        # The next message starts a turn whose model call happens.
        live = await h.prompt(live, "next please")
        assert len(h.srv.requests) == calls + 1
        assert h.srv.requests[-1]["messages"][-1]["content"] == "next please"
        assert _turn_ends(await h.events(live))[-1] == {"reason": "completed", "error_class": None}

        # Out of memory and woken from the store (--resume / send through the daemon).
        live = await h.prompt(live, "FAULT-NOW")
        assert _turn_ends(await h.events(live))[-1]["reason"] == "error"
        await h.orch.unload(live)
        live = await h.prompt(live, "after the wake")
        assert h.srv.requests[-1]["messages"][-1]["content"] == "after the wake"
        assert _turn_ends(await h.events(live))[-1]["reason"] == "completed"
        assert live.state == "idle"


SANDBOX_SCRIPT: Final = """
repeat forever:
    when "PLEASE-RUN": code: print("hi")
    when "tries again after": code: print("hi")
    when "the sandbox is marked failed": text: giving up
    when "marked failed": code: print('hi')
    when re "^hi$": text: done
    else: text: noted
"""


async def test_an_exhausted_start_backoff_fails_the_sandbox_not_the_session() -> None:
    backend = LocalBackend(pool_size=0, python="/bin/false")  # a real start that fails
    async with harness(SANDBOX_SCRIPT, settings=SETTINGS, backend=backend) as h:
        h.orch.sandboxes.backoff_base_s = BACKOFF_S
        live = await new_session(h, eager=False)
        live = await h.prompt(live, "PLEASE-RUN")
        results = [r["status"] for r in await h.tool_results(live)]
        assert results == ["sandbox_error"] * (START_MAX_FAILURES + 1)
        failure = h.orch.sandboxes.failure(live.id)
        assert failure is not None and failure["failures"] == START_MAX_FAILURES
        assert live.state == "idle"  # the sandbox failed; the session did not
        row = await h.store.get_session(live.id)
        assert row is not None and row.status == "idle"
        # A message that runs no cell is a normal turn meanwhile.
        live = await h.prompt(live, "just talk")
        assert _turn_ends(await h.events(live))[-1]["reason"] == "completed"

        backend.python = sys.executable  # the cause is fixed: the next prompt tries again
        live = await h.prompt(live, "PLEASE-RUN again")
        last = (await h.tool_results(live))[-1]
        assert last["status"] == "ok" and last["text"] == "hi"
        assert h.orch.sandboxes.failure(live.id) is None
        assert live.state == "idle"


async def _run(
    script: str, settings: Settings = SETTINGS
) -> tuple[RunResult, list[tuple[str, dict[str, Any]]], FakeModelServer]:
    paths = Paths.from_env()
    with FakeModelServer(script) as srv:
        model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
        result = await run_session(
            RunOptions(task="go", cwd=Path.cwd(), backend="local"), model, settings, paths
        )
    store = await Store.open(paths.database_file, read_only=True)
    try:
        events = [(e.type, e.payload) for e in await store.events(result.session_id)]
        row = await store.get_session(result.session_id)
    finally:
        await store.close()
    assert row is not None and row.status == (
        "completed" if result.outcome.reason == "completed" else "inactive"
    )
    return result, events, srv


# Spacing at the ends does not make a cell new (normalise_code).
SAME_CELL: Final = """
repeat forever:
    code: print('again')
    ---
    code:
        print('again')

"""


async def test_identical_cells_get_a_notice_then_the_turn_stops_stuck() -> None:
    result, events, srv = await _run(SAME_CELL)
    assert result.outcome.reason == "stuck"
    assert len(srv.requests) == STUCK_REPEAT_LIMIT  # bounded: no more model calls
    results = [p for t, p in events if t == "tool_result"]
    assert len(results) == STUCK_REPEAT_LIMIT
    assert results[0]["text"] == "again"  # the first one is just run
    for n, shown in enumerate(results[1:-1], start=2):
        assert shown["text"].startswith(f"[notice] {n} identical cells in a row")
        assert shown["text"].endswith("again") and shown["status"] == "ok"
    assert results[-1]["status"] == "stuck" and "not run" in results[-1]["text"]
    types = [t for t, _ in events]
    assert types[-3:] == ["error", "turn_end", "run_end"]
    assert events[-3][1]["kind"] == "stuck"
    assert events[-2][1]["reason"] == "stuck" and events[-1][1]["reason"] == "stuck"
    assert normalise_code("\n print(1)  \r\n\n") == " print(1)"


async def test_repeated_malformed_calls_stop_stuck() -> None:
    result, events, srv = await _run("repeat forever:\n    bad-tool-json")
    assert result.outcome.reason == "stuck"
    assert len(srv.requests) == STUCK_REPEAT_LIMIT
    results = [p for t, p in events if t == "tool_result"]
    assert [r["status"] for r in results] == ["invalid_arguments"] * (STUCK_REPEAT_LIMIT - 1) + [
        "stuck"
    ]
    assert "malformed tool calls in a row" in results[-2]["text"]


async def test_a_different_cell_resets_the_count() -> None:
    script = """
    code: print(1)
    ---
    code: print(1)
    ---
    code: print(1)
    ---
    code: print(2)
    ---
    code: print(2)
    ---
    text: finished
    """
    result, events, _ = await _run(script)
    assert result.outcome.reason == "completed" and result.outcome.final_text == "finished"
    texts = [p["text"] for t, p in events if t == "tool_result"]
    assert texts[3] == "2" and texts[4].startswith("[notice] 2 identical cells in a row")


async def test_an_empty_reply_is_retried_once() -> None:
    result, events, srv = await _run("empty\n---\ntext: the real answer")
    assert result.outcome.reason == "completed"
    assert result.outcome.final_text == "the real answer"
    assert len(srv.requests) == 2
    retry = next(p for t, p in events if t == "retry")
    assert "empty reply" in retry["reason"]
    replies = [p["text"] for t, p in events if t == "assistant_message"]
    assert replies == ["the real answer"]  # the empty one is not in the history


async def test_two_empty_replies_are_an_error_not_an_answer() -> None:
    result, events, srv = await _run("repeat forever:\n    empty")
    assert result.outcome.reason == "error"
    assert isinstance(result.outcome.error, EmptyReply)
    assert len(srv.requests) == 2
    assert not [p for t, p in events if t == "assistant_message"]
    ended = next(p for t, p in events if t == "turn_end")
    assert ended == {"reason": "error", "error_class": "empty_reply"}
    usage = [p for t, p in events if t == "usage"]
    assert len(usage) == 2  # both calls are accounted
