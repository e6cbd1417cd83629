"""The daemon's bus: one embedded nats-server, instance ``daemon``, that outlives the process.

Unlike the print mode's private server, the daemon's is started with ``die_with_parent=False``
and ``reuse=True`` (``NatsSessionBus.for_daemon``): if the daemon crashes, the server and its
JetStream mailboxes (queued agent messages, R4) stay up, and the next daemon adopts it on the
same URL with the same session users, so sandboxes that survived reconnect by themselves. A
clean shutdown stops it; its state files are kept (they hold no session content, only users).

With ``[nats] url`` in config.toml the daemon starts no server: it uses that external one in
operator mode (docs/bus.md, External NATS server), with a mailbox namespace kept in its data
directory so a restarted daemon finds the messages it had accepted.
"""

from __future__ import annotations

from typing import Final

from orchestrator.paths import Paths
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.settings import NatsSettings, load_settings

__all__ = ["DAEMON_NATS_INSTANCE", "DaemonBus", "daemon_bus"]

# One name for the daemon's server: a restarted daemon finds (and adopts) the same one.
DAEMON_NATS_INSTANCE: Final = "daemon"

DaemonBus = NatsSessionBus


def daemon_bus(paths: Paths, nats: NatsSettings | None = None) -> NatsSessionBus:
    """The daemon's bus; ``nats`` defaults to the ``[nats]`` section of the config file."""
    if nats is None:
        nats = load_settings(paths.config_file).nats
    return NatsSessionBus.for_daemon(paths, DAEMON_NATS_INSTANCE, nats)
