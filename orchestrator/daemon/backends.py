"""The daemon's sandbox backends: ``local`` always, ``docker`` when an engine answers,
``bwrap`` when bubblewrap runs a sandbox here.

Every sandbox the daemon starts outlives it (``die_with_parent`` off, R2): each backend gets
the ``SandboxRegistry`` as its listener, so the store knows every live sandbox, and each keeps
its warm pool of such sandboxes (docker's fills for the workspace most recently used).

Docker is looked at when the daemon starts and again when a session asks for it while the
daemon has none (the session image may have been built since); bwrap is probed once, when the
daemon starts (``sandbox/bwrap_probe.py``: installing bubblewrap needs a daemon restart). Both
are known before the daemon adopts the sandboxes a predecessor left. Which backend a session
gets follows ``orchestrator/sandbox/choice.py``; a session created without one gets
``$PRIME_AGENT_BACKEND`` of the daemon's environment (the variable ``--backend`` reads), else
``auto``. The choice's warning (``local``: NOT isolated) is logged here and sent back in the
create-session and import replies, which the CLI and the TUI show.
"""

from __future__ import annotations

import asyncio
import logging
import os
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

__all__ = ["BACKEND_ENV", "DEFAULT_BACKEND", "DOCKER_RECHECK_S", "DaemonBackends"]

log = logging.getLogger(__name__)

BACKEND_ENV: Final = "PRIME_AGENT_BACKEND"
DEFAULT_BACKEND: Final = "auto"
# While docker is not usable, a session asking for it looks again at most this often (an engine
# that hangs must not slow down every create_session).
DOCKER_RECHECK_S: Final = 30.0


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
        self.all: dict[str, SandboxBackend] = {self.local.name: self.local}
        self._lock = asyncio.Lock()
        self._checked_at: float | None = None  # loop time of the last look for docker

    async def start(self) -> None:
        """Look for docker and bwrap (in threads: the engine may be slow to answer)."""
        await asyncio.gather(self._try_docker(), self._try_bwrap())

    def start_pools(self) -> None:
        self.local.start_pool()
        if self.docker is not None:
            self.docker.start_pool()  # fills once a workspace was used

    async def choose(self, requested: str | None) -> BackendChoice:
        """The backend for a new session (``UserError`` for a bad or unusable one)."""
        requested = requested or os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
        if requested in ("auto", "docker") and self.docker is None:
            await self._try_docker()
        choice = choose_backend(
            requested,
            lambda: (self.docker is not None, self.docker_why),
            lambda: (self.bwrap is not None, self.bwrap_why),
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
