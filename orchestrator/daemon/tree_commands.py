"""The daemon's answers to ``tree``, ``branch``, ``fork``, ``clone`` and ``import_session``
(docs/tree.md): the store's tree operations, plus what only the daemon knows, which sessions
are loaded.

Branching moves the leaf a loaded session's in-memory context was built from, so ``branch`` is
refused (``busy``) while the session or a loaded descendant has a turn running or input
waiting; an idle loaded session is unloaded first (``Orchestrator.unload``: sandbox stopped,
state inactive) and reloads from the new leaf on its next prompt. Forks, clones and imports are
new inactive sessions; their sources are only read.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import Branch, Clone, Fork, ImportSession, JsonObject, Tree
from orchestrator.api.wire import E_BUSY, E_INVALID_ARGUMENT
from orchestrator.daemon.command_context import CommandContext
from orchestrator.errors import UserError
from orchestrator.models.registry import resolve_model
from orchestrator.sessions.live import LiveSession
from orchestrator.settings import EMBEDDED_MODEL_NAME
from orchestrator.store import tree
from orchestrator.store.db import SessionRecord
from orchestrator.store.jsonl_import import ImportOptions, import_session_jsonl
from orchestrator.store.jsonl_parse import read_session_file

__all__ = ["branch", "copy", "import_file", "loaded_family", "quiet_family", "tree_page"]

# A rejected path is quoted back this far (it may be huge).
_SHOWN_CHARS: Final = 200
# A busy refusal names at most this many of the sessions it waits for.
BUSY_SHOWN: Final = 3


def _invalid(exc: UserError) -> ApiCommandError:
    return ApiCommandError(E_INVALID_ARGUMENT, str(exc))


async def tree_page(daemon: CommandContext, rec: SessionRecord, command: Tree) -> JsonObject:
    page = await tree.tree_page(
        daemon.store, rec.id, after_seq=command.after_seq, limit=command.limit
    )
    return page.as_dict()


def loaded_family(daemon: CommandContext, session_id: str) -> list[LiveSession]:
    """The session and its loaded descendants (parents before children)."""
    sessions = sorted(daemon.orch.loaded_sessions(), key=lambda s: s.record.depth)
    inside = {session_id}
    found: list[LiveSession] = []
    for live in sessions:
        if live.id == session_id or live.record.parent_id in inside:
            inside.add(live.id)
            found.append(live)
    return found


def quiet_family(daemon: CommandContext, session_id: str, doing: str) -> list[LiveSession]:
    """The session's loaded family (``loaded_family``), or ``busy`` when one of them has a turn
    running or input waiting: ``doing`` ("branch", "restart the sandbox of") says what waits."""
    family = loaded_family(daemon, session_id)
    busy = [s.id for s in family if s.state == "running" or s.pending]
    if busy:
        raise ApiCommandError(
            E_BUSY,
            f"cannot {doing} {session_id} while {', '.join(busy[:BUSY_SHOWN])} "
            f"{'is' if len(busy) == 1 else 'are'} in a turn; wait for it or abort it",
        )
    return family


async def branch(daemon: CommandContext, rec: SessionRecord, command: Branch) -> JsonObject:
    orch = daemon.orch
    quiet_family(daemon, rec.id, "branch")
    live = orch.loaded(rec.id)
    if live is not None:  # its context was built from the old leaf
        await orch.unload(live)
    try:
        result = await tree.branch(daemon.store, rec.id, command.event, summary=command.summary)
    except UserError as exc:
        raise _invalid(exc) from None
    woken = orch.loaded(rec.id)  # a message woke it meanwhile, from the old leaf
    if woken is not None and woken.state != "running" and not woken.pending:
        await orch.unload(woken)
    return {**result.as_dict(), "unloaded": live is not None}


async def copy(daemon: CommandContext, rec: SessionRecord, command: Fork | Clone) -> JsonObject:
    """``fork`` (at ``event``, default the leaf) or ``clone`` (the active path)."""
    try:
        if isinstance(command, Clone):
            made = await tree.clone(daemon.store, rec.id)
        else:
            made = await tree.fork(daemon.store, rec.id, command.event)
    except UserError as exc:
        raise _invalid(exc) from None
    return {
        "session": made.id,
        "name": made.name,
        "forked_from": made.forked_from,
        "forked_at": made.forked_at,
        "leaf_event_id": made.leaf_event_id,
    }


def _directory(text: str | None, what: str) -> str | None:
    if text is None:
        return None
    path = Path(text)
    try:
        usable = path.is_absolute() and path.is_dir()
    except (OSError, ValueError):
        usable = False
    if not usable:
        raise ApiCommandError(
            E_INVALID_ARGUMENT, f"{what} {text[:_SHOWN_CHARS]!r} is not an absolute directory"
        )
    return text


async def import_file(daemon: CommandContext, command: ImportSession) -> JsonObject:
    path = Path(command.path)
    if not path.is_absolute():
        shown = command.path[:_SHOWN_CHARS]
        raise ApiCommandError(E_INVALID_ARGUMENT, f"import needs an absolute path, not {shown!r}")
    settings = daemon.settings
    try:
        if command.model is not None:  # refuse a model this daemon cannot use, now
            resolve_model(command.model, settings)
        # Parsing reads the whole file: off the loop.
        parsed = await asyncio.to_thread(read_session_file, path)
        choice = await daemon.choose_backend(command.backend)
    except UserError as exc:
        raise _invalid(exc) from None
    options = ImportOptions(
        model=command.model,
        default_model=settings.default_model or EMBEDDED_MODEL_NAME,
        cwd=_directory(command.cwd, "cwd"),
        fallback_cwd=_directory(command.fallback_cwd, "fallback cwd") or str(Path.home()),
        backend=choice.name,
        name=command.name,
    )
    try:
        result = await import_session_jsonl(daemon.store, parsed, options)
    except UserError as exc:
        raise _invalid(exc) from None
    return {**result.as_dict(), "warning": choice.warning or None}
