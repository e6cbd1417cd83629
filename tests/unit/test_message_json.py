"""orchestrator/models/message_json.py: a context message is encoded once, when the context
adds it, and every request body after that joins the stored JSON (the reason it exists:
docs/benchmarks.md, "Where a step's host CPU goes")."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any, Final

import pytest

from orchestrator.agent.context import ContextBuilder
from orchestrator.models import message_json
from orchestrator.models.message_json import EncodedMessage, messages_json
from orchestrator.models.openai_stream import OpenAIStream
from orchestrator.models.registry import resolve_model
from orchestrator.settings import Settings
from orchestrator.store.events import AssistantMessagePayload, ToolCall, ToolResultPayload

STEPS: Final = 30
CALLS: Final = 5


def _context() -> ContextBuilder:
    context = ContextBuilder()
    context.add("user_message", {"text": "go"})
    for step in range(STEPS):
        call = ToolCall(id=f"c{step}", name="ipython", arguments=json.dumps({"code": "n += 1"}))
        context.add(
            "assistant_message",
            AssistantMessagePayload(
                text="", tool_calls=[call], provider="openai", model="fake"
            ).model_dump(mode="json"),
        )
        result = ToolResultPayload(tool_call_id=f"c{step}", text=f"step {step} é")
        context.add("tool_result", result.model_dump(mode="json"))
    return context


def test_each_context_message_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[Any] = []
    dumps = json.dumps

    def counting(obj: Any, **kwargs: Any) -> str:
        if isinstance(obj, dict) and "role" in obj:  # a message (not a tool call's arguments)
            encoded.append(obj)
        return dumps(obj, **kwargs)

    monkeypatch.setattr(message_json.json, "dumps", counting)
    context = _context()
    assert len(encoded) == 1 + 2 * STEPS  # one per message, when it was added
    settings = Settings()
    stream = OpenAIStream(
        resolve_model("openai/fake", settings, api_base="http://x/v1", env={}), settings
    )
    system = {"role": "system", "content": "sys"}
    bodies = set()
    for _ in range(CALLS):
        encoded.clear()
        bodies.add(stream.body([system, *context.messages], None, None))
        assert encoded == [system]  # the plain dict only: the context's JSON is reused
    (body,) = bodies
    sent = json.loads(body)
    assert sent["messages"] == [system, *context.messages]
    assert sent["stream"] is True and sent["model"] == "fake"


def test_the_joined_json_is_what_json_dumps_writes() -> None:
    messages = [
        EncodedMessage({"role": "user", "content": 'h\u00e9 "q"'}),
        {"role": "system", "content": "s"},
    ]
    assert messages_json(messages) == json.dumps(messages)
    assert messages_json([]) == "[]"
    assert messages_json(messages, before='{"m": ', after="}") == json.dumps({"m": messages})


def test_an_encoded_message_refuses_changes_and_copies_fresh() -> None:
    message = EncodedMessage({"role": "user", "content": "a"})
    with pytest.raises(TypeError):
        message["content"] = "b"
    with pytest.raises(TypeError):
        message.update(content="b")
    with pytest.raises(TypeError):
        message.pop("content")
    assert message.json == '{"role": "user", "content": "a"}'
    for twin in (copy.deepcopy(message), pickle.loads(pickle.dumps(message))):
        assert isinstance(twin, EncodedMessage) and twin == message and twin.json == message.json
    plain = dict(message)
    plain["content"] = "b"  # what code that must edit one does
    assert message["content"] == "a"
