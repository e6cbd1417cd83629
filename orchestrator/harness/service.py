"""Host requests ``harness.*`` and ``refine.*`` from kernels (docs/spec.md §3, §6; docs/harness.md).

The kernel's ``rlm.harness`` and ``refine`` (``orchestrator/runtime/harness.py``, ``refine.py``)
are thin: every check that matters happens here and in ``orchestrator/store/harness.py``.

- **Who writes.** The caller is the session whose NATS subject the request came on (R18),
  never a payload field. ``local`` entries belong to the caller's session tree, so their owner
  is the caller's *root* id: a child reads and writes its root's entries, and no session can
  name another tree's. ``global`` entries are owned by ``GLOBAL_OWNER``.
- **Global writes are proposals** (issue 15). A kernel's write stays in its tree: a create,
  update or delete of a global entry is stored as a proposal (``harness/proposals.py``) that
  reaches no prompt until the user accepts it. The answer is the version accepting it would
  write, with ``proposal`` (its id) and ``proposal_status`` (``pending``). A kernel cannot
  roll back a global refinement either (that is a global write): the user can.
- **No lost update.** A write is one ``Store.transaction`` that reads the head, compares the
  version the kernel read (``version``) and appends the new version; a stale version is
  refused with code ``conflict`` and nothing is written (R20). The store layer validates the
  entry before the first statement; its ``HarnessError`` codes pass to the kernel unchanged.
- **Bounded answers.** ``list`` and ``history`` cap entries per kind (and versions) and the
  reply's size, saying ``more`` when they cut: a reply must fit a NATS message.
- **Prompt rebuild.** After a committed write the orchestrator is told
  (``harness_changed(owner)``) so the sessions concerned rebuild their harness section at the
  next turn boundary. The write is already committed then: a failure there is logged, not
  reported as a failed write (the kernel would retry and get a conflict).
- **refine.** ``refine.*`` go to ``orch.refiner`` (``orchestrator/harness/refine.py``) with the
  caller as a ``RefineTarget`` (``orch.session_target(live)``); without a refiner the requests
  are answered ``unknown_request``.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import duckdb
from pydantic import Field

from orchestrator.api.protocol import REFINE_INSTRUCTIONS_MAX_CHARS
from orchestrator.bus.request_args import RequestArgs, parse_args
from orchestrator.bus.router import HostRequestError
from orchestrator.errors import HarnessError
from orchestrator.harness.proposals import propose
from orchestrator.store import harness as harness_store
from orchestrator.store import refinements as refinement_store
from orchestrator.store.db import Store
from orchestrator.store.harness_entry import (
    GLOBAL_OWNER,
    SCOPES,
    Action,
    EntryWrite,
    HarnessEntry,
    Kind,
    Scope,
    check_entry_id,
    slugify,
)

__all__ = [
    "HARNESS_HISTORY_MAX_VERSIONS",
    "HARNESS_LIST_MAX_PER_KIND",
    "HARNESS_REPLY_MAX_BYTES",
    "HarnessCaller",
    "HarnessHost",
    "HarnessService",
]

# Entries of one kind per owner in a harness.list answer (more: ask for one kind or scope).
HARNESS_LIST_MAX_PER_KIND: Final = 50
# Versions in a harness.history answer: the newest ones, oldest first.
HARNESS_HISTORY_MAX_VERSIONS: Final = 50
# All entries of one answer together, as JSON (a NATS message holds 1 MiB by default).
HARNESS_REPLY_MAX_BYTES: Final = 256 * 1024
# The source of every write made through these requests (the CLI writes "user", refine "refine").
AGENT_SOURCE: Final = "agent"
# The reason recorded when the kernel gives none.
NO_REASON: Final = ""
REFINE_TRIGGER: Final = "agent"
SCOPE_SEPARATOR: Final = ":"
REFINE_DISABLED: Final = "refine is not enabled here"
REFINEMENT_ID_MAX_CHARS: Final = 200  # a refinement id is "r-" and an event id; this is slack

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]

log = logging.getLogger(__name__)


# -- request shapes ------------------------------------------------------------------------------


class _Target(RequestArgs):
    kind: Kind
    id: str
    scope: Scope | None = None


class CreateArgs(RequestArgs):
    kind: Kind
    title: str
    content: str
    id: str | None = None
    path: str | None = None
    reference: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    scope: Scope | None = None
    reason: str | None = None


class UpdateArgs(_Target):
    title: str | None = None
    content: str | None = None
    path: str | None = None
    reference: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    version: int | None = Field(default=None, ge=1)
    reason: str | None = None


class DeleteArgs(_Target):
    version: int | None = Field(default=None, ge=1)
    reason: str | None = None


class ListArgs(RequestArgs):
    kind: Kind | None = None
    scope: Scope | None = None


class RefineRunArgs(RequestArgs):
    instructions: str | None = Field(default=None, max_length=REFINE_INSTRUCTIONS_MAX_CHARS)
    scope: Scope | None = None


class RollbackArgs(RequestArgs):
    id: str = Field(min_length=1, max_length=REFINEMENT_ID_MAX_CHARS)


class _NoArgs(RequestArgs):
    pass


def _refused(exc: HarnessError) -> HostRequestError:
    return HostRequestError(exc.code, str(exc))


def _entry_write(a: CreateArgs | UpdateArgs, entry_id: str) -> EntryWrite:
    """The write a create or update asks for (on update, None fields keep their value)."""
    return EntryWrite(
        kind=a.kind,
        id=entry_id,
        title=a.title,
        content=a.content,
        path=a.path,
        reference=a.reference,
        arguments=a.arguments,
        metadata=a.metadata,
    )


def _split_id(value: str, scope: Scope | None) -> tuple[str, Scope | None]:
    """(id, scope) of ``id`` / ``local:id`` / ``global:id``; a scope given twice must agree."""
    prefix, sep, rest = value.partition(SCOPE_SEPARATOR)
    named: Scope | None = None
    if sep:
        for candidate in SCOPES:
            if prefix == candidate:
                named, value = candidate, rest
    if named is not None and scope is not None and named != scope:
        raise HostRequestError(
            "invalid_argument", f"the id says scope {named!r} but scope is {scope!r}"
        )
    try:
        return check_entry_id(value), named or scope
    except HarnessError as exc:
        raise _refused(exc) from None


def _bounded(
    entries: list[HarnessEntry], *, newest_last: bool
) -> tuple[list[dict[str, Any]], bool]:
    """Wire entries within ``HARNESS_REPLY_MAX_BYTES`` (at least one); ``newest_last``: keep
    the end of the list rather than its start."""
    ordered = entries[::-1] if newest_last else entries
    out: list[dict[str, Any]] = []
    used = 0
    for entry in ordered:
        wire = entry.to_wire()
        # ensure_ascii (as the reply is encoded) makes the length an upper bound of its bytes
        used += len(json.dumps(wire))
        if out and used > HARNESS_REPLY_MAX_BYTES:
            break
        out.append(wire)
    cut = len(out) < len(entries)
    return (out[::-1] if newest_last else out), cut


def _first_per_group(entries: list[HarnessEntry], limit: int) -> tuple[list[HarnessEntry], bool]:
    """At most ``limit`` entries per (owner, kind), keeping the order; and whether any were cut."""
    seen: dict[tuple[str, str], int] = {}
    kept: list[HarnessEntry] = []
    for entry in entries:
        key = (entry.owner, entry.kind)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= limit:
            kept.append(entry)
    return kept, len(kept) < len(entries)


# -- what the service needs of the orchestrator -------------------------------------------------


class _CallerRecord(Protocol):
    @property
    def root_id(self) -> str: ...


class HarnessCaller(Protocol):
    """What the handlers read of the live session a request came from (a ``LiveSession``)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def record(self) -> _CallerRecord: ...


class HarnessHost(Protocol):
    """What the handlers need of the orchestrator: its live sessions by id and its store.

    ``harness_changed``, ``refiner`` and ``session_target`` are optional hooks, looked up when
    a request needs them: without a refiner (or a ``session_target``) ``refine.*`` is answered
    ``unknown_request``, without ``harness_changed`` no prompt is rebuilt.
    """

    @property
    def sessions(self) -> Mapping[str, HarnessCaller]: ...

    @property
    def store(self) -> Store: ...


# -- the service ---------------------------------------------------------------------------------


class HarnessService:
    """The ``harness.*`` and ``refine.*`` handlers over an ``Orchestrator``."""

    def __init__(self, orch: HarnessHost):
        self.orch = orch

    def handlers(self) -> dict[str, Handler]:
        return {
            "harness.create": self.create,
            "harness.update": self.update,
            "harness.delete": self.delete,
            "harness.list": self.list_entries,
            "harness.get": self.get,
            "harness.history": self.history,
            "refine.run": self.refine_run,
            "refine.status": self.refine_status,
            "refine.rollback": self.refine_rollback,
        }

    # -- helpers ----------------------------------------------------------------------------

    def _live(self, session_id: str) -> HarnessCaller:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted":
            raise HostRequestError("not_found", f"session {session_id} is not live here")
        return live

    def _root(self, session_id: str) -> str:
        return self._live(session_id).record.root_id

    @staticmethod
    def _owners(root_id: str, scope: Scope | None) -> list[str]:
        """Where to look: one scope's owner, or the tree's own entries before the global ones."""
        if scope is None:
            return [root_id, GLOBAL_OWNER]
        return [harness_store.owner_of(scope, root_id)]

    async def _write(
        self,
        caller: str,
        owner: str,
        action: Action,
        write: EntryWrite,
        *,
        expected_version: int | None,
        reason: str | None,
    ) -> dict[str, Any]:
        if owner == GLOBAL_OWNER:
            return await self._propose(
                caller, owner, action, write, expected_version=expected_version, reason=reason
            )

        def run(con: duckdb.DuckDBPyConnection) -> HarnessEntry:
            return harness_store.write_entry(
                con,
                owner=owner,
                action=action,
                write=write,
                expected_version=expected_version,
                source=AGENT_SOURCE,
                reason=reason if reason is not None else NO_REASON,
                session_id=caller,
            )

        try:
            entry = await self.orch.store.transaction(run)
        except HarnessError as exc:
            raise _refused(exc) from None
        await self._changed(owner)
        return entry.to_wire()

    async def _propose(
        self,
        caller: str,
        owner: str,
        action: Action,
        write: EntryWrite,
        *,
        expected_version: int | None,
        reason: str | None,
    ) -> dict[str, Any]:
        """A global write from a kernel: stored as a proposal; no prompt changes."""
        proposer = self._root(caller)
        try:
            row, preview = await self.orch.store.transaction(
                lambda con: propose(
                    con,
                    owner=owner,
                    proposer=proposer,
                    action=action,
                    write=write,
                    expected_version=expected_version,
                    source=AGENT_SOURCE,
                    reason=reason if reason is not None else NO_REASON,
                    session_id=caller,
                )
            )
        except HarnessError as exc:
            raise _refused(exc) from None
        log.info("session %s proposed %s %s (%s)", caller, action, row.target, row.id)
        return {**preview.to_wire(), "proposal": row.id, "proposal_status": row.status}

    async def _changed(self, owner: str) -> None:
        # ``harness_changed`` is the orchestrator's hook to rebuild prompts; an orchestrator
        # built without it (tests, tools) simply has nothing to rebuild.
        changed = getattr(self.orch, "harness_changed", None)
        if changed is None:
            return
        try:
            result = changed(owner)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("harness_changed(%s) failed after a committed write", owner)

    # -- writes -----------------------------------------------------------------------------

    async def create(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(CreateArgs, "harness.create", args)
        if a.id is None:
            try:
                entry_id, scope = slugify(a.title), a.scope
            except HarnessError as exc:
                raise _refused(exc) from None
        else:
            entry_id, scope = _split_id(a.id, a.scope)
        owner = harness_store.owner_of(scope or "local", root)
        return await self._write(
            caller,
            owner,
            "create",
            _entry_write(a, entry_id),
            expected_version=None,
            reason=a.reason,
        )

    async def update(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(UpdateArgs, "harness.update", args)
        entry_id, scope = _split_id(a.id, a.scope)
        owner = harness_store.owner_of(scope or "local", root)
        write = _entry_write(a, entry_id)
        return await self._write(
            caller, owner, "update", write, expected_version=a.version, reason=a.reason
        )

    async def delete(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(DeleteArgs, "harness.delete", args)
        entry_id, scope = _split_id(a.id, a.scope)
        owner = harness_store.owner_of(scope or "local", root)
        write = EntryWrite(kind=a.kind, id=entry_id)
        return await self._write(
            caller, owner, "delete", write, expected_version=a.version, reason=a.reason
        )

    # -- reads ------------------------------------------------------------------------------

    async def list_entries(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(ListArgs, "harness.list", args)
        owners = self._owners(root, a.scope)
        kind = a.kind
        found = await self.orch.store.read(
            lambda con: harness_store.select_entries(
                con, owners, kind, limit_per_kind=HARNESS_LIST_MAX_PER_KIND + 1
            )
        )
        kept, cut = _first_per_group(found, HARNESS_LIST_MAX_PER_KIND)
        entries, too_big = _bounded(kept, newest_last=False)
        return {"entries": entries, "more": cut or too_big}

    async def get(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(_Target, "harness.get", args)
        entry_id, scope = _split_id(a.id, a.scope)
        owners = self._owners(root, scope)
        kind = a.kind

        def read(con: duckdb.DuckDBPyConnection) -> HarnessEntry | None:
            for owner in owners:
                entry = harness_store.select_entry(con, owner, kind, entry_id)
                if entry is not None:
                    return entry
            return None

        entry = await self.orch.store.read(read)
        if entry is None:
            where = scope or "local or global"
            raise HostRequestError("not_found", f"no {kind} {entry_id!r} ({where})")
        return entry.to_wire()

    async def history(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(_Target, "harness.history", args)
        entry_id, scope = _split_id(a.id, a.scope)
        owners = self._owners(root, scope)
        kind = a.kind

        def read(con: duckdb.DuckDBPyConnection) -> list[HarnessEntry]:
            # The first owner that has the entry at all (a deleted one still has a history).
            for owner in owners:
                if harness_store.select_entry(con, owner, kind, entry_id, include_deleted=True):
                    return harness_store.select_versions(con, owner, kind, entry_id)
            return []

        versions = await self.orch.store.read(read)
        if not versions:
            where = scope or "local or global"
            raise HostRequestError("not_found", f"no {kind} {entry_id!r} ({where})")
        newest = versions[-HARNESS_HISTORY_MAX_VERSIONS:]
        entries, too_big = _bounded(newest, newest_last=True)
        return {"entries": entries, "more": len(newest) < len(versions) or too_big}

    # -- refine -----------------------------------------------------------------------------

    def _refiner(self) -> Any:
        refiner = getattr(self.orch, "refiner", None)
        if refiner is None:
            raise HostRequestError("unknown_request", REFINE_DISABLED)
        return refiner

    async def refine_run(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._live(caller)
        a = parse_args(RefineRunArgs, "refine.run", args)
        refiner = self._refiner()
        make_target = getattr(self.orch, "session_target", None)
        if make_target is None:
            raise HostRequestError("unknown_request", REFINE_DISABLED)
        instructions = a.instructions.strip() if a.instructions else None
        try:
            answer = await refiner.request(
                make_target(live),
                instructions=instructions or None,
                scope=a.scope or "local",
                trigger=REFINE_TRIGGER,
            )
        except HarnessError as exc:
            raise _refused(exc) from None
        return dict(answer)

    async def refine_status(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._live(caller)
        parse_args(_NoArgs, "refine.status", args)
        return dict(self._refiner().status(live.id))

    async def refine_rollback(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        root = self._root(caller)
        a = parse_args(RollbackArgs, "refine.rollback", args)
        refiner = self._refiner()
        row = await self.orch.store.read(lambda con: refinement_store.select_refinement(con, a.id))
        # Another tree's refinement is as invisible as a missing one.
        if row is None or row.owner not in (root, GLOBAL_OWNER):
            raise HostRequestError("not_found", f"no refinement {a.id!r} in this session tree")
        if row.owner == GLOBAL_OWNER:
            raise HostRequestError(
                "invalid_argument",
                f"refinement {a.id} changed the global harness: only the user rolls it back "
                f"(prime-agent refine rollback {a.id})",
            )
        try:
            done = await refiner.rollback(a.id, session_id=caller, source=AGENT_SOURCE)
        except HarnessError as exc:
            raise _refused(exc) from None
        # The rollback's edits are committed: the trees that see them rebuild their prompts.
        await self._changed(done.owner)
        wire: dict[str, Any] = done.to_wire()
        return wire
