"""Filler prose for long contexts: plain sentences, no digits (a number in a haystack is
always a needle), drawn from a seeded generator so the same seed gives the same text."""

from __future__ import annotations

import random
from typing import Final

from orchestrator.sweeps.tasks import CHARS_PER_TOKEN

__all__ = ["FIRST_NAMES", "haystack_sentences", "rng_for"]

# People's first names for record-style contexts (oolong suites), one per initial.
FIRST_NAMES: Final = (
    "Ada",
    "Bela",
    "Chidi",
    "Dara",
    "Emeka",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kemal",
    "Lena",
    "Mateo",
    "Nia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Vera",
    "Wim",
    "Xiu",
    "Yara",
    "Zeno",
)
_SUBJECTS: Final = (
    "The river",
    "An old map",
    "The committee",
    "A quiet engineer",
    "The garden",
    "Our library",
    "The harbour master",
    "A travelling musician",
    "The weather station",
    "The night train",
    "A patient teacher",
    "The village council",
    "The lighthouse keeper",
    "A young botanist",
)
_VERBS: Final = (
    "described",
    "carried",
    "considered",
    "painted",
    "measured",
    "remembered",
    "repaired",
    "followed",
    "collected",
    "questioned",
    "welcomed",
    "ignored",
    "studied",
    "announced",
)
_OBJECTS: Final = (
    "the shape of the northern hills",
    "a basket of winter apples",
    "the sound of distant bells",
    "an unfinished letter",
    "the colour of the evening sky",
    "a list of forgotten recipes",
    "the path along the canal",
    "a box of wooden toys",
    "the rules of an old card game",
    "the history of the stone bridge",
    "a song about the sea",
    "the view from the tower",
)
_ENDINGS: Final = (
    "before the market opened.",
    "while the rain kept falling.",
    "without saying much.",
    "as everyone expected.",
    "with great care.",
    "after a long silence.",
    "once again.",
    "in the early morning.",
    "for reasons nobody recorded.",
    "and then went home.",
)


def rng_for(*parts: object) -> random.Random:
    """A generator seeded by ``parts`` (a string seed is hashed with SHA-512: stable)."""
    return random.Random(":".join(str(p) for p in parts))


def haystack_sentences(rng: random.Random, tokens: int) -> list[str]:
    """Sentences whose joined length (one space apart) is about ``tokens`` tokens."""
    budget = tokens * CHARS_PER_TOKEN
    out: list[str] = []
    used = 0
    while used < budget:
        sentence = (
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
            f"{rng.choice(_ENDINGS)}"
        )
        out.append(sentence)
        used += len(sentence) + 1
    return out
