"""kmock's Kubernetes emulator with the API requests counted where they arrive, for the scale
bench (bench/bench_k8s_scale.py) and the tests that assert which calls the kubernetes backend
makes (tests/integration/test_k8s_api_calls.py).

The emulator is served on two ports: one for the orchestrator (the backend under test) and one
for the node. Every request that arrives on the orchestrator's port is counted by verb
(``create``, ``watch``, ``list``, ``fetch``, ``update``, ``delete``), resource (``pods``,
``secrets``, ``networkpolicies``) and the object it names (a session's three objects share the
pod's name), at the server, whatever the client believes it sent.

Two changes keep the emulator's cost per request constant over thousands of sessions, as a real
API server's is: kmock looks each new request up in its log of every request ever made (so the
n-th request costs O(n)); here the log holds only the requests in flight. And an object deleted
is forgotten, as a real server forgets it (kmock keeps it, soft-deleted, and scans it on every
list and watch).
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import kmock
from kubernetes import client as k8s

__all__ = ["ApiCounts", "CountedCluster", "CountingEmulator", "counted_cluster"]

RESOURCES: Final = ("v1/pods", "v1/secrets", "networking.k8s.io/v1/networkpolicies")
NAME_SELECTOR: Final = "metadata.name="


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


class CountingEmulator(kmock.KubernetesEmulator):
    """See the module docstring. ``counted_port``: the port whose requests are counted."""

    counted_port: int | None = None
    counts: ApiCounts

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.counts = ApiCounts()

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.url.port == self.counted_port:
            verb = str(request.action.value).lower() if request.action is not None else "?"
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
