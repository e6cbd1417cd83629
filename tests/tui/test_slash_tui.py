"""Slash commands typed into the chat: each reaches the daemon and its answer (or the screen
it opens) shows in the TUI. tests/tui/test_slash_daemon.py covers every command's daemon
effect; this proves the chat's wiring (input → command → screen)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.testing import FakeModelServer
from tests.tui.pilot import screen_text, title_line, until
from tui.agents import AgentsScreen
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen

SIZE = (120, 36)
SCRIPT = """
repeat forever:
    text: Done.
    usage in=100 out=10
"""


@pytest.fixture
def model_script() -> str:
    return SCRIPT


@pytest.fixture
def fake_model(fake_model: FakeModelServer) -> FakeModelServer:
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
    other = f'\n[models."openai/other"]\napi_base = "{fake_model.url}"\n'
    config.write_text(config.read_text() + other)
    return fake_model


def _said(chat: ChatScreen) -> list[str]:
    return [i.text for i in chat.transcript.items if i.key.startswith("local-")]


async def test_slash_commands_typed_in_the_chat(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await pilot.press(*"hello", "enter")
        await until(
            pilot, lambda: chat.row.get("status") == "idle" and "Done." in screen_text(pilot)
        )

        await pilot.press(*"/model openai/other", "enter")
        await until(pilot, lambda: any("openai/other" in t for t in _said(chat)))
        await until(pilot, lambda: "openai/other" in title_line(pilot))

        await pilot.press(*"/goal Ship it --budget 500", "enter")
        await until(pilot, lambda: any("Ship it" in t for t in _said(chat)))

        await pilot.press(*"/autonomous status", "enter")
        await until(pilot, lambda: any(t.startswith("autonomous:") for t in _said(chat)))

        await pilot.press(*"/export", "enter")
        await until(pilot, lambda: any(t.startswith("exported") for t in _said(chat)))
        assert [p.name for p in project.glob("*.jsonl")] == ["hello.jsonl"]  # in the TUI's cwd

        # /fork opens the copy's chat.
        original = chat.session_id
        await pilot.press(*"/fork", "enter")
        await until(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen is not chat)
        fork = app.screen
        assert isinstance(fork, ChatScreen) and fork.session_id not in (None, original)
        await until(pilot, lambda: "(fork)" in title_line(pilot))

        await pilot.press(*"/agents", "enter")
        await until(pilot, lambda: isinstance(app.screen, AgentsScreen))
        # Opening the fork's chat attached it, which woke it (docs/spec.md §4): both are idle.
        await until(pilot, lambda: "Idle (2)" in screen_text(pilot))
