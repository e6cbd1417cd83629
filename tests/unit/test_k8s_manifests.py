"""A session's Kubernetes objects (orchestrator/sandbox/k8s_manifests.py) and the
``[kubernetes]`` settings: every Pod, Secret and NetworkPolicy the builders make is valid for
the newest Kubernetes minors (strictly: no unknown field), and each pod has the security
properties of docs/kubernetes.md. No cluster is needed (none exists here)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from orchestrator.errors import ConfigError, SandboxStartError
from orchestrator.runtime.wire import (
    ENV_NATS_JWT,
    ENV_NATS_NKEY_SEED,
    ENV_NATS_PASSWORD,
    ENV_NATS_URL,
    ENV_NATS_USER,
    ENV_SESSION_ID,
)
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.confined import CONTAINER_NATS_PORT
from orchestrator.sandbox.gateway_main import _parse_args
from orchestrator.sandbox.images import IMAGE_TAGS
from orchestrator.sandbox.k8s_manifests import (
    APP_LABEL,
    GPU_RESOURCE,
    LABEL_DAEMON,
    LABEL_HOST,
    LABEL_INSTANCE,
    LABEL_PID,
    LABEL_ROOT,
    LABEL_SESSION,
    NATS_APP,
    ORCHESTRATOR_APP,
    SECRET_DIR,
    RunProcess,
    SessionPod,
    files_roots,
    label_value,
    owner_reference,
    pod_name,
    secret_files,
    session_network_policy,
    session_objects,
    session_pod,
    session_secret,
)
from orchestrator.session_specs import StoredMount, StoredSandboxPolicy
from orchestrator.settings import KubernetesSettings, Settings, load_settings
from tests.k8s_checks import NEWEST_MINORS, assert_session_pod, validate_everywhere

SESSION = "s-0123456789ab"
ROOT = "s-zzzzzzzzzzzz"
INSTANCE = "0f1e2d3c4b5a6978"
TOKEN = "gateway-token-value"
JWT_ENV = {
    ENV_NATS_URL: "nats://nats:4222",
    ENV_NATS_JWT: "eyJ0eXAiOiJKV1QifQ.e30.sig",
    ENV_NATS_NKEY_SEED: "SUAEXAMPLESEED",
    ENV_SESSION_ID: SESSION,
}
PASSWORD_ENV = {
    ENV_NATS_URL: "nats://nats:4222",
    ENV_NATS_USER: SESSION,
    ENV_NATS_PASSWORD: "password-value",
}
GIB = 1024**3
DNS_LABEL_MAX = 63


def policy(**changes: Any) -> StoredSandboxPolicy:
    fields: dict[str, Any] = {
        "backend": "kubernetes",
        "image": "session",
        "workspace": "rw",
        "network": False,
        "memory_bytes": 2 * GIB,
        "cpus": 1.5,
        "pids": 256,
    }
    return StoredSandboxPolicy.model_validate({**fields, **changes})


def request(
    sandbox_policy: StoredSandboxPolicy | None = None, env: dict[str, str] | None = None
) -> SessionPod:
    spec = SandboxSpec(
        session_id=SESSION,
        cwd=Path("/work/project"),
        artifacts_dir=Path("/tmp/artifacts"),
        env=JWT_ENV if env is None else env,
        labels={"root": ROOT},
    )
    return SessionPod(
        spec=spec,
        policy=sandbox_policy or policy(),
        instance=INSTANCE,
        token=TOKEN,
        name=pod_name(SESSION, "a1b2c3"),
    )


# Every combination that changes what the builders write.
CASES: dict[str, tuple[SessionPod, KubernetesSettings]] = {
    "defaults": (request(), KubernetesSettings()),
    "network, password auth": (
        request(policy(network=True), PASSWORD_ENV),
        KubernetesSettings(),
    ),
    "read-only workspace, gVisor": (
        request(policy(workspace="ro")),
        KubernetesSettings(runtime_class="gvisor"),
    ),
    "cuda with GPUs from a registry": (
        request(policy(image="cuda", cpus=4.0, memory_bytes=16 * GIB)),
        KubernetesSettings(gpus=2, image_registry="registry.example:5000/", namespace="agents"),
    ),
    "rust, a tiny cpu share": (
        request(policy(image="rust", cpus=0.0001)),
        KubernetesSettings(image_pull_policy="Never", gateway_port=9000),
    ),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[SessionPod, KubernetesSettings]:
    return CASES[request.param]


def test_three_newest_minors_are_checked() -> None:
    assert len(NEWEST_MINORS) == 3
    assert NEWEST_MINORS[-1] == max(NEWEST_MINORS, key=lambda v: tuple(map(int, v.split("."))))


def test_every_object_is_valid_for_the_newest_minors(
    case: tuple[SessionPod, KubernetesSettings],
) -> None:
    pod_request, settings = case
    objects = session_objects(pod_request, settings)
    assert [o["kind"] for o in objects] == ["Secret", "NetworkPolicy", "Pod"]
    for obj in objects:
        validate_everywhere(obj)
        assert obj["metadata"]["namespace"] == settings.namespace
        assert obj["metadata"]["name"] == pod_request.name


def test_the_validation_is_strict() -> None:
    """An unknown field fails it (a typo in a builder would otherwise pass unnoticed)."""
    pod = session_pod(*CASES["defaults"])
    pod["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_everywhere(pod)


def test_every_pod_is_hardened(case: tuple[SessionPod, KubernetesSettings]) -> None:
    pod = session_pod(*case)
    assert_session_pod(pod["spec"], "session pod")


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return mutate


# Each security property, removed one at a time: the checks must notice every one.
WEAKENED: dict[str, Callable[[dict[str, Any]], None]] = {
    "runAsNonRoot": _drop("securityContext.runAsNonRoot"),
    "seccomp": _drop("securityContext.seccompProfile"),
    "token automount": _drop("automountServiceAccountToken"),
    "service links": _drop("enableServiceLinks"),
    "privilege escalation": _drop("containers.0.securityContext.allowPrivilegeEscalation"),
    "capabilities": _drop("containers.0.securityContext.capabilities"),
    "read-only root": _drop("containers.0.securityContext.readOnlyRootFilesystem"),
    "limits": _drop("containers.0.resources.limits"),
    "restart in place": _drop("restartPolicy"),
    "/tmp size": _drop("volumes.0.emptyDir.sizeLimit"),
    "home size": _drop("volumes.1.emptyDir.sizeLimit"),
    "secret read-only": _drop("containers.0.volumeMounts.3.readOnly"),
}


@pytest.mark.parametrize("what", sorted(WEAKENED))
def test_a_weakened_pod_fails_the_checks(what: str) -> None:
    spec = copy.deepcopy(session_pod(*CASES["defaults"])["spec"])
    WEAKENED[what](spec)
    with pytest.raises(AssertionError):
        assert_session_pod(spec, what)


def test_the_pod_runs_the_gateway_on_its_port_with_the_secret_token() -> None:
    pod_request, settings = CASES["rust, a tiny cpu share"]
    pod = session_pod(pod_request, settings)
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[1:4] == ["-P", "-m", "orchestrator.sandbox.gateway_main"]
    args = _parse_args(command[4:])  # the gateway's own parser accepts it
    assert args.ip == "0.0.0.0"
    assert args.port == settings.gateway_port == container["ports"][0]["containerPort"]
    assert args.unix_socket is None and args.relay == []  # no bound socket, no NATS relay
    assert str(args.token_file.parent) == SECRET_DIR
    assert args.token_file.name in secret_files(pod_request)
    # The kernel env the host sends at kernel start passes the gateway's whitelist.
    assert set(args.env_allow) == set(JWT_ENV)
    assert container["workingDir"] == str(pod_request.spec.cwd)
    # The files endpoint serves exactly the pod's writable volumes (gateway_files.py).
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert args.files_root == files_roots(pod_request.spec)
    assert str(pod_request.spec.cwd) in args.files_root and SECRET_DIR not in args.files_root
    assert all("emptyDir" in volumes[mounted[root]] for root in args.files_root)
    assert container["image"] == IMAGE_TAGS["rust"]
    assert container["imagePullPolicy"] == "Never"


def test_requests_and_limits_come_from_the_policy() -> None:
    pod_request, settings = CASES["cuda with GPUs from a registry"]
    pod = session_pod(pod_request, settings)
    (container,) = pod["spec"]["containers"]
    resources = container["resources"]
    assert resources["limits"]["cpu"] == resources["requests"]["cpu"] == "4000m"
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == str(16 * GIB)
    assert resources["limits"][GPU_RESOURCE] == "2"
    assert GPU_RESOURCE not in resources["requests"]
    assert container["image"] == "registry.example:5000/" + IMAGE_TAGS["cuda"]
    assert pod["spec"]["tolerations"][0]["key"] == GPU_RESOURCE
    tiny = session_pod(*CASES["rust, a tiny cpu share"])
    assert tiny["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1m"


def test_no_gpu_and_no_runtime_class_unless_asked() -> None:
    pod = session_pod(*CASES["defaults"])
    assert "runtimeClassName" not in pod["spec"] and "tolerations" not in pod["spec"]
    assert GPU_RESOURCE not in pod["spec"]["containers"][0]["resources"]["limits"]
    gvisor = session_pod(*CASES["read-only workspace, gVisor"])
    assert gvisor["spec"]["runtimeClassName"] == "gvisor"


def test_the_workspace_is_writable_in_every_mode() -> None:
    def workspace_mount(pod_request: SessionPod, settings: KubernetesSettings) -> Any:
        (container,) = session_pod(pod_request, settings)["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/work/project"]
        return mount["readOnly"]

    # Writable in every mode: the project is copied in through the gateway; an ro workspace's
    # changes are never copied back (docs/kubernetes.md, "Files between host and pod").
    assert workspace_mount(*CASES["defaults"]) is False
    assert workspace_mount(*CASES["read-only workspace, gVisor"]) is False


def test_ownership_labels_name_instance_session_and_root() -> None:
    pod_request, settings = CASES["defaults"]
    for obj in session_objects(pod_request, settings):
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_INSTANCE] == INSTANCE
        assert labels[LABEL_SESSION] == SESSION
        assert labels[LABEL_ROOT] == ROOT
        assert labels[LABEL_DAEMON] == "false"  # the spec's sandbox dies with its process
    daemons = replace(pod_request, spec=replace(pod_request.spec, die_with_parent=False))
    for obj in session_objects(daemons, settings):
        assert obj["metadata"]["labels"][LABEL_DAEMON] == "true"


def test_the_created_pod_is_named_as_owner_of_its_secret_and_policy() -> None:
    pod_request, settings = CASES["defaults"]
    secret, network_policy, pod = session_objects(pod_request, settings)
    assert owner_reference(pod) is None  # as built: only the API server gives a uid
    created = copy.deepcopy(pod)
    created["metadata"]["uid"] = "8f6ae0c2-4f8e-4e0b-9c49-2d1f6a7b3c10"
    owner = owner_reference(created)
    assert owner == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod_request.name,
        "uid": "8f6ae0c2-4f8e-4e0b-9c49-2d1f6a7b3c10",
    }
    for obj in (secret, network_policy):  # what the patch makes of them is valid everywhere
        owned = copy.deepcopy(obj)
        owned["metadata"]["ownerReferences"] = [owner]
        validate_everywhere(owned)


def test_pod_names_are_unique_per_start() -> None:
    first, second = pod_name(SESSION), pod_name(SESSION)
    assert first != second and first.startswith(f"prime-agent-{SESSION}-")
    assert len(first) <= DNS_LABEL_MAX


@pytest.mark.parametrize("session_id", ["S-UPPER", "pol_underscore", "x" * 41, "-dash", ""])
def test_a_session_id_that_cannot_name_a_pod_is_one_line(session_id: str) -> None:
    with pytest.raises(SandboxStartError) as caught:
        pod_name(session_id)
    assert "\n" not in str(caught.value) and "lower-case" in str(caught.value)


def test_the_secret_holds_the_token_and_the_nats_credentials_as_files() -> None:
    jwt_request, settings = CASES["defaults"]
    secret = session_secret(jwt_request, settings)
    assert secret["immutable"] is True
    assert secret["stringData"] == {
        "gateway-token": TOKEN,
        "nats-jwt": JWT_ENV[ENV_NATS_JWT],
        "nats-seed": JWT_ENV[ENV_NATS_NKEY_SEED],
    }
    password_request, _ = CASES["network, password auth"]
    assert session_secret(password_request, settings)["stringData"] == {
        "gateway-token": TOKEN,
        "nats-user": SESSION,
        "nats-password": PASSWORD_ENV[ENV_NATS_PASSWORD],
    }
    pod = session_pod(jwt_request, settings)
    (volume,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["defaultMode"] & 0o007 == 0  # nothing for others


def test_the_network_policy_allows_the_orchestrator_in_and_nats_out() -> None:
    pod_request, settings = CASES["defaults"]
    policy_object = session_network_policy(pod_request, settings)
    spec = policy_object["spec"]
    pod_labels = session_pod(pod_request, settings)["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert ingress["from"] == [{"podSelector": {"matchLabels": {APP_LABEL: ORCHESTRATOR_APP}}}]
    assert ingress["ports"] == [{"protocol": "TCP", "port": settings.gateway_port}]
    nats, dns = spec["egress"]
    assert nats["to"] == [{"podSelector": {"matchLabels": {APP_LABEL: NATS_APP}}}]
    assert nats["ports"] == [{"protocol": "TCP", "port": CONTAINER_NATS_PORT}]
    assert {port["port"] for port in dns["ports"]} == {53}
    assert all(rule.get("to") for rule in spec["egress"])  # no open rule without network


def test_network_opens_egress_only_for_a_session_that_has_it() -> None:
    pod_request, settings = CASES["network, password auth"]
    egress = session_network_policy(pod_request, settings)["spec"]["egress"]
    assert egress[-1] == {}
    assert sum(1 for rule in egress if not rule) == 1


def test_host_mounts_are_refused_in_one_line() -> None:
    mount = StoredMount(source="/srv/data", target="/data", read_only=True)
    with pytest.raises(SandboxStartError) as caught:
        session_pod(request(policy(mounts=(mount,))), KubernetesSettings())
    assert "\n" not in str(caught.value) and "docker or bwrap" in str(caught.value)


def test_kubernetes_settings_read_from_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "[kubernetes]\n"
        'context = "prod"\n'
        'namespace = "agents"\n'
        'image_registry = "registry.example:5000/"\n'
        'runtime_class = "gvisor"\n'
        "gpus = 1\n"
        "pool_size = 4\n"
    )
    settings = load_settings(path).kubernetes
    assert (settings.context, settings.namespace, settings.runtime_class) == (
        "prod",
        "agents",
        "gvisor",
    )
    assert (settings.gpus, settings.pool_size, settings.image_registry) == (
        1,
        4,
        "registry.example:5000/",
    )
    assert Settings().kubernetes == KubernetesSettings()


@pytest.mark.parametrize(
    ("line", "where"),
    [
        ('namespace = "Prime_Agent"', "kubernetes.namespace"),
        ('runtime_class = "g visor"', "kubernetes.runtime_class"),
        ('image_registry = "registry.example"', "kubernetes.image_registry"),
        ("gateway_port = 70000", "kubernetes.gateway_port"),
        ("pool_size = -1", "kubernetes.pool_size"),
        ("tmp_mib = 0", "kubernetes.tmp_mib"),
        ('runtime = "gvisor"', "kubernetes.runtime"),
    ],
)
def test_bad_kubernetes_settings_are_one_line(tmp_path: Path, line: str, where: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[kubernetes]\n{line}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert where in message and "\n" not in message


def test_a_print_runs_pod_names_its_run_and_a_daemons_pod_does_not() -> None:
    run = RunProcess("build-host-7", 4242)
    daemon_pod = replace(request(), spec=replace(request().spec, die_with_parent=False), run=run)
    labels = session_pod(daemon_pod, KubernetesSettings())["metadata"]["labels"]
    assert LABEL_HOST not in labels and LABEL_PID not in labels and labels[LABEL_DAEMON] == "true"
    print_pod = replace(request(), spec=replace(request().spec, die_with_parent=True), run=run)
    labels = session_pod(print_pod, KubernetesSettings())["metadata"]["labels"]
    assert (labels[LABEL_HOST], labels[LABEL_PID], labels[LABEL_DAEMON]) == (
        "build-host-7",
        "4242",
        "false",
    )
    validate_everywhere(session_pod(print_pod, KubernetesSettings()))


def test_a_host_name_becomes_a_label_value() -> None:
    assert label_value("Build_Host.Example.COM") == "build-host.example.com"
    assert label_value("-" * 10) == "unknown"
    long = label_value("a" * 100 + ".b")
    assert len(long) == 63 and long == "a" * 63
    assert RunProcess.this().pid == os.getpid()
