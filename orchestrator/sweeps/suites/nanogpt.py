"""``nanogpt``: a small nanoGPT speedrun — reach a validation loss target; time is the score.

The workspace holds a seeded corpus (``data/train.txt``, ``data/val.txt``; the language and its
exact entropy in ``nanogpt_files.py``), ``train.py`` (a small character-level GPT that trains
until its validation loss reaches the target and saves itself as TorchScript) and
``check_speedrun.py``. The gate checks the checker's and the validation data's hashes, then runs
the checker: it times ``python train.py`` from start to exit, loads ``out/model.pt`` and
measures the validation loss itself; it passes when the loss is at most the target
(the text's entropy per character plus ``MARGIN``). Scoring ``timed``: ``REFERENCE_S /
(REFERENCE_S + seconds)``.

Runs in the ``cuda`` image built with PyTorch (``prime-agent images build cuda --torch``) and
needs a GPU (``requires=("gpu", "torch")``). ``tasks`` tasks, one corpus each from ``seed``;
context lengths do not apply. Not run on a GPU yet: ``REFERENCE_S`` and ``MARGIN`` are
estimates (docs/sweeps.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from orchestrator.sweeps.scoring import TIMED_RESULT_FILE
from orchestrator.sweeps.suites.haystack import rng_for
from orchestrator.sweeps.suites.nanogpt_files import check_script, split_corpus, train_script
from orchestrator.sweeps.tasks import Task

__all__ = ["IMAGE", "MARGIN", "REFERENCE_S", "SUITE", "gate_command", "generate"]

SUITE: Final = "nanogpt"
IMAGE: Final = "cuda"
TRAIN_CHARS: Final = 400_000
VAL_CHARS: Final = 40_000
# The target is the validation text's entropy per character plus this (nats): a model that
# knows the language but not arithmetic, or that loses the first characters of each window,
# still has to come close.
MARGIN: Final = 0.15
# The time a timed score compares with (0.5 at this many seconds): an estimate of the
# baseline on one current GPU, not measured yet.
REFERENCE_S: Final = 120.0
TRAIN_LIMIT_S: Final = 1500.0  # the checker stops train.py after this long
GATE_TIMEOUT_S: Final = 1800.0
CHECK_FILE: Final = "check_speedrun.py"
VAL_FILE: Final = "data/val.txt"
PROMPT: Final = (
    "Speedrun: make `python train.py` reach a validation loss of at most {target} "
    "(nats per character on data/val.txt) as fast as you can. It trains a small "
    "character-level GPT on data/train.txt and saves it as TorchScript to out/model.pt; the "
    "gate runs `python {check}`, which times train.py from start to exit and measures the "
    "loss of the saved model itself (read its docstring for the interface). It must pass; "
    "then your score grows as the time falls. Change train.py freely (model, optimiser, "
    "schedule, precision, compilation); do not edit {check} or {val}."
)


def gate_command(check_text: str, val_text: str) -> str:
    """The gate: the checker and the validation data unchanged (their hashes are part of the
    command), then the checker."""
    pinned = "".join(
        f"{hashlib.sha256(text.encode()).hexdigest()}  {name}\\n"
        for name, text in ((CHECK_FILE, check_text), (VAL_FILE, val_text))
    )
    return f"printf '{pinned}' | sha256sum -c --quiet - && python {CHECK_FILE}"


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    out: list[Task] = []
    for index in range(tasks):
        rng = rng_for(SUITE, seed, index)
        train, val, entropy = split_corpus(rng, TRAIN_CHARS, VAL_CHARS)
        target = round(entropy + MARGIN, 3)
        check = check_script(target, REFERENCE_S, TRAIN_LIMIT_S, TIMED_RESULT_FILE)
        prompt = PROMPT.format(target=target, check=CHECK_FILE, val=VAL_FILE)
        config = {"target_val_loss": target, "entropy_per_char": round(entropy, 4)}
        out.append(
            Task(
                suite=SUITE,
                id=f"{SUITE}/{seed}-{index}",
                question=prompt,
                context="",
                expected=None,
                scoring="timed",
                params={"target_val_loss": target, "gate_timeout_s": GATE_TIMEOUT_S},
                files={
                    "train.py": train_script(),
                    CHECK_FILE: check,
                    "speedrun.json": json.dumps(config, indent=2) + "\n",
                    "data/train.txt": train,
                    VAL_FILE: val,
                    "README.md": prompt + "\n",
                },
                gates=(gate_command(check, val),),
                requires=("gpu", "torch"),
                image=IMAGE,
            )
        )
    return out
