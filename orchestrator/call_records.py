"""What one model call leaves in the record: the tool calls of its reply and its usage.

``models/client.py`` builds these from a provider's stream and the store keeps them as they
are: a ``usage`` event's payload is a ``UsagePayload``, an ``assistant_message`` holds the
``ToolCall``s and the usage (``store/events.py``, which lists both with the other payloads).
They live down here, with the other basics, because ``models`` and ``store`` are packages of
one layer and neither imports the other.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ToolCall", "UsagePayload"]


class _Record(BaseModel):
    # Like every event payload: a field we do not know is refused, not kept.
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Record):
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it (may be malformed)


class UsagePayload(_Record):
    provider: str
    model: str
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float | None = None  # None = price unknown (never recorded as 0)
    latency_ms: float = 0.0
    # What the call was for when it was not the agent's own step: "compaction", "refine".
    purpose: str | None = None
