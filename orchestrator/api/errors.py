"""The control API's exceptions, all ``orchestrator.errors.ApiError`` (code + message).

Those a person can act on (no daemon, a daemon of another version, another daemon already on the
socket) are also ``UserError``: the CLI prints them as one line.

Every error code the daemon sends (``orchestrator.api.wire.ERROR_CODES``) has the class a
client raises for it in ``WIRE_ERROR_CLASSES``; ``error_from_wire`` builds it. The whole tree is
drawn in ``orchestrator/errors.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from orchestrator.api.wire import E_PERMISSION_DENIED, E_VERSION_MISMATCH, ERROR_CODES
from orchestrator.errors import ApiError, UserError

__all__ = [
    "WIRE_ERROR_CLASSES",
    "ApiCommandError",
    "ConnectionClosed",
    "DaemonAlreadyRunning",
    "DaemonNotRunning",
    "DaemonUnresponsive",
    "PermissionDenied",
    "ProtocolMismatch",
    "SocketPathError",
    "error_from_wire",
]

# Codes for failures that never travel on the wire (the connection is gone or never existed).
CODE_CONNECTION_CLOSED = "connection_closed"
CODE_NOT_RUNNING = "not_running"
CODE_UNRESPONSIVE = "unresponsive"
CODE_ALREADY_RUNNING = "already_running"
CODE_BAD_SOCKET_PATH = "bad_socket_path"
CODE_PERMISSION_DENIED = "permission_denied"  # same string as wire.E_PERMISSION_DENIED


class ApiCommandError(ApiError):
    """A command failed with a wire error code.

    Handlers raise it to answer ``{ok: false, error: {code, message}}``; the client raises it
    when such an answer arrives.
    """


class ConnectionClosed(ApiError):
    """The connection ended before the answer arrived (daemon exit, refusal, backpressure)."""

    def __init__(self, message: str = "the daemon closed the connection"):
        super().__init__(CODE_CONNECTION_CLOSED, message)


class ProtocolMismatch(UserError, ApiError):
    """Client and daemon speak different protocol versions."""


class DaemonNotRunning(UserError, ApiError):
    """Nothing listens on the socket."""

    def __init__(self, message: str):
        super().__init__(CODE_NOT_RUNNING, message)


class DaemonUnresponsive(UserError, ApiError):
    """Something holds the socket but did not complete the handshake in time (a daemon that is
    wedged or very busy)."""

    def __init__(self, message: str):
        super().__init__(CODE_UNRESPONSIVE, message)


class DaemonAlreadyRunning(UserError, ApiError):
    """Another live daemon answers on the socket this server was asked to bind."""

    def __init__(self, message: str):
        super().__init__(CODE_ALREADY_RUNNING, message)


class SocketPathError(UserError, ApiError):
    """The socket path is unusable: too long, not a socket, or in a directory we do not own."""

    def __init__(self, message: str):
        super().__init__(CODE_BAD_SOCKET_PATH, message)


class PermissionDenied(UserError, ApiError):
    """The socket or the daemon refused this user."""

    def __init__(self, message: str):
        super().__init__(CODE_PERMISSION_DENIED, message)


# The class a client raises for each wire code: the two a person acts on at connect time have
# their own; every other code is a failed command (``ApiCommandError``, ``.code`` says which).
_OWN_CLASSES: Final[Mapping[str, type[ApiError]]] = {
    E_VERSION_MISMATCH: ProtocolMismatch,
    E_PERMISSION_DENIED: PermissionDenied,
}
WIRE_ERROR_CLASSES: Final[Mapping[str, type[ApiError]]] = MappingProxyType(
    {code: _OWN_CLASSES.get(code, ApiCommandError) for code in sorted(ERROR_CODES)}
)


def error_from_wire(code: str, message: str) -> ApiError:
    """The exception for a wire error ``{code, message}``; an unknown code (a newer daemon) is an
    ``ApiCommandError`` that keeps it."""
    cls = WIRE_ERROR_CLASSES.get(code, ApiCommandError)
    if cls is PermissionDenied:
        return PermissionDenied(message)
    return cls(code, message)
