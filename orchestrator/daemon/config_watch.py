"""config.toml as it is now, for each new session a running daemon creates.

A daemon reads config.toml when it starts, and used to keep that copy: an edit (a new
``[models."…"]`` endpoint, another ``default_model``) reached no session until someone restarted
the daemon, and nobody was told. ``ConfigWatch.current`` re-reads the file when its size or
modification time changed: new sessions resolve their model, budget and refine default from it.
What belongs to the daemon itself — ``[sandbox]`` (its backends), ``[nats]``, ``[daemon]``,
``[embedded]``, ``[mcp]`` (the MCP servers it runs) — only changes with a restart;
``current`` names those sections when they differ, so the client can say so in one line. A
file that no longer parses is a one-line ``ConfigError`` for the command, and the daemon keeps
serving.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from orchestrator.settings import Settings, load_settings

__all__ = ["DAEMON_SECTIONS", "ConfigWatch", "restart_notice"]

# Sections a running daemon built its parts from: they apply after `prime-agent daemon restart`.
DAEMON_SECTIONS: Final = ("sandbox", "nats", "daemon", "embedded", "mcp")

_Stamp = tuple[int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def restart_notice(sections: list[str], path: Path) -> str | None:
    if not sections:
        return None
    named = ", ".join(f"[{s}]" for s in sections)
    return (
        f"{path}'s {named} changed since the daemon started: it applies after "
        "`prime-agent daemon restart`"
    )


class ConfigWatch:
    """``started``: the settings the daemon was built from (read from ``path`` at start)."""

    def __init__(self, path: Path, started: Settings) -> None:
        self.path = path
        self.started = started
        self._stamp = _stamp(path)
        self._current = started

    def current(self) -> tuple[Settings, list[str]]:
        """(the file's settings now, the daemon-wide sections that differ from the start's)."""
        stamp = _stamp(self.path)
        if stamp != self._stamp:
            self._current = load_settings(self.path)  # ConfigError: the caller's one line
            self._stamp = stamp
        changed = [
            section
            for section in DAEMON_SECTIONS
            if getattr(self._current, section) != getattr(self.started, section)
        ]
        return self._current, changed
