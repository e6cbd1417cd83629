"""Whether a cell needs IPython's coroutine runner, answered without compiling it twice.

A cell may ``await`` at top level (``await rlm(...)``), so the kernel keeps IPython's
``autoawait``. IPython then decides per cell by compiling it with top-level await allowed and
looking at the code's flags, and ipykernel asks twice per ``execute_request`` (once itself,
once inside ``run_cell``): two extra compiles of every cell, about a tenth of a busy kernel's
CPU for a short cell (docs/benchmarks.md, session 14).

A module is a coroutine only if its source says ``await`` or ``async`` (top-level ``await``,
``async for``, ``async with``, an async comprehension): both are keywords, spelt only so. A
cell whose text holds neither word runs synchronously, and is answered here without a
compile; any other cell (the word may just sit in a string) gets IPython's own answer.
Stdlib only, installed by the runtime extension (``orchestrator/runtime/__init__.py``).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["ASYNC_WORDS", "install", "may_be_async"]

ASYNC_WORDS: Final = ("await", "async")


def may_be_async(cell: str) -> bool:
    """False when ``cell`` certainly compiles to no coroutine; True when it may."""
    return any(word in cell for word in ASYNC_WORDS)


def install(shell: Any) -> None:
    """Answer the shell's ``should_run_async`` from the text where that is certain."""
    full = shell.should_run_async

    def should_run_async(
        raw_cell: str, *, transformed_cell: Any = None, preprocessing_exc_tuple: Any = None
    ) -> bool:
        if (
            isinstance(transformed_cell, str)
            and preprocessing_exc_tuple is None
            and not may_be_async(transformed_cell)
        ):
            return False
        answer: bool = full(
            raw_cell,
            transformed_cell=transformed_cell,
            preprocessing_exc_tuple=preprocessing_exc_tuple,
        )
        return answer

    shell.should_run_async = should_run_async
