"""Harness entries and refinements in a real DuckDB file (docs/harness.md, R20)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import HarnessConflict, HarnessInvalid, HarnessNotFound
from orchestrator.store import harness as hs
from orchestrator.store import refinements as rs
from orchestrator.store.db import Store
from orchestrator.store.harness_entry import (
    BASE_PROMPT_ID,
    CONTENT_MAX_CHARS,
    ENTRY_ID_MAX_CHARS,
    GLOBAL_OWNER,
    JSON_FIELD_MAX_BYTES,
    REASON_MAX_CHARS,
    TITLE_MAX_CHARS,
    Action,
    EntryWrite,
    HarnessEntry,
    check_entry_id,
    check_kind,
    check_skill_contract,
    slugify,
)

ROOT_A = "s-aaaaaaaaaaaa"
ROOT_B = "s-bbbbbbbbbbbb"
SKILL_REFERENCE = {"type": "python", "import": "skills.grep_tools", "callable": "find_all"}
SKILL_ARGUMENTS: dict[str, Any] = {"pattern": "regular expression", "path": {"type": "string"}}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "state" / "prime-agent.duckdb") as opened:
        yield opened


async def write(
    store: Store,
    action: Action,
    entry: EntryWrite,
    *,
    owner: str = ROOT_A,
    expected_version: int | None = None,
    reason: str = "test",
) -> HarnessEntry:
    return await store.transaction(
        lambda con: hs.write_entry(
            con,
            owner=owner,
            action=action,
            write=entry,
            expected_version=expected_version,
            source="agent",
            reason=reason,
            session_id=ROOT_A,
        )
    )


async def create(
    store: Store, kind: str, entry_id: str, *, owner: str = ROOT_A, **fields: Any
) -> HarnessEntry:
    fields.setdefault("title", entry_id.replace("_", " "))
    fields.setdefault("content", f"content of {entry_id}")
    return await write(
        store, "create", EntryWrite(check_kind(kind), entry_id, **fields), owner=owner
    )


async def versions(
    store: Store, kind: str, entry_id: str, owner: str = ROOT_A
) -> list[HarnessEntry]:
    return await store.read(lambda con: hs.select_versions(con, owner, kind, entry_id))


async def head(store: Store, kind: str, entry_id: str, owner: str = ROOT_A) -> HarnessEntry | None:
    return await store.read(
        lambda con: hs.select_entry(con, owner, kind, entry_id, include_deleted=True)
    )


async def snapshot(store: Store) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every row of both harness tables, to prove a refused write left nothing."""

    def read(con: Any) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        heads = con.execute("SELECT * FROM harness_entries ORDER BY ALL").fetchall()
        rows = con.execute("SELECT * FROM harness_versions ORDER BY ALL").fetchall()
        return heads, rows

    return await store.read(read)


async def set_updated_at(store: Store, kind: str, entry_id: str, when: datetime) -> None:
    naive = when.astimezone(UTC).replace(tzinfo=None)
    await store.transaction(
        lambda con: con.execute(
            "UPDATE harness_entries SET updated_at = $1 WHERE kind = $2 AND entry_id = $3",
            [naive, kind, entry_id],
        )
    )


# -- harness_entry.py ------------------------------------------------------------------------------


def test_slugify_and_ids() -> None:
    assert slugify("  Run the Tests -- FIRST!  ") == "run_the_tests_first"
    assert slugify("x" * 79 + " y") == "x" * 79
    assert len(slugify("word " * 50)) <= ENTRY_ID_MAX_CHARS
    with pytest.raises(HarnessInvalid):
        slugify("  !!! ")
    assert check_entry_id("a_1") == "a_1"
    # "a_1\n": a trailing newline once slipped past a ^...$ pattern (now a full match).
    for bad in ("", "_a", "A", "a-b", "a_1\n", "a" * (ENTRY_ID_MAX_CHARS + 1), BASE_PROMPT_ID, 3):
        with pytest.raises(HarnessInvalid):
            check_entry_id(bad)


@pytest.mark.parametrize(
    ("reference", "arguments", "words"),
    [
        (None, SKILL_ARGUMENTS, "reference"),
        ({**SKILL_REFERENCE, "type": "shell"}, SKILL_ARGUMENTS, "type"),
        ({**SKILL_REFERENCE, "import": "skills..x"}, SKILL_ARGUMENTS, "dotted module"),
        ({**SKILL_REFERENCE, "callable": "find-all"}, SKILL_ARGUMENTS, "identifier"),
        ({**SKILL_REFERENCE, "extra": 1}, SKILL_ARGUMENTS, "unknown key"),
        (SKILL_REFERENCE, {}, "arguments"),
        (SKILL_REFERENCE, {"not valid": "x"}, "identifier"),
        (SKILL_REFERENCE, {"n": 3}, "string or an object"),
    ],
)
def test_skill_contract_is_checked(reference: Any, arguments: Any, words: str) -> None:
    with pytest.raises(HarnessInvalid, match=words) as info:
        check_skill_contract(reference, arguments)
    assert "\n" not in str(info.value)


def test_skill_contract_accepts_a_valid_one() -> None:
    check_skill_contract(SKILL_REFERENCE, SKILL_ARGUMENTS)


async def test_to_wire_is_json_with_utc_times(store: Store) -> None:
    entry = await create(
        store, "skill", "find", reference=SKILL_REFERENCE, arguments=SKILL_ARGUMENTS
    )
    wire = entry.to_wire()
    assert wire["id"] == "find" and wire["scope"] == "local" and wire["path"] == "general"
    assert wire["reference"] == SKILL_REFERENCE and wire["reference"] is not entry.reference
    assert datetime.fromisoformat(wire["created_at"]).utcoffset() == timedelta(0)
    stored = await head(store, "skill", "find")
    assert stored is not None and stored.to_wire() == wire


# -- versions and heads --------------------------------------------------------------------------


async def test_create_update_delete_revive(store: Store) -> None:
    first = await create(store, "prompt", "run_tests", title="Run tests", content="always")
    assert (first.version, first.path, first.deleted, first.owner) == (1, "policy", False, ROOT_A)

    second = await write(
        store,
        "update",
        EntryWrite("prompt", "run_tests", content="before finishing"),
        expected_version=1,
    )
    assert (second.version, second.title, second.content) == (2, "Run tests", "before finishing")
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at

    tomb = await write(store, "delete", EntryWrite("prompt", "run_tests"), expected_version=2)
    assert (tomb.version, tomb.deleted, tomb.content) == (3, True, "before finishing")
    assert await store.read(lambda con: hs.select_entry(con, ROOT_A, "prompt", "run_tests")) is None

    revived = await create(store, "prompt", "run_tests", title="Run tests", content="again")
    assert (revived.version, revived.deleted) == (4, False)
    assert revived.created_at == first.created_at

    history = await versions(store, "prompt", "run_tests")
    assert [(v.version, v.deleted, v.content) for v in history] == [
        (1, False, "always"),
        (2, False, "before finishing"),
        (3, True, "before finishing"),
        (4, False, "again"),
    ]
    assert all(v.created_at == first.created_at for v in history)
    assert history[-1] == await head(store, "prompt", "run_tests")


async def test_update_merges_and_checks_skill_contract(store: Store) -> None:
    await create(
        store,
        "skill",
        "find",
        reference=SKILL_REFERENCE,
        arguments=SKILL_ARGUMENTS,
        metadata={"tags": ["search"]},
    )
    updated = await write(store, "update", EntryWrite("skill", "find", path="tools"))
    assert updated.reference == SKILL_REFERENCE and updated.metadata == {"tags": ["search"]}
    assert updated.path == "tools"
    before = await snapshot(store)
    with pytest.raises(HarnessInvalid, match="arguments"):
        await write(store, "update", EntryWrite("skill", "find", arguments={}))
    assert await snapshot(store) == before


async def test_stale_expected_version_writes_nothing(store: Store) -> None:
    await create(store, "memory", "facts")
    await write(store, "update", EntryWrite("memory", "facts", content="v2"), expected_version=1)
    before = await snapshot(store)
    for action in ("update", "delete"):
        with pytest.raises(HarnessConflict) as info:
            await write(
                store, action, EntryWrite("memory", "facts", content="lost"), expected_version=1
            )
        assert info.value.current_version == 2 and info.value.code == "conflict"
    assert await snapshot(store) == before


async def test_create_of_a_live_entry_is_a_conflict(store: Store) -> None:
    await create(store, "memory", "facts")
    before = await snapshot(store)
    with pytest.raises(HarnessConflict) as info:
        await create(store, "memory", "facts")
    assert info.value.current_version == 1
    assert await snapshot(store) == before


async def test_missing_or_deleted_entries_are_not_found(store: Store) -> None:
    for action in ("update", "delete"):
        with pytest.raises(HarnessNotFound):
            await write(store, action, EntryWrite("memory", "nothing", content="x"))
    await create(store, "memory", "gone")
    await write(store, "delete", EntryWrite("memory", "gone"))
    before = await snapshot(store)
    actions: tuple[Action, ...] = ("update", "delete")
    for action in actions:
        with pytest.raises(HarnessNotFound) as info:
            await write(store, action, EntryWrite("memory", "gone", content="x"))
        assert info.value.code == "not_found"
    assert await snapshot(store) == before


@pytest.mark.parametrize(
    ("action", "entry", "reason"),
    [
        ("create", EntryWrite("memory", "x", title="t"), "r"),  # no content
        ("create", EntryWrite("memory", "x", title=" ", content="c"), "r"),
        ("create", EntryWrite("memory", BASE_PROMPT_ID, title="t", content="c"), "r"),
        ("create", EntryWrite("prompt", "Bad Id", title="t", content="c"), "r"),
        ("create", EntryWrite("tool", "x", title="t", content="c"), "r"),  # type: ignore[arg-type]
        ("create", EntryWrite("skill", "x", title="t", content="c"), "r"),  # no contract
        ("create", EntryWrite("memory", "x", title="t" * (TITLE_MAX_CHARS + 1), content="c"), "r"),
        (
            "create",
            EntryWrite("memory", "x", title="t", content="c" * (CONTENT_MAX_CHARS + 1)),
            "r",
        ),
        ("create", EntryWrite("memory", "x", title="t", content="c", path="a\nb"), "r"),
        (
            "create",
            EntryWrite(
                "memory", "x", title="t", content="c", metadata={"k": "v" * JSON_FIELD_MAX_BYTES}
            ),
            "r",
        ),
        ("create", EntryWrite("memory", "x", title="t", content="c", metadata={"k": {1, 2}}), "r"),
        ("create", EntryWrite("memory", "x", title="t", content="c"), "r" * (REASON_MAX_CHARS + 1)),
        ("update", EntryWrite("memory", "live", content=""), "r"),
        ("replace", EntryWrite("memory", "live", content="c"), "r"),
    ],
)
async def test_invalid_writes_write_nothing(
    store: Store, action: Action, entry: EntryWrite, reason: str
) -> None:
    await create(store, "memory", "live")
    before = await snapshot(store)
    with pytest.raises(HarnessInvalid) as info:
        await write(store, action, entry, reason=reason)
    assert info.value.code == "invalid_argument"
    assert await snapshot(store) == before


# -- restore -------------------------------------------------------------------------------------


async def restore(
    store: Store, kind: str, entry_id: str, to: HarnessEntry | None, expected: int | None
) -> HarnessEntry:
    return await store.transaction(
        lambda con: hs.restore_entry(
            con,
            owner=ROOT_A,
            kind=kind,
            entry_id=entry_id,
            to=to,
            expected_version=expected,
            source="refine",
            reason="rollback",
            session_id=ROOT_A,
            refinement_id="r-test",
        )
    )


async def test_restore_to_an_earlier_version_and_to_absent(store: Store) -> None:
    v1 = await create(store, "memory", "facts", content="one", metadata={"n": 1})
    await write(store, "update", EntryWrite("memory", "facts", content="two", metadata={"n": 2}))
    back = await restore(store, "memory", "facts", v1, 2)
    assert (back.version, back.content, back.metadata, back.deleted) == (3, "one", {"n": 1}, False)
    assert (back.source, back.refinement_id, back.created_at) == ("refine", "r-test", v1.created_at)

    gone = await restore(store, "memory", "facts", None, 3)
    assert (gone.version, gone.deleted, gone.content) == (4, True, "one")
    assert await store.read(lambda con: hs.select_entry(con, ROOT_A, "memory", "facts")) is None

    before = await snapshot(store)
    with pytest.raises(HarnessConflict) as info:
        await restore(store, "memory", "facts", v1, 3)
    assert info.value.current_version == 4
    with pytest.raises(HarnessNotFound):
        await restore(store, "memory", "never", None, None)
    with pytest.raises(HarnessInvalid):
        await restore(store, "memory", "other", v1, None)
    assert await snapshot(store) == before


# -- listing -------------------------------------------------------------------------------------


async def test_select_entries_orders_and_limits_per_kind(store: Store) -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    for i, entry_id in enumerate(("m_old", "m_mid", "m_new")):
        await create(store, "memory", entry_id)
        await set_updated_at(store, "memory", entry_id, start + timedelta(minutes=i))
    await create(store, "prompt", "p_a")
    await create(store, "prompt", "p_b")
    for entry_id in ("p_a", "p_b"):
        await set_updated_at(store, "prompt", entry_id, start)  # a tie: by id
    await create(store, "memory", "m_dead")
    await write(store, "delete", EntryWrite("memory", "m_dead"))
    await create(store, "memory", "g_one", owner=GLOBAL_OWNER)

    def ids(entries: list[HarnessEntry]) -> list[tuple[str, str]]:
        return [(e.owner, e.id) for e in entries]

    everything = await store.read(lambda con: hs.select_entries(con, [GLOBAL_OWNER, ROOT_A]))
    assert ids(everything) == [
        (GLOBAL_OWNER, "g_one"),
        (ROOT_A, "p_a"),
        (ROOT_A, "p_b"),
        (ROOT_A, "m_new"),
        (ROOT_A, "m_mid"),
        (ROOT_A, "m_old"),
    ]
    limited = await store.read(
        lambda con: hs.select_entries(con, [ROOT_A, GLOBAL_OWNER], limit_per_kind=1)
    )
    assert ids(limited) == [(ROOT_A, "p_a"), (ROOT_A, "m_new"), (GLOBAL_OWNER, "g_one")]
    memories = await store.read(lambda con: hs.select_entries(con, [ROOT_A], "memory"))
    assert [e.id for e in memories] == ["m_new", "m_mid", "m_old"]


async def test_one_roots_local_entries_are_invisible_to_another(store: Store) -> None:
    await create(store, "memory", "secret", owner=ROOT_A)
    await create(store, "memory", "secret", owner=ROOT_B, content="b's own")
    await create(store, "memory", "shared", owner=GLOBAL_OWNER)
    owners_b = [hs.owner_of("local", ROOT_B), hs.owner_of("global", ROOT_B)]
    seen = await store.read(lambda con: hs.select_entries(con, owners_b))
    assert [(e.owner, e.id, e.content) for e in seen] == [
        (ROOT_B, "secret", "b's own"),
        (GLOBAL_OWNER, "shared", "content of shared"),
    ]
    assert seen[1].scope == "global" and seen[0].scope == "local"
    log_b = await store.read(lambda con: hs.select_log(con, owners_b, limit=10))
    assert {e.owner for e in log_b} == {ROOT_B, GLOBAL_OWNER}


async def test_select_log_is_newest_first_across_entries(store: Store) -> None:
    await create(store, "memory", "a")
    await create(store, "prompt", "b")
    await write(store, "update", EntryWrite("memory", "a", content="a2"))
    await write(store, "delete", EntryWrite("prompt", "b"))
    await create(store, "memory", "other_root", owner=ROOT_B)
    log = await store.read(lambda con: hs.select_log(con, [ROOT_A], limit=10))
    assert [(e.id, e.version, e.deleted) for e in log] == [
        ("b", 2, True),
        ("a", 2, False),
        ("b", 1, False),
        ("a", 1, False),
    ]
    assert log[1].created_at == log[3].created_at and log[1].updated_at >= log[3].updated_at
    everyone = await store.read(lambda con: hs.select_log(con, None, limit=2))
    assert [(e.owner, e.id) for e in everyone] == [(ROOT_B, "other_root"), (ROOT_A, "b")]


# -- refinements ---------------------------------------------------------------------------------


async def test_refinements_round_trip(store: Store) -> None:
    first_id, second_id = rs.new_refinement_id(), rs.new_refinement_id()
    assert first_id.startswith("r-") and first_id < second_id
    row = rs.RefinementRow(
        id=first_id,
        session_id=ROOT_A,
        owner=ROOT_A,
        scope="local",
        trigger="user",
        instructions="be brief",
        edits=[{"action": "create", "kind": "memory", "id": "x", "baseline_version": None}],
    )
    await store.transaction(lambda con: rs.insert_refinement(con, row))
    assert await store.read(lambda con: rs.select_refinement(con, first_id)) == row

    applied_at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    updated = await store.transaction(
        lambda con: rs.update_refinement(
            con,
            first_id,
            status="applied",
            applied_at=applied_at,
            turn_index=7,
            outcome={"verdict": "better"},
        )
    )
    assert (updated.status, updated.applied_at, updated.turn_index) == ("applied", applied_at, 7)
    assert updated.outcome == {"verdict": "better"} and updated.edits == row.edits
    assert updated.created_at == row.created_at

    second = rs.RefinementRow(
        id=second_id,
        session_id=ROOT_B,
        owner=GLOBAL_OWNER,
        scope="global",
        trigger="auto",
        rollback_of=first_id,
        created_at=row.created_at + timedelta(seconds=1),
    )
    await store.transaction(lambda con: rs.insert_refinement(con, second))
    newest = await store.read(lambda con: rs.select_refinements(con, limit=10))
    assert [r.id for r in newest] == [second_id, first_id]
    assert [
        r.id
        for r in await store.read(lambda con: rs.select_refinements(con, owners=[ROOT_A], limit=10))
    ] == [first_id]
    assert [
        r.id
        for r in await store.read(
            lambda con: rs.select_refinements(con, session_id=ROOT_B, limit=10)
        )
    ] == [second_id]
    assert await store.read(lambda con: rs.select_refinements(con, limit=1)) == [second]


async def test_update_refinement_refuses_unknown_fields_and_rows(store: Store) -> None:
    row = rs.RefinementRow(
        id=rs.new_refinement_id(), session_id=ROOT_A, owner=ROOT_A, scope="local", trigger="user"
    )
    await store.transaction(lambda con: rs.insert_refinement(con, row))
    with pytest.raises(ValueError, match="colour"):
        await store.transaction(lambda con: rs.update_refinement(con, row.id, colour="red"))
    with pytest.raises(ValueError, match="id"):
        await store.transaction(lambda con: rs.update_refinement(con, row.id, id="r-other"))
    with pytest.raises(ValueError, match="status"):
        await store.transaction(lambda con: rs.update_refinement(con, row.id, status="done"))
    with pytest.raises(HarnessNotFound):
        await store.transaction(lambda con: rs.update_refinement(con, "r-missing", status="failed"))
    assert await store.read(lambda con: rs.select_refinement(con, row.id)) == row
