"""The table of docs/embedded-model.md ("Which embedded variant") from a sweep's cells:

    prime-agent sweep status NAME --json | python examples/sweeps/score_per_minute.py

One row per suite × model entry (and one per model entry over every suite): scored cells, mean
score, mean tokens and wall seconds per trial, and score per minute — the summed score over the
summed wall time, the figure the embedded default is chosen by. A cell whose turn stopped
without an answer (``scoring.NOT_ANSWERED``: stuck, a spent budget) counts 0, as the runner
scores it since sweeps-2 (older cells may hold a score read from the harness's notice).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from orchestrator.sweeps.scoring import NOT_ANSWERED

SECONDS_PER_MINUTE = 60.0


def main() -> None:
    groups: dict[tuple[str, str], list[dict[str, object]]] = defaultdict(list)
    for line in sys.stdin:
        if not line.strip():
            continue
        cell = json.loads(line)
        if cell["state"] != "scored":
            continue
        if cell["suite"] != "code-fix" and cell["stop_reason"] in NOT_ANSWERED:
            cell["score"] = 0.0
        groups[(str(cell["suite"]), str(cell["model"]))].append(cell)
        groups[("all", str(cell["model"]))].append(cell)
    print("| suite | model + protocol | trials | score | tokens / trial | wall s / trial | score / min |")
    print("|---|---|---|---|---|---|---|")
    for (suite, model), cells in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        n = len(cells)
        score = sum(float(c["score"] or 0.0) for c in cells)
        tokens = sum(int(c["tokens"] or 0) for c in cells)
        wall = sum(float(c["wall_s"] or 0.0) for c in cells)
        per_minute = score / (wall / SECONDS_PER_MINUTE) if wall else 0.0
        print(
            f"| {suite} | {model} | {n} | {score / n:.2f} | {tokens / n:.0f} | {wall / n:.0f} "
            f"| {per_minute:.3f} |"
        )


if __name__ == "__main__":
    main()
