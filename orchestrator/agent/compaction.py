"""Compaction: when the context gets too long, summarise its older part (docs/spec.md §5).

The turn loop owns one ``Compactor`` per session and calls it at step boundaries (never
mid-cell): before a model call when a compaction was requested (``/compact``, ``compact.run``
from the kernel) or the context passed the threshold, and after a provider's context-overflow
error (then the call is retried once). docs/compaction.md is the full description.

1. **Cut.** ``find_cut`` walks back from the newest message until ``keep_recent_tokens`` are
   kept and cuts at the nearest message that does not split a tool call from its result (a
   user or assistant message). The user message that started the turn in flight is never
   summarised: when the cut passes it, it is *pinned*, kept verbatim right after the summary.
2. **Summary.** One model call (the session's model) over the part before the cut, with the
   previous summary to update, the kernel's variables (names, types, sizes) and the user's
   instructions. It must have the sections of ``SUMMARY_SECTIONS``.
3. **Check.** A failed summary call, an empty summary, or a context that is not smaller (or
   still over the threshold) stops with ``CompactionFailed`` and its typed ``reason``; nothing
   is recorded as compacted, so nothing loops.
4. **Kernel.** Variables over the drop size are deleted from the kernel (``kernel_memory.py``);
   the summary message says what was dropped and what is still defined.
5. **Record.** One ``compaction`` event (summary, first kept event, pinned turn, tokens before
   and after, file lists, kernel note) whose parent is the current leaf; the context is
   rebuilt from it (``ContextBuilder.apply_compaction``), exactly as a reload would build it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from orchestrator.agent.context import (
    MESSAGE_OVERHEAD_TOKENS,
    ContextBuilder,
    ContextEntry,
    estimate_tokens,
    summary_message,
)
from orchestrator.agent.kernel_memory import (
    KernelVariable,
    drop_variables,
    kernel_note,
    list_variables,
)
from orchestrator.errors import ModelError, PrimeAgentError
from orchestrator.models.client import ModelReply
from orchestrator.sandbox.base import Sandbox
from orchestrator.settings import CompactionSettings
from orchestrator.store.events import CompactionPayload
from orchestrator.store.history_entries import code_of

__all__ = [
    "SUMMARY_SECTIONS",
    "CompactionFailed",
    "CompactionRequest",
    "Compactor",
    "FailReason",
    "NothingToCompact",
    "Reason",
    "file_hints",
    "find_cut",
    "serialize_for_summary",
]

log = logging.getLogger(__name__)

Reason = Literal["threshold", "overflow", "manual", "requested"]
FailReason = Literal["nothing_to_compact", "summary_failed", "no_progress"]
# Reasons that must shrink the context (else the next call fails or compaction would loop).
FORCED: Final = frozenset({"threshold", "overflow"})
USAGE_PURPOSE: Final = "compaction"  # UsagePayload.purpose of the summary call

# What the summary call sees of each message: tool results and long texts are cut.
SUMMARY_TOOL_RESULT_MAX_CHARS: Final = 2000
SUMMARY_MESSAGE_MAX_CHARS: Final = 8000
FILES_MAX: Final = 100  # paths kept per list (read / modified), newest last
# Small windows (the embedded model's 8,192 tokens) cannot give up 16,384 tokens of reserve or
# keep 20,000: the reserve is at most this share of the window, the kept span at most this
# share of the threshold, so a compaction still leaves room and still shrinks.
RESERVE_MAX_WINDOW_SHARE: Final = 0.5
KEEP_MAX_SHARE: Final = 0.5
SUMMARY_SECTIONS: Final[tuple[str, ...]] = (
    "## Goal",
    "## Constraints & Preferences",
    "## Progress",
    "### Done",
    "### In Progress",
    "### Blocked",
    "## Key Decisions",
    "## Next Steps",
    "## Critical Context",
    "## Files",
    "## Variables worth reusing",
)
SUMMARY_SYSTEM_PROMPT: Final = (
    "You keep the working notes of an agent whose conversation no longer fits its context "
    "window. You get the older part of that conversation, and the notes written last time if "
    "there are any. Write notes that let the agent carry on as if it remembered everything: "
    "the task, concrete facts, names, paths, numbers, decisions, results and open problems. "
    "Do not continue the conversation, answer its questions or call tools: reply with the "
    "notes only."
)
SUMMARY_FORMAT: Final = (
    "Write the notes in Markdown with exactly these headings, in this order:\n"
    + "\n".join(SUMMARY_SECTIONS)
    + "\nUnder Progress, list finished work under Done, started work under In Progress and "
    "what is stuck (and why) under Blocked. Under Files, list the files read and the files "
    "modified. Under Variables worth reusing, name kernel variables that hold results the "
    "agent should use instead of recomputing them (the kernel keeps running). Be specific "
    "and brief; write 'none' under a heading with nothing to say."
)

_EDIT_CALL = re.compile(r"""\bedit\(\s*(?:path\s*=\s*)?(['"])([^'"\n]+)\1""")
_OPEN_CALL = re.compile(
    r"""\bopen\(\s*(['"])([^'"\n]+)\1\s*(?:,\s*(?:mode\s*=\s*)?(['"])([^'"]*)\3)?"""
)
_PATH_IO = re.compile(r"""Path\(\s*(['"])([^'"\n]+)\1\s*\)\.(read|write)_(?:text|bytes)""")


class CompactionFailed(PrimeAgentError):
    """A compaction that did not happen; ``reason`` says why (``FailReason``)."""

    def __init__(self, reason: FailReason, message: str):
        super().__init__(message)
        self.reason: FailReason = reason


class NothingToCompact(CompactionFailed):
    """The context has nothing before the newest ``keep_recent_tokens`` worth summarising."""

    def __init__(self, message: str = "nothing to compact: the context is already short"):
        super().__init__("nothing_to_compact", message)


@dataclass
class CompactionRequest:
    """A compaction asked for while a turn runs: done at the next step boundary."""

    reason: Literal["manual", "requested"]
    instructions: str | None = None


Complete = Callable[[list[dict[str, Any]]], Awaitable[ModelReply]]
Record = Callable[[str, Any], Awaitable[Any]]


# -- the cut ------------------------------------------------------------------------------------


def _valid_cuts(entries: Sequence[ContextEntry]) -> list[bool]:
    """``valid[i]``: the kept span may start at entry ``i`` (a user or assistant message whose
    cut leaves every tool call on the same side as its result)."""
    made_at: dict[str, int] = {}
    for index, entry in enumerate(entries):
        for call in entry.calls:
            made_at[call] = index
    valid = [e.kind == "message" and e.answers is None for e in entries]
    for index, entry in enumerate(entries):
        start = made_at.get(entry.answers) if entry.answers is not None else None
        if start is not None:
            for inside in range(start + 1, index + 1):
                valid[inside] = False
    return valid


def find_cut(
    entries: Sequence[ContextEntry],
    keep_tokens: int,
    *,
    force: bool,
    protect: int | None = None,
) -> int | None:
    """Index of the first entry to keep, or None when nothing can be summarised.

    The latest valid cut that still keeps at least ``keep_tokens`` (so the newest work stays
    verbatim). When even the whole context is smaller than that, ``force`` (threshold and
    overflow, which must shrink) keeps only the newest exchange; otherwise nothing is done.
    Summary and pinned entries at the head are never a cut point, and at least one entry
    before the cut must be summarisable: not the head, not ``protect`` (the turn in flight,
    which is pinned instead of summarised).
    """
    head = 0
    while head < len(entries) and entries[head].kind != "message":
        head += 1
    valid = _valid_cuts(entries)
    first = head + 1 if protect != head else head + 2  # the first cut with work before it
    candidates = [i for i in range(first, len(entries)) if valid[i]]
    kept = 0
    suffix: dict[int, int] = {}
    for index in range(len(entries) - 1, head - 1, -1):
        kept += entries[index].tokens
        suffix[index] = kept
    enough = [i for i in candidates if suffix[i] >= keep_tokens]
    if enough:
        return max(enough)
    if force and candidates:
        return max(candidates)
    return None


# -- the summary request ------------------------------------------------------------------------


def _cut_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} chars cut ...]"


def serialize_for_summary(
    messages: Sequence[dict[str, Any]], entries: Sequence[ContextEntry]
) -> str:
    """The messages as labelled plain text: ``[user]``, ``[assistant]``, ``[ipython call]``,
    ``[tool result]`` (cut to ``SUMMARY_TOOL_RESULT_MAX_CHARS``)."""
    lines: list[str] = []
    for message, entry in zip(messages, entries, strict=True):
        content = str(message.get("content") or "")
        if entry.answers is not None:
            lines.append(f"[tool result]\n{_cut_text(content, SUMMARY_TOOL_RESULT_MAX_CHARS)}")
            continue
        role = "user" if message.get("role") == "user" else "assistant"
        if content:
            lines.append(f"[{role}]\n{_cut_text(content, SUMMARY_MESSAGE_MAX_CHARS)}")
        for call in message.get("tool_calls") or []:
            code = code_of(call["function"]["arguments"])
            lines.append(f"[ipython call]\n{_cut_text(code, SUMMARY_MESSAGE_MAX_CHARS)}")
    return "\n\n".join(lines)


def file_hints(code_texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """(read, modified) file paths visible in cells: ``edit(...)``, ``open(...)`` with a mode,
    ``Path(...).read_*/write_*``. A hint for the summary, not a complete record."""
    read: list[str] = []
    modified: list[str] = []
    for text in code_texts:
        for match in _EDIT_CALL.finditer(text):
            modified.append(match.group(2))
        for match in _OPEN_CALL.finditer(text):
            mode = match.group(4) or "r"
            (modified if any(c in mode for c in "wax+") else read).append(match.group(2))
        for match in _PATH_IO.finditer(text):
            (read if match.group(3) == "read" else modified).append(match.group(2))
    return read, modified


def _merge(old: Sequence[str], new: Sequence[str]) -> list[str]:
    out = [p for p in old if p not in new] + list(dict.fromkeys(new))
    return out[-FILES_MAX:]


def _request(
    conversation: str,
    *,
    previous: CompactionPayload | None,
    variables: list[KernelVariable] | None,
    read: list[str],
    modified: list[str],
    instructions: str | None,
) -> list[dict[str, Any]]:
    parts = [f"<conversation>\n{conversation}\n</conversation>"]
    if previous is not None:
        parts.append(
            f"<previous-notes>\n{previous.summary.strip()}\n</previous-notes>\n"
            "Update these notes with the conversation above: keep what still holds, change "
            "what changed, drop what no longer matters."
        )
    if variables:
        listing = "\n".join(v.describe() for v in variables)
        parts.append(f"<kernel-variables>\n{listing}\n</kernel-variables>")
    if read or modified:
        parts.append(
            "<files-seen-in-code>\n"
            f"read: {', '.join(read) or 'none'}\nmodified: {', '.join(modified) or 'none'}\n"
            "</files-seen-in-code>"
        )
    if instructions:
        parts.append(
            f"<instructions>\n{instructions.strip()}\n</instructions>\n"
            "Follow these instructions from the user first."
        )
    parts.append(SUMMARY_FORMAT)
    return [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


# -- the compactor ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionOutcome:
    payload: CompactionPayload
    event_id: str | None


class Compactor:
    """One session's compaction: the trigger checks, the pending request, the work.

    It reads and rebuilds the loop's ``ContextBuilder``; ``complete`` is one model call with
    the session's current model, ``record`` appends an event (the summary call's ``usage`` and
    the ``compaction``), ``peek_sandbox`` returns the running sandbox or None (a compaction
    never starts one).
    """

    def __init__(
        self,
        *,
        settings: CompactionSettings,
        context: ContextBuilder,
        complete: Complete,
        record: Record,
        window: Callable[[], Awaitable[int]],
        fixed_tokens: Callable[[], int],
        model: Callable[[], str],
        peek_sandbox: Callable[[], Sandbox | None] | None = None,
    ):
        self.settings = settings
        self.context = context
        self._complete = complete
        self._record = record
        self._window = window
        self._fixed_tokens = fixed_tokens
        self._model = model
        self._peek_sandbox = peek_sandbox or (lambda: None)
        self.pending: CompactionRequest | None = None
        self.last_window: int | None = None

    # -- triggers --------------------------------------------------------------------------

    def request(self, reason: Literal["manual", "requested"], instructions: str | None) -> bool:
        """Ask for a compaction at the next step boundary. A second request before it runs
        only replaces the instructions (when it has some); returns True for a new request."""
        if self.pending is not None:
            if instructions:
                self.pending.instructions = instructions
            return False
        self.pending = CompactionRequest(reason, instructions)
        return True

    def take_pending(self) -> CompactionRequest | None:
        pending, self.pending = self.pending, None
        return pending

    def tokens(self) -> int:
        return self.context.tokens(self._fixed_tokens())

    def _reserve(self, window: int) -> int:
        return min(self.settings.reserve_tokens, int(window * RESERVE_MAX_WINDOW_SHARE))

    async def threshold(self) -> int:
        """Compact above this many context tokens: the window minus the reserve."""
        window = await self._window()
        self.last_window = window
        return window - self._reserve(window)

    async def keep_tokens(self) -> int:
        return min(self.settings.keep_recent_tokens, int(await self.threshold() * KEEP_MAX_SHARE))

    async def over_threshold(self) -> bool:
        if not self.settings.enabled:
            return False
        return self.tokens() > await self.threshold()

    def status(self) -> dict[str, Any]:
        """``compact.status()``: size now, window, threshold, whether one is scheduled."""
        window = self.last_window
        tokens = self.tokens()
        last = self.context.compaction
        return {
            "tokens": tokens,
            "context_window": window,
            "threshold": None if window is None else window - self._reserve(window),
            "percent": None if not window else round(100.0 * tokens / window, 1),
            "scheduled": self.pending is not None,
            "last": None
            if last is None
            else {
                "reason": last.reason,
                "tokens_before": last.tokens_before,
                "tokens_after": last.tokens_after,
            },
        }

    # -- the work --------------------------------------------------------------------------

    async def compact(
        self, reason: Reason, instructions: str | None = None, *, turn_event_id: str | None
    ) -> CompactionOutcome:
        context = self.context
        entries, messages = context.entries, context.messages
        tokens_before = self.tokens()
        turn = context.index_of(turn_event_id)
        keep = await self.keep_tokens()
        cut = find_cut(entries, keep, force=reason in FORCED, protect=turn)
        if cut is None:
            raise NothingToCompact()
        pinned = turn if turn is not None and turn < cut else None
        chosen = [i for i in range(cut) if entries[i].kind != "summary" and i != pinned]
        if not chosen:
            raise NothingToCompact()
        previous = context.compaction
        sandbox = self._peek_sandbox()
        limit = self.settings.drop_variable_bytes
        variables = await list_variables(sandbox, limit) if sandbox is not None else None
        codes = [
            call["function"]["arguments"]
            for i in chosen
            for call in messages[i].get("tool_calls") or []
        ] + [str(messages[i].get("content") or "") for i in chosen if entries[i].calls]
        read, modified = file_hints([code_of(c) for c in codes])
        request = _request(
            serialize_for_summary([messages[i] for i in chosen], [entries[i] for i in chosen]),
            previous=previous,
            variables=variables,
            read=read,
            modified=modified,
            instructions=instructions,
        )
        try:
            reply = await self._complete(request)
        except ModelError as exc:
            raise CompactionFailed("summary_failed", f"the summary call failed: {exc}") from exc
        reply.usage.purpose = USAGE_PURPOSE
        await self._record("usage", reply.usage)
        summary = reply.text.strip()
        if not summary:
            raise CompactionFailed("summary_failed", "the summary call returned no text")
        payload = CompactionPayload(
            summary=summary,
            first_kept_event_id=entries[cut].event_id if cut < len(entries) else None,
            tokens_before=tokens_before,
            tokens_after=0,
            reason=reason,
            pinned_event_id=entries[pinned].event_id if pinned is not None else None,
            instructions=instructions,
            read_files=_merge(previous.read_files if previous else [], read),
            modified_files=_merge(previous.modified_files if previous else [], modified),
            model=self._model(),
            summarized_events=len(chosen),
        )
        kept = sum(e.tokens for e in entries[cut:])
        pinned_tokens = entries[pinned].tokens if pinned is not None else 0

        def size_after(p: CompactionPayload) -> int:
            summary_tokens = estimate_tokens(summary_message(p)) + MESSAGE_OVERHEAD_TOKENS
            return self._fixed_tokens() + summary_tokens + pinned_tokens + kept

        tokens_after = size_after(payload)
        threshold = await self.threshold()
        if tokens_after >= tokens_before or tokens_after > threshold:
            raise CompactionFailed(
                "no_progress",
                f"compaction made no progress: {tokens_before} tokens before, {tokens_after} "
                f"after (threshold {threshold})",
            )
        if sandbox is not None and variables is not None:
            over = [v.name for v in variables if v.over]
            dropped = (
                await drop_variables(sandbox, over)
                if over and self.settings.drop_large_variables
                else []
            )
            note = kernel_note(variables, dropped, limit_bytes=limit)
            payload = payload.model_copy(update={"kernel_note": note})
        payload = payload.model_copy(update={"tokens_after": size_after(payload)})
        record = await self._record("compaction", payload)
        context.apply_compaction(payload, cut=cut, pinned_index=pinned)
        log.info(
            "compacted (%s): %d -> %d tokens, %d events summarised",
            reason,
            tokens_before,
            payload.tokens_after,
            len(chosen),
        )
        return CompactionOutcome(payload, getattr(record, "id", None))
