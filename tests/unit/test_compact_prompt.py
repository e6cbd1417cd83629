"""The compact base prompt that fenced-protocol (small, embedded) models get: the guidance they
were missing on real tasks, and worked examples that really work when run as written
(docs/embedded-model.md, "Which embedded variant")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.agent.prompts import EnvironmentFacts, build_system_prompt

FACTS = EnvironmentFacts(cwd="/w", model="m", backend="local", today="2026-01-01")
# A fenced model's context is small (the embedded one's default window is 8192 tokens).
COMPACT_MAX_CHARS = 1400
# The sandbox kernel's shell: IPython with the runtime's extension (``edit`` and the helpers).
RUN_CELL = (
    "import sys\n"
    "from IPython.core.interactiveshell import InteractiveShell\n"
    "shell = InteractiveShell.instance()\n"
    "shell.extension_manager.load_extension('orchestrator.runtime')\n"
    "result = shell.run_cell(sys.stdin.read())\n"
    "sys.exit(0 if result.success else 1)\n"
)
BUGGY_CALC = "def add(a, b):\n    return a - b\n"
CALC_TESTS = (
    "from calc import add\n\n\n"
    "def test_small():\n    assert add(2, 3) == 5\n\n\n"
    "def test_zero():\n    assert add(0, 4) == 4\n"
)


def _compact() -> str:
    prompt = build_system_prompt(FACTS, tool_protocol="fenced")
    return prompt[: prompt.index("# Environment")]


def _blocks(prompt: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", prompt, flags=re.DOTALL)


def _run_cell(code: str, cwd: Path) -> str:
    """One block as the sandbox's IPython kernel runs it (``!`` lines and ``edit`` included),
    with this interpreter first on PATH as the sandbox's is (its ``python`` has pytest)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", RUN_CELL],
        input=code,
        cwd=cwd,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_compact_prompt_says_run_code_before_answering_and_edit_the_file() -> None:
    compact = _compact()
    assert "Never guess" in compact
    assert "Run code first, then answer from its output" in compact
    assert "change the file on disk with edit(path, old, new)" in compact
    assert "a function defined in the session does not change the file" in compact
    assert "run the tests" in compact
    assert "If an error repeats, read the file again" in compact
    assert len(compact) < COMPACT_MAX_CHARS
    # The native prompt (big models) is not the compact one and carries none of this.
    native = build_system_prompt(FACTS, tool_protocol="native")
    assert "Never guess" not in native and "```python" not in native


def test_the_search_example_finds_the_one_line_with_a_number(tmp_path: Path) -> None:
    search = _blocks(_compact())[0]
    assert 'open("notes.txt")' in search
    lines = [f"Line {chr(97 + i % 26)} of the prose, nothing to see here." for i in range(2000)]
    lines[1234] = "The special magic number is 48213."
    (tmp_path / "notes.txt").write_text("\n".join(lines) + "\n")
    assert _run_cell(search, tmp_path).strip() == "1234 The special magic number is 48213."


def test_the_fix_example_reads_the_file_then_edits_it_so_the_tests_pass(tmp_path: Path) -> None:
    read, fix = _blocks(_compact())[1:3]
    (tmp_path / "calc.py").write_text(BUGGY_CALC)
    (tmp_path / "test_calc.py").write_text(CALC_TESTS)
    assert "return a - b" in _run_cell(read, tmp_path)
    out = _run_cell(fix, tmp_path)
    assert "2 passed" in out
    assert (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
