"""A sweep report's pictures (matplotlib, drawn off-screen) and its pages: a self-contained
HTML page (the PNGs inlined) and a markdown table for the terminal.

Each figure is drawn to be read at a glance: titled, axes labelled with units, a legend naming
every series, values on bars, the colour of a group the same in every figure.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.sweeps.summary import CONFIDENCE, SweepSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["FIGURES", "markdown_table", "write_report"]

FIGURES: Final = ("score_vs_cost", "scores", "task_matrix", "score_vs_context")
DPI: Final = 120
WIDE: Final = (9.0, 5.0)
PALETTE: Final = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)
MATRIX_MAX_TASKS: Final = 60  # more rows than this are unreadable: the first ones are shown


def _colours(summary: SweepSummary) -> dict[str, str]:
    return {g.label: PALETTE[i % len(PALETTE)] for i, g in enumerate(summary.groups)}


def _figure(size: tuple[float, float] = WIDE) -> tuple[Figure, Axes]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=size, dpi=DPI, layout="constrained")
    return fig, ax


def _png(fig: Figure) -> bytes:
    from matplotlib import pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _score_vs_cost(summary: SweepSummary, title: str) -> bytes:
    fig, ax = _figure()
    colours = _colours(summary)
    points = {
        g.label: (g.cost_per_cell, g.mean_score)
        for g in summary.groups
        if g.mean_score is not None and g.cost_per_cell is not None
    }
    for label, (cost, score) in points.items():
        ax.scatter(cost, score, s=80, color=colours[label], label=label)
        ax.annotate(
            label, (cost, score), textcoords="offset points", xytext=(6, 6), fontsize="small"
        )
    frontier = [points[label] for label in summary.frontier if label in points]
    if len(frontier) > 1:
        ax.plot(
            [cost for cost, _ in frontier],
            [score for _, score in frontier],
            linestyle="--",
            color="black",
            linewidth=1,
            label="Pareto frontier",
        )
    ax.set_title(f"{title}: score against cost")
    ax.set_xlabel("mean cost per cell (USD)")
    ax.set_ylabel("mean score (0–1)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(loc="best", fontsize="small")
    return _png(fig)


def _scores(summary: SweepSummary, title: str) -> bytes:
    fig, ax = _figure()
    colours = _colours(summary)
    groups = [g for g in summary.groups if g.mean_score is not None]
    xs = range(len(groups))
    means = [g.mean_score or 0.0 for g in groups]
    errors = [
        [m - (g.ci_low if g.ci_low is not None else m) for g, m in zip(groups, means, strict=True)],
        [
            (g.ci_high if g.ci_high is not None else m) - m
            for g, m in zip(groups, means, strict=True)
        ],
    ]
    bars = ax.bar(xs, means, color=[colours[g.label] for g in groups], yerr=errors, capsize=4)
    ax.bar_label(bars, labels=[f"{m:.2f}" for m in means], padding=3)
    ax.set_xticks(list(xs), [g.label for g in groups], rotation=20, ha="right")
    ax.set_title(f"{title}: mean score per model and variant ({CONFIDENCE:.0%} bootstrap CI)")
    ax.set_ylabel("mean score (0–1)")
    ax.set_ylim(0, 1.15)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _task_matrix(summary: SweepSummary, title: str) -> bytes:
    tasks = summary.tasks[:MATRIX_MAX_TASKS]
    labels = [g.label for g in summary.groups]
    height = max(3.0, 0.3 * len(tasks) + 1.5)
    fig, ax = _figure((max(6.0, 1.6 * len(labels) + 3), height))
    values = [
        [v if (v := summary.matrix[t].get(label)) is not None else float("nan") for label in labels]
        for t in tasks
    ]
    image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_yticks(range(len(tasks)), tasks, fontsize="small")
    if len(tasks) * len(labels) <= 400:
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if v == v:  # not NaN
                    ax.text(
                        j,
                        i,
                        f"{v:.2f}",
                        ha="center",
                        va="center",
                        fontsize="x-small",
                        color="white" if v < 0.5 else "black",
                    )
    shown = "" if len(summary.tasks) <= MATRIX_MAX_TASKS else f" (first {MATRIX_MAX_TASKS})"
    ax.set_title(f"{title}: mean score per task{shown}")
    fig.colorbar(image, ax=ax, label="mean score (0–1)")
    return _png(fig)


def _tokens(n: int) -> str:
    return (
        f"{n // 1024}K"
        if n >= 1024 and n % 1024 == 0
        else (f"{n / 1000:g}K" if n >= 1000 else str(n))
    )


def _score_vs_context(summary: SweepSummary, title: str) -> bytes | None:
    if not summary.by_context:
        return None
    fig, ax = _figure()
    colours = _colours(summary)
    for label, series in summary.by_context.items():
        lengths = sorted(series)
        ax.plot(
            lengths, [series[n] for n in lengths], marker="o", color=colours[label], label=label
        )
    ax.set_xscale("log", base=2)
    lengths = sorted({n for series in summary.by_context.values() for n in series})
    ax.set_xticks(lengths, [_tokens(n) for n in lengths])
    ax.minorticks_off()
    ax.set_title(f"{title}: score against context length")
    ax.set_xlabel("context length (tokens, log scale)")
    ax.set_ylabel("mean score (0–1)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return _png(fig)


TABLE_HEADINGS: Final = (
    "model",
    "variant",
    "score",
    "95 % CI",
    "scored",
    "cost (USD)",
    "tokens",
    "Pareto",
)


def _row_texts(r: dict[str, Any]) -> tuple[str, ...]:
    """One ``SweepSummary.table()`` row as the table shows it, in ``TABLE_HEADINGS`` order."""
    score = "–" if r["score"] is None else f"{r['score']:.3f}"
    ci = "–" if r["ci_low"] is None else f"{r['ci_low']:.2f}–{r['ci_high']:.2f}"
    cost = f"{r['cost_usd']:.4f}" + ("" if r["cost_known"] else " (partial)")
    pareto = "yes" if r["pareto"] else ""
    scored = f"{r['scored']}/{r['cells']}"
    return (r["model"], r["variant"], score, ci, scored, cost, str(r["tokens"]), pareto)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The per-group table as markdown (``SweepSummary.table()`` rows)."""
    out = ["| " + " | ".join(TABLE_HEADINGS) + " |", "|" + "---|" * len(TABLE_HEADINGS)]
    out.extend("| " + " | ".join(_row_texts(r)) + " |" for r in rows)
    return "\n".join(out) + "\n"


def write_report(summary: SweepSummary, title: str, out: Path) -> list[Path]:
    """Write the PNGs, ``report.md`` and ``index.html`` (PNGs inlined) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = {
        "score_vs_cost": _score_vs_cost(summary, title),
        "scores": _scores(summary, title),
        "task_matrix": _task_matrix(summary, title),
        "score_vs_context": _score_vs_context(summary, title),
    }
    written: list[Path] = []
    images: list[tuple[str, bytes]] = []
    for name in FIGURES:
        data = drawn[name]
        if data is None:
            continue
        path = out / f"{name}.png"
        path.write_bytes(data)
        written.append(path)
        images.append((name, data))
    table = markdown_table(summary.table())
    md = out / "report.md"
    md.write_text(f"# Sweep {title}\n\n{table}", encoding="utf-8")
    written.append(md)
    page = out / "index.html"
    page.write_text(_html(title, summary, images), encoding="utf-8")
    written.append(page)
    return written


def _html(title: str, summary: SweepSummary, images: Sequence[tuple[str, bytes]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TABLE_HEADINGS)
    body = [
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _row_texts(r)) + "</tr>"
        for r in summary.table()
    ]
    figures = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(data).decode()}"></figure>'
        for name, data in images
    )
    name = html.escape(title)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Sweep {name}</title><style>"
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
        "img{max-width:100%}</style></head><body>"
        f"<h1>Sweep {name}</h1><table><tr>{head}</tr>{''.join(body)}</table>{figures}"
        "</body></html>\n"
    )
