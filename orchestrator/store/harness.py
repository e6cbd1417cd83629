"""The ``harness_versions`` and ``harness_entries`` tables: versioned harness entries.

Every write appends one version (a delete appends a tombstone) and replaces the entry's head
with a copy of it, so the audit log is complete and a rollback is just another version. A
writer says which version it edited (``expected_version``); when the head has moved since, the
write is refused with ``HarnessConflict`` instead of silently overwriting the other edit.
Validation happens before the first statement, so a refused write leaves nothing (R20).

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread. ``write_entry`` and ``restore_entry`` read the head, insert a version and upsert the
head: they must run inside one ``Store.transaction`` so the three are atomic (the single writer
thread also makes the read-compare-write free of races). The readers run under ``Store.read``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb

from orchestrator.errors import HarnessConflict, HarnessInvalid, HarnessNotFound
from orchestrator.store.harness_entry import (
    GLOBAL_OWNER,
    KINDS,
    Action,
    EntryWrite,
    HarnessEntry,
    Kind,
    Scope,
    Source,
    check_action,
    check_content,
    check_entry_id,
    check_json_field,
    check_kind,
    check_path,
    check_reason,
    check_scope,
    check_skill_contract,
    check_source,
    check_title,
    default_path,
    scope_of_owner,
)
from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow

__all__ = [
    "count_entries",
    "owner_of",
    "plan_write",
    "restore_entry",
    "select_entries",
    "select_entry",
    "select_log",
    "select_versions",
    "write_entry",
]

_FIELDS = (
    "owner, scope, kind, entry_id, version, title, content, path, reference, arguments, "
    "metadata, deleted, source, reason, session_id, refinement_id"
)
_HEAD_COLUMNS = f"{_FIELDS}, created_at, updated_at"
# A version row read as an entry: its own time is updated_at, version 1's is created_at.
_VERSION_SELECT = (
    f"SELECT {_FIELDS}, MIN(created_at) OVER (PARTITION BY owner, kind, entry_id) AS first_at, "
    "created_at, rowid AS seq FROM harness_versions"
)


def owner_of(scope: Scope, root_id: str) -> str:
    """The owner of a scope's entries for a session tree rooted at ``root_id``."""
    return GLOBAL_OWNER if check_scope(scope) == "global" else root_id


# -- reading -------------------------------------------------------------------------------------


def _entry(values: Sequence[Any]) -> HarnessEntry:
    (
        owner,
        scope,
        kind,
        entry_id,
        version,
        title,
        content,
        path,
        reference,
        arguments,
        metadata,
        deleted,
        source,
        reason,
        session_id,
        refinement_id,
        created_at,
        updated_at,
    ) = values[:18]
    return HarnessEntry(
        owner=owner,
        scope=scope,
        kind=kind,
        id=entry_id,
        version=version,
        title=title,
        content=content,
        path=path,
        reference=json.loads(reference),
        arguments=json.loads(arguments),
        metadata=json.loads(metadata),
        deleted=deleted,
        source=source,
        reason=reason,
        session_id=session_id,
        refinement_id=refinement_id,
        created_at=from_db_ts(created_at),
        updated_at=from_db_ts(updated_at),
    )


def select_entry(
    con: duckdb.DuckDBPyConnection,
    owner: str,
    kind: str,
    entry_id: str,
    *,
    include_deleted: bool = False,
) -> HarnessEntry | None:
    """The entry's head; None when absent, or deleted unless ``include_deleted``."""
    row = con.execute(
        f"SELECT {_HEAD_COLUMNS} FROM harness_entries "
        "WHERE owner = $1 AND kind = $2 AND entry_id = $3",
        [owner, kind, entry_id],
    ).fetchone()
    if row is None:
        return None
    entry = _entry(row)
    return entry if include_deleted or not entry.deleted else None


def _unique(owners: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(owners))


def select_entries(
    con: duckdb.DuckDBPyConnection,
    owners: Sequence[str],
    kind: str | None = None,
    *,
    limit_per_kind: int | None = None,
) -> list[HarnessEntry]:
    """Live heads of ``owners`` (in the order given), per kind (``KINDS`` order) newest first.

    With ``limit_per_kind`` at most that many of each kind for each owner.
    """
    if limit_per_kind is not None and limit_per_kind < 0:
        raise ValueError(f"limit_per_kind must be >= 0, got {limit_per_kind}")
    owner_list = _unique(owners)
    kinds = [check_kind(kind)] if kind is not None else list(KINDS)
    if not owner_list or limit_per_kind == 0:
        return []
    rank_limit = "" if limit_per_kind is None else f"QUALIFY rn <= {int(limit_per_kind)}"
    rows = con.execute(
        f"SELECT {_HEAD_COLUMNS}, ROW_NUMBER() OVER (PARTITION BY owner, kind "
        "ORDER BY updated_at DESC, entry_id) AS rn FROM harness_entries "
        "WHERE NOT deleted AND list_contains($1::VARCHAR[], owner) "
        f"AND list_contains($2::VARCHAR[], kind) {rank_limit} "
        "ORDER BY list_position($1::VARCHAR[], owner), list_position($2::VARCHAR[], kind), "
        "updated_at DESC, entry_id",
        [owner_list, kinds],
    ).fetchall()
    return [_entry(row) for row in rows]


def count_entries(con: duckdb.DuckDBPyConnection, owners: Sequence[str]) -> dict[str, int]:
    """Live entries of ``owners`` per kind (the prompt says how many it did not show)."""
    rows = con.execute(
        "SELECT kind, count(*) FROM harness_entries "
        "WHERE NOT deleted AND list_contains($1::VARCHAR[], owner) GROUP BY kind",
        [_unique(owners)],
    ).fetchall()
    return {str(kind): int(count) for kind, count in rows}


def _version_entry(values: Sequence[Any]) -> HarnessEntry:
    # _VERSION_SELECT's columns: the fields, first_at (created_at), created_at (updated_at), seq.
    return _entry(values[:18])


def select_versions(
    con: duckdb.DuckDBPyConnection, owner: str, kind: str, entry_id: str
) -> list[HarnessEntry]:
    """Every version of the entry, tombstones included, oldest first."""
    rows = con.execute(
        f"SELECT * FROM ({_VERSION_SELECT} WHERE owner = $1 AND kind = $2 AND entry_id = $3) "
        "ORDER BY version",
        [owner, kind, entry_id],
    ).fetchall()
    return [_version_entry(row) for row in rows]


def select_log(
    con: duckdb.DuckDBPyConnection, owners: Sequence[str] | None, *, limit: int
) -> list[HarnessEntry]:
    """The audit log: the newest ``limit`` versions of ``owners``' entries (all when None)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    # rowid breaks ties between versions written in the same microsecond: the table is
    # append-only, so it follows the order of the inserts.
    if owners is None:
        query = f"SELECT * FROM ({_VERSION_SELECT}) ORDER BY created_at DESC, seq DESC LIMIT $1"
        params: list[Any] = [limit]
    else:
        query = (
            f"SELECT * FROM ({_VERSION_SELECT} WHERE list_contains($2::VARCHAR[], owner)) "
            "ORDER BY created_at DESC, seq DESC LIMIT $1"
        )
        params = [limit, _unique(owners)]
    return [_version_entry(row) for row in con.execute(query, params).fetchall()]


# -- writing -------------------------------------------------------------------------------------


def _check_expected(
    head: HarnessEntry | None, expected_version: int | None, owner: str, kind: str, entry_id: str
) -> None:
    if expected_version is None:
        return
    current = head.version if head is not None else None
    if current != expected_version:
        have = f"version {current}" if current is not None else "no version"
        raise HarnessConflict(
            f"{kind} {entry_id!r} ({owner}) changed: expected version {expected_version}, "
            f"the store has {have}",
            current_version=current,
        )


def _put(con: duckdb.DuckDBPyConnection, entry: HarnessEntry) -> HarnessEntry:
    """Append ``entry`` as a version and make it the head."""
    values = [
        entry.owner,
        entry.scope,
        entry.kind,
        entry.id,
        entry.version,
        entry.title,
        entry.content,
        entry.path,
        json.dumps(entry.reference, ensure_ascii=False),
        json.dumps(entry.arguments, ensure_ascii=False),
        json.dumps(entry.metadata, ensure_ascii=False),
        entry.deleted,
        entry.source,
        entry.reason,
        entry.session_id,
        entry.refinement_id,
    ]
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    con.execute(
        f"INSERT INTO harness_versions ({_FIELDS}, created_at) "
        f"VALUES ({placeholders}, ${len(values) + 1})",
        [*values, to_db_ts(entry.updated_at)],
    )
    con.execute(
        f"INSERT OR REPLACE INTO harness_entries ({_HEAD_COLUMNS}) "
        f"VALUES ({placeholders}, ${len(values) + 1}, ${len(values) + 2})",
        [*values, to_db_ts(entry.created_at), to_db_ts(entry.updated_at)],
    )
    return entry


def _now_after(head: HarnessEntry | None) -> datetime:
    """The time of a new version: never before the head's, even if the clock stepped back."""
    now = utcnow()
    return now if head is None or now >= head.updated_at else head.updated_at


def _check_write_fields(action: Action, write: EntryWrite) -> None:
    if action == "create":
        if write.title is None or write.content is None:
            raise HarnessInvalid(f"creating a {write.kind} needs a title and content")
        if write.kind == "skill":
            check_skill_contract(write.reference, write.arguments)
    if action == "delete":
        return
    if write.title is not None:
        check_title(write.title)
    if write.content is not None:
        check_content(write.content)
    if write.path is not None:
        check_path(write.path)
    for name, value in (
        ("reference", write.reference),
        ("arguments", write.arguments),
        ("metadata", write.metadata),
    ):
        if value is not None:
            check_json_field(name, value)


def plan_write(
    con: duckdb.DuckDBPyConnection,
    *,
    owner: str,
    action: Action,
    write: EntryWrite,
    expected_version: int | None,
    source: Source,
    reason: str,
    session_id: str | None,
    refinement_id: str | None = None,
) -> HarnessEntry:
    """The version ``write_entry`` would write, checked against the head; writes nothing.

    create: ``HarnessConflict`` if a live head exists (a tombstone is revived as its next
    version). update / delete: ``HarnessNotFound`` without a live head. All three: with
    ``expected_version`` given, ``HarnessConflict`` unless it is the head's version. A
    proposal (``orchestrator/harness/proposals.py``) is checked with this, so a write that
    would be refused is refused when it is proposed, not only when it is accepted.
    """
    action = check_action(action)
    kind = check_kind(write.kind)
    entry_id = check_entry_id(write.id)
    source = check_source(source)
    reason = check_reason(reason)
    _check_write_fields(action, write)
    head = select_entry(con, owner, kind, entry_id, include_deleted=True)
    live = head if head is not None and not head.deleted else None
    if action == "create":
        if live is not None:
            raise HarnessConflict(
                f"{kind} {entry_id!r} already exists (version {live.version})",
                current_version=live.version,
            )
        _check_expected(head, expected_version, owner, kind, entry_id)
        assert write.title is not None and write.content is not None  # _check_write_fields
        now = _now_after(head)
        return HarnessEntry(
            owner=owner,
            scope=scope_of_owner(owner),
            kind=kind,
            id=entry_id,
            version=head.version + 1 if head is not None else 1,
            title=write.title,
            content=write.content,
            path=write.path if write.path is not None else default_path(kind),
            reference=write.reference if write.reference is not None else {},
            arguments=write.arguments if write.arguments is not None else {},
            metadata=write.metadata if write.metadata is not None else {},
            deleted=False,
            source=source,
            reason=reason,
            session_id=session_id,
            refinement_id=refinement_id,
            created_at=head.created_at if head is not None else now,
            updated_at=now,
        )
    if live is None:
        raise HarnessNotFound(f"no {kind} {entry_id!r} to {action}")
    _check_expected(live, expected_version, owner, kind, entry_id)
    reference = write.reference if write.reference is not None else live.reference
    arguments = write.arguments if write.arguments is not None else live.arguments
    if (
        action == "update"
        and kind == "skill"
        and (write.reference is not None or write.arguments is not None)
    ):
        check_skill_contract(reference, arguments)
    updated = action == "update"
    return HarnessEntry(
        owner=owner,
        scope=live.scope,
        kind=kind,
        id=entry_id,
        version=live.version + 1,
        title=write.title if updated and write.title is not None else live.title,
        content=write.content if updated and write.content is not None else live.content,
        path=write.path if updated and write.path is not None else live.path,
        reference=reference if updated else live.reference,
        arguments=arguments if updated else live.arguments,
        metadata=write.metadata if updated and write.metadata is not None else live.metadata,
        deleted=not updated,
        source=source,
        reason=reason,
        session_id=session_id,
        refinement_id=refinement_id,
        created_at=live.created_at,
        updated_at=_now_after(live),
    )


def write_entry(
    con: duckdb.DuckDBPyConnection,
    *,
    owner: str,
    action: Action,
    write: EntryWrite,
    expected_version: int | None,
    source: Source,
    reason: str,
    session_id: str | None,
    refinement_id: str | None = None,
) -> HarnessEntry:
    """Create, update or delete an entry; returns the version written (a tombstone for delete).
    The rules are ``plan_write``'s. Run inside ``Store.transaction``."""
    return _put(
        con,
        plan_write(
            con,
            owner=owner,
            action=action,
            write=write,
            expected_version=expected_version,
            source=source,
            reason=reason,
            session_id=session_id,
            refinement_id=refinement_id,
        ),
    )


def _check_restorable(to: HarnessEntry, owner: str, kind: str, entry_id: str) -> None:
    if (to.owner, to.kind, to.id) != (owner, kind, entry_id):
        raise HarnessInvalid(
            f"cannot restore {kind} {entry_id!r} ({owner}) from a version of "
            f"{to.kind} {to.id!r} ({to.owner})"
        )
    check_title(to.title)
    check_content(to.content)
    check_path(to.path)
    check_json_field("reference", to.reference)
    check_json_field("arguments", to.arguments)
    check_json_field("metadata", to.metadata)
    if kind == "skill" and not to.deleted:
        check_skill_contract(to.reference, to.arguments)


def restore_entry(
    con: duckdb.DuckDBPyConnection,
    *,
    owner: str,
    kind: str,
    entry_id: str,
    to: HarnessEntry | None,
    expected_version: int | None,
    source: Source,
    reason: str,
    session_id: str | None,
    refinement_id: str | None,
) -> HarnessEntry:
    """Roll the entry back: a new version whose fields equal ``to``'s, or a tombstone of the
    head when ``to`` is None (the entry did not exist). Same conflict rule as ``write_entry``;
    ``HarnessNotFound`` when there is nothing to make absent. Run inside ``Store.transaction``.
    """
    checked_kind: Kind = check_kind(kind)
    entry_id = check_entry_id(entry_id)
    source = check_source(source)
    reason = check_reason(reason)
    if to is not None:
        _check_restorable(to, owner, checked_kind, entry_id)
    head = select_entry(con, owner, checked_kind, entry_id, include_deleted=True)
    _check_expected(head, expected_version, owner, checked_kind, entry_id)
    now = _now_after(head)
    base = to if to is not None else head
    if base is None:
        raise HarnessNotFound(f"no {checked_kind} {entry_id!r} to restore")
    return _put(
        con,
        HarnessEntry(
            owner=owner,
            scope=scope_of_owner(owner),
            kind=checked_kind,
            id=entry_id,
            version=head.version + 1 if head is not None else 1,
            title=base.title,
            content=base.content,
            path=base.path,
            reference=base.reference,
            arguments=base.arguments,
            metadata=base.metadata,
            deleted=to is None or to.deleted,
            source=source,
            reason=reason,
            session_id=session_id,
            refinement_id=refinement_id,
            created_at=head.created_at if head is not None else now,
            updated_at=now,
        ),
    )
