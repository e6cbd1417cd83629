"""``sweep submit`` (sweeps/k8s_job.py, cli/sweep_submit.py): the Indexed Job and ConfigMap are
valid for the three newest Kubernetes minors (kubernetes-validate's offline schemas, strict), the
pod is hardened, each index runs its own shard; with no cluster configured, submitting is one
line. No cluster is reachable here: a real submission is not tested."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from orchestrator.cli.common import EXIT_BUDGET_SPENT, EXIT_USAGE
from orchestrator.errors import UserError
from orchestrator.sweeps.k8s_job import (
    DEFAULT_RESULTS_CLAIM,
    INDEX_ANNOTATION,
    RESULTS_MOUNT,
    SWEEP_FILE_KEY,
    SWEEP_FILE_MOUNT,
    JobRequest,
    sweep_manifests,
)
from orchestrator.sweeps.spec import load_sweep
from tests.helpers import cli

# The three newest minors whose schemas kubernetes-validate ships.
MINORS = ("1.35.0", "1.36.0", "1.37.0")
SWEEP = """name: niah_Small.v2
suites: [{suite: s-niah, tasks: 3, context_tokens: [600]}]
models: [openai/gpt-4o-mini]
"""


def _file(tmp_path: Path, text: str = SWEEP) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def _manifests(tmp_path: Path, **given: Any) -> list[dict[str, Any]]:
    path = _file(tmp_path)
    request = JobRequest(spec=load_sweep(path), sweep_text=path.read_text(), **given)
    return sweep_manifests(request)


@pytest.mark.parametrize("minor", MINORS)
def test_the_manifests_are_valid_kubernetes(tmp_path: Path, minor: str) -> None:
    for manifest in _manifests(
        tmp_path, shards=4, namespace="bench", env_secret="keys", runtime_class="gvisor"
    ):
        kubernetes_validate.validate(manifest, minor, strict=True)


def test_an_invalid_manifest_is_caught_by_the_validator(tmp_path: Path) -> None:
    # The check above can fail: a field the API does not have is refused.
    _, job = _manifests(tmp_path, shards=2)
    job["spec"]["completionsMode"] = "Indexed"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, MINORS[-1], strict=True)


def test_each_index_runs_its_shard_with_its_own_store(tmp_path: Path) -> None:
    config_map, job = _manifests(tmp_path, shards=5, parallelism=2, retries_per_shard=3)
    assert config_map["data"] == {SWEEP_FILE_KEY: SWEEP}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert (spec["completions"], spec["parallelism"], spec["backoffLimitPerIndex"]) == (5, 2, 3)
    assert job["metadata"]["name"] == "sweep-niah-small-v2"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["prime-agent"]
    assert container["args"] == [
        "sweep",
        "run",
        f"{SWEEP_FILE_MOUNT}/{SWEEP_FILE_KEY}",
        "--shard",
        "$(SHARD_INDEX)/5",
        "--export-dir",
        f"{RESULTS_MOUNT}/niah_Small.v2",
    ]
    env = {e["name"]: e for e in container["env"]}
    index = env["SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == f"metadata.annotations['{INDEX_ANNOTATION}']"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    # The store (XDG data home) and the runtime dir are on the pod's own emptyDir.
    for var in ("XDG_DATA_HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "HOME"):
        home = next(p for p in mounts if env[var]["value"].startswith(p) and p != "/")
        assert "emptyDir" in volumes[mounts[home]], var
    assert volumes[mounts[RESULTS_MOUNT]]["persistentVolumeClaim"] == {
        "claimName": DEFAULT_RESULTS_CLAIM
    }
    assert volumes[mounts[SWEEP_FILE_MOUNT]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert pod["restartPolicy"] == "Never"  # what backoffLimitPerIndex requires
    # Evictions are not failures; a failure no retry can mend fails its index at once.
    ignore, fail_index = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert fail_index["action"] == "FailIndex"
    assert fail_index["onExitCodes"]["containerName"] == container["name"]
    assert fail_index["onExitCodes"]["values"] == [EXIT_USAGE, EXIT_BUDGET_SPENT]


def test_the_pod_is_hardened(tmp_path: Path) -> None:
    _, job = _manifests(tmp_path, shards=2)
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["runAsNonRoot"] is True
    # Every writable place is a size-limited emptyDir or the results claim.
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            assert volume["emptyDir"]["sizeLimit"]
        else:
            assert "persistentVolumeClaim" in volume or mount.get("readOnly") is True
    assert "runtimeClassName" not in pod
    assert "envFrom" not in container


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"shards": 0}, "--shards 0: use 1.."),
        ({"shards": 2, "parallelism": 3}, "--parallelism 3: use 1..2"),
        ({"shards": 2, "retries_per_shard": -1}, "--retries -1"),
    ],
)
def test_a_request_that_makes_no_job_is_one_line(
    tmp_path: Path, given: dict[str, Any], said: str
) -> None:
    with pytest.raises(UserError) as raised:
        _manifests(tmp_path, **given)
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


def test_a_suite_read_from_this_machine_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    path = _file(
        tmp_path,
        "name: h\nsuites: [{suite: harbor, path: ./tasks}]\nmodels: [openai/gpt-4o-mini]\n",
    )
    with pytest.raises(UserError, match="a Job ships only the sweep file"):
        sweep_manifests(JobRequest(spec=load_sweep(path), sweep_text="", shards=2))


def test_dry_run_prints_the_manifests(tmp_path: Path) -> None:
    path = _file(tmp_path)
    shown = cli(["sweep", "submit", str(path), "--shards", "3", "--dry-run", "--pvc", "res"])
    assert shown.returncode == 0, shown.stderr
    config_map, job = yaml.safe_load_all(shown.stdout)
    assert config_map["data"][SWEEP_FILE_KEY] == SWEEP  # the file's own bytes
    assert job["spec"]["completions"] == 3
    claims = [v for v in job["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims[0]["persistentVolumeClaim"]["claimName"] == "res"
    for manifest in (config_map, job):
        kubernetes_validate.validate(manifest, MINORS[-1], strict=True)


def test_without_a_kubeconfig_submit_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not os.path.exists(tmp_path / ".kube")
    sent = cli(["sweep", "submit", str(path), "--shards", "2"])
    assert sent.returncode == 2, sent.stderr
    (line,) = sent.stderr.splitlines()
    assert line.startswith("prime-agent: error: no Kubernetes cluster to submit to")
    assert "--dry-run" in line
