"""The daemon's bus: one embedded nats-server, instance ``daemon``, that outlives the process.

Unlike the print mode's private server, the daemon's is started with ``die_with_parent=False``
and ``reuse=True`` (``NatsSessionBus.for_daemon``): if the daemon crashes, the server and its
JetStream mailboxes (queued agent messages, R4) stay up, and the next daemon adopts it on the
same URL with the same session users, so sandboxes that survived reconnect by themselves. A
clean shutdown stops it; its state files are kept (they hold no session content, only users).
"""

from __future__ import annotations

from typing import Final

from orchestrator.paths import Paths
from orchestrator.sessions.bus_link import NatsSessionBus

__all__ = ["DAEMON_NATS_INSTANCE", "DaemonBus", "daemon_bus"]

# One name for the daemon's server: a restarted daemon finds (and adopts) the same one.
DAEMON_NATS_INSTANCE: Final = "daemon"

DaemonBus = NatsSessionBus


def daemon_bus(paths: Paths) -> NatsSessionBus:
    return NatsSessionBus.for_daemon(paths, DAEMON_NATS_INSTANCE)
