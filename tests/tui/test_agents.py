"""The Agents View and the usage panel against a real daemon: keys in, state out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tui.pilot import screen_text, until, until_async
from tui import format as fmt
from tui.agents import AgentsScreen, ComposeScreen
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.panels import UsageScreen

SIZE = (120, 36)

FAMILY = """
repeat forever:
    when "finished without messaging":
        text: noted
    when "spawn family":
        code: h = await rlm("alpha spawns", name="alpha"); print("root spawned")
    when "root spawned":
        text: waiting for alpha
        usage in=100 out=10
    when "alpha spawns":
        code: g = await rlm("gamma works", name="gamma"); print("alpha spawned")
    when "alpha spawned":
        text: alpha waits
        usage in=40 out=4
    when "gamma works":
        text: gamma done
        usage in=20 out=2
"""


@pytest.fixture
def extra_config() -> str:
    return "max_depth = 2\n"  # root → alpha → gamma


async def _sessions(app: PrimeAgentApp) -> list[dict[str, Any]]:
    listed = await app.link.call("list_sessions")
    return list(listed["sessions"])


async def _settled(app: PrimeAgentApp, pilot: Any, count: int) -> list[dict[str, Any]]:
    """The sessions once there are ``count`` of them and none is running."""
    rows: list[dict[str, Any]] = []

    async def settled() -> bool:
        rows[:] = await _sessions(app)
        return len(rows) == count and all(r["status"] != "running" for r in rows)

    await until_async(pilot, settled, what=lambda: [(r["name"], r["status"]) for r in rows])
    return rows


def _by_name(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in rows if r.get("name") == name)


@pytest.mark.parametrize("model_script", [FAMILY])
async def test_agents_view_drills_into_subagents_and_opens_their_chats(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        root_chat = app.screen
        assert isinstance(root_chat, ChatScreen)
        await pilot.press(*"spawn family", "enter")
        await until(pilot, lambda: len(root_chat.children_rows) == 1)
        rows = await _settled(app, pilot, 3)
        root, alpha, gamma = (_by_name(rows, n) for n in ("spawn family", "alpha", "gamma"))
        assert (root["depth"], alpha["depth"], gamma["depth"]) == (0, 1, 2)

        # ← on the empty input: the top level lists root sessions only.
        await pilot.press("left")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen))
        top = app.screen
        assert isinstance(top, AgentsScreen) and top.parent_id is None
        await until(pilot, lambda: [r["id"] for r in top.visible_rows()] == [root["id"]])
        assert "Idle (1)" in screen_text(pilot) and "spawn family" in screen_text(pilot)

        # → drills into the selected session's subagents, recursively.
        await pilot.press("right")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen) and app.screen is not top)
        level1 = app.screen
        assert isinstance(level1, AgentsScreen) and level1.parent_id == root["id"]
        await until(pilot, lambda: [r["id"] for r in level1.visible_rows()] == [alpha["id"]])
        assert "Subagents of spawn family" in screen_text(pilot)
        await pilot.press("right")
        await until(
            pilot, lambda: isinstance(app.screen, AgentsScreen) and app.screen is not level1
        )
        level2 = app.screen
        assert isinstance(level2, AgentsScreen) and level2.parent_id == alpha["id"]
        await until(pilot, lambda: [r["id"] for r in level2.visible_rows()] == [gamma["id"]])
        line = next(ln for ln in screen_text(pilot).splitlines() if "gamma" in ln)
        assert "d2" in line and "local" in line and "22 tok" in line

        # ← goes back up one level; Enter opens the highlighted session's chat.
        await pilot.press("left")
        assert app.screen is level1
        await pilot.press("right")
        await until(
            pilot, lambda: isinstance(app.screen, AgentsScreen) and app.screen is not level1
        )
        await until(pilot, lambda: app.screen.selected_id() == gamma["id"])  # type: ignore[attr-defined]
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat = app.screen
        assert isinstance(chat, ChatScreen) and chat.session_id == gamma["id"]
        await until(pilot, lambda: "gamma done" in screen_text(pilot))
        assert [i.label for i in chat.transcript.items if i.kind == "user"] == ["task"]

        # From a chat, Ctrl-G opens that session's own subagents (none for gamma).
        await pilot.press("ctrl+g")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen))
        assert app.screen.parent_id == gamma["id"]  # type: ignore[attr-defined]
        await until(pilot, lambda: "no subagents" in screen_text(pilot))


@pytest.mark.parametrize("model_script", [FAMILY])
async def test_usage_panel_shows_own_and_total_for_the_tree(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await pilot.press(*"spawn family", "enter")

        await _settled(app, pilot, 3)
        await until(pilot, lambda: "noted" in screen_text(pilot))
        # The usage line catches up with the tree at its next refresh.
        await until(
            pilot,
            lambda: (
                int((chat.usage.get("total") or {}).get("tokens", 0))
                > int((chat.usage.get("own") or {}).get("tokens", 0)) + 22
            ),
        )
        own = int(chat.usage["own"]["tokens"])
        assert f"own {fmt.tokens(own)} tok" in screen_text(pilot)
        await pilot.press(*"/usage", "enter")
        await until(pilot, lambda: isinstance(app.screen, UsageScreen) and app.screen.nodes != [])
        usage = app.screen
        assert isinstance(usage, UsageScreen)
        (node,) = usage.nodes
        (child,) = node["children"]
        (grandchild,) = child["children"]
        assert grandchild["own"]["tokens"] == 22 and grandchild["total"]["tokens"] == 22
        assert child["total"]["tokens"] == child["own"]["tokens"] + 22
        assert node["total"]["tokens"] == node["own"]["tokens"] + child["total"]["tokens"]
        text = screen_text(pilot)
        assert "  alpha" in text and "    gamma" in text  # children indented under parents
        assert "tree tok" in text and "wall" in text

        # A subagent's own tree (what its chat asks for every second) reads only its family
        # and matches the root's view of it; another tree's usage never leaks in.
        await app.link.call("create_session", cwd=str(project), name="bystander")
        sub = child["session_id"]
        (same,) = (await app.link.call("get_usage", session=sub, tree=True))["usage"]
        for part in ("own", "total"):  # (wall time follows the record's last update)
            assert {**same[part], "wall_s": 0} == {**child[part], "wall_s": 0}
        assert [c["session_id"] for c in same["children"]] == [grandchild["session_id"]]
        below = await app.link.call("list_sessions", parent=sub)
        assert below["total"] == 1
        (row,) = below["sessions"]
        assert row["id"] == grandchild["session_id"] and row["usage"]["total"]["tokens"] == 22


PLAIN = """
repeat forever:
    when "block":
        code:
            import pathlib, time
            while not pathlib.Path("go").exists():
                time.sleep(0.05)
            print("went")
    when "went":
        text: unblocked
    when "hello":
        text: hi back
    when "first":
        text: first done
"""


@pytest.mark.parametrize("model_script", [PLAIN])
async def test_space_messages_a_session_in_any_state_and_search_filters(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        link = app.link
        idle = await link.call("create_session", cwd=str(project), task="first", name="idle-one")
        busy = await link.call("create_session", cwd=str(project), task="block", name="busy-one")
        await link.call("wait_quiet", session=idle["session"])
        fork = await link.call("fork", session=idle["session"])
        ids = {"idle": idle["session"], "busy": busy["session"], "fork": fork["session"]}

        await pilot.press("left")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen))
        view = app.screen
        assert isinstance(view, AgentsScreen)
        await until(pilot, lambda: len(view.visible_rows()) == 3)
        await until(pilot, lambda: "Running (1)" in screen_text(pilot))
        assert [r["id"] for r in view.visible_rows()] == [ids["busy"], ids["idle"], ids["fork"]]
        assert "Idle (1)" in screen_text(pilot) and "Inactive (1)" in screen_text(pilot)

        async def message(which: str, text: str) -> None:
            options = view.query_one("#agents")
            index = options.get_option_index(ids[which])  # type: ignore[attr-defined]
            options.highlighted = index  # type: ignore[attr-defined]
            await pilot.press("space")
            await until(pilot, lambda: isinstance(app.screen, ComposeScreen))
            await pilot.press(*text, "enter")
            await until(pilot, lambda: app.screen is view)
            await until(pilot, lambda: "sent to" in screen_text(pilot))

        # Busy: queued behind the running turn, answered after it.
        await message("busy", "hello busy")
        got = await link.call("get_session", session=ids["busy"])
        assert got["session"]["status"] == "running" and got["session"]["pending"] == 1
        # Inactive: woken, then answered.
        await message("fork", "hello fork")
        # Idle: a new turn.
        await message("idle", "hello idle")
        (project / "go").write_text("")
        for sid in ids.values():
            await link.call("wait_quiet", session=sid)
        for sid in ids.values():
            recent = await link.call("get_session", session=sid, recent=50)
            texts = [
                e["payload"].get("text")
                for e in recent["events"]
                if e["type"] == "assistant_message"
            ]
            assert texts[-1] == "hi back", (sid, texts)

        # Search by name: only matching rows stay.
        await pilot.press("slash", *"fork")
        await until(pilot, lambda: [r["id"] for r in view.visible_rows()] == [ids["fork"]])
        await pilot.press("escape")  # clears the search
        await until(pilot, lambda: len(view.visible_rows()) == 3)
