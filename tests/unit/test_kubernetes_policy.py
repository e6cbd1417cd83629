"""The kubernetes backend's policy for a session: the spec's choices over the backend's
defaults; a policy a pod cannot honour is refused before anything reaches the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest
from kubernetes import client as k8s

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox.base import ResourceLimits, SandboxSpec
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.kubernetes import KubernetesBackend
from orchestrator.sandbox.mounts import ExtraMount

NAMESPACE: Final = "prime-agent"
NOWHERE: Final = "http://127.0.0.1:1"  # never contacted: a call there would fail the test
MIB: Final = 1024**2


def backend() -> KubernetesBackend:
    api = K8sApi(k8s.ApiClient(k8s.Configuration(host=NOWHERE)), NAMESPACE)
    return KubernetesBackend(
        api, instance="i", image="session", memory_bytes=512 * MIB, cpus=1.0, pids_limit=256
    )


def test_the_specs_choices_win_over_the_defaults(tmp_path: Path) -> None:
    b = backend()
    plain = b.policy_for(SandboxSpec(session_id="s-a", cwd=tmp_path, artifacts_dir=tmp_path))
    assert (plain.image, plain.workspace, plain.network) == ("session", "rw", False)
    assert (plain.memory_bytes, plain.cpus, plain.pids) == (512 * MIB, 1.0, 256)
    chosen = b.policy_for(
        SandboxSpec(
            session_id="s-b",
            cwd=tmp_path,
            artifacts_dir=tmp_path,
            image="rust",
            workspace="ro",
            network=True,
            limits=ResourceLimits(memory_bytes=2048 * MIB, cpus=None, pids=64),
        )
    )
    assert (chosen.image, chosen.workspace, chosen.network) == ("rust", "ro", True)
    assert (chosen.memory_bytes, chosen.cpus, chosen.pids) == (2048 * MIB, 1.0, 64)
    assert chosen.backend == "kubernetes"


async def test_host_mounts_are_refused_before_any_api_call(tmp_path: Path) -> None:
    b = backend()
    spec = SandboxSpec(
        session_id="s-m",
        cwd=tmp_path,
        artifacts_dir=tmp_path,
        mounts=(ExtraMount(source=tmp_path, target="/data", read_only=True),),
    )
    with pytest.raises(SandboxStartError, match="extra mounts show host directories"):
        await b.create(spec)
    assert b.api.calls == {}
    await b.close()
