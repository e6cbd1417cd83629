"""A pod's gateway reached from outside the cluster: a loopback port whose every connection is
a port-forward through the API server (``pods/portforward``, ``K8sApi.port_forward``).

The gateway client (``KernelGatewayClient``: HTTP and the kernel's WebSocket) talks to
``http://127.0.0.1:<port>`` as it would to the pod's IP; each connection it opens becomes one
forward to the pod's ``gateway_port``, relayed both ways until either side closes. ``close``
stops the listener and every relay. Chosen by ``[kubernetes] reach`` (docs/kubernetes.md,
"Reaching the gateway").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Final

from orchestrator.errors import SandboxError
from orchestrator.sandbox.k8s_api import IN_CLUSTER_ENV, K8sApi
from orchestrator.settings import KubernetesSettings

__all__ = ["LOOPBACK", "PodPortForward", "uses_port_forward"]

log = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"
RELAY_CHUNK: Final = 65536


def uses_port_forward(settings: KubernetesSettings) -> bool:
    """Whether ``settings.reach`` means port-forward here (``auto``: when not in a pod)."""
    if settings.reach == "auto":
        return not os.environ.get(IN_CLUSTER_ENV)
    return settings.reach == "port-forward"


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


class PodPortForward:
    """``url()`` -> a loopback URL that reaches ``port`` of pod ``pod`` (see the module)."""

    def __init__(self, api: K8sApi, pod: str, port: int) -> None:
        self.api = api
        self.pod = pod
        self.port = port
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    async def url(self) -> str:
        if self._server is None:
            self._server = await asyncio.start_server(self._accepted, LOOPBACK, 0)
        bound: int = self._server.sockets[0].getsockname()[1]
        return f"http://{LOOPBACK}:{bound}"

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._relays.discard(task)
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pod_socket: socket.socket = await asyncio.to_thread(
                self.api.port_forward, self.pod, self.port
            )
        except SandboxError as exc:
            log.warning("kubernetes: %s", exc)
            return
        pod_reader, pod_writer = await asyncio.open_connection(sock=pod_socket)
        try:
            await asyncio.gather(_copy(reader, pod_writer), _copy(pod_reader, writer))
        finally:
            pod_writer.close()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._relays):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._relays, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
