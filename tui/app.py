"""The Textual app: one daemon connection, a stack of screens (docs/tui.md).

``PrimeAgentApp(socket_path, cwd=..., session=...)`` connects on mount and opens a chat (a new
one, or ``session``'s). Quitting closes the connection only: the daemon keeps every session
running, and the next app shows them again (detach/attach). The screens see the app only as a
``ScreenHost`` (``screen_host.py``): this module imports them, none of them imports it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Final

from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from orchestrator.api import ApiError
from tui.agents import AgentsScreen
from tui.chat import ChatScreen
from tui.inspector import InspectorScreen
from tui.link import DaemonLink
from tui.panels import HelpScreen, TreeScreen, UsageScreen
from tui.screen_host import ScreenHost
from tui.sweeps import SweepsScreen

__all__ = ["HISTORY_MAX", "PrimeAgentApp", "run_tui"]

# Inputs remembered for ↑/↓ (this process only).
HISTORY_MAX: Final = 500

CSS: Final = """
#title { height: 1; padding: 0 1; background: $boost; }
#transcript { height: 1fr; padding: 0 1; }
#hint { height: auto; max-height: 2; padding: 0 1; }
#subagents { height: auto; max-height: 7; padding: 0 1; }
#usage { height: 1; padding: 0 1; background: $boost; }
.msg-user { margin: 1 0 0 0; }
.msg-notice { color: $text-muted; }
.msg-error { color: $error; }
.msg-assistant { margin: 0; padding: 0; }
CellView { margin: 0; padding: 0 1; background: $boost; }
CellView:focus { background: $accent 30%; }
CellView.failed { color: $error; }
#agents-title, #inspector-title, .screen-title { height: 1; padding: 0 1; background: $boost; }
#search { margin: 0 1; }
#agents { height: 1fr; }
#agents-hint, #inspector-hint, #tree-hint { height: auto; padding: 0 1; }
#info { height: auto; padding: 1 1; }
#logs-title { padding: 0 1; }
#logs-box { height: 1fr; padding: 0 1; }
#compose { width: 80%; height: auto; border: round $accent; padding: 0 1; }
ComposeScreen { align: center middle; }
#tree { height: 1fr; }
"""


class PrimeAgentApp(App[None]):
    TITLE = "prime-agent"
    CSS = CSS
    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+q", "quit", "Quit", priority=True)]
    # The command palette would take Ctrl-P from the input; slash commands are ours.
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        socket_path: Path | str | None = None,
        *,
        cwd: Path | None = None,
        session: str | None = None,
        model: str | None = None,
        backend: str | None = None,
        api_base: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ):
        super().__init__()
        self.socket_path = socket_path
        self.cwd = (cwd or Path.cwd()).resolve()
        self.start_session = session
        self.model = model
        self.backend = backend
        self.api_base = api_base  # an OpenAI-compatible endpoint for new chats' model
        self._clock = clock or (lambda: datetime.now(UTC))
        self.history: list[str] = []
        self._link: DaemonLink | None = None
        self.failure: str | None = None

    @property
    def link(self) -> DaemonLink:
        if self._link is None:
            raise RuntimeError("the TUI is not connected")
        return self._link

    def now(self) -> datetime:
        return self._clock()

    async def on_mount(self) -> None:
        try:
            self._link = await DaemonLink.connect(self.socket_path)
        except ApiError as exc:
            self.failure = exc.message
            self.exit(return_code=1, message=exc.message)
            return
        self._link.lost = self._lost
        session = self.start_session
        if session is not None:  # an id, a unique id prefix or a name, as the CLI takes them
            try:
                found = await self._link.call("get_session", session=session)
            except ApiError as exc:
                self.failure = exc.message
                self.exit(return_code=1, message=exc.message)
                return
            session = str(found["session"]["id"])
        await self.push_screen(ChatScreen(session))

    async def on_unmount(self) -> None:
        if self._link is not None:
            await self._link.close()

    def _lost(self, why: str) -> None:
        self.failure = why
        self.exit(return_code=1, message=why)

    def remember(self, text: str) -> None:
        if not self.history or self.history[-1] != text:
            self.history.append(text)
            del self.history[:-HISTORY_MAX]

    # ---------------------------------------------------------------------------- navigation

    def open_chat(self, session_id: str, *, replace: bool = False) -> None:
        screen = ChatScreen(session_id)
        if replace:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def open_agents(self, parent: str | None, parent_name: str | None = None) -> None:
        self.push_screen(AgentsScreen(parent, parent_name or parent))

    def open_inspector(self, session_id: str) -> None:
        self.push_screen(InspectorScreen(session_id))

    def open_usage(self, session_id: str) -> None:
        self.push_screen(UsageScreen(session_id))

    def open_tree(self, session_id: str) -> None:
        self.push_screen(TreeScreen(session_id))

    def open_help(self) -> None:
        self.push_screen(HelpScreen())

    def open_sweeps(self) -> None:
        self.push_screen(SweepsScreen())

    def close_screen(self, screen: Screen[None]) -> None:
        """Back: pop ``screen`` (the bottom chat is never popped)."""
        if len(self.screen_stack) > 2 and self.screen is screen:
            self.pop_screen()


def _as_screen_host(app: PrimeAgentApp) -> ScreenHost:
    """The app as its screens reach it (``screen_host.host_of`` casts ``screen.app``): this
    is where mypy checks that ``PrimeAgentApp`` is a ``ScreenHost``."""
    return app


def run_tui(
    socket_path: Path | str | None = None,
    *,
    cwd: Path | None = None,
    session: str | None = None,
    model: str | None = None,
    backend: str | None = None,
    api_base: str | None = None,
) -> int:
    """Run the app on this terminal; the exit code (1: the daemon was not reachable or left)."""
    app = PrimeAgentApp(
        socket_path, cwd=cwd, session=session, model=model, backend=backend, api_base=api_base
    )
    app.run()
    if app.failure is not None:
        print(f"prime-agent: {app.failure}", file=sys.stderr)
    return app.return_code or 0
