"""The system prompt with a harness section (docs/harness.md, issue 7 bullet 3): the base text is
a cache-stable prefix that no harness write changes; per kind the newest six entries, each one
line of at most 180 chars; rebuilt only after a change; skills listed by metadata."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt
from orchestrator.harness.prompt_section import ENTRIES_PER_KIND, ENTRY_MAX_CHARS, HEADER
from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.prompting import PromptBuilder
from orchestrator.settings import Settings
from orchestrator.store import db as store_db
from orchestrator.store import harness as hs
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import NoticePayload
from orchestrator.store.harness_entry import GLOBAL_OWNER, EntryWrite, Kind, slugify

ROOT = "s-aaaaaaaaaaaa"
# Far longer than any test: rows reach the tables only when something asks for them.
NEVER_S = 3600.0
OTHER = "s-bbbbbbbbbbbb"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "db" / "prime-agent.duckdb") as opened:
        yield opened


def _live(tmp_path: Path, session_id: str = ROOT) -> LiveSession:
    model = resolve_model("openai/fake", Settings(), api_base="http://127.0.0.1:9/v1")
    record = SessionRecord(
        id=session_id, root_id=session_id, cwd=str(tmp_path), model=model.selector, backend="local"
    )
    return LiveSession(
        record=record,
        model=model,
        spec=SandboxSpec(session_id=session_id, cwd=tmp_path, artifacts_dir=tmp_path),
    )


def _builder(store: Store, tmp_path: Path) -> PromptBuilder:
    paths = Paths(
        config_dir=tmp_path / "config",
        data_dir=tmp_path / "data",
        cache_dir=tmp_path / "cache",
        runtime_dir=tmp_path / "run",
    )
    return PromptBuilder(store, paths, Settings())


async def _write(store: Store, owner: str, kind: Kind, title: str, content: str) -> None:
    await store.transaction(
        lambda con: hs.write_entry(
            con,
            owner=owner,
            action="create",
            write=EntryWrite(kind=kind, id=slugify(title), title=title, content=content),
            expected_version=None,
            source="agent",
            reason="test",
            session_id=None,
        )
    )


def _base(live: LiveSession) -> str:
    """The prompt with no harness section: everything before the environment facts."""
    full = build_system_prompt(
        EnvironmentFacts(cwd=live.record.cwd, model=live.model.selector, backend="local"),
        tool_protocol=live.model.tool_protocol,
    )
    return full[: full.index("\n# Environment")]


async def test_a_harness_write_keeps_the_base_prefix_byte_identical(
    store: Store, tmp_path: Path
) -> None:
    live = _live(tmp_path)
    builder = _builder(store, tmp_path)
    before = await builder.build(live)
    base = _base(live)
    assert before.startswith(base) and HEADER not in before
    await _write(store, ROOT, "memory", "Build tool", "use make")
    builder.changed(ROOT)
    after = await builder.build(live)
    assert after != before
    assert after.encode()[: len(base.encode())] == base.encode()
    assert after.index(HEADER) >= len(base)
    assert "[local:build_tool] Build tool: use make" in after


async def test_rebuilt_only_after_a_change_and_only_the_sessions_own_tree(
    store: Store, tmp_path: Path
) -> None:
    live, other = _live(tmp_path), _live(tmp_path, OTHER)
    builder = _builder(store, tmp_path)
    first = await builder.build(live)
    await _write(store, ROOT, "memory", "Quiet", "written without telling the builder")
    assert await builder.build(live) is first  # same generation: the cached prompt
    builder.changed(ROOT)
    assert "Quiet" in await builder.build(live)
    assert "Quiet" not in await builder.build(other)  # another tree's local entry
    await _write(store, GLOBAL_OWNER, "prompt", "Be brief", "one line answers")
    builder.changed(GLOBAL_OWNER)
    assert "[global:be_brief]" in await builder.build(other)


async def test_newest_six_per_kind_each_one_bounded_line(store: Store, tmp_path: Path) -> None:
    live = _live(tmp_path)
    for i in range(ENTRIES_PER_KIND + 3):
        await _write(store, ROOT, "memory", f"Fact {i}", f"value {i} " + "x" * 400)
    builder = _builder(store, tmp_path)
    prompt = await builder.build(live)
    lines = [line for line in prompt.splitlines() if line.startswith("- [local:fact_")]
    assert len(lines) == ENTRIES_PER_KIND
    assert all(len(line) <= ENTRY_MAX_CHARS and line.endswith("…") for line in lines)
    assert lines[0].startswith(f"- [local:fact_{ENTRIES_PER_KIND + 2}]")  # newest first
    assert "(3 more: rlm.harness.list('memory'))" in prompt


async def test_skills_are_listed_by_metadata(store: Store, tmp_path: Path) -> None:
    skill = tmp_path / ".prime-agent" / "skills" / "doubler"
    (skill / "doubler").mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: doubler\ndescription: Doubles numbers.\n---\nLong body not in the prompt.\n"
    )
    (skill / "doubler" / "__init__.py").write_text("def run(x):\n    return 2 * x\n")
    live = _live(tmp_path)
    builder = _builder(store, tmp_path)
    prompt = await builder.build(live)
    assert "- doubler: Doubles numbers." in prompt and "import doubler" in prompt
    assert "Long body" not in prompt
    assert builder.skill_dirs(str(tmp_path)) == (skill.resolve(),)


async def test_building_a_prompt_leaves_the_steps_rows_in_the_commit_log(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's start reads the harness tables, which the commit log never writes: a side read,
    so the rows the previous turn appended are not forced into the tables for it."""
    monkeypatch.setattr(store_db, "INGEST_DELAY_S", NEVER_S)  # no timed ingest meanwhile
    live = _live(tmp_path)
    await store.create_session(live.record)
    await _write(store, ROOT, "memory", "Build tool", "use make")
    await store.append(ROOT, "notice", NoticePayload(text="a step"))
    before = store.statistics()
    assert before.pending > 0
    assert "Build tool" in await _builder(store, tmp_path).build(live)
    after = store.statistics()
    assert (after.ingests, after.pending) == (before.ingests, before.pending)


async def test_a_tree_without_entries_builds_its_prompt_without_a_read(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most sessions of a sweep are new trees with no harness entries: the builder learns once
    which owners have entries, and the others' first prompts read nothing."""
    builder = _builder(store, tmp_path)
    reads: list[int] = []
    read_side = store.read_side

    async def counted(fn: Any) -> Any:
        reads.append(1)
        return await read_side(fn)

    monkeypatch.setattr(store, "read_side", counted)
    quiet, other = _live(tmp_path), _live(tmp_path, OTHER)
    assert HEADER not in await builder.build(quiet)
    assert HEADER not in await builder.build(other)
    assert len(reads) == 1  # the owners' index, once
    await _write(store, OTHER, "memory", "Late fact", "written after the index was read")
    builder.changed(OTHER)
    assert "Late fact" in await builder.build(other)
    assert len(reads) == 2
