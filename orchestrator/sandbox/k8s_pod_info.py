"""A session pod as the control API's ``sandbox_info`` shows it (``KubernetesSandbox.info``).

Pure: it turns what the API returned (plain dicts, camelCase, as ``K8sApi`` hands them over)
into a ``SandboxInfo`` with its ``PodDetails`` part, and talks to nothing:

- the Pod: name, image, state (``running`` once Ready, else its phase), start time, memory
  limit, namespace, phase, node, IP, restarts (the containers' ``restartCount``, summed);
- its core/v1 Events: those whose ``involvedObject`` is this pod (the server's field selector
  is not trusted: the test emulator ignores it), the newest ``POD_EVENTS_MAX``, oldest first;
- its metrics.k8s.io ``PodMetrics``: CPU (millicores over the metrics window) and memory (the
  working set), summed over its containers. Without them, ``PodDetails.metrics`` says why
  (``NO_METRICS_SERVER``, ``NO_POD_METRICS``, an unavailable server): a cluster without a
  metrics server is normal, not an error.

Quantities (``250m``, ``12345n``, ``100Mi``, ``1e3``) are read by ``quantity``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from orchestrator.sandbox.base import PodDetails, PodEvent, SandboxInfo
from orchestrator.sandbox.k8s_pod_state import view_pod

__all__ = [
    "EVENT_MESSAGE_CHARS",
    "NO_METRICS_SERVER",
    "NO_POD_METRICS",
    "POD_EVENTS_MAX",
    "pod_events",
    "pod_info",
    "quantity",
]

# The newest events of a pod that the inspector shows.
POD_EVENTS_MAX: Final = 5
EVENT_MESSAGE_CHARS: Final = 200
NO_METRICS_SERVER: Final = "no metrics server"
NO_POD_METRICS: Final = "no metrics for this pod yet"
MILLI: Final = 1000
# Kubernetes quantity suffixes (resource.Quantity): binary, then decimal.
_SUFFIXES: Final[dict[str, float]] = {
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
# Two-character suffixes first: "Mi" must not be read as "M" after "...i".
_SUFFIX_ORDER: Final = sorted(_SUFFIXES, key=len, reverse=True)


def quantity(text: object) -> float | None:
    """A Kubernetes quantity as a number (``"250m"`` -> 0.25, ``"1Gi"`` -> 1073741824.0);
    None for anything that is not one."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str) or not text.strip():
        return None
    value = text.strip()
    scale = 1.0
    for suffix in _SUFFIX_ORDER:
        # Only after a digit: "1e3" and "1E3" are exponents (float reads them), "1E" is exa.
        if value.endswith(suffix) and value[: -len(suffix)][-1:].isdigit():
            value, scale = value[: -len(suffix)], _SUFFIXES[suffix]
            break
    try:
        return float(value) * scale
    except ValueError:
        return None


def _time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _one_line(text: object) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= EVENT_MESSAGE_CHARS else flat[: EVENT_MESSAGE_CHARS - 1] + "…"


def _event_time(event: Mapping[str, Any]) -> datetime | None:
    """When the event last happened: the fields a kubelet, a scheduler or events/v1 fill."""
    series = event.get("series") or {}
    for text in (
        event.get("lastTimestamp"),
        series.get("lastObservedTime"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        at = _time(text)
        if at is not None:
            return at
    return None


def pod_events(name: str, events: Sequence[Mapping[str, Any]]) -> tuple[PodEvent, ...]:
    """The newest ``POD_EVENTS_MAX`` events about pod ``name`` among ``events``, oldest first
    (one without a time counts as the oldest)."""
    mine: list[PodEvent] = []
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("name") != name or involved.get("kind", "Pod") != "Pod":
            continue
        count = event.get("count") or (event.get("series") or {}).get("count") or 1
        mine.append(
            PodEvent(
                at=_event_time(event),
                kind=str(event.get("type") or "Normal"),
                reason=str(event.get("reason") or ""),
                message=_one_line(event.get("message")),
                count=int(count),
            )
        )
    oldest = datetime.min.replace(tzinfo=UTC)
    mine.sort(key=lambda e: e.at or oldest)
    return tuple(mine[-POD_EVENTS_MAX:])


def _usage(metrics: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """CPU millicores and memory bytes of a PodMetrics, summed over its containers."""
    cpu: float | None = None
    memory: float | None = None
    for container in metrics.get("containers") or ():
        usage = container.get("usage") or {}
        used_cpu, used_memory = quantity(usage.get("cpu")), quantity(usage.get("memory"))
        if used_cpu is not None:
            cpu = (cpu or 0.0) + used_cpu * MILLI
        if used_memory is not None:
            memory = (memory or 0.0) + used_memory
    return cpu, (round(memory) if memory is not None else None)


def pod_info(
    pod: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Any] | None,
    why_no_metrics: str = NO_METRICS_SERVER,
) -> SandboxInfo:
    """``pod`` with its ``events`` (any of the namespace's) and its PodMetrics (None: there
    are none, for the reason ``why_no_metrics``) as ``sandbox_info`` shows them."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    name = str(metadata.get("name") or "")
    container = (spec.get("containers") or [{}])[0]
    limit = quantity(((container.get("resources") or {}).get("limits") or {}).get("memory"))
    view = view_pod(pod)
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ())
    cpu, memory = _usage(metrics) if metrics is not None else (None, None)
    details = PodDetails(
        namespace=str(metadata.get("namespace") or ""),
        phase=view.phase,
        node=spec.get("nodeName") or None,
        ip=view.ip or None,
        restarts=restarts,
        events=pod_events(name, events),
        cpu_millicores=cpu,
        metrics="" if metrics is not None else why_no_metrics,
    )
    return SandboxInfo(
        name=name,
        image=container.get("image"),
        state="running" if view.ready else view.phase.lower(),
        started_at=_time(status.get("startTime")),
        memory_bytes=memory,
        memory_limit_bytes=round(limit) if limit else None,
        pod=details,
    )
