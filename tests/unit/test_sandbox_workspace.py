"""Workspace copy mode: copy in, sync back, conflicts, symlinks never followed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.sandbox.workspace import (
    COPY_DIR_NAME,
    MANIFEST_NAME,
    WorkspaceCopy,
    finish_copy,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a = 1\n")
    (root / "keep.txt").write_text("keep\n")
    (root / "gone.txt").write_text("to delete\n")
    (root / "link").symlink_to("src/a.py")
    return root


def _copy(project: Path, tmp_path: Path) -> WorkspaceCopy:
    return WorkspaceCopy.create(project, tmp_path / "artifacts")


def test_copy_is_private_and_complete(project: Path, tmp_path: Path) -> None:
    copy = _copy(project, tmp_path)
    assert copy.copy_dir == tmp_path / "artifacts" / COPY_DIR_NAME
    assert (copy.copy_dir / "src" / "a.py").read_text() == "a = 1\n"
    assert os.readlink(copy.copy_dir / "link") == "src/a.py"
    (copy.copy_dir / "src" / "a.py").write_text("changed\n")
    assert (project / "src" / "a.py").read_text() == "a = 1\n"  # the original is untouched


def test_sync_back_writes_changes_and_deletions(project: Path, tmp_path: Path) -> None:
    copy = _copy(project, tmp_path)
    (copy.copy_dir / "src" / "a.py").write_text("a = 2\n")
    (copy.copy_dir / "new" / "deep").mkdir(parents=True)
    (copy.copy_dir / "new" / "deep" / "b.rs").write_text("fn main() {}\n")
    (copy.copy_dir / "gone.txt").unlink()
    report = finish_copy(copy)
    assert report is not None and not report.conflicts
    assert (project / "src" / "a.py").read_text() == "a = 2\n"
    assert (project / "new" / "deep" / "b.rs").read_text() == "fn main() {}\n"
    assert not (project / "gone.txt").exists()
    assert (project / "keep.txt").read_text() == "keep\n"
    assert sorted(report.deleted) == ["gone.txt"]
    assert not copy.copy_dir.exists() and not (copy.parent / MANIFEST_NAME).exists()


def test_conflict_keeps_both_versions(project: Path, tmp_path: Path) -> None:
    copy = _copy(project, tmp_path)
    (copy.copy_dir / "src" / "a.py").write_text("agent\n")
    (project / "src" / "a.py").write_text("user\n")
    (project / "gone.txt").write_text("user changed it\n")
    (copy.copy_dir / "gone.txt").unlink()
    report = finish_copy(copy)
    assert report is not None
    assert report.conflicts == ["src/a.py"] and report.kept == ["gone.txt"]
    assert (project / "src" / "a.py").read_text() == "user\n"
    assert (Path(report.conflicts_dir) / "src" / "a.py").read_text() == "agent\n"
    assert (project / "gone.txt").read_text() == "user changed it\n"
    saved = json.loads((copy.parent / "workspace-sync.json").read_text())
    assert saved["conflicts"] == ["src/a.py"]


def test_same_change_on_both_sides_is_no_conflict(project: Path, tmp_path: Path) -> None:
    copy = _copy(project, tmp_path)
    (copy.copy_dir / "keep.txt").write_text("same\n")
    (project / "keep.txt").write_text("same\n")
    report = finish_copy(copy)
    assert report is not None and not report.conflicts


def test_sync_never_writes_through_a_project_symlink(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = _copy(project, tmp_path)
    # The agent makes a real directory `out` in its copy; meanwhile the project has a symlink
    # `out` to a directory outside it. Nothing may land outside.
    (copy.copy_dir / "out").mkdir()
    (copy.copy_dir / "out" / "x.txt").write_text("agent\n")
    (project / "out").symlink_to(outside)
    report = finish_copy(copy)
    assert report is not None
    assert list(outside.iterdir()) == []
    assert "out/x.txt" in report.conflicts


def test_agent_symlink_replaces_a_file_not_its_target(project: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("safe\n")
    copy = _copy(project, tmp_path)
    (copy.copy_dir / "keep.txt").unlink()
    (copy.copy_dir / "keep.txt").symlink_to(victim)
    finish_copy(copy)
    assert (project / "keep.txt").is_symlink()
    assert victim.read_text() == "safe\n"


def test_a_left_copy_is_synced_before_a_new_one(project: Path, tmp_path: Path) -> None:
    copy = _copy(project, tmp_path)
    (copy.copy_dir / "crash.txt").write_text("work from before a crash\n")
    again = WorkspaceCopy.load(copy.parent)
    assert again is not None and again.project == project.resolve()
    fresh = _copy(project, tmp_path)
    assert (project / "crash.txt").read_text() == "work from before a crash\n"
    assert (fresh.copy_dir / "crash.txt").exists()


def test_too_big_a_project_is_a_user_error(project: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="use --workspace rw or ro"):
        WorkspaceCopy.create(project, tmp_path / "artifacts", max_bytes=4)
