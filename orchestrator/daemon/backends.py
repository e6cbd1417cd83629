"""The daemon's sandbox backends: ``local`` always, ``docker`` when an engine answers,
``bwrap`` when bubblewrap runs a sandbox here, ``kubernetes`` when the cluster of
``[kubernetes]`` answers and the daemon has a reason to ask it.

Every sandbox the daemon starts outlives it (``die_with_parent`` off, R2): each backend gets
the ``SandboxRegistry`` as its listener, so the store knows every live sandbox, and each keeps
its warm pool of such sandboxes (docker's fills for the workspace most recently used).

Docker is looked at when the daemon starts and again when a session asks for it while the
daemon has none (the session image may have been built since); bwrap is probed once, when the
daemon starts (``sandbox/bwrap_probe.py``: installing bubblewrap needs a daemon restart). Both
are known before the daemon adopts the sandboxes a predecessor left.

Kubernetes is asked for only when it is wanted (``auto`` never picks it): at start when
``$PRIME_AGENT_BACKEND`` is ``kubernetes`` or the store recorded a pod of a predecessor (so
the daemon adopts or removes it, and sweeps the unrecorded pods of its instance), and again
when a session asks for it while the daemon has none (at most once per
``KUBERNETES_RECHECK_S``). It is built by ``KubernetesBackend.from_settings`` with the
daemon's instance id (its pods' ``prime-agent/instance`` label) and pods that outlive it.

Which backend a session
gets follows ``orchestrator/sandbox/choice.py``; a session created without one gets
``$PRIME_AGENT_BACKEND`` of the daemon's environment (the variable ``--backend`` reads), else
``auto``. The choice's warning (``local``: NOT isolated) is logged here and sent back in the
create-session and import replies, which the CLI and the TUI show.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Final

from orchestrator.errors import PrimeAgentError
from orchestrator.paths import Paths
from orchestrator.sandbox.base import SandboxBackend, SandboxListener
from orchestrator.sandbox.choice import BackendChoice, choose_backend
from orchestrator.sandbox.local import LocalBackend
from orchestrator.settings import Settings

if TYPE_CHECKING:
    from orchestrator.sandbox.bwrap import BwrapBackend
    from orchestrator.sandbox.docker import DockerBackend
    from orchestrator.sandbox.kubernetes import KubernetesBackend

__all__ = [
    "BACKEND_ENV",
    "DEFAULT_BACKEND",
    "DOCKER_RECHECK_S",
    "KUBERNETES",
    "KUBERNETES_RECHECK_S",
    "DaemonBackends",
]

log = logging.getLogger(__name__)

BACKEND_ENV: Final = "PRIME_AGENT_BACKEND"
DEFAULT_BACKEND: Final = "auto"
# While docker is not usable, a session asking for it looks again at most this often (an engine
# that hangs must not slow down every create_session).
DOCKER_RECHECK_S: Final = 30.0
KUBERNETES: Final = "kubernetes"
# The same for a cluster that did not answer (each look may wait for its API server).
KUBERNETES_RECHECK_S: Final = 30.0


class DaemonBackends:
    """Builds and holds the daemon's backends; ``all`` is what the ``Orchestrator`` uses."""

    def __init__(
        self,
        settings: Settings,
        *,
        listener: SandboxListener,
        socket_path: Path,
        paths: Paths | None = None,  # its data dir's instance id marks our containers
    ):
        self.settings = settings
        self.listener = listener
        self.socket_path = socket_path
        self.paths = paths
        self.local = LocalBackend(
            pool_size=settings.warm_pool_size,
            pool_die_with_parent=False,
            interrupt_grace_s=settings.interrupt_grace_s,
            output_cap_chars=settings.output_cap_chars,
            workspace_mode=settings.sandbox.workspace,
            owner=str(socket_path),  # marks its gateways, like docker's LABEL_DAEMON
        )
        self.local.listener = listener
        self.docker: DockerBackend | None = None
        self.docker_why = "not checked yet"
        self.bwrap: BwrapBackend | None = None
        self.bwrap_why = "not checked yet"
        self.kubernetes: KubernetesBackend | None = None
        self.kubernetes_why = "not checked yet"
        self._k8s_lock = asyncio.Lock()
        self._k8s_checked_at: float | None = None  # loop time of the last look for the cluster
        self.all: dict[str, SandboxBackend] = {self.local.name: self.local}
        self._lock = asyncio.Lock()
        self._checked_at: float | None = None  # loop time of the last look for docker

    async def start(self, recorded: Collection[str] = ()) -> None:
        """Look for docker and bwrap (in threads: the engine may be slow to answer), and for
        the cluster when it is the daemon's default or ``recorded`` (the backends of the
        sandboxes a predecessor left) names it."""
        await asyncio.gather(self._try_docker(), self._try_bwrap())
        # After docker: both clients import `requests` in a thread, and two threads importing
        # it at once can see it half-initialized (its modules import each other).
        if os.environ.get(BACKEND_ENV) == KUBERNETES or KUBERNETES in recorded:
            await self._try_kubernetes()

    def start_pools(self) -> None:
        self.local.start_pool()
        if self.docker is not None:
            self.docker.start_pool()  # fills once a workspace was used

    async def choose(self, requested: str | None) -> BackendChoice:
        """The backend for a new session (``UserError`` for a bad or unusable one)."""
        requested = requested or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
        if requested in ("auto", "docker") and self.docker is None:
            await self._try_docker()
        if requested == KUBERNETES and self.kubernetes is None:
            await self._try_kubernetes()
        choice = choose_backend(
            requested,
            lambda: (self.docker is not None, self.docker_why),
            lambda: (self.bwrap is not None, self.bwrap_why),
            kubernetes_status=lambda: (self.kubernetes is not None, self.kubernetes_why),
        )
        if choice.warning:
            log.warning(choice.warning)
        return choice

    async def _try_docker(self) -> None:
        async with self._lock:
            now = asyncio.get_running_loop().time()
            recent = self._checked_at is not None and now - self._checked_at < DOCKER_RECHECK_S
            if self.docker is not None or recent:
                return
            self._checked_at = now
            from orchestrator.sandbox.docker import docker_usable
            from orchestrator.sandbox.images import resolve_image

            image = resolve_image(self.settings.sandbox.image)
            usable, why = await asyncio.to_thread(docker_usable, image)
            if usable:
                try:
                    self.docker = await asyncio.to_thread(self._new_docker)
                except PrimeAgentError as exc:  # the engine went away in between
                    why = str(exc)
            self.docker_why = why
            if self.docker is None:
                log.info("docker backend not available: %s", why)
                return
            self.all[self.docker.name] = self.docker
            log.info("docker backend available (image %s)", self.docker.image)

    async def _try_bwrap(self) -> None:
        from orchestrator.sandbox.bwrap_probe import bwrap_usable

        usable, why = await asyncio.to_thread(bwrap_usable)
        self.bwrap_why = why
        if not usable:
            log.info("bwrap backend not available: %s", why)
            return
        from orchestrator.sandbox.bwrap import BwrapBackend

        # Its sandboxes outlive the daemon and carry its socket (remove_unknown finds them).
        bwrap = BwrapBackend.from_settings(
            self.settings, pool_die_with_parent=False, owner=str(self.socket_path)
        )
        bwrap.listener = self.listener
        self.bwrap = bwrap
        self.all[bwrap.name] = bwrap
        log.info("bwrap backend available")

    async def _try_kubernetes(self) -> None:
        async with self._k8s_lock:
            now = asyncio.get_running_loop().time()
            checked = self._k8s_checked_at
            if self.kubernetes is not None or (
                checked is not None and now - checked < KUBERNETES_RECHECK_S
            ):
                return
            self._k8s_checked_at = now
            from orchestrator.sandbox.k8s_status import kubernetes_usable

            usable, why = await asyncio.to_thread(kubernetes_usable, self.settings.kubernetes)
            if usable:
                try:
                    self.kubernetes = await asyncio.to_thread(self._new_kubernetes)
                except PrimeAgentError as exc:  # the configuration changed in between
                    why = str(exc)
            self.kubernetes_why = why
            if self.kubernetes is None:
                log.info("kubernetes backend not available: %s", why)
                return
            self.all[self.kubernetes.name] = self.kubernetes
            log.info(
                "kubernetes backend available (namespace %s)", self.settings.kubernetes.namespace
            )

    def _new_kubernetes(self) -> KubernetesBackend:
        from orchestrator.instance import instance_id
        from orchestrator.sandbox.kubernetes import KubernetesBackend

        # Its pods carry the daemon's instance id (what it adopts and removes is only its
        # own) and outlive it, its warm pool's too.
        kubernetes = KubernetesBackend.from_settings(
            self.settings,
            instance=instance_id(self.paths or Paths.from_env()),
            pool_die_with_parent=False,
        )
        kubernetes.listener = self.listener
        return kubernetes

    def _new_docker(self) -> DockerBackend:
        from orchestrator.instance import instance_id
        from orchestrator.sandbox.docker import DockerBackend

        # The instance id of the daemon's state dir: what it reaps and adopts is only its own.
        paths = self.paths or Paths.from_env()
        # The sandbox policy of the daemon's config (image, workspace mode, limits).
        docker = DockerBackend.from_settings(
            self.settings,
            pool_die_with_parent=False,
            daemon_socket=str(self.socket_path),
            instance=instance_id(paths),
            state_dir=paths.data_dir,
        )
        docker.listener = self.listener
        return docker
