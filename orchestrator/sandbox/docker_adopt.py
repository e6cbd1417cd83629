"""Docker sandboxes that outlive their daemon: adopt, remove, and sweep unknown ones (R2, R8).

A daemon's containers (``SandboxSpec.die_with_parent`` off) keep running when the daemon is
killed: the gateway inside still listens on ``gateway.sock`` in the host directory that is
bind-mounted into the container. What died with the daemon is the host half of the NATS relay
(``nats.sock``); the kernel's NATS client keeps retrying (``runtime/host.py``) and reconnects
once the relay is back.

- ``reattach_container``: the container still runs; serve the relay again on the same
  ``nats.sock`` and reconnect a ``KernelGatewayClient`` to its socket with its token and
  kernel id (``reattach``: a cell still running is interrupted). ``DockerBackend.adopt`` makes
  a ``DockerSandbox`` of what it returns (``ReattachedContainer``).
- ``remove_recorded``: force-remove the container and its host directory.
- ``remove_unknown``: containers that carry this daemon's label (``LABEL_DAEMON``) but are not
  in its table (it died between ``docker run`` and recording them) are removed.

Each acts only on containers of the caller's instance (``LABEL_INSTANCE``: the state
directory's id, ``orchestrator/instance.py``): a recorded container that carries another
instance's label (a copied state directory) is neither adopted nor removed, only forgotten.
The backend passes what they need (its engine client, instance, daemon socket, timeouts):
nothing here imports ``docker.py``, which sits on top and calls these.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import SandboxRef
from orchestrator.sandbox.confined import gateway_client
from orchestrator.sandbox.docker_owned import (
    LABEL_INSTANCE,
    docker_errors,
    list_owned,
    remove_containers,
)
from orchestrator.sandbox.docker_run import (
    NATS_SOCKET,
    RUNTIME_DIR_PREFIX,
    SOCKET_SUBDIR,
)
from orchestrator.sandbox.docker_slots import CONTAINER_SNAPSHOT_DIR
from orchestrator.sandbox.gateway import KernelGatewayClient
from orchestrator.sandbox.reattach import reattach_within
from orchestrator.sandbox.relay import serve_unix_to_tcp

__all__ = [
    "ReattachedContainer",
    "reattach_container",
    "remove_recorded",
    "remove_unknown",
]

log = logging.getLogger(__name__)

LEGACY_INSTANCE: Final = "main"  # LABEL_INSTANCE of every container before instance ids


@dataclass(frozen=True)
class ReattachedContainer:
    """A running container an earlier daemon started, reconnected: its gateway client is
    attached to the recorded kernel and the host half of its NATS relay serves again."""

    host_dir: Path  # its host directory (our own: checked before anything was touched)
    client: KernelGatewayClient
    relay: asyncio.Server
    # Where its kernel sees its snapshots: the fixed path, or None (a container of an earlier
    # version mounted the host's path, which the kernel then uses as it is).
    kernel_snapshot_dir: str | None
    interrupted: bool  # a cell was still running and was interrupted


def _own_host_dir(recorded: str) -> Path | None:
    """``recorded`` when it is one of our socket directories (a direct child of the temp dir
    with our prefix): a path read back from the database or a label is never removed blindly."""
    if not recorded:
        return None
    path = Path(recorded)
    if path.parent.resolve() != Path(tempfile.gettempdir()).resolve():
        return None
    return path if path.name.startswith(RUNTIME_DIR_PREFIX) else None


def _ours(own_instance: str, instance: str) -> bool:
    """A recorded container's instance label is ``own_instance`` (or the fixed one of versions
    before instance ids: the row in this state directory's table names it)."""
    return instance in (own_instance, LEGACY_INSTANCE)


async def _container_state(docker: Any, container_id: str) -> tuple[str, set[str], str]:
    """The container's status ("gone" when removed), its mount destinations and its instance
    label."""
    errors = docker_errors()

    def get() -> tuple[str, set[str], str]:
        try:
            container = docker.containers.get(container_id)
        except errors.NotFound:
            return "gone", set(), ""
        mounts = container.attrs.get("Mounts") or []
        instance = str((container.labels or {}).get(LABEL_INSTANCE, ""))
        return str(container.status), {str(m.get("Destination", "")) for m in mounts}, instance

    try:
        return await asyncio.to_thread(get)
    except errors.DockerException as exc:
        raise SandboxError(f"docker: inspecting {container_id[:12]}: {exc}") from exc


async def reattach_container(
    docker: Any,
    ref: SandboxRef,
    *,
    instance: str,
    nats: Callable[[], tuple[str, int] | None],
    start_timeout_s: float,
    interrupt_grace_s: float,
) -> ReattachedContainer:
    """Reconnect to the running container ``ref`` of ``instance`` that an earlier daemon
    started; its relay forwards to ``nats()`` (the adopting sandbox's bus). ``SandboxError``
    when it is not ours, not running, or its kernel does not answer (nothing is left open)."""
    host_dir = _own_host_dir(ref.runtime_dir)
    if host_dir is None:
        raise SandboxError(f"container {ref.ref[:12]}: no socket directory recorded")
    state, mounted_at, labelled = await _container_state(docker, ref.ref)
    if state != "running":
        raise SandboxError(f"container {ref.ref[:12]} is {state}")
    if not _ours(instance, labelled):
        raise SandboxError(f"container {ref.ref[:12]} belongs to another prime-agent instance")
    socket_dir = host_dir / SOCKET_SUBDIR
    # The relay's host half died with the old daemon: serve nats.sock again (same path, the
    # container's end is bind-mounted) towards this session's bus.
    relay = await serve_unix_to_tcp(socket_dir / NATS_SOCKET, nats)
    client = gateway_client(socket_dir, ref.token)
    try:
        interrupted = await reattach_within(
            client,
            ref.kernel_id,
            what=f"container {ref.ref[:12]}",
            interrupt_grace_s=interrupt_grace_s,
            timeout_s=start_timeout_s,
        )
    except SandboxError:  # reattach_within closed the client; the relay goes too
        relay.close()
        raise
    snapshots_inside = CONTAINER_SNAPSHOT_DIR in mounted_at
    return ReattachedContainer(
        host_dir=host_dir,
        client=client,
        relay=relay,
        kernel_snapshot_dir=CONTAINER_SNAPSHOT_DIR if snapshots_inside else None,
        interrupted=interrupted,
    )


async def remove_recorded(docker: Any, ref: SandboxRef, *, instance: str) -> None:
    """Force-remove a recorded container that is not adopted, and its socket directory; one of
    another instance than ``instance`` is left alone (its own daemon adopts or removes it)."""
    state, _mounted_at, labelled = await _container_state(docker, ref.ref)
    if state != "gone" and not _ours(instance, labelled):
        log.warning("container %s belongs to another prime-agent instance: kept", ref.ref[:12])
        return
    await asyncio.to_thread(remove_containers, [ref.ref], docker)
    host_dir = _own_host_dir(ref.runtime_dir)
    if host_dir is not None:
        shutil.rmtree(host_dir, ignore_errors=True)


async def remove_unknown(docker: Any, known: set[str], *, instance: str, daemon_socket: str) -> int:
    """Containers of ``instance`` labelled with the daemon socket ``daemon_socket`` that its
    table does not know (``known``; and this process did not start) are removed with their
    socket directories. No daemon socket: none."""
    if not daemon_socket:
        return 0
    owned = await asyncio.to_thread(partial(list_owned, docker, instance=instance))
    unknown = [
        c
        for c in owned
        if c.daemon == daemon_socket and c.id not in known and c.host_pid != os.getpid()
    ]
    removed = await asyncio.to_thread(remove_containers, [c.id for c in unknown], docker)
    for container in unknown:
        host_dir = _own_host_dir(container.host_dir)
        if host_dir is not None:
            shutil.rmtree(host_dir, ignore_errors=True)
        log.info(
            "removed unknown container %s (session %s)", container.id[:12], container.session_id
        )
    return removed
