"""Pods of print-mode runs that are gone: what ``prime-agent doctor`` reports and ``--fix``
deletes on the kubernetes backend (docs/kubernetes.md, "Choosing it").

A daemon adopts or removes its own pods when it starts (``KubernetesBackend.remove_unknown``),
but a print-mode run's pod (label ``daemon=false``) is nobody's once its run is killed with -9:
a cluster has no die-with-parent. Each such pod carries its run's host and pid
(``k8s_manifests.RunProcess``). A pod of this instance whose run was on this host and whose pid
is gone is an orphan; one whose run was on another host cannot be judged from here and is only
listed. (A pid reused by another process since keeps its pod: never a wrong delete.)
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.procs import pid_alive
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_manifests import LABEL_HOST, LABEL_PID, LABEL_SESSION, label_value

__all__ = ["RunPod", "run_pods"]


@dataclass(frozen=True)
class RunPod:
    """A print-mode run's pod: its name, session, the run's host and pid, whether that host is
    this one (``here``: only then can its pid be judged) and whether the run is known to be
    gone (``orphaned``: here, and its pid is not alive)."""

    name: str
    session_id: str
    host: str
    pid: int | None
    here: bool
    orphaned: bool


def run_pods(
    api: K8sApi,
    instance: str,
    *,
    host: str | None = None,
    alive: Callable[[int], bool] = pid_alive,
) -> list[RunPod]:
    """The print-mode runs' pods of ``instance`` (blocking: call it in a thread)."""
    here = host if host is not None else label_value(socket.gethostname())
    found = []
    for pod in api.run_pods(instance):
        metadata: dict[str, Any] = pod["metadata"]
        labels = metadata.get("labels") or {}
        pid_text = str(labels.get(LABEL_PID, ""))
        pid = int(pid_text) if pid_text.isdigit() else None
        pod_host = str(labels.get(LABEL_HOST, ""))
        on_host = pod_host == here
        orphaned = on_host and pid is not None and not alive(pid)
        session = str(labels.get(LABEL_SESSION, ""))
        found.append(RunPod(metadata["name"], session, pod_host, pid, on_host, orphaned))
    return found
