"""How an answer scores against its task, in [0, 1], exactly and without a model:

- ``contains``: 1 when the expected text appears in the answer as a whole token (``1234``
  does not match inside ``12345``);
- ``numeric``: ``0.75 ** |answer - expected|`` for the last number in the answer (0 when it
  has none), Oolong's partial credit;
- ``exact``: 1 when the answer, or its last line, is the expected text once case, surrounding
  punctuation, quotes and markdown emphasis are set aside;
- ``gate``: 1 when the trial's autonomous run stopped with every gate passed in the sandbox;
- ``verifier``: the reward a Harbor task's verifier wrote (``tests/test.sh`` in the sandbox
  after the agent's turn), clamped to [0, 1];
- ``timed``: gated like ``gate``, and then by time: the gate measured ``seconds`` (a kernel's
  time, a training run's wall time) against its ``reference_s`` (the naive kernel timed in the
  same check; the task's reference run time) and wrote both to the workspace
  (``TimedResult``); the score is ``reference / (reference + seconds)``: 0.5 at the
  reference's speed, 0.8 four times faster, never 1, and 0 when the gate did not pass;
- ``pairs_f1``: F1 of the pairs the answer lists (``(a, b)``, order within a pair ignored)
  against the expected pairs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.sweeps.tasks import Task

__all__ = ["NUMERIC_BASE", "TIMED_RESULT_FILE", "TimedResult", "read_timed_result", "score"]

NUMERIC_BASE: Final = 0.75
GATE_PASSED: Final = "gate_passed"  # the autonomous stop reason when every gate passed
# Turns that stopped without the model's answer: their final text is the harness's notice
# ("stopped: 4 identical cells in a row", a spent budget), whose numbers are no answer (a stuck
# 0.5B trial scored 1.0 on a count from the "4" of that notice).
NOT_ANSWERED: Final = frozenset({"stuck", "budget_exceeded", "max_steps", "compaction_failed"})
_NUMBER_RE: Final = re.compile(r"-?\d+(?:\.\d+)?")
_PAIR_RE: Final = re.compile(r"\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)")
_STRIP: Final = " \t\n.,;:!?\"'`*_()[]"
_ANSWER_PREFIX_RE: Final = re.compile(r"^(?:final\s+)?answer\s*[:\-]\s*", re.IGNORECASE)
# Where a timed task's gate writes what it measured, relative to the trial's workspace. The
# gate runs after the agent's last turn (autonomous mode stops once it passes), so the file a
# passed trial leaves is the gate's own.
TIMED_RESULT_FILE: Final = ".prime-agent-timed.json"


@dataclass(frozen=True)
class TimedResult:
    """What a timed task's gate measured: ``seconds`` against ``reference_s``."""

    seconds: float
    reference_s: float

    @property
    def score(self) -> float:
        return self.reference_s / (self.reference_s + self.seconds)


def read_timed_result(workspace: Path) -> TimedResult | None:
    """The gate's measurement in ``workspace``; None when it is missing or malformed."""
    try:
        data = json.loads((workspace / TIMED_RESULT_FILE).read_text(encoding="utf-8"))
        seconds, reference = float(data["seconds"]), float(data["reference_s"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not (math.isfinite(seconds) and math.isfinite(reference)):
        return None
    if seconds < 0 or reference <= 0:
        return None
    return TimedResult(seconds, reference)


def _normal(text: str) -> str:
    text = _ANSWER_PREFIX_RE.sub("", text.strip().strip(_STRIP))
    return " ".join(text.strip(_STRIP).lower().split())


def _contains(answer: str, expected: str) -> float:
    pattern = rf"(?<![\w]){re.escape(expected)}(?![\w])"
    return 1.0 if re.search(pattern, answer, re.IGNORECASE) else 0.0


def _numeric(answer: str, expected: float) -> float:
    found = _NUMBER_RE.findall(answer.replace(",", ""))
    if not found:
        return 0.0
    return float(NUMERIC_BASE ** abs(float(found[-1]) - float(expected)))


def _exact(answer: str, expected: str) -> float:
    want = _normal(expected)
    lines = [line for line in answer.strip().splitlines() if line.strip()]
    candidates = [answer] + ([lines[-1]] if lines else [])
    return 1.0 if any(_normal(c) == want for c in candidates) else 0.0


def _pairs(text: str) -> set[frozenset[str]]:
    return {frozenset((a.strip().lower(), b.strip().lower())) for a, b in _PAIR_RE.findall(text)}


def _pairs_f1(answer: str, expected: list[Any]) -> float:
    want = {frozenset(str(x).lower() for x in pair) for pair in expected}
    got = _pairs(answer)
    if not want and not got:
        return 1.0
    hits = len(want & got)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(got), hits / len(want)
    return 2 * precision * recall / (precision + recall)


def score(
    task: Task,
    answer: str,
    stop_reason: str | None = None,
    reward: float | None = None,
    *,
    timed: TimedResult | None = None,
) -> float:
    """``answer``'s score; a gated task scores by how its run stopped (``stop_reason``), a
    verified one by its verifier's ``reward``, a timed one also by what its gate measured
    (``timed``)."""
    match task.scoring:
        case "verifier":
            return min(1.0, max(0.0, reward)) if reward is not None else 0.0
        case "gate":
            return 1.0 if stop_reason == GATE_PASSED else 0.0
        case "timed":
            return timed.score if stop_reason == GATE_PASSED and timed is not None else 0.0
        case _ if stop_reason in NOT_ANSWERED:
            return 0.0
        case "contains":
            return _contains(answer, str(task.expected))
        case "numeric":
            return _numeric(answer, float(task.expected))
        case "exact":
            return _exact(answer, str(task.expected))
        case "pairs_f1":
            return _pairs_f1(answer, list(task.expected))
