"""Workspace content hash (git and plain trees, links never followed, bounds) and the bounded
gate output."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.control import workspace_hash as module
from orchestrator.control.workspace_hash import (
    GATE_OUTPUT_MAX_CHARS,
    bound_gate_output,
    workspace_digest,
    workspace_hash,
)

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    return root


def test_public_surface() -> None:
    assert module.__all__ and all(hasattr(module, name) for name in module.__all__)
    assert GATE_OUTPUT_MAX_CHARS == 6000


def test_git_tree_is_listed_by_git_and_stable(repo: Path) -> None:
    first = workspace_digest(repo)
    assert first.source == "git" and not first.truncated
    assert first.files == 3  # .gitignore, run.sh, src/a.py
    assert re.fullmatch(r"[0-9a-f]{64}", first.digest)
    assert workspace_digest(repo) == first
    assert workspace_hash(repo) == first.digest


def test_tracked_change_changes_and_restoring_restores(repo: Path) -> None:
    before = workspace_hash(repo)
    (repo / "src" / "a.py").write_text("a = 2\n")
    changed = workspace_hash(repo)
    assert changed != before
    (repo / "src" / "a.py").write_text("a = 1\n")
    assert workspace_hash(repo) == before


def test_timestamps_and_the_index_do_not_count(repo: Path) -> None:
    before = workspace_hash(repo)
    os.utime(repo / "src" / "a.py", (0, 0))
    assert workspace_hash(repo) == before
    (repo / "src" / "a.py").write_text("a = 2\n")
    unstaged = workspace_hash(repo)
    git(repo, "add", "src/a.py")
    assert workspace_hash(repo) == unstaged


def test_untracked_file_counts(repo: Path) -> None:
    before = workspace_hash(repo)
    (repo / "notes.md").write_text("todo\n")
    (repo / "new" / "deep").mkdir(parents=True)
    (repo / "new" / "deep" / "b.py").write_text("b = 1\n")
    with_new = workspace_digest(repo)
    assert with_new.digest != before and with_new.files == 5
    (repo / "new" / "deep" / "b.py").write_text("b = 2\n")
    assert workspace_hash(repo) != with_new.digest
    (repo / "notes.md").unlink()
    (repo / "new" / "deep" / "b.py").unlink()
    assert workspace_hash(repo) == before  # empty directories do not count


def test_ignored_files_do_not_count(repo: Path) -> None:
    before = workspace_hash(repo)
    (repo / "debug.log").write_text("noise\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_bytes(b"\0" * 100)
    assert workspace_hash(repo) == before


def test_deleted_tracked_file_counts_as_absent(repo: Path) -> None:
    before = workspace_hash(repo)
    (repo / "src" / "a.py").unlink()
    deleted = workspace_digest(repo)
    assert deleted.digest != before and deleted.files == 3
    (repo / "src" / "a.py").write_text("")  # an empty file is not an absent one
    assert workspace_hash(repo) not in (before, deleted.digest)
    (repo / "src" / "a.py").write_text("a = 1\n")
    assert workspace_hash(repo) == before


def test_executable_bit_counts(repo: Path) -> None:
    before = workspace_hash(repo)
    (repo / "run.sh").chmod(0o755)
    executable = workspace_hash(repo)
    assert executable != before
    (repo / "run.sh").chmod(0o700)  # only the owner's x bit matters, as in git
    assert workspace_hash(repo) == executable
    (repo / "run.sh").chmod(0o644)
    assert workspace_hash(repo) == before


def test_symlink_is_hashed_by_target_never_followed(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret 1\n")
    (repo / "link").symlink_to(outside)
    with_link = workspace_hash(repo)
    outside.write_text("secret 2\n")
    assert workspace_hash(repo) == with_link  # the target's content is not read
    (repo / "link").unlink()
    (repo / "link").symlink_to(tmp_path / "elsewhere.txt")
    assert workspace_hash(repo) != with_link  # the target text is


def test_directory_swapped_for_a_link_is_not_followed(repo: Path, tmp_path: Path) -> None:
    before = workspace_hash(repo)
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.py").write_text("a = 1\n")  # the same content as the tracked file
    (repo / "src" / "a.py").unlink()
    (repo / "src").rmdir()
    (repo / "src").symlink_to(other, target_is_directory=True)
    swapped = workspace_hash(repo)
    assert swapped != before
    (other / "a.py").write_text("a = 2\n")
    assert workspace_hash(repo) == swapped


def test_fifo_is_never_opened(repo: Path, plain: Path) -> None:
    before = workspace_hash(repo)
    os.mkfifo(repo / "pipe")  # reading it would block forever; git does not list it
    assert workspace_hash(repo) == before
    walked = workspace_hash(plain)
    os.mkfifo(plain / "pipe")  # the walk lists it, by kind only
    assert workspace_hash(plain) != walked


def test_subdirectory_of_a_repo_hashes_its_own_files(repo: Path) -> None:
    sub = workspace_digest(repo / "src")
    assert sub.source == "git" and sub.files == 1
    (repo / "run.sh").write_text("changed\n")
    assert workspace_hash(repo / "src") == sub.digest


# --- outside git ---------------------------------------------------------------------------------


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    root = tmp_path / "plain"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text("m = 1\n")
    (root / "README").write_text("hello\n")
    return root


def test_plain_directory_is_walked(plain: Path, tmp_path: Path) -> None:
    first = workspace_digest(plain)
    assert first.source == "walk" and first.files == 2 and not first.truncated
    assert workspace_hash(plain) == first.digest
    (plain / "pkg" / "m.py").write_text("m = 2\n")
    assert workspace_hash(plain) != first.digest
    (plain / "pkg" / "m.py").write_text("m = 1\n")
    (plain / "empty").mkdir()
    assert workspace_hash(plain) == first.digest
    (plain / "pkg" / "m.py").chmod(0o755)
    assert workspace_hash(plain) != first.digest


def test_walk_skips_dot_git_and_never_follows_links(plain: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.txt").write_text("1\n")
    (plain / "linked").symlink_to(outside, target_is_directory=True)
    (plain / "vendor" / ".git").mkdir(parents=True)
    (plain / "vendor" / ".git" / "HEAD").write_text("ref: x\n")
    before = workspace_digest(plain)
    assert before.source == "walk" and before.files == 3  # README, pkg/m.py, the link
    (outside / "big.txt").write_text("2\n")
    (outside / "more.txt").write_text("3\n")
    (plain / "vendor" / ".git" / "HEAD").write_text("ref: y\n")
    assert workspace_hash(plain) == before.digest


def test_without_git_a_repo_is_walked(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_git = workspace_digest(repo)
    monkeypatch.setenv("PATH", str(repo / "no-such-bin"))
    walked = workspace_digest(repo)
    assert walked.source == "walk" and walked.digest == with_git.digest  # the same files
    (repo / "debug.log").write_text("the walk does not read .gitignore\n")
    assert workspace_hash(repo) != walked.digest
    monkeypatch.undo()
    assert workspace_hash(repo) == with_git.digest


# --- bounds --------------------------------------------------------------------------------------


def test_file_limit_truncates_and_says_so(plain: Path) -> None:
    full = workspace_digest(plain)
    cut = workspace_digest(plain, max_files=1)
    assert cut.truncated and cut.files == 1 and cut.digest != full.digest
    (plain / "pkg" / "m.py").write_text("past the limit\n")  # "README" sorts first
    assert workspace_digest(plain, max_files=1).digest == cut.digest


def test_byte_limit_hashes_sizes_past_it(plain: Path) -> None:
    (plain / "README").write_text("x" * 100)
    cut = workspace_digest(plain, max_total_bytes=50)
    assert cut.truncated and cut.content_bytes == len("m = 1\n")
    (plain / "README").write_text("y" * 100)  # same size: not seen, as documented
    assert workspace_digest(plain, max_total_bytes=50).digest == cut.digest
    (plain / "README").write_text("y" * 101)
    assert workspace_digest(plain, max_total_bytes=50).digest != cut.digest
    (plain / "pkg" / "m.py").write_text("m = 9\n")  # still within the budget: content counts
    assert workspace_digest(plain, max_total_bytes=200).digest != cut.digest


def test_large_file_is_streamed_in_chunks(plain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "HASH_CHUNK_BYTES", 7)
    (plain / "README").write_bytes(bytes(range(256)) * 40)
    small_chunks = workspace_digest(plain)
    monkeypatch.setattr(module, "HASH_CHUNK_BYTES", 1 << 20)
    assert workspace_digest(plain) == small_chunks
    assert small_chunks.content_bytes == 256 * 40 + len("m = 1\n")


# --- gate output ---------------------------------------------------------------------------------


def test_short_output_is_unchanged() -> None:
    assert bound_gate_output("ok") == "ok"
    text = "x" * GATE_OUTPUT_MAX_CHARS
    assert bound_gate_output(text) == text


def test_long_output_keeps_head_and_tail() -> None:
    text = "FIRST ERROR\n" + "." * 10_000 + "\n3 failed, 7 passed"
    bounded = bound_gate_output(text)
    assert len(bounded) <= GATE_OUTPUT_MAX_CHARS
    assert bounded.startswith("FIRST ERROR\n") and bounded.endswith("3 failed, 7 passed")
    match = re.search(r"\[\.\.\. (\d+) chars cut \.\.\.\]", bounded)
    assert match is not None
    cut = int(match.group(1))
    assert len(bounded) - len(f"\n[... {cut} chars cut ...]\n") + cut == len(text)
    head, tail = bounded.split(f"\n[... {cut} chars cut ...]\n")
    assert abs(len(head) - len(tail)) <= 1 and len(head) + len(tail) > 5900


def test_tiny_or_negative_limits() -> None:
    assert bound_gate_output("abcdef", limit=3) == "abc"
    assert bound_gate_output("abc", limit=0) == ""
    with pytest.raises(ValueError, match="negative"):
        bound_gate_output("abc", limit=-1)


@given(st.text(max_size=400) | st.text(min_size=100, max_size=400), st.integers(0, 150))
def test_bounded_output_property(text: str, limit: int) -> None:
    bounded = bound_gate_output(text, limit)
    assert len(bounded) <= limit or bounded == text
    if len(text) <= limit:
        assert bounded == text
        return
    match = re.search(r"\n\[\.\.\. (\d+) chars cut \.\.\.\]\n", bounded)
    if match is None:
        assert bounded == text[:limit]
        return
    head, tail = bounded[: match.start()], bounded[match.end() :]
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + int(match.group(1)) + len(tail) == len(text)
    assert abs(len(head) - len(tail)) <= 1
