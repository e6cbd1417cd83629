"""Wiring the bus into the orchestrator: one NATS server, its admin connection, the router.

Each session gets its own NATS user when it is created (its credentials go to its sandbox as
environment) and loses it when it stops. Host requests arrive at the router, which hands them
to ``FamilyService`` with the caller's session id taken from the subject.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

from orchestrator.bus.router import HostRouter
from orchestrator.bus.server import EmbeddedNats
from orchestrator.paths import Paths
from orchestrator.sessions.manager import SessionBus

__all__ = ["NatsSessionBus"]


class NatsSessionBus(SessionBus):
    """An embedded nats-server private to this process (print mode without a daemon)."""

    def __init__(self, paths: Paths):
        # One instance per process: two print-mode runs must not share (and kill) a server.
        self.server = EmbeddedNats.from_paths(
            paths, instance=f"run-{os.getpid()}", reuse=False, die_with_parent=True
        )
        self.router: HostRouter | None = None
        self._nc: Any = None

    async def start(self, handlers: dict[str, Any]) -> None:
        await self.server.start()
        self._nc = await self.server.admin.connect()
        self.router = HostRouter(self._nc)
        for request_type, handler in handlers.items():
            self.router.register(request_type, handler)
        await self.router.start()

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        return (await self.server.add_session_user(session_id)).env()

    async def forget(self, session_id: str) -> None:
        await self.server.remove_session_user(session_id)

    async def close(self) -> None:
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        with contextlib.suppress(Exception):
            await self.server.stop()
        # A per-run server's JetStream store holds nothing that outlives the run.
        shutil.rmtree(self.server.store_dir, ignore_errors=True)
        shutil.rmtree(self.server.runtime_dir, ignore_errors=True)
