"""``/refine``: plan in the background, apply at a turn boundary, roll back by id (docs/spec.md §6).

The orchestrator holds one ``Refiner`` and hands it sessions as ``RefineTarget``s.

1. **Request.** ``request`` refuses when the session has refine switched off or a plan of it
   is still being made; otherwise it inserts a ``refinements`` row (``planning``) and starts
   phase 1 in a background task, so the session keeps working while the plan is made.
2. **Plan.** One model call (``refine_plan``) over the harness as it is, the recent
   refinements and the conversation, read from the store. Its usage is recorded as a
   ``usage`` event of the session. A truncated or invalid plan marks the row ``failed`` with a
   one-line error and changes nothing. A valid plan is stored ``planned``, each edit with the
   version of its target at planning time (``baseline_version``): that is what makes a late
   apply safe.
3. **Apply.** ``at_boundary`` (after every turn, and by the planner itself when the session is
   idle) applies each planned refinement in ONE store transaction: every edit is written with
   ``expected_version`` = its baseline, so an edit whose target the kernel (or the user)
   changed meanwhile is rejected while the others apply — never merged, never lost. The row
   records each edit's before and after version and the session's turn count, from which
   ``outcome`` later measures what the refinement did.
   A refinement of the *global* harness that the user did not start (``refine.run(scope=
   "global")`` from a cell: trigger ``agent``) applies nothing: each edit that would apply
   becomes a proposal (``orchestrator/harness/proposals.py``, the edit records its id) that
   waits for the user, like a kernel's own global write. The planner reads the conversation,
   which the sandbox wrote, so its global edits are the sandbox's words. A refinement the user
   started with ``--global`` (trigger ``user``) applies as planned: the user asked for it, and
   ``rollback`` undoes it.
4. **Rollback.** Restores every applied edit's before-state (newest first), each against the
   version the refinement left; it is itself a refinement row (``rollback_of``), so it can be
   rolled back too.

The row is the whole state of a refinement: a plan made by one daemon is applied by the next
after a restart. Only "which plans are being made right now" lives in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Protocol

import duckdb
from pydantic import BaseModel

from orchestrator.errors import (
    HarnessConflict,
    HarnessError,
    HarnessInvalid,
    HarnessNotFound,
    ModelError,
    PrimeAgentError,
    StoreError,
)
from orchestrator.harness.outcome import (
    OUTCOME_TURNS,
    due_refinement_ids,
    measure_outcome,
    outcome_line,
    turn_count,
)
from orchestrator.harness.proposals import propose
from orchestrator.harness.refine_plan import (
    CONVERSATION_MAX_CHARS,
    CONVERSATION_TYPES,
    HISTORY_MAX,
    STATE_ENTRIES_PER_KIND,
    HistoryItem,
    Plan,
    PlanFailed,
    build_messages,
    parse_plan,
    serialize_conversation,
)
from orchestrator.models.client import ModelReply
from orchestrator.store.db import Store
from orchestrator.store.events import EventType, NoticePayload
from orchestrator.store.harness import (
    owner_of,
    restore_entry,
    select_entries,
    select_entry,
    select_versions,
    write_entry,
)
from orchestrator.store.harness_entry import (
    GLOBAL_OWNER,
    EntryWrite,
    HarnessEntry,
    Scope,
    Source,
    check_action,
    check_entry_id,
    check_kind,
    check_scope,
)
from orchestrator.store.queries import EventRecord, event_from_row, utcnow
from orchestrator.store.refinements import (
    RefinementRow,
    insert_refinement,
    new_refinement_id,
    select_refinement,
    select_refinements,
    update_refinement,
)
from orchestrator.store.sessions_with_rows import SessionsWithRows, distinct_sessions_query

USAGE_PURPOSE: Final = "refine"

__all__ = [
    "CHANGED_DURING_PLANNING",
    "CONVERSATION_EVENTS_MAX",
    "INSTRUCTIONS_MAX_CHARS",
    "ROLLBACK_TRIGGER",
    "USER_TRIGGER",
    "RefineTarget",
    "Refiner",
    "apply_line",
]

log = logging.getLogger(__name__)

INSTRUCTIONS_MAX_CHARS: Final = 4_000
TRIGGER_MAX_CHARS: Final = 40
# Newest conversation events read for the planner; the text is then cut to
# CONVERSATION_MAX_CHARS (each event's text is already bounded by ``entry_of``).
CONVERSATION_EVENTS_MAX: Final = 2_000
NOTICE_REASON_MAX_CHARS: Final = 80
ROLLBACK_TRIGGER: Final = "rollback"
# The trigger of a refinement the user asked for (CLI, TUI, control API); only such a
# refinement writes the global harness directly (the agent's global edits are proposals).
USER_TRIGGER: Final = "user"
CHANGED_DURING_PLANNING: Final = "entry changed during planning"
CHANGED_SINCE: Final = "entry changed since the refinement"
INTERRUPTED: Final = "interrupted: the daemon stopped while the plan was being made"
# What undoing an edit amounts to (a rollback's edits say it, so they can be undone too).
_INVERSE: Final = {"create": "delete", "update": "update", "delete": "create"}
_EDIT_FIELDS: Final = ("title", "content", "path", "reference", "arguments", "metadata")

_CONVERSATION = """
SELECT session_id, seq, id, parent_event_id, type, ts, payload FROM events
WHERE session_id = $1 AND list_contains($2::VARCHAR[], type)
ORDER BY seq DESC LIMIT $3
"""
_BY_STATUS = """
SELECT id FROM refinements WHERE session_id = $1 AND status = $2 ORDER BY created_at, id
"""


class RefineTarget(Protocol):
    """A session as the refiner sees it (the orchestrator adapts its live session)."""

    @property
    def session_id(self) -> str: ...
    @property
    def root_id(self) -> str: ...
    @property
    def refine_enabled(self) -> bool: ...

    def busy(self) -> bool:
        """A turn is running (apply waits for the boundary that follows it)."""
        ...

    async def complete(self, messages: list[dict[str, Any]]) -> ModelReply:
        """One model call with the session's current model."""
        ...

    async def record(self, type_: EventType, payload: BaseModel) -> Any:
        """Append an event to the session."""
        ...

    def harness_changed(self) -> None:
        """The harness changed: rebuild the system prompt at the next turn boundary."""
        ...


@dataclass
class _Progress:
    """What ``status`` reports for one session (kept current as refinements move on)."""

    in_flight: str | None = None
    pending: list[str] = field(default_factory=list)
    last: RefinementRow | None = None


# -- reading what the planner sees -----------------------------------------------------------


@dataclass(frozen=True)
class _Evidence:
    state: list[HarnessEntry]
    history: list[HistoryItem]
    conversation: list[EventRecord]


def _history_item(row: RefinementRow) -> HistoryItem:
    shown = [e for e in row.edits if e.get("applied", row.status != "applied")]
    return HistoryItem(
        id=row.id,
        status=row.status,
        summary=row.summary,
        changes=tuple(f"{e.get('action')} {e.get('kind')}:{e.get('id')}" for e in shown),
        outcome=outcome_line(row) if row.outcome else None,
        rollback_of=row.rollback_of,
    )


def _owners(scope: Scope, root_id: str) -> list[str]:
    return [GLOBAL_OWNER] if scope == "global" else [GLOBAL_OWNER, root_id]


def _read_evidence(con: duckdb.DuckDBPyConnection, row: RefinementRow, root_id: str) -> _Evidence:
    owners = _owners(check_scope(row.scope), root_id)
    state = select_entries(con, owners, limit_per_kind=STATE_ENTRIES_PER_KIND)
    earlier = [
        r for r in select_refinements(con, owners=owners, limit=HISTORY_MAX + 1) if r.id != row.id
    ][:HISTORY_MAX]
    rows = con.execute(
        _CONVERSATION, [row.session_id, list(CONVERSATION_TYPES), CONVERSATION_EVENTS_MAX]
    ).fetchall()
    return _Evidence(
        state=state,
        history=[_history_item(r) for r in reversed(earlier)],
        conversation=[event_from_row(r) for r in reversed(rows)],
    )


def _store_plan(con: duckdb.DuckDBPyConnection, row: RefinementRow, plan: Plan) -> RefinementRow:
    """Mark the row planned, with each edit's baseline: the live head's version now."""
    edits = []
    for edit in plan.edits:
        head = select_entry(con, row.owner, edit.kind, edit.id)
        edits.append(edit.to_record(head.version if head is not None else None))
    return update_refinement(
        con,
        row.id,
        status="planned",
        summary=plan.summary,
        rationale=plan.rationale,
        expected_outcome=plan.expected_outcome,
        edits=edits,
        planned_at=utcnow(),
    )


# -- applying --------------------------------------------------------------------------------


def _short(error: str) -> str:
    head = error.split(": ", 1)[0]
    return (
        head if len(head) <= NOTICE_REASON_MAX_CHARS else head[: NOTICE_REASON_MAX_CHARS - 1] + "…"
    )


def _version_text(version: int | None) -> str:
    return "none" if version is None else f"v{version}"


def proposes(row: RefinementRow) -> bool:
    """Whether the refinement's edits are proposals rather than writes: it targets the global
    harness and the user did not start it."""
    return row.owner == GLOBAL_OWNER and row.trigger != USER_TRIGGER


def _root_of(con: duckdb.DuckDBPyConnection, session_id: str) -> str:
    found = con.execute("SELECT root_id FROM sessions WHERE id = $1", [session_id]).fetchone()
    return str(found[0]) if found is not None else session_id


def _apply_edit(
    con: duckdb.DuckDBPyConnection, row: RefinementRow, edit: dict[str, Any]
) -> dict[str, Any]:
    """Validate and write (or propose) one planned edit; the edit's record with what
    happened."""
    out = dict(edit)
    baseline = edit.get("baseline_version")
    try:
        action = check_action(edit.get("action"))
        kind = check_kind(edit.get("kind"))
        entry_id = check_entry_id(edit.get("id"))
        write = EntryWrite(kind=kind, id=entry_id, **{k: edit.get(k) for k in _EDIT_FIELDS})
        head = select_entry(con, row.owner, kind, entry_id, include_deleted=True)
        if action != "create" and baseline is None and head is not None and not head.deleted:
            raise HarnessConflict("created since", current_version=head.version)
        if proposes(row):
            proposal, _ = propose(
                con,
                owner=row.owner,
                proposer=_root_of(con, row.session_id),
                action=action,
                write=write,
                expected_version=baseline if isinstance(baseline, int) else None,
                source="refine",
                reason=str(edit.get("reason") or row.summary or ""),
                session_id=row.session_id,
                refinement_id=row.id,
            )
            out["applied"] = False
            out["proposal"] = proposal.id
            return out
        written = write_entry(
            con,
            owner=row.owner,
            action=action,
            write=write,
            expected_version=baseline if isinstance(baseline, int) else None,
            source="refine",
            reason=str(edit.get("reason") or row.summary or ""),
            session_id=row.session_id,
            refinement_id=row.id,
        )
    except HarnessConflict as exc:
        out["applied"] = False
        if exc.current_version != baseline:
            out["error"] = (
                f"{CHANGED_DURING_PLANNING}: planned against {_version_text(baseline)}, "
                f"the store has {_version_text(exc.current_version)}"
            )
        else:
            out["error"] = str(exc)
        return out
    except HarnessError as exc:
        out["applied"] = False
        out["error"] = str(exc)
        return out
    out["applied"] = True
    # The head before the write, tombstones included: rolling back restores exactly it (or,
    # for an entry that never existed, writes a tombstone).
    out["before_version"] = head.version if head is not None else None
    out["after_version"] = written.version
    return out


def _apply(con: duckdb.DuckDBPyConnection, refinement_id: str) -> RefinementRow | None:
    """Apply one planned refinement (inside a transaction); None when it is not planned any
    more (another boundary got to it first)."""
    row = select_refinement(con, refinement_id)
    if row is None or row.status != "planned":
        return None
    edits = [_apply_edit(con, row, edit) for edit in row.edits]
    return update_refinement(
        con,
        row.id,
        status="applied",
        edits=edits,
        turn_index=turn_count(con, row.session_id),
        applied_at=utcnow(),
    )


def _proposed(edit: dict[str, Any]) -> bool:
    return not edit.get("applied") and bool(edit.get("proposal"))


def _counts(row: RefinementRow) -> tuple[int, int]:
    """(applied, rejected) edits; a pending proposal is neither."""
    applied = sum(1 for e in row.edits if e.get("applied"))
    proposed = sum(1 for e in row.edits if _proposed(e))
    return applied, len(row.edits) - applied - proposed


def apply_line(row: RefinementRow) -> str:
    """One line for the session: ``refinement r-…: 2 edits applied, 1 rejected (why)``."""
    applied, rejected = _counts(row)
    if not row.edits:
        return f"refinement {row.id}: no change ({row.summary or 'no edits'})"
    proposals = [str(e["proposal"]) for e in row.edits if _proposed(e)]
    if proposals:
        noun = "edit" if len(proposals) == 1 else "edits"
        text = (
            f"refinement {row.id}: {len(proposals)} global {noun} proposed, waiting for the "
            f"user (prime-agent harness accept {' / '.join(proposals)})"
        )
        if rejected:
            text += f", {rejected} rejected"
        return text
    noun = "edit" if applied == 1 else "edits"
    text = f"refinement {row.id}: {applied} {noun} applied"
    if rejected:
        reasons = dict.fromkeys(
            _short(str(e.get("error")))
            for e in row.edits
            if not e.get("applied") and not _proposed(e)
        )
        text += f", {rejected} rejected ({'; '.join(reasons)})"
    elif row.summary:
        text += f": {row.summary}"
    return text


def _measure_due(
    con: duckdb.DuckDBPyConnection, session_id: str, turns: int
) -> list[RefinementRow]:
    measured = []
    for refinement_id in due_refinement_ids(con, session_id):
        row = select_refinement(con, refinement_id)
        if row is None or row.turn_index is None:
            continue
        outcome = measure_outcome(con, session_id, row.turn_index, turns=turns)
        if outcome is not None:
            measured.append(update_refinement(con, row.id, outcome=outcome, outcome_at=utcnow()))
    return measured


# -- rolling back ----------------------------------------------------------------------------


def _version(
    con: duckdb.DuckDBPyConnection, owner: str, kind: str, entry_id: str, version: int
) -> HarnessEntry:
    for entry in select_versions(con, owner, kind, entry_id):
        if entry.version == version:
            return entry
    raise HarnessNotFound(f"{kind} {entry_id!r} has no version {version} to restore")


def _restore_edit(
    con: duckdb.DuckDBPyConnection,
    original: RefinementRow,
    edit: dict[str, Any],
    *,
    rollback_id: str,
    session_id: str,
    source: Source,
) -> dict[str, Any]:
    kind, entry_id = str(edit.get("kind")), str(edit.get("id"))
    before, after = edit.get("before_version"), edit.get("after_version")
    reason = f"rollback of {original.id}"
    action = _INVERSE.get(str(edit.get("action")), "update")
    record: dict[str, Any] = {"action": action, "kind": kind, "id": entry_id, "reason": reason}
    record["baseline_version"] = after
    try:
        to = None if before is None else _version(con, original.owner, kind, entry_id, int(before))
        written = restore_entry(
            con,
            owner=original.owner,
            kind=kind,
            entry_id=entry_id,
            to=to,
            expected_version=int(after) if after is not None else None,
            source=source,
            reason=reason,
            session_id=session_id,
            refinement_id=rollback_id,
        )
    except HarnessConflict as exc:
        record["applied"] = False
        record["error"] = (
            f"{CHANGED_SINCE}: it left {_version_text(after)}, the store has "
            f"{_version_text(exc.current_version)}; restore it by hand if still wanted"
        )
        return record
    except HarnessError as exc:
        record["applied"] = False
        record["error"] = str(exc)
        return record
    record["applied"] = True
    record["before_version"] = after
    record["after_version"] = written.version
    return record


def _rollback(
    con: duckdb.DuckDBPyConnection,
    refinement_id: str,
    session_id: str | None,
    source: Source,
) -> RefinementRow:
    original = select_refinement(con, refinement_id)
    if original is None:
        raise HarnessNotFound(f"no refinement {refinement_id!r}")
    if original.status != "applied":
        raise HarnessInvalid(
            f"refinement {refinement_id} is {original.status}: only an applied refinement "
            "can be rolled back"
        )
    rollback_id = new_refinement_id()
    owner_session = session_id or original.session_id
    edits = [
        _restore_edit(
            con, original, edit, rollback_id=rollback_id, session_id=owner_session, source=source
        )
        for edit in reversed(original.edits)
        if edit.get("applied")
    ]
    now = utcnow()
    return insert_refinement(
        con,
        RefinementRow(
            id=rollback_id,
            session_id=owner_session,
            owner=original.owner,
            scope=original.scope,
            trigger=ROLLBACK_TRIGGER,
            status="applied",
            summary=f"rollback of {original.id}"
            + (f": {original.summary}" if original.summary else ""),
            edits=edits,
            rollback_of=original.id,
            turn_index=turn_count(con, owner_session),
            created_at=now,
            planned_at=now,
            applied_at=now,
        ),
    )


# -- the refiner -----------------------------------------------------------------------------


class Refiner:
    """Every session's refinements; one per orchestrator (``orch.refiner``)."""

    def __init__(self, store: Store, *, outcome_turns: int = OUTCOME_TURNS) -> None:
        if outcome_turns < 1:
            raise ValueError(f"outcome_turns must be >= 1, got {outcome_turns}")
        self._store = store
        self._outcome_turns = outcome_turns
        self._tasks: set[asyncio.Task[None]] = set()
        self._planning: dict[str, str] = {}  # session id -> the refinement being planned
        self._progress: dict[str, _Progress] = {}
        # One apply (or rollback) at a time: the orchestrator's boundary and a plan that
        # finishes while the session is idle may both call at_boundary.
        self._apply_lock = asyncio.Lock()
        self._closed = False
        # Sessions that ever had a refinement row: the others' boundaries read nothing.
        self._with_rows = SessionsWithRows(store, distinct_sessions_query("refinements"))

    # -- phase 1 -----------------------------------------------------------------------------

    async def request(
        self, target: RefineTarget, *, instructions: str | None, scope: Scope, trigger: str
    ) -> dict[str, Any]:
        """Schedule a refinement of ``target``: ``{"scheduled": True, "id": …}``, or
        ``{"scheduled": False, "reason": …}`` when refused. Bad arguments raise
        ``HarnessInvalid``."""
        scope = check_scope(scope)
        if not trigger or len(trigger) > TRIGGER_MAX_CHARS:
            raise HarnessInvalid(f"trigger must be 1 to {TRIGGER_MAX_CHARS} characters")
        if instructions is not None:
            instructions = instructions.strip() or None
        if instructions is not None and len(instructions) > INSTRUCTIONS_MAX_CHARS:
            raise HarnessInvalid(
                f"instructions have {len(instructions):,} characters; the limit is "
                f"{INSTRUCTIONS_MAX_CHARS:,}"
            )
        session_id = target.session_id
        if self._closed:
            return {"scheduled": False, "reason": "the orchestrator is stopping"}
        if not target.refine_enabled:
            return {"scheduled": False, "reason": "refine is disabled for this session"}
        busy = self._planning.get(session_id)
        if busy is not None:
            return {"scheduled": False, "reason": f"refinement {busy} is already being planned"}
        row = RefinementRow(
            id=new_refinement_id(),
            session_id=session_id,
            owner=owner_of(scope, target.root_id),
            scope=scope,
            trigger=trigger,
            instructions=instructions,
        )
        # Claimed before the first await, so a second request cannot slip in meanwhile.
        self._planning[session_id] = row.id
        self._with_rows.add(session_id)
        try:
            await self._store.transaction(lambda con: insert_refinement(con, row))
        except BaseException:
            self._planning.pop(session_id, None)
            raise
        self._progress_of(session_id).in_flight = row.id
        task = asyncio.get_running_loop().create_task(
            self._plan(target, row), name=f"refine-plan-{row.id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return {"scheduled": True, "id": row.id}

    async def wait_planning(self) -> None:
        """Wait until every plan being made now is stored (planned or failed) and, for an
        idle session, applied. Errors stay with the task (logged by ``_task_done``)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s failed", task.get_name(), exc_info=exc)

    async def _plan(self, target: RefineTarget, row: RefinementRow) -> None:
        session_id = target.session_id
        progress = self._progress_of(session_id)
        try:
            planned = await self._make_plan(target, row)
        except PlanFailed as exc:
            error = str(exc)
            failed = await self._store.transaction(
                lambda con: update_refinement(
                    con, row.id, status="failed", error=error, planned_at=utcnow()
                )
            )
            progress.last = failed
            log.info("refinement %s failed (%s): %s", row.id, exc.reason, exc)
            await target.record(
                "notice", NoticePayload(text=f"refinement {row.id} failed: {exc}; nothing changed")
            )
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug or a store outage: the row must not stay "planning" (it would look
            # in flight forever); the exception is still logged by _task_done.
            internal = f"internal error: {exc}"
            with contextlib.suppress(PrimeAgentError):
                await self._store.transaction(
                    lambda con: update_refinement(con, row.id, status="failed", error=internal)
                )
            raise
        finally:
            if self._planning.get(session_id) == row.id:
                del self._planning[session_id]
            if progress.in_flight == row.id:
                progress.in_flight = None
        progress.pending.append(planned.id)
        log.info("refinement %s planned: %d edits", planned.id, len(planned.edits))
        if not target.busy():
            await self.at_boundary(target)

    async def _make_plan(self, target: RefineTarget, row: RefinementRow) -> RefinementRow:
        evidence = await self._store.read(lambda con: _read_evidence(con, row, target.root_id))
        messages = build_messages(
            state=evidence.state,
            history=evidence.history,
            conversation=serialize_conversation(
                evidence.conversation, max_chars=CONVERSATION_MAX_CHARS
            ),
            scope=check_scope(row.scope),
            instructions=row.instructions,
        )
        try:
            reply = await target.complete(messages)
        except ModelError as exc:
            raise PlanFailed("model_failed", f"the planning call failed: {exc}") from exc
        reply.usage.purpose = USAGE_PURPOSE  # kept out of the measured outcome's windows
        await target.record("usage", reply.usage)
        plan = parse_plan(reply.text, finish_reason=reply.finish_reason)
        return await self._store.transaction(lambda con: _store_plan(con, row, plan))

    # -- phase 2 -----------------------------------------------------------------------------

    async def at_boundary(self, target: RefineTarget) -> list[RefinementRow]:
        """Apply the session's planned refinements (oldest first), then write the outcomes
        that became due. Returns the rows it changed: applied ones, then measured ones."""
        session_id = target.session_id
        progress = self._progress_of(session_id)
        changed: list[RefinementRow] = []
        async with self._apply_lock:
            # Most boundaries of most sessions have nothing planned and nothing to measure: a
            # session that never had a refinement row costs no read at all, the others one.
            if not await self._with_rows.may_have(session_id):
                return changed
            planned, stale, due = await self._store.read_side(
                lambda con: (
                    _ids_with_status(con, session_id, "planned"),
                    _ids_with_status(con, session_id, "planning"),
                    due_refinement_ids(con, session_id),
                )
            )
            await self._fail_stale(session_id, stale)
            for refinement_id in planned:
                row = await self._store.transaction(partial(_apply, refinement_id=refinement_id))
                if refinement_id in progress.pending:
                    progress.pending.remove(refinement_id)
                if row is None:
                    continue
                changed.append(row)
                progress.last = row
                applied, _ = _counts(row)
                if applied:
                    target.harness_changed()
                line = apply_line(row)
                log.info("%s", line)
                await target.record("notice", NoticePayload(text=line))
            measured: list[RefinementRow] = []
            if planned or due:  # else no applied refinement awaits its outcome
                measured = await self._store.transaction(
                    lambda con: _measure_due(con, session_id, self._outcome_turns)
                )
        for row in measured:
            log.info("refinement %s outcome: %s", row.id, outcome_line(row))
        return changed + measured

    async def _fail_stale(self, session_id: str, stale: Sequence[str]) -> None:
        """Rows left ``planning`` by an earlier daemon (this one plans none of them)."""
        mine = self._planning.get(session_id)
        for refinement_id in stale:
            if refinement_id == mine:
                continue
            await self._store.transaction(partial(_interrupted, refinement_id=refinement_id))

    # -- rollback, status, close -------------------------------------------------------------

    async def rollback(
        self, refinement_id: str, *, session_id: str | None, source: Source
    ) -> RefinementRow:
        """Undo an applied refinement; the rollback is a new applied refinement row.
        ``HarnessNotFound`` for an unknown id, ``HarnessInvalid`` when it was not applied.
        The caller tells the sessions that see the owner's harness to rebuild their prompt."""
        async with self._apply_lock:
            row = await self._store.transaction(
                lambda con: _rollback(con, refinement_id, session_id, source)
            )
            # Its session is known only now; boundaries read under the same lock, so none
            # can miss the row between the commit and this add.
            self._with_rows.add(row.session_id)
        self._progress_of(row.session_id).last = row
        log.info("%s", apply_line(row))
        return row

    def status(self, session_id: str) -> dict[str, Any]:
        progress = self._progress.get(session_id) or _Progress()
        last = progress.last
        summary = None
        if last is not None:
            applied, rejected = _counts(last)
            summary = {
                "id": last.id,
                "status": last.status,
                "summary": last.summary,
                "error": last.error,
                "applied": applied if last.status == "applied" else 0,
                "rejected": rejected if last.status == "applied" else 0,
            }
        return {"pending": list(progress.pending), "in_flight": progress.in_flight, "last": summary}

    async def close(self) -> None:
        """Cancel the plans being made (daemon stop); their rows become ``failed``."""
        self._closed = True
        interrupted = dict(self._planning)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for refinement_id in interrupted.values():
            with contextlib.suppress(StoreError, HarnessNotFound):
                await self._store.transaction(partial(_interrupted, refinement_id=refinement_id))
        self._planning.clear()

    def _progress_of(self, session_id: str) -> _Progress:
        return self._progress.setdefault(session_id, _Progress())


def _interrupted(con: duckdb.DuckDBPyConnection, refinement_id: str) -> RefinementRow | None:
    """Fail a refinement whose planning stopped; one that got further (a cancel can land
    after its plan committed) is left as it is."""
    row = select_refinement(con, refinement_id)
    if row is None or row.status != "planning":
        return row
    return update_refinement(con, refinement_id, status="failed", error=INTERRUPTED)


def _ids_with_status(con: duckdb.DuckDBPyConnection, session_id: str, status: str) -> list[str]:
    return [str(r[0]) for r in con.execute(_BY_STATUS, [session_id, status]).fetchall()]
