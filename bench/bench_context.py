"""Context assembly and compaction (issue 6, docs/compaction.md).

- **Assembly**: a session of 1k / 10k / 100k events (written in one bulk INSERT, a linear
  conversation with one compaction ``AFTER`` events before the leaf whose kept span is
  ``KEPT_SPAN`` events): the time to read its context path (``read_context_path``) and build the
  messages (``ContextBuilder.load``), the rows read, and the Python memory that takes
  (tracemalloc peak; DuckDB's own buffers are not counted). Target: flat in history length.
- **Compaction**: ``Compactor.compact`` on a context of ``COMPACT_MESSAGES`` messages with a
  summariser that answers at once: the wall time of the cut, the summary request's assembly,
  the store write and the context rebuild, without the model call.

Usage: ``.venv/bin/python -m bench context`` (through the runner) or
``.venv/bin/python bench/bench_context.py``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from orchestrator.agent.compaction import Compactor
from orchestrator.agent.context import ContextBuilder
from orchestrator.ids import new_session_id
from orchestrator.models.client import ModelReply
from orchestrator.settings import CompactionSettings
from orchestrator.store.context_queries import read_context_path
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    ToolCall,
    ToolResultPayload,
    UsagePayload,
    UserMessagePayload,
)

__all__ = ["main", "run"]

SIZES = (1_000, 10_000, 100_000)
REPEATS = 7
QUICK_REPEATS = 3
KEPT_SPAN = 200
AFTER = 100
TEXT_CHARS = 400  # per event payload
COMPACT_MESSAGES = 300  # user + (call, result) pairs in the compacted context
COMPACT_WINDOW = 128_000
MS = 1000.0
KIB = 1024.0


def _write(database: Path, sid: str, count: int) -> None:
    import duckdb

    compaction = count - AFTER
    con = duckdb.connect(str(database))
    try:
        con.execute(
            """
            INSERT INTO events (session_id, seq, id, parent_event_id, type, ts, payload)
            SELECT $1, i, 'e-' || lpad(i::VARCHAR, 7, '0'),
                   CASE WHEN i = 1 THEN NULL ELSE 'e-' || lpad((i - 1)::VARCHAR, 7, '0') END,
                   CASE WHEN i = $2 THEN 'compaction' WHEN i % 2 = 0 THEN 'user_message'
                        ELSE 'assistant_message' END,
                   now()::TIMESTAMP,
                   CASE WHEN i = $2 THEN json_object(
                            'summary', 'notes', 'first_kept_event_id',
                            'e-' || lpad(($2 - $3)::VARCHAR, 7, '0'), 'tokens_before', 1,
                            'tokens_after', 1, 'reason', 'threshold')
                        WHEN i % 2 = 0 THEN json_object('text', repeat('q', $4))
                        ELSE json_object('text', repeat('a', $4), 'provider', 'openai',
                                         'model', 'fake') END
            FROM range(1, $5 + 1) t(i)
            """,
            [sid, compaction, KEPT_SPAN, TEXT_CHARS, count],
        )
        con.execute("UPDATE sessions SET leaf_event_id = $2 WHERE id = $1", [sid, f"e-{count:07d}"])
    finally:
        con.close()


async def _session(path: Path) -> str:
    sid = new_session_id()
    async with await Store.open(path) as store:
        await store.create_session(
            SessionRecord(id=sid, root_id=sid, cwd="/", model="openai/fake", backend="local")
        )
    return sid


async def _assemble(path: Path, sid: str, repeats: int) -> tuple[list[float], float, int]:
    """(assembly times in ms, tracemalloc peak KiB of one assembly, rows read)."""
    times: list[float] = []
    async with await Store.open(path) as store:
        rows = 0
        for _ in range(repeats):
            start = time.perf_counter()
            found = await read_context_path(store, sid)
            ContextBuilder().load(found)
            times.append((time.perf_counter() - start) * MS)
            rows = found.rows_read
        tracemalloc.start()
        ContextBuilder().load(await read_context_path(store, sid))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return times, peak / KIB, rows


async def _instant(messages: list[dict[str, Any]]) -> ModelReply:
    usage = UsagePayload(provider="openai", model="fake", input=1, output=1)
    return ModelReply("## Goal\nnotes", [], "stop", usage)


async def _window() -> int:
    return COMPACT_WINDOW


async def _compaction_ms(path: Path) -> float:
    sid = new_session_id()
    async with await Store.open(path) as store:
        await store.create_session(
            SessionRecord(id=sid, root_id=sid, cwd="/", model="openai/fake", backend="local")
        )
        context = ContextBuilder()

        async def add(type_: str, payload: Any) -> None:
            rec = await store.append(sid, type_, payload)
            context.add(type_, payload.model_dump(mode="json"), event_id=rec.id)

        await add("user_message", UserMessagePayload(text="task"))
        for n in range(COMPACT_MESSAGES // 2):
            call = ToolCall(id=f"c{n}", name="ipython", arguments=json.dumps({"code": f"f({n})"}))
            await add(
                "assistant_message",
                AssistantMessagePayload(tool_calls=[call], provider="openai", model="fake"),
            )
            await add("tool_result", ToolResultPayload(tool_call_id=f"c{n}", text="r" * 2000))
        compactor = Compactor(
            settings=CompactionSettings(),
            context=context,
            complete=_instant,
            record=lambda t, p: store.append(sid, t, p),
            window=_window,
            fixed_tokens=lambda: 1000,
            model=lambda: "openai/fake",
        )
        start = time.perf_counter()
        await compactor.compact("manual", turn_event_id=None)
        return (time.perf_counter() - start) * MS


async def _measure(base: Path, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"assembly": {}, "compaction": []}
    for size in SIZES:
        path = base / f"context-{size}.duckdb"
        sid = await _session(path)
        _write(path, sid, size)
        out["assembly"][size] = await _assemble(path, sid, repeats)
    for i in range(repeats):
        out["compaction"].append(await _compaction_ms(base / f"compact-{i}.duckdb"))
    return out


def run(quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-context-") as tmp:
        measured = asyncio.run(_measure(Path(tmp), QUICK_REPEATS if quick else REPEATS))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for size, (times, peak_kib, rows_read) in measured["assembly"].items():
        rows.append(_row(f"context assembly, {size:,} events", "ms", times))
        rows.append(_row(f"context assembly memory, {size:,} events", "KiB", [peak_kib]))
        notes.append(f"{size:,} events: {rows_read} rows read for the context")
    first, last = (statistics.median(measured["assembly"][s][0]) for s in (SIZES[0], SIZES[-1]))
    notes.append(f"assembly time {SIZES[-1]:,} / {SIZES[0]:,} events: {last / first:.2f}×")
    rows.append(
        _row(
            f"compaction of {COMPACT_MESSAGES} messages, without the model call",
            "ms",
            measured["compaction"],
        )
    )
    return {"rows": rows, "notes": notes}


def _row(name: str, unit: str, samples: list[float]) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "samples": samples,
        "reference": None,
        "target": None,
        "higher_is_better": False,
    }


def main() -> None:
    result = run()
    for r in result["rows"]:
        print(f"{r['name']:<56} median {statistics.median(r['samples']):>10.2f} {r['unit']}")
    for note in result["notes"]:
        print(f"  - {note}")


if __name__ == "__main__":
    main()
