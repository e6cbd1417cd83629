"""The Tree and Help screens: keys in, state out (the Usage screen is in test_agents.py)."""

from __future__ import annotations

from pathlib import Path

from tests.tui.pilot import chat_screen, screen_text, until
from tui.app import PrimeAgentApp
from tui.panels import HelpScreen, TreeScreen
from tui.slash import COMMANDS

SIZE = (120, 36)


async def test_tree_enter_branches_and_help_lists_every_command(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"compute six times seven", "enter")
        await until(pilot, lambda: chat.row.get("status") == "idle" and chat.session_id is not None)
        sid = chat.session_id

        await pilot.press(*"/tree", "enter")
        await until(pilot, lambda: isinstance(app.screen, TreeScreen) and app.screen.nodes != [])
        tree = app.screen
        assert isinstance(tree, TreeScreen)
        seqs = [n["seq"] for n in tree.nodes]
        assert seqs == list(range(1, len(seqs) + 1)) and all(n["active"] for n in tree.nodes)
        assert tree.query_one("#tree").highlighted == len(seqs) - 1  # type: ignore[attr-defined]
        # Enter on the second event (the first answer) moves the leaf there.
        await pilot.press("home", "down", "enter")
        await until(pilot, lambda: "leaf moved to event 2" in screen_text(pilot))
        page = await app.link.call("tree", session=sid)
        assert page["leaf_seq"] == 2
        await until(
            pilot, lambda: [n["active"] for n in tree.nodes][2:] == [False] * (len(seqs) - 2)
        )
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat)

        await pilot.press(*"/help", "enter")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(pilot)
        assert all(f"/{spec.name}" in text for spec in COMMANDS[:6])  # the rest scroll
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat)
