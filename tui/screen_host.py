"""What a screen may use of the app that shows it (the seam below ``app.py``).

Every screen (chat, agents, inspector, usage, tree, help) reaches the app only through
``ScreenHost``: the daemon connection, the session defaults the app was started with, the
input history, the clock, and navigation (open another screen, go back). ``PrimeAgentApp``
(``app.py``) satisfies it, so the app imports the screens and no screen imports the app.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, cast

from textual.screen import Screen

from tui.link import DaemonLink

__all__ = ["ScreenHost", "host_of"]


class ScreenHost(Protocol):
    """The app as a screen sees it."""

    @property
    def link(self) -> DaemonLink: ...  # RuntimeError before the app has connected

    @property
    def cwd(self) -> Path: ...  # a new session's working directory (resolved)

    @property
    def model(self) -> str | None: ...  # a new session's model (None: the daemon's default)

    @property
    def backend(self) -> str | None: ...  # a new session's backend (None: the daemon's choice)

    @property
    def api_base(self) -> str | None: ...  # a new session's model endpoint (None: its own)

    @property
    def history(self) -> list[str]: ...  # inputs sent from any chat, oldest first (for ↑/↓)

    def now(self) -> datetime: ...  # the clock "5m ago" is measured with

    def remember(self, text: str) -> None: ...  # add an input to ``history``

    def open_chat(self, session_id: str, *, replace: bool = False) -> None: ...

    def open_agents(self, parent: str | None, parent_name: str | None = None) -> None: ...

    def open_inspector(self, session_id: str) -> None: ...

    def open_usage(self, session_id: str) -> None: ...

    def open_tree(self, session_id: str) -> None: ...

    def open_help(self) -> None: ...

    def open_sweeps(self) -> None: ...

    def close_screen(self, screen: Screen[None]) -> None: ...  # back (never the bottom chat)


def host_of(screen: Screen[Any]) -> ScreenHost:
    """The app ``screen`` is shown by, as a ``ScreenHost`` (every screen here runs in one)."""
    return cast(ScreenHost, screen.app)
