"""A session's lifecycle: its states, the arrows between them, and the check every change passes.

A session's state is one value, a ``SessionStatus``: the ``status`` column of ``sessions`` and,
while the session is loaded, ``LiveSession.state`` (the orchestrator writes the one through to
the other). It lives here, beside the column, because the store is the lowest layer that holds
it; this module imports nothing but the exception tree.

Every change of state is a ``Cause`` (the code path that makes it: a turn starting, an abort,
an unload...) applied to the state the session is in. ``ARROWS`` lists, for each cause, the
``(old, new)`` pairs it may produce, and nothing else is legal: ``transition`` checks one change
and returns its ``Transition`` record (which the orchestrator logs and announces to whoever
waits on its sessions), or raises ``IllegalTransition``. The drawing is in docs/design.md
("Session lifecycle"); ``tests/unit/test_lifecycle.py`` walks the table.

Where a session is born is not a transition: ``Orchestrator.create_session`` writes ``idle``;
a fork, a clone (``store/tree.py``) and an imported session file (``store/jsonl_import.py``)
are written ``inactive``.

The table is what the code did when it was written down, including a few arrows that are
questionable but taken today; each is marked *kept* where it is drawn:

- ``aborted -> running`` (``turn_start``): a cascading abort marks a descendant ``aborted`` and
  restarts its driver; the user's own input queued to it before the abort still runs.
- ``aborted -> completed | inactive`` (``run_end``): a print-mode run ends by stopping its
  tree (a running root becomes ``aborted``) and then names the root's state from its last
  outcome, so a root cancelled mid-turn after a completed one ends ``completed``. From
  ``inactive`` likewise: a print-mode root the idle sweep unloaded is still ended.
- ``idle -> idle``, ``completed -> completed | aborted`` (``abort``): a turn that finished
  while its abort was on the way (the abort found it running, the cancellation landed after
  the driver had written its resting state) is rested again by the abort.
- ``running -> inactive`` (``unload``): an unload cancels the driver first, so a turn in
  progress is dropped without an ``aborted`` state (its loop records ``aborted``).
- ``shutdown``: the daemon marks every session it stopped ``inactive``
  (``daemon/service.py``, through ``Orchestrator.set_stored_state``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from orchestrator.errors import IllegalTransition

__all__ = [
    "ARROWS",
    "CAUSES",
    "LEGACY_STATES",
    "LOADABLE_STATES",
    "NEXT_STATES",
    "RESTING_STATES",
    "SESSION_STATUSES",
    "STALE_LIVE_STATUSES",
    "TERMINAL_STATES",
    "Cause",
    "SessionStatus",
    "StopState",
    "Transition",
    "transition",
]

SessionStatus = Literal[
    "idle", "running", "inactive", "completed", "error", "aborted", "deleted", "failed"
]
SESSION_STATUSES: tuple[SessionStatus, ...] = get_args(SessionStatus)

# What each state means, and what holds while a session is in it:
#   running    loaded, a turn in progress (its driver is the only code running it).
#   idle       loaded, between turns, waiting for input: how a root session rests.
#   completed  loaded or not, between turns: how a subagent rests (its parent has its answer
#              or a notice); a message starts its next turn like an idle session's.
#   inactive   not loaded: no sandbox, no driver, everything on disk; any input wakes it.
#   aborted    stopped for good: takes no input and is never loaded again.
#   deleted    a tombstone: takes no input, is never loaded, and goes nowhere else.
#   error, failed  written by older versions only (LEGACY_STATES).

# Rows an older version left; nothing moves a session into them now. A failed turn never
# ends a session, so such a row is loaded and rests like any other.
LEGACY_STATES: Final[frozenset[SessionStatus]] = frozenset({"error", "failed"})
# A terminal session takes no input and is never loaded; ``deleted`` goes nowhere else, and
# ``aborted`` only along the arrows marked *kept* in the module docstring, and to ``deleted``.
TERMINAL_STATES: Final[frozenset[SessionStatus]] = frozenset({"aborted", "deleted"})
LOADABLE_STATES: Final[frozenset[SessionStatus]] = frozenset(SESSION_STATUSES) - TERMINAL_STATES
# A loaded session between turns: a root rests idle, a subagent completed.
RESTING_STATES: Final[frozenset[SessionStatus]] = frozenset({"idle", "completed"})
# Rows that claim a loaded session: after a restart nothing is loaded, so they are stale and
# recovery calls them inactive (completed rows stay as they are).
STALE_LIVE_STATUSES: Final[frozenset[SessionStatus]] = frozenset({"running", "idle"})

# What stopping a session for good leaves it as (``Orchestrator.stop_session``).
StopState = Literal["aborted", "deleted"]

Cause = Literal[
    "load",
    "turn_start",
    "turn_end",
    "abort",
    "stop",
    "restate",
    "delete",
    "unload",
    "run_end",
    "recover",
    "shutdown",
]
CAUSES: tuple[Cause, ...] = get_args(Cause)

_Arrow = tuple[SessionStatus, SessionStatus]


def _every(sources: Iterable[SessionStatus], targets: Iterable[SessionStatus]) -> frozenset[_Arrow]:
    """Each source to each target."""
    ends = frozenset(targets)
    return frozenset((old, new) for old in sources for new in ends)


ARROWS: Final[Mapping[Cause, frozenset[_Arrow]]] = {
    # Orchestrator._load: a stored session that is not terminal becomes loaded and rests
    # (a root idle, a subagent completed), whatever its row said, legacy states included.
    "load": _every(LOADABLE_STATES, RESTING_STATES),
    # Orchestrator._drive: queued input starts a turn; a driver going straight on to the next
    # queued turn writes running again. aborted -> running is *kept* (module docstring).
    "turn_start": _every({"idle", "completed", "running", "aborted"}, {"running"}),
    # Orchestrator._drive: the turn ended (any outcome, a failed one too) and no input waits.
    "turn_end": _every({"running"}, RESTING_STATES),
    # Orchestrator.abort_turn: the running turn is cancelled and the session rests, or (a
    # descendant in a cascading abort) is aborted. The pairs from a resting state are *kept*.
    "abort": _every({"running"}, {*RESTING_STATES, "aborted"})
    | {("idle", "idle"), ("completed", "completed"), ("completed", "aborted")},
    # Orchestrator.stop_session: a running session is cancelled for good.
    "stop": _every({"running"}, {"aborted"}),
    # Orchestrator.stop_session of a session that is not running: its state is written again
    # (the row's updated_at moves, waiters look again); a restatement goes nowhere.
    "restate": frozenset((state, state) for state in SESSION_STATUSES),
    # stop_session(state="deleted"), or a tombstone written for a session that is not loaded
    # (sessions/family.py): from anywhere, a deleted one again included.
    "delete": _every(SESSION_STATUSES, {"deleted"}),
    # Orchestrator.unload: a loaded root leaves memory; a completed subagent stays completed.
    # running -> inactive is *kept*.
    "unload": _every({"idle", "running"}, {"inactive"}),
    # Orchestrator.finish_root, after stop_session: a print-mode root ends completed, aborted
    # or (a failed run, woken by the next message) inactive. From aborted or inactive: *kept*.
    "run_end": _every(
        {"idle", "completed", "aborted", "inactive"}, {"completed", "aborted", "inactive"}
    ),
    # Orchestrator.recover_interrupted, at start-up: a row an orchestrator that died left
    # claiming a loaded session.
    "recover": _every(STALE_LIVE_STATUSES, {"inactive"}),
    # daemon/service.py, after the orchestrator closed: every session it had loaded that was
    # not terminal (a running one was stopped aborted on the way) is not loaded any more.
    "shutdown": _every({"idle", "running", "completed", "inactive", "aborted"}, {"inactive"}),
}

# The drawing by state: everywhere a session in each state may go, for any cause.
NEXT_STATES: Final[Mapping[SessionStatus, frozenset[SessionStatus]]] = {
    state: frozenset(new for arrows in ARROWS.values() for old, new in arrows if old == state)
    for state in SESSION_STATUSES
}


@dataclass(frozen=True)
class Transition:
    """One legal change of a session's state: from ``old`` to ``new`` because of ``why``."""

    session_id: str
    old: SessionStatus
    new: SessionStatus
    why: Cause

    def __str__(self) -> str:
        return f"session {self.session_id}: {self.old} -> {self.new} ({self.why})"


def transition(session_id: str, old: SessionStatus, new: SessionStatus, why: Cause) -> Transition:
    """The record of ``session_id`` going from ``old`` to ``new`` on ``why``;
    ``IllegalTransition`` when ``ARROWS`` does not draw that arrow for that cause."""
    arrows = ARROWS[why]
    if (old, new) not in arrows:
        allowed: list[str] = sorted(target for source, target in arrows if source == old)
        raise IllegalTransition(session_id, old, new, why, allowed)
    return Transition(session_id=session_id, old=old, new=new, why=why)
