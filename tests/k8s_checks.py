"""Checks on Kubernetes objects shared by the builder tests and the k8s/ (kustomize) tests:
strict schema validation for the newest Kubernetes minors ``kubernetes-validate`` ships, and the
security properties every pod of ours must have (docs/kubernetes.md, "Security")."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import kubernetes_validate
from kubernetes_validate.utils import all_versions

__all__ = [
    "NEWEST_MINORS",
    "assert_hardened",
    "assert_session_pod",
    "containers",
    "validate_everywhere",
]

# How many of the newest Kubernetes minors every object is validated against.
MINORS_CHECKED: Final = 3


def _newest_minors(count: int) -> tuple[str, ...]:
    versions = sorted(set(all_versions()), key=lambda v: tuple(int(p) for p in v.split(".")))
    return tuple(versions[-count:])


NEWEST_MINORS: Final = _newest_minors(MINORS_CHECKED)


def validate_everywhere(obj: Mapping[str, Any]) -> None:
    """Validate ``obj`` strictly (no unknown field anywhere) for each of ``NEWEST_MINORS``;
    raises ``kubernetes_validate.ValidationError`` naming the first problem."""
    for version in NEWEST_MINORS:
        kubernetes_validate.validate(dict(obj), version, strict=True)


def containers(pod_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every container of a pod spec, init containers included."""
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec["containers"]


def assert_hardened(pod_spec: Mapping[str, Any], where: str) -> None:
    """The properties every pod of ours has: non-root, seccomp RuntimeDefault, no automounted
    service-account token, no service links; each container without privilege escalation,
    with every capability dropped, a read-only root filesystem, and CPU and memory limits."""
    pod_context = pod_spec.get("securityContext", {})
    assert pod_context.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
    assert pod_context.get("runAsUser", 0) != 0, f"{where}: runAsUser is root"
    assert pod_context.get("seccompProfile") == {"type": "RuntimeDefault"}, f"{where}: seccomp"
    assert pod_spec.get("automountServiceAccountToken") is False, f"{where}: token automount"
    assert pod_spec.get("enableServiceLinks") is False, f"{where}: service links"
    assert not pod_spec.get("hostNetwork") and not pod_spec.get("hostPID"), f"{where}: host"
    for container in containers(pod_spec):
        name = f"{where}/{container['name']}"
        context = container.get("securityContext", {})
        assert context.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation"
        assert context.get("capabilities") == {"drop": ["ALL"]}, f"{name}: capabilities"
        assert context.get("readOnlyRootFilesystem") is True, f"{name}: writable root"
        assert context.get("privileged", False) is False, f"{name}: privileged"
        assert context.get("runAsNonRoot", True) is True, f"{name}: runAsNonRoot"
        assert context.get("runAsUser", 1) != 0, f"{name}: runAsUser is root"
        limits = container.get("resources", {}).get("limits", {})
        assert "cpu" in limits and "memory" in limits, f"{name}: no cpu/memory limits"


def assert_session_pod(pod_spec: Mapping[str, Any], where: str) -> None:
    """A session pod: hardened, never restarted in place, /tmp and home on size-limited
    emptyDirs, every emptyDir size-limited, its Secret mounted read-only."""
    assert_hardened(pod_spec, where)
    assert pod_spec.get("restartPolicy") == "Never", f"{where}: restartPolicy"
    volumes = {volume["name"]: volume for volume in pod_spec["volumes"]}
    for volume in volumes.values():
        if "emptyDir" in volume:
            assert volume["emptyDir"].get("sizeLimit"), f"{where}: {volume['name']} unbounded"
    (container,) = pod_spec["containers"]
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    for path in ("/tmp", container_home(container)):
        assert path in mounts, f"{where}: nothing mounted at {path}"
        assert "emptyDir" in volumes[mounts[path]["name"]], f"{where}: {path} not an emptyDir"
    secret_mounts = [m for m in mounts.values() if "secret" in volumes[m["name"]]]
    assert secret_mounts, f"{where}: no Secret mounted"
    assert all(m.get("readOnly") is True for m in secret_mounts), f"{where}: Secret writable"


def container_home(container: Mapping[str, Any]) -> str:
    (home,) = [e["value"] for e in container.get("env", []) if e["name"] == "HOME"]
    return str(home)
