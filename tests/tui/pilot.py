"""Helpers for driving the TUI with Textual's pilot: wait for a condition (the app's own
state), never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

from textual.pilot import Pilot

from tui.app import PrimeAgentApp
from tui.chat import ChatScreen

# A scripted first step whose cell blocks until the test creates the file ``go`` in the
# session's cwd: a turn that is reliably "running" for as long as a test needs.
WAIT_FOR_GO = """
text: Waiting for the go file.
code:
    import pathlib, time
    while not pathlib.Path("go").exists():
        time.sleep(0.05)
    print("went")
"""

# Bounds, not expectations: a turn on a loaded 2-core machine starts a kernel gateway first.
UNTIL_TIMEOUT_S: Final = 90.0
_STEP_S: Final = 0.05


async def until(
    pilot: Pilot[None], predicate: Callable[[], bool], *, timeout: float = UNTIL_TIMEOUT_S
) -> None:
    """Let the app run until ``predicate()`` holds; fail with the screen's text otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; screen:\n{screen_text(pilot)}")
        await pilot.pause(_STEP_S)


def screen_text(pilot: Pilot[None]) -> str:
    """What a person sees, as plain text (the app's current screen)."""
    strips = pilot.app.screen._compositor.render_strips()
    return "\n".join(strip.text.rstrip() for strip in strips)


def title_line(pilot: Pilot[None]) -> str:
    """The screen's first line; empty while a new screen has not rendered yet."""
    lines = screen_text(pilot).splitlines()
    return lines[0] if lines else ""


async def until_async(
    pilot: Pilot[None],
    predicate: Callable[[], Awaitable[bool]],
    *,
    timeout: float = UNTIL_TIMEOUT_S,
    what: Callable[[], object] = lambda: None,
) -> None:
    """``until`` for a predicate that asks the daemon (awaited each round)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; state: {what()!r}\nscreen:\n{screen_text(pilot)}")
        await pilot.pause(_STEP_S)


async def chat_screen(pilot: Pilot[None], app: PrimeAgentApp) -> ChatScreen:
    """The chat the app opened (once it has)."""
    await until(pilot, lambda: isinstance(app.screen, ChatScreen))
    assert isinstance(app.screen, ChatScreen)
    return app.screen


def texts(chat: ChatScreen, kind: str) -> list[str]:
    """The transcript's texts of one kind ("user", "assistant", "cell", "notice", "error")."""
    return [i.text for i in chat.transcript.items if i.kind == kind]
