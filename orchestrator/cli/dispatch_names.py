"""The first words ``prime-agent`` dispatches on: a subcommand goes to the typer group, a help
word to its help; any other command line is a run (``cli/entry.py``, ``cli/app.py``)."""

from __future__ import annotations

from typing import Final

__all__ = ["HELP_WORDS", "SUBCOMMANDS"]

SUBCOMMANDS: Final = frozenset(
    {
        "usage",
        "export",
        "agents",
        "attach",
        "send",
        "abort",
        "observe",
        "images",
        "doctor",
        "daemon",
        "shutdown",
        "sweep",
        "import",
        "tree",
        "branch",
        "fork",
        "clone",
        "compact",
        "model",
        "refine",
        "harness",
        "run",
        "schedule",
        "heartbeat",
        "goal",
        "tui",
    }
)
HELP_WORDS: Final = frozenset({"help", "--help-commands"})
