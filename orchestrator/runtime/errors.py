"""Typed exceptions for host requests made from inside the kernel (stdlib only).

Every failure of a host request is a ``HostError`` (a ``RuntimeError``) with ``.code`` (the
protocol's error code, see ``orchestrator/runtime/wire.py`` ``ERROR_CODES``) and
``.retry_after`` (seconds, or None). Each code has its own subclass, and the subclasses that
have an obvious builtin counterpart also inherit from it, so plain ``except ValueError`` /
``except LookupError`` / ``except PermissionError`` / ``except TimeoutError`` catch them too.

Two codes never come from the host; the runtime raises them itself:

- ``timeout`` -> ``HostTimeout``: the orchestrator did not answer in time.
- ``unavailable`` -> ``HostUnavailable``: there is no orchestrator to ask (no session env, the
  message bus cannot be reached, nobody listens, or the bus refused the request).

Messages are one line. In a cell the traceback is shortened to the user's own frames plus that
line (IPython's ``_render_traceback_`` hook): the runtime's internals would only cost tokens.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import ClassVar

__all__ = [
    "ERROR_CLASSES",
    "BudgetExceeded",
    "Conflict",
    "DepthLimitExceeded",
    "HostError",
    "HostTimeout",
    "HostUnavailable",
    "InternalHostError",
    "InvalidArgument",
    "McpTimeout",
    "McpToolError",
    "McpUnavailable",
    "ModelUnavailable",
    "NotFamily",
    "NotFound",
    "QueryBatchError",
    "QuotaExceeded",
    "RateLimited",
    "UnknownRequest",
    "error_from_reply",
]

MAX_MESSAGE_CHARS = 2000  # a host message longer than this is cut (it is meant to be one line)
TIMEOUT_CODE = "timeout"
UNAVAILABLE_CODE = "unavailable"
BATCH_FAILED_CODE = "batch_failed"
# Packages whose frames a shortened traceback leaves out (the runtime itself and the machinery
# between the cell and it).
_HIDDEN_PACKAGES = ("asyncio", "IPython", "ipykernel", "nats")
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def _one_line(message: str) -> str:
    text = " ".join(str(message).split())
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text or "(no message)"


def _hidden_dirs() -> list[str]:
    dirs = [_RUNTIME_DIR]
    for name in _HIDDEN_PACKAGES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return dirs


class HostError(RuntimeError):
    """A host request failed; ``code`` says how, ``retry_after`` when to try again (or None)."""

    default_code: ClassVar[str] = "host_error"

    def __init__(
        self, message: str, *, code: str | None = None, retry_after: float | None = None
    ) -> None:
        self.code: str = code or self.default_code
        self.retry_after: float | None = retry_after
        text = _one_line(message)
        if retry_after is not None and "retry" not in text.lower():
            text = f"{text} (retry after {retry_after:g} s)"
        super().__init__(text)

    @property
    def message(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default exception pickling (namespace
        # snapshots use dill); rebuild from the message and restore the rest as state.
        return (type(self), (str(self),), self.__dict__.copy())

    def _render_traceback_(self) -> list[str]:
        """IPython hook: the user's frames only, then ``ClassName: message``."""
        hidden = _hidden_dirs()
        frames = [
            frame
            for frame in traceback.extract_tb(self.__traceback__)
            if not any(os.path.abspath(frame.filename).startswith(d + os.sep) for d in hidden)
        ]
        lines: list[str] = []
        if frames:
            lines.append("Traceback (most recent call last):")
            lines.extend(chunk.rstrip("\n") for chunk in traceback.format_list(frames))
        lines.append(f"{type(self).__name__}: {self}")
        return lines


class InvalidArgument(HostError, ValueError):
    """A bad argument (wrong value, too long, unknown name)."""

    default_code = "invalid_argument"


class UnknownRequest(HostError):
    """The request type does not exist or is not enabled for this session."""

    default_code = "unknown_request"


class NotFound(HostError, LookupError):
    """The named agent or child does not exist."""

    default_code = "not_found"


class NotFamily(HostError, PermissionError):
    """The target is not the caller's parent, sibling or child."""

    default_code = "not_family"


class DepthLimitExceeded(HostError):
    """Spawning would exceed the maximum subagent depth."""

    default_code = "depth_limit"


class QuotaExceeded(HostError):
    """Too many live children, or too many pending messages for a target."""

    default_code = "quota_exceeded"


class BudgetExceeded(HostError):
    """The token budget does not allow this."""

    default_code = "budget_exceeded"


class RateLimited(HostError):
    """Too many messages per second to one target; ``retry_after`` says when to try again."""

    default_code = "rate_limited"


class ModelUnavailable(HostError):
    """The requested model cannot be used with the current credentials."""

    default_code = "model_unavailable"


class Conflict(HostError):
    """A harness write was based on a stale version (or creates an id that exists): it was
    refused and nothing changed. Read the entry again, then retry against its new version."""

    default_code = "conflict"


class McpUnavailable(HostError):
    """The MCP server is down: it crashed and is being restarted (see ``retry_after``), or it
    never started (its error says why). Nothing was run."""

    default_code = "mcp_unavailable"


class McpToolError(HostError):
    """The MCP tool ran and reported an error; the message is the tool's own text."""

    default_code = "mcp_tool_error"


class McpTimeout(HostError, TimeoutError):
    """The MCP server did not answer within the call's timeout (the call was cancelled)."""

    default_code = "mcp_timeout"


class InternalHostError(HostError):
    """The orchestrator failed (or sent a reply the runtime cannot read)."""

    default_code = "internal"


class HostTimeout(HostError, TimeoutError):
    """The orchestrator did not answer within the request timeout."""

    default_code = TIMEOUT_CODE


class HostUnavailable(HostError):
    """There is no orchestrator to ask (not in a session, bus unreachable or refusing)."""

    default_code = UNAVAILABLE_CODE


class QueryBatchError(HostError):
    """Some prompts of ``rlm.query_batched`` failed.

    ``results`` holds one entry per prompt, in order: the answer (``str``) or the ``HostError``
    of that prompt; ``errors`` only the failures. ``code`` is the first failure's code.
    """

    default_code = BATCH_FAILED_CODE

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retry_after: float | None = None,
        results: list[str | HostError] | None = None,
    ) -> None:
        super().__init__(message, code=code, retry_after=retry_after)
        self.results: list[str | HostError] = list(results or [])

    @property
    def errors(self) -> list[HostError]:
        return [item for item in self.results if isinstance(item, HostError)]


# Protocol error code -> exception class (the host's codes, then the runtime's own).
ERROR_CLASSES: dict[str, type[HostError]] = {
    "invalid_argument": InvalidArgument,
    "unknown_request": UnknownRequest,
    "not_found": NotFound,
    "not_family": NotFamily,
    "depth_limit": DepthLimitExceeded,
    "quota_exceeded": QuotaExceeded,
    "budget_exceeded": BudgetExceeded,
    "rate_limited": RateLimited,
    "model_unavailable": ModelUnavailable,
    "conflict": Conflict,
    "mcp_unavailable": McpUnavailable,
    "mcp_tool_error": McpToolError,
    "mcp_timeout": McpTimeout,
    "internal": InternalHostError,
    TIMEOUT_CODE: HostTimeout,
    UNAVAILABLE_CODE: HostUnavailable,
}


def error_from_reply(error: object) -> HostError:
    """The exception for a reply's ``error`` object ``{code, message, retry_after}``.

    An unknown code gives a plain ``HostError`` that keeps the code; a malformed object gives
    ``InternalHostError``.
    """
    if not isinstance(error, dict):
        return InternalHostError("the orchestrator sent an error reply without an error object")
    code = error.get("code")
    message = error.get("message")
    retry_after = error.get("retry_after")
    if not isinstance(code, str) or not code:
        return InternalHostError(f"the orchestrator sent an error without a code: {message!r}")
    if isinstance(retry_after, bool) or not isinstance(retry_after, int | float):
        retry_after = None
    cls = ERROR_CLASSES.get(code, HostError)
    text = message if isinstance(message, str) and message.strip() else f"host error {code}"
    return cls(text, code=code, retry_after=float(retry_after) if retry_after is not None else None)
