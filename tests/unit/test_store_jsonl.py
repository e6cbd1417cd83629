"""JSONL export in pi's session format (version 3)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import StoreError
from orchestrator.ids import new_session_id
from orchestrator.store import jsonl
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    NoticePayload,
    ToolCall,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.jsonl import export_session_jsonl

HEX_ID = re.compile(r"^[0-9a-f]{8}$")
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
MANY_EVENTS = 40
SHORT_ID_CHARS = 2  # 256 possible ids: 40 events collide for sure, exercising the rehash


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with await Store.open(tmp_path / "db" / "x.duckdb") as s:
        yield s


async def make_session(store: Store) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(
            id=sid, root_id=sid, cwd="/home/u/proj", model="openai/gpt-x", backend="local"
        )
    )
    return sid


def usage(cost: float | None) -> UsagePayload:
    return UsagePayload(
        provider="openai", model="gpt-x", input=120, output=30, cache_read=8, cost_usd=cost
    )


async def export(store: Store, sid: str) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    count = await export_session_jsonl(store, sid, out)
    text = out.getvalue()
    assert text.endswith("\n")
    return count, [json.loads(line) for line in text.splitlines()]


def check_tree(entries: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for entry in entries:
        assert HEX_ID.match(entry["id"]), entry
        assert entry["id"] not in seen
        assert entry["parentId"] is None or entry["parentId"] in seen, entry
        assert ISO_MS.match(entry["timestamp"])
        seen.add(entry["id"])


async def test_small_session_exports_in_pi_shape(store: Store) -> None:
    sid = await make_session(store)
    await store.append(sid, "user_message", UserMessagePayload(text="compute 6*7"))
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(
            text="Let me run it.",
            tool_calls=[ToolCall(id="call_1", name="ipython", arguments='{"code": "6*7"}')],
            stop_reason="tool_calls",
            provider="openai",
            model="gpt-x",
            usage=usage(0.0012),
        ),
    )
    await store.append(sid, "usage", usage(0.0012))
    await store.append(
        sid,
        "tool_result",
        ToolResultPayload(tool_call_id="call_1", text="42", duration_ms=3.5),
    )
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(text="It is 42.", provider="openai", model="gpt-x"),
    )
    count, lines = await export(store, sid)
    header, *entries = lines
    assert count == len(entries) == 5

    session = await store.get_session(sid)
    assert session is not None
    assert header == {
        "type": "session",
        "version": 3,
        "id": sid,
        "timestamp": header["timestamp"],
        "cwd": "/home/u/proj",
    }
    assert ISO_MS.match(header["timestamp"])
    check_tree(entries)
    # Default parents make one chain: each entry hangs off the one before it.
    assert [e["parentId"] for e in entries] == [None] + [e["id"] for e in entries[:-1]]

    user, assistant, usage_entry, tool, final = entries
    assert user["type"] == "message"
    assert user["message"]["role"] == "user"
    assert user["message"]["content"] == [{"type": "text", "text": "compute 6*7"}]
    assert isinstance(user["message"]["timestamp"], int)

    msg = assistant["message"]
    assert msg["role"] == "assistant"
    assert msg["content"] == [
        {"type": "text", "text": "Let me run it."},
        {"type": "toolCall", "id": "call_1", "name": "ipython", "arguments": {"code": "6*7"}},
    ]
    assert (msg["api"], msg["provider"], msg["model"]) == ("openai-completions", "openai", "gpt-x")
    assert msg["stopReason"] == "toolUse"
    assert msg["usage"]["input"] == 120 and msg["usage"]["cacheRead"] == 8
    assert msg["usage"]["totalTokens"] == 120 + 30 + 8
    assert set(msg["usage"]["cost"]) == {"input", "output", "cacheRead", "cacheWrite", "total"}
    assert msg["usage"]["cost"]["total"] == pytest.approx(0.0012)

    assert usage_entry["type"] == "custom"
    assert usage_entry["customType"] == "prime-agent.usage"
    assert usage_entry["data"]["cost_usd"] == pytest.approx(0.0012)
    assert "message" not in usage_entry

    result = tool["message"]
    assert result["role"] == "toolResult"
    assert (result["toolCallId"], result["toolName"], result["isError"]) == (
        "call_1",
        "ipython",
        False,
    )
    assert result["content"] == [{"type": "text", "text": "42"}]

    assert final["message"]["stopReason"] == "stop"
    assert final["message"]["content"] == [{"type": "text", "text": "It is 42."}]
    assert final["message"]["usage"]["cost"]["total"] == 0


async def test_branches_malformed_arguments_and_custom_entries(store: Store) -> None:
    sid = await make_session(store)
    first = await store.append(sid, "user_message", UserMessagePayload(text="hi"))
    abandoned = await store.append(sid, "notice", NoticePayload(text="old branch"))
    await store.update_session(sid, leaf_event_id=first.id)
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(
            tool_calls=[
                ToolCall(id="c1", name="ipython", arguments="{not json"),
                ToolCall(id="c2", name="ipython", arguments='"a string"'),
            ],
            stop_reason="length",
            provider="p",
            model="m",
        ),
    )
    _, (_, *entries) = await export(store, sid)
    check_tree(entries)
    user, notice, assistant = entries
    assert notice["customType"] == "prime-agent.notice"
    assert notice["data"] == {"text": "old branch"}
    assert notice["parentId"] == user["id"]
    # The second branch also hangs off the user entry: the tree survives the export.
    assert assistant["parentId"] == user["id"]
    calls = assistant["message"]["content"]
    assert [c["arguments"] for c in calls] == [{"_raw": "{not json"}, {"_raw": '"a string"'}]
    assert assistant["message"]["stopReason"] == "length"
    assert abandoned.id not in json.dumps(entries)  # our ids never leak into pi's id space


async def test_ids_are_stable_and_unique_under_collisions(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await make_session(store)
    for i in range(MANY_EVENTS):
        await store.append(sid, "notice", NoticePayload(text=str(i)))
    monkeypatch.setattr(jsonl, "JSONL_ID_HEX_CHARS", SHORT_ID_CHARS)
    monkeypatch.setattr(jsonl, "EXPORT_PAGE_SIZE", 7)  # several pages
    count, lines = await export(store, sid)
    again = await export(store, sid)
    assert count == MANY_EVENTS and again == (count, lines)
    ids = [e["id"] for e in lines[1:]]
    assert len(set(ids)) == MANY_EVENTS
    assert [e["data"]["text"] for e in lines[1:]] == [str(i) for i in range(MANY_EVENTS)]
    assert [e["parentId"] for e in lines[1:]] == [None, *ids[:-1]]


async def test_unknown_session_is_an_error(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown session"):
        await export_session_jsonl(store, new_session_id(), io.StringIO())


async def test_empty_session_is_just_the_header(store: Store) -> None:
    sid = await make_session(store)
    count, lines = await export(store, sid)
    assert count == 0 and [line["type"] for line in lines] == ["session"]
