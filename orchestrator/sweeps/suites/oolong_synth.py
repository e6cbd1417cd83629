"""``oolong-synth``: aggregation over labelled records (after Oolong's synthetic split).

The context is a list of records, one a line, each with a category; the question asks for a
count (numeric: scores 0.75^|error|), the most or least frequent category, or which of two
categories is more frequent (exact). Categories are drawn with unequal weights and a question
is only asked when its answer is unique (no ties).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Final

from orchestrator.sweeps.suites.haystack import FIRST_NAMES, rng_for
from orchestrator.sweeps.tasks import CHARS_PER_TOKEN, Task

__all__ = ["CATEGORIES", "DEFAULT_CONTEXT_TOKENS", "SUITE", "generate"]

SUITE: Final = "oolong-synth"
DEFAULT_CONTEXT_TOKENS: Final = (2000, 8000)
CATEGORIES: Final = ("billing", "shipping", "returns", "praise", "defect", "feature")
_WEIGHTS: Final = (9, 7, 5, 4, 2, 1)
_TOPICS: Final = (
    "the invoice sent last week",
    "a parcel that arrived late",
    "sending back a jacket",
    "how friendly the support team was",
    "a kettle that stopped working",
    "a dark mode for the app",
    "a double charge on the card",
    "tracking a delivery",
    "a refund for a lamp",
    "the quality of the new shoes",
    "a cracked phone screen",
    "exporting reports as PDF",
)
_QUESTION_KINDS: Final = ("count", "most", "least", "compare")
_ANSWER_HINT: Final = "Answer with the {what} only."


def _records(rng: random.Random, tokens: int) -> tuple[list[str], list[str]]:
    lines: list[str] = []
    labels: list[str] = []
    used = 0
    while used < tokens * CHARS_PER_TOKEN:
        label = rng.choices(CATEGORIES, weights=_WEIGHTS)[0]
        who, what = rng.choice(FIRST_NAMES), rng.choice(_TOPICS)
        line = f"Record {len(lines) + 1}: {who} wrote about {what}. Category: {label}."
        lines.append(line)
        labels.append(label)
        used += len(line) + 1
    return lines, labels


def _question(rng: random.Random, counts: Counter[str]) -> tuple[str, object, str]:
    """(question, expected, scoring) for a kind whose answer is unique."""
    ranked = counts.most_common()
    kinds = list(_QUESTION_KINDS)
    rng.shuffle(kinds)
    for kind in kinds:
        if kind == "count":
            label = rng.choice(CATEGORIES)
            question = f"How many records have the category {label}? "
            return question + _ANSWER_HINT.format(what="number"), counts[label], "numeric"
        if kind == "most" and len(ranked) > 1 and ranked[0][1] != ranked[1][1]:
            question = "Which category is the most frequent among the records? "
            return question + _ANSWER_HINT.format(what="category"), ranked[0][0], "exact"
        if kind == "least" and len(ranked) > 1 and ranked[-1][1] != ranked[-2][1]:
            question = "Which category is the least frequent among the records? "
            return question + _ANSWER_HINT.format(what="category"), ranked[-1][0], "exact"
        if kind == "compare":
            first, second = rng.sample(CATEGORIES, 2)
            if counts[first] != counts[second]:
                question = (
                    f"Which category has more records: {first} or {second}? "
                    + _ANSWER_HINT.format(what="category")
                )
                winner = first if counts[first] > counts[second] else second
                return question, winner, "exact"
    label = CATEGORIES[0]  # every kind above tied: a count is always unique
    question = f"How many records have the category {label}? "
    return question + _ANSWER_HINT.format(what="number"), counts[label], "numeric"


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    out: list[Task] = []
    for length in context_tokens or DEFAULT_CONTEXT_TOKENS:
        for index in range(tasks):
            rng = rng_for(SUITE, seed, length, index)
            lines, labels = _records(rng, length)
            question, expected, scoring = _question(rng, Counter(labels))
            out.append(
                Task(
                    suite=SUITE,
                    id=f"{SUITE}/{length}/{index}",
                    question=question,
                    context="\n".join(lines),
                    expected=expected,
                    scoring="numeric" if scoring == "numeric" else "exact",
                    params={"context_tokens": length, "records": len(lines)},
                )
            )
    return out
