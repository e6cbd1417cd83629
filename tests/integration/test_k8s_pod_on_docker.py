"""A session Pod as orchestrator/sandbox/k8s_manifests.py builds it, run by the test kubelet
(tests/k8s_docker_kubelet.py) on the local Docker Engine: its gateway answers on its port with
the token from its Secret, and a kernel inside finds what docs/kubernetes.md ("Security")
promises: the pod's non-root uid, no capabilities, no new privileges, a read-only root,
writable /tmp, home and workspace, the Secret's files readable and not writable."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.confined import KERNEL_BASE_ENV
from orchestrator.sandbox.docker_user import SANDBOX_UID
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.k8s_manifests import (
    SECRET_DIR,
    SessionPod,
    pod_name,
    session_pod,
    session_secret,
)
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.settings import KubernetesSettings
from tests.k8s_docker_kubelet import RunningPod, run_pod
from tests.k8s_emulator import docker_for_pods

pytestmark = pytest.mark.timeout(180)

SESSION: Final = "s-0123456789ab"
WORKSPACE: Final = Path("/workspace/project")
MIB: Final = 1024**2
POD_MEMORY: Final = 512 * MIB
READY_PREFIX: Final = b'{"port"'
CELL_TIMEOUT_S: Final = 60.0
# What the kernel reports about its own process and filesystem (one JSON object).
PROBE: Final = """
import json, os
def _writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w") as fh:
            fh.write("x")
        os.unlink(os.path.join(path, ".probe"))
        return True
    except OSError:
        return False
def _status(field):
    with open("/proc/self/status") as fh:
        return next(l.split()[1] for l in fh if l.startswith(field + ":"))
def _mount_options(path):
    with open("/proc/self/mountinfo") as fh:
        found = [l.split() for l in fh if l.split()[4] == path]
    return set(found[-1][5].split(","))  # the last mount at a path is the one seen
_token_path = os.path.join(SECRET_DIR, "gateway-token")
facts = json.dumps({
    "uid": os.getuid(),
    "cwd": os.getcwd(),
    "cap_eff": _status("CapEff"),
    "cap_bounding": _status("CapBnd"),  # what even a setuid binary could get back
    "no_new_privs": _status("NoNewPrivs"),
    "root_read_only": "ro" in _mount_options("/"),
    "secret_read_only": "ro" in _mount_options(SECRET_DIR),
    "etc_writable": _writable("/etc"),
    "tmp_writable": _writable("/tmp"),
    "home_writable": _writable(os.environ["HOME"]),
    "workspace_writable": _writable(os.getcwd()),
    "secret_dir_writable": _writable(SECRET_DIR),
    "token_readable": open(_token_path).read() == TOKEN,
    "token_writable": os.access(_token_path, os.W_OK),
})
"""


@pytest.fixture(scope="module")
def docker() -> Any:
    return docker_for_pods()


@pytest.fixture
def pod(docker: Any) -> Iterator[tuple[RunningPod, str]]:
    spec = SandboxSpec(session_id=SESSION, cwd=WORKSPACE, artifacts_dir=Path("/nonexistent"))
    policy = StoredSandboxPolicy(
        backend="kubernetes",
        image="session",
        workspace="rw",
        memory_bytes=POD_MEMORY,
        cpus=1.0,
        pids=256,
    )
    request = SessionPod(spec, policy, "instance", "the-pods-token", pod_name(SESSION))
    settings = KubernetesSettings()
    with run_pod(docker, session_pod(request, settings), session_secret(request, settings)) as p:
        for line in p.container.logs(stream=True, follow=True):
            if line.startswith(READY_PREFIX):  # the gateway listens (stdout is its log)
                break
        yield p, request.token


async def test_the_pod_serves_a_kernel_that_keeps_the_promises(
    pod: tuple[RunningPod, str],
) -> None:
    running, token = pod
    client = KernelGatewayClient(f"http://127.0.0.1:{running.ports['gateway']}", token)
    try:
        await client.start_kernel(env=KERNEL_BASE_ENV, path=str(WORKSPACE).lstrip("/"))
        await client.connect()
        await client.wait_ready()
        setup = f"SECRET_DIR = {SECRET_DIR!r}\nTOKEN = {token!r}\n"
        reply = await client.run_silent(
            setup + PROBE, user_expressions={"facts": "facts"}, timeout_s=CELL_TIMEOUT_S
        )
        found = reply["user_expressions"]["facts"]
        assert found["status"] == "ok", found
        facts = json.loads(ast.literal_eval(found["data"]["text/plain"]))  # repr of a str
    finally:
        await client.delete_kernel()
        await client.close()
    assert facts == {
        "uid": SANDBOX_UID,
        "cwd": str(WORKSPACE),
        "cap_eff": "0000000000000000",
        "cap_bounding": "0000000000000000",
        "no_new_privs": "1",
        "root_read_only": True,
        "secret_read_only": True,
        "etc_writable": False,
        "tmp_writable": True,
        "home_writable": True,
        "workspace_writable": True,
        "secret_dir_writable": False,
        "token_readable": True,
        "token_writable": False,
    }
