"""Subagent notices batched for one parent turn (sessions/notices.py) and the store's view of
a batch: every delivery merged into it counts as recorded (real DuckDB)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.ids import new_session_id
from orchestrator.models.registry import resolve_model
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.notices import NOTICE_SEPARATOR, gather_notices, notice_message
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import UserMessagePayload


def _live(tmp_path: Path) -> LiveSession:
    sid = new_session_id()
    model = resolve_model("openai/fake", Settings(), api_base="http://127.0.0.1:9/v1")
    record = SessionRecord(
        id=sid, root_id=sid, cwd=str(tmp_path), model=model.selector, backend="local"
    )
    spec = SandboxSpec(session_id=sid, cwd=tmp_path, artifacts_dir=tmp_path)
    return LiveSession(record=record, model=model, spec=spec)


def _notice(n: int) -> Inbound:
    payload = notice_message(f"[subagent {n} finished]", f"e-{n}")
    return Inbound(payload.model_copy(update={"message_id": f"m-{n}"}))


def test_queued_notices_merge_into_the_first_and_other_input_keeps_its_order(
    tmp_path: Path,
) -> None:
    live = _live(tmp_path)
    user = Inbound(UserMessagePayload(text="from the user"))
    for item in (_notice(2), user, _notice(3)):
        live.accept(item)
    merged = gather_notices(live, _notice(1))
    assert merged.payload.text == NOTICE_SEPARATOR.join(
        f"[subagent {n} finished]" for n in (1, 2, 3)
    )
    assert merged.payload.notice_ids == ["e-1", "e-2", "e-3"]
    assert merged.payload.message_id == "m-1"
    assert merged.payload.merged_message_ids == ["m-2", "m-3"]
    assert merged.payload.source == "harness" and merged.mode == "follow_up"
    assert list(live.follow) == [user]


def test_a_lone_notice_or_other_input_passes_unchanged(tmp_path: Path) -> None:
    live = _live(tmp_path)
    user = Inbound(UserMessagePayload(text="hi"))
    live.accept(user)
    first = _notice(1)
    assert gather_notices(live, first) is first
    assert list(live.follow) == [user]
    live.accept(_notice(2))
    other = Inbound(UserMessagePayload(text="a user message"))
    assert gather_notices(live, other) is other
    assert len(live.follow) == 2


async def test_ids_merged_into_a_batch_count_as_recorded(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "db.duckdb")
    try:
        sid = new_session_id()
        await store.create_session(
            SessionRecord(id=sid, root_id=sid, cwd="/work", model="fake/model", backend="local")
        )
        batch = UserMessagePayload(
            text="two notices",
            source="harness",
            notice_ids=["e-1", "e-2"],
            message_id="m-1",
            merged_message_ids=["m-2"],
        )
        await store.append(sid, "user_message", batch)
        await store.append(sid, "user_message", UserMessagePayload(text="plain"))
        asked = ["m-1", "m-2", "m-3"]
        assert await store.recorded_message_ids(sid, asked) == {"m-1", "m-2"}
    finally:
        await store.close()
