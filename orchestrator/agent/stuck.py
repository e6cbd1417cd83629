"""Runaway-loop detection for one turn: the same cell, or a malformed call, over and over.

A model that is stuck re-sends what it just sent: the same cell (a small local model re-sent
one cell 126 times) or tool-call arguments that never parse (200 model calls). ``RepeatGuard``
watches the tool calls of one turn in order. A call that repeats the previous one (the same
code after ``normalise_code``; or malformed like the previous one) raises the run count; any
other call resets it to one, and so does a call whose sandbox failed or whose kernel was
restarted (``forget``: the same code may well give another result now). From the second call
of a run on, the tool result starts with a notice saying so (``repeat_notice``); the
``STUCK_REPEAT_LIMIT``-th call of a run is not run at all and the turn stops with reason
``stuck`` (docs/agent-loop.md, "Runaway loops").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "MALFORMED",
    "STUCK_REPEAT_LIMIT",
    "RepeatGuard",
    "Verdict",
    "normalise_code",
    "repeat_notice",
    "stuck_message",
]

# Identical (or malformed) consecutive tool calls that end the turn: this many in a row.
STUCK_REPEAT_LIMIT: Final = 4
# The key of every malformed call: two malformed calls in a row repeat each other even when
# their broken arguments differ.
MALFORMED: Final = "\0malformed"


def normalise_code(code: str) -> str:
    """What makes two cells "the same": trailing spaces on each line, blank lines at either
    end and the line-ending style do not count; everything else (indentation, comments,
    spacing inside a line) does."""
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """What to do with one call: ``run`` it (with ``repeats`` > 1 it gets the notice) or
    ``stop`` the turn (the limit is reached; the call is not run)."""

    action: Literal["run", "stop"]
    repeats: int
    malformed: bool


class RepeatGuard:
    """One turn's run of repeated calls; ``limit`` is ``STUCK_REPEAT_LIMIT`` unless a test
    shortens it."""

    def __init__(self, limit: int = STUCK_REPEAT_LIMIT):
        self.limit = limit
        self._last: str | None = None
        self._repeats = 0

    def observe(self, code: str | None) -> Verdict:
        """The next call of the turn: its code, or None when its arguments are malformed."""
        key = MALFORMED if code is None else normalise_code(code)
        self._repeats = self._repeats + 1 if key == self._last else 1
        self._last = key
        action: Literal["run", "stop"] = "stop" if self._repeats >= self.limit else "run"
        return Verdict(action=action, repeats=self._repeats, malformed=code is None)

    def forget(self) -> None:
        """The last call got no answer from its code (its sandbox failed, or its kernel was
        restarted under it): running it again is a retry, not a loop, so the run starts over."""
        self._last = None
        self._repeats = 0


def repeat_notice(verdict: Verdict, limit: int) -> str:
    """The notice that opens the result of a repeated call (empty for a first one)."""
    if verdict.repeats < 2:
        return ""
    what = "malformed tool calls" if verdict.malformed else "identical cells"
    return (
        f"[notice] {verdict.repeats} {what} in a row; the turn stops at {limit}. "
        "Repeating the same call gives the same result: change the code or answer."
    )


def stuck_message(verdict: Verdict) -> str:
    what = "malformed tool calls" if verdict.malformed else "identical cells"
    return f"stopped: {verdict.repeats} {what} in a row (the model is stuck in a loop)"
