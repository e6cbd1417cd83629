"""The docker backend's costs (docs/docker.md, docs/benchmarks.md):

- **cold start**: ``DockerBackend(pool_size=0).create(spec)``: container, gateway, kernel,
  session setup; then the first cell;
- **warm-pool acquisition**: ``create(spec)`` with a ready pooled container for the same
  workspace (target ≤ 50 ms), and the first cell after it;
- **per-cell overhead**: trivial cells (``pass``) through a container vs the local backend, in
  interleaved rounds; the headline is the per-round ratio of medians (target ≤ 1.5×);
- **memory per idle container**: ``docker stats`` of containers that ran one cell and idle
  (usage minus the inactive file cache, as ``docker stats`` shows it).

Skipped with a note when no Docker engine answers or the session image is not built (it is
never built here: ``make images``). Containers and host runtime dirs left behind are an error.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import row

__all__ = ["run"]

COLD_RUNS = 5
QUICK_COLD_RUNS = 3
WARM_RUNS = 10
QUICK_WARM_RUNS = 5
CELL_ROUNDS = 5
QUICK_CELL_ROUNDS = 3
CELLS_PER_ROUND = 40
WARMUP_CELLS = 5
IDLE_CONTAINERS = 3
IDLE_SETTLE_S = 2.0  # after its cell, before docker stats
POOL_READY_TIMEOUT_S = 180.0
CELL_TIMEOUT_S = 60.0
SETTLE_S = 0.3
WARM_TARGET_S = 0.05
CELL_RATIO_TARGET = 1.5
MIB = 1024**2
SESSION_PREFIX = "bench-dkr-"
SANDBOX_UID = 1000  # the session image's user (images/session/Dockerfile)


def _spec(base: Path, name: str) -> Any:
    from orchestrator.sandbox.base import SandboxSpec

    return SandboxSpec(
        session_id=f"{SESSION_PREFIX}{name}", cwd=base, artifacts_dir=base / "artifacts"
    )


async def _first_cell(backend: Any, base: Path, name: str) -> tuple[float, float]:
    """(create, first cell) in seconds; the sandbox is stopped afterwards (not timed)."""
    start = time.perf_counter()
    sandbox = await backend.create(_spec(base, name))
    created = time.perf_counter()
    try:
        result = await sandbox.execute("x = 1", timeout_s=CELL_TIMEOUT_S, cell_id="first")
        done = time.perf_counter()
    finally:
        await sandbox.stop()
    if result.status != "ok":
        raise RuntimeError(f"the first cell ended with {result.status}")
    return created - start, done - created


async def _cells(sandbox: Any, count: int) -> list[float]:
    times = []
    for i in range(count):
        start = time.perf_counter()
        result = await sandbox.execute("pass", timeout_s=CELL_TIMEOUT_S, cell_id=f"c{i}")
        times.append(time.perf_counter() - start)
        if result.status != "ok":
            raise RuntimeError(f"a trivial cell ended with {result.status}")
    return times


def _idle_memory_bytes(container: Any) -> int:
    """What ``docker stats`` shows as MEM USAGE: usage minus inactive file pages."""
    stats = container.stats(stream=False)["memory_stats"]
    inner = stats.get("stats", {})
    cache = inner.get("total_inactive_file", inner.get("inactive_file", inner.get("cache", 0)))
    return int(stats["usage"]) - int(cache)


async def _bench(quick: bool) -> dict[str, Any]:
    from orchestrator.sandbox.docker import DockerBackend, list_owned
    from orchestrator.sandbox.local import LocalBackend

    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    ratios: list[float] = []
    docker_cells: list[float] = []
    local_cells: list[float] = []
    idle: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-docker-") as tmp:
        base = Path(tmp)
        if os.getuid() == 0:  # a root-owned workspace runs as the image's user: give it one
            os.chown(base, SANDBOX_UID, SANDBOX_UID)
        plain = DockerBackend(pool_size=0)
        try:
            for i in range(QUICK_COLD_RUNS if quick else COLD_RUNS):
                await asyncio.sleep(SETTLE_S)
                cold.append(await _first_cell(plain, base, f"cold-{i}"))
            # Per-cell overhead: one docker and one local sandbox, interleaved rounds, so a
            # change in machine load hits both alike.
            local = LocalBackend(pool_size=0)
            try:
                dsb = await plain.create(_spec(base, "cells"))
                lsb = await local.create(_spec(base, "cells-local"))
                await _cells(dsb, WARMUP_CELLS)
                await _cells(lsb, WARMUP_CELLS)
                for _ in range(QUICK_CELL_ROUNDS if quick else CELL_ROUNDS):
                    d = await _cells(dsb, CELLS_PER_ROUND)
                    lo = await _cells(lsb, CELLS_PER_ROUND)
                    docker_cells += d
                    local_cells += lo
                    ratios.append(statistics.median(d) / statistics.median(lo))
                await dsb.stop()
                await lsb.stop()
            finally:
                await local.close()
            # Memory of idle containers that ran one cell each.
            sandboxes = [
                await plain.create(_spec(base, f"idle-{i}")) for i in range(IDLE_CONTAINERS)
            ]
            for sb in sandboxes:
                await sb.execute("x = 1", timeout_s=CELL_TIMEOUT_S, cell_id="one")
            await asyncio.sleep(IDLE_SETTLE_S)
            for sb in sandboxes:
                container = plain.docker.containers.get(sb.container_id)
                idle.append(await asyncio.to_thread(_idle_memory_bytes, container) / MIB)
                await sb.stop()
        finally:
            await plain.close()
        pooled = DockerBackend(pool_size=1)
        try:
            pooled.start_pool(base)
            assert pooled.pool is not None
            for i in range(QUICK_WARM_RUNS if quick else WARM_RUNS):
                await pooled.pool.wait_ready(POOL_READY_TIMEOUT_S)
                await asyncio.sleep(SETTLE_S)
                warm.append(await _first_cell(pooled, base, f"warm-{i}"))
            stats = pooled.pool.statistics()
        finally:
            await pooled.close()
    left = [c.name for c in list_owned() if c.session_id.startswith(SESSION_PREFIX)]
    left += [str(p) for p in Path(tempfile.gettempdir()).glob("prime-agent-dkr-*")]
    if left:
        raise RuntimeError(f"left behind: {', '.join(left)}")
    return {
        "rows": [
            row(
                "docker: cold create (container + gateway + kernel)",
                "s",
                [a for a, _ in cold],
            ),
            row("  first cell after a cold create", "s", [b for _, b in cold]),
            row(
                "docker: warm-pool acquisition (create)",
                "s",
                [a for a, _ in warm],
                target=WARM_TARGET_S,
            ),
            row("  first cell after a warm create", "s", [b for _, b in warm]),
            row(
                "docker / local per-cell time (round medians)",
                "×",
                ratios,
                target=CELL_RATIO_TARGET,
            ),
            row("  trivial cell through a container", "ms", [t * 1000 for t in docker_cells]),
            row("  trivial cell through the local backend", "ms", [t * 1000 for t in local_cells]),
            row("docker: memory per idle container", "MiB", idle),
        ],
        "notes": [
            f"cold: {len(cold)} runs; warm: {len(warm)} runs, pool hits {stats.hits}, misses "
            f"{stats.misses}; cells: {len(ratios)} rounds of {CELLS_PER_ROUND} `pass` cells "
            f"per backend; memory: {len(idle)} idle containers (docker stats, usage minus "
            "inactive file cache: gateway + kernel + docker-init).",
        ],
    }


def run(quick: bool = False) -> dict[str, Any]:
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    if not usable:
        return {"rows": [], "notes": [f"skipped: {why}"]}
    return asyncio.run(_bench(quick))
