"""The chat screen against a real daemon and the scripted model: keys in, state out."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.sandbox.choice import LOCAL_WARNING
from orchestrator.testing import FakeModelServer
from tests.tui.pilot import WAIT_FOR_GO, chat_screen, screen_text, texts, until
from tui.app import PrimeAgentApp
from tui.transcript_view import CellView

SIZE = (100, 30)


async def test_first_message_creates_a_session_streams_and_condenses_cells(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"compute six times seven", "enter")
        await until(pilot, lambda: chat.session_id is not None)
        await until(pilot, lambda: "The answer is **42**." in texts(chat, "assistant"))
        assert texts(chat, "user") == ["compute six times seven"]
        # The daemon runs the tests' sessions on the local backend: the chat says, once, that
        # this one is not isolated (the create-session reply's warning).
        assert texts(chat, "notice") == [LOCAL_WARNING]
        assert chat.streamed > 0  # text arrived as deltas before the stored message
        # The cell is one line: first line of code, status, duration; collapsed.
        (cell,) = chat.query(CellView)
        assert cell.collapsed and "print(6 * 7)" in cell.title and "[ok " in cell.title
        assert cell.item.output.strip() == "42"
        await pilot.press("ctrl+o")
        assert not cell.collapsed
        await until(pilot, lambda: "42" in screen_text(pilot).split("print(6 * 7)", 1)[1])
        await pilot.press("ctrl+o")
        assert cell.collapsed
        # The usage line follows the tree: 120+12+150+6 tokens at $1/$2 per million.
        await until(pilot, lambda: "own 288 tok" in screen_text(pilot))
        assert "$0.0003" in screen_text(pilot)  # 270 in x $1 + 18 out x $2 per million = $0.000306


FAILING = """
code: 1/0
---
text: It failed.
---
500 upstream exploded
---
500 upstream exploded
"""


@pytest.mark.parametrize("model_script", [FAILING])
async def test_errors_are_shown_clearly(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"divide", "enter")
        await until(pilot, lambda: "It failed." in texts(chat, "assistant"))
        (cell,) = chat.query(CellView)
        assert cell.item.label == "error" and cell.has_class("failed")
        assert "ZeroDivisionError" in cell.item.output
        assert "✗ 1/0" in screen_text(pilot)
        await until(pilot, lambda: chat.row.get("status") == "idle")
        await pilot.press(*"again", "enter")
        await until(pilot, lambda: any("upstream exploded" in t for t in texts(chat, "error")))
        assert "✗ model: openai/fake" in screen_text(pilot)  # one red line, not a traceback


STEERED = (
    WAIT_FOR_GO
    + """
---
when "steer this way":
    text: Steered.
---
when "and then this":
    text: Followed up.
"""
)


@pytest.mark.parametrize("model_script", [STEERED])
async def test_enter_steers_a_running_turn_and_alt_enter_queues_a_follow_up(
    daemon: Path, project: Path, fake_model: FakeModelServer
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"start", "enter")
        await until(pilot, lambda: any(c.item.label == "running" for c in chat.query(CellView)))
        assert chat.running
        await pilot.press(*"steer this way", "enter")
        await pilot.press(*"and then this", "alt+enter")
        (project / "go").write_text("")
        await until(pilot, lambda: "Followed up." in texts(chat, "assistant"))
        assert texts(chat, "assistant") == ["Waiting for the go file.", "Steered.", "Followed up."]
        # The steer reached the model inside the first turn (after the cell), the follow-up
        # only after that turn ended.
        last = [r["messages"][-1]["content"] for r in fake_model.requests]
        assert "steer this way" in str(last[1]) and "and then this" in str(last[2])
        assert texts(chat, "user") == ["start", "steer this way", "and then this"]


SLOW = """
text: Thinking slowly.
slow 120
"""


@pytest.mark.parametrize("model_script", [SLOW])
async def test_escape_aborts_the_turn(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"take your time", "enter")
        await until(pilot, lambda: chat.session_id is not None and chat.running)
        await pilot.press("escape")
        await until(pilot, lambda: any("aborted" in t for t in texts(chat, "notice")))
        await until(pilot, lambda: chat.row.get("status") == "idle")


async def test_input_history_and_slash_completion_and_misuse(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        prompt = chat.query_one("#prompt")
        await pilot.press(*"/co", "tab")
        assert prompt.value == "/compact "  # type: ignore[attr-defined]
        # Misuse: one line saying what to do, and nothing is created.
        await pilot.press("enter")
        errors = texts(chat, "error")
        assert len(errors) == 1 and "\n" not in errors[0] and "/compact" in errors[0]
        await pilot.press(*"/frobnicate", "enter")
        assert len(texts(chat, "error")) == 2 and chat.session_id is None
        listed = await app.link.call("list_sessions")
        assert listed["sessions"] == []
        # ↑/↓ walk what was sent, newest first.
        await pilot.press("up")
        assert prompt.value == "/frobnicate"  # type: ignore[attr-defined]
        await pilot.press("up")
        assert prompt.value == "/compact"  # type: ignore[attr-defined]
        await pilot.press("down", "down")
        assert prompt.value == ""  # type: ignore[attr-defined]


FAMILY = """
repeat forever:
    when "spawn two":
        code: hs = [await rlm(f"child {c}", name=c) for c in ("alpha", "beta")]; print("spawned")
    when "spawned":
        text: waiting for children
    when "[task from parent]":
        code:
            r = await agent_message.send("finished")
            print("sent", r.status)
        usage in=10 out=5
    when "sent":
        text: done
    when "[message from child":
        text: noted
"""


@pytest.mark.parametrize("model_script", [FAMILY])
async def test_subagents_are_listed_under_the_input(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"spawn two", "enter")
        await until(pilot, lambda: len(chat.children_rows) == 2)
        await until(
            pilot, lambda: "↳ alpha" in screen_text(pilot) and "↳ beta" in screen_text(pilot)
        )
        names = sorted(str(r["name"]) for r in chat.children_rows)
        assert names == ["alpha", "beta"]
        await until(
            pilot,
            lambda: all(
                (r.get("usage") or {}).get("total", {}).get("tokens") for r in chat.children_rows
            ),
        )
        line = next(ln for ln in screen_text(pilot).splitlines() if "↳ alpha" in ln)
        assert " tok " in line and "$" in line


async def test_a_new_chat_uses_the_model_endpoint_given_with_api_base(
    daemon: Path, project: Path
) -> None:
    # `prime-agent tui --model M --api-base URL`: the endpoint config.toml does not name.
    with FakeModelServer("text: Hello from the other endpoint.") as other:
        app = PrimeAgentApp(daemon, cwd=project, model="openai/elsewhere", api_base=other.url)
        async with app.run_test(size=SIZE) as pilot:
            chat = await chat_screen(pilot, app)
            await pilot.press(*"hi", "enter")
            await until(pilot, lambda: "Hello from the other endpoint." in texts(chat, "assistant"))
        assert len(other.requests) == 1
        assert other.requests[0]["model"] == "elsewhere"
