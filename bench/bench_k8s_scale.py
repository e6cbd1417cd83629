"""``k8s_scale``: issue 21's scale check, by simulation (docs/kubernetes.md, "Scale").

Sessions: N short sessions (1,000; quick 40), ``CONCURRENCY`` at a time, through the
``KubernetesBackend`` and the official client over real HTTP to kmock's emulator, each one
``create`` -> one cell (``x = 1``) -> ``stop``. The emulator and its node run in a child process
(``bench/_k8s_cluster.py``): the emulator counts every request that reaches the orchestrator's
port, by verb, resource and object (tests/k8s_counting.py), and the node runs each pod's gateway
as a local process at a loopback IP of its own (tests/k8s_process_node.py). So this process is
the orchestrator alone, and its CPU time (user + system, all threads) per session is what one
orchestrator shard spends on a session's sandbox: the API calls, the watch, the gateway probe,
the kernel start and the cell over the gateway client. Not in it: the store, the bus, the
model, the sweep bookkeeping (``bench sweep`` measures those on the local backend), and
anything of the node or the pods.

Merge: ``sweep merge`` of ``MERGE_SHARDS`` shard exports of ``MERGE_CELLS`` scored cells with a
trial each (50 x 20 = 1,000 trials; quick 10 x 20), written as a shard's export is (Parquet,
``cli/sweep_files.write_rows``), read and merged into a new store (``read_exports``,
``merge_exports``) and reported (``write_sweep_report``), as the command does.

Checks (an ERROR, not numbers, when one fails): every cell ``ok``; the requests the server
counted equal those the backend's client says it made; no pod left in the emulator; the node
started every pod and none failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from bench.common import PYTHON, REPO_ROOT, row

SESSIONS: Final = 1000
SESSIONS_QUICK: Final = 40
ROUNDS: Final = 5  # CPU per session is sampled once per round
ROUNDS_QUICK: Final = 2
CONCURRENCY: Final = 4  # sessions in flight (a sweep's ``parallel``); more overloads 2 cores
NODE_CAPACITY: Final = 16  # pods the node runs at once
NAMESPACE: Final = "prime-agent"
INSTANCE: Final = "bench-k8s-scale"
CELL_TIMEOUT_S: Final = 60.0
CLUSTER_READY_TIMEOUT_S: Final = 60.0
MERGE_SHARDS: Final = 50
MERGE_SHARDS_QUICK: Final = 10
MERGE_CELLS: Final = 20  # cells (one trial each) per shard
MERGE_RUNS: Final = 3
MERGE_RUNS_QUICK: Final = 1
MERGE_SWEEP: Final = "bench-merge"
MS: Final = 1000.0
POD_PREFIX: Final = "prime-agent-scale-"  # k8s_manifests.pod_name of our session ids


class Cluster:
    """``bench._k8s_cluster`` as a child process."""

    def __init__(self, capacity: int) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "bench._k8s_cluster", "--capacity", str(capacity)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self._line())
        self.url: str = hello["url"]
        self.gateway_port: int = hello["gateway_port"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the emulated cluster exited ({self.proc.wait()})")
        return line

    def counts(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("counts\n")
        self.proc.stdin.flush()
        report: dict[str, Any] = json.loads(self._line())
        return report

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(CLUSTER_READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _sessions(cluster: Cluster, sessions: int, rounds: int, work: Path) -> dict[str, Any]:
    from kubernetes import client as k8s

    from orchestrator.errors import SandboxStartError
    from orchestrator.sandbox.base import SandboxSpec
    from orchestrator.sandbox.k8s_api import K8sApi
    from orchestrator.sandbox.kubernetes import KubernetesBackend
    from orchestrator.settings import KubernetesSettings

    backend = KubernetesBackend(
        K8sApi(k8s.ApiClient(k8s.Configuration(host=cluster.url)), NAMESPACE),
        instance=INSTANCE,
        settings=KubernetesSettings(namespace=NAMESPACE, gateway_port=cluster.gateway_port),
    )
    gate = asyncio.Semaphore(CONCURRENCY)
    walls: dict[str, list[float]] = {"create": [], "cell": [], "stop": []}
    names: list[str] = []
    failed: list[str] = []  # starts that failed (a loaded machine): counted, not fatal

    async def one(n: int) -> None:
        # Each session its own (empty) project and outputs: the pod gets a copy of the
        # project at start and gives it back at stop, as every session's does.
        own = work / f"scale-{n:05d}"
        (own / "workspace").mkdir(parents=True)
        spec = SandboxSpec(
            session_id=f"scale-{n:05d}", cwd=own / "workspace", artifacts_dir=own / "outputs"
        )
        async with gate:
            t0 = time.perf_counter()
            try:
                sandbox = await backend.create(spec)
            except SandboxStartError as exc:
                failed.append(str(exc))
                return
            t1 = time.perf_counter()
            try:
                result = await sandbox.execute("x = 1", timeout_s=CELL_TIMEOUT_S, cell_id="c")
                if result.status != "ok":
                    raise RuntimeError(f"session {n}: the cell ended {result.status}")
            finally:
                t2 = time.perf_counter()
                await sandbox.stop()
            walls["create"].append(t1 - t0)
            walls["cell"].append(t2 - t1)
            walls["stop"].append(time.perf_counter() - t2)
            names.append(sandbox.name)

    cpu_ms: list[float] = []
    per_s: list[float] = []
    per_round = [sessions // rounds + (1 if r < sessions % rounds else 0) for r in range(rounds)]
    first = 0
    try:
        for count in per_round:
            cpu, wall = _cpu_s(), time.perf_counter()
            await asyncio.gather(*(one(n) for n in range(first, first + count)))
            cpu_ms.append((_cpu_s() - cpu) / count * MS)
            per_s.append(count / (time.perf_counter() - wall))
            first += count
    finally:
        await backend.close()
    return {
        "walls": walls,
        "names": names,
        "failed": failed,
        "cpu_ms": cpu_ms,
        "per_s": per_s,
        "client_calls": sum(backend.api.calls.values()),
    }


def _session_rows(sessions: int, rounds: int) -> tuple[list[dict[str, Any]], list[str]]:
    cluster = Cluster(NODE_CAPACITY)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-k8s-scale-") as work:
            ran = asyncio.run(_sessions(cluster, sessions, rounds, Path(work)))
        counts = cluster.counts()
    finally:
        cluster.close()
    if counts["failed"]:
        raise RuntimeError(
            f"the node could not run {len(counts['failed'])} pod(s): {counts['failed'][0]}"
        )
    server_total = sum(counts["calls"].values())
    if server_total != ran["client_calls"]:
        raise RuntimeError(
            f"the server counted {server_total} requests, the client made {ran['client_calls']}"
        )
    # Every object the server heard of is a session's pod (its Secret and policy share the
    # name): a failed start counts too, its objects were created and deleted.
    per_session = [Counter(verbs) for verbs in counts["by_object"].values()]
    stray = [name for name in counts["by_object"] if not name.startswith(POD_PREFIX)]
    missing = set(ran["names"]) - set(counts["by_object"])
    if stray or missing or len(per_session) != sessions:
        raise RuntimeError(
            f"{len(per_session)} objects named at the server for {sessions} sessions "
            f"(not a session's: {stray[:3]}; sessions the server never saw: {sorted(missing)[:3]})"
        )

    def verbs(*names: str) -> list[float]:
        return [sum(c[v] for v in names) for c in per_session]

    rows = [
        row("API requests per session (at the server)", "requests", verbs(*_all_verbs(counts))),
        row("  creates (Secret, NetworkPolicy, Pod)", "requests", verbs("create")),
        row("  watch connections", "watches", verbs("watch")),
        row("  reads and lists (polls)", "requests", verbs("fetch", "list")),
        row("  deletes", "requests", verbs("delete")),
        row("orchestrator CPU per session", "ms", ran["cpu_ms"]),
        row(
            f"sessions per second ({CONCURRENCY} at once)",
            "sessions/s",
            ran["per_s"],
            higher_is_better=True,
        ),
        row("  create: objects, watch until Ready, kernel", "s", ran["walls"]["create"]),
        row("  one cell", "ms", [w * MS for w in ran["walls"]["cell"]]),
        row("  stop: three deletes", "ms", [w * MS for w in ran["walls"]["stop"]]),
    ]
    calls = ", ".join(f"{k} {v}" for k, v in sorted(counts["calls"].items()))
    notes = [
        f"{sessions} sessions, {CONCURRENCY} at once, node capacity {NODE_CAPACITY}; "
        f"{counts['started']} pods started; {len(ran['failed'])} start(s) failed"
        + (f" (first: {ran['failed'][0]})" if ran["failed"] else ""),
        f"requests at the server (all sessions): {calls}",
        f"median create {statistics.median(ran['walls']['create']):.2f} s; the emulator sends "
        "every pod's events to every watch (no field selectors), so each watch reads more events "
        "than it would from a real API server",
    ]
    return rows, notes


def _all_verbs(counts: dict[str, Any]) -> list[str]:
    return sorted({key.split(" ", 1)[0] for key in counts["calls"]})


def _write_exports(directory: Path, shards: int) -> None:
    from orchestrator.cli.sweep_files import write_rows
    from orchestrator.cli.sweep_shards import CELL_EXPORT_TYPES, TRIAL_EXPORT_TYPES
    from orchestrator.store.sweep_merge import CELL_COLUMNS
    from orchestrator.store.sweeps import TRIAL_COLUMNS
    from orchestrator.sweeps.shards import CELLS_SUFFIX, TRIALS_SUFFIX

    start = datetime(2026, 12, 4, tzinfo=UTC)
    spec = json.dumps({"name": MERGE_SWEEP, "seeds": [1]})
    total = shards * MERGE_CELLS
    identity = ("sweep", "digest", "spec", "shard", "shards", "cells_total")
    for shard in range(shards):
        cells, trials = [], []
        for k in range(MERGE_CELLS):
            n = shard * MERGE_CELLS + k
            at = (start + timedelta(seconds=n)).isoformat()
            cell = {
                "sweep": MERGE_SWEEP,
                "digest": "d" * 64,
                "spec": spec,
                "shard": shard,
                "shards": shards,
                "cells_total": total,
                "fingerprint": f"{n:064x}",
                "suite": "s-niah",
                "task_id": f"s-niah/300/{n}",
                "model": "openai/fake",
                "variant": "vanilla",
                "seed": 1,
                "context_tokens": 300,
                "state": "scored",
                "score": float(n % 2),
                "answer": str(n),
                "tokens": 400,
                "cost_usd": 0.0,
                "cost_known": True,
                "wall_s": 1.5,
                "stop_reason": "completed",
                "error_class": None,
                "truncated": False,
                "session_id": f"sess-{n}",
                "trials": 1,
                "position": n,
                "updated_at": at,
            }
            cells.append(cell)
            trial = {c: cell.get(c) for c in TRIAL_COLUMNS}
            trials.append(
                {
                    **trial,
                    "id": f"trial-{n}",
                    "digest": "d" * 64,
                    "started_at": at,
                    "finished_at": at,
                }
            )
        stem = directory / f"{MERGE_SWEEP}.shard-{shard}-of-{shards}"
        trial_fields = ("digest", *TRIAL_COLUMNS)
        write_rows(
            trials, Path(f"{stem}{TRIALS_SUFFIX}"), "parquet", trial_fields, TRIAL_EXPORT_TYPES
        )
        cell_fields = (*identity, *CELL_COLUMNS)
        write_rows(cells, Path(f"{stem}{CELLS_SUFFIX}"), "parquet", cell_fields, CELL_EXPORT_TYPES)


def _merge_rows(shards: int, runs: int) -> tuple[list[dict[str, Any]], list[str]]:
    from orchestrator.cli.sweep_reports import write_sweep_report
    from orchestrator.cli.sweep_shards import find_exports, merge_exports, read_exports

    timings: dict[str, list[float]] = {"read": [], "merge": [], "report": [], "again": []}
    with tempfile.TemporaryDirectory(prefix="bench-k8s-merge-") as work:
        exports = Path(work) / "exports"
        _write_exports(exports, shards)
        for run in range(runs):
            into = Path(work) / f"merged-{run}.duckdb"
            t0 = time.perf_counter()
            found = read_exports(find_exports([exports]))
            t1 = time.perf_counter()
            counts, cells = asyncio.run(merge_exports(found, into))
            t2 = time.perf_counter()
            write_sweep_report(MERGE_SWEEP, cells, Path(work) / f"report-{run}")
            t3 = time.perf_counter()
            again, _ = asyncio.run(merge_exports(found, into))  # merging twice adds nothing
            t4 = time.perf_counter()
            expected = shards * MERGE_CELLS
            if (counts.cells_added, counts.trials_added, counts.state) != (
                expected,
                expected,
                "done",
            ):
                raise RuntimeError(f"the merge made {counts}, not {expected} cells and trials")
            if again.cells_added or again.trials_added:
                raise RuntimeError(f"merging again added {again}")
            for key, took in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                timings[key].append(took * MS)
    what = f"{shards} shards x {MERGE_CELLS} trials"
    rows = [
        row(
            f"sweep merge, {what}: read, merge, report",
            "ms",
            [sum(x) for x in zip(*(timings[k] for k in ("read", "merge", "report")), strict=True)],
        ),
        row("  read the Parquet exports", "ms", timings["read"]),
        row("  merge into a new store (one transaction)", "ms", timings["merge"]),
        row("  write the report", "ms", timings["report"]),
        row("  merge the same shards again (adds nothing)", "ms", timings["again"]),
    ]
    return rows, [f"merge: {what} = {shards * MERGE_CELLS} cells and trials, {runs} run(s)"]


def run(quick: bool = False, sessions: int | None = None) -> dict[str, Any]:
    count = sessions or (SESSIONS_QUICK if quick else SESSIONS)
    rounds = min(count, ROUNDS_QUICK if quick else ROUNDS)
    session_rows, session_notes = _session_rows(count, rounds)
    shards = MERGE_SHARDS_QUICK if quick else MERGE_SHARDS
    merge_rows, merge_notes = _merge_rows(shards, MERGE_RUNS_QUICK if quick else MERGE_RUNS)
    return {"rows": session_rows + merge_rows, "notes": session_notes + merge_notes}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_k8s_scale")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sessions", type=int, default=None, help="sessions to drive")
    args = parser.parse_args()
    print(json.dumps(run(args.quick, args.sessions), indent=1))


if __name__ == "__main__":
    main()
