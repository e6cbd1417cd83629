"""``--backend kubernetes`` as a user runs it (``orchestrator/sandbox/choice.py``): real
``prime-agent`` processes and the scripted model over HTTP; the cluster is kmock's emulator
served over real HTTP from a thread of this test, reached through the kubeconfig this test
writes, its pods run on the local Docker Engine by a test node (tests/k8s_emulator.py).

- print mode with ``--backend kubernetes`` runs the session's cells in a pod (the pod's
  Secret is mounted where the cell looks), records the session's backend as ``kubernetes``,
  and deletes the pod, its Secret and its NetworkPolicy when the run ends;
- a cluster that does not answer: ``--backend kubernetes`` (and ``PRIME_AGENT_BACKEND``, and
  ``import``) is refused in one line saying why and what to do, before the model is asked;
  ``auto`` never picks kubernetes;
- ``doctor`` says whether the cluster answers, and never counts it a problem.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.instance import instance_id
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.choice import KUBERNETES_FIX
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_manifests import (
    SECRET_DIR,
    RunProcess,
    SessionPod,
    pod_name,
    session_objects,
)
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.settings import KubernetesSettings
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, write_config
from tests.integration.test_sandbox_conformance import workspace
from tests.k8s_emulator import (
    NAMESPACE,
    EmulatedCluster,
    docker_for_pods,
    node_in_thread,
    serve_in_thread,
    write_kubeconfig,
)

CLI_TIMEOUT_S: Final = 180.0
KINDS: Final = ("pods", "secrets", "networkpolicies")
NOWHERE: Final = "http://127.0.0.1:1"  # nothing listens on port 1
POD_MEMORY_BYTES: Final = 512 * 1024 * 1024
POD_PIDS: Final = 256
SESSION_FILE: Final = Path(__file__).resolve().parents[1] / "fixtures" / "jsonl" / "v3_tree.jsonl"

SCRIPT: Final = f"""
repeat forever:
    when "where":
        code: import os; print("secrets", os.path.isdir({SECRET_DIR!r}))
    when "secrets True":
        text: in a pod
    when "secrets False":
        text: not in a pod
"""


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(SCRIPT) as srv:
        write_config(f'retry_base_delay_s = 0.01\n[models."openai/fake"]\napi_base = "{srv.url}"\n')
        yield srv


@pytest.fixture
def docker() -> Any:
    return docker_for_pods()


@pytest.fixture
def no_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubeconfig whose API server does not answer."""
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", NOWHERE)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def run(backend: str, model: FakeModelServer, tmp_path: Path) -> tuple[int, str, list[str]]:
    """``-p`` in a small project of its own: a pod's workspace is a copy of the project (this
    checkout would be gigabytes), and a docker sandbox's user must be able to use it."""
    cwd = workspace(tmp_path / "project")
    proc = cli(
        ["-p", "where", "--backend", backend, "--model", "openai/fake", "--api-base", model.url],
        timeout=CLI_TIMEOUT_S,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout, proc.stderr.splitlines()


def test_print_mode_runs_the_session_in_a_pod_and_deletes_it_at_the_end(
    docker: Any, model: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cluster: EmulatedCluster
    with serve_in_thread() as cluster, node_in_thread(cluster, docker) as node:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", cluster.url)))
        code, out, err = run("kubernetes", model, tmp_path)
        assert code == 0, err
        assert out == "in a pod\n"  # the cell ran where the pod's Secret is mounted
        assert node.seen.is_set()
        assert not any(cluster.names(kind) for kind in KINDS)  # the run deleted its objects
    listing = cli(["agents", "--json"], timeout=CLI_TIMEOUT_S)
    assert listing.returncode == 0, listing.stderr
    assert [row["backend"] for row in json.loads(listing.stdout)] == ["kubernetes"]


def test_a_cluster_that_does_not_answer_is_refused_in_one_line(
    no_cluster: None, model: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run("kubernetes", model, tmp_path)
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith(
        f"prime-agent: error: the kubernetes backend is not usable: the API server at {NOWHERE} "
        "did not answer"
    ), err
    assert err[0].endswith(KUBERNETES_FIX)
    monkeypatch.setenv("PRIME_AGENT_BACKEND", "kubernetes")  # --backend's variable
    proc = cli(["-p", "where", "--model", "openai/fake", "--api-base", model.url])
    assert proc.returncode == 2 and proc.stderr.splitlines() == err, proc.stderr
    imported = cli(["import", str(SESSION_FILE), "--backend", "kubernetes"])
    assert imported.returncode == 2, imported.stderr
    assert imported.stderr.splitlines() == err, imported.stderr
    assert model.requests == []  # refused before the first model call


def test_auto_never_picks_kubernetes(
    docker: Any, model: FakeModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with serve_in_thread() as cluster, node_in_thread(cluster, docker) as node:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", cluster.url)))
        code, out, err = run("auto", model, tmp_path)
        assert code == 0, err
        assert out == "not in a pod\n" and not node.seen.is_set()


def test_doctor_says_whether_the_cluster_answers_and_never_counts_it_a_problem(
    no_cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = cli(["doctor"], timeout=CLI_TIMEOUT_S)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("backend: kubernetes")]
    assert line.startswith(
        "backend: kubernetes not usable (only --backend kubernetes picks it): the API server at "
        f"{NOWHERE} did not answer"
    ), line
    unusable_code = proc.returncode
    with serve_in_thread() as cluster:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", cluster.url)))
        proc = cli(["doctor"], timeout=CLI_TIMEOUT_S)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("backend: kubernetes")]
    assert lines == [
        f"backend: kubernetes usable with --backend kubernetes only (namespace {NAMESPACE})"
    ], proc.stdout
    assert proc.returncode == unusable_code  # the same verdict either way


def _run_pod(cluster: EmulatedCluster, tmp_path: Path, session: str, run: RunProcess) -> str:
    """The objects of a print-mode run's pod, as that run (``run``) would have created them."""
    spec = SandboxSpec(session_id=session, cwd=tmp_path, artifacts_dir=tmp_path)
    policy = StoredSandboxPolicy(
        backend="kubernetes", image="session", workspace="rw", network=False,
        memory_bytes=POD_MEMORY_BYTES, cpus=1.0, pids=POD_PIDS,
    )  # fmt: skip
    name = pod_name(session)
    request = SessionPod(spec, policy, instance_id(), "a-token", name, run=run)
    objects = session_objects(request, KubernetesSettings(namespace=NAMESPACE))
    K8sApi(cluster.api_client(), NAMESPACE).create(objects)
    return name


def test_doctor_fix_removes_the_pods_of_print_runs_that_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A print-mode run killed with -9 leaves its pod (a cluster has no die-with-parent):
    doctor names it and --fix deletes its three objects; the pod of a run still alive and one
    of a run on another host stay."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    gone_pid = _reaped_pid()
    here = RunProcess.this().host
    with serve_in_thread() as cluster:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", cluster.url)))
        dead = _run_pod(cluster, tmp_path, "s-dead-run", RunProcess(here, gone_pid))
        alive = _run_pod(cluster, tmp_path, "s-live-run", RunProcess(here, os.getpid()))
        other = _run_pod(cluster, tmp_path, "s-far-run", RunProcess("another-host", gone_pid))
        found = cli(["doctor"], timeout=CLI_TIMEOUT_S)
        assert "kubernetes: 1 orphaned pod(s)" in found.stdout.splitlines(), found.stdout
        assert f"kubernetes:   {dead} session=s-dead-run (run pid {gone_pid} is gone)" in (
            found.stdout.splitlines()
        )
        assert cluster.names("pods") == {dead, alive, other}  # without --fix nothing goes
        fixed = cli(["doctor", "--fix"], timeout=CLI_TIMEOUT_S)
        assert "kubernetes: 1 orphaned pod(s) (fixed)" in fixed.stdout.splitlines(), fixed.stdout
        assert "kubernetes: removed 1" in fixed.stdout.splitlines()
        assert any(
            line.startswith("kubernetes: 1 pod(s) of print-mode runs on other hosts, kept")
            and line.endswith(other)
            for line in fixed.stdout.splitlines()
        ), fixed.stdout
        for kind in KINDS:
            assert cluster.names(kind) == {alive, other}, kind


def _reaped_pid() -> int:
    """The pid of a child that has exited and been reaped (nothing runs under it now)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
