"""The chat's transcript model (tui/transcript.py): events in, display items out."""

from __future__ import annotations

import json
from typing import Any

from tui.transcript import CELL_OUTPUT_MAX_CHARS, Transcript


def ev(seq: int, kind: str, /, **payload: Any) -> dict[str, Any]:
    return {"type": kind, "seq": seq, "id": f"e{seq}", "payload": payload}


def call(call_id: str, code: str) -> dict[str, Any]:
    return {"id": call_id, "name": "ipython", "arguments": json.dumps({"code": code})}


def test_a_turn_becomes_user_text_cell_and_answer() -> None:
    t = Transcript()
    t.apply(ev(1, "user_message", text="six times seven"))
    t.apply(ev(2, "assistant_message", text="Let me.", tool_calls=[call("c1", "print(6*7)\nx=1")]))
    t.apply(ev(3, "usage", provider="p", model="m"))
    t.apply(ev(4, "tool_result", tool_call_id="c1", text="42\n", duration_ms=12.5))
    t.apply(ev(5, "assistant_message", text="It is 42."))
    t.apply(ev(6, "turn_end", reason="completed"))
    kinds = [(i.kind, i.text) for i in t.items]
    assert kinds == [
        ("user", "six times seven"),
        ("assistant", "Let me."),
        ("cell", "print(6*7)\nx=1"),
        ("assistant", "It is 42."),
    ]
    cell = t.items[2]
    assert (cell.label, cell.output, cell.duration_ms) == ("ok", "42\n", 12.5)
    assert t.cursor == 6


def test_replayed_and_pushed_events_apply_once() -> None:
    t = Transcript()
    first = ev(1, "user_message", text="hi")
    assert t.apply(first) and not t.apply(first)
    assert t.apply(ev(2, "notice", text="n"), cursor=2)
    assert not t.apply(ev(2, "notice", text="n"), cursor=2)
    assert len(t.items) == 2


def test_streamed_text_is_replaced_by_the_stored_message() -> None:
    t = Transcript()
    t.apply(ev(1, "user_message", text="go"))
    for delta in ("The ans", "wer is"):
        t.stream({"type": "text_delta", "delta": delta})
    (streamed,) = [i for i in t.items if i.kind == "assistant"]
    assert streamed.streaming and streamed.text == "The answer is"
    # A delta was dropped on the way: the stored message is the truth.
    t.apply(ev(2, "assistant_message", text="The answer is 42.", tool_calls=[call("c", "1")]))
    assert [i.kind for i in t.items] == ["user", "assistant", "cell"]
    assert (
        t.items[1] is streamed and not streamed.streaming and streamed.text == "The answer is 42."
    )
    assert t.stream({"type": "tool_start", "tool_call_id": "c"}) is t.items[2]
    assert t.items[2].label == "running"
    # Its output shows as it comes; the stored result replaces it.
    for piece in ("1\n", "2\n"):
        assert t.stream({"type": "tool_output", "tool_call_id": "c", "delta": piece}) is t.items[2]
    assert t.items[2].output == "1\n2\n"
    t.apply(ev(3, "tool_result", tool_call_id="c", text="1\n2\n3\n"))
    assert t.items[2].output == "1\n2\n3\n" and t.items[2].label == "ok"
    # Output arriving after the result changes nothing.
    t.stream({"type": "tool_output", "tool_call_id": "c", "delta": "late"})
    assert t.items[2].output == "1\n2\n3\n"


def test_deltas_pushed_while_the_replay_was_read_do_not_repeat_its_answer() -> None:
    """An attach is recorded before its replay is read: the deltas of an answer can reach the
    chat after the replay that holds the whole answer. Stamped with the cursor before that
    answer, they are dropped; a later answer's deltas are shown (the CI failure where the
    steer test saw "Waiting for the go file." twice)."""
    t = Transcript()
    t.apply(ev(1, "user_message", text="go"))
    t.apply(ev(2, "assistant_message", text="Waiting.", tool_calls=[call("c", "1")]))
    assert t.stream({"type": "text_delta", "delta": "Wait"}, after=1) is None
    assert t.stream({"type": "tool_start", "tool_call_id": "c"}, after=1) is None
    assert t.items[2].label == "queued"  # the stale start did not touch the cell either
    assert [i.text for i in t.items if i.kind == "assistant"] == ["Waiting."]
    t.apply(ev(3, "tool_result", tool_call_id="c", text="1"))
    shown = t.stream({"type": "text_delta", "delta": "Done"}, after=3)
    assert shown is not None and shown.streaming
    assert t.stream({"type": "text_delta", "delta": "!"}, after=None) is shown  # unstamped
    t.apply(ev(4, "assistant_message", text="Done!"))
    assert [i.text for i in t.items if i.kind == "assistant"] == ["Waiting.", "Done!"]


def test_failed_cells_errors_and_controls_are_shown() -> None:
    t = Transcript()
    t.apply(ev(1, "assistant_message", tool_calls=[call("c", "1/0")]))
    t.apply(
        ev(
            2,
            "tool_result",
            tool_call_id="c",
            text="x" * (CELL_OUTPUT_MAX_CHARS + 5),
            is_error=True,
        )
    )
    t.apply(ev(3, "error", kind="model", message="rate limited"))
    t.apply(ev(4, "gate_result", command="pytest -q", passed=False))
    t.apply(ev(5, "autonomous_stop", reason="turn_limit", detail="12 turns"))
    t.apply(ev(6, "aborted", reason="interrupted"))
    t.apply(ev(7, "something_new"))
    cell = t.items[0]
    assert cell.label == "error" and len(cell.output) == CELL_OUTPUT_MAX_CHARS
    assert [(i.kind, i.text) for i in t.items[1:]] == [
        ("error", "model: rate limited"),
        ("error", "gate failed: pytest -q"),
        ("notice", "autonomous run stopped: turn_limit — 12 turns"),
        ("notice", "aborted (interrupted)"),
        ("notice", "something new"),
    ]


def test_messages_from_agents_name_their_sender() -> None:
    t = Transcript()
    t.apply(ev(1, "user_message", text="task", source="parent"))
    t.apply(ev(2, "user_message", text="done", source="agent", sender_label="child worker-1"))
    t.apply(ev(3, "user_message", text="go on", source="harness"))
    assert [i.label for i in t.items] == ["task", "child worker-1", "harness"]


def test_invalid_tool_arguments_show_as_they_came() -> None:
    t = Transcript()
    t.apply(ev(1, "assistant_message", tool_calls=[{"id": "c", "arguments": '{"code": "pri'}]))
    assert t.items[0].text == '{"code": "pri'


def test_the_models_reasoning_shows_before_its_answer_streamed_or_stored() -> None:
    t = Transcript()
    t.apply(ev(1, "user_message", text="go"))
    for piece in ("Let me ", "think."):
        t.stream({"type": "thinking_delta", "delta": piece})
    t.stream({"type": "text_delta", "delta": "Answer"})
    assert [(i.kind, i.text, i.streaming) for i in t.items[1:]] == [
        ("thinking", "Let me think.", False),
        ("assistant", "Answer", True),
    ]
    t.apply(ev(2, "assistant_message", text="Answer.", thinking="Let me think."))
    assert [(i.kind, i.text, i.streaming) for i in t.items[1:]] == [
        ("thinking", "Let me think.", False),
        ("assistant", "Answer.", False),
    ]
    # Replayed (no deltas): the stored reasoning comes first, then the answer.
    replay = Transcript()
    replay.apply(ev(1, "user_message", text="go"))
    replay.apply(ev(2, "assistant_message", text="Answer.", thinking="Hmm."))
    assert [(i.kind, i.text) for i in replay.items[1:]] == [
        ("thinking", "Hmm."),
        ("assistant", "Answer."),
    ]
