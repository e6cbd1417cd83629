"""Docker sandboxes that outlive their daemon: adopt, remove, and sweep unknown ones (R2, R8).

A daemon's containers (``SandboxSpec.die_with_parent`` off) keep running when the daemon is
killed: the gateway inside still listens on ``gateway.sock`` in the host directory that is
bind-mounted into the container. What died with the daemon is the host half of the NATS relay
(``nats.sock``); the kernel's NATS client keeps retrying (``runtime/host.py``) and reconnects
once the relay is back.

- ``adopt_container``: the container still runs; reconnect a ``KernelGatewayClient`` to its
  socket with its token and kernel id (``reattach``: a cell still running is interrupted), and
  serve the relay again on the same ``nats.sock``.
- ``remove_recorded``: force-remove the container and its host directory.
- ``remove_unknown``: containers that carry this daemon's label (``LABEL_DAEMON``) but are not
  in its table (it died between ``docker run`` and recording them) are removed.

Each acts only on containers of this backend's instance (``LABEL_INSTANCE``: the state
directory's id, ``orchestrator/instance.py``): a recorded container that carries another
instance's label (a copied state directory) is neither adopted nor removed, only forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import SandboxRef, SandboxSpec
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.reattach import reattach
from orchestrator.sandbox.relay import serve_unix_to_tcp

if TYPE_CHECKING:
    from orchestrator.sandbox.docker import DockerBackend, DockerSandbox

__all__ = [
    "DAEMON_PROBE_TIMEOUT_S",
    "adopt_container",
    "daemon_answers",
    "remove_recorded",
    "remove_unknown",
]

log = logging.getLogger(__name__)

DAEMON_PROBE_TIMEOUT_S: Final = 1.0
SOCKET_SUBDIR: Final = "sock"  # DockerSandbox.start: <host dir>/sock, mounted in the container
LEGACY_INSTANCE: Final = "main"  # LABEL_INSTANCE of every container before instance ids


def daemon_answers(socket_path: str) -> bool:
    """A daemon listens on ``socket_path`` (a connect succeeds): it owns its containers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DAEMON_PROBE_TIMEOUT_S)
        try:
            sock.connect(socket_path)
        except OSError:
            return False
    return True


def _own_host_dir(recorded: str) -> Path | None:
    """``recorded`` when it is one of our socket directories (a direct child of the temp dir
    with our prefix): a path read back from the database or a label is never removed blindly."""
    from orchestrator.sandbox.docker import RUNTIME_DIR_PREFIX

    if not recorded:
        return None
    path = Path(recorded)
    if path.parent.resolve() != Path(tempfile.gettempdir()).resolve():
        return None
    return path if path.name.startswith(RUNTIME_DIR_PREFIX) else None


def _ours(backend: DockerBackend, instance: str) -> bool:
    """A recorded container's instance label is this backend's (or the fixed one of versions
    before instance ids: the row in this state directory's table names it)."""
    return instance in (backend.instance, LEGACY_INSTANCE)


async def _container_state(backend: DockerBackend, container_id: str) -> tuple[str, set[str], str]:
    """The container's status ("gone" when removed), its mount destinations and its instance
    label."""
    from orchestrator.sandbox.docker_owned import LABEL_INSTANCE, docker_errors

    errors = docker_errors()

    def get() -> tuple[str, set[str], str]:
        try:
            container = backend.docker.containers.get(container_id)
        except errors.NotFound:
            return "gone", set(), ""
        mounts = container.attrs.get("Mounts") or []
        instance = str((container.labels or {}).get(LABEL_INSTANCE, ""))
        return str(container.status), {str(m.get("Destination", "")) for m in mounts}, instance

    try:
        return await asyncio.to_thread(get)
    except errors.DockerException as exc:
        raise SandboxError(f"docker: inspecting {container_id[:12]}: {exc}") from exc


async def adopt_container(
    backend: DockerBackend, ref: SandboxRef, spec: SandboxSpec
) -> DockerSandbox:
    """The sandbox of a running container an earlier daemon started, for ``spec``'s session."""
    from orchestrator.sandbox.docker import DockerSandbox
    from orchestrator.sandbox.docker_run import GATEWAY_HOST_URL, GATEWAY_SOCKET, NATS_SOCKET
    from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR

    host_dir = _own_host_dir(ref.runtime_dir)
    if host_dir is None:
        raise SandboxError(f"container {ref.ref[:12]}: no socket directory recorded")
    state, mounted_at, instance = await _container_state(backend, ref.ref)
    if state != "running":
        raise SandboxError(f"container {ref.ref[:12]} is {state}")
    if not _ours(backend, instance):
        raise SandboxError(f"container {ref.ref[:12]} belongs to another prime-agent instance")
    socket_dir = host_dir / SOCKET_SUBDIR
    sandbox = DockerSandbox(backend, spec)
    # Its snapshots where its kernel sees them: the fixed path (a container of an earlier
    # version mounted the host's path, which the kernel then uses as it is).
    if CONTAINER_SNAPSHOT_DIR in mounted_at:
        sandbox.kernel_snapshot_dir = CONTAINER_SNAPSHOT_DIR
    sandbox.container_id = ref.ref
    sandbox.runtime_dir = host_dir
    sandbox.token = ref.token
    # The relay's host half died with the old daemon: serve nats.sock again (same path, the
    # container's end is bind-mounted) towards this session's bus.
    sandbox._relay = await serve_unix_to_tcp(socket_dir / NATS_SOCKET, lambda: sandbox._nats)
    client = KernelGatewayClient(GATEWAY_HOST_URL, ref.token, uds=str(socket_dir / GATEWAY_SOCKET))
    try:
        async with asyncio.timeout(backend.start_timeout_s):
            interrupted = await reattach(
                client,
                ref.kernel_id,
                interrupt_grace_s=backend.interrupt_grace_s,
                ready_timeout_s=backend.start_timeout_s,
            )
    except (SandboxError, TimeoutError) as exc:
        with contextlib.suppress(Exception):
            await client.close()
        sandbox._relay.close()
        raise SandboxError(f"container {ref.ref[:12]} could not be adopted: {exc!r}") from exc
    client.on_restart = sandbox._setup
    sandbox.client = client
    sandbox.ref = SandboxRef(
        backend=ref.backend,
        ref=ref.ref,
        session_id=spec.session_id,
        url=ref.url,
        kernel_id=ref.kernel_id,
        token=ref.token,
        runtime_dir=str(host_dir),
    )
    if not spec.die_with_parent:
        sandbox._recorded = sandbox.ref  # its row is removed when the sandbox stops
    log.info(
        "adopted docker sandbox %s (container %s%s)",
        spec.session_id,
        ref.ref[:12],
        ", its running cell was interrupted" if interrupted else "",
    )
    return sandbox


async def remove_recorded(backend: DockerBackend, ref: SandboxRef) -> None:
    """Force-remove a recorded container that is not adopted, and its socket directory; one of
    another instance is left alone (its own daemon adopts or removes it)."""
    from orchestrator.sandbox.docker_owned import remove_containers

    state, _mounted_at, instance = await _container_state(backend, ref.ref)
    if state != "gone" and not _ours(backend, instance):
        log.warning("container %s belongs to another prime-agent instance: kept", ref.ref[:12])
        return
    await asyncio.to_thread(remove_containers, [ref.ref], backend.docker)
    host_dir = _own_host_dir(ref.runtime_dir)
    if host_dir is not None:
        shutil.rmtree(host_dir, ignore_errors=True)


async def remove_unknown(backend: DockerBackend, known: set[str]) -> int:
    """Containers labelled with this daemon's socket that its table does not know (and this
    process did not start) are removed with their socket directories."""
    from orchestrator.sandbox.docker_owned import remove_containers

    if not backend.daemon_socket:
        return 0
    owned = await asyncio.to_thread(backend.list_owned)
    unknown = [
        c
        for c in owned
        if c.daemon == backend.daemon_socket and c.id not in known and c.host_pid != os.getpid()
    ]
    removed = await asyncio.to_thread(remove_containers, [c.id for c in unknown], backend.docker)
    for container in unknown:
        host_dir = _own_host_dir(container.host_dir)
        if host_dir is not None:
            shutil.rmtree(host_dir, ignore_errors=True)
        log.info(
            "removed unknown container %s (session %s)", container.id[:12], container.session_id
        )
    return removed
