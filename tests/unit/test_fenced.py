from __future__ import annotations

import pytest

from orchestrator.agent.fenced import extract_fenced_call, render_fenced_result


def test_first_python_block_wins_and_prose_after_is_ignored() -> None:
    text = "Let me compute.\n```python\nprint(1)\n```\nThen\n```python\nprint(2)\n```\nDone."
    found = extract_fenced_call(text)
    assert found == ("print(1)", "Let me compute.")


def test_unclosed_fence_is_accepted() -> None:
    assert extract_fenced_call("```python\nx = 2\nprint(x)") == ("x = 2\nprint(x)", "")


@pytest.mark.parametrize("tag", ["py", "Python", "python3", "ipython"])
def test_language_tags(tag: str) -> None:
    found = extract_fenced_call(f"```{tag}\nprint(3)\n```")
    assert found is not None and found[0] == "print(3)"


def test_json_block_naming_the_tool_is_a_fallback() -> None:
    text = '```json\n{"name": "ipython", "arguments": {"code": "print(4)"}}\n```'
    assert extract_fenced_call(text) == ("print(4)", "")


def test_json_block_with_string_arguments() -> None:
    text = '```json\n{"name": "ipython", "arguments": "{\\"code\\": \\"print(5)\\"}"}\n```'
    assert extract_fenced_call(text) == ("print(5)", "")


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        "```\nplain fence, no language\n```",
        '```json\n{"name": "other_tool", "arguments": {"code": "x"}}\n```',
        "```json\nnot json\n```",
        "```python\n   \n```",
    ],
)
def test_no_call(text: str) -> None:
    assert extract_fenced_call(text) is None


def test_render_result_is_fenced_text() -> None:
    assert render_fenced_result("42") == "Output of your code:\n```\n42\n```"
