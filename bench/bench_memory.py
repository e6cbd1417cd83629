"""Peak memory of a whole ``prime-agent -p`` run: the CLI process plus every descendant
(kernel gateway, kernel, the embedded nats-server; with ``--with-embedded`` also the llama.cpp
server).

A sampler thread reads ``/proc/<pid>/status`` VmRSS (and ``smaps_rollup`` Pss) of the process
tree every ``TreeSampler.interval_s`` while the run goes and keeps the peak of the sum, with
the per-process split at that moment. RSS sums count shared pages once per process; PSS shares
them out, so the PSS sum is the tree's real footprint.

The fake-model run asks for one cell (``x = 1``) and then answers, so the kernel exists and
litellm is loaded: the shape of a real short run. ``-p`` starts the user's daemon when none
runs (autostart); the daemon is the CLI's child until the CLI exits, so it is in the sampled
tree (role ``daemon``), and it is stopped after each run so the next one starts from nothing.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    FakeServerProcess,
    TreeSampler,
    cli_argv,
    cli_env,
    private_xdg,
    row,
    stop_daemon,
)

__all__ = ["run"]

RUNS = 3
QUICK_RUNS = 1
KIB_PER_MIB = 1024.0
RUN_TIMEOUT_S = 120.0
EMBEDDED_TIMEOUT_S = 600.0
TASK = "bench-rss-task"
SCRIPT = f'repeat forever:\n    when "{TASK}": code: x = 1\n    else: text: done\n'
EMBEDDED_TASK = "Compute 6 * 7 with Python, then answer with the number."
ROLES = ("cli", "daemon", "gateway", "kernel", "nats-server", "embedded-model")
# What the issue counts as host side: everything but the sandbox (gateway and kernel).
HOST_ROLES = ("cli", "daemon", "nats-server", "embedded-model")


def _sampled_run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float
) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    sampler = TreeSampler(proc.pid).start()
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        sampler.stop()
        # the daemon -p autostarted: stop it, so the next run starts from nothing
        stop_daemon(env, cwd)
    if proc.returncode != 0:
        raise RuntimeError(
            f"prime-agent -p failed ({proc.returncode}): {stderr.decode(errors='replace')[-500:]}"
        )
    return {
        "peak_rss_mib": sampler.peak_rss_kib / KIB_PER_MIB,
        "peak_pss_mib": sampler.peak_pss_kib / KIB_PER_MIB,
        "at_peak_mib": {k: v / KIB_PER_MIB for k, v in sampler.at_peak.items()},
        "samples": sampler.samples,
        "wall_s": time.perf_counter() - started,
    }


def _rows(label: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [
        row(f"peak RSS sum, {label}", "MiB", [r["peak_rss_mib"] for r in runs]),
        row(f"  peak PSS sum, {label}", "MiB", [r["peak_pss_mib"] for r in runs]),
    ]
    host = [sum(v for k, v in r["at_peak_mib"].items() if k in HOST_ROLES) for r in runs]
    rows.append(row("  host side at peak (no gateway, kernel)", "MiB", host))
    roles = [x for x in ROLES if any(x in r["at_peak_mib"] for r in runs)]
    roles += sorted({k for r in runs for k in r["at_peak_mib"]} - set(roles))
    for role in roles:
        values = [r["at_peak_mib"].get(role, 0.0) for r in runs]
        rows.append(row(f"  RSS at peak: {role}", "MiB", values))
    return rows


def run(quick: bool = False, with_embedded: bool = False) -> dict[str, Any]:
    runs = QUICK_RUNS if quick else RUNS
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        base = Path(tmp)
        fake: list[dict[str, Any]] = []
        with FakeServerProcess(SCRIPT, base) as srv:
            for _ in range(runs):
                with private_xdg(base) as xdg:
                    fake.append(
                        _sampled_run(
                            cli_argv(TASK, srv.url),
                            cli_env(xdg),
                            Path(xdg["XDG_DATA_HOME"]),
                            RUN_TIMEOUT_S,
                        )
                    )
        rows = _rows("-p with one cell (fake model)", fake)
        notes = [
            f"{runs} run(s), {statistics.median(r['samples'] for r in fake):.0f} samples each "
            "(every 25 ms); 'RSS at peak' is the split of the peak sum by process.",
        ]
        if with_embedded:
            with private_xdg(base, keep_cache=True) as xdg:
                embedded = _sampled_run(
                    cli_argv(EMBEDDED_TASK, None),
                    cli_env(xdg),
                    Path(xdg["XDG_DATA_HOME"]),
                    EMBEDDED_TIMEOUT_S,
                )
            rows += _rows("-p on the embedded model", [embedded])
            notes.append(f"embedded-model run: one run, {embedded['wall_s']:.1f} s wall.")
    return {"rows": rows, "notes": notes}
