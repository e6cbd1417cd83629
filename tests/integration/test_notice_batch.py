# ruff: noqa: E501  (the script below is data: long code lines are the model's cells)
"""Many children, few parent turns (issue 18 item 7): five subagents that finish while their
parent is busy reach it as one turn, and each notice is recorded and shown once. Real NATS,
real kernels, litellm over real HTTP to the scripted model serving every session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.cli.render import render_event
from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sessions.runner import RunOptions, run_session
from orchestrator.settings import Settings
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tui.transcript import Transcript

# Five kernels start on a busy machine while the parent's cell waits for them.
SETTINGS = Settings(retry_base_delay_s=0.01, model_max_retries=1, cell_timeout_s=240.0)
TASK = "spawn five"
CHILDREN = "abcde"
NOTICE_MARK = "finished without messaging you"

# The parent's cell spawns five children and returns only once every one of them has
# finished, so all five notices are queued while the parent is busy (a child notifies its
# parent before it shows as completed). Guards are tried in order: a notice quotes the
# child's "job finished", so its guard comes first.
FIVE_CHILDREN = f"""
repeat forever:
    when "{NOTICE_MARK}":
        text: reports read
    when "{TASK}":
        code:
            import asyncio
            hs = [await rlm(f"job {{c}}", name=c) for c in "{CHILDREN}"]
            while any(s.status != "completed" for s in await rlm.list_subagents()): await asyncio.sleep(0.05)
            print("all five done", len(hs))
    when "all five done":
        text: waiting for reports
    when "job":
        text: job finished
"""


async def test_five_notices_close_together_cost_the_parent_one_turn(tmp_path: Path) -> None:
    paths = Paths.from_env()
    pushed: list[dict[str, Any]] = []
    with FakeModelServer(FIVE_CHILDREN) as srv:
        model = resolve_model("openai/fake", SETTINGS, api_base=srv.url, env={})
        result = await run_session(
            RunOptions(task=TASK, cwd=Path.cwd(), backend="local"),
            model,
            SETTINGS,
            paths,
            sink=pushed.append,
        )
        requests = list(srv.requests)
    assert result.outcome.reason == "completed", result.outcome
    store = await Store.open(paths.database_file, read_only=True)
    try:
        sessions = {s.name or s.id: s for s in await store.list_sessions()}
        root = sessions[TASK]
        events = [(e.id, e.type, e.payload) for e in await store.events(root.id)]
    finally:
        await store.close()
    assert sorted(s.name for s in sessions.values() if s.parent_id == root.id) == list(CHILDREN)

    # The root's model calls: the spawning one, the one after its cell, one for the batch.
    root_calls = [r for r in requests if r["messages"][1]["content"] == TASK]
    assert len(root_calls) == 3, [r["messages"][-1]["content"][:60] for r in root_calls]
    last = str(root_calls[-1]["messages"][-1]["content"])
    assert last.count(NOTICE_MARK) == len(CHILDREN)
    assert all(f"subagent {c} (" in last for c in CHILDREN)

    # Recorded once: five notice events, and one message naming them carries them to the model.
    notices = [(i, p) for i, t, p in events if t == "notice" and NOTICE_MARK in p["text"]]
    assert len(notices) == len(CHILDREN)
    carriers = [p for _, t, p in events if t == "user_message" and p.get("notice_ids")]
    assert len(carriers) == 1
    assert carriers[0]["notice_ids"] == [i for i, _ in notices]
    assert carriers[0]["source"] == "harness"
    assert [r for r in root_calls[-1]["messages"] if NOTICE_MARK in str(r.get("content"))] == [
        root_calls[-1]["messages"][-1]
    ]

    # Shown once: the printed view (attach, observe) and the TUI chat of what was pushed.
    root_pushed = [e for e in pushed if e.get("session_id") == root.id and "payload" in e]
    printed = "\n".join(line for e in root_pushed for line in render_event(e))
    assert printed.count(NOTICE_MARK) == len(CHILDREN), printed
    transcript = Transcript()
    items = [item for e in root_pushed for item in transcript.apply(e)]
    assert sum(NOTICE_MARK in item.text for item in items) == len(CHILDREN)
    # The JSON lines (--mode json) hold each notice as one notice event; the model's copy is the
    # one user_message marked with their ids.
    json_notices = [
        e for e in root_pushed if e["type"] == "notice" and NOTICE_MARK in e["payload"]["text"]
    ]
    assert [e["id"] for e in json_notices] == carriers[0]["notice_ids"]
