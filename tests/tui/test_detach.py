"""Detach and attach (docs/tui.md): quitting the TUI leaves its sessions running in the daemon;
a new TUI finds them in the Agents View and replays what happened while none was attached."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api import ControlClient
from orchestrator.testing import FakeModelServer
from tests.helpers import cli
from tests.tui.pilot import WAIT_FOR_GO, chat_screen, screen_text, texts, until
from tui.agents import AgentsScreen, group_of
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.transcript_view import CellView

SIZE = (100, 30)
TURN_TIMEOUT_S = 90.0

# The cell waits for a file the test creates only after the TUI has quit.
WAITS_FOR_GO = (
    WAIT_FOR_GO
    + """
---
when "went": text: Finished while you were away.
"""
)


@pytest.mark.parametrize("model_script", [WAITS_FOR_GO], ids=["waits-for-go"])
async def test_quit_mid_turn_detaches_and_a_new_tui_shows_what_happened_meanwhile(
    daemon: Path, project: Path, fake_model: FakeModelServer
) -> None:
    first = PrimeAgentApp(daemon, cwd=project)
    async with first.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, first)
        await pilot.press(*"start", "enter")
        await until(pilot, lambda: any(c.item.label == "running" for c in chat.query(CellView)))
        assert chat.session_id is not None and chat.running
        sid = chat.session_id
        await pilot.press("ctrl+q")
    assert len(fake_model.requests) == 1  # quit inside the cell: the reply is still to come
    assert first.return_code == 0 and first.failure is None
    assert first._link is not None and first._link.client.closed  # the TUI's connection is gone

    async with await ControlClient.connect(daemon) as client:
        row = (await client.call("get_session", session=sid))["session"]
        assert row["status"] == "running"  # the turn goes on without a TUI
        (project / "go").write_text("")
        quiet = await client.call("wait_quiet", session=sid, timeout_s=TURN_TIMEOUT_S)
        assert quiet["final_text"] == "Finished while you were away."
        row = (await client.call("get_session", session=sid))["session"]
        assert row["status"] == "idle"

    second = PrimeAgentApp(daemon, cwd=project)
    async with second.run_test(size=SIZE) as pilot:
        fresh = await chat_screen(pilot, second)
        assert fresh.session_id is None  # a new chat, not the old session's
        await pilot.press("left")
        await until(pilot, lambda: isinstance(second.screen, AgentsScreen))
        agents = second.screen
        assert isinstance(agents, AgentsScreen)
        await until(pilot, lambda: [r["id"] for r in agents.visible_rows()] == [sid])
        assert group_of(agents.rows[0]) == "Idle"
        await until(pilot, lambda: "Idle (1)" in screen_text(pilot))
        assert "Running (0)" in screen_text(pilot) and "Inactive (0)" in screen_text(pilot)
        assert agents.selected_id() == sid
        await pilot.press("enter")
        await until(
            pilot, lambda: isinstance(second.screen, ChatScreen) and second.screen.session_id == sid
        )
        reopened = second.screen
        assert isinstance(reopened, ChatScreen)
        await until(pilot, lambda: "Finished while you were away." in texts(reopened, "assistant"))
        assert texts(reopened, "user") == ["start"]
        assert texts(reopened, "assistant") == [
            "Waiting for the go file.",
            "Finished while you were away.",
        ]
        (cell,) = reopened.query(CellView)
        assert cell.item.label == "ok" and cell.item.output.strip() == "went"
        assert "import pathlib, time" in cell.title and "[ok " in cell.title
        await until(pilot, lambda: "Finished while you were away." in screen_text(pilot))
        text = screen_text(pilot)
        assert "✓ import pathlib, time" in text and "Waiting for the go file." in text


async def test_session_argument_opens_its_chat_with_the_history_replayed(
    daemon: Path, project: Path
) -> None:
    async with await ControlClient.connect(daemon) as client:
        created = await client.call(
            "create_session", cwd=str(project), task="compute six times seven", backend="local"
        )
        sid = str(created["session"])
        quiet = await client.call("wait_quiet", session=sid, timeout_s=TURN_TIMEOUT_S)
        assert quiet["final_text"] == "The answer is **42**."

    app = PrimeAgentApp(daemon, cwd=project, session=sid)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        assert chat.session_id == sid and len(app.screen_stack) == 2  # straight in: no new chat
        await until(pilot, lambda: "The answer is **42**." in texts(chat, "assistant"))
        assert texts(chat, "user") == ["compute six times seven"]
        assert texts(chat, "assistant") == ["Let me compute.", "The answer is **42**."]
        (cell,) = chat.query(CellView)
        assert cell.item.label == "ok" and cell.item.output.strip() == "42"
        assert chat.streamed == 0  # replayed from the store, nothing streamed
        await until(pilot, lambda: "The answer is 42." in screen_text(pilot))
        text = screen_text(pilot)
        assert "compute six times seven" in text and "print(6 * 7)" in text
        await until(pilot, lambda: chat.row.get("status") == "idle")
        assert str(chat.row.get("name") or sid) in text.splitlines()[0]

    # By name, as the CLI takes it; an unknown one ends the app with one line.
    by_name = PrimeAgentApp(daemon, cwd=project, session="compute six times seven")
    async with by_name.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, by_name)
        assert chat.session_id == sid
    unknown = PrimeAgentApp(daemon, cwd=project, session="no-such-session")
    async with unknown.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: unknown.failure is not None)
    assert unknown.failure == "no session matches 'no-such-session'"
    assert unknown.return_code == 1


async def test_a_daemon_that_goes_away_ends_the_tui_with_one_line(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await chat_screen(pilot, app)
        stopped = cli(["daemon", "stop"])
        assert stopped.returncode == 0, stopped.stderr
        await until(pilot, lambda: app.failure is not None)
    assert app.failure == "the daemon closed the connection" and app.return_code == 1
