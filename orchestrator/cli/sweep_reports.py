"""A sweep's report from its cells: ``sweep report`` (cells from the daemon) and ``sweep merge``
(cells from the merged store) write the same files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_sweep_report"]


def write_sweep_report(name: str, cells: Sequence[dict[str, Any]], out: Path) -> str:
    """``index.html``, the PNGs, ``report.md`` and ``summary.json`` in ``out``; the markdown
    table."""
    from orchestrator.sweeps.plots import markdown_table, write_report
    from orchestrator.sweeps.summary import summarise

    summary = summarise(list(cells))
    write_report(summary, name, out)
    numbers = {
        "sweep": name,
        "groups": summary.table(),
        "frontier": summary.frontier,
        "matrix": summary.matrix,
        "by_context": {k: {str(n): v for n, v in s.items()} for k, s in summary.by_context.items()},
    }
    (out / "summary.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    return markdown_table(summary.table())
