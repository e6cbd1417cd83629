"""Faithful import of real session files (issue 20, item 4): tests/fixtures/pi-sessions/ holds
two files from the test fixtures of Prime Agent and pi (see its README.md). Every entry is kept
with all its fields (thinking blocks and signatures, ``errorMessage``, tool details, per-kind
costs, ``api``), the header too, ``usage`` shows the file's tokens and cost without charging a
budget, the file's missing directory is a notice, and import → export → import → export writes
the same file twice with the file's entry ids and session id."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store.db import Store
from orchestrator.store.jsonl import JSONL_VERSION, export_session_jsonl
from orchestrator.store.jsonl_import import ImportOptions, ImportResult, import_session_jsonl
from orchestrator.store.jsonl_parse import parse_session_jsonl

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "pi-sessions"
HAND_WRITTEN = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl"
FILES = ["prime-agent-before-compaction.jsonl.gz", "pi-large-session.jsonl.gz"]
FALLBACK_CWD = "/fallback/cwd"
OPTIONS = ImportOptions(default_model="openai/fake", fallback_cwd=FALLBACK_CWD)
ENTRIES_OF_THE_PRIME_AGENT_FILE = 1003  # the file the issue measured, header included
HEX_ID_CHARS = 8
STRUCTURE = ("id", "parentId")  # what a version 1 entry gains on the way (pi's migration)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with await Store.open(tmp_path / "db" / "fidelity.duckdb") as s:
        yield s


def lines_of(name: str) -> list[str]:
    path = REAL / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return fh.read().splitlines()


async def import_lines(store: Store, lines: list[str]) -> ImportResult:
    parsed = parse_session_jsonl(enumerate(lines, start=1), source="file")
    return await import_session_jsonl(store, parsed, OPTIONS)


async def export_lines(store: Store, session_id: str) -> list[str]:
    out = io.StringIO()
    await export_session_jsonl(store, session_id, out)
    return out.getvalue().splitlines()


def migrated(original: dict[str, Any], exported: dict[str, Any], ids: list[str]) -> Any:
    """``original`` as pi's migration to version 3 writes it: ``exported``'s id and parentId,
    and a compaction's kept entry named by id instead of by position."""
    out = {k: v for k, v in original.items() if k not in STRUCTURE}
    if "firstKeptEntryIndex" in out:
        index = out.pop("firstKeptEntryIndex")
        out["firstKeptEntryId"] = ids[index]
    return {**out, **{k: exported[k] for k in STRUCTURE}}


def usage_of(entries: list[dict[str, Any]]) -> tuple[int, int, int, float]:
    """(calls, input + output tokens, cache tokens, cost) over the file's assistant messages."""
    calls = tokens = cache = 0
    cost = 0.0
    for entry in entries:
        message = entry.get("message") or {}
        usage = message.get("usage") if message.get("role") == "assistant" else None
        if not usage:
            continue
        counts = (usage["input"], usage["output"], usage["cacheRead"], usage["cacheWrite"])
        total = usage["cost"]["total"]
        if any(counts) or total > 0:
            calls += 1
            tokens += usage["input"] + usage["output"]
            cache += usage["cacheRead"] + usage["cacheWrite"]
            cost += total
    return calls, tokens, cache, cost


@pytest.mark.parametrize("name", FILES)
async def test_a_real_file_keeps_every_entry_and_field(store: Store, name: str) -> None:
    original = lines_of(name)
    entries = [json.loads(line) for line in original]
    if name.startswith("prime-agent"):
        assert len(entries) == ENTRIES_OF_THE_PRIME_AGENT_FILE
    result = await import_lines(store, original)
    assert result.events == len(entries) - 1
    exported = [json.loads(line) for line in await export_lines(store, result.session.id)]
    assert len(exported) == len(entries)

    # The header: the file's, in version 3 (provider, model, thinking level, parent, id, cwd).
    assert exported[0] == {**entries[0], "version": JSONL_VERSION}
    # Every entry whole, given ids (unique, pi's shape) as version 1 files get them.
    ids = [e.get("id") for e in exported]
    assert len(set(ids[1:])) == len(ids) - 1
    assert all(isinstance(i, str) and len(i) == HEX_ID_CHARS for i in ids[1:])
    assert exported[1]["parentId"] is None
    assert [e["parentId"] for e in exported[2:]] == ids[1:-1]  # version 1 is linear
    for before, after in zip(entries[1:], exported[1:], strict=True):
        assert after == migrated(before, after, ids)

    # What the issue found lost, counted on both sides.
    def census(rows: list[dict[str, Any]]) -> Counter[str]:
        found: Counter[str] = Counter()
        for row in rows:
            message = row.get("message") or {}
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "thinking":
                    found["thinking"] += 1
                    found["signature"] += "thinkingSignature" in block
            found["errorMessage"] += "errorMessage" in message
            found["details"] += message.get("details") is not None
            found["api"] += "api" in message
        return found

    before, after = census(entries), census(exported)
    assert before == after
    assert before["thinking"] > 0 and before["errorMessage"] > 0 and before["details"] > 0


@pytest.mark.parametrize("name", FILES)
async def test_usage_shows_the_files_tokens_and_cost_and_no_budget_counts_them(
    store: Store, name: str
) -> None:
    entries = [json.loads(line) for line in lines_of(name)]
    result = await import_lines(store, lines_of(name))
    calls, tokens, cache, cost = usage_of(entries)
    assert calls > 0 and cost > 0
    (usage,) = await store.usage_summary([result.session.id])
    assert (usage.calls, usage.imported_calls, result.usage_rows) == (calls, calls, calls)
    assert (usage.input + usage.output, usage.cache_read + usage.cache_write) == (tokens, cache)
    assert usage.cost_usd == pytest.approx(cost)
    (budgeted,) = await store.usage_summary([result.session.id], imported=False)
    assert (budgeted.calls, budgeted.input, budgeted.output, budgeted.cost_usd) == (0, 0, 0, None)


@pytest.mark.parametrize("name", FILES)
async def test_import_export_import_export_writes_the_same_file(store: Store, name: str) -> None:
    first = await import_lines(store, lines_of(name))
    once = await export_lines(store, first.session.id)
    second = await import_lines(store, once)
    twice = await export_lines(store, second.session.id)
    assert twice == once  # byte for byte: entry ids and the file's session id kept
    assert json.loads(once[0])["id"] == json.loads(lines_of(name)[0])["id"]
    assert second.session.id != first.session.id  # ours: a new session each import


async def test_a_version_3_file_exports_its_own_entries_back(store: Store) -> None:
    text = (HAND_WRITTEN / "v3_tree.jsonl").read_text().splitlines()
    result = await import_lines(store, text)
    exported = [json.loads(line) for line in await export_lines(store, result.session.id)]
    assert exported == [json.loads(line) for line in text]


async def test_a_missing_directory_is_a_notice_and_stays_recorded(store: Store) -> None:
    lines = lines_of(FILES[0])
    result = await import_lines(store, lines)
    original_cwd = json.loads(lines[0])["cwd"]
    assert result.session.cwd == FALLBACK_CWD
    assert result.original_cwd == original_cwd
    assert result.notice is not None and original_cwd in result.notice
    assert result.as_dict()["notice"] == result.notice
    exported = await export_lines(store, result.session.id)
    assert json.loads(exported[0])["cwd"] == original_cwd
    # A directory that exists is used, and nothing is said.
    here = HAND_WRITTEN / "v3_tree.jsonl"
    at_home = await import_lines(store, here.read_text().splitlines())
    assert at_home.original_cwd is None and at_home.notice is None
