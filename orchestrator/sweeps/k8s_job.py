"""A sweep as a Kubernetes Indexed Job (``sweep submit``; docs/sweeps.md, "Shards, merge and
Kubernetes").

Two manifests, as plain data:

- a ConfigMap holding the sweep file, mounted read-only in every pod;
- a ``batch/v1`` Job with ``completionMode: Indexed`` and ``completions: N``: index ``i`` runs
  ``prime-agent sweep run FILE --shard i/N --export-dir /results/<sweep>``, its own home and
  store on an ``emptyDir``, its Parquet export on the shared claim mounted at ``/results``. Each
  index is retried on its own (``backoffLimitPerIndex``), so one shard's failures never fail
  the others.

The pod is hardened: non-root user and group, no privilege escalation, every capability
dropped, a read-only root filesystem (writable only in its size-limited ``emptyDir``\\ s),
seccomp ``RuntimeDefault``, no service-account token and no service links. Trials run on the
``local`` backend inside the pod (the pod is the sandbox: there is no Docker engine, and bwrap
would need privileges the pod does not have).

A failure a retry cannot mend (exit 2, the user must fix something; exit 4, the shard's budget
is spent) fails its index at once (``podFailurePolicy`` ``FailIndex``); a pod evicted or
preempted (``DisruptionTarget``) is not counted as a failure.

The shard index comes from the annotation the Job controller gives each pod
(``batch.kubernetes.io/job-completion-index``, the value of ``JOB_COMPLETION_INDEX``) through the
downward API, so the command needs no shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.errors import UserError
from orchestrator.sandbox.k8s_hardening import container_security, pod_security
from orchestrator.sweeps.shards import MAX_SHARDS
from orchestrator.sweeps.spec import SweepFile
from orchestrator.sweeps.suites import PATH_SUITES

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_RESULTS_CLAIM",
    "DEFAULT_RETRIES_PER_SHARD",
    "RESULTS_MOUNT",
    "SWEEP_FILE_MOUNT",
    "JobRequest",
    "sweep_manifests",
]

DEFAULT_IMAGE: Final = "prime-agent/orchestrator:latest"
DEFAULT_RESULTS_CLAIM: Final = "prime-agent-sweep-results"
DEFAULT_RETRIES_PER_SHARD: Final = 2
RESULTS_MOUNT: Final = "/results"
SWEEP_FILE_MOUNT: Final = "/etc/prime-agent/sweep"
SWEEP_FILE_KEY: Final = "sweep.yaml"
HOME_MOUNT: Final = "/home/prime-agent"
TMP_MOUNT: Final = "/tmp"
POD_UID: Final = 10001  # any non-root id; the image need not know it (HOME is the emptyDir)
HOME_SIZE: Final = "4Gi"  # the shard's store, its trials' workspaces
TMP_SIZE: Final = "1Gi"
CPU_REQUEST: Final = "1"
MEMORY_REQUEST: Final = "2Gi"
MEMORY_LIMIT: Final = "4Gi"
MAX_RETRIES_PER_SHARD: Final = 100
JOB_NAME_CHARS: Final = 52  # Indexed pods are named <job>-<index>-<suffix>: keep room
INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
SHARD_INDEX_ENV: Final = "SHARD_INDEX"
APP_LABEL: Final = "prime-agent"
SWEEP_LABEL: Final = "prime-agent.io/sweep"
CONTAINER_NAME: Final = "shard"
# sweep run's exit codes that a retry cannot change: the user must fix something (2: the file,
# a model, a key), or the shard's budget is spent (4: a retry would spend it again).
NO_RETRY_EXIT_CODES: Final = (2, 4)


def _job_name(sweep: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", sweep.lower()).strip("-")
    return f"sweep-{slug}"[:JOB_NAME_CHARS].rstrip("-")


@dataclass(frozen=True)
class JobRequest:
    """What ``sweep submit`` was asked for."""

    spec: SweepFile
    sweep_text: str  # the file as written: the pods read the same bytes
    shards: int
    parallelism: int | None = None  # default: every shard at once
    retries_per_shard: int = DEFAULT_RETRIES_PER_SHARD
    image: str = DEFAULT_IMAGE
    results_claim: str = DEFAULT_RESULTS_CLAIM
    namespace: str | None = None
    env_secret: str | None = None  # a Secret whose keys become the pods' environment (API keys)
    runtime_class: str | None = None  # gVisor, Kata

    def check(self) -> None:
        """One line for a request that cannot make a Job."""
        if not 1 <= self.shards <= MAX_SHARDS:
            raise UserError(f"--shards {self.shards}: use 1..{MAX_SHARDS}")
        if self.parallelism is not None and not 1 <= self.parallelism <= self.shards:
            raise UserError(f"--parallelism {self.parallelism}: use 1..{self.shards} (--shards)")
        if not 0 <= self.retries_per_shard <= MAX_RETRIES_PER_SHARD:
            raise UserError(
                f"--retries {self.retries_per_shard}: use 0..{MAX_RETRIES_PER_SHARD} per shard"
            )
        read = [s.suite for s in self.spec.suites if s.suite in PATH_SUITES]
        if read:
            raise UserError(
                f"sweep {self.spec.name}: suite {read[0]} reads task directories from this "
                "machine, and a Job ships only the sweep file; run it here, or sweep run --shard "
                "on machines that have them"
            )


def sweep_manifests(request: JobRequest) -> list[dict[str, Any]]:
    """The ConfigMap and the Job, in the order they are created."""
    request.check()
    name = _job_name(request.spec.name)
    labels = {
        "app.kubernetes.io/name": APP_LABEL,
        "app.kubernetes.io/component": "sweep-shard",
        SWEEP_LABEL: name.removeprefix("sweep-"),
    }

    def meta(named: str) -> dict[str, Any]:
        made: dict[str, Any] = {"name": named, "labels": dict(labels)}
        if request.namespace:
            made["namespace"] = request.namespace
        return made

    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(f"{name}-file"),
        "data": {SWEEP_FILE_KEY: request.sweep_text},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(name),
        "spec": {
            "completionMode": "Indexed",
            "completions": request.shards,
            "parallelism": request.parallelism or request.shards,
            "backoffLimitPerIndex": request.retries_per_shard,
            "podFailurePolicy": {
                "rules": [
                    # A pod evicted or preempted did not fail: its retry is not counted.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                    # A bad file, model or key, or a spent budget: a retry would not help.
                    {
                        "action": "FailIndex",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "In",
                            "values": list(NO_RETRY_EXIT_CODES),
                        },
                    },
                ]
            },
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": _pod_spec(request, f"{name}-file"),
            },
        },
    }
    return [config_map, job]


def _pod_spec(request: JobRequest, config_map: str) -> dict[str, Any]:
    export_dir = f"{RESULTS_MOUNT}/{request.spec.name}"
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": request.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["prime-agent"],
        "args": [
            "sweep",
            "run",
            f"{SWEEP_FILE_MOUNT}/{SWEEP_FILE_KEY}",
            "--shard",
            f"$({SHARD_INDEX_ENV})/{request.shards}",
            "--export-dir",
            export_dir,
        ],
        "env": [
            {
                "name": SHARD_INDEX_ENV,
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}
                },
            },
            # The shard's own home: config, store, runtime dir, all in the emptyDir.
            {"name": "HOME", "value": HOME_MOUNT},
            {"name": "XDG_CONFIG_HOME", "value": f"{HOME_MOUNT}/config"},
            {"name": "XDG_DATA_HOME", "value": f"{HOME_MOUNT}/data"},
            {"name": "XDG_CACHE_HOME", "value": f"{HOME_MOUNT}/cache"},
            {"name": "XDG_RUNTIME_DIR", "value": f"{HOME_MOUNT}/run"},
            {"name": "TMPDIR", "value": TMP_MOUNT},
            {"name": "PRIME_AGENT_DAEMON_AUTOSTART", "value": "1"},
            {"name": "PRIME_AGENT_BACKEND", "value": "local"},
        ],
        "resources": {
            "requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST},
            "limits": {"memory": MEMORY_LIMIT},
        },
        "securityContext": container_security(POD_UID),
        "volumeMounts": [
            {"name": "sweep-file", "mountPath": SWEEP_FILE_MOUNT, "readOnly": True},
            {"name": "home", "mountPath": HOME_MOUNT},
            {"name": "tmp", "mountPath": TMP_MOUNT},
            {"name": "results", "mountPath": RESULTS_MOUNT},
        ],
    }
    if request.env_secret:
        container["envFrom"] = [{"secretRef": {"name": request.env_secret}}]
    pod: dict[str, Any] = {
        # A failed shard is a new pod, counted per index (backoffLimitPerIndex and
        # podFailurePolicy require Never).
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(POD_UID),
        "containers": [container],
        "volumes": [
            {"name": "sweep-file", "configMap": {"name": config_map}},
            {"name": "home", "emptyDir": {"sizeLimit": HOME_SIZE}},
            {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
            {"name": "results", "persistentVolumeClaim": {"claimName": request.results_claim}},
        ],
    }
    if request.runtime_class:
        pod["runtimeClassName"] = request.runtime_class
    return pod
