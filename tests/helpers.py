"""Helpers shared by integration and e2e tests (not fixtures: plain functions)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["cli", "descendant_pids", "pids_alive", "wait_until", "write_config"]

CLI_TIMEOUT_S = 120.0


def cli(
    args: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = CLI_TIMEOUT_S,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``prime-agent ARGS`` as a real subprocess with the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        cwd=cwd,
        check=False,
    )


def write_config(text: str) -> Path:
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def wait_until(predicate: object, *, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or the deadline: for facts with no event to wait on
    (a process disappearing from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


def pids_alive(pids: Sequence[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def descendant_pids(root: int) -> list[int]:
    """All processes whose parent chain reaches ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    out: list[int] = []
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == current:
                out.append(pid)
                frontier.append(pid)
    return out
