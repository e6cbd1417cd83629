"""The refine planner's reply parsing and prompt (``orchestrator/harness/refine_plan.py``): a
bare object, a fenced block and brace slicing parse; truncated, non-JSON and invalid replies
fail with a typed one-line reason; the base prompt and unknown kinds are refused; the
prompt carries bounded harness state, history and the newest conversation."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

import pytest

from orchestrator.harness.refine_plan import (
    CONVERSATION_MAX_CHARS,
    ENTRY_PREVIEW_CHARS,
    NO_INSTRUCTIONS,
    PLAN_EDITS_MAX,
    TRUNCATED,
    HistoryItem,
    PlanFailed,
    build_messages,
    parse_plan,
    serialize_conversation,
)
from orchestrator.store.harness_entry import HarnessEntry
from orchestrator.store.queries import EventRecord

NOW: Final = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)

PLAN: Final[dict[str, Any]] = {
    "summary": "Remember the test command",
    "rationale": "The agent ran the wrong test command three times.",
    "expectedOutcome": "No more failed test runs.",
    "edits": [
        {
            "action": "create",
            "kind": "memory",
            "title": "Test command",
            "content": "Run tests with .venv/bin/pytest -q",
            "reason": "three failed runs",
        },
        {
            "action": "update",
            "kind": "prompt",
            "id": "local:style",
            "content": "Prefer small cells.",
            "reason": "long cells timed out",
        },
        {"action": "delete", "kind": "memory", "id": "stale_path", "reason": "path is gone"},
    ],
}


def ok(text: str, finish: str = "stop") -> Any:
    return parse_plan(text, finish_reason=finish)


def failure(text: str, finish: str = "stop") -> PlanFailed:
    with pytest.raises(PlanFailed) as info:
        parse_plan(text, finish_reason=finish)
    assert "\n" not in str(info.value)
    return info.value


def plan_with(*edits: dict[str, Any], **top: Any) -> str:
    return json.dumps({"summary": "s", "edits": list(edits), **top})


# -- parsing -------------------------------------------------------------------------------


def test_a_bare_object_parses_with_ids_derived_and_prefixes_stripped() -> None:
    plan = ok(json.dumps(PLAN))
    assert plan.summary == "Remember the test command"
    assert plan.expected_outcome == "No more failed test runs."  # camelCase accepted
    assert [(e.action, e.kind, e.id) for e in plan.edits] == [
        ("create", "memory", "test_command"),
        ("update", "prompt", "style"),
        ("delete", "memory", "stale_path"),
    ]
    record = plan.edits[1].to_record(3)
    assert record == {
        "action": "update",
        "kind": "prompt",
        "id": "style",
        "content": "Prefer small cells.",
        "reason": "long cells timed out",
        "baseline_version": 3,
    }


def test_snake_case_expected_outcome_and_an_empty_plan() -> None:
    plan = ok(json.dumps({"summary": "nothing", "expected_outcome": "same", "edits": []}))
    assert plan.expected_outcome == "same" and plan.edits == ()


def test_a_fenced_block_among_prose_parses() -> None:
    text = f"Here is my plan.\n\n```json\n{json.dumps(PLAN, indent=2)}\n```\nThat is all."
    assert len(ok(text).edits) == 3


def test_brace_slicing_finds_the_object_after_stray_braces() -> None:
    text = f"I looked at {{the errors}} and {{ this: }} so: {json.dumps(PLAN)} -- done"
    assert ok(text).summary == "Remember the test command"


def test_braces_inside_strings_do_not_confuse_slicing() -> None:
    edit = {
        "action": "create",
        "kind": "memory",
        "title": "Braces",
        "content": "a } b {",
        "reason": "r",
    }
    text = "Plan: " + plan_with(edit) + " end"
    assert ok(text).edits[0].content == "a } b {"


@pytest.mark.parametrize(
    ("text", "finish"),
    [
        (json.dumps(PLAN)[:-40], "stop"),  # cut mid-object
        ("```json\n" + json.dumps(PLAN)[:100], "stop"),  # an unclosed fence too
        (json.dumps(PLAN), "length"),  # complete JSON, but the model hit its limit
    ],
)
def test_a_truncated_reply_is_output_budget_exhausted(text: str, finish: str) -> None:
    failed = failure(text, finish)
    assert failed.reason == "truncated" and str(failed) == TRUNCATED


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "not JSON: the reply is empty"),
        ("I would change nothing.", "not JSON: the reply has no JSON object"),
        ("{'summary': 'single quotes'}", "not JSON: "),
        ("[1, 2, 3]", "not JSON: "),
    ],
)
def test_not_json(text: str, expected: str) -> None:
    failed = failure(text)
    assert failed.reason == "not_json" and str(failed).startswith(expected)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"action": "create", "kind": "tool", "title": "T", "content": "c", "reason": "r"}, "kind"),
        ({"action": "rename", "kind": "memory", "id": "a", "reason": "r"}, "action"),
        ({"action": "update", "kind": "memory", "reason": "r", "content": "c"}, "needs the id"),
        ({"action": "create", "kind": "memory", "title": "T", "reason": "r"}, "title and content"),
        ({"action": "update", "kind": "memory", "id": "a", "reason": "r"}, "changes nothing"),
        ({"action": "delete", "kind": "memory", "id": "Bad Id", "reason": "r"}, "invalid entry id"),
        ({"action": "delete", "kind": "memory", "id": "a"}, "reason"),
        (
            {"action": "create", "kind": "skill", "title": "S", "content": "c", "reason": "r"},
            "a skill needs reference",
        ),
    ],
)
def test_an_invalid_edit_names_its_number(edit: dict[str, Any], expected: str) -> None:
    good = {"action": "delete", "kind": "memory", "id": "old", "reason": "r"}
    failed = failure(plan_with(good, edit))
    assert failed.reason == "invalid"
    assert str(failed).startswith("edit 2: ") and expected in str(failed)


@pytest.mark.parametrize(
    "edit",
    [
        {
            "action": "update",
            "kind": "prompt",
            "id": "base_system_prompt",
            "content": "x",
            "reason": "r",
        },
        {"action": "delete", "kind": "memory", "id": "global:base_system_prompt", "reason": "r"},
        {
            "action": "create",
            "kind": "prompt",
            "title": "Base system prompt",
            "content": "x",
            "reason": "r",
        },
    ],
)
def test_the_base_prompt_is_never_a_target(edit: dict[str, Any]) -> None:
    failed = failure(plan_with(edit))
    assert failed.reason == "invalid" and "edit 1: " in str(failed)
    assert "base_system_prompt" in str(failed)


def test_too_many_edits() -> None:
    edits = [
        {"action": "delete", "kind": "memory", "id": f"m{i}", "reason": "r"}
        for i in range(PLAN_EDITS_MAX + 1)
    ]
    failed = failure(plan_with(*edits))
    assert failed.reason == "invalid"
    assert str(failed) == f"edits: {PLAN_EDITS_MAX + 1} edits; a plan has at most {PLAN_EDITS_MAX}"
    assert len(ok(plan_with(*edits[:PLAN_EDITS_MAX])).edits) == PLAN_EDITS_MAX


def test_a_sliced_object_without_plan_keys_is_validated_as_the_answer() -> None:
    failed = failure('My plan: {"changes": []} - that is it')
    assert failed.reason == "invalid" and str(failed).startswith("summary: ")


def test_two_edits_of_one_entry_and_a_missing_summary_are_invalid() -> None:
    edit = {"action": "delete", "kind": "memory", "id": "a", "reason": "r"}
    assert str(failure(plan_with(edit, edit))) == "edit 2: memory:a is already the target of edit 1"
    failed = failure(json.dumps({"edits": []}))
    assert failed.reason == "invalid" and str(failed).startswith("summary: ")


# -- the prompt ----------------------------------------------------------------------------


def entry(kind: Any, entry_id: str, content: str, *, scope: Any = "local") -> HarnessEntry:
    return HarnessEntry(
        owner="global" if scope == "global" else "s-root",
        scope=scope,
        kind=kind,
        id=entry_id,
        version=2,
        title=entry_id.title(),
        content=content,
        path="general",
        reference={},
        arguments={},
        metadata={},
        deleted=False,
        source="agent",
        reason="",
        session_id=None,
        refinement_id=None,
        created_at=NOW,
        updated_at=NOW,
    )


def event(seq: int, type_: Any, payload: dict[str, Any]) -> EventRecord:
    return EventRecord(
        session_id="s-x",
        seq=seq,
        id=f"e{seq}",
        parent_event_id=None,
        type=type_,
        ts=NOW,
        payload=payload,
    )


def test_the_prompt_has_every_block_with_bounds() -> None:
    long = "x" * (ENTRY_PREVIEW_CHARS * 3)
    messages = build_messages(
        state=[entry("memory", "tests", long), entry("prompt", "style", "short", scope="global")],
        history=[
            HistoryItem("r-1", "applied", "did a thing", ("create memory:tests",), "errors 3→1")
        ],
        conversation="[user] hello",
        scope="local",
        instructions=None,
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "base system prompt is fixed" in messages[0]["content"]
    user = messages[1]["content"]
    for tag in (
        "current_harness_state",
        "refinement_history",
        "conversation",
        "scope_policy",
        "user_refine_instructions",
    ):
        assert f"<{tag}>" in user and f"</{tag}>" in user
    assert "[local:tests] Tests (general, v2): " + "x" * (ENTRY_PREVIEW_CHARS - 1) + "…" in user
    assert "x" * ENTRY_PREVIEW_CHARS not in user
    assert "[global:style]" in user and "## skill: 0 entries" in user
    assert "r-1 [applied] did a thing; changes: create memory:tests; measured: errors 3→1" in user
    assert NO_INSTRUCTIONS in user and "local refinement" in user
    instructed = build_messages(
        state=[], history=[], conversation="", scope="global", instructions="  only memories "
    )[1]["content"]
    assert "<user_refine_instructions>\nonly memories\n" in instructed
    assert "global refinement" in instructed and "No earlier refinements." in instructed


def test_the_conversation_keeps_its_newest_part() -> None:
    events = [
        event(1, "user_message", {"text": "the oldest words", "source": "user"}),
        event(2, "usage", {"provider": "p", "model": "m"}),
        *(
            event(seq, "tool_result", {"tool_call_id": "c", "text": f"{seq} " + "y" * 3000})
            for seq in range(3, 60)
        ),
        event(60, "assistant_message", {"text": "the newest words", "provider": "p", "model": "m"}),
    ]
    text = serialize_conversation(events, max_chars=CONVERSATION_MAX_CHARS)
    assert len(text) <= CONVERSATION_MAX_CHARS
    assert text.endswith("[assistant] the newest words")
    assert "the oldest words" not in text and "[notice]" not in text
    short = serialize_conversation(events[:2], max_chars=CONVERSATION_MAX_CHARS)
    assert short == "[user] the oldest words"
