"""A sweep cell's row as the runner sends it (``sweep_add_cells``), for tests that build a
sweep by hand."""

from __future__ import annotations


def cell_spec(n: int, *, model: str = "openai/fake", variant: str = "rlm") -> dict[str, object]:
    return {
        "fingerprint": f"f{n}",
        "suite": "s-niah",
        "task_id": f"s-niah/2000/{n}",
        "model": model,
        "variant": variant,
        "seed": 1,
        "context_tokens": 2000,
    }
