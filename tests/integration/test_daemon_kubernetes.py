"""The daemon on the kubernetes backend survives ``kill -9`` and adopts its pods
(docs/kubernetes.md, "Choosing it"; docs/spec.md §4, R2, R8).

Real processes: the daemon (``prime-agent daemon start``, ``PRIME_AGENT_BACKEND=kubernetes``),
nats-server, the DuckDB file and the scripted model over HTTP. The cluster is kmock's emulator
served over real HTTP from a thread of this test (``tests/k8s_emulator.serve_in_thread``),
which the daemon reaches through the kubeconfig this test writes, and whose pods a test node
runs on the local Docker Engine (``DockerNode``).

A session on kubernetes defines ``x = 41`` in its pod; the daemon is killed with -9; a pod
of the daemon's instance that no row records (a daemon that died between creating a pod and
recording it) is created; the next daemon, before it says it is ready, adopts the session's
pod and removes the unknown one; the session's next cell finds ``x`` in the same kernel of
the same pod; ``daemon stop`` deletes the pod, its Secret and its NetworkPolicy.

``DaemonBackends`` asks the cluster only when kubernetes is wanted: the daemon's default, a
recorded pod, or a session asking for it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.daemon.backends import KUBERNETES, DaemonBackends
from orchestrator.errors import UserError
from orchestrator.instance import instance_id
from orchestrator.paths import Paths
from orchestrator.sandbox.base import SandboxRef, SandboxSpec
from orchestrator.sandbox.choice import BackendChoice
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_manifests import LABEL_INSTANCE, LABEL_SESSION, SessionPod, pod_name
from orchestrator.sandbox.k8s_manifests import session_objects as objects_of
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.settings import KubernetesSettings, Settings
from orchestrator.testing import FakeModelServer
from tests.helpers import kill_9, wait_until, write_config
from tests.integration.test_daemon import _daemon_pids, daemon_cli
from tests.k8s_emulator import (
    NAMESPACE,
    EmulatedCluster,
    docker_for_pods,
    node_in_thread,
    serve_in_thread,
    write_kubeconfig,
)

pytestmark = pytest.mark.timeout(600)

# Bounds, not expectations: a loaded machine starts a pod's container in seconds.
POLL_TIMEOUT_S: Final = 180.0
POLL_INTERVAL_S: Final = 0.1
STOP_TIMEOUT_S: Final = 60.0
KINDS: Final = ("pods", "secrets", "networkpolicies")
UNKNOWN_SESSION: Final = "s-unknown0000"
MIB: Final = 1024**2

SCRIPT: Final = """
repeat forever:
    when "pids":
        text: x is defined
    when re "^42 ":
        text: x plus one is 42
    when "NameError":
        text: x was lost
    when "define x":
        code:
            import os
            x = 41
            print("pids", os.getpid())
    when "print x":
        code:
            import os
            print(x + 1, os.getpid())
"""


@pytest.fixture
def docker() -> Any:
    return docker_for_pods()


@pytest.fixture
def cluster(
    docker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmulatedCluster]:
    """The emulator, its node, and this test's environment pointing the daemon at them."""
    with serve_in_thread() as emulated, node_in_thread(emulated, docker):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emulated.url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("PRIME_AGENT_BACKEND", "kubernetes")
        try:
            yield emulated
        finally:  # the node then deletes what the daemons left
            if _daemon_pids():
                daemon_cli("stop", "--force")
            for pid in _daemon_pids():
                kill_9(pid, STOP_TIMEOUT_S)


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    srv = FakeModelServer(SCRIPT).start()
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        f'[kubernetes]\nnamespace = "{NAMESPACE}"\n'
    )
    yield srv
    srv.close()


def _start_daemon() -> int:
    started = daemon_cli("start")
    assert started.returncode == 0, started.stderr
    (pid,) = _daemon_pids()
    return pid


async def _said(client: ControlClient, sid: str, text: str) -> str:
    """The last cell's output once the session said ``text`` and is idle again."""
    async with asyncio.timeout(POLL_TIMEOUT_S):
        while True:
            replay = await client.call("attach", session=sid, cursor=0)
            events = replay["events"]
            said = any(
                e["type"] == "assistant_message" and e["payload"]["text"] == text for e in events
            )
            status = (await client.call("get_session", session=sid))["session"]["status"]
            if said and status == "idle":
                results = [e["payload"] for e in events if e["type"] == "tool_result"]
                return str(results[-1]["text"])
            await asyncio.sleep(POLL_INTERVAL_S)


async def _define_x(cwd: Path) -> tuple[str, int]:
    client = await ControlClient.connect()
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="define x", model="openai/fake"
        )
        assert created["backend"] == "kubernetes"  # the daemon's default: $PRIME_AGENT_BACKEND
        sid = str(created["session"])
        output = await _said(client, sid, "x is defined")
        match = re.search(r"pids (\d+)", output)
        assert match is not None, output
        return sid, int(match.group(1))
    finally:
        await client.close()


async def _print_x(sid: str) -> str:
    client = await ControlClient.connect()
    try:
        assert (await client.call("prompt", session=sid, text="print x"))["status"] == ("delivered")
        return await _said(client, sid, "x plus one is 42")
    finally:
        await client.close()


def _unknown_pod(cluster: EmulatedCluster, cwd: Path) -> str:
    """A daemon pod of this state dir's instance that no row records."""
    spec = SandboxSpec(
        session_id=UNKNOWN_SESSION, cwd=cwd, artifacts_dir=cwd, die_with_parent=False
    )
    policy = StoredSandboxPolicy(
        backend="kubernetes",
        image="session",
        workspace="rw",
        network=False,
        memory_bytes=512 * MIB,
        cpus=1.0,
        pids=256,
    )
    name = pod_name(UNKNOWN_SESSION)
    request = SessionPod(spec, policy, instance_id(), "a-token", name)
    settings = KubernetesSettings(namespace=NAMESPACE)
    K8sApi(cluster.api_client(), NAMESPACE).create(objects_of(request, settings))
    return name


def test_a_daemon_on_kubernetes_adopts_its_pod_after_kill_9_and_removes_unknown_ones(
    cluster: EmulatedCluster, model: FakeModelServer, tmp_path: Path
) -> None:
    cwd = tmp_path / "ws"
    cwd.mkdir()
    pid = _start_daemon()
    sid, kernel = asyncio.run(_define_x(cwd))
    (pod,) = cluster.names("pods")
    labels = cluster.object("pods", pod)["metadata"]["labels"]
    assert (labels[LABEL_SESSION], labels[LABEL_INSTANCE]) == (sid, instance_id())

    kill_9(pid, STOP_TIMEOUT_S)
    assert pod in cluster.names("pods")  # a daemon's pod outlives it
    unknown = _unknown_pod(cluster, cwd)

    _start_daemon()
    # Before `ready`: the recorded pod adopted, the unknown one removed with its objects.
    assert all(pod in cluster.names(kind) for kind in KINDS)
    assert not any(unknown in cluster.names(kind) for kind in KINDS)
    # The same kernel of the same pod: x intact.
    assert asyncio.run(_print_x(sid)).split() == ["42", str(kernel)]
    assert cluster.names("pods") == {pod}

    stop = daemon_cli("stop")
    assert stop.returncode == 0, stop.stderr
    assert wait_until(
        lambda: not any(cluster.names(kind) for kind in KINDS), timeout=STOP_TIMEOUT_S
    )


class Listener:
    """A ``SandboxListener`` that is told nothing here (no sandbox starts)."""

    async def sandbox_up(self, ref: SandboxRef) -> None:
        raise AssertionError(f"no sandbox starts here: {ref}")

    async def sandbox_down(self, ref: SandboxRef) -> None:
        raise AssertionError(f"no sandbox starts here: {ref}")


def _backends(tmp_path: Path) -> DaemonBackends:
    return DaemonBackends(
        Settings(kubernetes=KubernetesSettings(namespace=NAMESPACE)),
        listener=Listener(),
        socket_path=tmp_path / "daemon.sock",
        paths=Paths.from_env(),
    )


async def test_the_daemon_asks_the_cluster_only_when_kubernetes_is_wanted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the default or a recorded pod the daemon's start does not ask the cluster; a
    session asking for kubernetes builds the backend then (the daemon's instance, its
    listener); a recorded pod makes the start build it; an unreachable cluster is one line,
    asked again only after ``KUBERNETES_RECHECK_S``."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with serve_in_thread() as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", emulated.url)))
        on_demand = _backends(tmp_path)
        await on_demand.start()
        assert on_demand.kubernetes is None and KUBERNETES not in on_demand.all
        assert not list(emulated.emulator)  # the requests it served: the cluster was not asked
        assert await on_demand.choose(KUBERNETES) == BackendChoice(KUBERNETES)
        built = on_demand.kubernetes
        assert built is not None and on_demand.all[KUBERNETES] is built
        assert (built.instance, built.listener) == (instance_id(), on_demand.listener)
        assert not built.pool_die_with_parent  # its pods, pooled ones too, outlive the daemon

        recorded = _backends(tmp_path)
        await recorded.start({KUBERNETES})  # a predecessor's pod is in the store
        assert recorded.kubernetes is not None and KUBERNETES in recorded.all

    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "gone", "http://127.0.0.1:1")))
    unreachable = _backends(tmp_path)
    with pytest.raises(UserError, match="the kubernetes backend is not usable: the API server"):
        await unreachable.choose(KUBERNETES)
    asked_at = unreachable._k8s_checked_at
    with pytest.raises(UserError):
        await unreachable.choose(KUBERNETES)
    assert unreachable._k8s_checked_at == asked_at  # not asked again within the recheck time
