"""Namespace snapshots without a kernel: the on-disk format, the bounds, atomicity, and the
texts the model reads (``runtime/snapshot.py``, ``sessions/snapshots.py``).
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import KernelDied
from orchestrator.runtime import snapshot
from orchestrator.runtime.snapshot import (
    CURRENT_FILE,
    MANIFEST_FILE,
    read_manifest,
    restore_namespace,
    save_namespace,
)
from orchestrator.sessions.snapshots import (
    REVIVAL_MAX_FAILURES,
    SNAPSHOT_VAR_CAP_BYTES,
    NamespaceKeeper,
    merge_notice,
    revival_text,
)

KIB = 1024
CAP = 64 * KIB
TOTAL = 256 * KIB
BUDGET_S = 30.0


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    """A snapshot directory of its own (``tmp_path`` also holds the test's XDG dirs)."""
    return tmp_path / "snap"


def _save(ns: dict[str, Any], directory: Path, **kw: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "var_cap_bytes": CAP,
        "total_cap_bytes": TOTAL,
        "time_budget_s": BUDGET_S,
    }
    options.update(kw)
    return save_namespace(ns, directory, **options)


def _reasons(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["reason"] for e in manifest["skipped"]}


class _DiskFull:
    def __reduce__(self) -> Any:
        raise OSError(28, "No space left on device")


class _Interrupting:
    def __reduce__(self) -> Any:
        raise KeyboardInterrupt


def test_round_trip_per_variable(snap: Path) -> None:
    offset = 10

    def add(a: int) -> int:
        return a + offset

    hidden = {"In": [], "get_ipython": print}
    ns: dict[str, Any] = {
        "x": 42,
        "data": {"a": [1, 2, 3]},
        "add": add,
        "m": math,
        "_private": 1,
        "_": "last output",
        "_i3": "x = 42",
        "__builtins__": {},
        **hidden,
    }
    manifest = _save(ns, snap, hidden=hidden)
    assert [e["name"] for e in manifest["saved"]] == ["x", "data", "add"]
    assert manifest["modules"] == [{"name": "m", "module": "math"}]
    # IPython's own names and the shell's hidden objects are not even listed.
    assert _reasons(manifest) == {"_private": "private"}
    assert read_manifest(snap) == manifest

    fresh: dict[str, Any] = {}
    report = restore_namespace(fresh, snap)
    assert report["found"] and report["restored"] == ["x", "data", "add"]
    assert report["modules"] == ["m"] and report["failed"] == []
    assert fresh["x"] == 42 and fresh["data"] == {"a": [1, 2, 3]}
    assert fresh["add"](1) == 11 and fresh["m"] is math


def test_bounds_and_unpicklable_values_are_skipped_with_the_reason(snap: Path) -> None:
    sock = socket.socket()
    try:
        ns: dict[str, Any] = {
            "small": b"s" * KIB,
            "big": b"b" * (CAP + 1),
            "gen": (i for i in range(3)),
            "sock": sock,
            "mid1": b"1" * (CAP - KIB),
            "mid2": b"2" * (CAP - KIB),
            "mid3": b"3" * (CAP - KIB),
            "mid4": b"4" * (CAP - KIB),
            "mid5": b"5" * (CAP - KIB),
            "tail": 7,
        }
        manifest = _save(ns, snap)
    finally:
        sock.close()
    reasons = _reasons(manifest)
    assert reasons["big"] == "too_large"
    assert reasons["gen"] == "unpicklable" and reasons["sock"] == "unpicklable"
    details = {e["name"]: e.get("detail", "") for e in manifest["skipped"]}
    assert "generator" in details["gen"] and "socket" in details["sock"]
    # Five ~63 KiB pickles do not fit in 256 KiB: the fifth is cut, a small one still fits.
    assert reasons["mid5"] == "total_cap"
    saved = ["small", "mid1", "mid2", "mid3", "mid4", "tail"]
    assert [e["name"] for e in manifest["saved"]] == saved
    assert manifest["bytes"] <= TOTAL
    # An abandoned pickle leaves no file behind.
    generation = snap / manifest["generation"]
    assert sorted(p.name for p in generation.iterdir()) == sorted(
        [MANIFEST_FILE, *(e["file"] for e in manifest["saved"])]
    )
    fresh: dict[str, Any] = {}
    report = restore_namespace(fresh, snap)
    assert set(fresh) == set(saved)
    assert {e["name"] for e in report["skipped"]} == {"big", "gen", "sock", "mid5"}


def test_time_budget_skips_the_rest(snap: Path) -> None:
    manifest = _save({"a": 1, "b": 2}, snap, time_budget_s=-1.0)
    assert manifest["saved"] == [] and _reasons(manifest) == {
        "a": "time_budget",
        "b": "time_budget",
    }


@pytest.mark.parametrize("breaker", [_DiskFull, _Interrupting])
def test_a_failed_snapshot_leaves_the_previous_one_intact(snap: Path, breaker: type[Any]) -> None:
    first = _save({"x": 1, "y": "kept"}, snap)
    with pytest.raises((OSError, KeyboardInterrupt)):
        _save({"x": 2, "y": "new", "z": breaker()}, snap)
    assert read_manifest(snap) == first
    # Nothing half-written stays next to it.
    assert sorted(p.name for p in snap.iterdir()) == sorted([CURRENT_FILE, first["generation"]])
    fresh: dict[str, Any] = {}
    restore_namespace(fresh, snap)
    assert fresh == {"x": 1, "y": "kept"}


def test_a_crash_before_the_commit_point_keeps_the_previous_one(
    snap: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _save({"x": 1}, snap)

    def crash(src: Any, dst: Any) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)  # the module shares os with us
    with pytest.raises(OSError):
        _save({"x": 2}, snap)
    monkeypatch.undo()
    assert read_manifest(snap) == first
    second = _save({"x": 3}, snap)  # the next one commits and cleans up
    assert read_manifest(snap) == second
    assert sorted(p.name for p in snap.iterdir()) == sorted([CURRENT_FILE, second["generation"]])


def test_missing_or_damaged_snapshots_read_as_none(snap: Path) -> None:
    assert read_manifest(snap / "absent") is None
    assert restore_namespace({}, snap)["found"] is False
    snap.mkdir()
    (snap / CURRENT_FILE).write_text("../../etc")
    assert read_manifest(snap) is None
    (snap / CURRENT_FILE).write_text("gen-x")
    (snap / "gen-x").mkdir()
    (snap / "gen-x" / MANIFEST_FILE).write_text("{not json")
    assert read_manifest(snap) is None


def test_a_variable_that_fails_to_load_does_not_stop_the_others(snap: Path) -> None:
    manifest = _save({"a": 1, "b": 2, "c": 3}, snap)
    victim = snap / manifest["generation"] / manifest["saved"][1]["file"]
    victim.write_bytes(b"not a pickle")
    fresh: dict[str, Any] = {}
    report = restore_namespace(fresh, snap)
    assert fresh == {"a": 1, "c": 3}
    assert [f["name"] for f in report["failed"]] == ["b"]
    assert report["failed"][0]["reason"] == "load"


def test_the_save_entry_point_refuses_an_unprepared_kernel(snap: Path) -> None:
    # A kernel that was restarted behind the host's back has not been revived: its (empty)
    # namespace must not replace the last good snapshot.
    snapshot._prepared = False
    snapshot.save(str(snap), CAP, TOTAL, BUDGET_S)
    assert json.loads(snapshot.last_report()) == {"ok": False, "error": snapshot.NOT_PREPARED}
    assert not snap.exists()


def test_revival_text_lists_what_came_back_and_what_did_not() -> None:
    report = {
        "ok": True,
        "found": True,
        "created_at": 1000.0,
        "restored": ["x", "df"],
        "modules": ["np"],
        "failed": [{"name": "f", "reason": "load", "detail": "ModuleNotFoundError: No module"}],
        "skipped": [
            {"name": "big", "reason": "too_large"},
            {"name": "gen", "reason": "unpicklable", "detail": "TypeError: cannot pickle"},
        ],
    }
    text = revival_text(report, now=1012.0)
    assert text.startswith("The REPL namespace was revived from its last snapshot, taken 12 s ago.")
    assert "Back: x, df." in text and "Re-imported: np." in text
    cap = f"{SNAPSHOT_VAR_CAP_BYTES // (1024 * 1024)} MiB"
    assert f"big (over the {cap} per-variable cap)" in text
    assert "gen (cannot be pickled: TypeError: cannot pickle)" in text
    assert "f (failed to load: ModuleNotFoundError: No module)" in text
    assert revival_text({"ok": False, "error": "boom"}).endswith("the namespace starts empty.")
    many = revival_text({"ok": True, "restored": [f"v{i}" for i in range(40)], "restored_more": 5})
    assert "and 15 more" in many


def test_merge_notice_replaces_namespace_is_lost() -> None:
    revival = "The REPL namespace was revived from its last snapshot."
    for lost in (
        "the kernel died after the previous cell and was restarted; the namespace is lost.",
        "the kernel died during this cell (killed or crashed); it was restarted and the "
        "namespace is lost.",
        "cell timed out after 1 s and did not stop within 2 s of an interrupt; the kernel was "
        "restarted and the namespace is lost.",
        "the sandbox container stopped (exited); a new sandbox container was started and the "
        "namespace is lost.",
    ):
        merged = merge_notice(lost, revival)
        assert "namespace is lost" not in merged and merged.endswith(revival)
    assert merge_notice("", revival) == revival


async def test_a_snapshot_that_cannot_be_loaded_is_set_aside(snap: Path) -> None:
    # E.g. unpickling it kills the kernel every time: after REVIVAL_MAX_FAILURES attempts the
    # kernel starts empty (and may snapshot again) instead of dying at every start.
    _save({"x": 1}, snap)
    sent: list[str] = []

    async def dying(
        code: str, *, user_expressions: Any = None, timeout_s: float = 0.0
    ) -> dict[str, Any]:
        sent.append(code)
        if ".adopt()" in code:
            return {"user_expressions": {}}
        raise KernelDied("kernel setup did not complete (gone)")

    keeper = NamespaceKeeper(snap)
    for _ in range(REVIVAL_MAX_FAILURES):
        await keeper.revive(dying)
        assert "Reviving the REPL namespace from its last snapshot failed" in keeper.take_notice()
    await keeper.revive(dying, new_sandbox=True)
    assert ".adopt()" in sent[-1]
    notice = keeper.take_notice()
    assert notice.startswith("This session got a new sandbox. The last namespace snapshot")
    assert "set aside" in notice


def test_a_user_variable_named_like_a_runtime_helper_is_saved(snap: Path) -> None:
    from orchestrator.runtime.history import Compact

    # ``history = model.fit(...)`` is the user's data; the runtime's own helper is not saved.
    manifest = _save({"history": {"loss": [0.5, 0.25]}, "compact": Compact()}, snap)
    assert [e["name"] for e in manifest["saved"]] == ["history"]
    assert _reasons(manifest) == {"compact": "runtime"}
