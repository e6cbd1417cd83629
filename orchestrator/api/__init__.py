"""The control API: the daemon's Unix socket protocol, its server and its client (docs/protocol.md).

The CLI and the TUI import only this package to talk to the daemon.
"""

from __future__ import annotations

from orchestrator.api.client import ControlClient, request_sync
from orchestrator.api.errors import (
    ApiCommandError,
    ConnectionClosed,
    DaemonAlreadyRunning,
    DaemonNotRunning,
    DaemonUnresponsive,
    PermissionDenied,
    ProtocolMismatch,
    SocketPathError,
)
from orchestrator.api.framing import MAX_LINE_BYTES
from orchestrator.api.protocol import PROTOCOL_VERSION
from orchestrator.api.server import (
    ClientInfo,
    CommandHandler,
    ControlServer,
    SessionSnapshot,
    default_socket_path,
)

__all__ = [
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "ApiCommandError",
    "ClientInfo",
    "CommandHandler",
    "ConnectionClosed",
    "ControlClient",
    "ControlServer",
    "DaemonAlreadyRunning",
    "DaemonNotRunning",
    "DaemonUnresponsive",
    "PermissionDenied",
    "ProtocolMismatch",
    "SessionSnapshot",
    "SocketPathError",
    "default_socket_path",
    "request_sync",
]
