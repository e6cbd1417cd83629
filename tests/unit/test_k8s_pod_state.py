"""A session pod's status read as the kubernetes backend reads it (k8s_pod_state.view_pod):
ready only when Running with an IP and Ready; each failure a session can meet is named and
said in one line."""

from __future__ import annotations

from typing import Any, Final

import pytest

from orchestrator.sandbox.k8s_pod_state import view_pod

NAME: Final = "prime-agent-s-1-abcdef"
IP: Final = "10.0.0.7"


def pod(status: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": NAME, **metadata}, "status": status}


def container(state: dict[str, Any]) -> dict[str, Any]:
    return {"name": "sandbox", "image": "registry/session:1", "state": state}


READY: Final = {"type": "Ready", "status": "True"}


def test_ready_needs_running_an_ip_and_the_ready_condition() -> None:
    assert view_pod(pod({"phase": "Running", "podIP": IP, "conditions": [READY]})).ready
    assert not view_pod(pod({"phase": "Running", "conditions": [READY]})).ready
    assert not view_pod(pod({"phase": "Running", "podIP": IP})).ready
    assert not view_pod(pod({"phase": "Pending", "podIP": IP, "conditions": [READY]})).ready
    fresh = view_pod({"metadata": {"name": NAME}})  # no status yet: still coming
    assert (fresh.phase, fresh.ready, fresh.failure) == ("Pending", False, None)


@pytest.mark.parametrize(
    ("status", "reason", "words"),
    [
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available:\n 3 Insufficient memory.",
                    }
                ],
            },
            "Unschedulable",
            "cannot be scheduled: 0/3 nodes are available: 3 Insufficient memory.",
        ),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    container({"waiting": {"reason": "ImagePullBackOff", "message": "not found"}})
                ],
            },
            "ImagePullBackOff",
            "cannot pull its image registry/session:1 (ImagePullBackOff): not found",
        ),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    container({"waiting": {"reason": "CreateContainerConfigError"}})
                ],
            },
            "CreateContainerConfigError",
            "cannot start its container (CreateContainerConfigError)",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    container({"terminated": {"reason": "OOMKilled", "exitCode": 137}})
                ],
            },
            "OOMKilled",
            "ran out of memory (OOMKilled): raise the memory limit",
        ),
        (
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
            },
            "Evicted",
            "was evicted: The node was low on resource: memory.",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    container({"terminated": {"reason": "Error", "exitCode": 1}})
                ],
            },
            "Ended",
            "ended (Failed): its gateway Error, code 1",
        ),
    ],
)
def test_each_failure_is_named_in_one_line(status: dict[str, Any], reason: str, words: str) -> None:
    view = view_pod(pod(status))
    assert view.failure is not None and not view.ready
    assert view.failure.reason == reason
    assert view.failure.line == f"pod {NAME} {words}"
    assert "\n" not in view.failure.line


def test_a_pod_being_deleted_is_not_ready() -> None:
    running = {"phase": "Running", "podIP": IP, "conditions": [READY]}
    view = view_pod(pod(running, deletionTimestamp="2026-01-01T00:00:00Z"))
    assert not view.ready
    assert view.failure is not None and view.failure.reason == "Deleted"
