"""The daemon's scheduler callbacks (docs/control.md): ticks wait while a cell runs or the
context is compacted, not while the model streams or the session is idle; what a tick says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.daemon.schedule_link import deferred, tick_text


def _orch(activity: str | None) -> Any:
    loop = None if activity is None else SimpleNamespace(activity=activity)
    session = SimpleNamespace(loop=loop)
    return SimpleNamespace(loaded={"s-1": session}.get)


@pytest.mark.parametrize(
    ("activity", "waits"),
    [("cell", True), ("compacting", True), ("turn", False), ("idle", False), (None, False)],
)
def test_a_tick_waits_only_for_a_cell_or_a_compaction(activity: str | None, waits: bool) -> None:
    assert deferred(_orch(activity), "s-1") is waits
    assert deferred(_orch(activity), "s-unknown") is False  # not loaded: wake it


def test_tick_text_names_its_kind_label_and_spec() -> None:
    row: Any = SimpleNamespace(source="rlm_heartbeat", label="ci", spec="every 15m", prompt="look")
    assert tick_text(row) == "[heartbeat ci: every 15m] look"
    row = SimpleNamespace(source="user", label=None, spec="in 10m", prompt="report")
    assert tick_text(row) == "[schedule: in 10m] report"
