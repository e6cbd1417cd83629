"""The daemon's answers to ``set_model`` and the Continual Harness commands (``refine``,
``refine_rollback``, ``harness_log``, ``harness_list``, ``harness_edit``; docs/harness.md).

``set_model`` switches a session's model (or only its endpoint) between turns: a
``model_change`` event on its path naming both endpoints (context assembly applies it from
there, docs/tree.md) and the session row's model and stored spec, which is what a later wake
resolves. Naming the session's own model without an endpoint keeps its endpoint. While the
session is in a turn it is refused (``busy``): a switch in the middle of a turn's steps would
make one turn talk to two models.

The harness commands are the user's and the TUI's door to the same store the kernel's
``rlm.harness`` writes (source ``user`` instead of ``agent``) and to the session's
``Refiner`` (``orch.refiner``). ``harness_accept`` / ``harness_reject`` decide on the global
writes a kernel (or a refinement the agent started) proposed (``harness/proposals.py``);
``harness_list`` answers the pending proposals too, and ``harness_log`` every proposal with
its decision.
"""

from __future__ import annotations

from typing import Any, Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import (
    HarnessAccept,
    HarnessEdit,
    HarnessList,
    HarnessLog,
    HarnessReject,
    JsonObject,
    Refine,
    RefineRollback,
    SetModel,
)
from orchestrator.api.wire import E_BUSY, E_CONFLICT, E_INVALID_ARGUMENT, E_NOT_FOUND
from orchestrator.daemon.command_context import CommandContext
from orchestrator.errors import HarnessError, UserError
from orchestrator.harness.outcome import outcome_line
from orchestrator.harness.proposals import accept_proposal, reject_proposal
from orchestrator.models.lite import ensure_litellm
from orchestrator.models.registry import resolving_needs_litellm, switched_model
from orchestrator.sessions.compaction import change_model
from orchestrator.sessions.live import LiveSession
from orchestrator.store import harness as harness_store
from orchestrator.store import proposals as proposal_store
from orchestrator.store import refinements as refinement_store
from orchestrator.store.db import SessionRecord
from orchestrator.store.harness_entry import GLOBAL_OWNER, EntryWrite, slugify
from orchestrator.store.refinements import RefinementRow

__all__ = [
    "PROPOSALS_LIST_MAX",
    "by_record",
    "decide",
    "harness_edit",
    "harness_list",
    "harness_log",
    "refine",
    "rollback",
    "set_model",
]

USER_REASON: Final = "edited by the user"
# Pending proposals in a harness_list answer (each tree has at most PROPOSALS_PENDING_MAX).
PROPOSALS_LIST_MAX: Final = 200


def _refinement_wire(row: RefinementRow) -> JsonObject:
    wire = row.to_wire()
    wire["outcome_line"] = outcome_line(row) if row.outcome is not None else None
    return wire


def _harness_error(exc: HarnessError) -> ApiCommandError:
    code = {"not_found": E_NOT_FOUND, "conflict": E_CONFLICT}.get(exc.code, E_INVALID_ARGUMENT)
    return ApiCommandError(code, str(exc))


async def set_model(daemon: CommandContext, live: LiveSession, command: SetModel) -> JsonObject:
    previous = live.model.selector
    try:
        if resolving_needs_litellm(command.model or previous, daemon.settings):
            await ensure_litellm()  # its first import must not stall the daemon's loop
        # The session's own endpoint stays unless the switch names another (or another model).
        model = switched_model(
            live.record.model_spec, command.model, command.api_base, daemon.settings
        )
        model = await daemon.endpoint_for(model)
    except UserError as exc:
        raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None
    try:
        await change_model(daemon.store, live, model)
    except ValueError as exc:
        raise ApiCommandError(E_BUSY, str(exc)) from None
    return {
        "session": live.id,
        "model": model.selector,
        "previous": previous,
        "api_base": None if model.embedded else model.api_base,
    }


async def refine(daemon: CommandContext, live: LiveSession, command: Refine) -> JsonObject:
    target = daemon.orch.session_target(live)
    answer = await daemon.orch.refiner.request(
        target, instructions=command.instructions, scope=command.scope, trigger="user"
    )
    return {"session": live.id, **answer}


async def rollback(daemon: CommandContext, command: RefineRollback) -> JsonObject:
    try:
        row = await daemon.orch.refiner.rollback(command.id, session_id=None, source="user")
    except HarnessError as exc:
        raise _harness_error(exc) from None
    daemon.orch.harness_changed(row.owner)
    return _refinement_wire(row)


def _owners(rec: SessionRecord | None) -> list[str]:
    return [GLOBAL_OWNER] if rec is None else [GLOBAL_OWNER, rec.root_id]


async def harness_list(
    daemon: CommandContext, rec: SessionRecord | None, command: HarnessList
) -> JsonObject:
    """The live entries, and every pending proposal (each would change what all sessions
    see, whichever tree proposed it)."""
    owners = _owners(rec)

    def read(con: Any) -> tuple[list[Any], list[Any]]:
        entries = harness_store.select_entries(con, owners, command.kind)
        pending = proposal_store.select_proposals(con, status="pending", limit=PROPOSALS_LIST_MAX)
        return entries, [p for p in pending if command.kind in (None, p.kind)]

    entries, pending = await daemon.store.read(read)
    return {
        "entries": [e.to_wire() for e in entries],
        "proposals": [p.to_wire() for p in pending],
    }


async def harness_log(
    daemon: CommandContext, rec: SessionRecord | None, command: HarnessLog
) -> JsonObject:
    owners = None if rec is None else _owners(rec)

    proposers = None if rec is None else [rec.root_id]

    def read(con: Any) -> tuple[list[Any], list[Any], list[Any]]:
        versions = harness_store.select_log(con, owners, limit=command.limit)
        refinements = refinement_store.select_refinements(con, owners=owners, limit=command.limit)
        proposals = proposal_store.select_proposals(con, proposers=proposers, limit=command.limit)
        return versions, refinements, proposals

    versions, refinements, proposals = await daemon.store.read(read)
    return {
        "versions": [v.to_wire() for v in versions],
        "refinements": [_refinement_wire(r) for r in refinements],
        "proposals": [p.to_wire() for p in proposals],
    }


async def decide(daemon: CommandContext, command: HarnessAccept | HarnessReject) -> JsonObject:
    """Accept (write) or reject a pending proposal: ``{proposal, entry?}``."""
    try:
        if isinstance(command, HarnessAccept):
            row, entry = await daemon.store.transaction(
                lambda con: accept_proposal(con, command.id, note=command.reason)
            )
        else:
            row = await daemon.store.transaction(
                lambda con: reject_proposal(con, command.id, note=command.reason)
            )
            return {"proposal": row.to_wire()}
    except HarnessError as exc:
        raise _harness_error(exc) from None
    daemon.orch.harness_changed(row.owner)
    return {"proposal": row.to_wire(), "entry": entry.to_wire()}


async def harness_edit(
    daemon: CommandContext, rec: SessionRecord | None, command: HarnessEdit
) -> JsonObject:
    if command.scope == "local" and rec is None:
        raise ApiCommandError(E_INVALID_ARGUMENT, "a local entry needs --session")
    owner = GLOBAL_OWNER if rec is None or command.scope == "global" else rec.root_id
    try:
        entry_id = command.id or slugify(command.title or "")
        write = EntryWrite(
            kind=command.kind, id=entry_id, title=command.title, content=command.content
        )
        entry = await daemon.store.transaction(
            lambda con: harness_store.write_entry(
                con,
                owner=owner,
                action=command.action,
                write=write,
                expected_version=command.version,
                source="user",
                reason=command.reason or USER_REASON,
                session_id=None,
            )
        )
    except HarnessError as exc:
        raise _harness_error(exc) from None
    daemon.orch.harness_changed(owner)
    return {"entry": entry.to_wire()}


async def by_record(
    daemon: CommandContext,
    rec: SessionRecord | None,
    command: HarnessLog | HarnessList | HarnessEdit,
) -> JsonObject:
    """The commands that name a session only to find its tree (or none: global)."""
    match command:
        case HarnessLog():
            return await harness_log(daemon, rec, command)
        case HarnessList():
            return await harness_list(daemon, rec, command)
        case HarnessEdit():
            return await harness_edit(daemon, rec, command)
