"""A session pod in view: the TUI's sandbox inspector and ``prime-agent agents`` for a session
on the kubernetes backend, against a real daemon, kmock's in-memory Kubernetes API and a node
that runs each pod on the local Docker Engine (tests/k8s_emulator.py, ``DockerNode``).

The daemon runs in this process: it cannot build the kubernetes backend from ``[kubernetes]``
yet (docs/kubernetes.md, "Not done"), so the test builds one for the emulator, adds it to the
daemon's backends and lets ``create_session`` choose it by name. Everything after that is the
daemon's own code: the session's turn starts its pod, ``sandbox_info`` reads the pod, its
events (the node records Scheduled and Started) and its metrics (the test writes the
PodMetrics a metrics server would serve), ``sandbox_control`` restarts it (a new pod) and stops
it (the session goes inactive, the pod is deleted and its container removed).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.api import default_socket_path
from orchestrator.daemon.service import Daemon
from orchestrator.instance import instance_id
from orchestrator.paths import Paths
from orchestrator.sandbox.choice import BackendChoice
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.kubernetes import BACKEND_NAME, KubernetesBackend
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, need, wait_until
from tests.k8s_docker_kubelet import TEST_LABEL, TEST_LABEL_VALUE
from tests.k8s_emulator import (
    NAMESPACE,
    NODE_NAME,
    DockerNode,
    EmulatedCluster,
    emulated_cluster,
    running_node,
    write_pod_metrics,
)
from tests.tui.pilot import chat_screen, screen_text, texts, until
from tests.tui.test_inspector import SIZE, _box, _inspector, _row
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.inspector import InspectorScreen

pytestmark = pytest.mark.timeout(300)

MIB: Final = 1024**2
POD_MEMORY: Final = 512 * MIB
WATCH_IDLE_S: Final = 1.0
READY_TIMEOUT_S: Final = 60.0
GONE_TIMEOUT_S: Final = 30.0
CLI_TIMEOUT_S: Final = 60.0
# One turn: a cell (the pod starts), then the answer.
SCRIPT: Final = """
code: print(sum(range(10)))
---
text: Done.
"""


@pytest.fixture
def model_script() -> str:
    return SCRIPT


@pytest.fixture
def docker() -> Any:
    from orchestrator.errors import UserError
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client, image_exists

    try:
        client = docker_client()
    except UserError as exc:
        need("docker", str(exc))
    if not image_exists(SESSION_IMAGE, client):
        need("docker", f"the session image {SESSION_IMAGE} is missing (make test builds it)")
    return client


def pod_containers(docker: Any) -> set[str]:
    found = docker.containers.list(all=True, filters={"label": f"{TEST_LABEL}={TEST_LABEL_VALUE}"})
    return {c.id for c in found}


@pytest.fixture
async def cluster() -> AsyncIterator[EmulatedCluster]:
    async with emulated_cluster(metrics_server=True) as emulated:
        yield emulated


@pytest.fixture
async def k8s_daemon(
    fake_model: FakeModelServer, cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Daemon]:
    """A daemon in this process whose ``kubernetes`` backend reaches the emulator."""
    paths = Paths.from_env()
    daemon = Daemon(paths=paths, socket_path=default_socket_path(paths))
    task = asyncio.ensure_future(daemon.run())
    try:
        await asyncio.wait_for(daemon.wait_ready(), READY_TIMEOUT_S)
        local = daemon.orch.backends["local"]
        backend = KubernetesBackend(
            K8sApi(cluster.api_client(), NAMESPACE, watch_idle_s=WATCH_IDLE_S),
            instance=instance_id(paths),
            memory_bytes=POD_MEMORY,
            cpus=1.0,
            pool_die_with_parent=False,
        )
        backend.listener = local.listener  # the daemon records its pods as it records any
        daemon.orch.backends[BACKEND_NAME] = backend
        choose: Callable[[str | None], Awaitable[BackendChoice]] = daemon.choose_backend

        async def choose_kubernetes(requested: str | None) -> BackendChoice:
            if requested == BACKEND_NAME:
                return BackendChoice(BACKEND_NAME)  # type: ignore[arg-type]
            return await choose(requested)

        monkeypatch.setattr(daemon, "choose_backend", choose_kubernetes)
        yield daemon
    finally:
        daemon.request_shutdown()
        await task


async def test_the_inspector_shows_a_pod_and_restarts_and_stops_it(
    docker: Any, cluster: EmulatedCluster, k8s_daemon: Daemon, project: Path
) -> None:
    node = DockerNode(cluster.api_client(), docker)
    async with running_node(node):
        app = PrimeAgentApp(k8s_daemon.socket_path, cwd=project)
        async with app.run_test(size=SIZE) as pilot:
            await chat_screen(pilot, app)
            created = await app.link.call(
                "create_session", cwd=str(project), task="add them up", backend=BACKEND_NAME
            )
            sid = str(created["session"])
            app.open_chat(sid)
            await until(
                pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.session_id == sid
            )
            chat = app.screen
            assert isinstance(chat, ChatScreen)
            await until(pilot, lambda: "Done." in texts(chat, "assistant"))
            await app.link.call("wait_quiet", session=sid)
            (pod,) = cluster.names("pods")
            container = node.containers[pod].id
            # The metrics server's scrape of the pod.
            await asyncio.to_thread(write_pod_metrics, cluster.api_client(), pod, "250m", "100Mi")

            inspector = await _inspector(pilot, app)
            await until(pilot, lambda: "Normal Started" in screen_text(pilot))
            box = _box(inspector)
            assert box["backend"] == BACKEND_NAME and box["name"] == box["ref"] == pod
            assert box["pod"]["node"] == NODE_NAME and box["pod"]["metrics"] == ""
            assert _row(pilot, "backend") == BACKEND_NAME
            assert _row(pilot, "name") == pod
            assert _row(pilot, "state") == "running"
            assert _row(pilot, "namespace") == NAMESPACE
            assert _row(pilot, "phase") == "Running"
            assert _row(pilot, "node") == NODE_NAME
            assert _row(pilot, "restarts") == "0"
            assert _row(pilot, "cpu") == "25.0%"  # 250m of one CPU
            assert _row(pilot, "memory") == "100.0 MiB of 512.0 MiB"
            assert "metrics" not in [
                line.split()[0] for line in screen_text(pilot).splitlines() if line.strip()
            ]
            events = screen_text(pilot)
            assert re.search(r"events\s+\S.* Normal Scheduled: assigned", events)
            assert re.search(r"Normal Started: Started container sandbox", events)

            # `prime-agent agents` names the session's pod.
            listing = await asyncio.to_thread(cli, ["agents"], timeout=CLI_TIMEOUT_S)
            assert listing.returncode == 0, listing.stderr
            (row,) = [line for line in listing.stdout.splitlines() if sid in line]
            assert row.split()[-1] == pod and BACKEND_NAME in row.split()

            # `r`: a new pod (the old one deleted, its container removed); the session stays.
            await pilot.press("r")
            await until(pilot, lambda: _box(inspector).get("name") not in (None, pod))
            again = _box(inspector)["name"]
            await until(pilot, lambda: cluster.names("pods") == {again})
            assert wait_until(
                lambda: container not in pod_containers(docker), timeout=GONE_TIMEOUT_S
            )
            await until(pilot, lambda: "restarted" in screen_text(pilot))
            assert _row(pilot, "phase") == "Running"
            assert _row(pilot, "metrics") == "no metrics for this pod yet"

            # `s`: the session goes inactive, its pod and everything of it goes.
            await pilot.press("s")
            await until(pilot, lambda: inspector.answer.get("status") == "inactive")
            assert inspector.answer == {"session": sid, "status": "inactive", "sandbox": None}
            assert not any(cluster.names(kind) for kind in ("pods", "secrets", "networkpolicies"))
            assert wait_until(lambda: not pod_containers(docker), timeout=GONE_TIMEOUT_S)
            assert isinstance(app.screen, InspectorScreen)
