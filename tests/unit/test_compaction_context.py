"""Compaction against a real DuckDB store, with a stub summariser (no model, no kernel): the
recorded event, the rebuilt context equal to what a reload assembles, repeated compactions
updating the summary, model switches, the typed failures, and the bounded path read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.compaction import CompactionFailed, Compactor, NothingToCompact
from orchestrator.agent.context import SUMMARY_PREFIX, ContextBuilder
from orchestrator.errors import ProviderError
from orchestrator.ids import new_session_id
from orchestrator.models.client import ModelReply
from orchestrator.settings import CompactionSettings
from orchestrator.store.context_queries import read_context_path
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    ModelChangePayload,
    ToolCall,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)

WINDOW = 4000
SETTINGS = CompactionSettings(reserve_tokens=1000, keep_recent_tokens=300)
FILLER_CHARS = 1200  # ~300 tokens per tool result


class Session:
    """A store session fed the way the loop feeds it: append, then add to the context."""

    def __init__(self, store: Store, sid: str):
        self.store = store
        self.sid = sid
        self.context = ContextBuilder()
        self.requests: list[list[dict[str, Any]]] = []
        self.reply_text = "## Goal\nfinish the task"
        self.fail: BaseException | None = None
        self.compactor = Compactor(
            settings=SETTINGS,
            context=self.context,
            complete=self._complete,
            record=lambda t, p: store.append(sid, t, p),
            window=self._window,
            fixed_tokens=lambda: 100,
            model=lambda: "openai/fake",
        )

    async def _window(self) -> int:
        return WINDOW

    async def _complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        self.requests.append(messages)
        if self.fail is not None:
            raise self.fail
        usage = UsagePayload(provider="openai", model="fake", input=100, output=20)
        return ModelReply(self.reply_text, [], "stop", usage)

    async def add(self, type_: str, payload: Any) -> str:
        rec = await self.store.append(self.sid, type_, payload)
        self.context.add(type_, payload.model_dump(mode="json"), event_id=rec.id)
        return rec.id

    async def cell(self, n: int) -> None:
        call = ToolCall(id=f"c{n}", name="ipython", arguments=json.dumps({"code": f"step({n})"}))
        await self.add(
            "assistant_message",
            AssistantMessagePayload(tool_calls=[call], provider="openai", model="fake"),
        )
        await self.add(
            "tool_result",
            ToolResultPayload(tool_call_id=f"c{n}", text=f"step {n} " + "x" * FILLER_CHARS),
        )

    async def reloaded(self) -> ContextBuilder:
        fresh = ContextBuilder()
        fresh.load(await read_context_path(self.store, self.sid))
        return fresh


@pytest.fixture
async def session(tmp_path: Path) -> Any:
    store = await Store.open(tmp_path / "db.duckdb")
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/", model="openai/fake", backend="local")
    )
    try:
        yield Session(store, sid)
    finally:
        await store.close()


async def test_compaction_records_its_event_and_a_reload_sees_the_same_context(
    session: Session,
) -> None:
    turn = await session.add("user_message", UserMessagePayload(text="the task"))
    for n in range(6):
        await session.cell(n)
    before = await session.store.get_session(session.sid)
    assert before is not None
    outcome = await session.compactor.compact("threshold", turn_event_id=turn)
    payload = outcome.payload
    event = await session.store.get_event(outcome.event_id or "")
    assert event is not None and event.type == "compaction"
    # it hangs off the leaf at the time: the summary call's usage row, itself after the old leaf
    usage = await session.store.get_event(event.parent_event_id or "")
    assert usage is not None and usage.type == "usage"
    assert usage.parent_event_id == before.leaf_event_id
    assert payload.pinned_event_id == turn  # the turn in flight is kept verbatim
    assert payload.tokens_after < payload.tokens_before
    assert payload.summarized_events > 0
    messages = session.context.messages
    assert messages[0]["content"].startswith(SUMMARY_PREFIX)
    assert "finish the task" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": "the task"}
    assert messages[2]["role"] == "assistant"  # the kept span starts at a call, not a result
    reloaded = await session.reloaded()
    assert reloaded.messages == messages
    # the summary call saw the summarised part, labelled, and the format it must follow
    request = session.requests[0][1]["content"]
    assert "[ipython call]\nstep(0)" in request and "## Critical Context" in request
    assert "the task" not in request  # the pinned turn is not summarised


async def test_repeated_compactions_update_the_previous_summary(session: Session) -> None:
    turn = await session.add("user_message", UserMessagePayload(text="the task"))
    for n in range(6):
        await session.cell(n)
    await session.compactor.compact("threshold", turn_event_id=turn)
    session.reply_text = "## Goal\nsecond notes"
    for n in range(6, 12):
        await session.cell(n)
    second = await session.compactor.compact("manual", "keep step numbers", turn_event_id=None)
    request = session.requests[1][1]["content"]
    assert "<previous-notes>\n## Goal\nfinish the task" in request
    assert "keep step numbers" in request
    assert second.payload.pinned_event_id is None  # no turn in flight: the old pin is summarised
    assert "the task" in request
    assert (await session.reloaded()).messages == session.context.messages
    assert session.context.messages[0]["content"].count("second notes") == 1


async def test_typed_failures_leave_the_context_alone(session: Session) -> None:
    turn = await session.add("user_message", UserMessagePayload(text="the task"))
    with pytest.raises(NothingToCompact):
        await session.compactor.compact("manual", turn_event_id=turn)
    for n in range(6):
        await session.cell(n)
    untouched = list(session.context.messages)
    session.fail = ProviderError("boom")
    with pytest.raises(CompactionFailed) as failed:
        await session.compactor.compact("threshold", turn_event_id=turn)
    assert failed.value.reason == "summary_failed"
    session.fail = None
    session.reply_text = "y" * (WINDOW * 8)  # a "summary" longer than what it replaces
    with pytest.raises(CompactionFailed) as grew:
        await session.compactor.compact("threshold", turn_event_id=turn)
    assert grew.value.reason == "no_progress"
    assert session.context.messages == untouched
    path = await read_context_path(session.store, session.sid)
    assert path.compaction is None


async def test_a_model_change_applies_from_its_event_on(session: Session) -> None:
    await session.add("user_message", UserMessagePayload(text="hi"))
    await session.add("model_change", ModelChangePayload(model="openai/other"))
    assert session.context.model == "openai/other"
    assert (await session.reloaded()).model == "openai/other"
