"""Peers side by side (issue 18 item 6): ``python -m bench.peers`` (``make bench-peers``).

Installs smolagents and rlms (pinned, from PyPI, with pip) into their own venv,
``bench/.venv-peers`` (gitignored; made once, reused while its stamp matches the pins), and
runs the same scenarios for them and for us on the project's scripted model (the fake model
server in its own process, OpenAI-compatible, TCP_NODELAY set). Nothing else is reached.

Scenarios (each a median over ``--runs`` runs):

- step gap: a task of ``--steps`` trivial code steps then a final answer; the gap between
  consecutive finished steps (model call + code run + bookkeeping). Ours: ``run_session`` in
  process, as ``bench_overhead`` measures it. Peers: their own step hooks.
- cold ``-p``: a fresh process that answers one prompt and exits (spawn → exit). Ours:
  ``prime-agent -p hi --no-daemon``-equivalent (no daemon running), fresh XDG dirs. Peers: the
  same one-answer task in a fresh interpreter.
- memory: peak RSS summed over the process tree of a ``--steps`` run. Ours also without the
  Kernel Gateway and kernel (the peers' REPL runs in their own process, ours in a sandbox).

- concurrent: ``--sessions`` N sessions × ``bench_concurrent.STEPS`` steps through one daemon,
  against N peer processes started at once (``bench_concurrent`` says what each figure is):
  step gap p50 and p95, first cell p50, wall; and our daemon's CPU per step.

Ratios: ours/peer per scenario, and ours/floor for the step gap, the floor being the cell
round trip through the Kernel Gateway (the ``cell`` time ``bench_overhead`` records).
Not measured yet: warm ``-p`` through a running daemon (``bench_daemon`` has it, without
peers). These are measurements, never pass/fail.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench import bench_concurrent
from bench.common import (
    REPO_ROOT,
    FakeServerProcess,
    TreeSampler,
    cli_argv,
    cli_env,
    private_xdg,
    reap_leftovers,
    set_child_subreaper,
)
from bench.peer_process import PEER_PYTHON, PEERS_VENV, spawn, step_ends

__all__ = ["main"]

STAMP: Final = PEERS_VENV / ".installed"
PINS: Final = ("smolagents[openai]==1.26.0", "rlms==0.1.3")
PEERS: Final = ("smolagents", "rlms")
RESULTS_FILE: Final = REPO_ROOT / "bench" / "results" / "peers.json"
DEFAULT_RUNS: Final = 3
DEFAULT_STEPS: Final = 20
INSTALL_TIMEOUT_S: Final = 1800.0
PEER_RUN_TIMEOUT_S: Final = 300.0
OURS_RUN_TIMEOUT_S: Final = 300.0
MS_PER_S: Final = 1000.0
KIB_PER_MIB: Final = 1024.0
# Roles of our process tree that are the sandbox, not the host side.
SANDBOX_ROLES: Final = ("gateway", "kernel")
SCENARIOS: Final = ("step_gap", "cold_p", "memory", "concurrent")
SINGLE_SCENARIOS: Final = frozenset({"step_gap", "cold_p", "memory"})  # use the peers' step runs
DEFAULT_SESSIONS: Final = "20,50"
COL: Final = 12
P95: Final = 0.95


# --- the peers' venv ------------------------------------------------------------------------


def ensure_peers_venv() -> None:
    """``bench/.venv-peers`` with ``PINS`` installed; rebuilt only when the pins change."""
    if STAMP.exists() and STAMP.read_text() == "\n".join(PINS):
        return
    if not PEER_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    has_pip = subprocess.run([str(PEER_PYTHON), "-m", "pip", "--version"], capture_output=True)
    if has_pip.returncode != 0:  # a venv made without pip (uv venv)
        subprocess.run([str(PEER_PYTHON), "-m", "ensurepip"], check=True)
    print(f"installing {', '.join(PINS)} into {PEERS_VENV} (PyPI) ...", flush=True)
    subprocess.run(
        [str(PEER_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    STAMP.write_text("\n".join(PINS))


# --- scripts for the scripted model ------------------------------------------------------------


def _fence(code: str) -> str:
    """A ```repl block as rlms reads one, as the text of a script step."""
    lines = ["```repl", *code.splitlines(), "```"]
    return "text:\n" + "\n".join("    " + line for line in lines)


def _indent(step: str) -> str:
    return "\n".join("    " + line for line in step.splitlines())


def peer_script(peer: str, steps: int) -> str:
    """``steps`` trivial code steps (two cells in turn), then the peer's way to answer."""
    if peer == "smolagents":
        one, two, final = "code: x = 1", "code: x = 2", 'code: final_answer("done")'
    else:
        one, two = _fence("x = 1"), _fence("x = 2")
        final = _fence('answer["content"] = "done"\nanswer["ready"] = True')
    pairs, odd = divmod(steps, 2)
    parts = []
    if pairs:
        parts.append(f"repeat {pairs}:\n{_indent(one)}\n    ---\n{_indent(two)}")
    if odd:
        parts.append(one)
    parts.append(final)
    return "\n---\n".join(parts) + "\n"


# --- one peer run -------------------------------------------------------------------------------


def run_peer(peer: str, srv: FakeServerProcess, steps: int, cwd: Path) -> dict[str, Any]:
    """One peer run: wall seconds, step end times, peak RSS of its process tree."""
    srv.load(peer_script(peer, steps))
    started = time.perf_counter()
    proc = spawn(peer, srv.url, cwd)
    sampler = TreeSampler(proc.pid).start()
    try:
        out, err = proc.communicate(timeout=PEER_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        sampler.stop()
    wall = time.perf_counter() - started
    ends = step_ends(peer, proc, out, err, steps)
    gaps = [(b - a) * MS_PER_S for a, b in itertools.pairwise(ends)]
    return {"wall_s": wall, "gaps_ms": gaps, "peak_rss_mib": sampler.peak_rss_kib / KIB_PER_MIB}


# --- ours -----------------------------------------------------------------------------------------


def ours_step_gap(runs: int, steps: int) -> tuple[list[float], list[float]]:
    """(step gaps, cell round trips through the gateway), ms, pooled over runs."""
    import asyncio

    from bench import bench_overhead

    done = asyncio.run(bench_overhead._bench(runs, steps))
    return [v for r in done for v in r["step"]], [v for r in done for v in r["cell"]]


def ours_cold_p(runs: int, base: Path) -> list[float]:
    from bench import bench_cold_start

    with FakeServerProcess(bench_cold_start.SCRIPT, base) as srv:
        bench_cold_start._one(srv.url, base)  # page cache warm, as for the peers
        return [bench_cold_start._one(srv.url, base)[1] for _ in range(runs)]


def ours_memory(
    runs: int, steps: int, base: Path
) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """(peak RSS of the whole tree, of the host side without gateway and kernel, MiB by role at
    the peak). A sandbox started in a scope of its own is outside the tree and counts in
    neither."""
    from bench import bench_memory, bench_overhead

    whole, host, roles = [], [], []
    with FakeServerProcess(bench_overhead._script(steps), base) as srv:
        for _ in range(runs):
            srv.load(bench_overhead._script(steps))
            with private_xdg(base) as xdg:
                cwd = Path(xdg["XDG_DATA_HOME"]).parent
                argv = cli_argv("peer bench task", srv.url)
                r = bench_memory._sampled_run(argv, cli_env(xdg), cwd, OURS_RUN_TIMEOUT_S)
            whole.append(r["peak_rss_mib"])
            sandbox = sum(r["at_peak_mib"].get(role, 0.0) for role in SANDBOX_ROLES)
            host.append(r["peak_rss_mib"] - sandbox)
            roles.append(dict(r["at_peak_mib"]))
    return whole, host, roles


def concurrent_rows(
    counts: list[int], peers: list[str], base: Path, model_workers: int | None = None
) -> list[dict[str, Any]]:
    """Per session count: step gap p50 and p95, first cell, wall, our daemon CPU per step (and
    its model-call workers')."""
    rows: list[dict[str, Any]] = []
    for n in counts:
        print(f"concurrent: {n} sessions ...", flush=True)
        ours = bench_concurrent.ours(n, base, model_workers)
        theirs = {p: bench_concurrent.peers(p, n, base) for p in peers}
        gaps = {p: theirs[p]["gaps_ms"] for p in peers}
        rows.append(
            {
                "name": f"{n} at once: step gap p50",
                "unit": "ms",
                "ours": ours["gaps_ms"],
                "peers": gaps,
            }
        )
        rows.append(
            {
                "name": f"{n} at once: step gap p95",
                "unit": "ms",
                "ours": [_p95(ours["gaps_ms"])],
                "peers": {p: [_p95(g)] for p, g in gaps.items()},
            }
        )
        rows.append(
            {
                "name": f"{n} at once: first cell p50",
                "unit": "ms",
                "ours": ours["first_ms"],
                "peers": {p: theirs[p]["first_ms"] for p in peers},
            }
        )
        rows.append(
            {
                "name": f"{n} at once: wall",
                "unit": "s",
                "ours": [ours["wall_s"]],
                "peers": {p: [theirs[p]["wall_s"]] for p in peers},
            }
        )
        rows.append(
            {
                "name": f"{n} at once: daemon CPU/step",
                "unit": "ms",
                "ours": [ours["cpu_per_step_ms"]],
                "peers": {},
            }
        )
        rows.append(
            {
                "name": f"{n} at once:   of it, the event loop's thread",
                "unit": "ms",
                "ours": [ours["loop_cpu_per_step_ms"]],
                "peers": {},
            }
        )
        rows.append(
            {
                "name": f"{n} at once: model-call workers' CPU/step",
                "unit": "ms",
                "ours": [ours["workers_cpu_per_step_ms"]],
                "peers": {},
            }
        )
        rows.append(
            {
                "name": f"{n} at once: sandboxes' CPU/step (gateway + kernel)",
                "unit": "ms",
                "ours": [ours["sandboxes_cpu_per_step_ms"]],
                "peers": {},
            }
        )
    return rows


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * P95))]


# --- the table ------------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _num(value: float | None) -> str:
    return "-" if value is None else (f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}")


def _ratio(ours: float | None, other: float | None) -> str:
    return "-" if ours is None or not other else f"{ours / other:.2f}×"


def _table(rows: list[dict[str, Any]], peers: list[str]) -> str:
    head = f"{'scenario':<34}{'unit':<6}{'ours':>{COL}}"
    for peer in peers:
        head += f"{peer:>{COL}}{'ours/' + peer[:5]:>{COL}}"
    head += f"{'floor':>{COL}}{'ours/floor':>{COL}}"
    lines = [head]
    for r in rows:
        ours = _median(r["ours"])
        line = f"{r['name']:<34}{r['unit']:<6}{_num(ours):>{COL}}"
        for peer in peers:
            theirs = _median(r["peers"].get(peer, []))
            line += f"{_num(theirs):>{COL}}{_ratio(ours, theirs):>{COL}}"
        floor = _median(r.get("floor", []))
        line += f"{_num(floor):>{COL}}{_ratio(ours, floor):>{COL}}"
        lines.append(line)
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers",
        description="Ours next to smolagents and rlms on the scripted model: medians, ratios.",
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per scenario")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps per step run")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}"
    )
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--sessions", default=DEFAULT_SESSIONS, help="comma-separated session counts (concurrent)"
    )
    parser.add_argument(
        "--model-workers",
        type=int,
        default=None,
        help="our daemon's [daemon] model_workers (default: as the machine decides)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS_FILE)
    args = parser.parse_args(argv)
    args.peer_list = [p for p in args.peers.split(",") if p]
    args.scenarios = [s for s in args.only.split(",") if s]
    args.session_counts = [int(n) for n in args.sessions.split(",") if n.strip().isdigit()]
    bad = [p for p in args.peer_list if p not in PEERS]
    bad += [s for s in args.scenarios if s not in SCENARIOS]
    if bad or args.runs < 1 or args.steps < 2 or not args.session_counts:
        parser.error(
            f"unknown peer or scenario {', '.join(bad)}"
            if bad
            else "--runs ≥ 1, --steps ≥ 2, --sessions N[,N...]"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    ensure_peers_venv()
    set_child_subreaper()
    tmp_root = Path(tempfile.mkdtemp(prefix="prime-agent-bench-peers-"))
    os.environ["TMPDIR"] = str(tmp_root)
    tempfile.tempdir = None
    rows: list[dict[str, Any]] = []
    peers: list[str] = args.peer_list
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        base = Path(tmp)
        peer_runs: dict[str, list[dict[str, Any]]] = {}
        cold: dict[str, list[float]] = {}
        with FakeServerProcess(peer_script("smolagents", args.steps), base) as srv:
            for peer in peers if set(args.scenarios) & SINGLE_SCENARIOS else ():
                print(f"{peer}: {args.runs} runs of {args.steps} steps ...", flush=True)
                run_peer(peer, srv, args.steps, base)  # warm-up: page cache, .pyc files
                peer_runs[peer] = [run_peer(peer, srv, args.steps, base) for _ in range(args.runs)]
                if "cold_p" in args.scenarios:
                    cold[peer] = [run_peer(peer, srv, 0, base)["wall_s"] for _ in range(args.runs)]
        if "step_gap" in args.scenarios:
            print(f"ours: {args.runs} runs of {args.steps} steps ...", flush=True)
            gaps, cells = ours_step_gap(args.runs, args.steps)
            rows.append(
                {
                    "name": f"step gap, {args.steps} steps",
                    "unit": "ms",
                    "ours": gaps,
                    "peers": {p: [g for r in peer_runs[p] for g in r["gaps_ms"]] for p in peers},
                    "floor": cells,
                }
            )
        if "cold_p" in args.scenarios:
            print("ours: cold -p ...", flush=True)
            rows.append(
                {
                    "name": "cold -p (spawn → exit), no daemon",
                    "unit": "s",
                    "ours": ours_cold_p(args.runs, base),
                    "peers": cold,
                }
            )
        if "memory" in args.scenarios:
            print("ours: memory ...", flush=True)
            whole, host, roles = ours_memory(args.runs, args.steps, base)
            print(f"   our tree by role at its peak (MiB): {roles}", flush=True)
            peak = {p: [r["peak_rss_mib"] for r in peer_runs[p]] for p in peers}
            rows.append(
                {
                    "name": f"peak RSS, {args.steps} steps, tree",
                    "unit": "MiB",
                    "ours": whole,
                    "peers": peak,
                }
            )
            rows.append(
                {
                    "name": "  host side (no gateway, kernel)",
                    "unit": "MiB",
                    "ours": host,
                    "peers": peak,
                }
            )
        if "concurrent" in args.scenarios:
            rows += concurrent_rows(args.session_counts, peers, base, args.model_workers)
    leftovers = reap_leftovers()
    print()
    print(_table(rows, peers))
    print(
        f"   - {args.runs} runs each on the scripted model (its own process); peers "
        f"{', '.join(PINS)} in {PEERS_VENV.name}; cold -p for peers is a one-answer run in a "
        "fresh interpreter; floor = our cell round trip through the Kernel Gateway."
    )
    print(
        "   - concurrent: one run per session count (N sessions × "
        f"{bench_concurrent.STEPS} steps); ours through one daemon (local backend, sandboxes "
        "started first), peers as N processes at once; 'cpu' is our daemon's CPU per step."
    )
    print("   - not measured here: warm -p through a running daemon (bench daemon has it).")
    for item in leftovers:
        print(f"   LEFTOVER (stopped): {item}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"rows": rows, "pins": list(PINS)}, indent=1))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
