"""Where compaction cuts (``find_cut``): never inside a tool call/result pair, never at the head
(summary, pinned turn), keeping the newest ``keep_tokens``; and what the summary call sees."""

from __future__ import annotations

import random

import pytest

from orchestrator.agent.compaction import (
    SUMMARY_SECTIONS,
    file_hints,
    find_cut,
    serialize_for_summary,
)
from orchestrator.agent.context import ContextBuilder, ContextEntry
from orchestrator.store.events import (
    AssistantMessagePayload,
    ToolCall,
    ToolResultPayload,
    UserMessagePayload,
)

RANDOM_SEED = 1234
RANDOM_CASES = 300


def user(tokens: int = 10, event: str | None = None) -> ContextEntry:
    return ContextEntry(event, "message", tokens, user=True)


def asst(*calls: str, tokens: int = 10) -> ContextEntry:
    return ContextEntry(None, "message", tokens, calls=calls)


def tool(call: str, tokens: int = 10) -> ContextEntry:
    return ContextEntry(None, "message", tokens, answers=call)


def _splits(entries: list[ContextEntry], cut: int) -> bool:
    made = {c: i for i, e in enumerate(entries) for c in e.calls}
    return any(
        e.answers is not None and made.get(e.answers, cut) < cut <= i for i, e in enumerate(entries)
    )


def test_a_cut_that_would_land_on_a_tool_result_moves_to_its_call() -> None:
    entries = [user(), asst("a"), tool("a", 50), asst("b"), tool("b", 50), asst()]
    # keeping 60 tokens reaches back to tool("b"); the call that made it is kept with it
    cut = find_cut(entries, 60, force=False)
    assert cut == 3
    assert not _splits(entries, cut)


def test_parallel_calls_stay_with_all_their_results() -> None:
    entries = [user(), asst(), user(), asst("a", "b"), tool("a", 40), tool("b", 40), asst()]
    cut = find_cut(entries, 50, force=False)
    assert cut == 3  # not at tool("b"), not at tool("a")
    assert not _splits(entries, cut)


def test_keeps_at_least_keep_tokens_at_the_latest_valid_point() -> None:
    entries = [user(100), asst(tokens=100), user(100), asst(tokens=100), user(100)]
    assert find_cut(entries, 150, force=False) == 3  # 200 kept
    assert find_cut(entries, 300, force=False) == 2
    assert find_cut(entries, 10_000, force=False) is None  # all of it fits: nothing to do


def test_forced_compaction_of_a_short_context_keeps_the_newest_exchange() -> None:
    entries = [user(), asst("a"), tool("a"), asst("b"), tool("b")]
    assert find_cut(entries, 10_000, force=True) == 3


def test_summary_and_pinned_head_is_never_a_cut_point_or_counted_as_work() -> None:
    head = [ContextEntry(None, "summary", 500), ContextEntry("u1", "pinned", 500, user=True)]
    assert find_cut([*head, asst()], 1, force=True) is None  # nothing to summarise
    entries = [*head, asst("a"), tool("a"), asst()]
    cut = find_cut(entries, 1, force=False)
    assert cut == 4
    assert find_cut(entries, 15, force=False) is None  # would keep everything after the head
    assert find_cut(entries, 15, force=True) == 4


def test_random_histories_never_split_a_pair() -> None:
    rng = random.Random(RANDOM_SEED)
    for _ in range(RANDOM_CASES):
        entries: list[ContextEntry] = []
        for step in range(rng.randint(1, 30)):
            kind = rng.random()
            if kind < 0.3:
                entries.append(user(rng.randint(1, 200)))
            else:
                calls = tuple(f"c{step}-{k}" for k in range(rng.randint(0, 3)))
                entries.append(asst(*calls, tokens=rng.randint(1, 200)))
                for call in calls:
                    entries.append(tool(call, rng.randint(1, 500)))
        keep = rng.randint(1, 2000)
        for force in (False, True):
            cut = find_cut(entries, keep, force=force)
            if cut is None:
                continue
            assert 0 < cut < len(entries)
            assert entries[cut].answers is None
            assert not _splits(entries, cut)
            if not force:
                assert sum(e.tokens for e in entries[cut:]) >= keep


def test_context_entries_follow_messages_fenced_and_native() -> None:
    ctx = ContextBuilder()
    ctx.add("user_message", UserMessagePayload(text="go").model_dump(), event_id="e1")
    native = ToolCall(id="n1", name="ipython", arguments='{"code": "1"}')
    fenced = ToolCall(id="f1", name="ipython", arguments='{"code": "2"}')
    ctx.add(
        "assistant_message",
        AssistantMessagePayload(tool_calls=[native], provider="p", model="m").model_dump(),
        event_id="e2",
    )
    ctx.add("tool_result", ToolResultPayload(tool_call_id="n1", text="1").model_dump())
    ctx.add(
        "assistant_message",
        AssistantMessagePayload(
            text="```python\n2\n```", tool_calls=[fenced], provider="p", model="m", fenced=True
        ).model_dump(),
        event_id="e4",
    )
    ctx.add("tool_result", ToolResultPayload(tool_call_id="f1", text="2").model_dump())
    assert len(ctx.entries) == len(ctx.messages) == 5
    assert [e.answers for e in ctx.entries] == [None, None, "n1", None, "f1"]
    assert ctx.messages[4]["role"] == "user"  # a fenced result is a user message...
    assert find_cut(ctx.entries, 1, force=False) == 3  # ...but never a cut point
    assert ctx.index_of("e2") == 1


def test_serialized_conversation_labels_roles_and_cuts_long_results() -> None:
    ctx = ContextBuilder()
    ctx.add("user_message", UserMessagePayload(text="task").model_dump())
    call = ToolCall(id="c", name="ipython", arguments='{"code": "print(1)"}')
    ctx.add(
        "assistant_message",
        AssistantMessagePayload(
            text="let me", tool_calls=[call], provider="p", model="m"
        ).model_dump(),
    )
    ctx.add("tool_result", ToolResultPayload(tool_call_id="c", text="x" * 5000).model_dump())
    text = serialize_for_summary(ctx.messages, ctx.entries)
    assert "[user]\ntask" in text and "[assistant]\nlet me" in text
    assert "[ipython call]\nprint(1)" in text
    assert "[tool result]" in text and "chars cut" in text and len(text) < 3000


@pytest.mark.parametrize(
    ("code", "read", "modified"),
    [
        ("edit('a.py', 'x', 'y')", [], ["a.py"]),
        ("open('data.csv').read()", ["data.csv"], []),
        ("open(\"out.txt\", 'w')", [], ["out.txt"]),
        ("Path('n.md').write_text(s); Path('m.md').read_text()", ["m.md"], ["n.md"]),
    ],
)
def test_file_hints(code: str, read: list[str], modified: list[str]) -> None:
    assert file_hints([code]) == (read, modified)


def test_summary_sections_are_the_spec_ones() -> None:
    for needed in ("Goal", "Constraints & Preferences", "Done", "In Progress", "Blocked"):
        assert any(needed in s for s in SUMMARY_SECTIONS)
    for needed in ("Key Decisions", "Next Steps", "Critical Context", "Files", "Variables"):
        assert any(needed in s for s in SUMMARY_SECTIONS)


def test_the_turn_in_flight_is_not_counted_as_work_to_summarise() -> None:
    entries = [user(event="turn"), asst("a"), tool("a"), asst("b"), tool("b")]
    assert find_cut(entries, 10_000, force=True, protect=0) == 3
    only_turn = [user(event="turn"), asst("a"), tool("a")]
    assert find_cut(only_turn, 1, force=True, protect=0) is None
