"""Cold start of ``prime-agent -p`` against the fake model: spawn → exit of the whole program.

Each run is a fresh ``python -m orchestrator -p hi --model openai/fake --api-base URL`` with
fresh XDG dirs (no database, no config, no daemon running), one text reply from the fake
server. ``-p`` starts the user's daemon when none runs (autostart), so spawn → exit includes
the daemon's start; the daemon is stopped after each run (outside the timing). Timestamps:
spawn, the answer line on stdout, process exit. ``-p`` prints the answer after the session is
wound up (run_end recorded, sandbox stopped, store closed), so "answer → exit" is only what
follows: closing the event loop and the interpreter's own exit.

A second row runs ``-p`` again with the daemon left running (one daemon for all those runs,
started and warmed first): spawn → exit of the client alone, the daemon's start excluded.

The breakdown measures the pieces in separate fresh processes, each spawn → exit:

- CLI import: ``python -m orchestrator --help`` (typer app; no litellm, no sandbox);
- client import: ``python -c`` importing the modules a ``-p`` run through the daemon uses
  (``CLIENT_MODULES``; no typer, no litellm, no duckdb);
- a litellm probe, ``python -c`` that stamps the monotonic clock when its code starts, after
  ``orchestrator.models.lite.load_litellm()``, after a first and a second streamed
  ``acompletion`` to the fake server, and at its end, while this process stamps spawn and
  exit. That gives python startup (spawn → code), litellm's import, its first call (lazy
  set-up) against a warm one, and the interpreter's exit (finalization: tearing down every
  module litellm loaded). Half the probes call ``gc.freeze()`` before exiting, to show what
  finalization costs.

The sandbox (gateway + kernel) starts in the background of a ``-p`` run while litellm
imports, sharing the CPUs with it; its cold start alone is the ``first_cell`` benchmark's cold
row.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from bench.common import (
    PYTHON,
    FakeServerProcess,
    cli_argv,
    cli_env,
    private_xdg,
    row,
    stop_daemon,
    time_command,
)

__all__ = ["run"]

RUNS = 10
QUICK_RUNS = 5
BREAKDOWN_RUNS = 5
QUICK_BREAKDOWN_RUNS = 3
REFERENCE_S = 2.7
TARGET_S: Final = 2.0  # issue 18: -p with no daemon running, daemon start included, spawn → exit
RUN_TIMEOUT_S = 120.0
WARM_TARGET_S: Final = 0.5  # issue 18: -p with the daemon running, spawn → exit
# What a -p run through the daemon imports (cli/entry.py's lean path).
CLIENT_MODULES: Final = (
    "orchestrator.cli.entry",
    "orchestrator.cli.autostart",
    "orchestrator.cli.client_config",
    "orchestrator.cli.print_run",
    "orchestrator.cli.via_daemon",
    "orchestrator.model_names",
)
ANSWER = "Hello from the fake model."
SCRIPT = f"repeat forever:\n    text: {ANSWER}\n"
# Stamps: code starts, litellm imported, first streamed call done, second call done, the end.
PROBE = """\
import asyncio, gc, sys, time
t0 = time.monotonic()
import orchestrator.models.lite as l
litellm = l.load_litellm()
t1 = time.monotonic()

async def call():
    stream = await litellm.acompletion(
        model="openai/fake", api_base=sys.argv[1], api_key="sk-fake", stream=True,
        stream_options={"include_usage": True}, num_retries=0, max_retries=0,
        messages=[{"role": "user", "content": "hi"}],
    )
    async for _ in stream:
        pass

asyncio.run(call())
t2 = time.monotonic()
asyncio.run(call())
t3 = time.monotonic()
"""
PROBE_END = "print(t0, t1, t2, t3, time.monotonic())\n"


def _one(api_base: str, base: Path) -> tuple[float, float]:
    """(spawn → answer on stdout, spawn → exit), in seconds."""
    with private_xdg(base) as xdg:
        workdir = Path(xdg["XDG_DATA_HOME"]).parent
        start = time.perf_counter()
        proc = subprocess.Popen(
            cli_argv("hi", api_base),
            env=cli_env(xdg),
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        answered: list[float] = []
        assert proc.stdout is not None

        def read_stdout() -> None:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            answered.append(time.perf_counter())
            if ANSWER.encode() not in line:
                answered.append(float("nan"))
            proc.stdout.read()

        reader = threading.Thread(target=read_stdout, daemon=True)
        reader.start()
        try:
            proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finished = time.perf_counter()
        # -p started a daemon (autostart): stop it, so the next run starts cold again.
        stop_daemon(cli_env(xdg), workdir)
        reader.join(5)
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr is not None:
            proc.stderr.close()
        proc.stdout.close()
        if proc.returncode != 0 or len(answered) != 1:
            raise RuntimeError(f"prime-agent -p failed ({proc.returncode}): {stderr[-500:]}")
        return answered[0] - start, finished - start


def _warm(api_base: str, base: Path, runs: int) -> list[float]:
    """Spawn → exit of ``-p`` with the daemon already running (started by a first run)."""
    with private_xdg(base) as xdg:
        workdir = Path(xdg["XDG_DATA_HOME"]).parent
        env = cli_env(xdg)
        argv = cli_argv("hi", api_base)
        try:
            subprocess.run(argv, env=env, cwd=workdir, check=True, capture_output=True)
            out = []
            for _ in range(runs):
                start = time.perf_counter()
                subprocess.run(
                    argv,
                    env=env,
                    cwd=workdir,
                    check=True,
                    capture_output=True,
                    timeout=RUN_TIMEOUT_S,
                )
                out.append(time.perf_counter() - start)
            return out
        finally:
            stop_daemon(env, workdir)


def _probe(api_base: str, freeze: bool) -> dict[str, float]:
    """Seconds of each phase of one fresh process that imports litellm and calls the model."""
    code = PROBE + ("gc.freeze()\n" if freeze else "") + PROBE_END
    spawned = time.monotonic()
    out = subprocess.run([PYTHON, "-c", code, api_base], check=True, capture_output=True, text=True)
    exited = time.monotonic()
    t0, t1, t2, t3, t4 = (float(x) for x in out.stdout.split())
    return {
        "startup": t0 - spawned,
        "import": t1 - t0,
        "first_call": t2 - t1,
        "second_call": t3 - t2,
        "exit": exited - t4,
    }


def run(quick: bool = False) -> dict[str, Any]:
    runs = QUICK_RUNS if quick else RUNS
    parts = QUICK_BREAKDOWN_RUNS if quick else BREAKDOWN_RUNS
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
        base = Path(tmp)
        with FakeServerProcess(SCRIPT, base) as srv:
            _one(srv.url, base)  # warm the page cache: a cold disk is not what we measure
            pairs = [_one(srv.url, base) for _ in range(runs)]
            warm = _warm(srv.url, base, runs)
            plain = [_probe(srv.url, freeze=False) for _ in range(parts)]
            frozen = [_probe(srv.url, freeze=True) for _ in range(parts)]
    answer = [a for a, _ in pairs]
    wall = [w for _, w in pairs]
    teardown = [w - a for a, w in pairs]
    cli_import = time_command([PYTHON, "-m", "orchestrator", "--help"], parts)
    imports = "; ".join(f"import {name}" for name in CLIENT_MODULES)
    client_import = time_command([PYTHON, "-c", imports], parts)
    probes = plain + frozen
    litellm = [p["import"] for p in probes]
    exit_plain = [p["exit"] for p in plain]
    exit_frozen = [p["exit"] for p in frozen]
    lit = statistics.median(litellm)
    notes = [
        f"{runs} runs after one warm-up, fresh XDG dirs each; breakdown rows are separate "
        f"processes, {parts} runs each.",
        f"importing litellm costs {lit:.2f} s ({lit / TARGET_S:.1f}× the {TARGET_S:.2f} s "
        "target): a `-p` whose model goes through litellm pays it before its first call; an "
        "OpenAI-compatible endpoint (this run's scripted model) goes through the lean client "
        "and never imports it.",
        f"teardown (answer → exit) is {statistics.median(teardown):.2f} s; the interpreter's "
        f"exit after importing litellm alone is {statistics.median(exit_plain):.2f} s, and "
        f"{statistics.median(exit_frozen):.2f} s with gc.freeze() before exit.",
    ]
    return {
        "rows": [
            row(
                "prime-agent -p cold start (spawn → exit)",
                "s",
                wall,
                reference=REFERENCE_S,
                target=TARGET_S,
            ),
            row("  spawn → answer on stdout", "s", answer),
            row("  answer → exit (teardown)", "s", teardown),
            row(
                "prime-agent -p, daemon running (spawn → exit)",
                "s",
                warm,
                target=WARM_TARGET_S,
            ),
            row(
                "  python startup (spawn → first line of -c code)",
                "s",
                [p["startup"] for p in probes],
            ),
            row("  CLI import (python -m orchestrator --help)", "s", cli_import),
            row("  client import (the -p path's modules, no typer)", "s", client_import),
            row("  litellm import (load_litellm, in process)", "s", litellm),
            row(
                "  litellm first streamed call (lazy set-up)",
                "s",
                [p["first_call"] for p in probes],
            ),
            row("  litellm second call", "s", [p["second_call"] for p in probes]),
            row("  interpreter exit after litellm import", "s", exit_plain),
            row("  same, with gc.freeze() before exit", "s", exit_frozen),
        ],
        "notes": notes,
    }
