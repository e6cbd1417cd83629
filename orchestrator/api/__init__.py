"""The control API: the daemon's Unix socket protocol, its server and its client (docs/protocol.md).

The CLI and the TUI import only this package to talk to the daemon. Its names load on first
use (PEP 562): importing one module of the package, ``orchestrator.api.client`` say, runs this
file first, and a plain ``prime-agent -p`` must not pay here for the server and the pydantic
models it never uses (docs/cli.md, "Start-up cost").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
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
    from orchestrator.api.messages import Event, Resync, Stream
    from orchestrator.api.protocol import (
        COMPACT_INSTRUCTIONS_MAX_CHARS,
        GOAL_OBJECTIVE_MAX_CHARS,
        MAX_ID_CHARS,
        REFINE_INSTRUCTIONS_MAX_CHARS,
        SCHEDULE_PROMPT_MAX_CHARS,
    )
    from orchestrator.api.sandbox_pod import SandboxPod, SandboxPodEvent
    from orchestrator.api.server import (
        ClientInfo,
        CommandHandler,
        ControlServer,
        SessionSnapshot,
    )
    from orchestrator.api.socket_file import default_socket_path
    from orchestrator.api.wire import CAP_STREAM, CLIENT_CAPABILITIES, PROTOCOL_VERSION
    from orchestrator.errors import ApiError

# Each public name → the module that defines it.
_HOMES: Final = {
    "ControlClient": "orchestrator.api.client",
    "request_sync": "orchestrator.api.client",
    "ApiCommandError": "orchestrator.api.errors",
    "ConnectionClosed": "orchestrator.api.errors",
    "DaemonAlreadyRunning": "orchestrator.api.errors",
    "DaemonNotRunning": "orchestrator.api.errors",
    "DaemonUnresponsive": "orchestrator.api.errors",
    "PermissionDenied": "orchestrator.api.errors",
    "ProtocolMismatch": "orchestrator.api.errors",
    "SocketPathError": "orchestrator.api.errors",
    "MAX_LINE_BYTES": "orchestrator.api.framing",
    "Event": "orchestrator.api.messages",
    "Resync": "orchestrator.api.messages",
    "Stream": "orchestrator.api.messages",
    "COMPACT_INSTRUCTIONS_MAX_CHARS": "orchestrator.api.protocol",
    "GOAL_OBJECTIVE_MAX_CHARS": "orchestrator.api.protocol",
    "MAX_ID_CHARS": "orchestrator.api.protocol",
    "REFINE_INSTRUCTIONS_MAX_CHARS": "orchestrator.api.protocol",
    "SCHEDULE_PROMPT_MAX_CHARS": "orchestrator.api.protocol",
    "SandboxPod": "orchestrator.api.sandbox_pod",
    "SandboxPodEvent": "orchestrator.api.sandbox_pod",
    "ClientInfo": "orchestrator.api.server",
    "CommandHandler": "orchestrator.api.server",
    "ControlServer": "orchestrator.api.server",
    "SessionSnapshot": "orchestrator.api.server",
    "default_socket_path": "orchestrator.api.socket_file",
    "CAP_STREAM": "orchestrator.api.wire",
    "CLIENT_CAPABILITIES": "orchestrator.api.wire",
    "PROTOCOL_VERSION": "orchestrator.api.wire",
    "ApiError": "orchestrator.errors",
}

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
    "SandboxPod",
    "SandboxPodEvent",
    "SessionSnapshot",
    "SocketPathError",
    "Stream",
    "default_socket_path",
    "request_sync",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
