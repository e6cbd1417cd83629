"""First-cell latency: ``backend.create(spec)`` → the result of the session's first cell.

- warm pool: ``LocalBackend(pool_size=1)``, ``pool.wait_ready`` before each measurement, so
  ``create`` takes the idle sandbox (setup: cwd, env) and the pool starts a replacement in the
  background, sharing the CPUs with the first cell as it would in the daemon;
- cold: ``LocalBackend(pool_size=0)``: gateway spawn, kernel start, setup, then the cell.

The cell is ``x = 1``. Each sandbox is stopped after its measurement (not timed).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import row

__all__ = ["run"]

WARM_RUNS = 15
QUICK_WARM_RUNS = 5
COLD_RUNS = 7
QUICK_COLD_RUNS = 3
REFERENCE_S = 0.87
TARGET_S = 0.3
POOL_READY_TIMEOUT_S = 120.0
CELL_TIMEOUT_S = 30.0
# Let the previous sandbox's stop and the pool's refill settle before the next measurement.
SETTLE_S = 0.3


async def _first_cell(backend: Any, base: Path) -> tuple[float, float]:
    """(create, first cell) in seconds."""
    from orchestrator.ids import new_session_id, new_tool_call_id
    from orchestrator.sandbox.base import SandboxSpec

    spec = SandboxSpec(session_id=new_session_id(), cwd=base, artifacts_dir=base / "artifacts")
    start = time.perf_counter()
    sandbox = await backend.create(spec)
    created = time.perf_counter()
    try:
        result = await sandbox.execute(
            "x = 1", timeout_s=CELL_TIMEOUT_S, cell_id=new_tool_call_id()
        )
        done = time.perf_counter()
    finally:
        await sandbox.stop()
    if result.status != "ok":
        raise RuntimeError(f"the first cell ended with {result.status}")
    return created - start, done - created


async def _bench(warm_runs: int, cold_runs: int) -> tuple[list[Any], list[Any], Any]:
    from orchestrator.sandbox.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="bench-first-cell-") as tmp:
        base = Path(tmp)
        warm: list[tuple[float, float]] = []
        pooled = LocalBackend(pool_size=1)
        try:
            pooled.start_pool()
            assert pooled.pool is not None
            for _ in range(warm_runs):
                await pooled.pool.wait_ready(POOL_READY_TIMEOUT_S)
                await asyncio.sleep(SETTLE_S)
                warm.append(await _first_cell(pooled, base))
            stats = pooled.pool.statistics()
        finally:
            await pooled.close()
        cold: list[tuple[float, float]] = []
        plain = LocalBackend(pool_size=0)
        try:
            for _ in range(cold_runs):
                await asyncio.sleep(SETTLE_S)
                cold.append(await _first_cell(plain, base))
        finally:
            await plain.close()
    return warm, cold, stats


def run(quick: bool = False) -> dict[str, Any]:
    warm, cold, stats = asyncio.run(
        _bench(QUICK_WARM_RUNS if quick else WARM_RUNS, QUICK_COLD_RUNS if quick else COLD_RUNS)
    )
    return {
        "rows": [
            row(
                "first cell, warm pool (create → result)",
                "s",
                [a + b for a, b in warm],
                reference=REFERENCE_S,
                target=TARGET_S,
            ),
            row("  create() from the pool", "s", [a for a, _ in warm]),
            row("  first cell round trip", "s", [b for _, b in warm]),
            row(
                "first cell, cold (no pool)",
                "s",
                [a + b for a, b in cold],
                reference=REFERENCE_S,
                target=TARGET_S,
            ),
            row("  create() cold: gateway + kernel", "s", [a for a, _ in cold]),
            row("  first cell round trip", "s", [b for _, b in cold]),
        ],
        "notes": [
            f"warm pool: {len(warm)} runs, pool hits {stats.hits}, misses {stats.misses}; "
            f"cold: {len(cold)} runs. The cold row is what the pool hides; a one-shot `-p` run "
            "starts its sandbox cold, overlapped with litellm's import.",
        ],
    }
