"""The daemon reaches the orchestrator through its port only (``daemon/command_context.py``).

``SessionControl`` lists what a daemon command may ask of the orchestrator. These checks read
``orchestrator/daemon/*.py`` and fail when code there reaches past it: into the orchestrator's
session table or store (``orch.sessions``, ``orch.store``), into a session's input queues
(``steer``, ``follow``), or assigning a field of a live session. Reading what a session shows
(``live.state``, ``live.record``...) is allowed. That the ``Orchestrator`` fills each port is
mypy's check, where ``service.Daemon`` passes it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import orchestrator.daemon

DAEMON_DIR: Final = Path(orchestrator.daemon.__file__).parent
# The names the daemon gives its orchestrator, and the orchestrator's parts it may not touch.
ORCHESTRATOR_NAMES: Final = frozenset({"orch", "_orch"})
HIDDEN_PARTS: Final = frozenset({"sessions", "store", "sandboxes"})
# The names the daemon gives a live session (``LiveSession``), and its input queues.
SESSION_NAMES: Final = frozenset(
    {"live", "session", "fresh", "woken", "loaded", "parent", "child", "above"}
)
QUEUES: Final = frozenset({"steer", "follow"})


def _holder(node: ast.expr) -> str | None:
    """What an attribute is read from, by name: ``orch`` for ``orch.x`` and ``self.orch.x``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _root(node: ast.expr) -> str | None:
    """The variable an attribute or item chain starts from (``live`` for ``live.a.b[0]``)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _flattened(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            out += _flattened(list(target.elts))
        else:
            out.append(target)
    return out


def reaches_past_the_port(source: str, filename: str = "<source>") -> list[str]:
    """Each place in ``source`` that reaches past the port, as ``file:line: what``, in line
    order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute):
            if node.attr in HIDDEN_PARTS and _holder(node.value) in ORCHESTRATOR_NAMES:
                found.append((node.lineno, f"reads the orchestrator's {node.attr}"))
            if node.attr in QUEUES and _root(node.value) in SESSION_NAMES:
                found.append((node.lineno, f"touches a session's {node.attr} queue"))
        for target in _flattened(_targets(node)):
            # A plain name (``live = ...``) rebinds a variable; a field or item changes a session.
            if isinstance(target, ast.Attribute | ast.Subscript) and _root(target) in SESSION_NAMES:
                found.append((target.lineno, f"assigns {ast.unparse(target)} of a live session"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_no_daemon_module_reaches_past_the_orchestrators_port() -> None:
    modules = sorted(DAEMON_DIR.glob("*.py"))
    assert len(modules) > 1, DAEMON_DIR
    found = [
        hit
        for path in modules
        for hit in reaches_past_the_port(path.read_text(encoding="utf-8"), path.name)
    ]
    assert found == [], "\n".join(found)


def test_the_guard_sees_each_kind_of_reach() -> None:
    source = """
def command(daemon, live, session, orch, rec):
    daemon.orch.sessions.get(rec.id)
    self._orch.store.append(rec.id)
    orch.sandboxes.forget(rec.id)
    live.goal_run = "g-1"
    session.steer.clear()
    live.run_stop, other = None, 1
    fresh.record.name += "x"
    del woken.notes[0]
"""
    found = reaches_past_the_port(source)
    assert [hit.split(": ", 1)[1] for hit in found] == [
        "reads the orchestrator's sessions",
        "reads the orchestrator's store",
        "reads the orchestrator's sandboxes",
        "assigns live.goal_run of a live session",
        "touches a session's steer queue",
        "assigns live.run_stop of a live session",
        "assigns fresh.record.name of a live session",
        "assigns woken.notes[0] of a live session",
    ], found


def test_reading_what_a_session_shows_and_calling_the_port_are_allowed() -> None:
    source = """
def command(daemon, live, rec):
    found = daemon.orch.loaded(rec.id)
    status = live.state if live is not None else rec.status
    store = daemon.store
    daemon.orch.begin_goal_run(live, "g-1")
    busy = live.pending > 0 and live.record.parent_id is None
"""
    assert reaches_past_the_port(source) == []
