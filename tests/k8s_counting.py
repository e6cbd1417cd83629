"""kmock's Kubernetes emulator with the API requests counted where they arrive, for the scale
bench (bench/bench_k8s_scale.py) and the tests that assert which calls the kubernetes backend
makes (tests/integration/test_k8s_api_calls.py).

The emulator is served on two ports: one for the orchestrator (the backend under test) and one
for the node. Every request that arrives on the orchestrator's port is counted by verb
(``create``, ``watch``, ``list``, ``fetch``, ``update``, ``delete``), resource (``pods``,
``secrets``, ``networkpolicies``) and the object it names (a session's three objects share the
pod's name), at the server, whatever the client believes it sent.

It also serves what kmock lacks: ``pods/portforward``, the WebSocket subresource the official
client's ``kubernetes.stream.portforward`` speaks (``v4.channel.k8s.io``: per forwarded port a
data channel and an error channel, each opened by a frame naming the port, then frames of one
channel byte and the data). Each connection is relayed to the pod's ``status.podIP`` at the
port asked, as a kubelet relays it into the pod's network namespace; a pod without an IP or a
port that refuses is said on the error channel. It is a substitute: the API server's and
kubelet's own streaming (SPDY or WebSocket, through the kubelet's port) is not exercised.

Two changes keep the emulator's cost per request constant over thousands of sessions, as a real
API server's is: kmock looks each new request up in its log of every request ever made (so the
n-th request costs O(n)); here the log holds only the requests in flight. And an object deleted
is forgotten, as a real server forgets it (kmock keeps it, soft-deleted, and scans it on every
list and watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import aiohttp.web
import kmock
from kubernetes import client as k8s

from tests.k8s_emulator import UidEmulator

__all__ = ["ApiCounts", "CountedCluster", "CountingEmulator", "counted_cluster"]

RESOURCES: Final = ("v1/pods", "v1/secrets", "networking.k8s.io/v1/networkpolicies")
NAME_SELECTOR: Final = "metadata.name="
PORT_FORWARD_PATH: Final = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/portforward$")
PORT_FORWARD_PROTOCOL: Final = "v4.channel.k8s.io"
DATA_CHANNEL: Final = 0
ERROR_CHANNEL: Final = 1
RELAY_CHUNK: Final = 65536


def _object_name(request: Any) -> str:
    """The object a request is about: its URL's name, a created object's name, or the name a
    watch's field selector asks for ("" for a plain list or watch)."""
    if request.name:
        return str(request.name)
    data = request.data if isinstance(request.data, dict) else {}
    created = (data.get("metadata") or {}).get("name")
    if created:
        return str(created)
    selector = str(request.params.get("fieldSelector", ""))
    return selector.removeprefix(NAME_SELECTOR) if selector.startswith(NAME_SELECTOR) else ""


@dataclass
class ApiCounts:
    """The requests counted so far: by (verb, resource), and by object name and verb."""

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    by_object: dict[str, Counter[str]] = field(default_factory=dict)
    _lock: threading.Condition = field(default_factory=threading.Condition)

    def add(self, verb: str, resource: str, name: str) -> None:
        with self._lock:
            self.calls[verb, resource] += 1
            self.by_object.setdefault(name, Counter())[verb] += 1
            self._lock.notify_all()

    def wait_for(self, verb: str, count: int, *, timeout_s: float, resource: str = "pods") -> bool:
        """Wait (from another thread than the emulator's) until ``count`` requests of ``verb``
        on ``resource`` have arrived; False when ``timeout_s`` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self.calls[verb, resource] >= count, timeout_s)

    def total(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def of(self, verb: str, resource: str = "pods") -> int:
        with self._lock:
            return self.calls[verb, resource]

    def snapshot(self) -> dict[str, Any]:
        """As JSON: ``calls`` ("verb resource" -> n) and ``by_object`` (name -> verb -> n)."""
        with self._lock:
            return {
                "calls": {f"{verb} {resource}": n for (verb, resource), n in self.calls.items()},
                "by_object": {name: dict(verbs) for name, verbs in self.by_object.items()},
            }


class CountingEmulator(UidEmulator):
    """See the module docstring (a uid for every object created, as ``UidEmulator`` gives).
    ``counted_port``: the port whose requests are counted."""

    counted_port: int | None = None
    counts: ApiCounts

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.counts = ApiCounts()

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        match = PORT_FORWARD_PATH.match(raw_request.path)
        if match is None:
            response: aiohttp.web.StreamResponse = await super().__call__(raw_request)
            return response
        if raw_request.url.port == self.counted_port:
            self.counts.add("portforward", "pods", match.group(2))
        return await self._port_forward(raw_request, match.group(1), match.group(2))

    def _pod_ip(self, namespace: str, name: str) -> str | None:
        for (resource, pod_namespace, pod_name), obj in self.objects.items():
            named = (resource.plural, pod_namespace, pod_name) == ("pods", namespace, name)
            if named and not obj.deleted:
                ip: str | None = (obj.raw.get("status") or {}).get("podIP")
                return ip
        return None

    async def _port_forward(
        self, raw_request: aiohttp.web.BaseRequest, namespace: str, name: str
    ) -> aiohttp.web.StreamResponse:
        (port,) = (int(p) for p in raw_request.query.getall("ports"))
        ws = aiohttp.web.WebSocketResponse(protocols=(PORT_FORWARD_PROTOCOL,))
        await ws.prepare(raw_request)
        opening = port.to_bytes(2, "little")
        await ws.send_bytes(bytes([DATA_CHANNEL]) + opening)
        await ws.send_bytes(bytes([ERROR_CHANNEL]) + opening)
        ip = self._pod_ip(namespace, name)
        try:
            if ip is None:
                raise OSError(f"pod {name} has no IP")
            reader, writer = await asyncio.open_connection(ip, port)
        except OSError as exc:
            await ws.send_bytes(bytes([ERROR_CHANNEL]) + str(exc).encode())
            await ws.close()
            return ws

        async def to_pod() -> None:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY and message.data[:1] == bytes(
                    [DATA_CHANNEL]
                ):
                    writer.write(message.data[1:])
                    await writer.drain()
            writer.close()

        async def from_pod() -> None:
            while data := await reader.read(RELAY_CHUNK):
                await ws.send_bytes(bytes([DATA_CHANNEL]) + data)
            await ws.close()

        tasks = [asyncio.ensure_future(to_pod()), asyncio.ensure_future(from_pod())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()
            await ws.close()
        return ws

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.url.port == self.counted_port:
            verb = str(request.action.value).lower() if request.action is not None else "?"
            if request.method == kmock.method.PATCH:  # kmock files a PATCH under "update"
                verb = "patch"
            self.counts.add(verb, request.resource.plural, _object_name(request))
        try:
            return await super()._handle(request)
        finally:
            # kmock 0.8 keeps every request in ``_requests`` and scans it for each new one.
            for index, logged in enumerate(self._requests):
                if logged is request:
                    del self._requests[index]
                    break
            key = (request.resource, request.namespace, request.name)
            deleted = request.action == kmock.action.DELETE and key in self.objects
            if deleted and self.objects[key].deleted:
                del self.objects[key]


@dataclass
class CountedCluster:
    emulator: CountingEmulator
    orchestrator_url: str  # the backend's requests go here and are counted
    node_url: str  # the node's are not

    @property
    def counts(self) -> ApiCounts:
        counts: ApiCounts = self.emulator.counts
        return counts

    def orchestrator_client(self) -> Any:
        return k8s.ApiClient(k8s.Configuration(host=self.orchestrator_url))

    def node_client(self) -> Any:
        return k8s.ApiClient(k8s.Configuration(host=self.node_url))

    def names(self, kind: str) -> set[str]:
        """Names of the objects of ``kind`` (``pods``, ``secrets``, ``networkpolicies``)."""
        return {
            name
            for (resource, _namespace, name), obj in self.emulator.objects.items()
            if resource.plural == kind and not obj.deleted
        }


@contextlib.asynccontextmanager
async def counted_cluster() -> AsyncIterator[CountedCluster]:
    emulator = CountingEmulator()
    async with (
        emulator,
        kmock.Server(emulator) as orchestrator,
        kmock.Server(emulator) as node,
    ):
        emulator.counted_port = orchestrator.url.port
        for resource in RESOURCES:
            emulator.resources[resource]  # declared: a list before any object is not a 404
        yield CountedCluster(emulator, str(orchestrator.url).rstrip("/"), str(node.url).rstrip("/"))
