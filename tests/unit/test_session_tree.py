"""The session tree at the store level (docs/tree.md): leaf rebuild, branch, fork, clone and the
listing, checked through the active paths and the contexts the ContextBuilder makes of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from orchestrator.agent.context import ContextBuilder
from orchestrator.errors import StoreError, UserError
from orchestrator.ids import new_session_id
from orchestrator.store import tree
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    NoticePayload,
    ToolCall,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)

PAGE = 2  # a tiny page size: the listing is read in several pages


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "db" / "tree.duckdb"


@pytest.fixture
async def store(db_path: Path) -> Any:
    async with await Store.open(db_path) as s:
        yield s


async def make_session(store: Store, name: str | None = "work") -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(
            id=sid,
            root_id=sid,
            name=name,
            cwd="/home/u/proj",
            model="openai/fake",
            backend="local",
            budget_tokens=5000,
        )
    )
    return sid


def user(text: str) -> UserMessagePayload:
    return UserMessagePayload(text=text)


def said(text: str) -> AssistantMessagePayload:
    return AssistantMessagePayload(text=text, provider="openai", model="fake")


async def context_of(store: Store, sid: str) -> list[dict[str, Any]]:
    builder = ContextBuilder()
    builder.extend(await store.active_path(sid))
    return builder.messages


async def conversation(store: Store, sid: str) -> list[str]:
    """A session with a cell: user, assistant (tool call), usage, result, answer, user, answer.
    Returns the event ids in order."""
    ids = []
    for type_, payload in [
        ("user_message", user("compute 6*7")),
        (
            "assistant_message",
            AssistantMessagePayload(
                tool_calls=[ToolCall(id="c1", name="ipython", arguments='{"code": "6*7"}')],
                stop_reason="tool_calls",
                provider="openai",
                model="fake",
            ),
        ),
        ("usage", UsagePayload(provider="openai", model="fake", input=10, output=5)),
        ("tool_result", ToolResultPayload(tool_call_id="c1", text="42")),
        ("assistant_message", said("It is 42.")),
        ("user_message", user("now double it")),
        ("assistant_message", said("84")),
    ]:
        ids.append((await store.append(sid, type_, payload)).id)  # type: ignore[arg-type]
    return ids


async def test_a_missing_leaf_is_rebuilt_from_the_newest_event(db_path: Path) -> None:
    async with await Store.open(db_path) as store:
        sid = await make_session(store)
        ids = await conversation(store, sid)
        empty = await make_session(store, name="empty")
        await store.transaction(
            lambda con: con.execute(
                "UPDATE sessions SET leaf_event_id = NULL WHERE id = $1", [sid]
            ),
            sessions=(sid,),
        )
        # Read before any reopen: readers already use the newest event.
        page = await tree.tree_page(store, sid)
        assert page.leaf_seq == len(ids) and all(n.active for n in page.nodes)
    async with await Store.open(db_path) as store:
        rebuilt = await store.get_session(sid)
        assert rebuilt is not None and rebuilt.leaf_event_id == ids[-1]
        assert [e.id for e in await store.active_path(sid)] == ids
        nothing = await store.get_session(empty)
        assert nothing is not None and nothing.leaf_event_id is None  # no events: stays None
        # The next append continues the rebuilt path.
        nxt = await store.append(sid, "user_message", user("more"))
        assert nxt.parent_event_id == ids[-1] and nxt.seq == len(ids) + 1


async def test_branch_moves_the_leaf_and_keeps_everything(store: Store) -> None:
    sid = await make_session(store)
    ids = await conversation(store, sid)
    full = await context_of(store, sid)
    result = await tree.branch(store, sid, "5")  # back to "It is 42."
    assert (result.target_seq, result.leaf_seq, result.summary_seq) == (5, 5, None)
    assert [e.id for e in await store.active_path(sid)] == ids[:5]
    assert await context_of(store, sid) == full[:4]
    other = await store.append(sid, "user_message", user("now triple it"))
    assert other.parent_event_id == ids[4]
    ctx = await context_of(store, sid)
    assert ctx == [*full[:4], {"role": "user", "content": "now triple it"}]
    assert len(await store.events(sid)) == len(ids) + 1  # nothing deleted
    # An event id works as well as a seq; branching back to the old leaf restores the old path.
    await tree.branch(store, sid, ids[-1])
    assert await context_of(store, sid) == full


async def test_branch_with_a_summary_records_it_at_the_branch_point(store: Store) -> None:
    sid = await make_session(store)
    ids = await conversation(store, sid)
    result = await tree.branch(store, sid, "5", summary="Doubled it: 84.")
    path = await store.active_path(sid)
    summary = path[-1]
    assert summary.type == "branch_summary" and summary.id == result.leaf_id
    assert summary.parent_event_id == ids[4] and result.summary_seq == summary.seq == 8
    assert summary.payload == {
        "summary": "Doubled it: 84.",
        "from_event_id": ids[-1],
        "details": None,
    }
    nxt = await store.append(sid, "user_message", user("now triple it"))
    assert nxt.parent_event_id == summary.id
    # The model keeps what the abandoned path did: the summary is in the context.
    ctx = await context_of(store, sid)
    assert ctx[4]["role"] == "user" and ctx[4]["content"].endswith("Doubled it: 84.")
    assert [m["content"] for m in ctx[3:4] + ctx[5:]] == ["It is 42.", "now triple it"]
    with pytest.raises(UserError, match="summary is empty"):
        await tree.branch(store, sid, "5", summary="  ")


async def test_branch_refuses_events_it_cannot_find(store: Store) -> None:
    sid = await make_session(store)
    other = await make_session(store, name="other")
    foreign = await store.append(other, "user_message", user("elsewhere"))
    await conversation(store, sid)
    for ref in ("99", foreign.id, "nope", "9" * 40):
        with pytest.raises(UserError, match="has no event"):
            await tree.branch(store, sid, ref)
    with pytest.raises(UserError, match="no session matches"):
        await tree.branch(store, "s-nothinghere", "1")


async def test_fork_copies_the_path_up_to_an_event(store: Store) -> None:
    sid = await make_session(store)
    ids = await conversation(store, sid)
    source_ctx = await context_of(store, sid)
    forked = await tree.fork(store, sid, "5")
    assert forked.id != sid and forked.root_id == forked.id and forked.parent_id is None
    assert (forked.cwd, forked.model, forked.backend) == ("/home/u/proj", "openai/fake", "local")
    assert forked.status == "inactive" and forked.budget_tokens == 5000
    assert (forked.name, forked.forked_from, forked.forked_at) == ("work (fork)", sid, ids[4])
    copied = await store.events(forked.id)
    originals = (await store.events(sid))[:5]
    assert [e.seq for e in copied] == [1, 2, 3, 4, 5]
    assert [e.parent_event_id for e in copied] == [None] + [e.id for e in copied[:-1]]
    assert [(e.type, e.payload, e.ts) for e in copied] == [
        (e.type, e.payload, e.ts) for e in originals
    ]
    assert not {e.id for e in copied} & set(ids)  # new ids: the session's tree is closed
    assert forked.leaf_event_id == copied[-1].id
    assert await context_of(store, forked.id) == source_ctx[:4]
    # Usage rows count each model call once: the copy's history was paid for by the source.
    (usage,) = await store.usage_summary([forked.id])
    assert usage.calls == 0
    # The fork is a session like any other; the source is untouched.
    nxt = await store.append(forked.id, "user_message", user("now triple it"))
    assert (nxt.seq, nxt.parent_event_id) == (6, copied[-1].id)
    assert [e.id for e in await store.active_path(sid)] == ids
    again = await tree.fork(store, sid, "1")
    assert again.name == "work (fork 2)" and len(await store.events(again.id)) == 1
    assert (await tree.fork(store, sid)).forked_at == ids[-1]  # default: the leaf


async def test_clone_copies_only_the_active_path(store: Store) -> None:
    sid = await make_session(store)
    ids = await conversation(store, sid)
    await tree.branch(store, sid, "5", summary="Doubled it.")
    await store.append(sid, "user_message", user("now triple it"))
    expected = await context_of(store, sid)
    cloned = await tree.clone(store, sid)
    assert cloned.name == "work (clone)" and cloned.status == "inactive"
    events = await store.events(cloned.id)
    assert [e.type for e in events][-2:] == ["branch_summary", "user_message"]
    assert len(events) == 5 + 2  # the abandoned "now double it" / "84" stay behind
    assert await context_of(store, cloned.id) == expected
    assert [e.id for e in await store.active_path(cloned.id)] == [e.id for e in events]
    unnamed = await make_session(store, name=None)
    empty = await tree.clone(store, unnamed)
    assert empty.name is None and empty.leaf_event_id is None
    assert await store.events(empty.id) == [] and len(ids) == 7


async def test_listing_draws_branches_and_marks_the_active_path(store: Store) -> None:
    sid = await make_session(store)
    await conversation(store, sid)
    await tree.branch(store, sid, "5", summary="Doubled it.")
    await store.append(sid, "user_message", user("now triple it\nplease"))
    await store.append(sid, "notice", NoticePayload(text=""))
    page = await tree.tree_page(store, "work")
    assert page.total == 10 and page.leaf_seq == 10 and page.next_after is None
    lines = tree.render_tree(page)
    assert lines == [
        "*  1 user_message  compute 6*7",
        "*  2 assistant_message  » ipython: 6*7",
        "*  3 usage  fake",
        "*  4 tool_result  42",
        "*  5 assistant_message  It is 42.",
        "  ├─  6 user_message  now double it",
        "  │   7 assistant_message  84",
        "* └─  8 branch_summary  Doubled it.",
        "*     9 user_message  now triple it",
        "*    10 notice  ← leaf",
    ]
    # Paged (as the daemon serves it), the nodes are the same.
    nodes: list[tree.TreeNode] = []
    after = 0
    while True:
        part = await tree.tree_page(store, sid, after_seq=after, limit=PAGE)
        nodes += part.nodes
        if part.next_after is None:
            break
        after = part.next_after
    assert nodes == page.nodes
    assert tree.TreePage.from_dict(page.as_dict()) == page


async def test_a_failed_transaction_leaves_nothing(store: Store) -> None:
    sid = await make_session(store)

    def half(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("UPDATE sessions SET name = 'changed' WHERE id = $1", [sid])
        raise UserError("stop here")

    with pytest.raises(UserError, match="stop here"):
        await store.transaction(half, sessions=(sid,))
    rec = await store.get_session(sid)
    assert rec is not None and rec.name == "work"
    async with await Store.open(store.path.with_name("ro.duckdb")) as other:
        await other.close()
    readonly = await Store.open(store.path.with_name("ro.duckdb"), read_only=True)
    try:
        with pytest.raises(StoreError, match="read-only"):
            await readonly.transaction(half)
    finally:
        await readonly.close()


async def test_a_fork_of_a_compacted_session_points_at_its_own_copies(store: Store) -> None:
    from orchestrator.store.context_queries import read_context_path
    from orchestrator.store.events import CompactionPayload

    sid = await make_session(store)
    ids = await conversation(store, sid)
    compaction = CompactionPayload(
        summary="earlier: 6*7 was computed",
        first_kept_event_id=ids[5],  # "now double it" and after
        pinned_event_id=ids[0],
        tokens_before=100,
        tokens_after=20,
        reason="manual",
    )
    await store.append(sid, "compaction", compaction)
    await store.append(sid, "user_message", user("and triple?"))
    source = await read_context_path(store, sid)
    assert source.compaction is not None and source.pinned is not None

    for copy in (await tree.fork(store, sid), await tree.clone(store, sid)):
        found = await read_context_path(store, copy.id)
        # The copy's compaction names the copy's own events, so its context assembles the same.
        assert found.compaction is not None and found.pinned is not None
        assert {e.session_id for e in found.events} == {copy.id}
        assert found.pinned.session_id == copy.id
        assert [(e.type, e.payload.get("text")) for e in found.events] == [
            (e.type, e.payload.get("text")) for e in source.events
        ]
        stored = found.compaction.payload
        assert stored["first_kept_event_id"] not in ids
        assert stored["pinned_event_id"] == found.pinned.id
