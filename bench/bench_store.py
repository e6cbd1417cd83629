"""Sustained append throughput of the DuckDB store (committed appends per second).

Two shapes, each run ``REPEATS`` times on a fresh database file, median printed:

- one session, sequential awaits: every append waits for its own commit (fsync-bound);
- ``CONCURRENT_SESSIONS`` sessions, each a task doing sequential awaits: group commit batches
  the appends that pile up while a commit is in progress.

Usage: ``.venv/bin/python bench/bench_store.py [--dir DIR]`` (DIR decides the disk measured;
default a temporary directory). ``python -m bench store`` runs it through the bench runner
(``run()``), with the other benchmarks' table and JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.ids import new_session_id
from orchestrator.store.db import SessionRecord, Store
from orchestrator.store.events import NoticePayload

__all__ = ["main", "run"]

REPEATS = 5
QUICK_REPEATS = 3
SEQUENTIAL_APPENDS = 500
CONCURRENT_SESSIONS = 50
APPENDS_PER_SESSION = 100
PAYLOAD_CHARS = 200


async def _session(store: Store) -> str:
    sid = new_session_id()
    await store.create_session(
        SessionRecord(id=sid, root_id=sid, cwd="/", model="bench", backend="local")
    )
    return sid


async def _appender(store: Store, sid: str, count: int) -> None:
    payload = NoticePayload(text="x" * PAYLOAD_CHARS)
    for _ in range(count):
        await store.append(sid, "notice", payload)


async def _run(path: Path, sessions: int, per_session: int) -> tuple[float, float]:
    """Returns (committed appends per second, mean rows per commit)."""
    async with await Store.open(path) as store:
        sids = [await _session(store) for _ in range(sessions)]
        before = store.statistics()
        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for sid in sids:
                tg.create_task(_appender(store, sid, per_session))
        elapsed = time.perf_counter() - start
        after = store.statistics()
    rows = after.rows - before.rows
    return rows / elapsed, rows / max(1, after.commits - before.commits)


def _shapes() -> list[tuple[str, int, int]]:
    return [
        ("1 session, sequential awaits", 1, SEQUENTIAL_APPENDS),
        (f"{CONCURRENT_SESSIONS} concurrent sessions", CONCURRENT_SESSIONS, APPENDS_PER_SESSION),
    ]


async def _measure(base: Path, repeats: int) -> list[tuple[str, list[float], list[float]]]:
    """Per shape: (label, appends/s of each run, rows per commit of each run)."""
    out = []
    for label, sessions, per_session in _shapes():
        rates, batches = [], []
        for i in range(repeats):
            rate, batch = await _run(base / f"bench-{sessions}-{i}.duckdb", sessions, per_session)
            rates.append(rate)
            batches.append(batch)
        out.append((label, rates, batches))
    return out


async def _bench(base: Path) -> None:
    for label, rates, batches in await _measure(base, REPEATS):
        print(
            f"{label:<32} median {statistics.median(rates):>9,.0f} appends/s "
            f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}; "
            f"median rows/commit {statistics.median(batches):.1f})"
        )


def run(quick: bool = False) -> dict[str, Any]:
    """The bench runner's entry: one row per shape (appends/s, higher is better)."""
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        measured = asyncio.run(_measure(Path(tmp), QUICK_REPEATS if quick else REPEATS))
    rows = [
        {
            "name": f"store appends/s, {label}",
            "unit": "appends/s",
            "samples": rates,
            "reference": None,
            "target": None,
            "higher_is_better": True,
        }
        for label, rates, _ in measured
    ]
    notes = [
        f"{label}: median {statistics.median(batches):.1f} rows per commit"
        for label, _, batches in measured
    ]
    return {"rows": rows, "notes": notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the database files go")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_bench(args.dir))
        return
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        asyncio.run(_bench(Path(tmp)))


if __name__ == "__main__":
    main()
