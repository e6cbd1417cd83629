"""A cell without ``await``/``async`` is known synchronous without a compile
(orchestrator/runtime/async_check.py); every other cell gets IPython's own answer."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.async_helpers import _should_be_async

from orchestrator.runtime.async_check import install, may_be_async

CELLS = [
    "x = 1",
    "print('no waiting here')",
    "await asyncio.sleep(0)",
    "r = await rlm('task')",
    "async with lock:\n    pass",
    "async for item in stream():\n    print(item)",
    "[x async for x in agen()]",
    "def f():\n    return 1\nf()",
    "async def f():\n    await g()\n",  # async, but defines a coroutine function: not a coroutine
    "s = 'await in a string'",
    "# async only in a comment\nx = 2",
    "await",  # a syntax error
    "return 5",  # invalid at top level
]


@pytest.mark.parametrize("cell", CELLS)
def test_the_text_check_never_misses_a_coroutine(cell: str) -> None:
    if _should_be_async(cell):
        assert may_be_async(cell)


class _Shell:
    """The one method the check wraps, counting what reaches it."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def should_run_async(
        self, raw_cell: str, *, transformed_cell: Any = None, preprocessing_exc_tuple: Any = None
    ) -> bool:
        self.asked.append(raw_cell)
        return bool(transformed_cell) and _should_be_async(transformed_cell)


def test_only_cells_that_may_await_reach_the_compile() -> None:
    shell = _Shell()
    install(shell)
    assert shell.should_run_async("x = 1", transformed_cell="x = 1") is False
    assert shell.asked == []
    cell = "await asyncio.sleep(0)"
    assert shell.should_run_async(cell, transformed_cell=cell) is True
    text = "s = 'await'"
    assert shell.should_run_async(text, transformed_cell=text) is False
    assert shell.asked == [cell, text]
    # A failed transform, or no transformed cell at all: IPython decides, as before.
    shell.should_run_async("x = (", transformed_cell="x = (", preprocessing_exc_tuple=(1, 2, 3))
    shell.should_run_async("y = 1")
    assert shell.asked[2:] == ["x = (", "y = 1"]


def test_a_real_shell_still_runs_top_level_await() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell()
    install(shell)
    assert shell.run_cell("import asyncio\nx = 1").success
    assert shell.run_cell("await asyncio.sleep(0)\ny = x + 1").success
    assert shell.user_ns["y"] == 2
