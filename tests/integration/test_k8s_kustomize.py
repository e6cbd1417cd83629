"""k8s/ as ``kubectl kustomize`` renders it (real kubectl; no cluster): the base and every
overlay render, every object is valid for the newest Kubernetes minors, every pod is hardened,
the orchestrator's rights stop at its namespace, and the manifests agree with the pods the
orchestrator builds (orchestrator/sandbox/k8s_manifests.py) and with its config.toml."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from orchestrator.bus.operator import AUTH_CONFIG_FILE, OperatorSetup
from orchestrator.bus.process import find_nats_server_binary
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.confined import CONTAINER_NATS_PORT
from orchestrator.sandbox.k8s_manifests import (
    APP_LABEL,
    GPU_RESOURCE,
    NATS_APP,
    ORCHESTRATOR_APP,
    SESSION_APP,
    SessionPod,
    pod_image,
    pod_name,
    session_pod,
)
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.sessions.sandbox_policy import apply_policy
from orchestrator.settings import Settings, load_settings
from tests.helpers import need
from tests.k8s_checks import assert_hardened, assert_session_pod, validate_everywhere

K8S_DIR: Final = Path(__file__).resolve().parents[2] / "k8s"
BASE: Final = "base"
OVERLAYS: Final = ("overlays/gvisor", "overlays/gpu")
RENDERED: Final = (BASE, *OVERLAYS)
KUSTOMIZE_TIMEOUT_S: Final = 60.0
NATS_REPLICAS: Final = 3
# What the orchestrator's Role grants, and nothing else.
ROLE_RESOURCES: Final = {
    "pods",
    "pods/portforward",
    "pods/log",
    "secrets",
    "networkpolicies",
    "events",
}
WORKLOADS: Final = ("Deployment", "StatefulSet")
CLUSTER_RBAC: Final = ("ClusterRole", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        need("kubectl", "k8s/ is rendered with `kubectl kustomize` (make install adds it as root)")
    return found


_renders: dict[str, list[dict[str, Any]]] = {}


def render(kubectl: str, where: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize k8s/WHERE`` prints (cached per directory)."""
    if where not in _renders:
        done = subprocess.run(
            [kubectl, "kustomize", str(K8S_DIR / where)],
            capture_output=True,
            text=True,
            timeout=KUSTOMIZE_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        _renders[where] = [obj for obj in yaml.safe_load_all(done.stdout) if obj]
    return _renders[where]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def config_of(objects: list[dict[str, Any]], tmp_path: Path) -> Settings:
    """The orchestrator's config.toml from the rendered ConfigMap, read as the daemon reads it."""
    config = one(objects, "ConfigMap", "prime-agent-config")
    path = tmp_path / "config.toml"
    path.write_text(config["data"]["config.toml"])
    return load_settings(path)


@pytest.mark.parametrize("where", RENDERED)
def test_every_rendered_object_is_valid(kubectl: str, where: str) -> None:
    objects = render(kubectl, where)
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "Deployment", "StatefulSet", "PodTemplate", "NetworkPolicy"} <= kinds
    for obj in objects:
        validate_everywhere(obj)


@pytest.mark.parametrize("where", RENDERED)
def test_every_pod_is_hardened(kubectl: str, where: str) -> None:
    objects = render(kubectl, where)
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            assert_hardened(obj["spec"]["template"]["spec"], f"{where}: {obj['metadata']['name']}")
    template = one(objects, "PodTemplate")
    assert_session_pod(template["template"]["spec"], f"{where}: session pod template")


@pytest.mark.parametrize("where", RENDERED)
def test_the_orchestrator_may_act_only_in_its_namespace(kubectl: str, where: str) -> None:
    objects = render(kubectl, where)
    assert not [o for o in objects if o["kind"] in CLUSTER_RBAC]
    namespace = one(objects, "Namespace")["metadata"]["name"]
    role = one(objects, "Role")
    granted = {resource for rule in role["rules"] for resource in rule["resources"]}
    assert granted == ROLE_RESOURCES
    # From metrics.k8s.io, a pod's metrics may be read and nothing else.
    metrics = [rule for rule in role["rules"] if "metrics.k8s.io" in rule["apiGroups"]]
    assert metrics == [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get"]}]
    assert all("*" not in rule["verbs"] for rule in role["rules"])
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    deployment = one(objects, "Deployment")
    (subject,) = binding["subjects"]
    assert subject["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert subject["namespace"] == namespace
    namespaced = [o for o in objects if o["kind"] not in ("Namespace", "RuntimeClass")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {namespace}


def test_the_namespace_denies_by_default(kubectl: str) -> None:
    objects = render(kubectl, BASE)
    deny = one(objects, "NetworkPolicy", "default-deny")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    labels = one(objects, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_labels_the_session_policies_select_are_worn(kubectl: str) -> None:
    """A session pod's NetworkPolicy lets in the orchestrator's pods and out to NATS's pods by
    their app label: the Deployment and the StatefulSet must give their pods exactly those."""
    objects = render(kubectl, BASE)
    deployment = one(objects, "Deployment")
    nats = one(objects, "StatefulSet")
    assert deployment["spec"]["template"]["metadata"]["labels"][APP_LABEL] == ORCHESTRATOR_APP
    assert nats["spec"]["template"]["metadata"]["labels"][APP_LABEL] == NATS_APP
    template = one(objects, "PodTemplate")
    assert template["template"]["metadata"]["labels"][APP_LABEL] == SESSION_APP
    service = one(objects, "Service", "nats")
    assert service["spec"]["ports"][0]["port"] == CONTAINER_NATS_PORT
    nats_policy = one(objects, "NetworkPolicy", "nats")
    sources = [
        peer["podSelector"]["matchLabels"][APP_LABEL]
        for peer in nats_policy["spec"]["ingress"][0]["from"]
    ]
    assert sorted(sources) == sorted([ORCHESTRATOR_APP, SESSION_APP])


def test_nats_is_a_jetstream_cluster_in_operator_mode(kubectl: str) -> None:
    objects = render(kubectl, BASE)
    nats = one(objects, "StatefulSet")
    assert nats["spec"]["replicas"] == NATS_REPLICAS
    config = one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    assert "jetstream" in config and "cluster" in config
    assert config.count("nats://nats-") == NATS_REPLICAS
    assert "include ./auth/auth.conf" in config  # operator, system account, resolver preload
    volumes = {v["name"]: v for v in nats["spec"]["template"]["spec"]["volumes"]}
    assert volumes["auth"]["secret"]["secretName"] == "nats-auth"
    assert nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_the_nats_server_accepts_its_config(kubectl: str, tmp_path: Path) -> None:
    """The rendered nats.conf, with the auth part `operator init` writes at the path the
    Secret nats-auth is mounted, passes the real nats-server's own check (``-t``: unknown
    fields, bad JWTs and a missing include all fail it)."""
    objects = render(kubectl, BASE)
    nats = one(objects, "StatefulSet")
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    assert mounts["config"] == str(config_path)
    auth_dir = tmp_path / Path(mounts["auth"]).relative_to(config_path.parent)
    auth_dir.mkdir(parents=True)
    setup_dir = tmp_path / "operator"
    OperatorSetup.generate().write(setup_dir)
    (auth_dir / "auth.conf").write_bytes((setup_dir / AUTH_CONFIG_FILE).read_bytes())
    config = tmp_path / config_path.name
    config.write_text(one(objects, "ConfigMap", "nats-config")["data"]["nats.conf"])
    checked = subprocess.run(
        [find_nats_server_binary(), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=KUSTOMIZE_TIMEOUT_S,
        env={"SERVER_NAME": "nats-0"},  # what the pod's env gives it
        cwd=tmp_path,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert "is valid" in checked.stdout + checked.stderr


def test_the_orchestrator_keeps_its_store_on_a_volume_and_never_runs_twice(
    kubectl: str, tmp_path: Path
) -> None:
    objects = render(kubectl, BASE)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    assert volumes["store"]["persistentVolumeClaim"]["claimName"] == claim
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["XDG_DATA_HOME"] == mounts["store"]
    settings = config_of(objects, tmp_path)
    seed = settings.nats.account_signing_seed_file
    assert seed is not None and str(seed.parent) == mounts["nats-seed"]


@pytest.mark.parametrize("where", RENDERED)
def test_the_template_is_what_the_orchestrator_builds(
    kubectl: str, where: str, tmp_path: Path
) -> None:
    """The session pod template of each overlay and the pod the orchestrator builds with that
    overlay's config.toml agree: image, runtime class, GPUs, security, volumes."""
    objects = render(kubectl, where)
    settings = config_of(objects, tmp_path)
    assert settings.kubernetes.namespace == one(objects, "Namespace")["metadata"]["name"]
    template = one(objects, "PodTemplate")["template"]["spec"]
    sandbox = settings.sandbox
    policy = StoredSandboxPolicy(
        backend="kubernetes",
        image=sandbox.image,
        workspace=sandbox.workspace,
        memory_bytes=sandbox.memory_bytes,
        cpus=sandbox.cpus,
        pids=sandbox.pids_limit,
    )
    spec = apply_policy(
        SandboxSpec(session_id="s-0123456789ab", cwd=Path("/workspace"), artifacts_dir=tmp_path),
        policy,
    )
    name = pod_name(spec.session_id)
    built = session_pod(SessionPod(spec, policy, "instance", "token", name), settings.kubernetes)
    pod = built["spec"]
    for field in (
        "securityContext",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "restartPolicy",
        "runtimeClassName",
        "tolerations",
        "hostname",
    ):
        assert template.get(field) == pod.get(field), field
    (want,), (have,) = template["containers"], pod["containers"]
    assert want["image"] == have["image"] == pod_image(policy, settings.kubernetes)
    assert want["securityContext"] == have["securityContext"]
    assert want["command"] == have["command"][: len(want["command"])]
    assert want["volumeMounts"] == have["volumeMounts"]
    assert want["resources"]["limits"].get(GPU_RESOURCE) == have["resources"]["limits"].get(
        GPU_RESOURCE
    )

    def without_secret_name(volumes: list[Mapping[str, Any]]) -> list[Any]:
        return [
            {**v, "secret": {**v["secret"], "secretName": ""}} if "secret" in v else v
            for v in volumes
        ]

    assert without_secret_name(template["volumes"]) == without_secret_name(pod["volumes"])
