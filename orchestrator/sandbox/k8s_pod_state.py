"""What a session pod's status says: ready (phase Running, an IP, the Ready condition), still
coming, or failed for good, with one line for the user.

Pure: it reads a pod as the API returns it (a plain dict, camelCase) and talks to nothing. The
failures a session can meet are named (``PodFailure.reason``): ``Unschedulable`` (no node fits
its requests), an image that cannot be pulled (``ImagePullBackOff``, ``ErrImagePull``...), a
container that cannot be created, ``OOMKilled``, ``Evicted``, and a pod that ended or is being
deleted. The backend (``kubernetes.py``) raises ``SandboxStartError`` for one while the pod
starts and ``KernelDied`` once it ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "CONTAINER_FAILURES",
    "EVICTED",
    "OOM_KILLED",
    "PULL_FAILURES",
    "UNSCHEDULABLE",
    "PodFailure",
    "PodView",
    "view_pod",
]

UNSCHEDULABLE: Final = "Unschedulable"
OOM_KILLED: Final = "OOMKilled"
EVICTED: Final = "Evicted"
DELETED: Final = "Deleted"
ENDED: Final = "Ended"
# A container waiting for one of these will not start by waiting longer.
PULL_FAILURES: Final = frozenset(
    {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
)
CONTAINER_FAILURES: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}
)
RUNNING: Final = "Running"
ENDED_PHASES: Final = frozenset({"Failed", "Succeeded"})
MESSAGE_CHARS: Final = 200


@dataclass(frozen=True)
class PodFailure:
    """Why a pod will never serve: ``reason`` (one of the names above or the kubelet's own
    word) and ``line``, one line for the user."""

    reason: str
    line: str


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ip: str  # "" until the pod has one
    ready: bool  # Running, an IP, and the Ready condition true
    failure: PodFailure | None


def _one_line(text: object) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 1] + "…"


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _container_failure(name: str, container: Mapping[str, Any]) -> PodFailure | None:
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    message = _one_line(waiting.get("message"))
    if reason in PULL_FAILURES:
        image = container.get("image", "")
        return PodFailure(
            reason, f"pod {name} cannot pull its image {image} ({reason}): {message}".rstrip(": ")
        )
    if reason in CONTAINER_FAILURES:
        return PodFailure(
            reason, f"pod {name} cannot start its container ({reason}): {message}".rstrip(": ")
        )
    terminated = state.get("terminated") or {}
    if terminated.get("reason") == OOM_KILLED:
        return PodFailure(
            OOM_KILLED, f"pod {name} ran out of memory (OOMKilled): raise the memory limit"
        )
    return None


def _ended(name: str, phase: str, status: Mapping[str, Any]) -> PodFailure:
    if status.get("reason") == EVICTED:
        return PodFailure(EVICTED, f"pod {name} was evicted: {_one_line(status.get('message'))}")
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            why = terminated.get("reason") or "exited"
            code = terminated.get("exitCode")
            return PodFailure(ENDED, f"pod {name} ended ({phase}): its gateway {why}, code {code}")
    return PodFailure(ENDED, f"pod {name} ended ({phase})")


def view_pod(pod: Mapping[str, Any]) -> PodView:
    """The pod's state as the backend needs it (``pod`` as the API returns it)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = str(metadata.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    ip = str(status.get("podIP") or "")
    failure: PodFailure | None = None
    scheduled = _condition(status, "PodScheduled")
    if scheduled.get("status") == "False" and scheduled.get("reason") == UNSCHEDULABLE:
        failure = PodFailure(
            UNSCHEDULABLE,
            f"pod {name} cannot be scheduled: {_one_line(scheduled.get('message'))}".rstrip(": "),
        )
    for container in status.get("containerStatuses") or ():
        failure = failure or _container_failure(name, container)
    if failure is None and phase in ENDED_PHASES:
        failure = _ended(name, phase, status)
    if failure is None and metadata.get("deletionTimestamp"):
        failure = PodFailure(DELETED, f"pod {name} is being deleted")
    ready = (
        failure is None
        and phase == RUNNING
        and bool(ip)
        and _condition(status, "Ready").get("status") == "True"
    )
    return PodView(name=name, phase=phase, ip=ip, ready=ready, failure=failure)
