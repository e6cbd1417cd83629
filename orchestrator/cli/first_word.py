"""What ``prime-agent`` makes of its first words before any parsing: ``--version``, and a bare
first word that is no subcommand.

``prime-agent exec "hi"`` used to run the task "exec hi" — ten minutes and 190k tokens on the
embedded model for a mistyped command. A first argument that looks like a command (one bare
lowercase word) and is none is refused in one line, with the closest subcommand and how to run
it as a task. A task by intent still runs: quoted with spaces (``prime-agent "fix the bug"``),
or with a flag that says so (``-p``, ``--print``, ``--mode``, ``--resume``, ``--continue``).
"""

from __future__ import annotations

import difflib
import re
from typing import Final

from orchestrator.cli.dispatch_names import HELP_WORDS, SUBCOMMANDS

__all__ = ["DISTRIBUTION", "VERSION_WORDS", "refused_first_word", "version_line"]

DISTRIBUTION: Final = "prime-agent"
VERSION_WORDS: Final = frozenset({"--version", "-V"})
# Flags that say the words are a task (a run), whatever they look like.
_TASK_FLAGS: Final = frozenset({"-p", "--print", "--mode", "-r", "--resume", "-c", "--continue"})
_BARE_WORD: Final = re.compile(r"^[a-z][a-z0-9_-]*$")
_SUGGEST_CUTOFF: Final = 0.6


def version_line() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{DISTRIBUTION} {version(DISTRIBUTION)}"
    except PackageNotFoundError:  # a source tree run without installing it
        return f"{DISTRIBUTION} (not installed)"


def refused_first_word(args: list[str]) -> str | None:
    """Why ``args`` are refused (one line), or None when they are a command or a task."""
    if not args:
        return None
    first = args[0]
    if first in SUBCOMMANDS or first in HELP_WORDS or not _BARE_WORD.match(first):
        return None
    if any(arg.partition("=")[0] in _TASK_FLAGS for arg in args):
        return None
    close = difflib.get_close_matches(first, sorted(SUBCOMMANDS), n=1, cutoff=_SUGGEST_CUTOFF)
    hint = f"did you mean `prime-agent {close[0]}`? " if close else ""
    words = []
    for arg in args:  # the task's words: up to the first option
        if arg.startswith("-"):
            break
        words.append(arg)
    task = " ".join(words)
    return (
        f"{first!r} is not a command; {hint}to run it as a task: "
        f'prime-agent -p "{task}" (commands: prime-agent help)'
    )
