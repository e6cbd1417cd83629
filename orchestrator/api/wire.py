"""The control protocol's words: its version, capabilities and error codes (no pydantic).

Both sides use them: the daemon's pydantic models (``protocol.py``, which re-exports every name
here) and the lean client (``client.py``), which a plain ``prime-agent -p`` loads without
pydantic (docs/cli.md, "Start-up cost"). Everything here is a constant or plain text, so
importing it costs nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CAP_EVENTS",
    "CAP_IDEMPOTENCY",
    "CAP_RESYNC",
    "CAP_STREAM",
    "CLIENT_CAPABILITIES",
    "ERROR_CODES",
    "E_BUSY",
    "E_CONFLICT",
    "E_HANDSHAKE_REQUIRED",
    "E_HANDSHAKE_TIMEOUT",
    "E_INTERNAL",
    "E_INVALID_ARGUMENT",
    "E_INVALID_COMMAND",
    "E_LINE_TOO_LONG",
    "E_NOT_FOUND",
    "E_PARSE_ERROR",
    "E_PERMISSION_DENIED",
    "E_RESULT_TOO_LARGE",
    "E_SHUTTING_DOWN",
    "E_UNKNOWN_COMMAND",
    "E_VERSION_MISMATCH",
    "PROTOCOL_VERSION",
    "SERVER_CAPABILITIES",
    "STREAM_EVENT_TYPES",
    "WAIT_QUIET_DEFAULT_S",
    "version_mismatch_message",
]

# Bump on any incompatible wire change; docs/protocol.md quotes it and a test checks that it does.
PROTOCOL_VERSION: Final = 1

# Capabilities. A feature used only when both sides list it; the intersection is stored per client.
CAP_EVENTS: Final = "events"  # attach/detach and pushed `event` messages
CAP_RESYNC: Final = "resync"  # the client understands `resync` after it fell behind
CAP_IDEMPOTENCY: Final = "idempotency"  # repeated mutating commands return the stored response
# Pushed `stream` messages (text deltas, tool and compaction starts) of attached sessions: never
# stored, dropped for a client that falls behind. Opt-in: a client lists it in its hello.
CAP_STREAM: Final = "stream"
SERVER_CAPABILITIES: tuple[str, ...] = (CAP_EVENTS, CAP_RESYNC, CAP_IDEMPOTENCY, CAP_STREAM)
CLIENT_CAPABILITIES: tuple[str, ...] = (CAP_EVENTS, CAP_RESYNC, CAP_IDEMPOTENCY)
# The transient events a `stream` message carries (the agent loop's sink emits them without a
# seq; durable events go out as `event`).
STREAM_EVENT_TYPES: frozenset[str] = frozenset(
    {"text_delta", "thinking_delta", "tool_start", "compaction_start"}
)

# `wait_quiet`'s bound when a client gives none: the settings' FAMILY_WAIT_TIMEOUT_S
# (tests/unit/test_run_settings.py keeps them equal). The lean -p client sends it when
# config.toml sets no other.
WAIT_QUIET_DEFAULT_S: Final = 3600.0

# Error codes: the `code` of `response.error` and of connection-level `error` messages.
E_PARSE_ERROR: Final = "parse_error"  # the line is not UTF-8 JSON holding an object
E_LINE_TOO_LONG: Final = "line_too_long"  # the line passed MAX_LINE_BYTES; the rest was discarded
E_HANDSHAKE_REQUIRED: Final = "handshake_required"  # the first message was not `hello`
E_HANDSHAKE_TIMEOUT: Final = "handshake_timeout"  # no `hello` within the handshake timeout
E_VERSION_MISMATCH: Final = "version_mismatch"  # the client speaks another protocol version
E_UNKNOWN_COMMAND: Final = "unknown_command"  # `type` names no command this daemon knows
E_INVALID_COMMAND: Final = "invalid_command"  # a known command with missing, extra or bad fields
E_INVALID_ARGUMENT: Final = "invalid_argument"  # well-formed, but the handler rejects a value
E_NOT_FOUND: Final = "not_found"  # the session (or other object) does not exist
E_CONFLICT: Final = "conflict"  # a command id reused for a different command
E_BUSY: Final = "busy"  # the target cannot take this now (try again or use follow_up)
E_PERMISSION_DENIED: Final = "permission_denied"  # the peer's uid is not the daemon's
E_RESULT_TOO_LARGE: Final = "result_too_large"  # the reply would pass MAX_LINE_BYTES
E_SHUTTING_DOWN: Final = "shutting_down"  # the daemon is stopping
E_INTERNAL: Final = "internal"  # a bug in the daemon; details are in its log, never on the wire
ERROR_CODES: frozenset[str] = frozenset(
    {
        E_PARSE_ERROR,
        E_LINE_TOO_LONG,
        E_HANDSHAKE_REQUIRED,
        E_HANDSHAKE_TIMEOUT,
        E_VERSION_MISMATCH,
        E_UNKNOWN_COMMAND,
        E_INVALID_COMMAND,
        E_INVALID_ARGUMENT,
        E_NOT_FOUND,
        E_CONFLICT,
        E_BUSY,
        E_PERMISSION_DENIED,
        E_RESULT_TOO_LARGE,
        E_SHUTTING_DOWN,
        E_INTERNAL,
    }
)


def version_mismatch_message(client_version: int, server_version: int) -> str:
    """What either side says when the other speaks another protocol version."""
    return (
        f"control protocol mismatch: client speaks version {client_version}, the daemon speaks "
        f"version {server_version}; restart the daemon so it runs the installed version, or "
        "upgrade the older side"
    )
