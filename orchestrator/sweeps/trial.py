"""What one trial gives its session: the prompt, and the files its workspace starts with.

- ``rlm`` variants: the long context is the REPL variable ``context``, bound at every kernel
  start from the workspace file ``context.txt`` (the session's ``repl_context_file``); the
  prompt is the question and where the context is (it is never pasted into the prompt).
- ``rlm: false`` (vanilla): the context is pasted into the prompt, cut to fit the model's
  window (``PROMPT_SHARE`` of it, counted at ``CHARS_PER_TOKEN``); ``truncated`` records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from orchestrator.sweeps.grid import Cell
from orchestrator.sweeps.tasks import CHARS_PER_TOKEN

__all__ = ["CONTEXT_FILE", "PROMPT_SHARE", "TrialInput", "trial_input"]

CONTEXT_FILE: Final = "context.txt"
# The share of the model's window a vanilla prompt's context may fill (the rest: the system
# prompt, the question and the answer).
PROMPT_SHARE: Final = 0.75
RLM_PROMPT: Final = (
    "{question}\n\n"
    "The context for this question ({chars} characters) is in the REPL variable `context` "
    "(also the file {file} in your working directory). Do not print it whole: inspect it "
    "with code. When you know the answer, reply with it as plain text."
)
VANILLA_PROMPT: Final = "{question}\n\nContext:\n{context}"


@dataclass(frozen=True)
class TrialInput:
    prompt: str
    files: dict[str, str] = field(default_factory=dict)
    truncated: bool = False
    context_file: str | None = None  # bound to the REPL variable ``context`` at kernel start


def trial_input(cell: Cell, context_window: int) -> TrialInput:
    task = cell.task
    if not task.context:
        return TrialInput(task.question, dict(task.files))
    if cell.variant.rlm:
        prompt = RLM_PROMPT.format(
            question=task.question, chars=len(task.context), file=CONTEXT_FILE
        )
        return TrialInput(prompt, {CONTEXT_FILE: task.context}, context_file=CONTEXT_FILE)
    room = int(context_window * PROMPT_SHARE) * CHARS_PER_TOKEN
    context = task.context[:room]
    return TrialInput(
        VANILLA_PROMPT.format(question=task.question, context=context),
        truncated=len(context) < len(task.context),
    )
