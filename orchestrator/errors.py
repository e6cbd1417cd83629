"""One exception tree for the whole orchestrator.

Foreign exceptions (litellm, httpx, websockets, duckdb, OS errors) are translated into these where
they enter, so callers above the boundary catch only ``PrimeAgentError`` subclasses. A
``UserError`` is something the person at the keyboard can fix: the CLI prints its message as one
line and exits with ``EXIT_USAGE``; anything else is a bug or an outage and keeps its traceback
behind ``--debug``.

The tree (``+ X``: also a subclass of ``X``; ``(api)``: defined in ``orchestrator/api/errors.py``,
the control API's own, which import this module; ``tests/unit/test_public_api.py`` checks this
drawing against the classes)::

    PrimeAgentError                  raised on purpose; anything else is a bug
    ├── UserError                    the user can fix it: one line, exit 2
    │   ├── ConfigError              a config file or option value
    │   ├── DaemonRefused            .code: the daemon's wire error code (CLI clients)
    │   ├── ScheduleSpecError        a schedule or heartbeat spec
    │   └── GoalError                .code: a host wire code
    ├── ModelError                   .error_class: the failure in one word
    │   ├── ModelNotFound            + UserError
    │   ├── MissingCredentials       + UserError
    │   ├── ModelUnreachable         + UserError
    │   ├── EmbeddedModelError       + UserError
    │   └── ProviderError            .status, .retryable
    │       └── EmptyReply
    ├── SandboxError
    │   ├── SandboxStartError
    │   └── KernelDied
    ├── BusError
    ├── StoreError
    │   └── StoreLocked              + UserError
    ├── IllegalTransition            a session state change its lifecycle forbids (a bug)
    ├── ApiError                     .code: a control API wire code
    │   ├── ApiCommandError          (api) a command failed; most wire codes
    │   ├── ConnectionClosed         (api)
    │   ├── ProtocolMismatch         (api) + UserError; wire code version_mismatch
    │   ├── PermissionDenied         (api) + UserError; wire code permission_denied
    │   ├── DaemonNotRunning         (api) + UserError
    │   ├── DaemonUnresponsive       (api) + UserError
    │   ├── DaemonAlreadyRunning     (api) + UserError
    │   └── SocketPathError          (api) + UserError
    ├── HarnessError                 .code: a host wire code
    │   ├── HarnessInvalid           invalid_argument
    │   ├── HarnessNotFound          not_found
    │   ├── HarnessConflict          conflict
    │   └── HarnessQuota             quota_exceeded
    └── McpError                     .code: a host wire code (an MCP server or call failed)

Wire codes: each code the daemon sends on the control socket
(``orchestrator.api.wire.ERROR_CODES``) maps to the ``ApiError`` class a client raises
(``orchestrator.api.errors.WIRE_ERROR_CLASSES``). Each host-request code a kernel receives
(``orchestrator.runtime.wire.ERROR_CODES``) maps to the kernel's own exception class
(``orchestrator.runtime.errors.ERROR_CLASSES``, stdlib only, not part of this tree); the
``.code`` of ``HarnessError``, ``GoalError`` and ``McpError`` is one of those codes, passed on
unchanged.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "BusError",
    "ConfigError",
    "DaemonRefused",
    "EmbeddedModelError",
    "EmptyReply",
    "GoalError",
    "HarnessConflict",
    "HarnessError",
    "HarnessInvalid",
    "HarnessNotFound",
    "HarnessQuota",
    "IllegalTransition",
    "KernelDied",
    "McpError",
    "MissingCredentials",
    "ModelError",
    "ModelNotFound",
    "ModelUnreachable",
    "PrimeAgentError",
    "ProviderError",
    "SandboxError",
    "SandboxStartError",
    "ScheduleSpecError",
    "StoreError",
    "StoreLocked",
    "UserError",
]


class PrimeAgentError(Exception):
    """Base of every error this package raises on purpose."""


class UserError(PrimeAgentError):
    """Bad input or setup the user can fix; printed as one line, exit code 2."""


class DaemonRefused(UserError):
    """The daemon refused a command; ``code`` is its wire error code (``api/wire.py``), so a
    client can tell one refusal from another without reading the message."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ConfigError(UserError):
    """A config file or option value is invalid."""


class ModelError(PrimeAgentError):
    """Something went wrong talking to a language model.

    ``error_class`` names the kind of failure in one word (``rate_limited``, ``server_error``,
    ``timeout``, ``stream_cut``, ``bad_response``, ``empty_reply``, ...): a failed turn's
    ``turn_end`` and ``error`` events carry it, so a reader branches on it, not on the text.
    """

    error_class: str = "model_error"


class ModelNotFound(UserError, ModelError):
    """The model selector names nothing we can call."""

    error_class = "model_not_found"


class MissingCredentials(UserError, ModelError):
    """The provider needs a key that is not set."""

    error_class = "credentials"


class ModelUnreachable(UserError, ModelError):
    """The endpoint did not answer (connection refused, DNS, TLS) after retries."""

    error_class = "unreachable"


class EmbeddedModelError(UserError, ModelError):
    """The embedded local model is missing, corrupt or failed to start."""

    error_class = "embedded_model"


class ProviderError(ModelError):
    """The provider answered with an error we gave up retrying (5xx, 429, bad reply)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        error_class: str = "provider_error",
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.error_class = error_class


class EmptyReply(ProviderError):
    """The model answered with nothing (no text, no tool call) again after one retry: never a
    completed answer (docs/agent-loop.md)."""

    def __init__(self, message: str):
        super().__init__(message, error_class="empty_reply")


class SandboxError(PrimeAgentError):
    """A sandbox (kernel gateway, container, pod) misbehaved."""


class SandboxStartError(SandboxError):
    """A sandbox could not be started."""


class KernelDied(SandboxError):
    """The kernel went away during or between executions."""


class BusError(PrimeAgentError):
    """The message bus (nats-server, a NATS connection, JetStream) failed or refused."""


class StoreError(PrimeAgentError):
    """The DuckDB store failed (I/O error, disk full, corrupt file)."""


class StoreLocked(UserError, StoreError):
    """Another process holds the database file."""


class IllegalTransition(PrimeAgentError):
    """A session was asked to change state along an arrow its lifecycle does not draw
    (``orchestrator/store/lifecycle.py``): a bug in the caller, never the user's doing. The
    message is one line; ``session_id``, ``old``, ``new`` and ``why`` say which change it was."""

    def __init__(self, session_id: str, old: str, new: str, why: str, allowed: list[str]):
        ways = ", ".join(allowed) if allowed else "nowhere"
        super().__init__(
            f"session {session_id} cannot go from {old} to {new} on {why} "
            f"({why} from {old} goes to: {ways})"
        )
        self.session_id = session_id
        self.old = old
        self.new = new
        self.why = why


class ApiError(PrimeAgentError):
    """The control API (the daemon's Unix socket) refused, failed or was misused.

    ``code`` is a wire code (``orchestrator.api.wire.ERROR_CODES``), or for failures that
    never reach the wire one of the codes in ``orchestrator.api.errors``; callers branch on it
    without parsing the message.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class HarnessError(PrimeAgentError):
    """A Continual Harness write or refinement was refused (docs/harness.md).

    ``code`` is a host error code (``orchestrator.runtime.wire.ERROR_CODES``) so a handler can
    pass it to the kernel unchanged: ``invalid_argument``, ``not_found`` or ``conflict``.
    """

    code = "invalid_argument"


class HarnessInvalid(HarnessError):
    """The entry or edit fails validation (unknown kind, bad id, missing skill contract, the
    base prompt as a target); nothing was written."""

    code = "invalid_argument"


class HarnessNotFound(HarnessError):
    """The entry (or refinement) does not exist, or is deleted."""

    code = "not_found"


class HarnessConflict(HarnessError):
    """A write against a stale version, or a create of an entry that exists: refused, so no
    concurrent update is lost. ``current_version`` is the head's version (None if absent)."""

    code = "conflict"

    def __init__(self, message: str, *, current_version: int | None = None):
        super().__init__(message)
        self.current_version = current_version


class HarnessQuota(HarnessError):
    """Too many pending proposals from one session tree (docs/harness.md, "Proposals"): the
    user decides on the ones there are before more are taken."""

    code = "quota_exceeded"


class ScheduleSpecError(UserError):
    """A schedule or heartbeat spec (``in 10m``, ``every 30s``, ``at <time>``, cron) is invalid;
    the message is one line saying what to write instead (docs/schedules.md)."""


class GoalError(UserError):
    """A goal request was refused (docs/control.md): a goal is already open, there is no goal,
    the objective or budget is invalid, or the change does not fit the goal's status.

    ``code`` is a host error code (``orchestrator.runtime.wire.ERROR_CODES``) so a handler can
    pass it to the kernel unchanged: ``invalid_argument``, ``not_found`` or ``conflict``.
    """

    code = "invalid_argument"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class McpError(PrimeAgentError):
    """An MCP server is down, a call to it failed or ran out of time (docs/mcp.md). ``code``
    is the host wire code the kernel gets (``mcp_unavailable``, ``mcp_tool_error``,
    ``mcp_timeout``, ``not_found``, ``invalid_argument``); ``retry_after``: seconds until a
    restarting server is tried again, or None."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after
