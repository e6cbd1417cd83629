# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""Compaction end to end (issue 6): a real nats-server with per-session users, real kernels, the
scripted model over real HTTP, a real DuckDB file. A long session compacts three times and
keeps its turn in flight; the model gets a compacted fact back with ``history.search``; an
overflow compacts and retries once; failed and non-shrinking summaries stop with a typed
reason; ``compact.run`` / ``compact.status`` from the kernel and ``/compact`` between turns;
a 100,000-event session resumes reading only its newest compaction's span."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.agent.loop import TurnOutcome
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.sessions.compaction import compact_session
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import Orchestrator
from orchestrator.sessions.runner import make_backend
from orchestrator.settings import CompactionSettings, ModelConfig, Settings
from orchestrator.store.context_queries import (
    CONTEXT_WINDOW_FIRST_ROWS,
    read_context_path,
)
from orchestrator.store.db import EventRecord, Store
from orchestrator.store.events import UserMessagePayload
from orchestrator.testing import FakeModelServer

MODEL: Final = "openai/fake"
WINDOW: Final = 6000  # tokens: small, so a few 5,000-character cells cross the threshold
RESERVE: Final = 2000
KEEP: Final = 1000
QUIET_TIMEOUT_S: Final = 120.0
BIG_MIB: Final = 20  # one kernel variable over the 16 MiB drop size


def settings(window: int = WINDOW, **changes: Any) -> Settings:
    return Settings(
        models={MODEL: ModelConfig(context_window=window)},
        compaction=CompactionSettings(reserve_tokens=RESERVE, keep_recent_tokens=KEEP),
        retry_base_delay_s=0.01,
        model_max_retries=0,
        cell_timeout_s=60.0,
        **changes,
    )


@contextlib.asynccontextmanager
async def orchestrator(cfg: Settings) -> AsyncIterator[Orchestrator]:
    """An orchestrator with the NATS bus and the host handlers, as print mode builds it."""
    paths = Paths.from_env()
    bus = NatsSessionBus(paths, nats=cfg.nats)
    store = await Store.open(paths.database_file)
    orch = Orchestrator(
        store=store, backend=make_backend("local", cfg), settings=cfg, paths=paths, bus=bus
    )
    try:
        await bus.start(FamilyService(orch).handlers())
        yield orch
    finally:
        await orch.close()
        await bus.close()
        await store.close()


def fake_model(cfg: Settings, srv: FakeModelServer) -> ResolvedModel:
    return resolve_model(MODEL, cfg, api_base=srv.url, env={})


async def turn(orch: Orchestrator, live: LiveSession, text: str) -> TurnOutcome:
    orch.submit(live, Inbound(UserMessagePayload(text=text)))
    await orch.wait_quiet(live.record.root_id, QUIET_TIMEOUT_S)
    assert live.last_outcome is not None
    return live.last_outcome


async def events_of(orch: Orchestrator, live: LiveSession) -> list[EventRecord]:
    return await orch.store.events(live.id)


def is_summary_request(request: dict[str, Any]) -> bool:
    return "Write the notes in Markdown" in str(request["messages"][-1].get("content"))


def assert_pairs_whole(request: dict[str, Any]) -> None:
    """Every tool result follows the call that made it, in the same request."""
    called: set[str] = set()
    for message in request["messages"]:
        for call in message.get("tool_calls") or []:
            called.add(call["id"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in called, "a tool result lost its call"


def step(n: int, extra: str = "") -> str:
    return f'    when "step {n - 1} done":\n        code: {extra}print("step {n} done " + "x" * 5000)\n'


SUMMARY: Final = """
    when "Write the notes in Markdown":
        text:
            ## Goal
            Run the numbered steps.
            ## Progress
            ### Done
            Some steps.
            ## Critical Context
            Nothing else to remember.
"""

STEPS: Final = 7
LONG_SESSION = (
    "repeat forever:\n"
    + SUMMARY
    + '    when "FOUND: the launch code is ZEBRA-7431":\n        text: The launch code is ZEBRA-7431.\n'
    + '    when "What was the launch code":\n        code:\n'
    + '            hits = await history.search("launch code is")\n'
    + '            print("FOUND:", next(h.text for h in hits if h.role == "tool" and "ZEBRA" in h.text).splitlines()[0])\n'
    + '    when "Run the numbered steps":\n'
    + f'        code: big = bytearray({BIG_MIB} * 2**20); small = [1, 2, 3]; print("the launch code is ZEBRA-7431"); print("step 1 done " + "x" * 5000)\n'
    + "".join(step(n) for n in range(2, STEPS + 1))
    + f'    when "step {STEPS} done":\n        code: print("kernel:", "big" in globals(), small)\n'
    + '    when "kernel: ":\n        text: all steps done\n'
)


async def test_a_long_session_compacts_three_times_and_finds_a_compacted_fact() -> None:
    cfg = settings()
    async with orchestrator(cfg) as orch:
        with FakeModelServer(LONG_SESSION) as srv:
            live = await orch.create_session(
                model=fake_model(cfg, srv), cwd=Path.cwd(), name="long"
            )
            first = await turn(orch, live, "Run the numbered steps, please.")
            assert first.reason == "completed" and first.final_text == "all steps done"
            second = await turn(orch, live, "What was the launch code?")
            requests = list(srv.requests)
        events = await events_of(orch, live)
    assert second.reason == "completed"
    assert second.final_text == "The launch code is ZEBRA-7431."

    compactions = [e for e in events if e.type == "compaction"]
    assert len(compactions) == 3, [e.payload["reason"] for e in compactions]
    assert all(c.payload["reason"] == "threshold" for c in compactions)
    prompt = next(e for e in events if e.type == "user_message")
    summaries = [i for i, r in enumerate(requests) if is_summary_request(r)]
    assert len(summaries) == 3
    for index, compaction in zip(summaries, compactions, strict=True):
        after = requests[index + 1]["messages"]
        assert after[1]["content"].startswith("[context summary]")
        assert "Run the numbered steps" in after[1]["content"]  # the summary text
        # the turn in flight stays verbatim right after the summary (or in the kept span)
        assert {"role": "user", "content": "Run the numbered steps, please."} in after
        assert compaction.payload["tokens_after"] < compaction.payload["tokens_before"]
        pinned = compaction.payload["pinned_event_id"]
        assert pinned in (prompt.id, None)
    for request in requests:
        assert_pairs_whole(request)
    # later summaries update the earlier notes
    assert "<previous-notes>" in requests[summaries[1]]["messages"][-1]["content"]

    # kernel memory: the 20 MiB variable was dropped at the first compaction, the model was told
    first_note = compactions[0].payload["kernel_note"]
    assert "Dropped" in first_note and "big (bytearray" in first_note and "small" in first_note
    kernel_result = next(
        e for e in events if e.type == "tool_result" and "kernel:" in e.payload["text"]
    )
    assert kernel_result.payload["text"].strip() == "kernel: False [1, 2, 3]"

    # the fact was only in compacted history when the question came
    question = next(
        r for r in requests if r["messages"][-1].get("content") == "What was the launch code?"
    )
    assert "ZEBRA-7431" not in json.dumps(question["messages"])
    answer_request = requests[-1]
    assert "FOUND: the launch code is ZEBRA-7431" in answer_request["messages"][-1]["content"]


OVERFLOW_HEAD: Final = """
code: print("a " + "x" * 2000)
---
code: print("b " + "x" * 2000)
---
overflow
---
"""


@pytest.mark.parametrize("retry", ["text: recovered", "overflow"])
async def test_an_overflow_compacts_and_retries_exactly_once(retry: str) -> None:
    cfg = settings(window=100_000)
    script = (
        OVERFLOW_HEAD
        + SUMMARY.replace("    when", "when", 1).replace("\n        ", "\n    ")
        + f"---\n{retry}\n---\ntext: never reached\n"
    )
    async with orchestrator(cfg) as orch:
        with FakeModelServer(script) as srv:
            live = await orch.create_session(model=fake_model(cfg, srv), cwd=Path.cwd(), name="o")
            outcome = await turn(orch, live, "go")
            requests = list(srv.requests)
        events = await events_of(orch, live)
    assert len(requests) == 5  # two cells, the overflow, the summary, ONE retry
    assert is_summary_request(requests[3])
    assert requests[4]["messages"][1]["content"].startswith("[context summary]")
    assert requests[4]["messages"][2] == {"role": "user", "content": "go"}
    compaction = next(e for e in events if e.type == "compaction")
    assert compaction.payload["reason"] == "overflow"
    if retry.startswith("text"):
        assert outcome.reason == "completed" and outcome.final_text == "recovered"
    else:
        assert outcome.reason == "error"
        error = [e for e in events if e.type == "error"][-1]
        assert error.payload["kind"] == "context_overflow"


@pytest.mark.parametrize(
    ("summary_step", "why"),
    [
        ("500 the summariser is down", "summary_failed"),
        # longer than what it replaces (varied words: litellm stops a stream that repeats)
        ("text: " + " ".join(f"note{i}" for i in range(6000)), "no_progress"),
    ],
)
async def test_a_failed_or_useless_summary_stops_the_turn_with_a_typed_reason(
    summary_step: str, why: str
) -> None:
    cfg = settings(window=100_000)
    script = OVERFLOW_HEAD + f"{summary_step}\n---\ntext: never reached\n"
    async with orchestrator(cfg) as orch:
        with FakeModelServer(script) as srv:
            live = await orch.create_session(model=fake_model(cfg, srv), cwd=Path.cwd(), name="f")
            outcome = await turn(orch, live, "go")
            served = srv.served
        events = await events_of(orch, live)
    assert outcome.reason == "compaction_failed"
    assert served == 4  # no retry, no loop
    error = [e for e in events if e.type == "error"][-1]
    assert error.payload["kind"] == "compaction" and error.payload["message"].startswith(why)
    assert not [e for e in events if e.type == "compaction"]
    assert live.state == "idle"  # the failed turn left the session usable


REQUESTED: Final = (
    "repeat forever:\n"
    + SUMMARY
    + '    when "begin":\n        code: print("one " + "x" * 6000)\n'
    + '    when "one ":\n        code: print("two " + "x" * 6000)\n'
    + '    when "two ":\n        code:\n            r = await compact.run("keep the word PLUM")\n            s = await compact.status()\n            print("asked", r.scheduled, s.scheduled, s.context_window, s.tokens > 0)\n'
    + '    when "asked":\n        text: carried on\n'
    + '    when "more":\n        code: print("three " + "x" * 3000)\n'
    + '    when "three ":\n        code: print("four " + "x" * 3000)\n'
    + '    when "four ":\n        text: ok\n'
)


async def test_compact_run_applies_at_the_step_boundary_and_slash_compact_between_turns() -> None:
    cfg = settings(window=100_000)
    async with orchestrator(cfg) as orch:
        with FakeModelServer(REQUESTED) as srv:
            live = await orch.create_session(model=fake_model(cfg, srv), cwd=Path.cwd(), name="r")
            outcome = await turn(orch, live, "begin")
            assert outcome.reason == "completed" and outcome.final_text == "carried on"
            await turn(orch, live, "more")
            manual = await compact_session(live, "focus on the numbers")
            requests = list(srv.requests)
        events = await events_of(orch, live)
    asked = next(e for e in events if e.type == "tool_result" and "asked" in e.payload["text"])
    assert asked.payload["text"].strip() == f"asked True True {100_000} True"
    summaries = [r for r in requests if is_summary_request(r)]
    assert len(summaries) == 2
    assert "keep the word PLUM" in summaries[0]["messages"][-1]["content"]
    assert "focus on the numbers" in summaries[1]["messages"][-1]["content"]
    reasons = [e.payload["reason"] for e in events if e.type == "compaction"]
    assert reasons == ["requested", "manual"]
    # the requested one ran after the cell that asked (not mid-cell), then the turn went on
    first = next(i for i, e in enumerate(events) if e.type == "compaction")
    assert events[first - 2] == asked and events[first - 1].type == "usage"  # the summary's
    assert events[first + 1].type == "assistant_message"
    assert events[first + 1].payload["text"] == "carried on"
    assert manual["compacted"] is True and manual["tokens_after"] < manual["tokens_before"]
    assert live.loop is not None and live.loop.context.messages[0]["content"].startswith(
        "[context summary]"
    )


# -- scale: 100,000 events ---------------------------------------------------------------------

HISTORY_EVENTS: Final = 100_000
KEPT_SPAN: Final = 300  # events from the first kept one to the compaction
AFTER: Final = 100  # events after the compaction


def _write_long_history(database: Path, sid: str) -> None:
    """One bulk INSERT of a linear history: user/assistant/notice rows, one compaction near
    the end whose kept span starts ``KEPT_SPAN`` events before it (as bench_daemon does)."""
    import duckdb

    compaction_seq = HISTORY_EVENTS - AFTER
    first_kept = compaction_seq - KEPT_SPAN
    con = duckdb.connect(str(database))
    try:
        con.execute(
            """
            INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
            SELECT $1, i, 'e-' || lpad(i::VARCHAR, 7, '0'),
                   CASE WHEN i = 1 THEN NULL ELSE 'e-' || lpad((i - 1)::VARCHAR, 7, '0') END,
                   CASE WHEN i = $2 THEN 'compaction'
                        WHEN i % 3 = 0 THEN 'user_message'
                        WHEN i % 3 = 1 THEN 'assistant_message' ELSE 'notice' END,
                   now()::TIMESTAMP,
                   CASE WHEN i = $2 THEN json_object(
                            'summary', 'the first ' || $3 || ' events', 'first_kept_event_id',
                            'e-' || lpad($3::VARCHAR, 7, '0'), 'tokens_before', 9000,
                            'tokens_after', 3000, 'reason', 'threshold')
                        WHEN i % 3 = 0 THEN json_object('text', 'question ' || i)
                        WHEN i % 3 = 1 THEN json_object('text', 'answer ' || i,
                                                        'provider', 'openai', 'model', 'fake')
                        ELSE json_object('text', 'notice ' || i) END
            FROM range(1, $4 + 1) t(i)
            """,
            [sid, compaction_seq, first_kept, HISTORY_EVENTS],
        )
        con.execute(
            "UPDATE sessions SET leaf_event_id = $2 WHERE id = $1",
            [sid, f"e-{HISTORY_EVENTS:07d}"],
        )
    finally:
        con.close()


async def test_a_100k_event_session_resumes_reading_only_its_newest_compaction_span(
    tmp_path: Path,
) -> None:
    from orchestrator.ids import new_session_id
    from orchestrator.store.db import SessionRecord

    paths = Paths.from_env()
    sid = new_session_id()
    store = await Store.open(paths.database_file)
    await store.create_session(
        SessionRecord(
            id=sid, root_id=sid, cwd=str(tmp_path), model=MODEL, backend="local", status="inactive"
        )
    )
    await store.close()
    _write_long_history(paths.database_file, sid)

    cfg = Settings(
        models={MODEL: ModelConfig(api_base="http://127.0.0.1:9/v1", context_window=WINDOW)}
    )
    async with orchestrator(cfg) as orch:
        path = await read_context_path(orch.store, sid)
        live = await orch.load_session_id(sid)
        assert live.loop is not None
        messages = live.loop.context.messages
    # the walk read the span from the first kept event to the leaf, in a couple of windows
    span = KEPT_SPAN + AFTER + 1
    assert len(path.events) == span
    assert path.rows_read < span + CONTEXT_WINDOW_FIRST_ROWS
    assert path.rows_read < HISTORY_EVENTS // 100
    assert (
        path.compaction is not None
        and path.events[0].id == f"e-{HISTORY_EVENTS - AFTER - KEPT_SPAN:07d}"
    )
    # the resumed context: the summary, then the kept span and what followed (notices skipped)
    assert messages[0]["content"].startswith("[context summary]")
    conversational = [e for e in path.events if e.type in ("user_message", "assistant_message")]
    assert len(messages) == 1 + len(conversational)
    assert messages[-1] == {"role": "assistant", "content": f"answer {HISTORY_EVENTS}"}


CHILD_STEPS: Final = 5
CHILD_SESSION = (
    "repeat forever:\n"
    + SUMMARY
    + '    when "child finished":\n        text: noted\n'
    + '    when "Do the child steps":\n        code: print("step 1 done " + "x" * 5000)\n'
    + "".join(step(n) for n in range(2, CHILD_STEPS + 1))
    + f'    when "step {CHILD_STEPS} done":\n        text: child finished\n'
    + '    when "spawned kid":\n        text: waiting for kid\n'
    + '    when "Delegate":\n        code: h = await rlm("Do the child steps", name="kid"); print("spawned", h.name)\n'
)


async def test_a_child_compacts_its_own_context() -> None:
    """Children compact too (issue 6 bullet 3): a subagent crossing its threshold summarises its
    own history; its parent's context is untouched."""
    cfg = settings()
    async with orchestrator(cfg) as orch:
        with FakeModelServer(CHILD_SESSION) as srv:
            live = await orch.create_session(
                model=fake_model(cfg, srv), cwd=Path.cwd(), name="parent"
            )
            outcome = await turn(orch, live, "Delegate the steps to a child.")
            requests = list(srv.requests)
        assert outcome.reason == "completed"
        family = await orch.store.family_sessions(live.id)
        child = next(s for s in family if s.parent_id == live.id)
        child_events = await orch.store.events(child.id)
        parent_events = await orch.store.events(live.id)
    compactions = [e for e in child_events if e.type == "compaction"]
    assert compactions and all(c.payload["reason"] == "threshold" for c in compactions)
    assert not [e for e in parent_events if e.type == "compaction"]
    # the child kept its task (the turn in flight) through the compaction
    after = requests[next(i for i, r in enumerate(requests) if is_summary_request(r)) + 1]
    assert any("Do the child steps" in str(m.get("content")) for m in after["messages"][1:])
    finished = [e for e in child_events if e.type == "assistant_message"]
    assert finished[-1].payload["text"] == "child finished"
