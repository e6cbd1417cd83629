"""The code-fix suite's repositories are real tasks: each one's tests fail as shipped and pass
after its one edit (run with real pytest in a scratch directory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sweeps.scoring import score
from orchestrator.sweeps.suites import generate
from orchestrator.sweeps.suites.code_fix import GATE
from orchestrator.sweeps.suites.code_fix_repos import REPOS

PYTEST_TIMEOUT_S = 60.0
MIN_REPOS = 10


def _pytest(where: Path) -> int:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=where,
        capture_output=True,
        timeout=PYTEST_TIMEOUT_S,
        check=False,
    ).returncode


def test_there_are_enough_distinct_repositories() -> None:
    assert len(REPOS) >= MIN_REPOS
    assert len({r.name for r in REPOS}) == len(REPOS)


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_the_tests_fail_as_shipped_and_pass_after_the_fix(repo: object, tmp_path: Path) -> None:
    from orchestrator.sweeps.suites.code_fix_repos import Repo

    assert isinstance(repo, Repo)
    for name, text in repo.files.items():
        (tmp_path / name).write_text(text)
    assert _pytest(tmp_path) == 1  # tests ran and failed (not a collection error: 2)
    path, old, new = repo.fix
    text = (tmp_path / path).read_text()
    assert text.count(old) == 1
    (tmp_path / path).write_text(text.replace(old, new))
    assert _pytest(tmp_path) == 0


def test_tasks_are_gated_and_score_by_how_the_run_stopped() -> None:
    tasks = generate("code-fix", 3, None, seed=0)
    assert [t.id for t in tasks] == [f"code-fix/{r.name}" for r in REPOS[:3]]
    assert all(t.gates == (GATE,) and t.files and GATE in t.question for t in tasks)
    shuffled = generate("code-fix", len(REPOS), None, seed=4)
    assert sorted(t.id for t in shuffled) == sorted(f"code-fix/{r.name}" for r in REPOS)
    assert score(tasks[0], "done", "gate_passed") == 1.0
    assert score(tasks[0], "done", "max_turns") == 0.0
