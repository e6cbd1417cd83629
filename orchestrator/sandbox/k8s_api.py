"""The Kubernetes API as the sandbox backend uses it, on the official ``kubernetes`` client.

Synchronous, as that client is: the backend calls each method in a thread. Objects go in and
come out as plain dicts (camelCase, as ``kubectl`` shows them). What it does:

- ``create``: a session's Secret, NetworkPolicy and Pod (``k8s_manifests.session_objects``),
  then the Secret and the NetworkPolicy get the created pod as their owner (a patch each of
  ``metadata.ownerReferences``: the pod's ``uid`` exists only once it is created), so a
  cluster's garbage collector removes them with the pod; ``delete`` still deletes all three.
- ``read_pod``: one pod, None when it is gone.
- ``wait_pod``: WATCH the pod (never a poll loop) until a predicate holds or time runs out.
  The watch asks the server to end it (``timeoutSeconds``), and a read gives up after
  ``WATCH_IDLE_S`` without an event (urllib3, under the client, retries such a read a few
  times first), then the pod is watched again: an emulator without server-side timeouts
  cannot hold it forever, and a stop request (a cancelled start) is seen within that time.
- ``daemon_pods``: the pods of one instance's daemons (``LABEL_DAEMON``). The label selector
  goes to the server, and the labels are checked again here (the emulator the tests use
  ignores selectors).
- ``delete``: a session's Pod, Secret and NetworkPolicy by name (one already gone is fine).
- ``port_forward``: one connection to a pod's port through the API server (``pods/portforward``,
  the client's WebSocket), as a socket (``k8s_port_forward.py`` serves it on loopback).
- ``pod_events``: the core/v1 Events about one pod (field selector sent, names checked here).
- ``pod_metrics``: the pod's metrics.k8s.io PodMetrics, or why there are none: a 404 asks
  the group's discovery once, to tell "no metrics server" from "none for this pod yet".

``api_client`` builds the client from ``[kubernetes]``: in-cluster when the orchestrator runs
in a pod and no context is named, else the kubeconfig (``$KUBECONFIG`` as it is when called,
else ``~/.kube/config``; its current context or the named one; never written back).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from orchestrator.errors import SandboxError, SandboxStartError
from orchestrator.sandbox.k8s_manifests import (
    APP_LABEL,
    LABEL_DAEMON,
    LABEL_INSTANCE,
    SESSION_APP,
    owner_reference,
)
from orchestrator.sandbox.k8s_pod_info import NO_METRICS_SERVER, NO_POD_METRICS
from orchestrator.settings import KubernetesSettings

__all__ = [
    "IN_CLUSTER_ENV",
    "METRICS_GROUP",
    "METRICS_VERSION",
    "WATCH_IDLE_S",
    "K8sApi",
    "api_client",
]

HTTP_NOT_FOUND: Final = 404
# Without an event for this long a watch is ended here and started again.
WATCH_IDLE_S: Final = 5.0
IN_CLUSTER_ENV: Final = "KUBERNETES_SERVICE_HOST"
KUBECONFIG_ENV: Final = "KUBECONFIG"
DEFAULT_KUBECONFIG: Final = "~/.kube/config"
API_TIMEOUT_S: Final = 30.0
METRICS_GROUP: Final = "metrics.k8s.io"
METRICS_VERSION: Final = "v1beta1"
METRICS_PODS: Final = "pods"


def api_client(settings: KubernetesSettings) -> Any:
    """The official client's ``ApiClient`` for ``settings`` (``SandboxStartError``, one line,
    when there is no cluster configuration)."""
    from kubernetes import client as typed_client
    from kubernetes import config as typed_config

    # The client's loaders carry no annotations: used through Any.
    client: Any = typed_client
    config: Any = typed_config
    try:
        if settings.context is None and os.environ.get(IN_CLUSTER_ENV):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        # The client reads $KUBECONFIG once, when imported: it is passed as it is now.
        kubeconfig = os.environ.get(KUBECONFIG_ENV) or os.path.expanduser(DEFAULT_KUBECONFIG)
        return config.new_client_from_config(
            config_file=kubeconfig, context=settings.context, persist_config=False
        )
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise SandboxStartError(f"kubernetes: no usable cluster configuration: {exc}") from exc


def _api_error(exc: Exception, what: str) -> SandboxError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or exc
    return SandboxError(f"kubernetes: {what} failed ({status}: {reason})")


class K8sApi:
    """The calls the backend makes, in one namespace, through ``client`` (an ``ApiClient``);
    ``watch_idle_s``: how long a watch's read waits for an event (``WATCH_IDLE_S``)."""

    def __init__(self, client: Any, namespace: str, *, watch_idle_s: float = WATCH_IDLE_S):
        from kubernetes import client as k8s

        self.client = client
        self.namespace = namespace
        self.watch_idle_s = watch_idle_s
        self.core = k8s.CoreV1Api(client)
        self.networking = k8s.NetworkingV1Api(client)
        self.custom = k8s.CustomObjectsApi(client)
        self._exceptions = k8s.exceptions
        # Every call this object made, by verb ("create", "patch", "read", "list", "watch",
        # "delete").
        self.calls: dict[str, int] = {}
        self._calls_lock = threading.Lock()

    def _count(self, verb: str) -> None:
        with self._calls_lock:
            self.calls[verb] = self.calls.get(verb, 0) + 1

    def _plain(self, obj: Any) -> dict[str, Any]:
        plain: dict[str, Any] = self.client.sanitize_for_serialization(obj)
        return plain

    def create(self, objects: list[dict[str, Any]]) -> None:
        """Create ``objects`` (Secret, NetworkPolicy, Pod) in order; then the pod owns the
        others (``SandboxError`` when the server gave the pod no uid to name)."""
        creators: dict[str, Callable[..., Any]] = {
            "Secret": self.core.create_namespaced_secret,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            "Pod": self.core.create_namespaced_pod,
        }
        created: dict[str, dict[str, Any]] = {}
        for obj in objects:
            kind = obj["kind"]
            self._count("create")
            try:
                made = creators[kind](self.namespace, obj, _request_timeout=API_TIMEOUT_S)
            except self._exceptions.ApiException as exc:
                raise _api_error(exc, f"creating {kind} {obj['metadata']['name']}") from exc
            created[kind] = self._plain(made)
        if "Pod" in created:
            self._own(created["Pod"], [kind for kind in created if kind != "Pod"])

    def _own(self, pod: dict[str, Any], kinds: list[str]) -> None:
        """Make ``pod`` the owner of its objects of ``kinds`` (named as it is)."""
        name = pod["metadata"]["name"]
        owner = owner_reference(pod)
        if owner is None:
            raise SandboxError(f"kubernetes: the API server gave pod {name} no uid")
        patchers: dict[str, Callable[..., Any]] = {
            "Secret": self.core.patch_namespaced_secret,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
        }
        body = {"metadata": {"ownerReferences": [owner]}}
        for kind in kinds:
            self._count("patch")
            try:
                patchers[kind](name, self.namespace, body, _request_timeout=API_TIMEOUT_S)
            except self._exceptions.ApiException as exc:
                raise _api_error(exc, f"naming pod {name} the owner of {kind} {name}") from exc

    def read_pod(self, name: str) -> dict[str, Any] | None:
        self._count("read")
        try:
            pod = self.core.read_namespaced_pod(
                name, self.namespace, _request_timeout=API_TIMEOUT_S
            )
        except self._exceptions.ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise _api_error(exc, f"reading pod {name}") from exc
        return self._plain(pod)

    def wait_pod(
        self,
        name: str,
        done: Callable[[dict[str, Any] | None], bool],
        *,
        timeout_s: float,
        stop: threading.Event,
    ) -> dict[str, Any] | None:
        """Watch pod ``name`` until ``done(pod)`` (None: the pod was deleted), ``timeout_s``
        passes or ``stop`` is set; returns the last state seen (None: never seen or deleted)."""
        from kubernetes import watch as typed_watch
        from urllib3.exceptions import HTTPError as Urllib3Error

        watch: Any = typed_watch
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] | None = None
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return last
            watcher = watch.Watch()
            self._count("watch")
            try:
                for event in watcher.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=max(1, int(remaining)),
                    _request_timeout=(API_TIMEOUT_S, self.watch_idle_s),
                    deserialize=False,
                ):
                    pod = event.get("object") or {}
                    if (pod.get("metadata") or {}).get("name") != name:
                        continue  # a server that ignores the field selector
                    last = None if event.get("type") == "DELETED" else pod
                    if done(last) or stop.is_set() or time.monotonic() >= deadline:
                        watcher.stop()
                        return last
            except self._exceptions.ApiException as exc:
                raise _api_error(exc, f"watching pod {name}") from exc
            except Urllib3Error:
                continue  # no event for watch_idle_s (or the stream broke): watch again
        return last

    def daemon_pods(self, instance: str) -> list[dict[str, Any]]:
        """Session pods of ``instance``'s daemons in the namespace (labels checked here too)."""
        return self._session_pods(instance, daemon=True)

    def run_pods(self, instance: str) -> list[dict[str, Any]]:
        """Session pods of ``instance``'s print-mode runs in the namespace (``daemon=false``)."""
        return self._session_pods(instance, daemon=False)

    def _session_pods(self, instance: str, *, daemon: bool) -> list[dict[str, Any]]:
        flag = "true" if daemon else "false"
        selector = f"{APP_LABEL}={SESSION_APP},{LABEL_INSTANCE}={instance},{LABEL_DAEMON}={flag}"
        self._count("list")
        try:
            listed = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=API_TIMEOUT_S
            )
        except self._exceptions.ApiException as exc:
            raise _api_error(exc, "listing pods") from exc
        pods = [self._plain(pod) for pod in listed.items]
        return [pod for pod in pods if _has_labels(pod, instance, daemon=daemon)]

    def pod_events(self, name: str) -> list[dict[str, Any]]:
        """The namespace's core/v1 Events whose ``involvedObject`` is pod ``name``."""
        self._count("list")
        try:
            listed = self.core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}",
                _request_timeout=API_TIMEOUT_S,
            )
        except self._exceptions.ApiException as exc:
            raise _api_error(exc, f"listing the events of pod {name}") from exc
        events = [self._plain(event) for event in listed.items]
        return [e for e in events if (e.get("involvedObject") or {}).get("name") == name]

    def pod_metrics(self, name: str) -> tuple[dict[str, Any] | None, str]:
        """Pod ``name``'s PodMetrics and ""; or None and why there are none (one line)."""
        self._count("read")
        try:
            found = self.custom.get_namespaced_custom_object(
                METRICS_GROUP,
                METRICS_VERSION,
                self.namespace,
                METRICS_PODS,
                name,
                _request_timeout=API_TIMEOUT_S,
            )
        except self._exceptions.ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                return None, f"metrics server unavailable ({exc.status}: {exc.reason})"
        else:
            return (dict(found), "") if isinstance(found, Mapping) else (None, NO_POD_METRICS)
        # Not found: the pod's metrics, or the whole metrics.k8s.io group? Its discovery says.
        self._count("read")
        try:
            served: Any = self.custom.get_api_resources(
                METRICS_GROUP,
                METRICS_VERSION,
                _preload_content=False,
                _request_timeout=API_TIMEOUT_S,
            )
            served.release_conn()
        except self._exceptions.ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None, NO_METRICS_SERVER
            return None, f"metrics server unavailable ({exc.status}: {exc.reason})"
        return None, NO_POD_METRICS

    def delete(self, name: str) -> None:
        """Delete the Pod, Secret and NetworkPolicy named ``name`` (each may be gone)."""
        deleters: list[Callable[..., Any]] = [
            self.core.delete_namespaced_pod,
            self.core.delete_namespaced_secret,
            self.networking.delete_namespaced_network_policy,
        ]
        for delete in deleters:
            self._count("delete")
            try:
                delete(name, self.namespace, _request_timeout=API_TIMEOUT_S)
            except self._exceptions.ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise _api_error(exc, f"deleting {name}") from exc

    def port_forward(self, name: str, port: int) -> socket.socket:
        """A new connection to ``port`` of pod ``name`` through the API server's port-forward:
        a non-blocking socket whose other end the client's proxy thread relays; closing it ends
        the forward."""
        from kubernetes.stream import portforward

        self._count("portforward")
        try:
            forward: Any = portforward(
                self.core.connect_get_namespaced_pod_portforward,
                name,
                self.namespace,
                ports=str(port),
                _request_timeout=API_TIMEOUT_S,
            )
        except self._exceptions.ApiException as exc:
            raise _api_error(exc, f"forwarding to pod {name}") from exc
        wrapped = forward.socket(port)  # the client's wrapper of one end of a socket pair
        own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(wrapped.fileno()))
        wrapped.close()
        own.setblocking(False)
        return own

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def _has_labels(pod: Mapping[str, Any], instance: str, *, daemon: bool = True) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(APP_LABEL) == SESSION_APP
        and labels.get(LABEL_INSTANCE) == instance
        and labels.get(LABEL_DAEMON) == ("true" if daemon else "false")
    )
