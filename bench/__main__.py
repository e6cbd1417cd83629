"""The bench runner: ``python -m bench [--quick] [--with-embedded] [NAME ...]``.

Runs the chosen benchmarks (all by default) one after another, prints each one's table as it
finishes and a summary of the rows that have a reference or a target, and writes everything
(raw samples included) to ``bench/results/latest.json``.

Self-check: after each benchmark, any process still descended from this one is a leftover.
The runner is a child subreaper, so a leftover whose parent already exited (a CLI's gateway)
is found too; it is reported, stopped, and the run exits 1. Sandbox runtime dirs go to a
private ``TMPDIR``, and any ``prime-agent-sbx-*`` dir left in it is reported the same way.
Missing a target never changes the exit status: these are measurements, not tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, reap_leftovers, set_child_subreaper, summarize

RESULTS_FILE = REPO_ROOT / "bench" / "results" / "latest.json"
SANDBOX_DIR_GLOB = "prime-agent-sbx-*"
# Before each benchmark (when none of ours runs) the CPUs are watched for BUSY_WINDOW_S; more
# than BUSY_CPUS of them busy means someone else is using the machine, worth a warning. (The
# load average would mostly report the previous benchmark.)
BUSY_WINDOW_S = 0.5
BUSY_CPUS = 0.3
NAME_WIDTH = 52


def _overhead(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_overhead

    return bench_overhead.run(a.quick)


def _cold_start(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_cold_start

    return bench_cold_start.run(a.quick)


def _first_cell(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_first_cell

    return bench_first_cell.run(a.quick)


def _memory(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_memory

    return bench_memory.run(a.quick, with_embedded=a.with_embedded)


def _family(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_family

    return bench_family.run(a.quick)


def _store(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_store

    return bench_store.run(a.quick)


def _daemon(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_daemon

    return bench_daemon.run(a.quick)


def _context(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_context

    return bench_context.run(a.quick)


def _docker(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_docker

    return bench_docker.run(a.quick)


def _bwrap(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_bwrap

    return bench_bwrap.run(a.quick)


def _sweep(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_sweep

    return bench_sweep.run(a.quick)


def _k8s_scale(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_k8s_scale

    return bench_k8s_scale.run(a.quick)


def _tui(a: argparse.Namespace) -> dict[str, Any]:
    from bench import bench_tui

    return bench_tui.run(a.quick)


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.Namespace], dict[str, Any]]]] = {
    "overhead": ("per-tool-call harness overhead (50 trivial cells)", _overhead),
    "cold_start": ("cold start of prime-agent -p against the fake model", _cold_start),
    "first_cell": ("first-cell latency, warm pool and cold", _first_cell),
    "memory": ("peak RSS of a -p run's process tree", _memory),
    "store": ("DuckDB store append throughput", _store),
    "context": ("context assembly 1k/10k/100k events; compaction without the model", _context),
    "family": ("subagent admission, host requests, message delivery", _family),
    "docker": ("docker backend: cold/warm start, per-cell overhead, idle memory", _docker),
    "bwrap": ("bwrap backend vs local and docker: first cell, per-cell round trip", _bwrap),
    "daemon": ("daemon: -p through it, attach latency, events/s, RSS", _daemon),
    "tui": ("TUI: transcript fold, replay render, streamed answer (no daemon)", _tui),
    "sweep": ("sweep: one-step cells through the daemon, cells/s, CPU and memory", _sweep),
    "k8s_scale": (
        "kubernetes: 1,000 sessions through the emulator (API calls, CPU), shard merge",
        _k8s_scale,
    ),
}


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'':<{NAME_WIDTH}} {'median':>9} {'p90':>9} {'unit':<9} {'reference':>9} "
        f"{'ratio':>7} {'target':>8}  meets target"
    )
    lines = [head]
    for r in rows:
        ratio = f"{r['ratio']:.2f}×" if r.get("ratio") is not None else "-"
        meets = {True: "yes", False: "no", None: "-"}[r.get("meets")]
        target = r.get("target")
        target_text = (
            "-" if target is None else ("≥" if r["higher_is_better"] else "≤") + _fmt(target)
        )
        lines.append(
            f"{r['name'][:NAME_WIDTH]:<{NAME_WIDTH}} {_fmt(r.get('median')):>9} "
            f"{_fmt(r.get('p90')):>9} {r['unit']:<9} {_fmt(r.get('reference')):>9} "
            f"{ratio:>7} {target_text:>8}  {meets}"
        )
    return "\n".join(lines)


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _busy_cpus(window_s: float = BUSY_WINDOW_S) -> float | None:
    """How many CPUs' worth of work other processes do right now (None off Linux)."""
    try:
        busy0, total0 = _cpu_times()
        time.sleep(window_s)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return 0.0
    return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def _machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rev = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_rev": rev,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Prime Agent benchmarks: medians and ratios against reference figures.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (all)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~3 min)")
    parser.add_argument(
        "--with-embedded",
        action="store_true",
        help="memory: also a run on the embedded llama.cpp model (slow; needs the local extra)",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--output", type=Path, default=RESULTS_FILE, help=f"JSON results (default {RESULTS_FILE})"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    return args


def _run_one(name: str, args: argparse.Namespace, tmp_root: Path) -> dict[str, Any]:
    title, fn = BENCHMARKS[name]
    busy = _busy_cpus()
    print(f"\n== {name}: {title} ==", flush=True)
    if busy is not None and busy > BUSY_CPUS:
        print(
            f"   (machine busy: other processes use {busy:.1f} of {os.cpu_count()} CPUs "
            "just before this benchmark; its numbers may run high)"
        )
    started = time.perf_counter()
    entry: dict[str, Any] = {"title": title, "rows": [], "notes": [], "error": None}
    try:
        result = fn(args)
        entry["rows"] = [summarize(r) for r in result["rows"]]
        entry["notes"] = list(result.get("notes", []))
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["other_busy_cpus_before"] = None if busy is None else round(busy, 2)
    entry["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    leftovers = reap_leftovers()
    leftovers += [f"runtime dir {p}" for p in sorted(tmp_root.glob(SANDBOX_DIR_GLOB))]
    entry["leftovers"] = leftovers
    if entry["rows"]:
        print(_table(entry["rows"]))
    for note in entry["notes"]:
        print(f"   - {note}")
    if entry["error"]:
        print(f"   ERROR: {entry['error']}")
    for item in leftovers:
        print(f"   LEFTOVER (stopped): {item}")
    idle = "-" if busy is None else f"{busy:.2f}"
    print(f"   [{entry['seconds']:.0f} s; CPUs busy before it: {idle}]", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name, (title, _) in BENCHMARKS.items():
            print(f"{name:<12} {title}")
        return 0
    names = args.names or list(BENCHMARKS)
    subreaper = set_child_subreaper()
    # Sandboxes (in this process and under the CLI) make their runtime dirs in $TMPDIR:
    # a private one shows whether any is left behind.
    tmp_root = Path(tempfile.mkdtemp(prefix="prime-agent-bench-"))
    os.environ["TMPDIR"] = str(tmp_root)
    tempfile.tempdir = None
    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": _machine(),
        "subreaper": subreaper,
        "benchmarks": {},
    }
    m = report["machine"]
    print(
        f"prime-agent benchmarks{' (quick)' if args.quick else ''}: {m['cpus']} CPUs "
        f"{m['cpu_model']}, python {m['python']}, rev {m['git_rev'] or '?'}"
    )
    try:
        for name in names:
            report["benchmarks"][name] = _run_one(name, args, tmp_root)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    report["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")

    headline = [
        r
        for entry in report["benchmarks"].values()
        for r in entry["rows"]
        if r.get("reference") is not None or r.get("target") is not None
    ]
    if headline:
        print("\n== summary (rows with a reference or a target) ==")
        print(_table(headline))
    failed = [n for n, e in report["benchmarks"].items() if e["error"]]
    leftover = [n for n, e in report["benchmarks"].items() if e["leftovers"]]
    verdict = "no leftover processes or sandbox dirs"
    if leftover:
        verdict = "LEFTOVERS after " + ", ".join(leftover)
    if failed:
        verdict += "; errors in " + ", ".join(failed)
    print(f"\nself-check: {verdict}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"results: {args.output}")
    return 1 if failed or leftover else 0


if __name__ == "__main__":
    sys.exit(main())
