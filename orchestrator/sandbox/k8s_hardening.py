"""The security contexts every pod of ours runs under (docs/kubernetes.md, "Security"): a
session's sandbox pod (``k8s_manifests``) and a sweep shard's Job pod (``sweeps/k8s_job``) are
hardened the same way, so they are written once.

A container: a fixed non-root uid and gid, never privileged, no privilege escalation, every
capability dropped, a read-only root filesystem (what it writes goes to its emptyDirs), the
runtime's default seccomp profile. A pod: the same uid, its volumes owned by that group.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["SECCOMP_RUNTIME_DEFAULT", "container_security", "pod_security"]

SECCOMP_RUNTIME_DEFAULT: Final = {"type": "RuntimeDefault"}


def container_security(uid: int) -> dict[str, Any]:
    """A container's ``securityContext``, running as ``uid`` (its group the same id)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT),
    }


def pod_security(uid: int) -> dict[str, Any]:
    """A pod's ``securityContext``: ``uid`` for every container, its volumes the group's."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": dict(SECCOMP_RUNTIME_DEFAULT),
    }
