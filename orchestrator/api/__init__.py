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
from orchestrator.api.protocol import (
    CAP_STREAM,
    CLIENT_CAPABILITIES,
    COMPACT_INSTRUCTIONS_MAX_CHARS,
    GOAL_OBJECTIVE_MAX_CHARS,
    MAX_ID_CHARS,
    PROTOCOL_VERSION,
    REFINE_INSTRUCTIONS_MAX_CHARS,
    SCHEDULE_PROMPT_MAX_CHARS,
    Event,
    Resync,
    Stream,
)
from orchestrator.api.server import (
    ClientInfo,
    CommandHandler,
    ControlServer,
    SessionSnapshot,
    default_socket_path,
)
from orchestrator.errors import ApiError

__all__ = [
    "CAP_STREAM",
    "CLIENT_CAPABILITIES",
    "COMPACT_INSTRUCTIONS_MAX_CHARS",
    "GOAL_OBJECTIVE_MAX_CHARS",
    "MAX_ID_CHARS",
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "REFINE_INSTRUCTIONS_MAX_CHARS",
    "SCHEDULE_PROMPT_MAX_CHARS",
    "ApiCommandError",
    "ApiError",
    "ClientInfo",
    "CommandHandler",
    "ConnectionClosed",
    "ControlClient",
    "ControlServer",
    "DaemonAlreadyRunning",
    "DaemonNotRunning",
    "DaemonUnresponsive",
    "Event",
    "PermissionDenied",
    "ProtocolMismatch",
    "Resync",
    "SessionSnapshot",
    "SocketPathError",
    "Stream",
    "default_socket_path",
    "request_sync",
]
