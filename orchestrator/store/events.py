"""Event types and their payloads: the record of truth (docs/design.md, "State and storage").

``events`` is append-only. Each row is ``(session_id, seq, id, parent_event_id, type, ts,
payload)``; the payload is one of the pydantic models below, dumped as JSON. The session's leaf
pointer names the newest event on its active path; a new event's parent is the leaf.

A model call's ``ToolCall`` and ``UsagePayload`` are defined in ``orchestrator/call_records.py``
(the models package builds them) and listed here with the other payloads.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.call_records import ToolCall, UsagePayload

__all__ = [
    "EVENT_PAYLOADS",
    "IMPORTED_ENTRY_TYPES",
    "AbortedPayload",
    "AssistantMessagePayload",
    "AutonomousStopPayload",
    "BranchSummaryPayload",
    "CompactionPayload",
    "CustomPayload",
    "ErrorPayload",
    "EventType",
    "GateResultPayload",
    "GoalUpdatePayload",
    "McpCallPayload",
    "ModelChangePayload",
    "NoticePayload",
    "RetryPayload",
    "RunEndPayload",
    "ScheduleTickPayload",
    "ToolCall",
    "ToolResultPayload",
    "TurnEndPayload",
    "UsagePayload",
    "UserMessagePayload",
]

EventType = Literal[
    "user_message",
    "assistant_message",
    "tool_result",
    "usage",
    "retry",
    "error",
    "notice",
    "aborted",
    "run_end",
    "branch_summary",
    "custom",
    "compaction",
    "model_change",
    "turn_end",
    "gate_result",
    "autonomous_stop",
    "goal_update",
    "schedule_tick",
    "mcp_call",
]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _absent(value: object) -> bool:
    return value is None


# An imported event's file entry; left out of the recorded payload when there is none, so the
# events of sessions that were never imported carry nothing more.
SourceEntry = Annotated[dict[str, Any] | None, Field(default=None, exclude_if=_absent)]

# The event types an imported entry of a session file may become with its ``source_entry``.
IMPORTED_ENTRY_TYPES: frozenset[str] = frozenset(
    {
        "user_message",
        "assistant_message",
        "tool_result",
        "branch_summary",
        "compaction",
        "model_change",
    }
)


class UserMessagePayload(_Payload):
    text: str
    # who put it there: the user, a parent agent (task), another agent of the family (a
    # message), the harness (continuation, notice)
    source: Literal["user", "parent", "agent", "harness"] = "user"
    sender: str | None = None  # session id of the sending agent (from its NATS credentials)
    sender_label: str | None = None  # how the recipient sees the sender ("child worker-1")
    message_id: str | None = None  # agent messages: dedupe key (each enters context once)
    # Subagent notices this message carries to the model: the ids of their ``notice`` events.
    # Those were shown when they arrived, so renderers show nothing for this message; queued
    # notices are merged into one such message (one turn) when the session takes its inbox.
    notice_ids: list[str] | None = None
    # The mailbox ids of the other deliveries merged into this message (besides
    # ``message_id``): each counts as recorded with it, so none is redelivered after a crash.
    merged_message_ids: list[str] | None = None
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


class AssistantMessagePayload(_Payload):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    stop_reason: Literal["stop", "tool_calls", "length", "error", "aborted"] = "stop"
    provider: str
    model: str
    usage: UsagePayload | None = None
    # Fenced-code protocol: the code block was taken from ``text`` (no native tool call).
    fenced: bool = False
    # The model's reasoning before this reply, when its provider streams it (never sent back
    # to the model; shown to clients: ACP thought chunks, RPC and session-file thinking).
    thinking: str | None = Field(default=None, exclude_if=_absent)
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


class ToolResultPayload(_Payload):
    tool_call_id: str
    name: str = "ipython"
    text: str  # exactly what the model is shown
    is_error: bool = False
    status: str = "ok"  # CellStatus, or "invalid_arguments"
    duration_ms: float = 0.0
    artifact: str | None = None  # path of the full output when it was truncated
    kernel_restarted: bool = False
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


class RetryPayload(_Payload):
    attempt: int
    delay_s: float
    reason: str


class ErrorPayload(_Payload):
    kind: str  # e.g. "model", "budget", "max_steps", "stuck", "compaction"
    message: str
    # A model error's class (``ModelError.error_class``: rate_limited, server_error, ...).
    error_class: str | None = None


class NoticePayload(_Payload):
    text: str


class AbortedPayload(_Payload):
    reason: str  # "interrupted", "sigterm", ...


class RunEndPayload(_Payload):
    reason: str  # "completed", "error", "aborted", "max_steps", "stuck"
    final_text: str = ""
    error_class: str | None = None  # the last turn's, when it failed with a model error


class TurnEndPayload(_Payload):
    """The end of one turn (a prompt and every step it caused), in every mode: what turn
    counts (refine's measured outcome, autonomous limits) read. Not part of the context."""

    reason: str  # TurnOutcome.reason: "completed", "error", "max_steps", "stuck", ...
    # A failed turn's typed error (``ModelError.error_class``): the session takes the next
    # message all the same (docs/agent-loop.md, "A failed turn").
    error_class: str | None = None


class GateResultPayload(_Payload):
    """One autonomous gate run (docs/control.md): ``skipped`` when it was not re-run because
    the workspace had not changed since it failed (``passed`` is then False)."""

    command: str
    passed: bool
    exit_code: int | None = None  # None: timed out, skipped, or could not start
    output: str = ""  # bounded (GATE_OUTPUT_MAX_CHARS)
    duration_ms: float = 0.0
    attempt: int = 1
    skipped: bool = False
    timed_out: bool = False
    workspace_hash: str | None = None


class AutonomousStopPayload(_Payload):
    """Why an autonomous run stopped: its last event (the CLI maps ``reason`` to its exit
    code). ``children``: what happened to descendants still working ("drained"/"cancelled")."""

    reason: str  # control/autonomous.py STOP_REASONS
    detail: str = ""
    # gate_failed: the limit that stopped the run (turn_limit, token_limit, time_limit).
    limit: str | None = Field(default=None, exclude_if=_absent)
    turns: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    gates: list[dict[str, Any]] = Field(default_factory=list)
    children: dict[str, str] = Field(default_factory=dict)  # session id -> drained|cancelled


class GoalUpdatePayload(_Payload):
    """A goal was created or changed state (docs/control.md); a snapshot of the goal row."""

    goal_id: str
    status: str
    objective: str
    token_budget: int | None = None
    tokens_used: int = 0
    reason: str | None = None


class ScheduleTickPayload(_Payload):
    """A schedule's tick was delivered to this session (or deferred / interrupted)."""

    schedule_id: str
    dispatch_id: str
    status: str  # delivered | deferred | interrupted
    label: str | None = None


class McpCallPayload(_Payload):
    """A call from the kernel to an MCP server the orchestrator runs (docs/mcp.md): which
    server, tool, resource or prompt, how it ended and how long it took. Never in context."""

    server: str
    kind: Literal["tool", "resource", "prompt"]
    name: str  # the tool, the resource's uri or the prompt
    status: Literal["ok", "error", "unavailable", "timeout", "cancelled", "refused"]
    duration_ms: float
    arguments: str | None = None  # the arguments as JSON, cut at MCP_EVENT_ARGUMENTS_CHARS
    error: str | None = None


class BranchSummaryPayload(_Payload):
    """Recorded at a branch point when the leaf moves back (``prime-agent branch --summary``):
    what the abandoned path did, so the model keeps it (docs/tree.md)."""

    summary: str
    from_event_id: str | None = None  # the leaf that was left
    details: dict[str, Any] | None = None  # e.g. {"readFiles": [...], "modifiedFiles": [...]}
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


class CustomPayload(_Payload):
    """An entry of an imported session file with no event type of its own, kept verbatim:
    ``fields`` is the entry without ``type``/``id``/``parentId``/``timestamp`` (entry ids in
    ``firstKeptEntryId``, ``fromId``, ``targetId`` mapped to event ids). Never in context."""

    entry_type: str  # the file's entry type: "custom", "label", "session_info", ...
    fields: dict[str, Any] = Field(default_factory=dict)
    # Its id in the file: an export writes it under that id again (absent when not imported).
    entry_id: str | None = Field(default=None, exclude_if=_absent)


class CompactionPayload(_Payload):
    """The context before this point was summarised (docs/compaction.md). Parent: the leaf at
    the time. Context assembly from here on: ``summary`` (with ``kernel_note``), then the
    ``pinned_event_id`` message (the user turn in flight, never summarised), then the path
    from ``first_kept_event_id`` on (None: nothing before this event is kept)."""

    summary: str
    first_kept_event_id: str | None
    tokens_before: int
    tokens_after: int
    reason: Literal["threshold", "overflow", "manual", "requested", "imported"]
    pinned_event_id: str | None = None
    instructions: str | None = None
    read_files: list[str] = Field(default_factory=list)  # cumulative over compactions
    modified_files: list[str] = Field(default_factory=list)
    kernel_note: str | None = None  # what the kernel kept and dropped (oversized variables)
    model: str | None = None  # the session's model here: a later read stops at this event
    summarized_events: int = 0
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


class ModelChangePayload(_Payload):
    """The session's model changed here; it applies to every later model call on this path."""

    model: str  # the new selector, e.g. "openai/gpt-4o-mini"
    previous: str | None = None
    # The endpoints switched between (None: the provider's own, or the embedded model).
    api_base: str | None = None
    previous_api_base: str | None = None
    # Imported from a session file: its entry as it was (thinking blocks, signatures, usage
    # with per-kind costs, api, errorMessage, tool details ...), written back by an export.
    source_entry: SourceEntry = None


EVENT_PAYLOADS: dict[str, type[BaseModel]] = {
    "user_message": UserMessagePayload,
    "assistant_message": AssistantMessagePayload,
    "tool_result": ToolResultPayload,
    "usage": UsagePayload,
    "retry": RetryPayload,
    "error": ErrorPayload,
    "notice": NoticePayload,
    "aborted": AbortedPayload,
    "run_end": RunEndPayload,
    "turn_end": TurnEndPayload,
    "gate_result": GateResultPayload,
    "autonomous_stop": AutonomousStopPayload,
    "goal_update": GoalUpdatePayload,
    "schedule_tick": ScheduleTickPayload,
    "mcp_call": McpCallPayload,
    "branch_summary": BranchSummaryPayload,
    "custom": CustomPayload,
    "compaction": CompactionPayload,
    "model_change": ModelChangePayload,
}
