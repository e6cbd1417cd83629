"""``code-fix``: small repositories whose pytest suite fails — a bug to fix or a feature to
add (``code_fix_repos.py``) —, run in autonomous mode with the suite as the gate: a trial scores
1 when the gate passed in the sandbox (stop reason ``gate_passed``), else 0.

``tasks`` takes the first repositories (at most ``len(REPOS)``); ``seed`` orders them; context
lengths do not apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from orchestrator.sweeps.suites.code_fix_repos import REPOS
from orchestrator.sweeps.suites.haystack import rng_for
from orchestrator.sweeps.tasks import Task

__all__ = ["GATE", "PROMPT", "SUITE", "generate"]

SUITE: Final = "code-fix"
GATE: Final = "python -m pytest -q"
PROMPT: Final = (
    "The repository in your working directory has a failing test suite. {task} "
    "Edit the files (not the tests) so that `{gate}` passes; run it to check."
)


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    repos = list(REPOS)
    if seed:
        rng_for(SUITE, seed).shuffle(repos)
    return [
        Task(
            suite=SUITE,
            id=f"{SUITE}/{repo.name}",
            question=PROMPT.format(task=repo.task, gate=GATE),
            context="",
            expected=None,
            scoring="gate",
            files=dict(repo.files),
            gates=(GATE,),
        )
        for repo in repos[:tasks]
    ]
