"""Where the daemon writes its log, and how it says it could not start.

Kept apart from ``service.py`` (which imports the whole session stack): the CLI needs these two
names to start a daemon and to quote its failure, and must not pay ~1 s of imports for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from orchestrator.paths import Paths

__all__ = ["DAEMON_LOG_FILE_NAME", "STARTUP_ERROR_PREFIX", "daemon_log_path"]

DAEMON_LOG_FILE_NAME: Final = "daemon.log"
# How `python -m orchestrator.daemon` says it could not start (stderr, which `daemon start`
# appends to the log and quotes without this prefix).
STARTUP_ERROR_PREFIX: Final = "prime-agent daemon: error: "


def daemon_log_path(paths: Paths | None = None) -> Path:
    """The daemon's log, next to its socket in the private runtime directory."""
    return (paths or Paths.from_env()).runtime_dir / DAEMON_LOG_FILE_NAME
