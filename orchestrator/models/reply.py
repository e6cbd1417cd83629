"""What one model-call attempt gives back, whichever client made it.

A transport (``openai_stream`` for OpenAI-compatible endpoints, ``litellm_stream`` for every
other provider) turns one HTTP attempt into a ``ModelReply`` or raises ``AttemptFailed`` naming
the failure in one word (``FailureKind``). ``ModelClient`` (client.py) decides from the kind
alone whether to retry and which ``ModelError`` the caller finally gets, so both transports
retry, back off and fail alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from orchestrator.call_records import ToolCall, UsagePayload

__all__ = [
    "RETRYABLE",
    "AttemptFailed",
    "DeltaKind",
    "FailureKind",
    "ModelReply",
    "OnDelta",
    "RetryInfo",
    "ToolCallParts",
    "joined_calls",
    "retry_after_s",
]

FailureKind = Literal[
    "stream_cut",  # the stream ended before its finish reason
    "connection",  # no connection could be made (refused, DNS, TLS)
    "timeout",  # nothing arrived within the idle timeout
    "context_overflow",  # the prompt is longer than the model's window
    "auth",  # the key was rejected (401/403)
    "not_found",  # the endpoint does not serve this model (404)
    "bad_response",  # a body that parses as no completion
    "rate_limited",  # 429
    "server_error",  # 5xx
    "bad_request",  # any other 4xx: the request itself is wrong
]
# Kinds worth another attempt; the others will fail the same way again.
RETRYABLE: Final[frozenset[FailureKind]] = frozenset(
    {"stream_cut", "connection", "timeout", "bad_response", "rate_limited", "server_error"}
)


class AttemptFailed(Exception):
    """One attempt failed; ``reason`` is the line a ``retry`` event or the final error shows."""

    def __init__(
        self,
        kind: FailureKind,
        reason: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        connected: bool = True,
    ) -> None:
        super().__init__(reason)
        self.kind: FailureKind = kind
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s  # what a 429's Retry-After asked for, in seconds
        self.connected = connected  # False: no connection was made at all


# What a streamed piece of a reply is: its text, or its reasoning (a provider's
# ``reasoning_content`` / ``reasoning`` deltas).
DeltaKind = Literal["text", "thinking"]
# Called with each piece as the model streams it.
OnDelta = Callable[[str, DeltaKind], None]


@dataclass
class ModelReply:
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str
    usage: UsagePayload
    thinking: str = ""  # the model's reasoning, when its provider streams it


@dataclass(frozen=True)
class RetryInfo:
    attempt: int  # the attempt that failed, 1-based
    delay_s: float
    reason: str


@dataclass
class ToolCallParts:
    """A native tool call as its stream deltas arrive."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


DEFAULT_TOOL_NAME: Final = "ipython"


def joined_calls(calls: dict[int, ToolCallParts]) -> list[ToolCall]:
    """The finished tool calls in their stream order (ids and names filled in when missing)."""
    return [
        ToolCall(
            id=p.id or f"call_{i}",
            name=p.name or DEFAULT_TOOL_NAME,
            arguments="".join(p.arguments),
        )
        for i, p in sorted(calls.items())
    ]


def retry_after_s(raw: str | None) -> float | None:
    """A Retry-After header in seconds; None for none or an HTTP date (our backoff applies)."""
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None
