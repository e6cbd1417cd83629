"""Snapshot slots of pooled docker containers (orchestrator/sandbox/docker_slots.py): the
handover keeps the session's snapshot valid and makes the slot's directory (its inode, which a
container has mounted) the session's; stray slots are swept. No Docker needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.runtime.snapshot import CURRENT_FILE, read_manifest, save_namespace
from orchestrator.sandbox import docker_slots
from orchestrator.sandbox.docker_slots import (
    SLOTS_DIR_NAME,
    hand_over,
    new_slot,
    sweep_slots,
)

CAP = 1024 * 1024


def _snapshot(directory: Path, **names: object) -> dict[str, object]:
    return save_namespace(
        dict(names), directory, var_cap_bytes=CAP, total_cap_bytes=CAP, time_budget_s=10
    )


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
def test_hand_over_keeps_the_snapshot_and_moves_the_slot(
    tmp_path: Path, exchange: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not exchange:
        monkeypatch.setattr(docker_slots, "_exchange", lambda a, b: False)
    root = tmp_path / "snapshots"
    target = root / "s-abcdefabcdef"
    target.mkdir(parents=True)
    manifest = _snapshot(target, x=41, y="kept")
    slot = new_slot(root)
    assert slot.parent.name == SLOTS_DIR_NAME and oct(slot.parent.stat().st_mode & 0o777) == "0o700"
    inode = slot.stat().st_ino  # what a container has mounted
    hand_over(slot, target)
    assert target.stat().st_ino == inode
    assert read_manifest(target) == manifest
    assert not slot.exists() and os.listdir(root / SLOTS_DIR_NAME) == []
    # The kernel's next snapshot commits over the carried-over one as usual.
    newer = _snapshot(target, x=42)
    assert read_manifest(target) == newer
    assert sorted(p.name for p in target.iterdir()) == sorted([CURRENT_FILE, newer["generation"]])


def test_hand_over_to_a_session_without_a_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    slot = new_slot(root)
    inode = slot.stat().st_ino
    target = root / "s-abcdefabcdef"  # not even created yet
    hand_over(slot, target)
    assert target.stat().st_ino == inode and list(target.iterdir()) == []


def test_sweep_removes_only_old_slots_no_container_names(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    used, stray, young = new_slot(root), new_slot(root), new_slot(root)
    (stray / "junk").write_text("x")
    old = 1_000_000.0
    for path in (used, stray):
        os.utime(path, (old, old))
    assert sweep_slots(root, {str(used)}, min_age_s=3600) == 1
    assert used.is_dir() and young.is_dir() and not stray.exists()
    assert sweep_slots(tmp_path / "nothing-here", set()) == 0
