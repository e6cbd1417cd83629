"""The pod part of a ``sandbox_info`` answer in the inspector's table (tui/inspector.py,
``pod_rows``; the shape is orchestrator/api/sandbox_pod.py): read at the boundary, absent for
other backends and older daemons, unknown fields of a newer daemon ignored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from orchestrator.api import SandboxPod
from tui.inspector import info_table, pod_rows

NOW: Final = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
POD: Final[dict[str, Any]] = {
    "namespace": "prime-agent",
    "phase": "Running",
    "node": "node-7",
    "ip": "10.0.0.9",
    "restarts": 1,
    "events": [
        {
            "at": (NOW - timedelta(minutes=3)).isoformat(),
            "kind": "Normal",
            "reason": "Scheduled",
            "message": "assigned to node-7",
            "count": 1,
        },
        {"at": None, "kind": "Warning", "reason": "BackOff", "message": "", "count": 4},
    ],
    "cpu_millicores": 120.0,
    "metrics": "",
    "added_by_a_newer_daemon": {"anything": True},
}


def test_a_pods_rows_phase_node_restarts_and_events() -> None:
    assert pod_rows(POD, NOW) == [
        ("namespace", "prime-agent"),
        ("phase", "Running"),
        ("node", "node-7"),
        ("restarts", "1"),
        ("events", "3m ago Normal Scheduled: assigned to node-7\n— Warning BackOff (x4)"),
    ]


def test_without_metrics_a_row_says_why_and_no_events_say_none() -> None:
    pod = {**POD, "metrics": "no metrics server", "events": [], "node": None}
    rows = dict(pod_rows(pod, NOW))
    assert rows["metrics"] == "no metrics server"
    assert rows["events"] == "(none)" and rows["node"] == "—"


def test_no_pod_part_adds_nothing_and_a_bad_one_is_one_row() -> None:
    assert pod_rows(None, NOW) == []
    assert pod_rows({**POD, "restarts": -1}, NOW) == [("pod", "(unreadable)")]
    assert pod_rows({"phase": "Running"}, NOW) == [("pod", "(unreadable)")]  # no namespace
    box = {"backend": "docker", "name": "c", "state": "running"}
    table = info_table({"session": "s-1", "status": "idle", "sandbox": box}, NOW)
    assert table.row_count == len(
        ("session", "backend", "name", "image", "state", "cpu", "memory", "uptime")
    )


def test_the_daemon_and_the_tui_read_one_shape() -> None:
    pod = SandboxPod.model_validate(POD)
    assert pod.events[0].at == NOW - timedelta(minutes=3) and pod.events[1].count == 4
    assert SandboxPod.model_validate(pod.model_dump(mode="json")) == pod
