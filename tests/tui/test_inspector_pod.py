"""A session pod in view: the TUI's sandbox inspector and ``prime-agent agents`` for a session
on the kubernetes backend (docs/kubernetes.md, "Pods in view"; docs/tui.md).

Real processes: the daemon (``prime-agent daemon start``), nats-server, the DuckDB file and the
scripted model over HTTP. The cluster is kmock's emulator served over real HTTP from a thread of
this test (``tests/k8s_emulator.serve_in_thread``), with metrics.k8s.io declared; the daemon
reaches it through the kubeconfig this test writes, and a test node runs its pods on the local
Docker Engine (``DockerNode``: it names its node and records Scheduled and Started events).
The test writes the PodMetrics a metrics server would serve. The session's turn starts its
pod; the inspector shows it (``sandbox_info``); `r` makes a new pod whose kernel has the
namespace back (the snapshot crossed to the host) and `s` deletes it (``sandbox_control``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.helpers import cli, wait_until
from tests.k8s_docker_kubelet import TEST_LABEL, TEST_LABEL_VALUE
from tests.k8s_emulator import (
    NAMESPACE,
    NODE_NAME,
    DockerNode,
    EmulatedCluster,
    docker_for_pods,
    node_in_thread,
    serve_in_thread,
    write_kubeconfig,
    write_pod_metrics,
)
from tests.tui.pilot import chat_screen, screen_text, texts, until
from tests.tui.test_inspector import KEEP, SECRET, SIZE, _box, _inspector, _row
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.inspector import InspectorScreen
from tui.transcript_view import CellView

pytestmark = pytest.mark.timeout(300)

BACKEND: Final = "kubernetes"
GONE_TIMEOUT_S: Final = 30.0
CLI_TIMEOUT_S: Final = 60.0
KINDS: Final = ("pods", "secrets", "networkpolicies")


@pytest.fixture
def model_script() -> str:
    return KEEP  # "keep a number" sets a variable, "is it still there" reads it


@pytest.fixture
def docker() -> Any:
    return docker_for_pods()


def pod_containers(docker: Any) -> set[str]:
    found = docker.containers.list(all=True, filters={"label": f"{TEST_LABEL}={TEST_LABEL_VALUE}"})
    return {c.id for c in found}


@pytest.fixture
def cluster(
    docker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[EmulatedCluster, DockerNode]]:
    """The emulator (with a metrics server), its node, and the environment the daemon starts
    with pointing at them."""
    with (
        serve_in_thread(metrics_server=True) as emulated,
        node_in_thread(emulated, docker) as node,
    ):
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", emulated.url)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield emulated, node


@pytest.fixture
def k8s_daemon(cluster: tuple[EmulatedCluster, DockerNode], daemon: Path) -> Path:
    """A daemon started after the cluster (it reads the kubeconfig), stopped before it."""
    return daemon


async def test_the_inspector_shows_a_pod_and_restarts_and_stops_it(
    docker: Any,
    cluster: tuple[EmulatedCluster, DockerNode],
    k8s_daemon: Path,
    project: Path,
) -> None:
    emulated, node = cluster
    app = PrimeAgentApp(k8s_daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await chat_screen(pilot, app)
        created = await app.link.call(
            "create_session", cwd=str(project), task="keep a number", backend=BACKEND
        )
        sid = str(created["session"])
        app.open_chat(sid)
        await until(
            pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.session_id == sid
        )
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await until(pilot, lambda: "Stored." in texts(chat, "assistant"))
        await app.link.call("wait_quiet", session=sid)
        (pod,) = emulated.names("pods")
        container = node.containers[pod].id
        # The metrics server's scrape of the pod.
        await asyncio.to_thread(write_pod_metrics, emulated.api_client(), pod, "250m", "100Mi")

        inspector = await _inspector(pilot, app)
        await until(pilot, lambda: "Normal Started" in screen_text(pilot))
        box = _box(inspector)
        assert box["backend"] == BACKEND and box["name"] == box["ref"] == pod
        assert box["pod"]["node"] == NODE_NAME and box["pod"]["metrics"] == ""
        assert _row(pilot, "backend") == BACKEND
        assert _row(pilot, "name") == pod
        assert _row(pilot, "state") == "running"
        assert _row(pilot, "namespace") == NAMESPACE
        assert _row(pilot, "phase") == "Running"
        assert _row(pilot, "node") == NODE_NAME
        assert _row(pilot, "restarts") == "0"
        assert _row(pilot, "cpu") == "25.0%"  # 250m of one CPU
        assert _row(pilot, "memory") == "100.0 MiB of 2.0 GiB"  # the default limit
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
        assert row.split()[-1] == pod and BACKEND in row.split()

        # `r`: a new pod (the old one deleted, its container removed); the session stays.
        await pilot.press("r")
        await until(pilot, lambda: _box(inspector).get("name") not in (None, pod))
        again = _box(inspector)["name"]
        await until(pilot, lambda: emulated.names("pods") == {again})
        replaced = node.containers[again].id
        assert wait_until(lambda: container not in pod_containers(docker), timeout=GONE_TIMEOUT_S)
        await until(pilot, lambda: "restarted" in screen_text(pilot))
        assert _row(pilot, "phase") == "Running"
        assert _row(pilot, "metrics") == "no metrics for this pod yet"

        # The new pod's kernel has the namespace back (its snapshot crossed to the host).
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat)
        await pilot.press(*"is it still there", "enter")
        await until(pilot, lambda: len(texts(chat, "assistant")) == 2)
        assert texts(chat, "assistant") == ["Stored.", "Still there."]
        cells = [c.item.output.strip() for c in chat.query(CellView)]
        assert cells == ["stored", str(SECRET + 1)]
        await app.link.call("wait_quiet", session=sid)
        inspector = await _inspector(pilot, app)
        assert _box(inspector)["name"] == again  # the turn ran in the new pod

        # `s`: the session goes inactive, its pod and everything of it goes.
        await pilot.press("s")
        await until(pilot, lambda: inspector.answer.get("status") == "inactive")
        assert inspector.answer == {"session": sid, "status": "inactive", "sandbox": None}
        assert not any(emulated.names(kind) for kind in KINDS)
        assert wait_until(lambda: replaced not in pod_containers(docker), timeout=GONE_TIMEOUT_S)
        assert isinstance(app.screen, InspectorScreen)
