"""Context assembly: the events on a session's active path -> chat messages for the model.

The context is the turn loop's own state: the loop appends to it step by step, compaction cuts
and rebuilds it (``agent/compaction.py``); the orchestrator builds it from the store
(``load``) when it loads a session.

The path is read leaf -> root by the store and arrives root-first; a compacted session's path
starts at its newest compaction's kept span (``orchestrator/store/context_queries.py``). The
compaction contributes its summary as the first message, then the user turn it pinned, then
the kept span and everything after it; older compactions inside the kept span are skipped
(the newest summary already covers them). Only conversational events enter the context;
bookkeeping (usage, retries, run ends) does not. A ``model_change`` event changes the model
from that point on (``ContextBuilder.model``). Each message keeps the protocol it was made
with: a fenced-protocol exchange stays plain text even if the session later switches to a
model with native tool calls.

Every message has an ``ContextEntry`` beside it (same index): the event it came from, a token
estimate and its tool-call links, which is what compaction needs to choose where to cut.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeVar

from pydantic import BaseModel

from orchestrator.agent.fenced import render_fenced_result
from orchestrator.models.message_json import EncodedMessage
from orchestrator.store.events import (
    AssistantMessagePayload,
    CompactionPayload,
    ToolResultPayload,
    UserMessagePayload,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "MESSAGE_OVERHEAD_TOKENS",
    "PARENT_TASK_PREFIX",
    "SUMMARY_PREFIX",
    "ContextBuilder",
    "ContextEntry",
    "estimate_tokens",
    "safe_arguments",
    "summary_message",
]

PARENT_TASK_PREFIX = "[task from parent]\n"
# Token estimate where no provider count exists: characters / 4 (rough for English and code;
# the provider's reported usage replaces it as soon as a reply comes back).
CHARS_PER_TOKEN: Final = 4
# Fixed cost of a message's envelope (role, separators) in the estimate.
MESSAGE_OVERHEAD_TOKENS: Final = 4
SUMMARY_PREFIX: Final = "[context summary]"
BRANCH_SUMMARY_PREFIX: Final = "[summary of an abandoned branch]"
HISTORY_HINT: Final = (
    "The full history is still recorded: `await history.search(text)`, "
    "`await history.get(from_seq, to_seq)` and `await history.tail(n)` read it."
)

EntryKind = Literal["message", "summary", "pinned"]


class _EventLike(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def payload(self) -> dict[str, Any]: ...


class _PathLike(Protocol):
    @property
    def events(self) -> list[Any]: ...

    @property
    def compaction(self) -> Any: ...

    @property
    def pinned(self) -> Any: ...


@dataclass
class ContextEntry:
    """What compaction knows about one message of the context (same index as the message)."""

    event_id: str | None
    kind: EntryKind  # summary: the compaction's; pinned: the user turn a compaction kept
    tokens: int
    calls: tuple[str, ...] = ()  # ids of the tool calls this assistant message made
    answers: str | None = None  # the tool call id this tool result answers
    user: bool = False  # a user message (a turn's start, a steer, a harness note)


_DICT_READ_TYPES: Final = frozenset({"branch_summary", "model_change", "compaction"})


_P = TypeVar("_P", bound=BaseModel)


def _payload(cls: type[_P], payload: dict[str, Any] | BaseModel) -> _P:
    """``payload`` as a ``cls``: the live model as it is, else validated (a stored dict)."""
    if isinstance(payload, cls):
        return payload
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    return cls.model_validate(payload)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _message_tokens(message: dict[str, Any]) -> int:
    text = str(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        text += call["function"]["name"] + call["function"]["arguments"]
    return estimate_tokens(text) + MESSAGE_OVERHEAD_TOKENS


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


def summary_message(compaction: CompactionPayload) -> str:
    """The first message of a compacted context."""
    parts = [
        f"{SUMMARY_PREFIX} The conversation before this point was compacted into this summary.",
        "<summary>",
        compaction.summary.strip(),
        "</summary>",
    ]
    if compaction.kernel_note:
        parts.append(compaction.kernel_note)
    parts.append(HISTORY_HINT)
    return "\n".join(parts)


class ContextBuilder:
    """Incrementally built message list (O(new events) per step, not O(history))."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.entries: list[ContextEntry] = []
        self.model: str | None = None  # set by a model_change (or a compaction) on the path
        self.compaction: CompactionPayload | None = None  # the newest one in this context
        self._fenced_calls: set[str] = set()
        # The provider's count: (entry index of an assistant reply, prompt + output tokens).
        self._anchor: tuple[int, int] | None = None

    # -- building ------------------------------------------------------------------------------

    def extend(self, events: Iterable[_EventLike]) -> None:
        for event in events:
            self.add(event.type, event.payload, event_id=getattr(event, "id", None))

    def load(self, path: _PathLike) -> None:
        """Rebuild from a context path: summary, pinned turn, kept span and what followed."""
        self._reset()
        newest = path.compaction
        if newest is not None:
            self._start_compacted(
                CompactionPayload.model_validate(newest.payload),
                path.pinned.payload if path.pinned is not None else None,
                path.pinned.id if path.pinned is not None else None,
            )
        # Provider counts made before the newest compaction measured the old, longer context.
        counts = newest is None
        for event in path.events:
            if event.type == "compaction":
                counts = counts or (newest is not None and event.id == newest.id)
                continue
            self.add(event.type, event.payload, event_id=event.id, counts=counts)

    def add(
        self,
        type_: str,
        payload: dict[str, Any] | BaseModel,
        *,
        event_id: str | None = None,
        counts: bool = True,
    ) -> None:
        """Take one event: its payload as stored (a dict), or the payload model a live session
        just recorded (used as it is: dumping it to add it here validated it a second time
        at every step, and most event types are not in the context at all)."""
        if type_ == "user_message":
            self._user(_payload(UserMessagePayload, payload), event_id, "message")
        elif type_ == "assistant_message":
            self._assistant(_payload(AssistantMessagePayload, payload), event_id, counts)
        elif type_ == "tool_result":
            res = _payload(ToolResultPayload, payload)
            if res.tool_call_id in self._fenced_calls:
                message = {"role": "user", "content": render_fenced_result(res.text)}
            else:
                message = {"role": "tool", "tool_call_id": res.tool_call_id, "content": res.text}
            self._push(message, ContextEntry(event_id, "message", 0, answers=res.tool_call_id))
        elif type_ in _DICT_READ_TYPES:
            fields = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
            if type_ == "branch_summary":
                text = f"{BRANCH_SUMMARY_PREFIX}\n{fields.get('summary', '')}"
                self._push({"role": "user", "content": text}, ContextEntry(event_id, "message", 0))
            elif type_ == "model_change":
                self.model = str(fields.get("model") or "") or self.model
            else:  # a live compaction is applied with ``apply_compaction``: only the model
                self.model = fields.get("model") or self.model

    def apply_compaction(
        self,
        compaction: CompactionPayload,
        *,
        cut: int,
        pinned_index: int | None,
    ) -> None:
        """Replace everything before entry ``cut`` with the summary (and the pinned turn)."""
        pinned = None
        if pinned_index is not None:
            pinned = (self.messages[pinned_index], self.entries[pinned_index])
        kept_messages, kept_entries = self.messages[cut:], self.entries[cut:]
        fenced = self._fenced_calls
        model = self.model
        self._reset()
        self._fenced_calls = fenced
        self.model = compaction.model or model
        self.compaction = compaction
        self._push_summary(compaction)
        if pinned is not None:
            message, entry = pinned
            self.messages.append(message)
            self.entries.append(ContextEntry(entry.event_id, "pinned", entry.tokens, user=True))
        self.messages += kept_messages
        self.entries += kept_entries

    # -- measuring -----------------------------------------------------------------------------

    def tokens(self, fixed_tokens: int = 0) -> int:
        """The context's size: the provider's count at its last reply plus estimates for what
        came after it, or (no reply since the last compaction) ``fixed_tokens`` (system
        prompt, tool schema) plus estimates for every message."""
        if self._anchor is not None:
            index, counted = self._anchor
            return counted + sum(e.tokens for e in self.entries[index + 1 :])
        return fixed_tokens + sum(e.tokens for e in self.entries)

    def index_of(self, event_id: str | None) -> int | None:
        if event_id is None:
            return None
        for index in range(len(self.entries) - 1, -1, -1):
            if self.entries[index].event_id == event_id:
                return index
        return None

    # -- internals -----------------------------------------------------------------------------

    def _push(self, message: dict[str, Any], entry: ContextEntry) -> None:
        entry.tokens = _message_tokens(message)
        self.messages.append(EncodedMessage(message))  # encoded once, not at every call
        self.entries.append(entry)

    def _push_summary(self, compaction: CompactionPayload) -> None:
        message = {"role": "user", "content": summary_message(compaction)}
        self._push(message, ContextEntry(None, "summary", 0, user=True))

    def _start_compacted(
        self, compaction: CompactionPayload, pinned: dict[str, Any] | None, pinned_id: str | None
    ) -> None:
        self.compaction = compaction
        self.model = compaction.model or self.model
        self._push_summary(compaction)
        if pinned is not None:
            self._user(UserMessagePayload.model_validate(pinned), pinned_id, "pinned")

    def _user(self, user: UserMessagePayload, event_id: str | None, kind: EntryKind) -> None:
        if user.source == "parent":
            text = PARENT_TASK_PREFIX + user.text
        elif user.source == "agent":
            text = f"[message from {user.sender_label or user.sender}]\n{user.text}"
        else:
            text = user.text
        self._push({"role": "user", "content": text}, ContextEntry(event_id, kind, 0, user=True))

    def _assistant(self, msg: AssistantMessagePayload, event_id: str | None, counts: bool) -> None:
        calls = tuple(c.id for c in msg.tool_calls)
        if msg.fenced or not msg.tool_calls:
            self._fenced_calls.update(calls)
            message: dict[str, Any] = {"role": "assistant", "content": msg.text}
        else:
            message = {
                "role": "assistant",
                "content": msg.text or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": safe_arguments(c.arguments)},
                    }
                    for c in msg.tool_calls
                ],
            }
        self._push(message, ContextEntry(event_id, "message", 0, calls=calls))
        usage = msg.usage
        if counts and usage is not None:
            prompt = usage.input + usage.cache_read + usage.cache_write
            if prompt > 0:
                self._anchor = (len(self.entries) - 1, prompt + usage.output)
