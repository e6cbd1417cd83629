"""Global harness writes from a sandbox are proposals until the user accepts them (issue 15).

A global entry lands in the system prompt of every later session of the user, so one hostile
model that could write one would steer everything after it. What a kernel writes stays in its
own session tree (``local``); a global create, update or delete from a kernel, or from a
refinement the agent started, becomes a row of ``harness_proposals`` instead
(``orchestrator/store/proposals.py``):

- ``propose`` checks the write exactly as ``write_entry`` would (``plan_write``: validation,
  conflicts, a missing entry), so a write that would be refused is refused now, and stores it
  with the head's version as its base. It returns the row and the version it *would* write;
  nothing reaches ``harness_entries``. A tree has at most ``PROPOSALS_PENDING_MAX`` pending.
- ``accept`` (the user: ``prime-agent harness accept ID``, ``/harness accept ID``) writes it in
  one transaction against that base version: if the entry moved on meanwhile, the accept is
  refused (``HarnessConflict``) and the proposal stays pending, to be rejected or proposed
  again. The version it writes keeps the proposer as its source (``agent`` or ``refine``) and
  session; the proposal row records the acceptance (``decided_by`` = ``user``, the time, the
  version written). A refinement's edit is marked applied, so its rollback undoes it.
- ``reject`` only marks the row.

Every step is an audit row: the proposal (who, when, why), the decision, and the version.
"""

from __future__ import annotations

from typing import Any, Final

import duckdb

from orchestrator.errors import HarnessInvalid, HarnessNotFound, HarnessQuota
from orchestrator.store.harness import plan_write, select_entry, write_entry
from orchestrator.store.harness_entry import (
    Action,
    EntryWrite,
    HarnessEntry,
    Source,
    check_reason,
)
from orchestrator.store.proposals import (
    ProposalRow,
    count_pending,
    insert_proposal,
    new_proposal_id,
    select_proposal,
    update_proposal,
)
from orchestrator.store.queries import utcnow
from orchestrator.store.refinements import select_refinement, update_refinement

__all__ = [
    "DECIDED_BY_USER",
    "PROPOSALS_PENDING_MAX",
    "accept_proposal",
    "propose",
    "reject_proposal",
]

# Pending proposals one session tree may have: a model that proposes in a loop fills this,
# not the store or the user's screen.
PROPOSALS_PENDING_MAX: Final = 20
DECIDED_BY_USER: Final = "user"
_WRITE_FIELDS: Final = ("title", "content", "path", "reference", "arguments", "metadata")


def _fields(write: EntryWrite) -> dict[str, Any]:
    return {
        name: getattr(write, name) for name in _WRITE_FIELDS if getattr(write, name) is not None
    }


def _write(row: ProposalRow) -> EntryWrite:
    stored = row.fields
    return EntryWrite(
        kind=row.kind,  # type: ignore[arg-type]  # checked again by write_entry
        id=row.entry_id,
        **{name: stored.get(name) for name in _WRITE_FIELDS},
    )


def propose(
    con: duckdb.DuckDBPyConnection,
    *,
    owner: str,
    proposer: str,
    action: Action,
    write: EntryWrite,
    expected_version: int | None,
    source: Source,
    reason: str,
    session_id: str,
    refinement_id: str | None = None,
) -> tuple[ProposalRow, HarnessEntry]:
    """Store a write of ``owner``'s entry as a pending proposal (inside ``Store.transaction``).

    Refused as ``write_entry`` would refuse it (``HarnessInvalid``, ``HarnessNotFound``,
    ``HarnessConflict``), or with ``HarnessQuota`` when ``proposer`` has
    ``PROPOSALS_PENDING_MAX`` pending. Returns the row and the version accepting it would write
    now."""
    preview = plan_write(
        con,
        owner=owner,
        action=action,
        write=write,
        expected_version=expected_version,
        source=source,
        reason=reason,
        session_id=session_id,
        refinement_id=refinement_id,
    )
    pending = count_pending(con, proposer)
    if pending >= PROPOSALS_PENDING_MAX:
        raise HarnessQuota(
            f"this session tree has {pending} global harness proposals waiting for the user "
            f"(at most {PROPOSALS_PENDING_MAX}); write to the local scope instead"
        )
    head = select_entry(con, owner, preview.kind, preview.id, include_deleted=True)
    row = insert_proposal(
        con,
        ProposalRow(
            id=new_proposal_id(),
            owner=owner,
            proposer=proposer,
            action=action,
            kind=preview.kind,
            entry_id=preview.id,
            fields=_fields(write),
            base_version=head.version if head is not None else None,
            source=source,
            reason=preview.reason,
            session_id=session_id,
            refinement_id=refinement_id,
        ),
    )
    return row, preview


def _pending(con: duckdb.DuckDBPyConnection, proposal_id: str) -> ProposalRow:
    row = select_proposal(con, proposal_id)
    if row is None:
        raise HarnessNotFound(
            f"no harness proposal {proposal_id!r}: `prime-agent harness list` shows the "
            "pending ones"
        )
    if row.status != "pending":
        raise HarnessInvalid(f"proposal {proposal_id} is already {row.status}")
    return row


def _mark_refinement_edit(
    con: duckdb.DuckDBPyConnection, row: ProposalRow, before: int | None, after: int
) -> None:
    """The refinement that proposed it now has this edit applied (its rollback undoes it)."""
    if row.refinement_id is None:
        return
    refinement = select_refinement(con, row.refinement_id)
    if refinement is None:
        return
    edits = [dict(edit) for edit in refinement.edits]
    for edit in edits:
        if edit.get("proposal") == row.id:
            edit.update(applied=True, before_version=before, after_version=after)
            edit.pop("error", None)
    update_refinement(con, refinement.id, edits=edits)


def accept_proposal(
    con: duckdb.DuckDBPyConnection, proposal_id: str, *, note: str | None = None
) -> tuple[ProposalRow, HarnessEntry]:
    """Write a pending proposal against its base version and mark it accepted (inside
    ``Store.transaction``). ``HarnessNotFound`` (unknown id), ``HarnessInvalid`` (decided
    already), ``HarnessConflict`` (the entry moved on; the proposal stays pending)."""
    row = _pending(con, proposal_id)
    note = check_reason(note) if note is not None else None
    head = select_entry(con, row.owner, row.kind, row.entry_id, include_deleted=True)
    written = write_entry(
        con,
        owner=row.owner,
        action=row.action,  # type: ignore[arg-type]  # checked again by write_entry
        write=_write(row),
        expected_version=row.base_version,
        source=row.source,  # type: ignore[arg-type]
        reason=row.reason,
        session_id=row.session_id,
        refinement_id=row.refinement_id,
    )
    _mark_refinement_edit(con, row, head.version if head is not None else None, written.version)
    decided = update_proposal(
        con,
        row.id,
        status="accepted",
        decided_at=utcnow(),
        decided_by=DECIDED_BY_USER,
        decision_note=note,
        result_version=written.version,
    )
    return decided, written


def reject_proposal(
    con: duckdb.DuckDBPyConnection, proposal_id: str, *, note: str | None = None
) -> ProposalRow:
    """Mark a pending proposal rejected (inside ``Store.transaction``); nothing else changes."""
    row = _pending(con, proposal_id)
    note = check_reason(note) if note is not None else None
    return update_proposal(
        con,
        row.id,
        status="rejected",
        decided_at=utcnow(),
        decided_by=DECIDED_BY_USER,
        decision_note=note,
    )
