"""SVG snapshots of every screen at 80×24 and 160×48 (tests/tui/snapshots.py explains how
run-to-run values are masked). One app run per size walks the screens as a person would:
chat after a turn → Agents View → sandbox inspector of an inactive session → usage → tree →
help."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tui.pilot import screen_text, until
from tests.tui.snapshots import assert_snapshot
from tui.agents import AgentsScreen
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.inspector import InspectorScreen
from tui.panels import HelpScreen, TreeScreen, UsageScreen

SIZES = [(80, 24), (160, 48)]
SNAPSHOT_CWD = Path("/tmp/prime-agent-tui-snapshots")
SNAPSHOT_THEME = "textual-dark"


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
async def test_screens(daemon: Path, size: tuple[int, int]) -> None:
    tag = f"{size[0]}x{size[1]}"
    # A new chat's title shows its directory: the same path in every run and on every machine
    # (a tmp_path's length varies, and the layout after it would shift).
    SNAPSHOT_CWD.mkdir(parents=True, exist_ok=True)
    app = PrimeAgentApp(daemon, cwd=SNAPSHOT_CWD)
    async with app.run_test(size=size) as pilot:
        app.theme = SNAPSHOT_THEME  # not whatever TEXTUAL_THEME the machine sets
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await assert_snapshot(pilot, f"new_chat_{tag}")

        await pilot.press(*"compute six times seven", "enter")
        await until(pilot, lambda: chat.row.get("status") == "idle" and chat.session_id is not None)
        await until(pilot, lambda: "own 288 tok" in screen_text(pilot))
        await until(pilot, lambda: "The answer is 42." in screen_text(pilot))
        await assert_snapshot(pilot, f"chat_{tag}")

        assert chat.session_id is not None
        forked = await app.link.call("fork", session=chat.session_id)
        await pilot.press("left")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen))
        agents = app.screen
        assert isinstance(agents, AgentsScreen)
        await until(pilot, lambda: len(agents.visible_rows()) == 2)
        await until(pilot, lambda: "Inactive (1)" in screen_text(pilot))
        await assert_snapshot(pilot, f"agents_{tag}")

        await pilot.press("down")  # from the idle session to the inactive fork
        assert agents.selected_id() == forked["session"]
        await pilot.press("i")
        await until(pilot, lambda: isinstance(app.screen, InspectorScreen))
        await until(pilot, lambda: "inactive" in screen_text(pilot))
        await assert_snapshot(pilot, f"inspector_inactive_{tag}")

        await pilot.press("escape", "escape")
        await until(pilot, lambda: app.screen is chat)
        await pilot.press(*"/usage", "enter")
        await until(pilot, lambda: isinstance(app.screen, UsageScreen) and app.screen.nodes != [])
        await assert_snapshot(pilot, f"usage_{tag}")

        await pilot.press("escape", *"/tree", "enter")
        await until(pilot, lambda: isinstance(app.screen, TreeScreen) and app.screen.nodes != [])
        await assert_snapshot(pilot, f"tree_{tag}")

        await pilot.press("escape", *"/help", "enter")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await assert_snapshot(pilot, f"help_{tag}")
