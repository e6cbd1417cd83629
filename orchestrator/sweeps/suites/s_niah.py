"""``s-niah``: one needle (``The special magic number is N.``) in a haystack of prose; the
answer scores 1 when it contains N (RULER's single needle, generated offline)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from orchestrator.sweeps.suites.haystack import haystack_sentences, rng_for
from orchestrator.sweeps.tasks import Task

__all__ = ["DEFAULT_CONTEXT_TOKENS", "NEEDLE", "QUESTION", "SUITE", "generate"]

SUITE: Final = "s-niah"
DEFAULT_CONTEXT_TOKENS: Final = (2000, 8000)
NEEDLE: Final = "The special magic number is {n}."
QUESTION: Final = (
    "Somewhere in the context is a sentence stating a special magic number. "
    "What is the special magic number? Answer with the number."
)
_NUMBER_MIN: Final = 1_000_000
_NUMBER_MAX: Final = 9_999_999


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    out: list[Task] = []
    for length in context_tokens or DEFAULT_CONTEXT_TOKENS:
        for index in range(tasks):
            rng = rng_for(SUITE, seed, length, index)
            number = rng.randint(_NUMBER_MIN, _NUMBER_MAX)
            sentences = haystack_sentences(rng, length)
            depth = rng.random()
            sentences.insert(round(depth * len(sentences)), NEEDLE.format(n=number))
            out.append(
                Task(
                    suite=SUITE,
                    id=f"{SUITE}/{length}/{index}",
                    question=QUESTION,
                    context=" ".join(sentences),
                    expected=str(number),
                    scoring="contains",
                    params={"context_tokens": length, "depth": round(depth, 3)},
                )
            )
    return out
