"""The session lifecycle (orchestrator/store/lifecycle.py): every drawn arrow is legal, others
raise ``IllegalTransition`` with a one-line message, the table is closed over the states, the
terminal states lead nowhere but along the arrows the code takes, and only the orchestrator's
state-change methods write a session's state."""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path

import pytest

from orchestrator import IllegalTransition, PrimeAgentError
from orchestrator.store import lifecycle, queries
from orchestrator.store.lifecycle import (
    ARROWS,
    CAUSES,
    LEGACY_STATES,
    NEXT_STATES,
    SESSION_STATUSES,
    TERMINAL_STATES,
    Cause,
    SessionStatus,
    Transition,
    transition,
)

ROOT = Path(__file__).resolve().parents[2]
SESSION = "s-lifecycle00"

ALLOWED = sorted((why, old, new) for why, arrows in ARROWS.items() for old, new in arrows)

# (cause, old, new): each one a change no code path makes.
ILLEGAL: list[tuple[Cause, SessionStatus, SessionStatus]] = [
    ("turn_start", "deleted", "running"),  # a tombstone never runs again
    ("turn_start", "inactive", "running"),  # a session that is not loaded has no driver
    ("load", "aborted", "idle"),  # terminal sessions are never loaded
    ("load", "deleted", "completed"),
    ("load", "inactive", "running"),  # a loaded session rests until input starts a turn
    ("turn_end", "idle", "completed"),  # only a running turn ends
    ("turn_end", "running", "aborted"),
    ("unload", "completed", "inactive"),  # a completed subagent stays completed
    ("stop", "idle", "aborted"),  # stopping a resting session restates it
    ("restate", "completed", "idle"),  # a restatement goes nowhere
    ("recover", "completed", "inactive"),  # completed rows stay as they are
    ("abort", "idle", "aborted"),
    ("run_end", "deleted", "completed"),
    ("delete", "deleted", "idle"),
    ("turn_end", "running", "error"),  # nothing enters a legacy state
]

# Where the code takes a session out of a terminal state (the arrows marked *kept* in the
# module docstring, and the tombstone), by cause.
WAYS_OUT: dict[SessionStatus, set[tuple[Cause, SessionStatus]]] = {
    "aborted": {
        ("turn_start", "running"),
        ("run_end", "completed"),
        ("run_end", "inactive"),
        ("delete", "deleted"),
        ("shutdown", "inactive"),
    },
    "deleted": set(),
}


@pytest.mark.parametrize(("why", "old", "new"), ALLOWED)
def test_every_drawn_arrow_is_a_transition(
    why: Cause, old: SessionStatus, new: SessionStatus
) -> None:
    moved = transition(SESSION, old, new, why)
    assert moved == Transition(session_id=SESSION, old=old, new=new, why=why)
    assert str(moved) == f"session {SESSION}: {old} -> {new} ({why})"


@pytest.mark.parametrize(("why", "old", "new"), ILLEGAL)
def test_an_arrow_that_is_not_drawn_is_an_illegal_transition(
    why: Cause, old: SessionStatus, new: SessionStatus
) -> None:
    with pytest.raises(IllegalTransition) as raised:
        transition(SESSION, old, new, why)
    error = raised.value
    assert isinstance(error, PrimeAgentError)
    assert (error.session_id, error.old, error.new, error.why) == (SESSION, old, new, why)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"session {SESSION} cannot go from {old} to {new} on {why} (")
    allowed = sorted(target for source, target in ARROWS[why] if source == old)
    assert message.endswith(f"goes to: {', '.join(allowed) if allowed else 'nowhere'})")


def test_the_message_names_where_the_cause_may_go() -> None:
    with pytest.raises(IllegalTransition, match=r"abort from running goes to: aborted, completed"):
        transition(SESSION, "running", "deleted", "abort")
    with pytest.raises(IllegalTransition, match=r"load from aborted goes to: nowhere\)$"):
        transition(SESSION, "aborted", "idle", "load")


def test_the_table_is_closed() -> None:
    assert set(ARROWS) == set(CAUSES)
    states = set(SESSION_STATUSES)
    for why, arrows in ARROWS.items():
        assert arrows, f"{why} draws no arrow"
        for old, new in arrows:
            assert old in states and new in states, (why, old, new)
    assert set(NEXT_STATES) == states
    for state, targets in NEXT_STATES.items():
        assert targets <= states, state
        assert state in targets, f"{state} cannot be restated"


def test_terminal_states_lead_only_where_the_code_goes() -> None:
    for state in TERMINAL_STATES:
        out = {
            (why, new)
            for why, arrows in ARROWS.items()
            for old, new in arrows
            if old == state and new != state
        }
        assert out == WAYS_OUT[state], state
    assert NEXT_STATES["deleted"] == {"deleted"}
    # Neither is ever loaded, nor does a turn end or an unload start from one.
    for why in ("load", "turn_end", "unload", "recover"):
        assert not {old for old, _ in ARROWS[why]} & TERMINAL_STATES, why


def test_nothing_enters_a_legacy_state_and_legacy_rows_load() -> None:
    for why, arrows in ARROWS.items():
        for old, new in arrows:
            if new in LEGACY_STATES:
                assert why == "restate" and old == new, (why, old, new)
    for state in LEGACY_STATES:
        for rest in ("idle", "completed"):
            transition(SESSION, state, rest, "load")


def test_the_store_uses_the_lifecycle_states() -> None:
    assert queries.SessionStatus is lifecycle.SessionStatus
    assert queries.SESSION_STATUSES == lifecycle.SESSION_STATUSES
    assert queries.SessionRecord(id="s", root_id="s", cwd="/", model="m", backend="b").status in (
        lifecycle.RESTING_STATES
    )


# --- every state change goes through the lifecycle ---------------------------------------------

# Where the orchestrator writes a session's state: Orchestrator._move assigns the live state;
# _publish and set_stored_state write the row (the daemon's shutdown goes through the latter).
STATE_WRITERS = {("orchestrator/sessions/manager.py", "_move")}
STATUS_WRITERS = {
    ("orchestrator/sessions/manager.py", "_publish"),
    ("orchestrator/sessions/manager.py", "set_stored_state"),
}


def _writes(path: Path) -> tuple[set[str], set[str]]:
    """The functions of ``path`` that assign ``x.state`` (``x`` not ``self``) and those that
    call ``update_session(..., status=...)`` or ``x.set_status(...)`` (``x`` not ``self``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    state: set[str] = set()
    status: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == "state"
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                ):
                    state.add(func.name)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "update_session"
                and any(k.arg == "status" for k in node.keywords)
            ) or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "set_status"
                # ``self.set_status`` is an HTTP handler's own (tornado), not a session's
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
            ):
                status.add(func.name)
    return state, status


def test_only_the_orchestrator_state_methods_write_a_session_state() -> None:
    state_writers: set[tuple[str, str]] = set()
    status_writers: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        state, status = _writes(path)
        state_writers |= {(rel, name) for name in state}
        status_writers |= {(rel, name) for name in status}
    assert state_writers == STATE_WRITERS
    assert status_writers <= STATUS_WRITERS
    assert ("orchestrator/sessions/manager.py", "_publish") in status_writers


# --- a driver that dies of an illegal arrow says so ----------------------------------------------


async def test_a_driver_stopped_by_an_illegal_transition_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from orchestrator.sessions.manager import _report_driver_end

    async def drive() -> None:
        lifecycle.transition("s-x", "deleted", "running", "turn_start")

    task = asyncio.create_task(drive(), name="driver-s-x")
    await asyncio.wait({task})
    with caplog.at_level(logging.ERROR, logger="orchestrator.sessions.manager"):
        _report_driver_end(task)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith("driver-s-x stopped: session s-x cannot go from deleted to running")
    assert "\n" not in line
