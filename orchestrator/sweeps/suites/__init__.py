"""The built-in suites: offline, generated deterministically from a seed, scored exactly.

Each suite is a function ``(tasks, context_tokens, seed) -> list[Task]``: ``tasks`` tasks for
each length in ``context_tokens`` (its default lengths when None). Same arguments, same tasks,
on any machine and Python version (``random.Random`` seeded with a string is stable).

``harbor`` is not generated: its tasks are read from the directory the sweep names
(``suites/harbor.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from orchestrator.errors import ConfigError
from orchestrator.sweeps.suites import (
    code_fix,
    gpu_kernel,
    harbor,
    nanogpt,
    oolong_pairs_synth,
    oolong_synth,
    s_niah,
)
from orchestrator.sweeps.tasks import Task

__all__ = ["DEFAULT_SUITE_TASKS", "PATH_SUITES", "SUITES", "SUITE_NAMES", "Generate", "generate"]

# Tasks per context length of a generated suite that names no count.
DEFAULT_SUITE_TASKS: Final = 10

Generate = Callable[[int, Sequence[int] | None, int], list[Task]]

SUITES: Final[dict[str, Generate]] = {
    s_niah.SUITE: s_niah.generate,
    oolong_synth.SUITE: oolong_synth.generate,
    oolong_pairs_synth.SUITE: oolong_pairs_synth.generate,
    code_fix.SUITE: code_fix.generate,
    gpu_kernel.SUITE: gpu_kernel.generate,
    nanogpt.SUITE: nanogpt.generate,
}
# Suites read from a directory the sweep names (``path``) rather than generated.
PATH_SUITES: Final = (harbor.SUITE,)
SUITE_NAMES: Final = (*SUITES, *PATH_SUITES)


def generate(
    suite: str,
    tasks: int | None,
    context_tokens: Sequence[int] | None,
    seed: int,
    path: str | None = None,
) -> list[Task]:
    """``suite``'s tasks: ``tasks`` of them (a generated suite's default when None; every task
    of a directory)."""
    if suite in PATH_SUITES:
        if path is None:
            raise ConfigError(f"suite {suite} needs a path (a task directory or a dataset)")
        return harbor.generate(Path(path), tasks)
    count = tasks if tasks is not None else DEFAULT_SUITE_TASKS
    return SUITES[suite](count, context_tokens, seed)
