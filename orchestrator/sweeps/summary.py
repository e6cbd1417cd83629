"""A sweep's numbers, from its cells: what ``sweep report`` draws and tabulates.

Pure data in, data out (``plots.py`` draws it, ``cli/sweep.py`` writes it), so the report's
numbers are tested without looking at pixels:

- per model × variant (a *group*): cells, scored cells, mean score with a 95 % bootstrap
  interval (``BOOTSTRAP_RESAMPLES`` resamples of the scored cells, a fixed seed: the same
  cells give the same interval), total and per-cell cost, tokens, wall time;
- the Pareto frontier of groups on (mean cost per cell, mean score): no other group is at least
  as cheap and at least as good, and strictly one of the two;
- a task × group matrix of mean scores (over seeds);
- mean score by context length, per group.

Only ``scored`` cells count towards scores (an errored trial did not run; it is not a 0).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "CONFIDENCE",
    "Group",
    "SweepSummary",
    "bootstrap_interval",
    "summarise",
]

BOOTSTRAP_RESAMPLES: Final = 2000
CONFIDENCE: Final = 0.95
_BOOTSTRAP_SEED: Final = "prime-agent-sweep-report"


@dataclass(frozen=True)
class Group:
    model: str
    variant: str
    cells: int
    scored: int
    errored: int
    mean_score: float | None
    ci_low: float | None
    ci_high: float | None
    cost_usd: float
    cost_per_cell: float | None
    cost_known: bool
    tokens: int
    wall_s: float

    @property
    def label(self) -> str:
        return f"{self.model} · {self.variant}"


@dataclass(frozen=True)
class SweepSummary:
    groups: list[Group]
    frontier: list[str]  # group labels on the Pareto frontier, cheapest first
    tasks: list[str]
    matrix: dict[str, dict[str, float | None]]  # task -> group label -> mean score
    by_context: dict[str, dict[int, float]]  # group label -> context tokens -> mean score

    def table(self) -> list[dict[str, Any]]:
        """One row per group: what the markdown table and ``summary.json`` show."""
        return [
            {
                "model": g.model,
                "variant": g.variant,
                "score": g.mean_score,
                "ci_low": g.ci_low,
                "ci_high": g.ci_high,
                "scored": g.scored,
                "cells": g.cells,
                "errored": g.errored,
                "cost_usd": round(g.cost_usd, 6),
                "cost_per_cell": None if g.cost_per_cell is None else round(g.cost_per_cell, 6),
                "cost_known": g.cost_known,
                "tokens": g.tokens,
                "wall_s": round(g.wall_s, 3),
                "pareto": g.label in self.frontier,
            }
            for g in self.groups
        ]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def bootstrap_interval(
    scores: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean at ``CONFIDENCE`` (None without scores)."""
    if not scores:
        return None
    if len(set(scores)) == 1:
        return scores[0], scores[0]
    rng = random.Random(_BOOTSTRAP_SEED)
    n = len(scores)
    means = sorted(sum(rng.choices(scores, k=n)) / n for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[int((1 - tail) * (resamples - 1))]
    return low, high


def _group(model: str, variant: str, cells: Sequence[Mapping[str, Any]]) -> Group:
    scores = [float(c["score"]) for c in cells if c["state"] == "scored" and c["score"] is not None]
    interval = bootstrap_interval(scores)
    cost = sum(float(c.get("cost_usd") or 0.0) for c in cells)
    finished = [c for c in cells if c["state"] in ("scored", "errored")]
    return Group(
        model=model,
        variant=variant,
        cells=len(cells),
        scored=len(scores),
        errored=sum(1 for c in cells if c["state"] == "errored"),
        mean_score=_mean(scores),
        ci_low=None if interval is None else interval[0],
        ci_high=None if interval is None else interval[1],
        cost_usd=cost,
        cost_per_cell=cost / len(finished) if finished else None,
        cost_known=all(c.get("cost_known") is not False for c in finished),
        tokens=sum(int(c.get("tokens") or 0) for c in cells),
        wall_s=sum(float(c.get("wall_s") or 0.0) for c in cells),
    )


def _frontier(groups: Iterable[Group]) -> list[str]:
    points = [g for g in groups if g.mean_score is not None and g.cost_per_cell is not None]
    on: list[Group] = []
    for g in points:
        assert g.mean_score is not None and g.cost_per_cell is not None
        dominated = any(
            o is not g
            and o.mean_score is not None
            and o.cost_per_cell is not None
            and o.cost_per_cell <= g.cost_per_cell
            and o.mean_score >= g.mean_score
            and (o.cost_per_cell < g.cost_per_cell or o.mean_score > g.mean_score)
            for o in points
        )
        if not dominated:
            on.append(g)
    on.sort(key=lambda g: (g.cost_per_cell, -(g.mean_score or 0.0)))
    return [g.label for g in on]


def summarise(cells: Sequence[Mapping[str, Any]]) -> SweepSummary:
    by_group: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for cell in cells:
        by_group[(str(cell["model"]), str(cell["variant"]))].append(cell)
    groups = [_group(m, v, members) for (m, v), members in sorted(by_group.items())]
    tasks = list(dict.fromkeys(str(c["task_id"]) for c in cells))
    cell_scores: dict[tuple[str, str], list[float]] = defaultdict(list)
    context_scores: dict[tuple[str, int], list[float]] = defaultdict(list)
    for cell in cells:
        if cell["state"] != "scored" or cell["score"] is None:
            continue
        label = f"{cell['model']} · {cell['variant']}"
        cell_scores[(str(cell["task_id"]), label)].append(float(cell["score"]))
        if cell.get("context_tokens") is not None:
            context_scores[(label, int(cell["context_tokens"]))].append(float(cell["score"]))
    matrix = {
        task: {g.label: _mean(cell_scores.get((task, g.label), [])) for g in groups}
        for task in tasks
    }
    by_context: dict[str, dict[int, float]] = defaultdict(dict)
    for (label, tokens), scores in sorted(context_scores.items()):
        mean = _mean(scores)
        if mean is not None:
            by_context[label][tokens] = mean
    return SweepSummary(groups, _frontier(groups), tasks, matrix, dict(by_context))
