"""The ``kubernetes`` backend: one pod per session (docs/kubernetes.md).

A sandbox is the session's Secret, NetworkPolicy and Pod (``k8s_manifests.session_objects``),
created in that order through the official client (``k8s_api.py``). ``create`` then WATCHES
the pod until it runs with an IP and is Ready (its readiness probe: the gateway accepts
connections), or until its status says it never will (``k8s_pod_state.py``: Unschedulable,
an image that cannot be pulled, OOMKilled, Evicted...: ``SandboxStartError`` in one line).
The kernel is reached at the pod's IP and ``[kubernetes] gateway_port`` through the same
``KernelGatewayClient`` as every backend, with the token the Secret carries, when the
orchestrator runs in the cluster; from outside, through a loopback port whose connections are
port-forwards of the API server (``k8s_port_forward.py``; ``[kubernetes] reach``). A pod that
fails once it ran is ``KernelDied`` with its one line.

``stop`` deletes the pod, its Secret and its policy. Every object carries the ownership
labels (``prime-agent/instance``, ``/session``): a restarted orchestrator ``adopt``s a pod it
recorded (the same kernel, the namespace kept) and ``remove_unknown`` deletes the daemon pods
(``prime-agent/daemon``) of its instance that it recorded nowhere.

A warm pool (``pool_size``, ``[kubernetes] pool_size`` by ``from_settings``) keeps ready pods
for the workspace path most recently used (a pod's volumes are fixed at creation); a session
with the backend's default policy and that path takes one (``assign``: its cwd and env).

Files cross through the gateway's own port (``pod_sync.py``): the project is copied in at the
start and synced back at stop (modes ``copy`` and ``rw``; ``ro`` is copied in only), skills are
copied in without write bits, the session's snapshot is copied in before revival and every new
snapshot is pulled back, and a cell's host-written output file is copied to the same path
inside. A pooled pod gets them when it is assigned.

Once the pod is created, its Secret and NetworkPolicy name it as their owner
(``K8sApi.create``), so a cluster's garbage collector removes them with it. The kernel reads
the session's NATS credentials from the Secret's files, not from its env (``_session_env``).

The gateway is reached at the pod's IP, or through API-server port-forwards from outside the
cluster (``k8s_port_forward.py``, ``[kubernetes] reach``). ``--backend kubernetes`` chooses
this backend (``sandbox/choice.py``); print mode and the daemon build it with
``from_settings`` (the cluster of ``[kubernetes]``, the defaults of ``[sandbox]``:
``sandbox/defaults.py``), tests with ``KubernetesBackend(K8sApi(...))``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import httpx

from orchestrator.errors import KernelDied, SandboxError, SandboxStartError
from orchestrator.runtime.wire import ENV_NATS_CREDENTIALS_DIR, NATS_CREDENTIAL_FILES
from orchestrator.sandbox.base import (
    CellResult,
    OutputListener,
    SandboxBackend,
    SandboxInfo,
    SandboxRef,
    SandboxSpec,
    WorkspaceMode,
)
from orchestrator.sandbox.confined import session_env, skill_mount_point
from orchestrator.sandbox.defaults import sandbox_defaults
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.gateway_sandbox import GatewaySandbox
from orchestrator.sandbox.k8s_api import K8sApi, api_client
from orchestrator.sandbox.k8s_manifests import (
    LABEL_INSTANCE,
    LABEL_SESSION,
    SECRET_DIR,
    RunProcess,
    SessionPod,
    pod_name,
    session_objects,
)
from orchestrator.sandbox.k8s_pod_info import pod_info
from orchestrator.sandbox.k8s_pod_state import PodView, view_pod
from orchestrator.sandbox.k8s_port_forward import PodPortForward, uses_port_forward
from orchestrator.sandbox.pod_files import PodFiles
from orchestrator.sandbox.pod_sync import (
    outputs_home,
    outputs_path,
    pull_snapshot,
    pull_workspace,
    push_output,
    push_skills,
    push_snapshot,
    push_workspace,
    remove_outputs_home,
)
from orchestrator.sandbox.pool import WarmPool
from orchestrator.sandbox.reattach import reattach_within
from orchestrator.sandbox.workspace import WorkspaceCopy
from orchestrator.session_specs import StoredSandboxPolicy
from orchestrator.settings import (
    INTERRUPT_GRACE_S,
    OUTPUT_STREAM_CAP_CHARS,
    SANDBOX_CPUS,
    SANDBOX_MEMORY_MIB,
    SANDBOX_PIDS_LIMIT,
    SANDBOX_START_TIMEOUT_S,
    KubernetesSettings,
    Settings,
)

__all__ = ["BACKEND_NAME", "KubernetesBackend", "KubernetesSandbox"]

log = logging.getLogger(__name__)

BACKEND_NAME: Final = "kubernetes"
TOKEN_BYTES: Final = 32
DEFAULT_IMAGE: Final = "session"
DEFAULT_MEMORY_BYTES: Final = SANDBOX_MEMORY_MIB * 1024**2
# A pod pulls its image and is scheduled before its gateway starts: more time than a container.
POD_START_TIMEOUT_S: Final = SANDBOX_START_TIMEOUT_S * 4
GATEWAY_POLL_S: Final = 0.05  # the gateway answers within a moment of the pod being Ready
GATEWAY_PROBE_TIMEOUT_S: Final = 2.0
POOL_SESSION_ID: Final = "pool"


def nats_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """The NATS credentials in ``env`` (those a session's Secret holds as files)."""
    return {name: env[name] for name in NATS_CREDENTIAL_FILES if env.get(name)}


def gateway_url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


class KubernetesSandbox(GatewaySandbox):
    """One session pod with its gateway and kernel."""

    def __init__(
        self, backend: KubernetesBackend, spec: SandboxSpec, name: str, *, idle: bool = False
    ):
        self.backend = backend
        self.spec = spec
        self.name = name
        self.output_cap_chars = backend.output_cap_chars
        self.interrupt_grace_s = backend.interrupt_grace_s
        self.token = ""
        self.client: KernelGatewayClient | None = None
        self.ref = SandboxRef(BACKEND_NAME, name, spec.session_id, "", "", "")
        self.failure = ""  # the pod's one line once it failed for good
        self.created = False  # objects may exist in the cluster: stop deletes them
        self.forward: PodPortForward | None = None  # ``[kubernetes] reach``: port-forward
        self._stopped = False
        self._lock = asyncio.Lock()
        self._recorded: SandboxRef | None = None
        # The NATS credentials the pod's Secret holds as files (those of the spec it is
        # created for): while the session's are these, its kernel reads them there.
        self._secret_credentials = nats_credentials(spec.env)
        # Files between host and pod (pod_sync.py): the gateway's files endpoint once it
        # answers, the host side of the pod's outputs directory, the project's host copy.
        self.files: PodFiles | None = None
        self.outputs: Path | None = None
        self.workspace_copy: WorkspaceCopy | None = None
        # A warm pool's pod: the session's files come when it is assigned one.
        self.idle = idle

    # --- GatewaySandbox ---------------------------------------------------------------------

    def _usable(self) -> KernelGatewayClient:
        if self._stopped or self.client is None:
            raise SandboxError(f"sandbox {self.spec.session_id} is stopped")
        if self.failure:
            raise KernelDied(self.failure)
        return self.client

    def _exit_status(self) -> int | None:
        return 1 if self.failure else None

    def _exit_message(self) -> str:
        return self.failure

    def _artifact_root(self) -> Path:
        # The outputs directory has the same path in the pod: a path in a result opens there.
        return self.outputs if self.outputs is not None else self.spec.artifacts_dir

    async def _check_pod(self, exc: SandboxError) -> SandboxError:
        """``exc`` from the gateway, or ``KernelDied`` with the pod's line when it failed."""
        if isinstance(exc, KernelDied) or self._stopped:
            return exc
        try:
            pod = await asyncio.to_thread(self.backend.api.read_pod, self.name)
        except SandboxError:
            return exc
        if pod is None:
            self.failure = f"pod {self.name} is gone"
        else:
            failure = view_pod(pod).failure
            if failure is not None:
                self.failure = failure.line
        return KernelDied(self.failure) if self.failure else exc

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        cell_id: str,
        on_output: OutputListener | None = None,
    ) -> CellResult:
        try:
            result = await super().execute(
                code, timeout_s=timeout_s, cell_id=cell_id, on_output=on_output
            )
        except SandboxError as exc:
            raise await self._check_pod(exc) from exc
        artifact = result.artifact_path
        # Written on the host (not spilled in the pod): copied to the same path inside.
        if artifact is not None and self.files is not None and artifact.is_file():
            try:
                await push_output(self.files, artifact)
            except SandboxError as exc:
                log.warning("kubernetes: %s", exc)
        return result

    async def run_silent(
        self, code: str, *, user_expressions: Mapping[str, str] | None = None, timeout_s: float
    ) -> dict[str, Any]:
        """Host code in the kernel; a snapshot it committed is pulled to the host at once
        (``spec.snapshot_dir``), so that it outlives the pod."""
        reply = await super().run_silent(
            code, user_expressions=user_expressions, timeout_s=timeout_s
        )
        directory = self.spec.snapshot_dir
        if directory is not None and self.files is not None:
            async with self._lock:
                try:
                    await pull_snapshot(self.files, directory)
                except (SandboxError, OSError) as exc:
                    log.warning("kubernetes: pulling the snapshot of %s: %s", self.name, exc)
        return reply

    async def restart_kernel(self) -> None:
        try:
            await super().restart_kernel()
        except SandboxError as exc:
            raise await self._check_pod(exc) from exc

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the objects, watch the pod until Ready, copy the session's files in (a pooled
        pod's come at ``assign``), start the kernel, apply the session."""
        backend, spec = self.backend, self.spec
        started = time.monotonic()
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        self.outputs = await asyncio.to_thread(outputs_home, self.name)
        request = SessionPod(
            spec,
            backend.policy_for(spec),
            backend.instance,
            self.token,
            self.name,
            run=RunProcess.this() if spec.die_with_parent else None,
        )
        objects = session_objects(request, backend.settings)  # SandboxStartError: mounts
        self.created = True
        await self._to_thread(backend.api.create, objects)
        await self._record(self._ref("", ""))
        view = await self._wait_ready()
        url = await self._gateway_url(view.ip)
        await self._record(self._ref(url, ""))
        await self._wait_gateway(url)
        booted = time.monotonic()
        self.files = PodFiles(url, self.token)
        if not self.idle:
            await self._bring_in()
        client = KernelGatewayClient(url, self.token)
        self.client = client
        await self._start_kernel(client)
        self.ref = self._ref(url, client.kernel_id)
        await self._record(self.ref)
        log.info(
            "kubernetes sandbox %s: pod %s ready %.0f ms, kernel %.0f ms",
            spec.session_id,
            self.name,
            (booted - started) * 1000,
            (time.monotonic() - booted) * 1000,
        )

    async def _to_thread(self, call: Any, *args: Any) -> Any:
        """An API call in a thread, waited for even when cancelled (an object it creates is
        then known to ``stop``, which deletes by name anyway)."""
        work = asyncio.ensure_future(asyncio.to_thread(call, *args))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await work
            raise

    async def _wait_ready(self) -> PodView:
        stop = threading.Event()

        def done(pod: dict[str, Any] | None) -> bool:
            if pod is None:
                return True
            view = view_pod(pod)
            return view.ready or view.failure is not None

        timeout_s = self.backend.start_timeout_s
        try:
            pod = await asyncio.to_thread(
                self.backend.api.wait_pod, self.name, done, timeout_s=timeout_s, stop=stop
            )
        finally:
            stop.set()  # a cancelled wait: its thread ends at its next event or idle read
        if pod is None:
            raise SandboxStartError(f"pod {self.name} was deleted while it started")
        view = view_pod(pod)
        if view.failure is not None:
            raise SandboxStartError(view.failure.line)
        if not view.ready:
            raise SandboxStartError(
                f"pod {self.name} was not ready within {timeout_s:.0f} s (phase {view.phase})"
            )
        return view

    async def _wait_gateway(self, url: str) -> None:
        """The pod is Ready (its gateway accepts connections); wait until it answers HTTP."""
        deadline = time.monotonic() + self.backend.start_timeout_s
        headers = {"Authorization": f"token {self.token}"}
        async with httpx.AsyncClient(
            base_url=url, headers=headers, trust_env=False, timeout=GATEWAY_PROBE_TIMEOUT_S
        ) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/api")).status_code == httpx.codes.OK:
                        return
                if time.monotonic() > deadline:
                    raise SandboxStartError(f"pod {self.name}: its gateway at {url} did not answer")
                await asyncio.sleep(GATEWAY_POLL_S)

    async def _gateway_url(self, ip: str) -> str:
        """The pod's gateway at its IP, or through a port-forward (``[kubernetes] reach``)."""
        port = self.backend.settings.gateway_port
        if not uses_port_forward(self.backend.settings):
            return gateway_url(ip, port)
        if self.forward is None:
            self.forward = PodPortForward(self.backend.api, self.name, port)
        return await self.forward.url()

    def _ref(self, url: str, kernel_id: str) -> SandboxRef:
        return SandboxRef(
            backend=BACKEND_NAME,
            ref=self.name,
            session_id=self.spec.session_id,
            url=url,
            kernel_id=kernel_id,
            token=self.token,
        )

    async def _record(self, ref: SandboxRef) -> None:
        if not self.spec.die_with_parent:
            self._recorded = ref
            await self.backend._report_up(ref)

    def _session_env(self) -> dict[str, str]:
        """The kernel's env: NATS by its URL (no relay in a pod); the session's NATS
        credentials read from the Secret's files when it holds them (not sent over the pod
        network), else in the env (a pooled pod's Secret has only its token; an adopted pod's
        is not read)."""
        env = session_env(self.spec, relayed=False)
        credentials = nats_credentials(env)
        if credentials and credentials == self._secret_credentials:
            for name in credentials:
                del env[name]
            env[ENV_NATS_CREDENTIALS_DIR] = SECRET_DIR
        return env

    def _import_path(self) -> list[str]:
        # A pooled pod's kernel started before its session's skills were known.
        return [skill_mount_point(directory) for directory in self.spec.skill_dirs]

    async def _setup(self) -> None:
        assert self.client is not None
        await self._apply_session(self.client)

    async def _bring_in(self) -> None:
        """The session's files into the pod, before its kernel holds the session: the
        workspace, the skills, the snapshot to revive from (pod_sync.py)."""
        assert self.files is not None
        spec = self.spec
        mode = self.backend.policy_for(spec).workspace
        self.workspace_copy = await push_workspace(self.files, spec, mode)
        if spec.skill_dirs:
            await push_skills(self.files, spec.skill_dirs)
        if spec.snapshot_dir is not None:
            await push_snapshot(self.files, spec.snapshot_dir)
            self.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR

    async def _take_back(self) -> None:
        """Before the pod goes: its workspace synced back into the project (``copy``, ``rw``;
        an adopted pod's host copy is found on disk). Never raises."""
        spec = self.spec
        if self.files is None or self.idle or self.backend.policy_for(spec).workspace == "ro":
            return
        copy, self.workspace_copy = self.workspace_copy, None
        if copy is None:
            try:
                copy = await asyncio.to_thread(WorkspaceCopy.load, spec.artifacts_dir)
            except SandboxError as exc:
                log.error("kubernetes: %s", exc)
        if copy is None:
            return
        if self.failure:
            log.error(
                "workspace: pod %s failed (%s); what it changed in %s is lost",
                self.name,
                self.failure,
                spec.cwd,
            )
            await asyncio.to_thread(copy.remove)
            return
        await pull_workspace(self.files, copy, spec.cwd)

    async def _adopt(self, ref: SandboxRef) -> None:
        """Take over ``ref``, the pod of an earlier orchestrator (``SandboxError`` when it
        is not ours, not ready, or its kernel does not answer)."""
        backend = self.backend
        self._secret_credentials = {}  # not read back: a restarted kernel gets them in its env
        pod = await asyncio.to_thread(backend.api.read_pod, ref.ref)
        if pod is None:
            raise SandboxError(f"pod {ref.ref} is gone")
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_INSTANCE) != backend.instance:
            raise SandboxError(f"pod {ref.ref} belongs to another prime-agent instance")
        view = view_pod(pod)
        if view.failure is not None:
            raise SandboxError(view.failure.line)
        if not view.ready:
            raise SandboxError(f"pod {ref.ref} is not ready (phase {view.phase})")
        url = await self._gateway_url(view.ip)
        client = KernelGatewayClient(url, ref.token)
        self.files = PodFiles(url, ref.token)
        self.outputs = await asyncio.to_thread(outputs_home, ref.ref)  # the pod's own path
        if self.spec.snapshot_dir is not None:
            self.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
        interrupted = await reattach_within(
            client,
            ref.kernel_id,
            what=f"pod {ref.ref}",
            interrupt_grace_s=backend.interrupt_grace_s,
            timeout_s=backend.start_timeout_s,
        )
        client.on_restart = self._setup
        self.client = client
        self.created = True
        self.token = ref.token
        self.ref = self._ref(url, ref.kernel_id)
        if not self.spec.die_with_parent:
            self._recorded = self.ref
            if self.ref != ref:  # the pod's IP is the one to record now
                await backend._report_up(self.ref)
        log.info(
            "adopted kubernetes sandbox %s (pod %s%s)",
            self.spec.session_id,
            ref.ref,
            ", its running cell was interrupted" if interrupted else "",
        )

    async def assign(self, spec: SandboxSpec) -> None:
        """Hand an idle pooled pod to a session (same workspace path): its cwd and env are
        applied in the kernel; the pod keeps its labels (session ``pool``)."""
        if spec.cwd != self.spec.cwd:
            raise SandboxError("pooled pod has another workspace")
        self.spec = spec
        self.idle = False
        self.ref = replace(self.ref, session_id=spec.session_id)
        assert self.client is not None
        self.client.unreported_restarts = 0
        await self._bring_in()
        await self._setup()
        if self._recorded is not None:
            await self._record(self.ref)

    # --- Sandbox ----------------------------------------------------------------------------

    async def is_alive(self) -> bool:
        if self._stopped or self.client is None or self.failure:
            return False
        return await self.client.kernel_alive()

    async def info(self) -> SandboxInfo:
        """The pod (phase, node, restarts, limits), its newest events and its resource use
        from metrics.k8s.io (``k8s_pod_info.py``); a pod that is gone is ``state`` gone."""
        api = self.backend.api
        try:
            pod = await asyncio.to_thread(api.read_pod, self.name)
        except SandboxError:
            pod = None
        if pod is None:
            return SandboxInfo(name=self.name, state="gone")
        metrics_read = asyncio.to_thread(api.pod_metrics, self.name)
        events, (metrics, why) = await asyncio.gather(self._events(), metrics_read)
        return pod_info(pod, events, metrics, why)

    async def _events(self) -> list[dict[str, Any]]:
        """The pod's events; none when they cannot be listed (diagnostics only)."""
        try:
            return await asyncio.to_thread(self.backend.api.pod_events, self.name)
        except SandboxError as exc:
            log.warning("kubernetes: %s", exc)
            return []

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.backend._owned.discard(self)
        self.backend._names.discard(self.name)
        await self._teardown()

    async def _teardown(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        await self._take_back()
        self.files = None
        if self.outputs is not None:
            await asyncio.to_thread(remove_outputs_home, self.outputs)
        forward, self.forward = self.forward, None
        if forward is not None:
            await forward.close()
        if self.created:
            try:
                await self._to_thread(self.backend.api.delete, self.name)
            except SandboxError as exc:
                log.warning("kubernetes: %s", exc)
        recorded, self._recorded = self._recorded, None
        if recorded is not None:
            await self.backend._report_down(recorded)


class KubernetesBackend(SandboxBackend):
    """Starts ``KubernetesSandbox``es in ``settings.namespace`` through ``api`` (a ``K8sApi``).
    A session's policy is its spec's where it makes one, else this backend's defaults."""

    name = BACKEND_NAME

    def __init__(
        self,
        api: K8sApi,
        *,
        instance: str,
        settings: KubernetesSettings | None = None,
        image: str = DEFAULT_IMAGE,
        workspace_mode: WorkspaceMode = "rw",
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = SANDBOX_CPUS,
        pids_limit: int = SANDBOX_PIDS_LIMIT,
        network: bool = False,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        output_cap_chars: int = OUTPUT_STREAM_CAP_CHARS,
        start_timeout_s: float = POD_START_TIMEOUT_S,
        pool_size: int = 0,
        pool_die_with_parent: bool = True,
    ):
        self.api = api
        self.instance = instance
        self.settings = settings or KubernetesSettings(namespace=api.namespace)
        if self.settings.namespace != api.namespace:
            raise SandboxStartError(
                f"kubernetes: the API client is for namespace {api.namespace}, "
                f"the settings name {self.settings.namespace}"
            )
        self.image = image
        self.workspace_mode = workspace_mode
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.network = network
        self.interrupt_grace_s = interrupt_grace_s
        self.output_cap_chars = output_cap_chars
        self.start_timeout_s = start_timeout_s
        self.pool_size = pool_size
        self.pool_die_with_parent = pool_die_with_parent
        self.pool: WarmPool[KubernetesSandbox] | None = None
        self._pool_cwd: Path | None = None
        self._retired: list[WarmPool[KubernetesSandbox]] = []
        self._owned: set[KubernetesSandbox] = set()
        self._names: set[str] = set()  # every pod this object started and has not stopped
        self._closed = False

    @classmethod
    def from_settings(
        cls, settings: Settings, *, instance: str, network: bool = False, **options: Any
    ) -> KubernetesBackend:
        """A backend for ``settings``' cluster (``[kubernetes]``: ``api_client``) with its
        sandbox policy and REPL settings as defaults; ``options`` are passed on."""
        k8s = settings.kubernetes
        options.setdefault("pool_size", k8s.pool_size)
        return cls(
            K8sApi(api_client(k8s), k8s.namespace),
            instance=instance,
            settings=k8s,
            network=network,
            **sandbox_defaults(settings),
            **options,
        )

    def policy_for(self, spec: SandboxSpec) -> StoredSandboxPolicy:
        """The policy the pod is built with: the spec's choices over this backend's."""
        limits = spec.limits
        return StoredSandboxPolicy(
            backend=BACKEND_NAME,
            image=spec.image or self.image,
            workspace=spec.workspace or self.workspace_mode,
            network=self.network if spec.network is None else spec.network,
            memory_bytes=(limits.memory_bytes if limits else None) or self.memory_bytes,
            cpus=(limits.cpus if limits else None) or self.cpus,
            pids=(limits.pids if limits else None) or self.pids_limit,
        )

    async def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        if self._closed:
            raise SandboxError("backend is closed")
        spec = replace(spec, cwd=spec.cwd.absolute())
        if self.pool_size > 0:
            fits = self._pool_fits(spec)
            pool = self._pool_for(spec.cwd)
            sandbox = await (pool.acquire(spec) if fits else self._start_cold(spec))
        else:
            sandbox = await self._start_cold(spec)
        self._owned.add(sandbox)
        return sandbox

    # --- the warm pool: ready pods for the workspace most recently used ---------------------

    def _pool_fits(self, spec: SandboxSpec) -> bool:
        """A pooled pod was built with this backend's policy and the pool's workspace path
        (a pod's volumes are fixed at creation)."""
        idle = replace(spec, image=None, workspace=None, limits=None, network=None)
        return (
            self._pool_cwd == spec.cwd
            and self.policy_for(spec) == self.policy_for(idle)
            and not spec.mounts
        )

    def _pool_for(self, cwd: Path) -> WarmPool[KubernetesSandbox]:
        """The pool for ``cwd``, started; one for another workspace is closed."""
        if self.pool is not None and self._pool_cwd == cwd:
            return self.pool
        if self.pool is not None:
            self._retired.append(self.pool)
            asyncio.get_running_loop().create_task(self.pool.close())

        async def start_idle(die_with_parent: bool) -> KubernetesSandbox:
            idle = SandboxSpec(
                session_id=POOL_SESSION_ID,
                cwd=cwd,
                artifacts_dir=Path(tempfile.gettempdir()),
                die_with_parent=die_with_parent,
            )
            return await self._start_cold(idle, idle=True)

        self._pool_cwd = cwd
        self.pool = WarmPool(
            start_idle,
            self._start_cold,
            size=self.pool_size,
            die_with_parent=self.pool_die_with_parent,
        )
        self.pool.start()
        return self.pool

    async def _start_cold(self, spec: SandboxSpec, *, idle: bool = False) -> KubernetesSandbox:
        sandbox = KubernetesSandbox(self, spec, pod_name(spec.session_id), idle=idle)
        self._names.add(sandbox.name)
        try:
            await sandbox.start()
        except BaseException as exc:
            await sandbox._teardown()  # nothing of a failed start stays in the cluster
            if isinstance(exc, SandboxStartError):
                raise
            if isinstance(exc, (SandboxError, TimeoutError, OSError)):
                raise SandboxStartError(f"pod {sandbox.name} did not start: {exc}") from exc
            raise
        return sandbox

    async def adopt(self, ref: SandboxRef, spec: SandboxSpec) -> KubernetesSandbox:
        sandbox = KubernetesSandbox(self, spec, ref.ref)
        await sandbox._adopt(ref)
        self._owned.add(sandbox)
        return sandbox

    async def remove(self, ref: SandboxRef) -> None:
        pod = await asyncio.to_thread(self.api.read_pod, ref.ref)
        labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
        if pod is not None and labels.get(LABEL_INSTANCE) != self.instance:
            log.warning("pod %s belongs to another prime-agent instance: kept", ref.ref)
            return
        await asyncio.to_thread(self.api.delete, ref.ref)
        await asyncio.to_thread(remove_outputs_home, outputs_path(ref.ref))

    async def remove_unknown(self, known: set[str]) -> int:
        mine = self._names  # this object's pods, pooled ones included
        pods = await asyncio.to_thread(self.api.daemon_pods, self.instance)
        unknown = [pod["metadata"] for pod in pods if pod["metadata"]["name"] not in known | mine]
        for metadata in unknown:
            await asyncio.to_thread(self.api.delete, metadata["name"])
            await asyncio.to_thread(remove_outputs_home, outputs_path(metadata["name"]))
            session = (metadata.get("labels") or {}).get(LABEL_SESSION, "")
            log.info("removed unknown pod %s (session %s)", metadata["name"], session)
        return len(unknown)

    async def close(self) -> None:
        self._closed = True
        pools = [*self._retired, *([self.pool] if self.pool is not None else [])]
        for pool in pools:
            await pool.close()
        owned, self._owned = list(self._owned), set()
        async with asyncio.TaskGroup() as tg:
            for sandbox in owned:
                tg.create_task(sandbox.stop())
