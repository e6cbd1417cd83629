"""The built-in suites: offline, generated deterministically from a seed, scored exactly.

Each suite is a function ``(tasks, context_tokens, seed) -> list[Task]``: ``tasks`` tasks for
each length in ``context_tokens`` (its default lengths when None). Same arguments, same tasks,
on any machine and Python version (``random.Random`` seeded with a string is stable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from orchestrator.sweeps.suites import code_fix, oolong_pairs_synth, oolong_synth, s_niah
from orchestrator.sweeps.tasks import Task

__all__ = ["SUITES", "SUITE_NAMES", "Generate", "generate"]

Generate = Callable[[int, Sequence[int] | None, int], list[Task]]

SUITES: Final[dict[str, Generate]] = {
    s_niah.SUITE: s_niah.generate,
    oolong_synth.SUITE: oolong_synth.generate,
    oolong_pairs_synth.SUITE: oolong_pairs_synth.generate,
    code_fix.SUITE: code_fix.generate,
}
SUITE_NAMES: Final = tuple(SUITES)


def generate(suite: str, tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    return SUITES[suite](tasks, context_tokens, seed)
