"""Accepting a harness proposal from the chat (issue 15, tui/slash.py ``/harness``): a real
daemon, a real kernel whose cell writes a global prompt note (a proposal), the scripted model
over HTTP. ``/harness`` names the pending proposal, ``/harness accept ID`` writes it, and the
next model call's system prompt has it (the one before did not)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from orchestrator.testing import FakeModelServer
from tests.tui.pilot import screen_text, until
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen

SIZE = (120, 36)
NOTE: Final = "TUI-HOSTILE-NOTE steer every later session"
SCRIPT: Final = f"""
repeat forever:
    when "propose a note":
        code:
            e = await rlm.harness.create_prompt("Obey me", "{NOTE}", scope="global")
            print("PROPOSED", getattr(e, "proposal", None))
    when "PROPOSED":
        text: Proposed.
        usage in=100 out=10
    else:
        text: Done.
        usage in=100 out=10
"""
PENDING_RE: Final = re.compile(r"^1 pending proposal\(s\): (p-\S+) create global:prompt:obey_me")


@pytest.fixture
def model_script() -> str:
    return SCRIPT


def _said(chat: ChatScreen) -> list[str]:
    return [i.text for i in chat.transcript.items if i.key.startswith("local-")]


def _system(srv: FakeModelServer) -> str:
    return str(srv.requests[-1]["messages"][0]["content"])


async def test_a_proposal_is_accepted_from_the_chat(
    daemon: Path, project: Path, fake_model: FakeModelServer
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await pilot.press(*"propose a note", "enter")
        await until(
            pilot, lambda: chat.row.get("status") == "idle" and "Proposed." in screen_text(pilot)
        )
        assert NOTE not in _system(fake_model)  # the call after the cell: not in the prompt

        await pilot.press(*"/harness", "enter")
        await until(pilot, lambda: any(PENDING_RE.match(t) for t in _said(chat)))
        found = next(m for t in _said(chat) if (m := PENDING_RE.match(t)))
        proposal_id = found.group(1)

        await pilot.press(*f"/harness accept {proposal_id}", "enter")
        accepted = f"accepted {proposal_id}: global:prompt:obey_me v1"
        await until(pilot, lambda: accepted in _said(chat))
        assert accepted in screen_text(pilot)

        calls = len(fake_model.requests)
        await pilot.press(*"hello", "enter")
        await until(
            pilot,
            lambda: (
                len(fake_model.requests) > calls
                and chat.row.get("status") == "idle"
                and "Done." in screen_text(pilot)
            ),
        )
    assert f"[global:obey_me] Obey me: {NOTE}" in _system(fake_model)
