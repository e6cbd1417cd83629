"""The bwrap backend's costs against local and docker, in the same run (docs/benchmarks.md):

- **first cell**: ``backend.create(spec)`` -> the first ``execute`` done (one cold sandbox,
  no warm pool: ``pool_size=0`` on every backend), per backend, in interleaved runs so that a
  change in machine load hits all three alike; the headlines are the per-run ratios
  bwrap / local and bwrap / docker;
- **per-cell round trip**: one sandbox per backend, interleaved rounds of trivial cells
  (``pass``) after a few warm-up cells; the headlines are each round's bwrap median over the
  local median and over the docker median.

The docker rows are left out with a note when no Docker engine answers or the session image is
missing (it is never built here: ``make images``); the whole benchmark is skipped with a note
when bwrap cannot run a sandbox here. A sandbox runtime dir left behind is an error.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.common import row

__all__ = ["run"]

FIRST_CELL_RUNS: Final = 5
QUICK_FIRST_CELL_RUNS: Final = 3
CELL_ROUNDS: Final = 5
QUICK_CELL_ROUNDS: Final = 3
CELLS_PER_ROUND: Final = 40
WARMUP_CELLS: Final = 5
CELL_TIMEOUT_S: Final = 60.0
SETTLE_S: Final = 0.3  # between cold starts: the previous sandbox's teardown finishes
SESSION_PREFIX: Final = "bench-bwr-"
SANDBOX_UID: Final = 1000  # a root-owned workspace is handed to the sandbox's user
BWRAP: Final = "bwrap"
LOCAL: Final = "local"
DOCKER: Final = "docker"
MS: Final = 1000.0


def _spec(base: Path, name: str) -> Any:
    from orchestrator.sandbox.base import SandboxSpec

    return SandboxSpec(
        session_id=f"{SESSION_PREFIX}{name}", cwd=base, artifacts_dir=base / "artifacts"
    )


def _docker_why_not() -> str | None:
    """None when an engine answers and the session image exists, else why not."""
    from orchestrator.sandbox.docker import docker_usable

    usable, why = docker_usable()
    return None if usable else why


def _bwrap_why_not() -> str | None:
    """None when bwrap runs a trivial sandbox here (the backend's probe), else why not."""
    from orchestrator.sandbox.bwrap_probe import bwrap_usable

    usable, why = bwrap_usable()
    return None if usable else why


def _backends(with_docker: bool) -> dict[str, Any]:
    from orchestrator.sandbox.bwrap import BwrapBackend
    from orchestrator.sandbox.local import LocalBackend

    backends: dict[str, Any] = {LOCAL: LocalBackend(pool_size=0), BWRAP: BwrapBackend(pool_size=0)}
    if with_docker:
        from orchestrator.sandbox.docker import DockerBackend

        backends[DOCKER] = DockerBackend(pool_size=0)
    return backends


async def _first_cell(backend: Any, base: Path, name: str) -> float:
    """create -> first cell done, in seconds; the sandbox is stopped afterwards (not timed)."""
    start = time.perf_counter()
    sandbox = await backend.create(_spec(base, name))
    try:
        result = await sandbox.execute("x = 1", timeout_s=CELL_TIMEOUT_S, cell_id="first")
        done = time.perf_counter()
    finally:
        await sandbox.stop()
    if result.status != "ok":
        raise RuntimeError(f"{backend.name}: the first cell ended with {result.status}")
    return done - start


async def _cells(sandbox: Any, count: int) -> list[float]:
    times = []
    for i in range(count):
        start = time.perf_counter()
        result = await sandbox.execute("pass", timeout_s=CELL_TIMEOUT_S, cell_id=f"c{i}")
        times.append(time.perf_counter() - start)
        if result.status != "ok":
            raise RuntimeError(f"a trivial cell ended with {result.status}")
    return times


def _ratios(a: list[list[float]], b: list[list[float]]) -> list[float]:
    """Per run (or round): the median of ``a`` over the median of ``b``."""
    return [statistics.median(x) / statistics.median(y) for x, y in zip(a, b, strict=True)]


async def _bench(quick: bool, with_docker: bool) -> dict[str, Any]:
    names = [LOCAL, BWRAP] + ([DOCKER] if with_docker else [])
    first: dict[str, list[list[float]]] = {n: [] for n in names}
    cells: dict[str, list[list[float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="bench-bwrap-") as tmp:
        base = Path(tmp)
        if os.getuid() == 0:  # a root-owned workspace runs as the sandbox's user: give it one
            os.chown(base, SANDBOX_UID, SANDBOX_UID)
        backends = _backends(with_docker)
        try:
            for i in range(QUICK_FIRST_CELL_RUNS if quick else FIRST_CELL_RUNS):
                for name in names:
                    await asyncio.sleep(SETTLE_S)
                    first[name].append([await _first_cell(backends[name], base, f"{name}-{i}")])
            sandboxes = {n: await backends[n].create(_spec(base, f"cells-{n}")) for n in names}
            try:
                for sandbox in sandboxes.values():
                    await _cells(sandbox, WARMUP_CELLS)
                for _ in range(QUICK_CELL_ROUNDS if quick else CELL_ROUNDS):
                    for name in names:
                        cells[name].append(await _cells(sandboxes[name], CELLS_PER_ROUND))
            finally:
                for sandbox in sandboxes.values():
                    await sandbox.stop()
        finally:
            for backend in backends.values():
                await backend.close()
    from orchestrator.sandbox.bwrap_owned import RUNTIME_DIR_PREFIX

    left = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{RUNTIME_DIR_PREFIX}*")]
    if left:
        raise RuntimeError(f"left behind: {', '.join(left)}")
    rows = [
        row("first cell: bwrap / local (per run)", "×", _ratios(first[BWRAP], first[LOCAL])),
    ]
    if with_docker:
        rows.append(
            row("first cell: bwrap / docker (per run)", "×", _ratios(first[BWRAP], first[DOCKER]))
        )
    rows += [row(f"  create + first cell, {n}", "s", [run[0] for run in first[n]]) for n in names]
    rows.append(
        row("per-cell: bwrap / local (round medians)", "×", _ratios(cells[BWRAP], cells[LOCAL]))
    )
    if with_docker:
        rows.append(
            row(
                "per-cell: bwrap / docker (round medians)",
                "×",
                _ratios(cells[BWRAP], cells[DOCKER]),
            )
        )
    rows += [
        row(f"  trivial cell, {n}", "ms", [t * MS for rnd in cells[n] for t in rnd]) for n in names
    ]
    runs = len(first[BWRAP])
    return {
        "rows": rows,
        "notes": [
            f"first cell: {runs} interleaved cold runs per backend (create -> `x = 1` done, no "
            f"warm pool); cells: {len(cells[BWRAP])} interleaved rounds of {CELLS_PER_ROUND} "
            f"`pass` cells per backend after {WARMUP_CELLS} warm-up cells.",
        ],
    }


def run(quick: bool = False) -> dict[str, Any]:
    why = _bwrap_why_not()
    if why is not None:
        return {"rows": [], "notes": [f"skipped: bwrap: {why}"]}
    docker_why = _docker_why_not()
    result = asyncio.run(_bench(quick, with_docker=docker_why is None))
    if docker_why is not None:
        result["notes"].append(f"no docker rows: {docker_why}")
    return result
