"""A test node that runs each session pod's gateway as a local process, for the scale bench
(bench/bench_k8s_scale.py) and the API-call tests (tests/integration/test_k8s_api_calls.py):
many pods on two cores, where the Docker node (tests/k8s_emulator.py) runs a few.

``ProcessNode`` watches the pods created in the emulator (through its own API client) and
plays the kubelet for each: it reads the pod's Secret, writes its files into a private
directory, and runs the pod's command as a process of this machine, the gateway of this
checkout with this interpreter, with three substitutions: ``--ip`` is a loopback address of the
pod's own (``127.1.x.y``: every 127/8 address is local on Linux, so each pod has an IP and the
same ``gateway_port``, as in a cluster), ``--runtime-dir`` and ``--token-file`` are in the
private directory; the working directory is the pod's (``workingDir``, which must exist here)
and HOME and TMPDIR are private. Once the gateway prints its ready line the pod's status
becomes Running and Ready with that IP. A deleted pod's process is stopped.

What it is not: no container, no limits, no read-only root, no volumes but the working
directory, no scheduler (``capacity`` pods run at once, the rest stay Pending until one goes),
no probes. It measures the orchestrator's side (the API requests, the kernel client), not a
pod's isolation: the Docker node and tests/integration/test_k8s_pod_on_docker.py do that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes import watch as typed_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

__all__ = ["ProcessNode", "free_gateway_port", "running_process_node"]

watch: Any = typed_watch  # the client carries no annotations
HTTP_NOT_FOUND: Final = 404
READY_PREFIX: Final = b'{"port"'  # the gateway's ready line on stdout
WATCH_IDLE_S: Final = 1.0  # the node's watch is read again this often: it sees ``stop`` soon
API_TIMEOUT_S: Final = 10.0
STOP_GRACE_S: Final = 5.0
STDERR_TAIL_CHARS: Final = 300
# Pod IPs: 127.1.0.1, 127.1.0.2, ... (250 per third octet).
IP_BLOCK: Final = "127.1"
IPS_PER_OCTET: Final = 250
FIRST_IP: Final = "127.1.0.1"
START_WORKERS: Final = 4  # pods started at once (a kubelet starts several in parallel)
DEFAULT_CAPACITY: Final = 16  # pods running at once; more stay Pending


def free_gateway_port() -> int:
    """A port free on the pods' addresses (all pods listen on it, each at its own IP)."""
    with socket.socket() as probe:
        probe.bind((FIRST_IP, 0))
        port: int = probe.getsockname()[1]
        return port


def _pod_ip(index: int) -> str:
    return f"{IP_BLOCK}.{index // IPS_PER_OCTET}.{index % IPS_PER_OCTET + 1}"


@dataclass
class _Pod:
    name: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    deleted: bool = False
    holds_slot: bool = False


@dataclass
class ProcessNode:
    """See the module docstring. ``run`` in a thread until ``stop``. ``before_ready(name)``,
    when given, is called just before a pod is made Ready (a test's gate)."""

    api_client: Any
    namespace: str
    capacity: int = DEFAULT_CAPACITY
    before_ready: Callable[[str], None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    started: int = 0  # pods whose gateway ran
    failed: list[str] = field(default_factory=list)  # one line per pod that could not run
    _pods: dict[str, _Pod] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slots: threading.Semaphore = field(init=False)
    _next_ip: int = 0

    def __post_init__(self) -> None:
        self._slots = threading.Semaphore(self.capacity)

    def run(self) -> None:
        core = k8s.CoreV1Api(self.api_client)
        with ThreadPoolExecutor(START_WORKERS, thread_name_prefix="process-node") as starts:
            try:
                while not self.stop.is_set():
                    with contextlib.suppress(Urllib3Error):
                        for event in watch.Watch().stream(
                            core.list_namespaced_pod,
                            self.namespace,
                            _request_timeout=(API_TIMEOUT_S, WATCH_IDLE_S),
                            deserialize=False,
                        ):
                            self._handle(core, starts, event["type"], event["object"])
                            if self.stop.is_set():
                                break
            finally:
                with self._lock:
                    names = list(self._pods)
                for name in names:
                    self._forget(name)

    def _handle(self, core: Any, starts: ThreadPoolExecutor, kind: str, pod: Any) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self._forget(name)
            return
        with self._lock:
            if kind != "ADDED" or name in self._pods:
                return
            record = _Pod(name, Path(tempfile.mkdtemp(prefix="prime-agent-k8s-node-")))
            self._pods[name] = record
            ip = _pod_ip(self._next_ip)
            self._next_ip += 1
        starts.submit(self._start_logged, core, record, pod, ip)

    def _start_logged(self, core: Any, record: _Pod, pod: Any, ip: str) -> None:
        try:
            self._start(core, record, pod, ip)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:  # 404: deleted while it started
                self.failed.append(f"{record.name}: {exc.status} {exc.reason}")
        except Exception as exc:  # a thread's failure is reported, not lost
            self.failed.append(f"{record.name}: {type(exc).__name__}: {exc}")

    def _start(self, core: Any, record: _Pod, pod: Any, ip: str) -> None:
        self._slots.acquire()
        with self._lock:
            record.holds_slot = True
            if record.deleted:
                self._release(record)
                return
        (container,) = pod["spec"]["containers"]
        secret_name = next(
            v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v
        )
        secret = self.api_client.sanitize_for_serialization(
            core.read_namespaced_secret(secret_name, self.namespace)
        )
        secrets = record.directory / "secrets"
        for sub in ("secrets", "home", "tmp"):
            (record.directory / sub).mkdir(mode=0o700)
        for key, value in secret["stringData"].items():
            (secrets / key).write_text(value)
        values = {
            "--ip": ip,
            "--runtime-dir": str(record.directory / "runtime"),
            "--token-file": str(secrets / Path(_flag(container["command"], "--token-file")).name),
        }
        argv = [
            sys.executable,
            *_substituted(container["command"][1:], values),
            "--die-with-parent",
        ]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        env.update(
            PATH=os.environ.get("PATH", ""),
            HOME=str(record.directory / "home"),
            TMPDIR=str(record.directory / "tmp"),
        )
        with self._lock, (record.directory / "gateway.log").open("wb") as log_file:
            if record.deleted:
                self._release(record)
                return
            record.process = subprocess.Popen(
                argv,
                cwd=container["workingDir"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
            )
        assert record.process.stdout is not None
        ready = record.process.stdout.readline().startswith(READY_PREFIX)
        if not ready:
            if not record.deleted:  # as a kubelet reports a container that exited
                log = (record.directory / "gateway.log").read_text(errors="replace")
                line = " ".join(log[-STDERR_TAIL_CHARS:].split())
                self.failed.append(f"{record.name}: the gateway did not start: {line}")
                failed = {"phase": "Failed", "reason": "Error", "message": line}
                core.patch_namespaced_pod_status(record.name, self.namespace, {"status": failed})
            return
        self.started += 1
        if self.before_ready is not None:
            self.before_ready(record.name)
        status: dict[str, Any] = {
            "phase": "Running",
            "podIP": ip,
            "startTime": datetime.now(UTC).isoformat(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
        }
        core.patch_namespaced_pod_status(record.name, self.namespace, {"status": status})

    def _release(self, record: _Pod) -> None:
        if record.holds_slot:
            record.holds_slot = False
            self._slots.release()

    def _forget(self, name: str) -> None:
        with self._lock:
            record = self._pods.pop(name, None)
            if record is None:
                return
            record.deleted = True
            process = record.process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        with self._lock:
            self._release(record)
        shutil.rmtree(record.directory, ignore_errors=True)


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _substituted(args: list[str], values: dict[str, str]) -> list[str]:
    """``args`` with the value after each flag of ``values`` replaced."""
    out: list[str] = []
    replace_next: str | None = None
    for arg in args:
        out.append(values[replace_next] if replace_next is not None else arg)
        replace_next = arg if arg in values else None
    return out


@contextlib.asynccontextmanager
async def running_process_node(node: ProcessNode) -> AsyncIterator[ProcessNode]:
    task = asyncio.ensure_future(asyncio.to_thread(node.run))
    try:
        yield node
    finally:
        node.stop.set()
        await task
