from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.agent.context import PARENT_TASK_PREFIX, ContextBuilder, safe_arguments
from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt
from orchestrator.agent.shaping import NO_OUTPUT, shape_cell_result
from orchestrator.sandbox.base import CellError, CellResult
from orchestrator.store.events import (
    AssistantMessagePayload,
    ModelChangePayload,
    ToolCall,
    ToolResultPayload,
    UserMessagePayload,
)


def _add(ctx: ContextBuilder, type_: str, payload: object) -> None:
    ctx.add(type_, payload.model_dump(mode="json"))  # type: ignore[attr-defined]


def test_native_tool_exchange_becomes_tool_messages() -> None:
    ctx = ContextBuilder()
    _add(ctx, "user_message", UserMessagePayload(text="hi"))
    call = ToolCall(id="c1", name="ipython", arguments='{"code": "1+1"}')
    _add(
        ctx,
        "assistant_message",
        AssistantMessagePayload(text="", tool_calls=[call], provider="p", model="m"),
    )
    _add(ctx, "tool_result", ToolResultPayload(tool_call_id="c1", text="Out: 2"))
    assert ctx.messages[0] == {"role": "user", "content": "hi"}
    assert ctx.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"code": "1+1"}'
    assert ctx.messages[1]["content"] is None
    assert ctx.messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "Out: 2"}


def test_fenced_exchange_stays_plain_text() -> None:
    ctx = ContextBuilder()
    call = ToolCall(id="f1", name="ipython", arguments='{"code": "1"}')
    text = "```python\n1\n```"
    _add(
        ctx,
        "assistant_message",
        AssistantMessagePayload(text=text, tool_calls=[call], provider="p", model="m", fenced=True),
    )
    _add(ctx, "tool_result", ToolResultPayload(tool_call_id="f1", text="Out: 1"))
    assert ctx.messages[0] == {"role": "assistant", "content": text}
    assert ctx.messages[1]["role"] == "user" and "Out: 1" in ctx.messages[1]["content"]


def test_parent_task_is_marked() -> None:
    ctx = ContextBuilder()
    _add(ctx, "user_message", UserMessagePayload(text="do x", source="parent"))
    assert ctx.messages[0]["content"] == PARENT_TASK_PREFIX + "do x"


def test_bookkeeping_events_do_not_enter_context() -> None:
    ctx = ContextBuilder()
    ctx.add("usage", {"provider": "p", "model": "m"})
    ctx.add("retry", {"attempt": 1, "delay_s": 0.1, "reason": "x"})
    assert ctx.messages == []


def test_malformed_arguments_are_wrapped_for_history() -> None:
    wrapped = json.loads(safe_arguments('{"code": "x'))
    assert wrapped == {"_invalid_arguments": '{"code": "x'}
    assert safe_arguments('{"code": "x"}') == '{"code": "x"}'


def test_shaping_orders_notice_streams_and_error() -> None:
    result = CellResult(
        status="error",
        stdout="out\n",
        stderr="warn\n",
        result="",
        error=CellError(
            ename="ValueError", evalue="bad", traceback="Traceback...\nValueError: bad"
        ),
        notice="kernel restarted",
        artifact_path=Path("/tmp/a.txt"),
        truncated_chars=10,
    )
    text = shape_cell_result(result)
    lines = text.splitlines()
    assert lines[0] == "[notice] kernel restarted"
    assert lines[1] == "out" and "[stderr]" in text and "ValueError: bad" in text
    assert "/tmp/a.txt" in text and "10 chars" in text


def test_shaping_empty_and_result() -> None:
    assert shape_cell_result(CellResult(status="ok")) == NO_OUTPUT
    assert shape_cell_result(CellResult(status="ok", result="42")) == "Out: 42"


def test_system_prompt_prefix_is_stable_and_fenced_variant_differs() -> None:
    facts = EnvironmentFacts(cwd="/w", model="m", backend="local", today="2026-01-01")
    native = build_system_prompt(facts, tool_protocol="native")
    fenced = build_system_prompt(facts, tool_protocol="fenced")
    with_harness = build_system_prompt(
        facts, tool_protocol="native", harness_section="# Notes\n- x"
    )
    assert "```python" in fenced and "```python" not in native
    assert len(fenced) < len(native)  # small models lose the thread in a long prompt
    env_at = native.index("# Environment")
    assert with_harness.startswith(native[:env_at])
    assert len(native) < 4000  # the reference's prompt is 19k characters


def test_a_live_payload_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent loop adds the payload model it just recorded: the context reads the same
    messages as from the stored dicts, and validates and dumps nothing at each step (it used to
    dump every event and validate it back: docs/benchmarks.md, "Where a step's host CPU
    goes")."""
    call = ToolCall(id="c1", name="ipython", arguments='{"code": "1+1"}')
    events = [
        ("user_message", UserMessagePayload(text="hi")),
        ("assistant_message", AssistantMessagePayload(tool_calls=[call], provider="p", model="m")),
        ("tool_result", ToolResultPayload(tool_call_id="c1", text="Out: 2")),
        ("model_change", ModelChangePayload(model="p/n", previous="p/m")),
    ]
    stored = ContextBuilder()
    for type_, payload in events:
        _add(stored, type_, payload)
    conversions: list[str] = []
    for cls in (UserMessagePayload, AssistantMessagePayload, ToolResultPayload):
        validate, dump = cls.model_validate, cls.model_dump
        monkeypatch.setattr(
            cls,
            "model_validate",
            lambda *a, _f=validate, **k: conversions.append("validate") or _f(*a, **k),
        )
        monkeypatch.setattr(
            cls, "model_dump", lambda *a, _f=dump, **k: conversions.append("dump") or _f(*a, **k)
        )
    live = ContextBuilder()
    for type_, payload in events:
        live.add(type_, payload)
    assert conversions == []
    assert live.messages == stored.messages and live.model == stored.model == "p/n"
