"""What the benchmarks share: result rows, statistics, private dirs, the timed fake model
server, the CLI command line, process-tree memory sampling and the leftover-process check.

A benchmark returns ``{"rows": [row, ...], "notes": [str, ...]}``. A row holds raw
``samples`` plus what to compare them with; ``summarize`` adds median, p90, ratio and the
target verdict. Nothing here asserts on timings: the numbers are printed, never judged
pass/fail beyond the "meets target" column.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.sandbox.proctree import ProcInfo, descendants, is_running, kill_all

__all__ = [
    "PROVIDER_KEY_VARS",
    "PYTHON",
    "REPO_ROOT",
    "FakeServerProcess",
    "TreeSampler",
    "cli_argv",
    "cli_env",
    "private_xdg",
    "reap_leftovers",
    "role_of",
    "row",
    "set_child_subreaper",
    "stop_daemon",
    "summarize",
    "time_command",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# Provider keys never reach a benchmarked process: every model here is the fake server.
PROVIDER_KEY_VARS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "ANTHROPIC_API_KEY",
    "OPENROUTER_API_KEY",
)
FAKE_READY_TIMEOUT_S = 30.0
FAKE_STOP_GRACE_S = 5.0
# The fake server writes a request's timing just after the reply's last byte; give it this
# long to land before reading.
TIMINGS_SETTLE_S = 2.0
LEFTOVER_GRACE_S = 2.0
PR_SET_CHILD_SUBREAPER = 36
P90 = 0.9


# --- rows and statistics ----------------------------------------------------------------------


def row(
    name: str,
    unit: str,
    samples: Sequence[float],
    *,
    reference: float | None = None,
    target: float | None = None,
    higher_is_better: bool = False,
) -> dict[str, Any]:
    """One line of the results table, with its raw samples (summarized by the runner)."""
    return {
        "name": name,
        "unit": unit,
        "samples": [float(s) for s in samples],
        "reference": reference,
        "target": target,
        "higher_is_better": higher_is_better,
    }


def _p90(values: Sequence[float]) -> float:
    """Nearest-rank 90th percentile (with few samples this is close to the maximum)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(P90 * len(ordered)) - 1)]


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """Adds n, median, p90, ratio (median / reference) and meets (median vs target)."""
    samples = [round(float(s), 4) for s in r["samples"]]
    out = dict(r, samples=samples)
    if not samples:
        out.update(n=0, median=None, p90=None, ratio=None, meets=None)
        return out
    median = statistics.median(samples)
    ref, target = r.get("reference"), r.get("target")
    meets = None
    if target is not None:
        meets = median >= target if r.get("higher_is_better") else median <= target
    out.update(
        n=len(samples),
        median=median,
        p90=_p90(samples),
        ratio=(median / ref) if ref else None,
        meets=meets,
    )
    return out


def time_command(
    argv: Sequence[str], repeats: int, *, env: dict[str, str] | None = None
) -> list[float]:
    """Wall seconds of ``argv`` (spawn → exit), ``repeats`` times; a failure raises."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        out.append(time.perf_counter() - start)
    return out


# --- private dirs and the CLI ---------------------------------------------------------------


@contextlib.contextmanager
def private_xdg(parent: Path, *, keep_cache: bool = False) -> Iterator[dict[str, str]]:
    """Fresh XDG config/data/runtime (and cache) dirs under ``parent``; yields the env vars."""
    root = Path(tempfile.mkdtemp(prefix="xdg-", dir=parent))
    env: dict[str, str] = {}
    for var, sub in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_RUNTIME_DIR", "run"),
        ("XDG_CACHE_HOME", "cache"),
    ):
        if var == "XDG_CACHE_HOME" and keep_cache:
            continue  # the embedded model's 491 MB file lives there
        path = root / sub
        path.mkdir(mode=0o700)
        env[var] = str(path)
    yield env


def fake_model_config(xdg: dict[str, str], url: str) -> None:
    """Point ``openai/fake`` at the fake server ``url`` in the private config.toml."""
    config = Path(xdg["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[models."openai/fake"]\napi_base = "{url}"\n')


def cli_env(xdg: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_KEY_VARS}
    env.update(xdg)
    return env


DAEMON_STOP_TIMEOUT_S = 120.0


def stop_daemon(env: dict[str, str], cwd: Path) -> None:
    """``prime-agent daemon stop`` with ``env``'s dirs: the daemon a ``-p`` run autostarted,
    so the next run starts from nothing and no process is left behind."""
    subprocess.run(
        [PYTHON, "-m", "orchestrator", "daemon", "stop"],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=DAEMON_STOP_TIMEOUT_S,
    )


def cli_argv(task: str, api_base: str | None) -> list[str]:
    """``prime-agent -p TASK`` as a subprocess; no api_base means the embedded model."""
    argv = [PYTHON, "-m", "orchestrator", "-p", task]
    if api_base is not None:
        argv += ["--model", "openai/fake", "--api-base", api_base]
    return argv


# --- the fake model server, in its own process, with per-request timings --------------------


class FakeServerProcess:
    """``bench._timed_fake`` as a child process (a real provider is not in our process either).

    ``timings()`` returns, per chat request in order, the milliseconds the server spent on it
    (request line parsed → last byte of the reply written).
    """

    def __init__(self, script: str, workdir: Path) -> None:
        self.script = script
        self.url = ""
        self._script_file = workdir / "script.txt"
        self._timings_file = workdir / "timings.txt"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FakeServerProcess:
        self._script_file.write_text(self.script)
        self._timings_file.write_text("")
        proc = self._proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "bench._timed_fake",
                "--timings",
                str(self._timings_file),
                "--script",
                str(self._script_file),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        ready: list[bytes] = []

        def read_ready_line() -> None:
            assert proc.stdout is not None
            ready.append(proc.stdout.readline())

        reader = threading.Thread(target=read_ready_line, daemon=True)
        reader.start()
        reader.join(FAKE_READY_TIMEOUT_S)
        if not ready or not ready[0]:
            self.close()
            raise RuntimeError("the fake model server did not start")
        self.url = json.loads(ready[0])["url"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(FAKE_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def root(self) -> str:
        return self.url.rsplit("/v1", 1)[0]

    def load(self, script: str) -> None:
        """Replace the script (``POST /_script``)."""
        req = urllib.request.Request(self.root + "/_script", data=script.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def timings(self, expected: int = 0) -> list[float]:
        deadline = time.monotonic() + TIMINGS_SETTLE_S
        while True:
            lines = self._timings_file.read_text().split()
            if len(lines) >= expected or time.monotonic() > deadline:
                return [float(x) for x in lines]
            time.sleep(0.01)


# --- memory of a process tree -----------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _pss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def role_of(pid: int, root: int) -> str:
    """A short name for a process of a ``-p`` run: cli, daemon, gateway, kernel, embedded-model…"""
    if pid == root:
        return "cli"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"pid {pid}"
    if "gateway_main" in cmd:
        return "gateway"
    if "orchestrator.daemon" in cmd:
        return "daemon"
    if "ipykernel" in cmd or "IPKernelApp" in cmd:
        return "kernel"
    if "embedded_server" in cmd or "llama" in cmd:
        return "embedded-model"
    return Path(cmd.split(" ", 1)[0]).name or f"pid {pid}"


@dataclass
class TreeSampler:
    """Samples VmRSS (and PSS) of ``root`` and all its descendants every ``interval_s``.

    RSS summed over processes counts shared pages (libpython, numpy…) once per process; PSS
    splits them, so its sum is what the run really costs the machine.
    """

    root: int
    interval_s: float = 0.025
    peak_rss_kib: int = 0
    peak_pss_kib: int = 0
    at_peak: dict[str, int] = field(default_factory=dict)  # role → RSS KiB at the RSS peak
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        pids = [self.root] + [p.pid for p in descendants(self.root) if p.state != "Z"]
        rss: dict[str, int] = {}
        total = pss_total = 0
        for pid in pids:
            kib = _status_kib(pid, "VmRSS:")
            if kib is None:
                continue  # gone, or a zombie (no VmRSS line)
            role = role_of(pid, self.root)
            rss[role] = rss.get(role, 0) + kib
            total += kib
            pss_total += _pss_kib(pid) or 0
        self.samples += 1
        if total > self.peak_rss_kib:
            self.peak_rss_kib = total
            self.at_peak = rss
        self.peak_pss_kib = max(self.peak_pss_kib, pss_total)


# --- no leftovers -------------------------------------------------------------------------------


def set_child_subreaper() -> bool:
    """Make orphans of our descendants (a CLI's gateway, say) our children, so that
    ``reap_leftovers`` can see and stop them. Linux only; False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _describe(info: ProcInfo) -> str:
    try:
        with open(f"/proc/{info.pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"{info.pid} {cmd[:120]}"


def reap_leftovers() -> list[str]:
    """Every live descendant of this process is a leftover: describe it, then stop it
    (SIGTERM, grace, SIGKILL). Zombies adopted as subreaper are reaped quietly."""
    found = [p for p in descendants(os.getpid()) if p.state != "Z"]
    described = [_describe(p) for p in found]
    if found:
        kill_all(found, signal.SIGTERM)
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while time.monotonic() < deadline and any(is_running(p) for p in found):
            time.sleep(0.05)
        kill_all(found, signal.SIGKILL)
    for p in descendants(os.getpid()):
        if p.state == "Z" and p.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)
    return described
