"""Issue 19: a sweep of one-step cells through the daemon — cells per second, the harness's CPU
per cell (daemon and runner; sandboxes and the model excluded), and peak memory.

The sweep is ``s-niah`` in its vanilla variant with a tiny context, so each cell is one model
call that answers from the prompt: what is measured is the sweep machinery (a session per
trial, its sandbox, the trial's bookkeeping), not a model. The floor beside it is the same
number of model calls made one after another by a bare HTTP client against the same server.
"""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.common import (
    PYTHON,
    FakeServerProcess,
    cli_env,
    fake_model_config,
    private_xdg,
    row,
    stop_daemon,
)

CELLS: Final = 200
QUICK_CELLS: Final = 40
CONCURRENCY: Final = 8
CONTEXT_TOKENS: Final = 300
SWEEP_TIMEOUT_S: Final = 1800.0
KIB_PER_MIB: Final = 1024
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
SCRIPT: Final = """
repeat forever:
    when re "magic number is ([0-9]+)": text: \\1
    else: text: none
"""
SWEEP: Final = """
name: bench
suites: [{{suite: s-niah, tasks: {cells}, context_tokens: [{tokens}]}}]
models: [openai/fake]
variants: [{{name: vanilla, rlm: false}}]
concurrency: {{trials: {concurrency}, sandboxes: {concurrency}}}
"""


def _daemon_pid(env: dict[str, str]) -> int | None:
    """The pid the running daemon reports (its ping answer)."""
    from orchestrator.api.client import request_sync

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        answer = request_sync("ping")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    pid = answer.get("pid") if isinstance(answer, dict) else None
    return int(pid) if pid else None


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _floor_s(url: str, calls: int) -> float:
    """``calls`` one-step completions, one after another, from a bare HTTP client."""
    import httpx

    body = {
        "model": "fake",
        "messages": [{"role": "user", "content": "The special magic number is 1234567."}],
    }
    with httpx.Client(base_url=url) as client:
        started = time.perf_counter()
        for _ in range(calls):
            client.post("/chat/completions", json=body).raise_for_status()
        return time.perf_counter() - started


def run(quick: bool = False) -> dict[str, Any]:
    cells = QUICK_CELLS if quick else CELLS
    with (
        tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp,
        FakeServerProcess(SCRIPT, Path(tmp)) as fake,
        private_xdg(Path(tmp)) as xdg,
    ):
        env = cli_env(xdg)
        env["PRIME_AGENT_BACKEND"] = "local"
        env["PRIME_AGENT_DAEMON_AUTOSTART"] = "1"
        fake_model_config(xdg, fake.url)
        sweep = Path(tmp) / "bench.yaml"
        sweep.write_text(SWEEP.format(cells=cells, tokens=CONTEXT_TOKENS, concurrency=CONCURRENCY))
        subprocess.run(
            [PYTHON, "-m", "orchestrator", "daemon", "start"], env=env, check=True, cwd=tmp
        )
        daemon = _daemon_pid(env)
        daemon_cpu = _cpu_s(daemon) if daemon else 0.0
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [PYTHON, "-m", "orchestrator", "sweep", "run", str(sweep)],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=SWEEP_TIMEOUT_S,
            check=False,
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"sweep run failed: {done.stderr[-2000:]}")
        runner_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        daemon_cpu = (_cpu_s(daemon) - daemon_cpu) if daemon else float("nan")
        daemon_peak = _peak_rss_kib(daemon) if daemon else 0
        floor = _floor_s(fake.url, cells)
        stop_daemon(env, Path(tmp))
    return {
        "rows": [
            row(
                f"{cells} one-step cells: cells per second",
                "cells/s",
                [cells / wall],
                higher_is_better=True,
            ),
            row(
                "  floor: the same calls from a bare client",
                "cells/s",
                [cells / floor],
                higher_is_better=True,
            ),
            row("  wall per cell", "ms", [wall / cells * 1000]),
            row("  daemon CPU per cell (sandboxes excluded)", "ms", [daemon_cpu / cells * 1000]),
            row("  runner CPU per cell", "ms", [runner_cpu / cells * 1000]),
            row("  daemon peak RSS", "MiB", [daemon_peak / KIB_PER_MIB]),
            row("  runner peak RSS", "MiB", [after.ru_maxrss / KIB_PER_MIB]),
        ],
        "notes": [
            f"concurrency {CONCURRENCY}; s-niah vanilla at {CONTEXT_TOKENS} tokens; local backend",
            "runner peak RSS is the largest child of the bench so far (ru_maxrss)",
        ],
    }
