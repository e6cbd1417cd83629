"""RPC mode's ``message_update`` (issue 20, item 2): the reply's text deltas become
text_start / text_delta / text_end between one message_start and the message_end of the stored
reply, and a delta that overtakes the event it follows waits for it."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.api.messages import Stream
from orchestrator.cli.rpc_mode import RpcOptions, RpcServer

SESSION = "s-0000000000aa"


def _server(out: list[dict[str, Any]]) -> RpcServer:
    async def write(line: str) -> None:
        out.append(json.loads(line))

    return RpcServer(RpcOptions(cwd="/"), control=None, write=write)  # type: ignore[arg-type]


def _delta(text: str, after: int) -> Stream:
    return Stream(session=SESSION, event={"type": "text_delta", "delta": text}, after=after)


def _event(seq: int, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, "type": kind, "ts": "2026-12-04T12:00:00+00:00", "payload": payload}


USER = {"text": "hi"}
REPLY = {"text": "Hello world", "provider": "openai", "model": "fake"}


async def test_deltas_stream_between_one_start_and_the_stored_replys_end() -> None:
    out: list[dict[str, Any]] = []
    rpc = _server(out)
    # The first delta overtakes the user message it follows: it waits for it.
    await rpc._on_delta(_delta("Hello", after=1))
    assert out == []
    await rpc._on_durable(_event(1, "user_message", USER))
    await rpc._on_delta(_delta(" world", after=1))
    await rpc._on_durable(_event(2, "assistant_message", REPLY))
    kinds = [
        x["assistantMessageEvent"]["type"] if x["type"] == "message_update" else x["type"]
        for x in out
    ]
    assert kinds == [
        "agent_start",
        "turn_start",
        "message_start",  # the user's
        "message_end",
        "message_start",  # the reply, as it is written
        "text_start",
        "text_delta",
        "text_delta",
        "text_end",
        "message_end",
        "turn_end",  # no tool call: the turn is over
    ]
    deltas = [x["assistantMessageEvent"] for x in out if x["type"] == "message_update"]
    assert [d.get("delta") for d in deltas[1:3]] == ["Hello", " world"]
    assert deltas[-1]["content"] == "Hello world"
    assert out[-2]["message"]["content"] == [{"type": "text", "text": "Hello world"}]


async def test_a_reply_whose_deltas_were_lost_is_sent_whole() -> None:
    out: list[dict[str, Any]] = []
    rpc = _server(out)
    await rpc._on_durable(_event(1, "user_message", USER))
    await rpc._on_durable(_event(2, "assistant_message", REPLY))
    assert [x["type"] for x in out][-3:] == ["message_start", "message_end", "turn_end"]
    assert all(x["type"] != "message_update" for x in out)


def _thought(text: str, after: int) -> Stream:
    return Stream(session=SESSION, event={"type": "thinking_delta", "delta": text}, after=after)


async def test_thinking_streams_as_its_own_block_before_the_text() -> None:
    out: list[dict[str, Any]] = []
    rpc = _server(out)
    await rpc._on_durable(_event(1, "user_message", USER))
    await rpc._on_delta(_thought("Greet ", after=1))
    await rpc._on_delta(_thought("them.", after=1))
    await rpc._on_delta(_delta("Hello world", after=1))
    await rpc._on_durable(_event(2, "assistant_message", {**REPLY, "thinking": "Greet them."}))
    updates = [x["assistantMessageEvent"] for x in out if x["type"] == "message_update"]
    assert [(u["type"], u["contentIndex"]) for u in updates] == [
        ("thinking_start", 0),
        ("thinking_delta", 0),
        ("thinking_delta", 0),
        ("thinking_end", 0),
        ("text_start", 1),
        ("text_delta", 1),
        ("text_end", 1),
    ]
    assert updates[3]["content"] == "Greet them." and updates[-1]["content"] == "Hello world"
    assert updates[-1]["partial"]["content"] == [
        {"type": "thinking", "thinking": "Greet them."},
        {"type": "text", "text": "Hello world"},
    ]
    # The stored reply, as a session file has it: the thinking block first.
    assert out[-2]["type"] == "message_end"
    assert out[-2]["message"]["content"][:2] == [
        {"type": "thinking", "thinking": "Greet them."},
        {"type": "text", "text": "Hello world"},
    ]
