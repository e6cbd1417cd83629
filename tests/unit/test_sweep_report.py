"""A sweep report's numbers (sweeps/summary.py) checked against the cells they come from, and
the files ``write_report`` makes (sweeps/plots.py): the numbers, not the pixels."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sweeps.plots import FIGURES, markdown_table, write_report
from orchestrator.sweeps.summary import bootstrap_interval, summarise

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cell(
    model: str,
    variant: str,
    task: int,
    seed: int,
    score: float | None,
    cost: float,
    context: int = 1000,
    state: str = "scored",
) -> dict[str, Any]:
    return {
        "model": model,
        "variant": variant,
        "task_id": f"s-niah/{context}/{task}",
        "seed": seed,
        "state": state,
        "score": score,
        "cost_usd": cost,
        "cost_known": True,
        "tokens": 100,
        "wall_s": 1.0,
        "context_tokens": context,
    }


def _cells() -> list[dict[str, Any]]:
    cells = []
    for task in range(2):
        for seed in (1, 2):
            # a: always right, expensive; b: right on task 0 only, cheap; c: never right, dear.
            cells.append(_cell("m/a", "rlm", task, seed, 1.0, 0.10))
            cells.append(_cell("m/b", "rlm", task, seed, 1.0 if task == 0 else 0.0, 0.01))
            cells.append(_cell("m/c", "rlm", task, seed, 0.0, 0.20, context=4000))
    cells.append(_cell("m/b", "rlm", 9, 1, None, 0.0, state="errored"))
    return cells


def test_groups_frontier_matrix_and_context_follow_the_cells() -> None:
    summary = summarise(_cells())
    rows = {r["model"]: r for r in summary.table()}
    assert rows["m/a"]["score"] == 1.0 and rows["m/a"]["scored"] == 4
    assert rows["m/b"]["score"] == 0.5 and rows["m/b"]["errored"] == 1
    assert rows["m/b"]["cells"] == 5  # the errored cell is a cell, not a 0
    assert rows["m/a"]["cost_usd"] == pytest.approx(0.4)
    assert rows["m/b"]["cost_per_cell"] == pytest.approx(0.04 / 5)
    # b is cheapest, a is best; c is dearer and worse than both: dominated.
    assert summary.frontier == ["m/b · rlm", "m/a · rlm"]
    assert [rows[m]["pareto"] for m in ("m/a", "m/b", "m/c")] == [True, True, False]
    assert summary.matrix["s-niah/1000/0"]["m/b · rlm"] == 1.0
    assert summary.matrix["s-niah/1000/1"]["m/b · rlm"] == 0.0
    assert summary.matrix["s-niah/1000/0"]["m/c · rlm"] is None  # c ran other tasks
    assert summary.by_context == {
        "m/a · rlm": {1000: 1.0},
        "m/b · rlm": {1000: 0.5},
        "m/c · rlm": {4000: 0.0},
    }


def test_the_bootstrap_interval_brackets_the_mean_and_is_repeatable() -> None:
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 1.0]
    low, high = bootstrap_interval(scores) or (0.0, 0.0)
    mean = sum(scores) / len(scores)
    assert 0.0 <= low < mean < high <= 1.0
    assert bootstrap_interval(scores) == (low, high)
    assert bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)
    assert bootstrap_interval([]) is None


def test_the_report_files_carry_the_summarys_numbers(tmp_path: Path) -> None:
    summary = summarise(_cells())
    written = write_report(summary, "demo", tmp_path)
    names = {p.name for p in written}
    assert {f"{f}.png" for f in FIGURES} | {"report.md", "index.html"} == names
    for figure in FIGURES:
        assert (tmp_path / f"{figure}.png").read_bytes().startswith(PNG_MAGIC)
    table = (tmp_path / "report.md").read_text()
    assert markdown_table(summary.table()) in table
    row_b = next(line for line in table.splitlines() if line.startswith("| m/b "))
    assert "| 0.500 |" in row_b and "| 4/5 |" in row_b and row_b.endswith("| yes |")
    page = (tmp_path / "index.html").read_text()
    inlined = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(inlined) == len(FIGURES)
    assert all(base64.b64decode(data).startswith(PNG_MAGIC) for data in inlined)
    assert 'src="http' not in page  # self-contained
