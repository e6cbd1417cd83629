"""The Kubernetes objects of one session's sandbox: its Pod, its Secret, its NetworkPolicy.

Pure builders: a session's ``SandboxSpec`` and its stored sandbox policy (``session_specs``)
become plain dicts, as ``kubectl apply`` or the API takes them; nothing here talks to a
cluster. The pod runs the command a docker container runs (``docker_run.py``), the same
gateway from the same session image, with three differences: the gateway listens on the pod's
IP at ``[kubernetes] gateway_port`` instead of a bound Unix socket, its token is a file of the
session's Secret (``gateway_main --token-file``), and NATS is reached directly, not through the
in-sandbox relay. docs/kubernetes.md lists the security properties each pod has;
``tests/unit/test_k8s_manifests.py`` asserts them and validates every object against the
Kubernetes schemas.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.errors import SandboxStartError
from orchestrator.runtime.wire import NATS_CREDENTIAL_FILES
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.confined import (
    CONTAINER_GATEWAY_RUNTIME,
    CONTAINER_HOME,
    CONTAINER_NATS_PORT,
    CONTAINER_SKILLS_DIR,
    GATEWAY_MODULE,
    session_env,
)
from orchestrator.sandbox.docker_run import CONTAINER_PYTHON
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.docker_user import SANDBOX_UID
from orchestrator.sandbox.images import resolve_image
from orchestrator.sandbox.k8s_hardening import container_security, pod_security
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.settings import PROCESS_STOP_GRACE_S, KubernetesSettings

__all__ = [
    "APP_LABEL",
    "GPU_RESOURCE",
    "LABEL_DAEMON",
    "LABEL_HOST",
    "LABEL_INSTANCE",
    "LABEL_PID",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "NATS_APP",
    "ORCHESTRATOR_APP",
    "POD_OUTPUTS_DIR",
    "SECRET_DIR",
    "SESSION_APP",
    "RunProcess",
    "SessionPod",
    "files_roots",
    "label_value",
    "owner_reference",
    "pod_name",
    "session_network_policy",
    "session_objects",
    "session_pod",
    "session_secret",
]

# Labels. The app names are the contract with k8s/: the orchestrator Deployment's pods and the
# NATS StatefulSet's pods carry them, and each session's NetworkPolicy selects them.
APP_LABEL: Final = "app.kubernetes.io/name"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "prime-agent"
SESSION_APP: Final = "prime-agent-session"
ORCHESTRATOR_APP: Final = "prime-agent-orchestrator"
NATS_APP: Final = "nats"
# Ownership (as docker's labels, docker_owned.py): which orchestrator instance started the pod
# and for which session, so a restarted orchestrator finds its pods.
LABEL_INSTANCE: Final = "prime-agent/instance"
LABEL_SESSION: Final = "prime-agent/session"
LABEL_ROOT: Final = "prime-agent/root"
# "true" on a daemon's sandboxes (``SandboxSpec.die_with_parent`` off): only those are the
# next daemon's to adopt or remove (a print-mode run's pod of the same instance is not).
LABEL_DAEMON: Final = "prime-agent/daemon"
# A print-mode run's pod: the host and pid of the run (``RunProcess``); doctor --fix removes
# the pods of runs on this host that are gone.
LABEL_HOST: Final = "prime-agent/host"
LABEL_PID: Final = "prime-agent/pid"
LABEL_VALUE_MAX_CHARS: Final = 63
UNKNOWN_HOST: Final = "unknown"

POD_NAME_PREFIX: Final = "prime-agent-"
# What a session id must be to name a pod (inside a DNS label) and be a label value: lower
# case, digits and '-', at most 40 characters so that the pod's whole name stays a DNS label.
LABEL_VALUE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
POD_SUFFIX_BYTES: Final = 3
CONTAINER_NAME: Final = "sandbox"
POD_HOSTNAME: Final = "sandbox"
GATEWAY_PORT_NAME: Final = "gateway"
LISTEN_ALL: Final = "0.0.0.0"
# The session's Secret, mounted read-only: one file per key, readable by the pod's group only.
SECRET_DIR: Final = "/run/secrets/prime-agent"
SECRET_FILE_MODE: Final = 0o440
TOKEN_KEY: Final = "gateway-token"
# NATS credentials: the kernel env names the bus hands a session (bus/credentials.py) -> file
# (the names the in-kernel runtime reads them by, runtime/wire.py).
NATS_SECRET_KEYS: Final = NATS_CREDENTIAL_FILES
# Writable directories of a read-only root: /tmp and home in memory (they count against the
# memory limit, as docker's tmpfs do), the workspace on the node's disk.
TMP_VOLUME: Final = "tmp"
HOME_VOLUME: Final = "home"
WORKSPACE_VOLUME: Final = "workspace"
SECRET_VOLUME: Final = "secrets"
MEMORY_MEDIUM: Final = "Memory"
# What crosses between host and pod through the gateway's files endpoint (gateway_files.py),
# each on the node's disk (docs/kubernetes.md, "Files between host and pod"): cell outputs
# under one fixed path that the host uses too (a path in a tool result opens on both sides),
# the session's namespace snapshot at docker's fixed path, and its skill directories.
OUTPUTS_VOLUME: Final = "outputs"
SNAPSHOT_VOLUME: Final = "snapshot"
SKILLS_VOLUME: Final = "skills"
POD_OUTPUTS_DIR: Final = "/tmp/prime-agent-pods"
OUTPUTS_MIB: Final = 1024
SNAPSHOT_MIB: Final = 1024  # two generations of SNAPSHOT_TOTAL_CAP_BYTES (256 MiB) and room
SKILLS_MIB: Final = 64
# Ephemeral storage beyond the workspace: the container's logs.
LOG_STORAGE_MIB: Final = 256
MILLICORES_PER_CPU: Final = 1000
MIN_MILLICORES: Final = 1
GPU_RESOURCE: Final = "nvidia.com/gpu"
# Readiness: the gateway accepts connections (it binds only once it can serve).
READINESS_PERIOD_S: Final = 1
READINESS_FAILURES: Final = 60
# DNS: a session resolves the NATS Service's name through the cluster's DNS, and nothing else.
DNS_PORT: Final = 53
DNS_NAMESPACE: Final = "kube-system"
DNS_APP_LABEL: Final = "k8s-app"
DNS_APP: Final = "kube-dns"
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class SessionPod:
    """One sandbox pod to build: the session's spec, the policy it was created with, who owns
    the pod (``instance``), the gateway's ``token`` and the pod's ``name`` (``pod_name``).
    ``run``: for a print-mode run's pod (``spec.die_with_parent``), the run's process, so that
    ``doctor`` can tell the pod of a run that is gone (a cluster has no die-with-parent)."""

    spec: SandboxSpec
    policy: StoredSandboxPolicy
    instance: str
    token: str
    name: str
    run: RunProcess | None = None


@dataclass(frozen=True)
class RunProcess:
    """The process that owns a print-mode run's pod: its host's name and its pid."""

    host: str
    pid: int

    @classmethod
    def this(cls) -> RunProcess:
        return cls(label_value(socket.gethostname()), os.getpid())


def label_value(text: str) -> str:
    """``text`` as a label value: lower case, ``[a-z0-9.-]`` and at most 63 characters,
    starting and ending with an alphanumeric (``unknown`` when nothing of it is left)."""
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", text.lower())[:LABEL_VALUE_MAX_CHARS].strip(".-")
    return cleaned or UNKNOWN_HOST


def pod_name(session_id: str, suffix: str | None = None) -> str:
    """A new pod's name for ``session_id``; the Secret and the NetworkPolicy of that pod share
    it. ``SandboxStartError`` when the session id cannot be part of a name or a label value
    (ours, ``s-`` and base32, always can)."""
    if not LABEL_VALUE.match(session_id):
        raise SandboxStartError(
            f"session id {session_id!r} cannot name a pod: use lower-case letters, digits and '-'"
        )
    tail = suffix if suffix is not None else secrets.token_hex(POD_SUFFIX_BYTES)
    return f"{POD_NAME_PREFIX}{session_id}-{tail}"


def pod_image(policy: StoredSandboxPolicy, settings: KubernetesSettings) -> str:
    """The image the cluster pulls: the policy's (``session``, ``rust``, ``cuda`` or a tag)
    behind ``[kubernetes] image_registry``."""
    return f"{settings.image_registry}{resolve_image(policy.image)}"


def _labels(request: SessionPod) -> dict[str, str]:
    spec = request.spec
    return {
        APP_LABEL: SESSION_APP,
        MANAGED_BY_LABEL: MANAGED_BY,
        LABEL_INSTANCE: request.instance,
        LABEL_SESSION: spec.session_id,
        LABEL_ROOT: spec.labels.get("root", spec.session_id),
        LABEL_DAEMON: "false" if spec.die_with_parent else "true",
        **(
            {LABEL_HOST: request.run.host, LABEL_PID: str(request.run.pid)}
            if request.run is not None and spec.die_with_parent
            else {}
        ),
    }


def _metadata(request: SessionPod, settings: KubernetesSettings) -> dict[str, Any]:
    return {"name": request.name, "namespace": settings.namespace, "labels": _labels(request)}


def _command(spec: SandboxSpec, settings: KubernetesSettings) -> list[str]:
    # The kernel env names the gateway lets through: the session's, as the host sends them
    # when it starts the kernel (NATS by its URL, no relay).
    command = [
        CONTAINER_PYTHON,
        "-P",
        "-m",
        GATEWAY_MODULE,
        "--runtime-dir",
        CONTAINER_GATEWAY_RUNTIME,
        "--ip",
        LISTEN_ALL,
        "--port",
        str(settings.gateway_port),
        "--token-file",
        f"{SECRET_DIR}/{TOKEN_KEY}",
    ]
    for name in sorted(session_env(spec, relayed=False)):
        command += ["--env-allow", name]
    for root in files_roots(spec):
        command += ["--files-root", root]
    return command


def files_roots(spec: SandboxSpec) -> list[str]:
    """The directories the host may move files in and out of (``gateway_main --files-root``):
    the workspace, home, and the outputs, snapshot and skills volumes."""
    return [str(spec.cwd), CONTAINER_HOME, POD_OUTPUTS_DIR, CONTAINER_SNAPSHOT_DIR,
            CONTAINER_SKILLS_DIR]  # fmt: skip


def _resources(policy: StoredSandboxPolicy, settings: KubernetesSettings) -> dict[str, Any]:
    # Requests equal limits: the pod is Guaranteed, the last a node evicts under pressure.
    millicores = max(MIN_MILLICORES, round(policy.cpus * MILLICORES_PER_CPU))
    storage_mib = settings.workspace_mib + LOG_STORAGE_MIB + OUTPUTS_MIB + SNAPSHOT_MIB + SKILLS_MIB
    amounts: dict[str, str] = {
        "cpu": f"{millicores}m",
        "memory": str(policy.memory_bytes),
        "ephemeral-storage": f"{storage_mib}Mi",
    }
    limits = dict(amounts)
    if settings.gpus:
        limits[GPU_RESOURCE] = str(settings.gpus)  # extended resources: limits only
    return {"requests": amounts, "limits": limits}


def _volumes(request: SessionPod, settings: KubernetesSettings) -> list[dict[str, Any]]:
    return [
        {
            "name": TMP_VOLUME,
            "emptyDir": {"medium": MEMORY_MEDIUM, "sizeLimit": f"{settings.tmp_mib}Mi"},
        },
        {
            "name": HOME_VOLUME,
            "emptyDir": {"medium": MEMORY_MEDIUM, "sizeLimit": f"{settings.home_mib}Mi"},
        },
        {"name": WORKSPACE_VOLUME, "emptyDir": {"sizeLimit": f"{settings.workspace_mib}Mi"}},
        {
            "name": SECRET_VOLUME,
            "secret": {"secretName": request.name, "defaultMode": SECRET_FILE_MODE},
        },
        {"name": OUTPUTS_VOLUME, "emptyDir": {"sizeLimit": f"{OUTPUTS_MIB}Mi"}},
        {"name": SNAPSHOT_VOLUME, "emptyDir": {"sizeLimit": f"{SNAPSHOT_MIB}Mi"}},
        {"name": SKILLS_VOLUME, "emptyDir": {"sizeLimit": f"{SKILLS_MIB}Mi"}},
    ]


def _mounts(request: SessionPod) -> list[dict[str, Any]]:
    workspace = str(request.spec.cwd)
    return [
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": HOME_VOLUME, "mountPath": CONTAINER_HOME},
        # Writable in every mode: the host copies the project in through the gateway (an
        # "ro" workspace is one whose changes are never copied back: docs/kubernetes.md).
        {"name": WORKSPACE_VOLUME, "mountPath": workspace, "readOnly": False},
        {"name": SECRET_VOLUME, "mountPath": SECRET_DIR, "readOnly": True},
        {"name": OUTPUTS_VOLUME, "mountPath": POD_OUTPUTS_DIR},
        {"name": SNAPSHOT_VOLUME, "mountPath": CONTAINER_SNAPSHOT_DIR},
        {"name": SKILLS_VOLUME, "mountPath": CONTAINER_SKILLS_DIR},
    ]


def session_pod(request: SessionPod, settings: KubernetesSettings) -> dict[str, Any]:
    """The session's Pod, hardened (docs/kubernetes.md, "Security"): non-root, no privilege
    escalation, no capabilities, read-only root, seccomp RuntimeDefault, no service-account
    token, no service links; requests and limits from the policy. ``SandboxStartError`` for a
    policy a pod cannot honour (host directories mounted inside)."""
    spec, policy = request.spec, request.policy
    if policy.mounts or spec.mounts:
        raise SandboxStartError(
            "extra mounts show host directories: use the docker or bwrap backend for them"
        )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": pod_image(policy, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": _command(spec, settings),
        "workingDir": str(spec.cwd),
        # From scratch: nothing of the orchestrator's environment.
        "env": [
            {"name": "LANG", "value": "C.UTF-8"},
            {"name": "HOME", "value": CONTAINER_HOME},
        ],
        "ports": [
            {"name": GATEWAY_PORT_NAME, "containerPort": settings.gateway_port, "protocol": "TCP"}
        ],
        "readinessProbe": {
            "tcpSocket": {"port": GATEWAY_PORT_NAME},
            "periodSeconds": READINESS_PERIOD_S,
            "failureThreshold": READINESS_FAILURES,
        },
        "resources": _resources(policy, settings),
        "securityContext": container_security(SANDBOX_UID),
        "volumeMounts": _mounts(request),
    }
    pod_spec: dict[str, Any] = {
        # A dead gateway is a dead sandbox: the session's supervisor starts a new pod.
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": POD_HOSTNAME,
        "terminationGracePeriodSeconds": round(PROCESS_STOP_GRACE_S),
        # the Secret's files and the emptyDirs are the group's
        "securityContext": pod_security(SANDBOX_UID),
        "containers": [container],
        "volumes": _volumes(request, settings),
    }
    if settings.runtime_class is not None:
        pod_spec["runtimeClassName"] = settings.runtime_class
    if settings.gpus:
        # GPU nodes are commonly tainted so that only pods asking for GPUs land there.
        pod_spec["tolerations"] = [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(request, settings),
        "spec": pod_spec,
    }


def secret_files(request: SessionPod) -> dict[str, str]:
    """The Secret's files: the gateway token and the session's NATS credentials (those of its
    kernel env: user and password, or JWT and nkey seed)."""
    files = {TOKEN_KEY: request.token}
    env: Mapping[str, str] = request.spec.env
    for name, key in NATS_SECRET_KEYS.items():
        if env.get(name):
            files[key] = env[name]
    return files


def session_secret(request: SessionPod, settings: KubernetesSettings) -> dict[str, Any]:
    """The session's Secret (named as its pod), mounted read-only at ``SECRET_DIR``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(request, settings),
        "type": "Opaque",
        "immutable": True,
        "stringData": secret_files(request),
    }


def _dns_egress() -> dict[str, Any]:
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: DNS_NAMESPACE}},
                "podSelector": {"matchLabels": {DNS_APP_LABEL: DNS_APP}},
            }
        ],
        "ports": [
            {"protocol": "UDP", "port": DNS_PORT},
            {"protocol": "TCP", "port": DNS_PORT},
        ],
    }


def session_network_policy(request: SessionPod, settings: KubernetesSettings) -> dict[str, Any]:
    """The session pod's NetworkPolicy: ingress only from the orchestrator to the gateway
    port; egress only to NATS (and the cluster DNS that names it), and anywhere only when the
    session's policy grants network."""
    egress: list[dict[str, Any]] = [
        {
            "to": [{"podSelector": {"matchLabels": {APP_LABEL: NATS_APP}}}],
            "ports": [{"protocol": "TCP", "port": CONTAINER_NATS_PORT}],
        },
        _dns_egress(),
    ]
    if request.policy.network:
        egress.append({})  # one empty rule: every destination
    pod = _labels(request)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(request, settings),
        "spec": {
            "podSelector": {
                "matchLabels": {
                    LABEL_SESSION: pod[LABEL_SESSION],
                    LABEL_INSTANCE: pod[LABEL_INSTANCE],
                }
            },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {APP_LABEL: ORCHESTRATOR_APP}}}],
                    "ports": [{"protocol": "TCP", "port": settings.gateway_port}],
                }
            ],
            "egress": egress,
        },
    }


def owner_reference(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``ownerReferences`` entry that names ``pod`` (a pod as the API server returned it
    from its creation: only then does it have a ``uid``) as the owner of its session's Secret
    and NetworkPolicy, so that a cluster's garbage collector removes them with it. None when
    the pod has no uid (a server that did not give one)."""
    metadata = pod.get("metadata") or {}
    uid, name = metadata.get("uid"), metadata.get("name")
    if not uid or not name:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def session_objects(request: SessionPod, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """Everything one sandbox needs, in the order to create it: Secret and NetworkPolicy first,
    so the pod never starts without its token or unconfined (then both get the created pod as
    their owner: ``owner_reference``)."""
    return [
        session_secret(request, settings),
        session_network_policy(request, settings),
        session_pod(request, settings),
    ]
