"""Context assembly: the events on a session's active path -> chat messages for the model.

The path is read leaf -> root by the store and arrives root-first. Only conversational events
enter the context; bookkeeping (usage, retries, run ends) does not. Each message keeps the
protocol it was made with: a fenced-protocol exchange stays plain text even if the session
later switches to a model with native tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

from orchestrator.agent.fenced import render_fenced_result
from orchestrator.store.events import (
    AssistantMessagePayload,
    ToolResultPayload,
    UserMessagePayload,
)

__all__ = ["ContextBuilder", "safe_arguments"]

PARENT_TASK_PREFIX = "[task from parent]\n"


class _EventLike(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def payload(self) -> dict[str, Any]: ...


def safe_arguments(raw: str) -> str:
    """Tool-call arguments as the provider will accept them back in history.

    A malformed JSON string from the model is kept in the event as-is but wrapped here, because
    some providers reject a conversation whose earlier tool call has invalid JSON arguments.
    """
    try:
        json.loads(raw)
    except ValueError:
        return json.dumps({"_invalid_arguments": raw[:2000]})
    return raw


class ContextBuilder:
    """Incrementally built message list (O(new events) per step, not O(history))."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._fenced_calls: set[str] = set()

    def extend(self, events: Iterable[_EventLike]) -> None:
        for event in events:
            self.add(event.type, event.payload)

    def add(self, type_: str, payload: dict[str, Any]) -> None:
        if type_ == "user_message":
            user = UserMessagePayload.model_validate(payload)
            if user.source == "parent":
                text = PARENT_TASK_PREFIX + user.text
            elif user.source == "agent":
                text = f"[message from {user.sender_label or user.sender}]\n{user.text}"
            else:
                text = user.text
            self.messages.append({"role": "user", "content": text})
        elif type_ == "assistant_message":
            msg = AssistantMessagePayload.model_validate(payload)
            if msg.fenced or not msg.tool_calls:
                for call in msg.tool_calls:
                    self._fenced_calls.add(call.id)
                self.messages.append({"role": "assistant", "content": msg.text})
            else:
                self.messages.append(
                    {
                        "role": "assistant",
                        "content": msg.text or None,
                        "tool_calls": [
                            {
                                "id": c.id,
                                "type": "function",
                                "function": {
                                    "name": c.name,
                                    "arguments": safe_arguments(c.arguments),
                                },
                            }
                            for c in msg.tool_calls
                        ],
                    }
                )
        elif type_ == "tool_result":
            res = ToolResultPayload.model_validate(payload)
            if res.tool_call_id in self._fenced_calls:
                self.messages.append({"role": "user", "content": render_fenced_result(res.text)})
            else:
                self.messages.append(
                    {"role": "tool", "tool_call_id": res.tool_call_id, "content": res.text}
                )
