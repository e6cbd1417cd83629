"""One peer agent process (``bench/_peer_agent.py`` in the peers' venv) and its report, for
``bench/peers.py`` (one run at a time) and ``bench/bench_concurrent.py`` (N at once)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Final

from bench.common import PROVIDER_KEY_VARS, REPO_ROOT

__all__ = ["PEERS_VENV", "PEER_PYTHON", "spawn", "step_ends"]

PEERS_VENV: Final = REPO_ROOT / "bench" / ".venv-peers"
PEER_PYTHON: Final = PEERS_VENV / "bin" / "python"
PEER_AGENT: Final = REPO_ROOT / "bench" / "_peer_agent.py"
ERROR_TAIL_CHARS: Final = 800
ANSWER: Final = "done"


def spawn(peer: str, api_base: str, cwd: Path) -> subprocess.Popen[bytes]:
    """``peer`` running its one task against ``api_base``, with no provider keys of ours."""
    return subprocess.Popen(
        [str(PEER_PYTHON), str(PEER_AGENT), peer, api_base],
        env={k: v for k, v in os.environ.items() if k not in PROVIDER_KEY_VARS},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def step_ends(
    peer: str, proc: subprocess.Popen[bytes], out: bytes, err: bytes, steps: int
) -> list[float]:
    """The finished process's step end times (monotonic s); it must have answered after
    exactly ``steps`` + 1 steps, or this says what it did instead."""
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-ERROR_TAIL_CHARS:]
        raise RuntimeError(f"{peer} failed ({proc.returncode}): {tail}")
    report = json.loads(out.decode().strip().splitlines()[-1])
    ends = [float(t) for t in report["step_ends"]]
    if report["answer"] != ANSWER or len(ends) != steps + 1:
        raise RuntimeError(f"{peer}: {len(ends)} steps and answer {report['answer']!r}")
    return ends
