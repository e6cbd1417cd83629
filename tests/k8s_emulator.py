"""A Kubernetes API for the kubernetes backend's tests: kmock's in-memory emulator served over
real HTTP in the test's event loop, reached by the official ``kubernetes`` client from threads
(the backend calls it in threads anyway), and a node for it: ``DockerNode`` watches the pods
created there and plays the kubelet for each.

- ``mode="run"``: the pod runs on the local Docker Engine (``k8s_docker_kubelet.run_pod``:
  its image, command, user, limits, volumes and Secret), and once its gateway listens the
  pod's status becomes Running and Ready with the container's bridge IP (reachable from this
  host). A deleted pod's container is removed.
- ``mode="unschedulable"``: the pod stays Pending with ``PodScheduled`` False, reason
  ``Unschedulable``, as a scheduler writes it when no node fits.
- ``mode="no-image"``: the pod stays Pending, its container waiting in ``ImagePullBackOff``,
  as a kubelet writes it when the image cannot be pulled.
- ``mode="evicted"``: the pod Failed, reason ``Evicted``, as the kubelet of a node under
  pressure writes it.
- ``mode="pending"``: nothing is written; the pod stays as created (an image still pulling).

``seen`` is set when the node has seen a pod created. A pod the node runs gets its node's
name (``spec.nodeName``, as a scheduler's binding writes it) and the kubelet's ``Scheduled``
and ``Started`` core/v1 Events.

The emulator serves core/v1 Events (declared, as every resource kmock serves must be).
``emulated_cluster(metrics_server=True)`` also declares metrics.k8s.io's ``pods``, so that a
PodMetrics object the test writes (``write_pod_metrics``, standing in for a metrics server's
scrape) is served where a real cluster serves it; without it the group is not served at all,
as in a cluster without a metrics server.

The setup every test that runs pods shares: ``docker_for_pods`` (the Docker client, or the
test needs Docker and the session image: ``tests.helpers.need``), ``node_on`` (a node of one
mode running for a block) and ``docker_cluster`` (an emulated cluster with a running node;
the sandbox conformance suite's kubernetes variant uses it).

What kmock does not do (docs/kubernetes.md, "Tests"): label and field selectors (a list or
watch returns every object of the namespace), uid / resourceVersion / creationTimestamp, a
pod's initial status, stringData -> data, server-side watch timeouts, owner-reference garbage
collection, pods/portforward. The node writes the status; the backend filters by labels and
names itself. ``UidEmulator`` gives each created object a ``metadata.uid``, as an API server
does, so the backend can name a pod as the owner of its Secret and NetworkPolicy.

``serve_in_thread`` runs the emulator on its own event loop in a thread, for a test whose
API clients are other processes (a daemon or a CLI run reaching it through the kubeconfig
``write_kubeconfig`` writes); ``node_in_thread`` runs a ``DockerNode`` for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import kmock
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from tests.helpers import need, wait_until
from tests.k8s_docker_kubelet import run_pod

__all__ = [
    "NAMESPACE",
    "NODE_NAME",
    "DockerNode",
    "EmulatedCluster",
    "NodeMode",
    "docker_cluster",
    "docker_for_pods",
    "emulated_cluster",
    "node_in_thread",
    "node_on",
    "running_node",
    "serve_in_thread",
    "write_kubeconfig",
    "write_pod_event",
    "write_pod_metrics",
]

NAMESPACE: Final = "prime-agent"
HTTP_NOT_FOUND: Final = 404
RESOURCES: Final = ("v1/pods", "v1/secrets", "networking.k8s.io/v1/networkpolicies", "v1/events")
METRICS_GROUP: Final = "metrics.k8s.io"
METRICS_RESOURCE: Final = f"{METRICS_GROUP}/v1beta1/pods"
NODE_NAME: Final = "docker-node"
READY_PREFIX: Final = b'{"port"'  # the gateway's ready line (its stdout is its log)
SERVE_TIMEOUT_S: Final = 30.0  # the emulator's thread starts (and ends) within this
WATCH_IDLE_S: Final = 1.0  # the node's watch is read again this often: it sees ``stop`` soon
UNSCHEDULABLE_MESSAGE: Final = "0/3 nodes are available: 3 Insufficient memory."
PULL_MESSAGE: Final = 'Back-off pulling image "prime-agent/session:latest"'
EVICTED_MESSAGE: Final = "The node was low on resource: ephemeral-storage."
# The status each failing mode writes (what a scheduler or kubelet would).
FAILED_STATUS: Final[dict[str, dict[str, Any]]] = {
    "unschedulable": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": UNSCHEDULABLE_MESSAGE,
            }
        ],
    },
    "no-image": {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": "prime-agent/session:latest",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": PULL_MESSAGE}},
            }
        ],
    },
    "evicted": {"phase": "Failed", "reason": "Evicted", "message": EVICTED_MESSAGE},
}
NodeMode = Literal["run", "unschedulable", "no-image", "evicted", "pending"]


@dataclass
class EmulatedCluster:
    emulator: Any  # kmock.KubernetesEmulator
    url: str

    def api_client(self) -> Any:
        """A fresh ``ApiClient`` for the emulator (as a restarted orchestrator makes one)."""
        return k8s.ApiClient(k8s.Configuration(host=self.url))

    def object(self, kind: str, name: str) -> dict[str, Any]:
        """The object of ``kind`` named ``name`` as stored now (KeyError when there is none)."""
        for (resource, _namespace, stored), obj in self.emulator.objects.items():
            if resource.plural == kind and stored == name and not obj.deleted:
                return dict(obj.raw)
        raise KeyError(f"{kind}/{name}")

    def names(self, kind: str) -> set[str]:
        """Names of the objects of ``kind`` (``pods``, ``secrets``, ``networkpolicies``) that
        exist now (a PodMetrics, plural ``pods`` too, is not a pod)."""
        return {
            name
            for (resource, _namespace, name), obj in self.emulator.objects.items()
            if resource.plural == kind and resource.group != METRICS_GROUP and not obj.deleted
        }


class UidEmulator(kmock.KubernetesEmulator):
    """kmock's emulator, with a ``metadata.uid`` given to every object it creates."""

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata.setdefault("uid", str(uuid.uuid4()))
        return await super()._handle(request)


@contextlib.asynccontextmanager
async def emulated_cluster(*, metrics_server: bool = False) -> AsyncIterator[EmulatedCluster]:
    async with UidEmulator() as emulator, kmock.Server(emulator) as server:
        for resource in RESOURCES:
            emulator.resources[resource]  # declared: a list before any object is not a 404
        if metrics_server:
            emulator.resources[METRICS_RESOURCE] = kmock.ResourceInfo(
                kind="PodMetrics", namespaced=True, verbs={"get", "list"}
            )
        yield EmulatedCluster(emulator, str(server.url).rstrip("/"))


@contextlib.contextmanager
def serve_in_thread(*, metrics_server: bool = False) -> Iterator[EmulatedCluster]:
    """``emulated_cluster`` on an event loop of its own thread, until the block ends."""
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[EmulatedCluster] = loop.create_future()
    done = asyncio.Event()

    async def serve() -> None:
        async with emulated_cluster(metrics_server=metrics_server) as cluster:
            ready.set_result(cluster)
            await done.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(_wait(ready), loop).result(SERVE_TIMEOUT_S)
    finally:
        loop.call_soon_threadsafe(done.set)
        thread.join(SERVE_TIMEOUT_S)
        loop.close()


async def _wait(future: asyncio.Future[EmulatedCluster]) -> EmulatedCluster:
    return await future


KUBECONFIG: Final = """\
apiVersion: v1
kind: Config
clusters:
- name: emulated
  cluster: {{server: "{url}"}}
users:
- name: tester
  user: {{token: not-checked}}
contexts:
- name: emulated
  context: {{cluster: emulated, user: tester, namespace: {namespace}}}
current-context: emulated
"""


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig whose current context is the API server at ``url``."""
    path.write_text(KUBECONFIG.format(url=url, namespace=NAMESPACE))
    return path


@contextlib.contextmanager
def node_in_thread(cluster: EmulatedCluster, docker: Any) -> Iterator[DockerNode]:
    """A ``DockerNode`` running ``cluster``'s pods until the block ends; then every pod left
    is deleted, so the node removes its container."""
    node = DockerNode(cluster.api_client(), docker)
    thread = threading.Thread(target=node.run, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        core = k8s.CoreV1Api(cluster.api_client())
        for name in cluster.names("pods"):
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(name, NAMESPACE)
        wait_until(lambda: not node.containers, timeout=SERVE_TIMEOUT_S)
        node.stop.set()
        thread.join(SERVE_TIMEOUT_S)


def write_pod_metrics(api_client: Any, name: str, cpu: str, memory: str) -> None:
    """The PodMetrics of pod ``name`` (one container, ``sandbox``), as metrics-server serves
    it after a scrape (blocking: call it in a thread)."""
    metrics = {
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "PodMetrics",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "timestamp": datetime.now(UTC).isoformat(),
        "window": "15s",
        "containers": [{"name": "sandbox", "usage": {"cpu": cpu, "memory": memory}}],
    }
    custom = k8s.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(METRICS_GROUP, "v1beta1", NAMESPACE, "pods", metrics)


def write_pod_event(
    api_client: Any, pod: str, reason: str, message: str, kind: str = "Normal"
) -> None:
    """A core/v1 Event about ``pod``, as a kubelet or scheduler records one (blocking)."""
    now = datetime.now(UTC).isoformat()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{secrets.token_hex(8)}", "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": NAMESPACE},
        "type": kind,
        "reason": reason,
        "message": message,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "kubelet", "host": NODE_NAME},
    }
    k8s.CoreV1Api(api_client).create_namespaced_event(NAMESPACE, event)


@dataclass
class DockerNode:
    """The kubelet of one node: see the module docstring. ``run`` in a thread until ``stop``."""

    api_client: Any
    docker: Any  # the Docker client; None for the modes that run nothing
    mode: NodeMode = "run"
    stop: threading.Event = field(default_factory=threading.Event)
    seen: threading.Event = field(default_factory=threading.Event)
    containers: dict[str, Any] = field(default_factory=dict)  # pod name -> its container
    _stacks: dict[str, contextlib.ExitStack] = field(default_factory=dict)

    def run(self) -> None:
        core = k8s.CoreV1Api(self.api_client)
        try:
            while not self.stop.is_set():
                with contextlib.suppress(Urllib3Error):
                    for event in watch.Watch().stream(
                        core.list_namespaced_pod,
                        NAMESPACE,
                        _request_timeout=(10, WATCH_IDLE_S),
                        deserialize=False,
                    ):
                        try:
                            self._handle(core, event["type"], event["object"])
                        except ApiException as exc:  # deleted while the node started it
                            if exc.status != HTTP_NOT_FOUND:
                                raise
                        if self.stop.is_set():
                            break
        finally:
            for name in list(self._stacks):
                self._forget(name)

    def _handle(self, core: Any, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._forget(name)
        elif kind == "ADDED" and name not in self._stacks:
            self._stacks[name] = contextlib.ExitStack()
            self.seen.set()
            if self.mode in FAILED_STATUS:
                status = FAILED_STATUS[self.mode]
                core.patch_namespaced_pod_status(name, NAMESPACE, {"status": status})
            elif self.mode == "run":
                self._start(core, name, pod)

    def _forget(self, name: str) -> None:
        self.containers.pop(name, None)
        stack = self._stacks.pop(name, None)
        if stack is not None:
            stack.close()

    def _start(self, core: Any, name: str, pod: dict[str, Any]) -> None:
        core.patch_namespaced_pod(name, NAMESPACE, {"spec": {"nodeName": NODE_NAME}})
        write_pod_event(self.api_client, name, "Scheduled", f"assigned {name} to {NODE_NAME}")
        volumes = pod["spec"]["volumes"]
        (secret_name,) = [v["secret"]["secretName"] for v in volumes if "secret" in v]
        secret = self.api_client.sanitize_for_serialization(
            core.read_namespaced_secret(secret_name, NAMESPACE)
        )
        running = self._stacks[name].enter_context(run_pod(self.docker, pod, secret))
        self.containers[name] = running.container
        for line in running.container.logs(stream=True, follow=True):
            if line.startswith(READY_PREFIX):
                break
        running.container.reload()
        ip = running.container.attrs["NetworkSettings"]["IPAddress"]
        status = {
            "phase": "Running",
            "podIP": ip,
            "startTime": datetime.now(UTC).isoformat(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        }
        core.patch_namespaced_pod_status(name, NAMESPACE, {"status": status})
        write_pod_event(self.api_client, name, "Started", "Started container sandbox")

    def fail(self, name: str, status: dict[str, Any]) -> None:
        """Kill pod ``name``'s container and write ``status`` (an OOM kill, an eviction)."""
        container = self.containers[name]
        container.kill()
        core = k8s.CoreV1Api(self.api_client)
        core.patch_namespaced_pod_status(name, NAMESPACE, {"status": status})


@contextlib.asynccontextmanager
async def running_node(node: DockerNode) -> AsyncIterator[DockerNode]:
    task = asyncio.ensure_future(asyncio.to_thread(node.run))
    try:
        yield node
    finally:
        node.stop.set()
        await task


def docker_for_pods() -> Any:
    """The Docker client a node runs pods with; the test needs Docker and the session image
    (``need``: a skip, or a failure with ``CI=true``)."""
    from orchestrator.errors import UserError
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client, image_exists

    try:
        client = docker_client()
    except UserError as exc:
        need("docker", str(exc))
    if not image_exists(SESSION_IMAGE, client):
        need("docker", f"the session image {SESSION_IMAGE} is missing (make test builds it)")
    return client


@contextlib.asynccontextmanager
async def node_on(
    cluster: EmulatedCluster, docker: Any, mode: NodeMode = "run"
) -> AsyncIterator[DockerNode]:
    """A node of ``mode`` for ``cluster``, running until the block ends (``docker``: None for
    the modes that run nothing)."""
    async with running_node(DockerNode(cluster.api_client(), docker, mode=mode)) as node:
        yield node


@contextlib.asynccontextmanager
async def docker_cluster(docker: Any) -> AsyncIterator[tuple[EmulatedCluster, DockerNode]]:
    """An emulated cluster whose node runs every pod on ``docker``."""
    async with emulated_cluster() as cluster, node_on(cluster, docker) as node:
        yield cluster, node
