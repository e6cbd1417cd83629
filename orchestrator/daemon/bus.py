"""The daemon's bus: one embedded nats-server, instance ``daemon``, that outlives the process.

Unlike the print mode's private server (``sessions/bus_link.py``: per process, dies with it,
its directories removed afterwards), the daemon's server is started with
``die_with_parent=False`` and ``reuse=True``: if the daemon crashes, the server and its
JetStream mailboxes (queued agent messages, R4) stay up, and the next daemon adopts it on the
same URL with the same session users, so sandboxes that survived reconnect by themselves. A clean
shutdown stops it; its state files are kept (they hold no session content, only users).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

from orchestrator.bus.router import HostRouter
from orchestrator.bus.server import EmbeddedNats
from orchestrator.paths import Paths
from orchestrator.sessions.bus_link import MailboxBus

__all__ = ["DAEMON_NATS_INSTANCE", "DaemonBus"]

log = logging.getLogger(__name__)

# One name for the daemon's server: a restarted daemon finds (and adopts) the same one.
DAEMON_NATS_INSTANCE: Final = "daemon"


class DaemonBus(MailboxBus):
    """NATS for the daemon: server, admin connection, host-request router, mailboxes (R4)."""

    def __init__(self, paths: Paths):
        self.server = EmbeddedNats.from_paths(
            paths, instance=DAEMON_NATS_INSTANCE, reuse=True, die_with_parent=False
        )
        self.router: HostRouter | None = None
        self._nc: Any = None

    async def start(self, handlers: dict[str, Any]) -> None:
        await self.server.start()
        if self.server.reused:
            log.info("adopted the NATS server left by a previous daemon (pid %d)", self.server.pid)
        self._nc = await self.server.admin.connect()
        # The mailboxes are JetStream state of this server: an adopted server still holds the
        # messages a crashed daemon had accepted, and the daemon redelivers them at start.
        await self._open_mailbox(self._nc)
        self.router = HostRouter(self._nc)
        for request_type, handler in handlers.items():
            self.router.register(request_type, handler)
        await self.router.start()

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        return (await self.server.add_session_user(session_id)).env()

    async def forget(self, session_id: str) -> None:
        await self.server.remove_session_user(session_id)

    async def close(self) -> None:
        """Stop routing and stop the server (a clean shutdown leaves no nats-server, R8)."""
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        with contextlib.suppress(Exception):
            await self.server.stop()
