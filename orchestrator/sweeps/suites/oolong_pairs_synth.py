"""``oolong-pairs-synth``: pairs of records that satisfy a condition (after Oolong's pairs
split). The context lists people with a city and a year; the question asks for every pair of
people who share a city and whose years differ by at most ``YEAR_WINDOW``. The answer lists
pairs as ``(name, name)``; it scores the F1 of its pairs against the true set.

The number of cities grows with the context (about ``PEOPLE_PER_CITY`` people each), so the
true pairs grow linearly with the length, not quadratically: an answer stays writable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import combinations
from typing import Final

from orchestrator.sweeps.suites.haystack import FIRST_NAMES, rng_for
from orchestrator.sweeps.tasks import CHARS_PER_TOKEN, Task

__all__ = ["DEFAULT_CONTEXT_TOKENS", "SUITE", "YEAR_WINDOW", "generate"]

SUITE: Final = "oolong-pairs-synth"
DEFAULT_CONTEXT_TOKENS: Final = (1000, 4000)
YEAR_WINDOW: Final = 2
PEOPLE_PER_CITY: Final = 6
_MIN_CITIES: Final = 4
_SYLLABLES: Final = ("ka", "lo", "mi", "ra", "to", "ve", "su", "na", "de", "po", "ri", "ba")
_LINE_CHARS: Final = 64  # about what one record line takes, to size the city list
_LAST: Final = (
    "Abara",
    "Brandt",
    "Costa",
    "Dahl",
    "Eze",
    "Fujita",
    "Gallo",
    "Horvat",
    "Ilves",
    "Jensen",
    "Kato",
    "Lind",
    "Mensah",
    "Novak",
    "Okafor",
    "Pereira",
    "Quist",
    "Rossi",
    "Sato",
    "Tamm",
)
_INITIALS: Final = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_FIRST_YEAR: Final = 1990
_LAST_YEAR: Final = 2020
QUESTION: Final = (
    "List every pair of people in the records who live in the same city and whose start "
    f"years differ by at most {YEAR_WINDOW}. Write each pair as (Name, Name), the names as "
    "written, all pairs in one answer; write none if there are none."
)


def _city(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(3)).capitalize()


def _people(rng: random.Random, tokens: int) -> list[tuple[str, str, int]]:
    """People until the context is full (or every name is used: 13,520 of them)."""
    budget = tokens * CHARS_PER_TOKEN
    wanted = max(_MIN_CITIES, budget // _LINE_CHARS // PEOPLE_PER_CITY)
    cities = sorted({_city(rng) for _ in range(wanted * 2)})[:wanted]
    names = [f"{f} {i}. {last}" for f in FIRST_NAMES for i in _INITIALS for last in _LAST]
    rng.shuffle(names)
    people: list[tuple[str, str, int]] = []
    used = 0
    for name in names:
        if used >= budget:
            break
        person = (name, rng.choice(cities), rng.randint(_FIRST_YEAR, _LAST_YEAR))
        people.append(person)
        used += len(_line(len(people), person)) + 1
    return people


def _line(number: int, person: tuple[str, str, int]) -> str:
    name, city, year = person
    return f"Record {number}: {name} lives in {city} and started working in {year}."


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    out: list[Task] = []
    for length in context_tokens or DEFAULT_CONTEXT_TOKENS:
        for index in range(tasks):
            rng = rng_for(SUITE, seed, length, index)
            people = _people(rng, length)
            pairs = sorted(
                sorted((a[0], b[0]))
                for a, b in combinations(people, 2)
                if a[1] == b[1] and abs(a[2] - b[2]) <= YEAR_WINDOW
            )
            out.append(
                Task(
                    suite=SUITE,
                    id=f"{SUITE}/{length}/{index}",
                    question=QUESTION,
                    context="\n".join(_line(i + 1, p) for i, p in enumerate(people)),
                    expected=pairs,
                    scoring="pairs_f1",
                    params={"context_tokens": length, "records": len(people)},
                )
            )
    return out
