"""A task: what a trial asks, the long context it comes with, and how its answer is scored.

Built-in suites generate tasks deterministically (``sweeps/suites``); a task's ``content_hash``
covers everything that changes what a trial sees or how it is scored, so a sweep cell's
fingerprint changes exactly when its task does (``sweeps/grid.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["CHARS_PER_TOKEN", "Requirement", "Scoring", "Task"]

# How suites size a context in tokens without a tokenizer: English prose runs about four
# characters a token for the common BPE vocabularies.
CHARS_PER_TOKEN: Final = 4

Scoring = Literal["contains", "numeric", "exact", "pairs_f1", "gate", "verifier", "timed"]
# What a task may need of the machine besides a sandbox: "gpu" (docker with GPUs given to it),
# "torch" (its image built with PyTorch: the cuda image's --torch).
Requirement = Literal["gpu", "torch"]


@dataclass(frozen=True)
class Task:
    suite: str
    id: str  # unique within the suite, e.g. "s-niah/8000/3"
    question: str
    context: str  # the long context ("" when there is none)
    expected: Any  # JSON data: what scores 1
    scoring: Scoring
    params: dict[str, Any] = field(default_factory=dict)  # e.g. {"context_tokens": 8000}
    files: dict[str, str] = field(default_factory=dict)  # the workspace it starts with
    gates: tuple[str, ...] = ()  # commands that must pass in the sandbox (scoring "gate")
    # Where the task's files lie (a Harbor task directory); not part of its content, so a
    # dataset moved elsewhere keeps its cells.
    source: str | None = None
    # What the trial needs of this machine (a cell that cannot have it is not started here,
    # cli/sweep_runner.py), and the sandbox image it runs in (None: the daemon's).
    requires: tuple[Requirement, ...] = ()
    image: str | None = None

    @property
    def content_hash(self) -> str:
        body: dict[str, Any] = {
            "suite": self.suite,
            "id": self.id,
            "question": self.question,
            "context": hashlib.sha256(self.context.encode()).hexdigest(),
            "expected": self.expected,
            "scoring": self.scoring,
            "params": self.params,
            "files": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in self.files.items()},
            "gates": list(self.gates),
        }
        # Only when set: the tasks that need neither keep the fingerprints they had.
        if self.requires:
            body["requires"] = list(self.requires)
        if self.image is not None:
            body["image"] = self.image
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def context_tokens(self) -> int | None:
        value = self.params.get("context_tokens")
        return int(value) if value is not None else None
