"""The orchestrator's image (``prime-agent/orchestrator:latest``, images/orchestrator/Dockerfile)
runs the daemon under the Deployment's own constraints, read from k8s/base/orchestrator.yaml:
its uid, a read-only root, no capabilities, no privilege escalation, and every writable place a
size-limited mount (the emptyDirs and the store's PVC become tmpfs here). One session goes
through that daemon to its answer.

What differs from the cluster, and why: the ConfigMap's config.toml names the cluster's NATS
StatefulSet and the kubernetes backend, neither of which exists here, so the container gets a
config.toml of the embedded NATS server and ``PRIME_AGENT_BACKEND=local`` (the session's REPL
runs as a process of the same container). The scripted model runs in the container too, so the
container needs no network but its loopback. Needs Docker (fails under CI=true without it); the
first run builds the image (several minutes: docs/images.md)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.helpers import need, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MANIFEST: Final = Path(__file__).resolve().parents[2] / "k8s" / "base" / "orchestrator.yaml"
CONTAINER: Final = "orchestrator"
CONFIG_MOUNT: Final = "config"
MODEL_PORT: Final = 18080
DOCKER_TIMEOUT_S: Final = 120.0
READY_TIMEOUT_S: Final = 120.0
RUN_TIMEOUT_S: Final = 300.0
ANSWER: Final = "the orchestrator image answers"
SCRIPT: Final = f"text: {ANSWER}\n"
# A PVC has no size in the pod; here it is a tmpfs of this size.
STORE_TMPFS: Final = "1g"


def _deployment() -> dict[str, Any]:
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc and doc.get("kind") == "Deployment":
            return dict(doc)
    raise AssertionError(f"no Deployment in {MANIFEST}")


def _docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["docker", *argv], capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(argv[:2])}: {proc.stderr.strip()[-800:]}")
    return proc


def _size(volume: dict[str, Any]) -> str:
    limit = str(volume.get("emptyDir", {}).get("sizeLimit") or STORE_TMPFS)
    return limit.replace("Gi", "g").replace("Mi", "m")


def run_argv(name: str, config_dir: Path) -> list[str]:
    """``docker run`` flags for the Deployment's orchestrator container."""
    spec = _deployment()["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == CONTAINER]
    pod_security, security = spec["securityContext"], container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    uid, gid = pod_security["runAsUser"], pod_security["runAsGroup"]
    argv = [
        "run", "-d", "--name", name, "--network", "none", "--read-only",
        "--user", f"{uid}:{gid}", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--memory", container["resources"]["limits"]["memory"].replace("Gi", "g"),
    ]  # fmt: skip
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if mount["name"] == CONFIG_MOUNT:
            argv += ["-v", f"{config_dir}:{mount['mountPath']}:ro"]
        elif "emptyDir" in volume or "persistentVolumeClaim" in volume:
            argv += ["--tmpfs", f"{mount['mountPath']}:size={_size(volume)},uid={uid},gid={gid}"]
        # secret and projected volumes (the NATS signing seed, the API token) are the
        # cluster's; nothing here uses them.
    for env in container["env"]:
        value = "local" if env["name"] == "PRIME_AGENT_BACKEND" else env["value"]
        argv += ["-e", f"{env['name']}={value}"]
    return [*argv, str(container["image"]), *container["command"]]


@pytest.fixture(scope="module")
def image() -> str:
    from orchestrator.errors import PrimeAgentError
    from orchestrator.sandbox.orchestrator_image import (
        ORCHESTRATOR_IMAGE,
        ensure_orchestrator_image,
    )

    try:
        ensure_orchestrator_image()
    except PrimeAgentError as exc:
        need("docker", f"the orchestrator image cannot be built: {exc}")
    return ORCHESTRATOR_IMAGE


@pytest.fixture
def container(image: str, tmp_path: Path) -> Iterator[str]:
    assert _deployment()["spec"]["template"]["spec"]["containers"][0]["image"] == image
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.toml").write_text(
        f'[models."openai/fake"]\napi_base = "http://127.0.0.1:{MODEL_PORT}/v1"\n'
    )
    config.chmod(0o755)
    (config / "config.toml").chmod(0o644)
    name = f"prime-agent-test-orchestrator-{uuid.uuid4().hex[:8]}"
    _docker(*run_argv(name, config))
    try:
        yield name
    finally:
        _docker("rm", "-f", name, check=False)


def _exec(
    name: str, *argv: str, timeout_s: float = DOCKER_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "exec", name, *argv], capture_output=True, text=True, timeout=timeout_s
    )


def _logs(name: str) -> str:
    return "the daemon did not start: " + _docker("logs", name, check=False).stderr[-2000:]


def test_the_image_runs_the_daemon_as_the_deployment_does(container: str) -> None:
    who = _exec(container, "id", "-u")
    assert who.stdout.strip() == "1000"
    refused = _exec(container, "touch", "/opt/prime-agent/written")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr

    def daemon_ready() -> bool:
        status = _exec(container, "prime-agent", "daemon", "status")
        return status.returncode == 0 and "running" in status.stdout

    assert wait_until(daemon_ready, timeout=READY_TIMEOUT_S), _logs(container)
    _exec(container, "sh", "-c", f"printf '%s' '{SCRIPT}' > /tmp/script.txt")
    _docker(
        "exec", "-d", container, "python", "-m", "orchestrator.testing.fake_model",
        "--script", "/tmp/script.txt", "--port", str(MODEL_PORT),
    )  # fmt: skip

    def model_up() -> bool:
        probe = _exec(
            container, "python", "-c",
            f"import socket; socket.create_connection(('127.0.0.1', {MODEL_PORT}), 1)",
        )  # fmt: skip
        return probe.returncode == 0

    assert wait_until(model_up, timeout=READY_TIMEOUT_S), "the scripted model did not start"
    run = _exec(
        container, "env", "OPENAI_API_KEY=sk-test", "prime-agent", "-p", "hi",
        "--model", "openai/fake", "--backend", "local",
        timeout_s=RUN_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert ANSWER in run.stdout
    # The session went through the container's daemon: its store is on the store's mount.
    listed = _exec(container, "prime-agent", "agents", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["backend"] for row in json.loads(listed.stdout)] == ["local"]
    stored = _exec(container, "sh", "-c", "ls /var/lib/prime-agent/prime-agent")
    assert any(name.endswith(".duckdb") for name in stored.stdout.split()), stored
