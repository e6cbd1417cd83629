"""Which Kubernetes API requests a session's sandbox costs, counted where they arrive: at
kmock's emulator (tests/k8s_counting.py), on the port the backend's official client talks to,
not by the backend's own tally. Each pod runs on a node that starts its gateway as a local
process at a loopback IP of its own (tests/k8s_process_node.py), so these tests need no Docker.

- One session: three creates (Secret, NetworkPolicy, Pod), two patches (the Secret's and the
  policy's owner reference, once the pod has its uid) and ONE watch until Ready, no read
  or list while it waits; cells make no request; stop makes three deletes. The node makes the
  pod Ready only once the backend's watch is open at the server: a backend that polled would
  show reads or lists here, and one that never watched would never see the pod Ready.
- A watch that sees no event for ``watch_idle_s`` is opened again (two watches, still no read).
- Sessions at once cost the same each: the emulator sends every pod's events to every watch
  (it ignores field selectors) and the backend keeps to its own pod.
- ``[kubernetes] reach = "port-forward"``: the gateway is reached on a loopback port whose
  every connection is a port-forward through the emulator (its ``pods/portforward``
  substitute), counted at the server under the pod's name; stop closes the port; a restarted
  orchestrator adopts the pod through a port-forward of its own.

The scale bench (bench/bench_k8s_scale.py) runs the same parts over 1,000 sessions and reports
the counts per session; docs/kubernetes.md, "Scale", has its figures."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Final

import pytest

from orchestrator.sandbox.base import SandboxRef, SandboxSpec
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_port_forward import LOOPBACK
from orchestrator.sandbox.kubernetes import KubernetesBackend, KubernetesSandbox
from orchestrator.settings import KubernetesSettings
from tests.k8s_counting import CountedCluster, counted_cluster
from tests.k8s_process_node import ProcessNode, free_gateway_port, running_process_node

pytestmark = pytest.mark.timeout(180)

NAMESPACE: Final = "prime-agent"
INSTANCE: Final = "api-calls"
CELL_TIMEOUT_S: Final = 60.0
START_TIMEOUT_S: Final = 45.0  # a failing check fails well within the test timeout
GATE_TIMEOUT_S: Final = 20.0
LONG_IDLE_S: Final = 120.0  # longer than any start here: one watch per session
SHORT_IDLE_S: Final = 1.0
SESSIONS_AT_ONCE: Final = 4
CELLS: Final = 3
PER_SESSION: Final = Counter({"create": 3, "patch": 2, "watch": 1, "delete": 3})
START_CALLS: Final = {
    ("create", "secrets"): 1,
    ("create", "networkpolicies"): 1,
    ("create", "pods"): 1,
    # the owner references, once the pod has its uid
    ("patch", "secrets"): 1,
    ("patch", "networkpolicies"): 1,
    ("watch", "pods"): 1,
}
STOP_CALLS: Final = {
    ("delete", "pods"): 1,
    ("delete", "secrets"): 1,
    ("delete", "networkpolicies"): 1,
}


@pytest.fixture
async def cluster() -> AsyncIterator[CountedCluster]:
    async with counted_cluster() as counted:
        yield counted


def backend_for(cluster: CountedCluster, port: int, watch_idle_s: float) -> KubernetesBackend:
    return KubernetesBackend(
        K8sApi(cluster.orchestrator_client(), NAMESPACE, watch_idle_s=watch_idle_s),
        instance=INSTANCE,
        settings=KubernetesSettings(namespace=NAMESPACE, gateway_port=port),
        start_timeout_s=START_TIMEOUT_S,
    )


def spec_for(session: str, tmp_path: Path) -> SandboxSpec:
    """Each session its own project and outputs: the pod's workspace is a copy of the project,
    pushed in at start and synced back at stop (on this node, into the project's own path)."""
    workspace = tmp_path / session / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    return SandboxSpec(session_id=session, cwd=workspace, artifacts_dir=tmp_path / session / "out")


def gate_on_watches(cluster: CountedCluster, watches: int) -> object:
    """The node's ``before_ready``: the pod is made Ready only once ``watches`` watches of the
    backend have reached the server."""

    def gate(name: str) -> None:
        if not cluster.counts.wait_for("watch", watches, timeout_s=GATE_TIMEOUT_S):
            raise AssertionError(f"pod {name}: the backend never opened watch {watches}")

    return gate


async def run_cells(sandbox: KubernetesSandbox) -> None:
    for n in range(CELLS):
        result = await sandbox.execute(f"x = {n}", timeout_s=CELL_TIMEOUT_S, cell_id=f"c{n}")
        assert result.status == "ok", result


def calls(cluster: CountedCluster) -> dict[tuple[str, str], int]:
    return {key: n for key, n in cluster.counts.calls.items() if n}


async def test_a_session_costs_three_creates_two_patches_one_watch_and_three_deletes(
    cluster: CountedCluster, tmp_path: Path
) -> None:
    port = free_gateway_port()
    node = ProcessNode(
        cluster.node_client(),
        NAMESPACE,
        before_ready=gate_on_watches(cluster, 1),  # type: ignore[arg-type]
    )
    async with running_process_node(node):
        backend = backend_for(cluster, port, LONG_IDLE_S)
        try:
            sandbox = await backend.create(spec_for("s-calls", tmp_path))
            assert calls(cluster) == START_CALLS  # watched until Ready: no read, no list
            await run_cells(sandbox)
            assert calls(cluster) == START_CALLS  # cells never reach the API server
            await sandbox.stop()
            assert calls(cluster) == {**START_CALLS, **STOP_CALLS}
            assert cluster.counts.by_object == {sandbox.name: PER_SESSION}
            # The backend's own tally agrees with what the server saw.
            assert sum(backend.api.calls.values()) == cluster.counts.total()
        finally:
            await backend.close()
    assert node.started == 1 and not node.failed
    assert not any(cluster.names(kind) for kind in ("pods", "secrets", "networkpolicies"))


async def test_an_idle_watch_is_opened_again_never_replaced_by_reads(
    cluster: CountedCluster, tmp_path: Path
) -> None:
    port = free_gateway_port()
    node = ProcessNode(
        cluster.node_client(),
        NAMESPACE,
        before_ready=gate_on_watches(cluster, 2),  # type: ignore[arg-type]
    )
    async with running_process_node(node):
        backend = backend_for(cluster, port, SHORT_IDLE_S)
        try:
            sandbox = await backend.create(spec_for("s-idle", tmp_path))
            assert calls(cluster) == {**START_CALLS, ("watch", "pods"): 2}
            await sandbox.stop()
        finally:
            await backend.close()
    assert not node.failed


async def test_sessions_at_once_cost_the_same_each(cluster: CountedCluster, tmp_path: Path) -> None:
    port = free_gateway_port()
    node = ProcessNode(cluster.node_client(), NAMESPACE)
    async with running_process_node(node):
        backend = backend_for(cluster, port, LONG_IDLE_S)

        async def session(n: int) -> str:
            sandbox = await backend.create(spec_for(f"s-many-{n}", tmp_path))
            await run_cells(sandbox)
            await sandbox.stop()
            return sandbox.name

        try:
            names = await asyncio.gather(*(session(n) for n in range(SESSIONS_AT_ONCE)))
        finally:
            await backend.close()
    assert cluster.counts.by_object == {name: PER_SESSION for name in names}
    assert node.started == SESSIONS_AT_ONCE and not node.failed


async def test_port_forward_reaches_the_gateway_through_the_api_server(
    cluster: CountedCluster, tmp_path: Path
) -> None:
    port = free_gateway_port()
    node = ProcessNode(cluster.node_client(), NAMESPACE)
    async with running_process_node(node):
        backend = KubernetesBackend(
            K8sApi(cluster.orchestrator_client(), NAMESPACE, watch_idle_s=LONG_IDLE_S),
            instance=INSTANCE,
            settings=KubernetesSettings(
                namespace=NAMESPACE, gateway_port=port, reach="port-forward"
            ),
            start_timeout_s=START_TIMEOUT_S,
        )
        try:
            sandbox = await backend.create(spec_for("s-forward", tmp_path))
            assert sandbox.ref.url.startswith(f"http://{LOOPBACK}:")  # not the pod's IP
            await run_cells(sandbox)
            await sandbox.restart_kernel()  # a new kernel WebSocket: a new forward
            await run_cells(sandbox)
            await sandbox.stop()  # (the project's copy comes back over a forward too)
            assert sandbox.forward is None
            forwards = cluster.counts.of("portforward")
            assert forwards >= 2  # one per connection the gateway client opened
        finally:
            await backend.close()
    assert cluster.counts.by_object == {
        sandbox.name: PER_SESSION + Counter({"portforward": forwards})
    }
    with pytest.raises(OSError):  # the loopback listener is gone with the sandbox
        await asyncio.open_connection(*sandbox.ref.url.removeprefix("http://").split(":"))
    assert not node.failed


class Recorder:
    """The daemon's listener, as far as adoption needs it: the refs it was told about."""

    def __init__(self) -> None:
        self.up: dict[str, SandboxRef] = {}

    async def sandbox_up(self, ref: SandboxRef) -> None:
        self.up[ref.session_id] = ref

    async def sandbox_down(self, ref: SandboxRef) -> None:
        self.up.pop(ref.session_id, None)


def forwarding_backend(cluster: CountedCluster, port: int) -> KubernetesBackend:
    return KubernetesBackend(
        K8sApi(cluster.orchestrator_client(), NAMESPACE, watch_idle_s=LONG_IDLE_S),
        instance=INSTANCE,
        settings=KubernetesSettings(namespace=NAMESPACE, gateway_port=port, reach="port-forward"),
        start_timeout_s=START_TIMEOUT_S,
    )


async def test_a_restarted_orchestrator_adopts_a_pod_through_its_own_port_forward(
    cluster: CountedCluster, tmp_path: Path
) -> None:
    port = free_gateway_port()
    node = ProcessNode(cluster.node_client(), NAMESPACE)
    async with running_process_node(node):
        first = forwarding_backend(cluster, port)  # the orchestrator that "dies": never closed
        recorder = Recorder()
        first.listener = recorder
        spec = replace(spec_for("s-adopted", tmp_path), die_with_parent=False)
        kept = await first.create(spec)
        result = await kept.execute("x = 41", timeout_s=CELL_TIMEOUT_S, cell_id="set")
        assert result.status == "ok", result
        ref = recorder.up["s-adopted"]
        second = forwarding_backend(cluster, port)
        try:
            adopted = await second.adopt(ref, spec)
            assert adopted.ref.url != ref.url  # its own loopback port
            assert adopted.ref.url.startswith(f"http://{LOOPBACK}:")
            after = await adopted.execute("x + 1", timeout_s=CELL_TIMEOUT_S, cell_id="get")
            assert after.status == "ok" and str(after.result).strip() == "42"  # the same kernel
        finally:
            await second.close()
            if kept.client is not None:  # the "dead" orchestrator's connections
                await kept.client.close()
            if kept.forward is not None:
                await kept.forward.close()
    assert not any(cluster.names(kind) for kind in ("pods", "secrets", "networkpolicies"))
    assert not node.failed
