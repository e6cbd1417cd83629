"""Per-tool-call harness overhead: what the agent loop adds to each model call + cell.

One run = ``run_session`` (the code path of ``prime-agent -p``: real DuckDB store, real Kernel
Gateway sandbox from ``LocalBackend``, litellm over loopback HTTP) against the fake model
server in its own process, scripted to ask for ``N_CELLS`` trivial cells (``x = 1`` and
``x = 2`` in turn) and then answer with text. The sink timestamps every committed event as it
happens.

Definitions (per tool call; the first call is left out because it waits for the cold sandbox
and litellm's lazy set-up, so the window is tool_result #1 → tool_result #N, N−1 calls):

- step time: tool_result(i−1) committed → tool_result(i) committed. One step is: build the
  context, model call, record assistant_message + usage, run the cell, record tool_result.
- model server time: what the server spent on request i (request parsed → last byte written),
  measured inside the server process.
- model-call latency (client): ``usage.latency_ms``, litellm's ``acompletion`` until the
  stream's last chunk, as the client sees it (server time + HTTP + litellm parsing).
- harness overhead (the issue's definition) = (window wall time − Σ model server time) / calls.
  Everything that is not the model: litellm's client side, the store, the loop, the cell round
  trip through the gateway and the kernel's own execution of ``x = 1``.
- loop overhead excluding litellm = step time − model-call latency (the cell round trip plus
  our own bookkeeping).
- store appends: the three commits of a step (assistant_message, usage, tool_result), timed
  by wrapping ``Store.append`` for the run (call → committed).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import FakeServerProcess, row

__all__ = ["run"]

N_CELLS = 50
RUNS = 5
QUICK_RUNS = 3
WARMUP_CELLS = 3
REFERENCE_MS = 48.0
TARGET_MS = 10.0
TASK = "benchmark: run the trivial cells"
# The records each tool-call step commits.
STEP_RECORDS = ("assistant_message", "usage", "tool_result")


@contextlib.contextmanager
def _timed_appends() -> Iterator[dict[str, list[float]]]:
    """Times every ``Store.append`` (call → committed) while active, by event type."""
    from orchestrator.store.db import Store

    original = Store.append
    times: dict[str, list[float]] = {}

    async def timed(self: Store, session_id: str, type_: Any, payload: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return await original(self, session_id, type_, payload, **kw)
        finally:
            times.setdefault(type_, []).append((time.perf_counter() - start) * 1000.0)

    Store.append = timed  # type: ignore[method-assign, assignment]
    try:
        yield times
    finally:
        Store.append = original  # type: ignore[method-assign]


def _script(cells: int) -> str:
    # Two cells in turn: the same cell over and over would stop the turn as stuck
    # (orchestrator/agent/stuck.py).
    pairs, odd = divmod(cells, 2)
    tail = "code: x = 1\n---\n" if odd else ""
    return f"repeat {pairs}:\n    code: x = 1\n    ---\n    code: x = 2\n---\n{tail}text: done\n"


async def _one_run(srv: FakeServerProcess, base: Path, cells: int) -> dict[str, Any]:
    from orchestrator.models.registry import resolve_model
    from orchestrator.paths import Paths
    from orchestrator.sessions.runner import RunOptions, run_session
    from orchestrator.settings import Settings

    paths = Paths(
        config_dir=base / "config",
        data_dir=base / "data",
        cache_dir=base / "cache",
        runtime_dir=base / "run",
    )
    settings = Settings()
    model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
    srv.load(_script(cells))
    before = len(srv.timings())
    marks: list[tuple[str, float, dict[str, Any]]] = []

    def sink(event: dict[str, Any]) -> None:
        if "payload" in event:  # committed records; text deltas have none
            marks.append((event["type"], time.perf_counter(), event["payload"]))

    with _timed_appends() as appends:
        started = time.perf_counter()
        result = await run_session(
            RunOptions(task=TASK, cwd=base, backend="local"), model, settings, paths, sink=sink
        )
        total_s = time.perf_counter() - started
    if result.outcome.reason != "completed":
        raise RuntimeError(f"the benchmark session ended with {result.outcome.reason}")
    server = srv.timings(before + cells + 1)[before:]
    results = [(t, p) for kind, t, p in marks if kind == "tool_result"]
    usages = [p for kind, _, p in marks if kind == "usage"]
    if len(results) != cells or len(usages) != cells + 1 or len(server) != cells + 1:
        raise RuntimeError(
            f"expected {cells} cells and {cells + 1} model calls, got {len(results)} cells, "
            f"{len(usages)} usage records, {len(server)} server timings"
        )
    if any(p["status"] != "ok" for _, p in results):
        raise RuntimeError("a benchmark cell did not succeed")
    step = [(results[i][0] - results[i - 1][0]) * 1000.0 for i in range(1, cells)]
    client = [float(usages[i]["latency_ms"]) for i in range(1, cells)]
    cell = [float(results[i][1]["duration_ms"]) for i in range(1, cells)]
    store = [sum(appends[kind][i] for kind in STEP_RECORDS) for i in range(1, cells)]
    window_ms = (results[-1][0] - results[0][0]) * 1000.0
    return {
        "step": step,
        "server": server[1:cells],
        "client": client,
        "cell": cell,
        "store": store,
        "overhead_per_call": (window_ms - sum(server[1:cells])) / (cells - 1),
        "whole_run_per_call": (total_s * 1000.0 - sum(server)) / cells,
    }


async def _bench(runs: int, cells: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        base = Path(tmp)
        with FakeServerProcess(_script(cells), base) as srv:
            # Warm-up: litellm's import and its lazy first-call set-up are not per-call costs.
            from orchestrator.models.lite import load_litellm

            await asyncio.to_thread(load_litellm)
            await _one_run(srv, base, WARMUP_CELLS)
            return [await _one_run(srv, base, cells) for _ in range(runs)]


def run(quick: bool = False) -> dict[str, Any]:
    runs = QUICK_RUNS if quick else RUNS
    done = asyncio.run(_bench(runs, N_CELLS))

    def pooled(key: str) -> list[float]:
        return [v for r in done for v in r[key]]

    step, server, client = pooled("step"), pooled("server"), pooled("client")
    cell, store = pooled("cell"), pooled("store")
    no_litellm = [s - c for s, c in zip(step, client, strict=True)]
    rest = [s - c - k - a for s, c, k, a in zip(step, client, cell, store, strict=True)]
    per_step_overhead = [s - v for s, v in zip(step, server, strict=True)]
    whole = [r["whole_run_per_call"] for r in done]
    return {
        "rows": [
            row(
                "harness overhead per tool call (mean per run)",
                "ms",
                [r["overhead_per_call"] for r in done],
                reference=REFERENCE_MS,
                target=TARGET_MS,
            ),
            row("  same, per step", "ms", per_step_overhead),
            row("  step time (model call + cell + records)", "ms", step),
            row("  model server time (server side)", "ms", server),
            row("  model-call latency (client, litellm)", "ms", client),
            row("  loop overhead excluding litellm", "ms", no_litellm),
            row("  cell round trip (gateway + kernel)", "ms", cell),
            row("  store appends (log commits of a step)", "ms", store),
            row("  the rest (context, shaping, loop)", "ms", rest),
        ],
        "notes": [
            f"{runs} runs of {N_CELLS} `x = 1` cells through run_session (steady-state window "
            f"of {N_CELLS - 1} calls per run); 'per step' rows pool all steps of all runs.",
            "harness overhead = (window wall − Σ model server time) / calls: litellm's client "
            "side, the store, the loop and the cell round trip; only the server is excluded.",
            f"median litellm client cost per call (latency − server time): "
            f"{statistics.median(client) - statistics.median(server):.1f} ms.",
            f"whole run incl. cold sandbox start, per call: {statistics.median(whole):.1f} ms "
            "(median over runs).",
        ],
    }
