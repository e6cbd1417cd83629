"""``prime-agent import``'s store side: pi / Prime Agent session files of versions 1, 2 and 3
(tests/fixtures/jsonl/, written by hand from the format's documentation), the round trip
import → export → import, and malformed files (one-line error naming the line, nothing kept)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.context import SUMMARY_PREFIX, ContextBuilder
from orchestrator.errors import UserError
from orchestrator.ids import new_session_id
from orchestrator.store import tree
from orchestrator.store.context_queries import read_context_path
from orchestrator.store.db import EventRecord, SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    CompactionPayload,
    ModelChangePayload,
    NoticePayload,
    ToolCall,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)
from orchestrator.store.jsonl import LEAF_MARKER, export_session_jsonl
from orchestrator.store.jsonl_import import ImportOptions, ImportResult, import_session_jsonl
from orchestrator.store.jsonl_parse import parse_session_jsonl, read_session_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl"
FALLBACK_CWD = "/fallback/cwd"
DEFAULT_MODEL = "local/qwen2.5-coder-0.5b"
OPTIONS = ImportOptions(default_model=DEFAULT_MODEL, fallback_cwd=FALLBACK_CWD)
MICROS_PER_MS = 1000
REFERENCES = ("firstKeptEntryId", "fromId", "targetId")


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with await Store.open(tmp_path / "db" / "import.duckdb") as s:
        yield s


async def import_file(store: Store, path: Path, options: ImportOptions = OPTIONS) -> ImportResult:
    return await import_session_jsonl(store, read_session_file(path), options)


async def import_text(store: Store, text: str, options: ImportOptions = OPTIONS) -> ImportResult:
    lines = enumerate(text.splitlines(), start=1)
    return await import_session_jsonl(store, parse_session_jsonl(lines, source="x"), options)


async def export_text(store: Store, sid: str) -> str:
    out = io.StringIO()
    await export_session_jsonl(store, sid, out)
    return out.getvalue()


async def context_of(store: Store, sid: str) -> list[dict[str, Any]]:
    """What the model would be sent: from the newest compaction's summary on, when there is one."""
    builder = ContextBuilder()
    builder.load(await read_context_path(store, sid))
    return builder.messages


def shape(events: list[EventRecord], leaf: str | None) -> list[Any]:
    """Events with their ids replaced by positions: what a round trip must keep exactly."""
    seq = {e.id: e.seq for e in events}

    def pos(value: Any) -> Any:
        return seq.get(value, value) if isinstance(value, str) else value

    out: list[Any] = []
    for e in events:
        payload = dict(e.payload)
        # The file's entry an imported event keeps: checked by the fidelity tests below.
        payload.pop("source_entry", None)
        payload.pop("entry_id", None)
        if e.type == "branch_summary":
            payload["from_event_id"] = pos(payload["from_event_id"])
        if e.type == "compaction":
            for key in ("first_kept_event_id", "pinned_event_id"):
                payload[key] = pos(payload[key])
        if e.type == "custom":
            payload["fields"] = {
                k: pos(v) if k in REFERENCE_FIELDS_SET else v for k, v in payload["fields"].items()
            }
        ms = e.ts.replace(microsecond=e.ts.microsecond // MICROS_PER_MS * MICROS_PER_MS)
        out.append((e.seq, pos(e.parent_event_id), e.type, ms, payload))  # pi keeps ms
    out.append(("leaf", pos(leaf)))
    return out


REFERENCE_FIELDS_SET = frozenset(REFERENCES)


async def round_trip(store: Store, sid: str) -> tuple[str, str]:
    """Export ``sid``, import the file; return (the exported text, the new session id)."""
    text = await export_text(store, sid)
    again = await import_text(store, text)
    return text, again.session.id


async def assert_same_history(store: Store, a: str, b: str) -> None:
    ra, rb = await store.get_session(a), await store.get_session(b)
    assert ra is not None and rb is not None
    ea, eb = await store.events(a), await store.events(b)
    assert shape(ea, ra.leaf_event_id) == shape(eb, rb.leaf_event_id)
    assert await context_of(store, a) == await context_of(store, b)
    assert (ra.model, ra.cwd, ra.backend) == (rb.model, rb.cwd, rb.backend)


# -- each version ----------------------------------------------------------------------------


async def test_version_3_keeps_the_tree_and_every_entry(store: Store) -> None:
    result = await import_file(store, FIXTURES / "v3_tree.jsonl")
    rec = result.session
    assert (result.version, result.events, result.custom) == (3, 18, 6)
    assert rec.name == "fixture v3" and rec.status == "inactive" and rec.cwd == "/tmp"
    assert rec.model == "anthropic/claude-sonnet-4-5"  # the newest on the active path
    assert rec.root_id == rec.id and rec.parent_id is None
    assert rec.created_at.isoformat() == "2025-03-01T10:00:00+00:00"
    events = await store.events(rec.id)
    by_seq = {e.seq: e for e in events}
    assert [e.type for e in events] == [
        "custom",  # session_info
        "user_message",
        "assistant_message",
        "tool_result",
        "assistant_message",
        "custom",  # label
        "user_message",
        "assistant_message",
        "branch_summary",
        "model_change",
        "custom",  # thinking_level_change
        "user_message",
        "assistant_message",
        "compaction",
        "custom",  # custom
        "custom",  # custom_message
        "custom",  # future_entry_kind
        "user_message",
    ]
    # The tree: the branch summary hangs off the label (seq 6), like "Now double it" (seq 7).
    assert by_seq[9].parent_event_id == by_seq[6].id == by_seq[7].parent_event_id
    assert rec.leaf_event_id == events[-1].id
    path = await store.active_path(rec.id)
    assert [e.seq for e in path] == [1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]
    # References between entries point at the imported events.
    assert by_seq[9].payload["from_event_id"] == by_seq[8].id
    assert by_seq[6].payload == {
        "entry_type": "label",
        "fields": {"targetId": by_seq[3].id, "label": "computed"},
        "entry_id": "a0000006",
    }
    compaction = by_seq[14].payload
    assert compaction["first_kept_event_id"] == by_seq[12].id
    assert (compaction["tokens_before"], compaction["reason"]) == (1200, "imported")
    assert compaction["read_files"] == ["notes.md"] and compaction["pinned_event_id"] is None
    assert by_seq[10].payload == {
        "model": "anthropic/claude-sonnet-4-5",
        "previous": None,
        "api_base": None,
        "previous_api_base": None,
        "source_entry": {
            "type": "model_change",
            "id": "a000000a",
            "parentId": "a0000009",
            "timestamp": "2025-03-01T10:01:01.000Z",
            "provider": "anthropic",
            "modelId": "claude-sonnet-4-5",
        },
    }
    assert by_seq[17].payload == {
        "entry_type": "future_entry_kind",
        "fields": {"whatever": {"nested": [1, 2, 3]}},
        "entry_id": "a0000011",
    }
    call = by_seq[3].payload
    assert call["text"] == "Let me compute." and call["stop_reason"] == "tool_calls"
    assert call["tool_calls"] == [
        {"id": "call_1", "name": "ipython", "arguments": '{"code": "6*7"}'}
    ]
    assert call["usage"]["cost_usd"] == pytest.approx(0.0003)
    assert by_seq[5].payload["usage"]["cost_usd"] is None  # pi's 0: unknown, never "free"
    assert by_seq[18].payload["text"] == "Thanks!\n[image omitted: image/png]"
    assert by_seq[2].ts.isoformat() == "2025-03-01T10:00:01+00:00"
    # The context starts from the compaction: its summary, then its kept span and what followed.
    ctx = await context_of(store, rec.id)
    assert [m["role"] for m in ctx] == ["user", "user", "assistant", "user"]
    assert ctx[0]["content"].startswith(SUMMARY_PREFIX) and "Arithmetic on 42." in ctx[0]["content"]
    assert [m["content"] for m in ctx[1:]] == [
        "Now triple it.",
        "126.",
        "Thanks!\n[image omitted: image/png]",
    ]
    # The file's calls are usage rows marked imported: in the totals, out of every budget.
    (usage,) = await store.usage_summary([rec.id])
    assert (usage.calls, usage.imported_calls) == (4, 4)
    (budgeted,) = await store.usage_summary([rec.id], imported=False)
    assert budgeted.calls == 0


async def test_version_2_renames_hook_messages_and_keeps_branches(store: Store) -> None:
    result = await import_file(store, FIXTURES / "v2_tree.jsonl")
    rec = result.session
    assert (result.version, result.events, result.custom) == (2, 7, 1)
    assert rec.cwd == FALLBACK_CWD  # the file's cwd does not exist here
    assert rec.model == "anthropic/claude-3-5-sonnet" and rec.name == "Hello"
    events = await store.events(rec.id)
    hook = events[5]
    assert hook.type == "custom" and hook.payload["fields"]["message"]["role"] == "custom"
    assert events[4].parent_event_id == events[1].id  # plan B branches off the first answer
    ctx = await context_of(store, rec.id)
    assert [m["content"] for m in ctx] == [
        "Hello",
        "Hi! What should we try?",
        "Try plan B",
        "Plan B works.",
    ]


async def test_version_1_is_linear_and_compactions_name_the_kept_entry(store: Store) -> None:
    result = await import_file(store, FIXTURES / "v1_linear.jsonl")
    events = await store.events(result.session.id)
    assert (result.version, len(events)) == (1, 7)
    assert [e.parent_event_id for e in events] == [None] + [e.id for e in events[:-1]]
    compaction = events[4].payload
    assert events[4].type == "compaction"
    assert compaction["first_kept_event_id"] == events[3].id  # index 4 (the header is 0)
    ctx = await context_of(store, result.session.id)
    assert [m["content"] for m in ctx[1:]] == ["Two files: a.txt and b.txt.", "Delete b.txt"]
    assert events[5].payload["fields"]["message"]["role"] == "custom"
    assert events[1].payload["tool_calls"][0]["name"] == "bash"
    assert result.session.leaf_event_id == events[-1].id
    assert result.session.name == "List the files."


async def test_names_stay_unique_and_options_win(store: Store) -> None:
    first = await import_file(store, FIXTURES / "v2_tree.jsonl")
    second = await import_file(store, FIXTURES / "v2_tree.jsonl")
    assert (first.session.name, second.session.name) == ("Hello", "Hello (import)")
    chosen = ImportOptions(
        model="openai/fake", cwd="/here", backend="docker", name="mine", default_model="x"
    )
    third = await import_file(store, FIXTURES / "v2_tree.jsonl", chosen)
    rec = third.session
    assert (rec.model, rec.cwd, rec.backend, rec.name) == ("openai/fake", "/here", "docker", "mine")
    empty = await import_text(store, '{"type":"session","version":3,"id":"e","cwd":"/tmp"}\n')
    assert empty.events == 0 and empty.session.model == DEFAULT_MODEL
    assert empty.session.leaf_event_id is None


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v1_linear.jsonl", "v2_tree.jsonl", "v3_tree.jsonl"])
async def test_import_export_import_keeps_everything(store: Store, name: str) -> None:
    first = await import_file(store, FIXTURES / name)
    text, second = await round_trip(store, first.session.id)
    await assert_same_history(store, first.session.id, second)
    entries = [json.loads(line) for line in text.splitlines()]
    assert entries[0]["version"] == 3
    types = [e["type"] for e in entries[1:]]
    if name == "v3_tree.jsonl":
        for kind in ("compaction", "branch_summary", "model_change", "label", "future_entry_kind"):
            assert kind in types, kind
        compaction = next(e for e in entries if e["type"] == "compaction")
        kept = next(e for e in entries if e["id"] == compaction["firstKeptEntryId"])
        assert kept["message"]["content"] == [{"type": "text", "text": "Now triple it."}]
        model = next(e for e in entries if e["type"] == "model_change")
        assert (model["provider"], model["modelId"]) == ("anthropic", "claude-sonnet-4-5")
        for kind in ("label",):
            assert kind in types, kind
    # ... and a third pass is byte-for-byte the second export (ids are derived stably).
    _, third = await round_trip(store, second)
    await assert_same_history(store, second, third)


async def test_our_own_sessions_round_trip(store: Store) -> None:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/tmp", model="openai/fake", backend="local")
    )
    usage = UsagePayload(provider="openai", model="fake", input=9, output=3, cost_usd=0.002)
    first = await store.append(
        sid, "user_message", UserMessagePayload(text="task", source="parent")
    )
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(
            text="```python\nprint(1)\n```",
            tool_calls=[ToolCall(id="f1", name="ipython", arguments="{broken")],
            fenced=True,
            provider="openai",
            model="fake",
            usage=usage.model_copy(update={"latency_ms": 0.0}),
        ),
    )
    await store.append(sid, "usage", usage.model_copy(update={"latency_ms": 12.5}))
    tool = ToolResultPayload(tool_call_id="f1", text="1", duration_ms=4.0, status="ok")
    result = await store.append(sid, "tool_result", tool)
    await store.append(
        sid,
        "user_message",
        UserMessagePayload(text="hi", source="agent", sender="s-x", sender_label="child a"),
    )
    await store.append(sid, "notice", NoticePayload(text="[notice] something"))
    await store.append(sid, "model_change", ModelChangePayload(model="openai/other", previous="x"))
    await store.append(
        sid,
        "compaction",
        CompactionPayload(
            summary="## Goal\nthe task",
            first_kept_event_id=result.id,
            pinned_event_id=first.id,
            tokens_before=900,
            tokens_after=100,
            reason="manual",
            instructions="keep the numbers",
            read_files=["a.py"],
            kernel_note="x dropped",
            model="openai/other",
            summarized_events=3,
        ),
    )
    await tree.branch(store, sid, result.id, summary="Said hi, got a notice.")
    await store.append(
        sid,
        "assistant_message",
        AssistantMessagePayload(text="ok", provider="openai", model="fake"),
    )
    await tree.branch(store, sid, "5")  # the leaf is now an event with children
    text, copy = await round_trip(store, sid)
    last = json.loads(text.splitlines()[-1])
    assert last["type"] == "custom" and last["customType"] == LEAF_MARKER
    await assert_same_history(store, sid, copy)
    events = await store.events(copy)
    assert len(events) == 10  # the marker is not history
    assert events[2].type == "usage" and events[2].payload["latency_ms"] == 12.5
    # The copy's one assistant message with usage is an imported call: shown, never budgeted.
    (copied_usage,) = await store.usage_summary([copy])
    assert (copied_usage.calls, copied_usage.imported_calls) == (1, 1)
    assert (copied_usage.input, copied_usage.output, copied_usage.cost_usd) == (9, 3, 0.002)
    (budgeted,) = await store.usage_summary([copy], imported=False)
    assert (budgeted.calls, budgeted.input) == (0, 0)


# -- malformed files -------------------------------------------------------------------------

HEADER = '{"type":"session","version":3,"id":"h","cwd":"/tmp"}'
USER = '{"type":"message","id":"%s","parentId":%s,"message":{"role":"user","content":"hi"}}'
ROOT_A = USER % ("a", "null")
CHILD_B_OF_ZZ = USER % ("b", '"zz"')
AGAIN_A = USER % ("a", '"a"')


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("", 1, "no session header"),
        (ROOT_A, 1, "not a session header"),
        ('{"type":"session","version":4,"id":"h"}', 1, "version 4"),
        (f"{HEADER}\n{ROOT_A}\n{{oops", 3, "not JSON"),
        (f"{HEADER}\n[1, 2]", 2, "not a JSON object"),
        (f"{HEADER}\n{ROOT_A}\n{CHILD_B_OF_ZZ}", 3, "names no earlier"),
        (f"{HEADER}\n{ROOT_A}\n{AGAIN_A}", 3, "appears twice"),
        (f'{HEADER}\n{{"type":"message","parentId":null,"message":{{}}}}', 2, "needs an id"),
        (f'{HEADER}\n{{"type":"message","id":"a","message":{{"role":"user"}}}}', 2, "content"),
        (f'{HEADER}\n{{"type":"label","id":"a","x":NaN}}', 2, "NaN"),
        (f"{HEADER}\n{HEADER}", 2, "second session header"),
        (f'{HEADER}\n{{"id":"a"}}', 2, "type"),
    ],
)
async def test_malformed_lines_are_named_and_nothing_is_imported(
    store: Store, text: str, line: int, reason: str
) -> None:
    with pytest.raises(UserError, match=rf"^x line {line}: .*{reason}") as info:
        await import_text(store, text)
    assert "\n" not in str(info.value)
    assert await store.list_sessions() == []


async def test_a_payload_refused_at_insert_rolls_the_whole_import_back(store: Store) -> None:
    bad = '{"type":"message","id":"b","parentId":"a","message":{"role":"user","content":"x",'
    bad += '"primeAgent":{"source":"martian"}}}'
    with pytest.raises(UserError, match=r"^x line 3: source"):
        await import_text(store, f"{HEADER}\n{ROOT_A}\n{bad}")
    assert await store.list_sessions() == []


def test_files_that_are_not_utf8_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(HEADER.encode() + b"\n\xff\xfe\n")
    with pytest.raises(UserError, match=r"bad.jsonl line 2: not UTF-8"):
        read_session_file(path)
    with pytest.raises(UserError, match="cannot read"):
        read_session_file(tmp_path / "missing.jsonl")
