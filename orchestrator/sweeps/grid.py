"""A sweep's cells: every task × model × variant × seed, each with a fingerprint.

A cell's fingerprint hashes what decides its trial: the task's content, the model (and its
endpoint and declared prices), the variant's settings, the seed, the per-trial budgets and the
harness version. Running a sweep file again reruns only cells without a score (``sweep run``
reads their states by fingerprint, ``store/sweeps.py``); a cell whose task, model or settings
changed has a new fingerprint and runs as a new cell, and its old row is left as it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.errors import ConfigError
from orchestrator.sweeps.spec import MAX_GRID_CELLS, SweepFile, SweepModel, Variant
from orchestrator.sweeps.suites import generate
from orchestrator.sweeps.tasks import Task

__all__ = ["HARNESS_VERSION", "Cell", "expand"]

# Bumped when what a trial does for the same inputs changes (prompts, scoring, suites): every
# cell then gets a new fingerprint and runs again.
# sweeps-2: the compact prompt's worked examples; a turn stopped without an answer scores 0.
HARNESS_VERSION: Final = "sweeps-2"
FINGERPRINT_CHARS: Final = 32


@dataclass(frozen=True)
class Cell:
    fingerprint: str
    task: Task
    model: SweepModel
    variant: Variant
    seed: int

    def row(self) -> dict[str, Any]:
        """What the daemon stores of the cell (``sweep_open``)."""
        return {
            "fingerprint": self.fingerprint,
            "suite": self.task.suite,
            "task_id": self.task.id,
            "model": self.model.label,
            "variant": self.variant.name,
            "seed": self.seed,
            "context_tokens": self.task.context_tokens,
        }


def fingerprint(task: Task, model: SweepModel, variant: Variant, seed: int, trial: Any) -> str:
    body = {
        "task": task.content_hash,
        "model": model.model_dump(mode="json", exclude_none=True),
        "variant": variant.settings(),
        "seed": seed,
        "trial_budgets": trial,
        "harness": HARNESS_VERSION,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def expand(spec: SweepFile) -> list[Cell]:
    """Every cell of ``spec``, in a stable order (suite, task, model, variant, seed)."""
    tasks = [
        task
        for entry in spec.suites
        for task in generate(entry.suite, entry.tasks, entry.context_tokens, entry.seed, entry.path)
    ]
    total = len(tasks) * len(spec.models) * len(spec.variants) * len(spec.seeds)
    if total > MAX_GRID_CELLS:
        raise ConfigError(f"{spec.name}: {total} cells; a sweep may have {MAX_GRID_CELLS}")
    trial = spec.budgets.per_trial()
    cells = [
        Cell(fingerprint(task, model, variant, seed, trial), task, model, variant, seed)
        for task in tasks
        for model in spec.models
        for variant in spec.variants
        for seed in spec.seeds
    ]
    seen = {c.fingerprint for c in cells}
    if len(seen) != len(cells):
        raise ConfigError(f"{spec.name}: two cells are the same (a suite listed twice?)")
    return cells
