"""A session pod, its events and its PodMetrics as ``sandbox_info`` shows them
(orchestrator/sandbox/k8s_pod_info.py): pure mapping from the API's plain dicts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

import pytest

from orchestrator.sandbox.base import PodEvent
from orchestrator.sandbox.k8s_pod_info import (
    EVENT_MESSAGE_CHARS,
    NO_METRICS_SERVER,
    NO_POD_METRICS,
    POD_EVENTS_MAX,
    pod_events,
    pod_info,
    quantity,
)

NAME: Final = "prime-agent-s1-abcd"
NAMESPACE: Final = "prime-agent"
MIB: Final = 1024**2


def a_pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "nodeName": "node-7",
            "containers": [
                {
                    "name": "sandbox",
                    "image": "registry.example:5000/prime-agent/session:latest",
                    "resources": {"limits": {"memory": "2Gi", "cpu": "1"}},
                }
            ],
        },
        "status": status,
    }


RUNNING: Final = {
    "phase": "Running",
    "podIP": "10.1.2.3",
    "startTime": "2026-12-04T10:00:00Z",
    "conditions": [{"type": "Ready", "status": "True"}],
    "containerStatuses": [
        {"name": "sandbox", "restartCount": 2, "state": {"running": {}}},
        {"name": "sidecar", "restartCount": 1, "state": {"running": {}}},
    ],
}


def event(reason: str, minute: int, *, name: str = NAME, **more: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.{reason}.{minute}", "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": NAMESPACE},
        "type": "Normal",
        "reason": reason,
        "message": f"{reason} happened",
        "lastTimestamp": f"2026-12-04T10:{minute:02d}:00Z",
        **more,
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("250m", 0.25),
        ("1", 1.0),
        ("2.5", 2.5),
        ("12345678n", 0.012345678),
        ("500u", 0.0005),
        ("100Mi", 100.0 * MIB),
        ("2Gi", 2.0 * 1024**3),
        ("1Ki", 1024.0),
        ("3k", 3000.0),
        ("1M", 1e6),
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("1E", 1e18),
        (512, 512.0),
        ("", None),
        ("lots", None),
        ("Mi", None),
        (None, None),
        (True, None),
    ],
)
def test_quantity_reads_kubernetes_quantities(text: object, value: float | None) -> None:
    assert quantity(text) == (pytest.approx(value) if value is not None else None)


def test_a_running_pod_with_metrics_shows_phase_node_restarts_events_and_use() -> None:
    metrics = {
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "window": "15s",
        "containers": [
            {"name": "sandbox", "usage": {"cpu": "250m", "memory": "100Mi"}},
            {"name": "sidecar", "usage": {"cpu": "5000000n", "memory": "28Mi"}},
        ],
    }
    events = [event("Scheduled", 1), event("Pulled", 2), event("Started", 3)]
    info = pod_info(a_pod(**RUNNING), events, metrics)
    assert (info.name, info.state) == (NAME, "running")
    assert info.image == "registry.example:5000/prime-agent/session:latest"
    assert info.started_at == datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    assert info.memory_limit_bytes == 2 * 1024 * MIB
    assert info.memory_bytes == 128 * MIB  # the working sets, summed
    assert info.cpu_seconds is None  # metrics give a rate, not a counter
    pod = info.pod
    assert pod is not None
    assert (pod.namespace, pod.phase, pod.node, pod.ip) == (
        NAMESPACE,
        "Running",
        "node-7",
        "10.1.2.3",
    )
    assert pod.restarts == 3
    assert pod.cpu_millicores == pytest.approx(255.0)
    assert pod.metrics == ""
    assert [e.reason for e in pod.events] == ["Scheduled", "Pulled", "Started"]
    assert pod.events[0] == PodEvent(
        at=datetime(2026, 12, 4, 10, 1, tzinfo=UTC),
        kind="Normal",
        reason="Scheduled",
        message="Scheduled happened",
        count=1,
    )


@pytest.mark.parametrize("why", [NO_METRICS_SERVER, NO_POD_METRICS, "metrics server unavailable"])
def test_without_metrics_the_reason_is_said_and_use_is_unknown(why: str) -> None:
    info = pod_info(a_pod(**RUNNING), [], None, why)
    assert info.pod is not None and info.pod.metrics == why
    assert info.pod.cpu_millicores is None and info.memory_bytes is None
    assert info.memory_limit_bytes == 2 * 1024 * MIB  # from the spec, metrics or not
    assert pod_info(a_pod(**RUNNING), [], None).pod.metrics == NO_METRICS_SERVER  # type: ignore[union-attr]


def test_a_pending_pod_has_its_phase_no_node_and_no_restarts() -> None:
    pod = a_pod(phase="Pending")
    pod["spec"].pop("nodeName")
    info = pod_info(pod, [event("FailedScheduling", 1, type="Warning")], None)
    assert info.state == "pending" and info.started_at is None
    assert info.pod is not None
    assert (info.pod.phase, info.pod.node, info.pod.ip, info.pod.restarts) == (
        "Pending",
        None,
        None,
        0,
    )
    assert [(e.kind, e.reason) for e in info.pod.events] == [("Warning", "FailedScheduling")]


def test_a_pod_without_a_status_is_pending() -> None:
    info = pod_info({"metadata": {"name": NAME}}, [], None)
    assert info.state == "pending" and info.image is None and info.memory_limit_bytes is None
    assert info.pod is not None and info.pod.phase == "Pending" and info.pod.namespace == ""


def test_only_the_pods_own_events_the_newest_few_oldest_first() -> None:
    mine = [event(f"R{minute}", minute) for minute in range(POD_EVENTS_MAX + 3)]
    other_pod = event("Other", 59, name="prime-agent-other")
    not_a_pod = {**event("Secret", 58), "involvedObject": {"kind": "Secret", "name": NAME}}
    shuffled = [mine[4], other_pod, *mine[5:], not_a_pod, *mine[:4]]
    shown = pod_events(NAME, shuffled)
    assert [e.reason for e in shown] == [f"R{m}" for m in range(3, POD_EVENTS_MAX + 3)]


def test_an_events_time_count_and_message_from_whichever_fields_it_has() -> None:
    timeless = event("Old", 0)
    timeless.pop("lastTimestamp")
    series = event("Repeated", 0)
    series.pop("lastTimestamp")
    series["series"] = {"count": 7, "lastObservedTime": "2026-12-04T11:00:00.123456Z"}
    created = event("Created", 0)
    created.pop("lastTimestamp")
    created["metadata"]["creationTimestamp"] = "2026-12-04T10:30:00+00:00"
    noisy = event("Noisy", 20, count=3, message="line one\nline two\t" + "x" * 500)
    shown = pod_events(NAME, [series, noisy, timeless, created])
    assert [e.reason for e in shown] == ["Old", "Noisy", "Created", "Repeated"]
    assert shown[0].at is None
    assert shown[-1].at == datetime(2026, 12, 4, 11, 0, 0, 123456, tzinfo=UTC)
    assert shown[-1].count == 7 and shown[1].count == 3
    message = shown[1].message
    assert message.startswith("line one line two x") and "\n" not in message
    assert len(message) == EVENT_MESSAGE_CHARS and message.endswith("…")
