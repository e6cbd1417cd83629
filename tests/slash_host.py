"""A ``tui.slash.SlashHost`` that records what a slash command opened and said; subclasses
decide where ``call`` goes (recorded replies in unit tests, a real daemon in tests/tui)."""

from __future__ import annotations

from pathlib import Path


class RecordingHost:
    def __init__(self, session_id: str | None):
        self.session_id = session_id
        self.lines: list[tuple[str, bool]] = []
        self.opened: list[tuple[str, str | None]] = []

    @property
    def cwd(self) -> Path:
        return Path.cwd()

    def open_agents(self, parent: str | None = None) -> None:
        self.opened.append(("agents", parent))

    def open_usage(self) -> None:
        self.opened.append(("usage", None))

    def open_tree(self) -> None:
        self.opened.append(("tree", None))

    def open_help(self) -> None:
        self.opened.append(("help", None))

    def open_sweeps(self) -> None:
        self.opened.append(("sweeps", None))

    def open_session(self, session_id: str) -> None:
        self.opened.append(("session", session_id))

    def say(self, text: str, *, error: bool = False) -> None:
        assert "\n" not in text  # one line, always
        self.lines.append((text, error))
