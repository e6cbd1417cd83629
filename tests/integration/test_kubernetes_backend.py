"""The kubernetes backend end to end, without a cluster: the official client over real HTTP to
kmock's in-memory API (tests/k8s_emulator.py), and a node that runs each created pod on the
local Docker Engine and writes its status and IP back (``DockerNode``). create -> Ready ->
cells that share a namespace -> stop (Pod, Secret, NetworkPolicy deleted, container gone); a
pod that cannot start (unschedulable, no image, evicted, not Ready in time) is a one-line
``SandboxStartError`` and a cancelled start leaves nothing; an OOM-killed pod is
``KernelDied``; a new backend object adopts a recorded pod and removes a daemon pod it has no
record of; the warm pool hands a ready pod over; ``from_settings`` finds the cluster through
a kubeconfig context; the workspace, a skill, a cell's output file and a snapshot cross between
host and pod through the gateway (``pod_sync.py``), to a pooled pod when it is handed over.
What this does NOT show: scheduling, probes, NetworkPolicy enforcement, label selectors on a
real API server (docs/kubernetes.md, "Tests")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError
from orchestrator.runtime.snapshot import read_manifest
from orchestrator.runtime.wire import (
    ENV_NATS_CREDENTIALS_DIR,
    ENV_NATS_PASSWORD,
    ENV_NATS_URL,
    ENV_NATS_USER,
    ENV_SESSION_ID,
)
from orchestrator.sandbox.base import ResourceLimits, SandboxRef, SandboxSpec
from orchestrator.sandbox.k8s_api import K8sApi
from orchestrator.sandbox.k8s_manifests import SECRET_DIR
from orchestrator.sandbox.kubernetes import KubernetesBackend
from orchestrator.sandbox.pod_sync import outputs_path
from orchestrator.sessions.snapshots import KeptSandbox, NamespaceKeeper
from orchestrator.settings import KubernetesSettings, SandboxSettings, Settings
from tests.helpers import wait_until
from tests.k8s_docker_kubelet import TEST_LABEL, TEST_LABEL_VALUE
from tests.k8s_emulator import (
    EVICTED_MESSAGE,
    NAMESPACE,
    PULL_MESSAGE,
    UNSCHEDULABLE_MESSAGE,
    EmulatedCluster,
    NodeMode,
    docker_for_pods,
    emulated_cluster,
    node_on,
)

pytestmark = pytest.mark.timeout(240)

INSTANCE: Final = "test-instance"
CELL_TIMEOUT_S: Final = 60.0
START_TIMEOUT_S: Final = 90.0
GONE_TIMEOUT_S: Final = 30.0
SEEN_TIMEOUT_S: Final = 30.0
WATCH_IDLE_S: Final = 1.0  # a cancelled start's watch thread ends within a few of these
SHORT_START_S: Final = 2.0
MIB: Final = 1024**2
POD_MEMORY: Final = 512 * MIB
SHORT_CELL_S: Final = 1.0
BIG: Final = ResourceLimits(memory_bytes=1024 * MIB)
KINDS: Final = ("pods", "secrets", "networkpolicies")
NATS_ENV: Final = {
    ENV_NATS_URL: "nats://nats:4222",
    ENV_SESSION_ID: "s-cells",
    ENV_NATS_USER: "s-cells",
    ENV_NATS_PASSWORD: "pw-in-secret",
}
# The password as the kernel env has it, as the in-kernel runtime reads it, and the directory
# of credential files the env names.
READ_CREDENTIALS: Final = (
    "import os; from orchestrator.runtime.host import HostConfig; "
    f"os.environ.get({ENV_NATS_PASSWORD!r}), HostConfig.from_env().password, "
    f"os.environ.get({ENV_NATS_CREDENTIALS_DIR!r})"
)


class Recorder:
    """The daemon's listener, as far as adoption needs it: the refs it was told about."""

    def __init__(self) -> None:
        self.up: dict[str, SandboxRef] = {}

    async def sandbox_up(self, ref: SandboxRef) -> None:
        self.up[ref.session_id] = ref

    async def sandbox_down(self, ref: SandboxRef) -> None:
        self.up.pop(ref.session_id, None)


@pytest.fixture(scope="module")
def docker() -> Any:
    return docker_for_pods()


@pytest.fixture
async def cluster() -> AsyncIterator[EmulatedCluster]:
    async with emulated_cluster() as emulated:
        yield emulated


def backend_for(
    cluster: EmulatedCluster, *, start_timeout_s: float = START_TIMEOUT_S, pool_size: int = 0
) -> KubernetesBackend:
    return KubernetesBackend(
        K8sApi(cluster.api_client(), NAMESPACE, watch_idle_s=WATCH_IDLE_S),
        instance=INSTANCE,
        memory_bytes=POD_MEMORY,
        cpus=1.0,
        start_timeout_s=start_timeout_s,
        pool_size=pool_size,
    )


def workspace_of(tmp_path: Path) -> Path:
    """The test's project on the host (copied into each pod at the same path)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    return project


def spec_for(session: str, tmp_path: Path, *, die_with_parent: bool = True) -> SandboxSpec:
    return SandboxSpec(
        session_id=session,
        cwd=workspace_of(tmp_path),
        artifacts_dir=tmp_path / f"artifacts-{session}",
        die_with_parent=die_with_parent,
    )


def pod_uid(pod: dict[str, Any]) -> str:
    uid = pod["metadata"]["uid"]  # the emulator gives one, as an API server does
    assert isinstance(uid, str) and uid
    return uid


def kubelet_containers(docker: Any) -> list[Any]:
    return list(
        docker.containers.list(all=True, filters={"label": f"{TEST_LABEL}={TEST_LABEL_VALUE}"})
    )


async def run(sandbox: Any, code: str) -> str:
    result = await sandbox.execute(code, timeout_s=CELL_TIMEOUT_S, cell_id=code[:8])
    assert result.status == "ok", result
    return str(result.result or result.stdout).strip()


async def test_a_session_pod_runs_cells_and_stop_deletes_it(
    docker: Any, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    async with node_on(cluster, docker) as node:
        backend = backend_for(cluster)
        try:
            spec = replace(spec_for("s-cells", tmp_path), env=NATS_ENV)
            sandbox = await backend.create(spec)
            name = sandbox.name
            assert all(name in cluster.names(kind) for kind in KINDS)
            # Three objects created, the Secret and the NetworkPolicy patched to name the pod
            # as their owner, the pod watched until Ready (never polled: no reads).
            calls = dict(backend.api.calls)
            assert calls.pop("create") == 3 and calls.pop("patch") == 2
            assert calls.pop("watch") >= 1 and calls == {}
            pod = cluster.object("pods", name)
            owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod_uid(pod)}
            for kind in ("secrets", "networkpolicies"):
                assert cluster.object(kind, name)["metadata"]["ownerReferences"] == [owner]
            await run(sandbox, "x = 41")
            assert await run(sandbox, "x + 1") == "42"
            assert await run(sandbox, "import os; print(os.getuid(), os.getcwd())") == (
                f"1000 {workspace_of(tmp_path)}"
            )
            # The NATS credentials are the Secret's files, not the kernel env's: the runtime
            # reads them there.
            assert await run(sandbox, READ_CREDENTIALS) == (
                f"(None, 'pw-in-secret', '{SECRET_DIR}')"
            )
            assert await sandbox.is_alive()
            info = await sandbox.info()
            assert (info.name, info.state) == (name, "running")
            assert info.memory_limit_bytes == POD_MEMORY and info.started_at is not None
            # A cell past its timeout is interrupted; the namespace stays.
            slow = await sandbox.execute(
                "import time; time.sleep(60)", timeout_s=SHORT_CELL_S, cell_id="slow"
            )
            assert slow.status == "timeout", slow
            assert await run(sandbox, "x + 1") == "42"
            # A restart loses the namespace; the session's cwd is applied again.
            await sandbox.restart_kernel()
            assert await run(sandbox, "print('x' in dir(), __import__('os').getcwd())") == (
                f"False {workspace_of(tmp_path)}"
            )
            container = node.containers[name]
            await sandbox.stop()
            assert backend.api.calls["delete"] == 3  # Pod, Secret, NetworkPolicy
            assert not any(name in cluster.names(kind) for kind in KINDS)
            assert not await sandbox.is_alive()
            assert wait_until(
                lambda: container.id not in {c.id for c in kubelet_containers(docker)},
                timeout=GONE_TIMEOUT_S,
            )
        finally:
            await backend.close()


SKILL_CODE: Final = "VALUE = 7\n"
BIG_PRINT_CHARS: Final = 100_000  # over the output cap: the host writes the artifact


async def test_files_cross_between_host_and_pod(
    docker: Any, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    """The project is copied in and synced back at stop; a skill is importable and read-only
    at the path the prompt names; a host-written output file opens in the next cell; a
    snapshot the kernel commits is on the host at once and revives the namespace in a new
    pod (docs/kubernetes.md, "Files between host and pod")."""
    project = workspace_of(tmp_path)
    (project / "data.txt").write_text("from the host")
    (project / "keep.txt").write_text("untouched")
    skill = tmp_path / "skills" / "my-skill"  # a skill directory holds its package
    (skill / "myskill").mkdir(parents=True)
    (skill / "myskill" / "__init__.py").write_text(SKILL_CODE)
    snapshots = tmp_path / "snapshots" / "s-files"
    spec = replace(spec_for("s-files", tmp_path), skill_dirs=(skill,), snapshot_dir=snapshots)
    async with node_on(cluster, docker):
        backend = backend_for(cluster)
        try:
            keeper = NamespaceKeeper(snapshots)
            kept = KeptSandbox(await backend.create(spec), keeper)
            await keeper.revive(kept.run_silent)  # nothing yet: the kernel may save now
            assert await run(kept, "print(open('data.txt').read())") == "from the host"
            await run(kept, "open('data.txt', 'w').write('from the pod')")
            await run(kept, "open('made.txt', 'w').write('new')")
            assert await run(kept, "import myskill; print(myskill.VALUE, myskill.__file__)") == (
                "7 /opt/prime-agent/skills/my-skill/myskill/__init__.py"
            )
            denied = await kept.execute(
                "open(myskill.__file__, 'a')", timeout_s=CELL_TIMEOUT_S, cell_id="ro"
            )
            assert denied.error is not None and denied.error.ename == "PermissionError"
            big = await kept.execute(
                f"print('b' * {BIG_PRINT_CHARS})", timeout_s=CELL_TIMEOUT_S, cell_id="big"
            )
            assert big.artifact_path is not None and big.artifact_path.is_file()
            opened = f"print(len(open({str(big.artifact_path)!r}).read()) > {BIG_PRINT_CHARS})"
            assert await run(kept, opened) == "True"
            await run(kept, "kept_value = 5")
            saved = await keeper.save(kept)
            assert saved.get("ok"), saved
            manifest = read_manifest(snapshots)  # on the host before the pod goes
            assert manifest is not None
            assert "kept_value" in [v["name"] for v in manifest["saved"]]
            await kept.stop()
            assert (project / "data.txt").read_text() == "from the pod"
            assert (project / "made.txt").read_text() == "new"
            assert (project / "keep.txt").read_text() == "untouched"
            # A new pod: the snapshot goes in and the namespace comes back.
            keeper = NamespaceKeeper(snapshots)
            again = KeptSandbox(await backend.create(spec), keeper)
            await keeper.revive(again.run_silent, new_sandbox=True)
            assert await run(again, "print(kept_value)") == "5"
            await again.stop()
        finally:
            await backend.close()


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("unschedulable", f"cannot be scheduled: {UNSCHEDULABLE_MESSAGE}"),
        (
            "no-image",
            f"cannot pull its image prime-agent/session:latest (ImagePullBackOff): {PULL_MESSAGE}",
        ),
        ("evicted", f"was evicted: {EVICTED_MESSAGE}"),
    ],
)
async def test_a_pod_that_cannot_start_is_a_one_line_start_error_and_leaves_nothing(
    cluster: EmulatedCluster, tmp_path: Path, mode: NodeMode, words: str
) -> None:
    async with node_on(cluster, None, mode):  # runs nothing: no Docker
        backend = backend_for(cluster)
        try:
            with pytest.raises(SandboxStartError) as raised:
                await backend.create(spec_for("s-nofit", tmp_path))
        finally:
            await backend.close()
    assert str(raised.value).endswith(words)
    assert "\n" not in str(raised.value)
    assert not any(cluster.names(kind) for kind in KINDS)


async def test_a_pooled_pod_is_handed_to_the_next_session_of_its_workspace(
    docker: Any, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    async with node_on(cluster, docker):
        backend = backend_for(cluster, pool_size=1)
        try:
            first = await backend.create(spec_for("s-first", tmp_path))  # cold; fills the pool
            assert backend.pool is not None
            await backend.pool.wait_ready(START_TIMEOUT_S)
            (idle,) = cluster.names("pods") - {first.name}
            # The session's files reach a pooled pod when it is handed over.
            (workspace_of(tmp_path) / "handed.txt").write_text("to the pool")
            skill = tmp_path / "skills" / "pool-skill"
            (skill / "poolskill").mkdir(parents=True)
            (skill / "poolskill" / "__init__.py").write_text(SKILL_CODE)
            spec = replace(
                spec_for("s-second", tmp_path),
                env={**NATS_ENV, "PA_TEST_VALUE": "handed"},
                skill_dirs=(skill,),
            )
            second = await backend.create(spec)
            assert second.name == idle and second.ref.session_id == "s-second"
            assert backend.pool.statistics().hits == 1
            assert await run(second, "__import__('os').environ['PA_TEST_VALUE']") == "'handed'"
            assert await run(second, "print(open('handed.txt').read())") == "to the pool"
            assert await run(second, "import poolskill; print(poolskill.VALUE)") == "7"
            # The pooled pod's Secret holds only its token: the credentials are in the env.
            assert await run(second, READ_CREDENTIALS) == "('pw-in-secret', 'pw-in-secret', None)"
            other = await backend.create(replace(spec_for("s-big", tmp_path), limits=BIG))
            assert other.name not in {first.name, idle}  # another policy: a cold start
        finally:
            await backend.close()
    assert not any(cluster.names(kind) for kind in KINDS)  # the refilled pool's pod too


async def test_a_pod_not_ready_in_time_is_a_start_error_and_leaves_nothing(
    cluster: EmulatedCluster, tmp_path: Path
) -> None:
    async with node_on(cluster, None, "pending") as node:  # runs nothing: no Docker
        backend = backend_for(cluster, start_timeout_s=SHORT_START_S)
        try:
            with pytest.raises(
                SandboxStartError, match=r"was not ready within 2 s \(phase Pending\)"
            ):
                await backend.create(spec_for("s-slow", tmp_path))
        finally:
            await backend.close()
    assert node.seen.is_set()
    assert not any(cluster.names(kind) for kind in KINDS)


async def test_a_cancelled_start_leaves_nothing(cluster: EmulatedCluster, tmp_path: Path) -> None:
    async with node_on(cluster, None, "pending") as node:  # runs nothing: no Docker
        backend = backend_for(cluster)
        try:
            start = asyncio.ensure_future(backend.create(spec_for("s-cancel", tmp_path)))
            assert await asyncio.to_thread(node.seen.wait, SEEN_TIMEOUT_S)
            assert cluster.names("pods")  # created, waiting to be Ready
            start.cancel()
            with pytest.raises(asyncio.CancelledError):
                await start
        finally:
            await backend.close()
    assert not any(cluster.names(kind) for kind in KINDS)


async def test_an_oom_killed_pod_is_kernel_died_with_one_line(
    docker: Any, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    async with node_on(cluster, docker) as node:
        backend = backend_for(cluster)
        try:
            sandbox = await backend.create(spec_for("s-oom", tmp_path))
            await run(sandbox, "x = 1")
            oom = {
                "name": "sandbox",
                "image": "prime-agent/session:latest",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
            status = {"phase": "Failed", "containerStatuses": [oom]}
            await asyncio.to_thread(node.fail, sandbox.name, status)  # the API is served here
            with pytest.raises(KernelDied, match="ran out of memory"):
                await sandbox.execute("x", timeout_s=CELL_TIMEOUT_S, cell_id="after")
            assert not await sandbox.is_alive()
        finally:
            await backend.close()
    assert not any(cluster.names(kind) for kind in KINDS)


async def test_a_new_backend_adopts_its_pod_and_removes_unknown_ones(
    docker: Any, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    async with node_on(cluster, docker):
        first = backend_for(cluster)  # the orchestrator that is "killed": never closed
        recorder = Recorder()
        first.listener = recorder
        kept = await first.create(spec_for("s-kept", tmp_path, die_with_parent=False))
        await run(kept, "x = 41")
        stray = await first.create(spec_for("s-stray", tmp_path, die_with_parent=False))
        printed = await first.create(spec_for("s-print", tmp_path))  # a print-mode run's pod
        ref = recorder.up["s-kept"]
        assert (ref.ref, ref.kernel_id) == (kept.name, kept.ref.kernel_id)

        stranger = KubernetesBackend(
            K8sApi(cluster.api_client(), NAMESPACE), instance="another-instance"
        )
        with pytest.raises(SandboxError, match="another prime-agent instance"):
            await stranger.adopt(ref, spec_for("s-kept", tmp_path))
        await stranger.remove(ref)  # not its pod: kept
        assert await stranger.remove_unknown(set()) == 0
        assert {kept.name, stray.name} <= cluster.names("pods")

        second = backend_for(cluster)  # a fresh client, as after a restart
        try:
            adopted = await second.adopt(ref, spec_for("s-kept", tmp_path, die_with_parent=False))
            assert await run(adopted, "x + 1") == "42"  # the same kernel: its namespace kept
            assert await second.remove_unknown({ref.ref}) == 1
            assert not any(stray.name in cluster.names(kind) for kind in KINDS)
            assert not outputs_path(stray.name).exists()  # its host side goes too
            assert {kept.name, printed.name} <= cluster.names("pods")  # not a daemon's pod
            await second.remove(ref)  # what the daemon does with one it could not adopt
            assert not any(kept.name in cluster.names(kind) for kind in KINDS)
            assert not outputs_path(kept.name).exists()
        finally:
            await second.close()
            await printed.stop()
            for dropped in (kept, stray):  # the "killed" orchestrator's connections
                if dropped.client is not None:
                    await dropped.client.close()


KUBECONFIG: Final = """\
apiVersion: v1
kind: Config
clusters:
- name: emulated
  cluster: {{server: "{url}"}}
- name: elsewhere
  cluster: {{server: "http://127.0.0.1:1"}}
users:
- name: tester
  user: {{token: not-checked}}
contexts:
- name: other
  context: {{cluster: elsewhere, user: tester}}
- name: emulated
  context: {{cluster: emulated, user: tester, namespace: {namespace}}}
current-context: other
"""


async def test_from_settings_reaches_the_cluster_of_its_kubeconfig_context(
    cluster: EmulatedCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(url=cluster.url, namespace=NAMESPACE))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = Settings(
        sandbox=SandboxSettings(memory_mib=768, cpus=0.5),
        kubernetes=KubernetesSettings(context="emulated", namespace=NAMESPACE),
    )
    backend = KubernetesBackend.from_settings(settings, instance=INSTANCE)
    policy = backend.policy_for(spec_for("s-config", tmp_path))
    assert (policy.memory_bytes, policy.cpus) == (768 * MIB, 0.5)
    async with node_on(cluster, None, "unschedulable") as node:  # runs nothing
        try:
            with pytest.raises(SandboxStartError, match="cannot be scheduled"):
                await backend.create(spec_for("s-config", tmp_path))
        finally:
            await backend.close()
    assert node.seen.is_set()  # the pod reached the emulator through the kubeconfig
    assert kubeconfig.read_text() == KUBECONFIG.format(url=cluster.url, namespace=NAMESPACE)

    missing = Settings(kubernetes=KubernetesSettings(context="nowhere", namespace=NAMESPACE))
    with pytest.raises(SandboxStartError, match="no usable cluster configuration") as raised:
        KubernetesBackend.from_settings(missing, instance=INSTANCE)
    assert "\n" not in str(raised.value)
