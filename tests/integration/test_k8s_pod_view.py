"""``KubernetesSandbox.info()`` over real HTTP: the official client against kmock's in-memory
API (tests/k8s_emulator.py). The pod, its core/v1 Events and its metrics.k8s.io PodMetrics are
objects in the emulator, written as a scheduler, a kubelet and a metrics server would write
them; the backend reads them as it reads a cluster. Three clusters: one whose metrics server
has the pod's metrics, one whose metrics server has none for it yet, one without a metrics
server (the group is not served at all). No Docker: the pod's status is written by the test.
The pod a real node runs, in the daemon and the TUI, is tests/tui/test_inspector_pod.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Final, Literal

import pytest
from kubernetes import client as k8s

from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_manifests import SessionPod, pod_name, session_objects
from orchestrator.sandbox.k8s_pod_info import NO_METRICS_SERVER, NO_POD_METRICS, POD_EVENTS_MAX
from orchestrator.sandbox.kubernetes import KubernetesBackend, KubernetesSandbox
from tests.k8s_emulator import (
    NAMESPACE,
    NODE_NAME,
    emulated_cluster,
    write_pod_event,
    write_pod_metrics,
)

pytestmark = pytest.mark.timeout(120)

INSTANCE: Final = "test-instance"
MIB: Final = 1024**2
POD_MEMORY: Final = 512 * MIB
POD_IP: Final = "10.244.1.17"
RESTARTS: Final = 2
Metrics = Literal["served", "not-yet", "no-server"]
# Each cluster, and what the pod's resource use then says.
METRICS_LINE: Final[dict[Metrics, str]] = {
    "served": "",
    "not-yet": NO_POD_METRICS,
    "no-server": NO_METRICS_SERVER,
}


def running_status(image: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": POD_IP,
        "startTime": "2026-12-04T10:00:00+00:00",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": image,
                "imageID": "",
                "ready": True,
                "restartCount": RESTARTS,
                "state": {"running": {"startedAt": "2026-12-04T10:00:05+00:00"}},
            }
        ],
    }


def the_cluster_writes(api_client: Any, name: str, image: str, metrics: Metrics) -> None:
    """What a scheduler, a kubelet and a metrics server write about a running pod (blocking)."""
    core = k8s.CoreV1Api(api_client)
    core.patch_namespaced_pod(name, NAMESPACE, {"spec": {"nodeName": NODE_NAME}})
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": running_status(image)})
    reasons = ["Scheduled", "Pulling", "Pulled", "Created", "Started", "Killing", "BackOff"]
    for reason in reasons:
        kind = "Warning" if reason == "BackOff" else "Normal"
        write_pod_event(api_client, name, reason, f"{reason} {name}", kind)
    write_pod_event(api_client, "prime-agent-another-pod", "Scheduled", "not this pod's")
    if metrics == "served":
        write_pod_metrics(api_client, name, cpu="250m", memory="100Mi")


@pytest.mark.parametrize("metrics", ["served", "not-yet", "no-server"])
async def test_info_reads_the_pod_its_newest_events_and_its_metrics(
    tmp_path: Path, metrics: Metrics
) -> None:
    async with emulated_cluster(metrics_server=metrics != "no-server") as cluster:
        api = K8sApi(cluster.api_client(), NAMESPACE)
        backend = KubernetesBackend(api, instance=INSTANCE, memory_bytes=POD_MEMORY)
        spec = SandboxSpec(session_id="s-view", cwd=Path("/workspace"), artifacts_dir=tmp_path)
        sandbox = KubernetesSandbox(backend, spec, pod_name(spec.session_id))
        request = SessionPod(spec, backend.policy_for(spec), INSTANCE, "token", sandbox.name)
        objects = session_objects(request, backend.settings)
        await asyncio.to_thread(api.create, objects)
        image = objects[-1]["spec"]["containers"][0]["image"]
        writer = cluster.api_client()
        await asyncio.to_thread(the_cluster_writes, writer, sandbox.name, image, metrics)
        api.calls.clear()

        info = await sandbox.info()

        assert (info.name, info.state, info.image) == (sandbox.name, "running", image)
        assert info.memory_limit_bytes == POD_MEMORY and info.started_at is not None
        pod = info.pod
        assert pod is not None
        assert (pod.namespace, pod.phase, pod.node, pod.ip) == (
            NAMESPACE,
            "Running",
            NODE_NAME,
            POD_IP,
        )
        assert pod.restarts == RESTARTS
        # The newest few of this pod's events, oldest first; another pod's are not shown.
        assert [e.reason for e in pod.events] == [
            "Pulled",
            "Created",
            "Started",
            "Killing",
            "BackOff",
        ][-POD_EVENTS_MAX:]
        assert pod.events[-1].kind == "Warning"
        assert pod.events[-1].message == f"BackOff {sandbox.name}"
        assert pod.metrics == METRICS_LINE[metrics]
        if metrics == "served":
            assert pod.cpu_millicores == pytest.approx(250.0)
            assert info.memory_bytes == 100 * MIB
            # One read of the pod, one list of events, one read of its metrics.
            assert api.calls == {"read": 2, "list": 1}
        else:
            assert pod.cpu_millicores is None and info.memory_bytes is None
            # The metrics were not found: the group's discovery was asked once.
            assert api.calls == {"read": 3, "list": 1}

        await asyncio.to_thread(api.delete, sandbox.name)
        gone = await sandbox.info()
        assert (gone.name, gone.state, gone.pod) == (sandbox.name, "gone", None)
