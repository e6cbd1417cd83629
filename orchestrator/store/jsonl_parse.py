"""Read a pi / Prime Agent session file (JSONL, versions 1 to 3) into a ``ParsedSession``:
validated, not yet written (``jsonl_import.py`` writes it; docs/tree.md).

The file is a boundary: every line is validated with the pydantic models below, and the first
bad line is a ``UserError`` naming it, before anything is written.

- Version 1 files are linear: entries have no ``id``/``parentId``; each gets the previous entry
  as its parent and an id (8 hex digits, derived from the header id and the line, so the same
  file always gets the same ids, as pi's own migration does), and a compaction's
  ``firstKeptEntryIndex`` (an index into the file's entries, header included) becomes a
  reference to that entry. Versions 1 and 2 call the ``custom`` message role ``hookMessage``.
  Version 3 is what ``jsonl.export_session_jsonl`` writes.
- ``message`` entries with role user / assistant / toolResult become ``user_message`` /
  ``assistant_message`` / ``tool_result`` drafts (text blocks joined; an image becomes a
  ``[image omitted: TYPE]`` line); ``branch_summary``, ``compaction`` and ``model_change``
  entries become drafts of those types. Each of them keeps the entry as the file has it
  (``Draft.entry``: thinking blocks and signatures, ``errorMessage``, tool details, usage with
  per-kind costs, ``api``, unknown fields), which the writer stores as ``source_entry``.
  ``custom`` entries named ``prime-agent.<type>`` holding a valid payload of that type become
  that event again (the round trip of our own exports).
- Every other entry (``label``, ``session_info``, ``custom_message``, other message roles, types
  this code has never heard of) becomes a ``custom`` draft holding the entry's fields.
- The leaf is the file's last entry, as pi reads it (or the parent of a trailing
  ``prime-agent.leaf`` marker, which is not kept). ``ParsedSession.model`` is the newest model
  named on the active path. The header line is kept whole (``ParsedSession.header``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)

from orchestrator.errors import UserError
from orchestrator.store.events import EVENT_PAYLOADS, IMPORTED_ENTRY_TYPES
from orchestrator.store.jsonl import (
    CUSTOM_TYPE_PREFIX,
    JSONL_VERSION,
    LEAF_MARKER,
    PRIME_AGENT_KEY,
    STOP_REASONS,
)
from orchestrator.store.queries import utcnow

__all__ = [
    "IMPORT_MAX_LINE_BYTES",
    "JSONL_MIN_VERSION",
    "PAYLOAD_REFERENCES",
    "Draft",
    "ParsedSession",
    "parse_session_jsonl",
    "read_session_file",
    "validation_reason",
]

JSONL_MIN_VERSION: Final = 1
# A line longer than this is refused rather than read into memory (a cell's output is at most
# 64 KiB per stream in our own files; pi's are of the same order).
IMPORT_MAX_LINE_BYTES: Final = 64 * 1024 * 1024
# How much of a line's problem an error message quotes.
_REASON_CHARS: Final = 160
# Version 1 entries have no ids: each gets this many hex digits of a hash (pi's id length).
_V1_ID_HEX_CHARS: Final = 8
_HOOK_ROLE: Final = "hookMessage"  # the v1/v2 name of the "custom" message role
_CUSTOM_ROLE: Final = "custom"
_FIRST_TREE_VERSION: Final = 2
_FIRST_CUSTOM_ROLE_VERSION: Final = 3
_BASE_KEYS: Final = frozenset({"type", "id", "parentId", "timestamp"})
# Our own payload types that may come back from `prime-agent.<type>` custom entries.
_MESSAGE_TYPES: Final = frozenset({"user_message", "assistant_message", "tool_result"})
_PI_STOP_REASONS: Final = {pi: ours for ours, pi in STOP_REASONS.items()}
_TOOL_RESULT_DETAILS: Final[dict[str, type | tuple[type, ...]]] = {
    "status": str,
    "duration_ms": (int, float),
    "artifact": str,
    "kernel_restarted": bool,
}
_USER_EXTRAS: Final = ("source", "sender", "sender_label", "message_id")
# Payload fields that name another event (file ids while parsing, event ids once written).
PAYLOAD_REFERENCES: Final = {
    "branch_summary": ("from_event_id",),
    "compaction": ("first_kept_event_id", "pinned_event_id"),
}


# -- the file's shapes (pydantic: this is a boundary) ----------------------------------------


class _Lenient(BaseModel):
    # pi adds fields over time; what we do not read is kept (custom events) or ignored.
    model_config = ConfigDict(extra="allow")


class _Header(_Lenient):
    type: Literal["session"]
    version: int = JSONL_MIN_VERSION
    id: str | None = None
    timestamp: str | None = None
    cwd: str | None = None


class _Entry(_Lenient):
    type: Annotated[str, Field(min_length=1)]
    id: str | None = None
    parentId: str | None = None
    timestamp: str | None = None


class _Text(_Lenient):
    type: Literal["text"]
    text: str


class _Image(_Lenient):
    type: Literal["image"]
    mimeType: str = "image"


class _Thinking(_Lenient):
    type: Literal["thinking"]
    thinking: str = ""


class _ToolCall(_Lenient):
    type: Literal["toolCall"]
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class _OtherBlock(_Lenient):
    type: str


def _block_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("text", "image", "thinking", "toolCall") else "other"


_Block = Annotated[
    Annotated[_Text, Tag("text")]
    | Annotated[_Image, Tag("image")]
    | Annotated[_Thinking, Tag("thinking")]
    | Annotated[_ToolCall, Tag("toolCall")]
    | Annotated[_OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]
_Content = str | list[_Block]


class _Cost(_Lenient):
    total: float = 0.0


class _Usage(_Lenient):
    input: Annotated[int, Field(ge=0)] = 0
    output: Annotated[int, Field(ge=0)] = 0
    cacheRead: Annotated[int, Field(ge=0)] = 0
    cacheWrite: Annotated[int, Field(ge=0)] = 0
    cost: _Cost | None = None


class _UserMessage(_Lenient):
    role: Literal["user"]
    content: _Content


class _AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: list[_Block] = Field(default_factory=list)
    provider: str = ""
    model: str = ""
    usage: _Usage | None = None
    stopReason: str = "stop"


class _ToolResultMessage(_Lenient):
    role: Literal["toolResult"]
    toolCallId: str
    toolName: str = "ipython"
    content: _Content = Field(default_factory=list)
    isError: bool = False
    details: Any = None


class _MessageEntry(_Lenient):
    message: dict[str, Any]


class _BranchSummaryEntry(_Lenient):
    summary: str
    fromId: str | None = None
    details: dict[str, Any] | None = None


class _Compaction(_Lenient):
    summary: str
    firstKeptEntryId: str | None = None
    firstKeptEntryIndex: Annotated[int, Field(ge=0)] | None = None  # version 1
    tokensBefore: Annotated[int, Field(ge=0)] = 0
    details: dict[str, Any] | None = None
    customInstructions: str | None = None


class _CompactionExtras(_Lenient):
    """What our compactions add to pi's entry (``primeAgent``; see ``jsonl``)."""

    tokensAfter: Annotated[int, Field(ge=0)] = 0
    reason: str = "imported"
    pinnedEntryId: str | None = None
    kernelNote: str | None = None
    model: str | None = None
    summarizedEvents: Annotated[int, Field(ge=0)] = 0


class _ModelChange(_Lenient):
    provider: str = ""
    modelId: str = ""


class _CustomEntry(_Lenient):
    customType: str | None = None
    data: Any = None


class _SessionInfo(_Lenient):
    name: str | None = None


_MESSAGE_MODELS: dict[str, TypeAdapter[Any]] = {
    "user": TypeAdapter(_UserMessage),
    "assistant": TypeAdapter(_AssistantMessage),
    "toolResult": TypeAdapter(_ToolResultMessage),
}


# -- parsing ---------------------------------------------------------------------------------


@dataclass
class Draft:
    line: int
    key: str  # the entry's id in the file (synthesized for version 1)
    parent: str | None
    type: str  # our event type
    payload: dict[str, Any]
    ts: datetime
    model: str | None = None  # "provider/model" this entry names, if any
    # The entry as the file has it (ids as in the file; version 1 given its ids): kept as the
    # event's ``source_entry`` when it became one of IMPORTED_ENTRY_TYPES.
    entry: dict[str, Any] | None = None


@dataclass
class ParsedSession:
    """A validated file, not yet written: what ``import_session_jsonl`` inserts."""

    source: str
    version: int
    header_id: str | None
    created_at: datetime
    cwd: str | None
    drafts: list[Draft] = field(default_factory=list)
    leaf: str | None = None
    name: str | None = None
    header: dict[str, Any] = field(default_factory=dict)  # the header line as it was

    @property
    def model(self) -> str | None:
        """The newest model named on the active path (leaf → root)."""
        by_key = {d.key: d for d in self.drafts}
        key = self.leaf
        while key is not None and key in by_key:
            draft = by_key[key]
            if draft.model:
                return draft.model
            key = draft.parent
        return None


class _LineError(Exception):
    pass


def validation_reason(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    text = f"{where}: {err['msg']}" if where else str(err["msg"])
    return text[:_REASON_CHARS]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_ts(value: str | None, fallback: datetime) -> datetime:
    if not value:
        return fallback
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return fallback
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, _Text):
            parts.append(block.text)
        elif isinstance(block, _Image):
            parts.append(f"[image omitted: {block.mimeType}]")
    return "\n".join(parts)


def _model_name(provider: str, model: str) -> str | None:
    if not model:
        return None
    return f"{provider}/{model}" if provider else model


def _extras(message: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    extra = message.get(PRIME_AGENT_KEY)
    if not isinstance(extra, dict):
        return {}
    return {k: extra[k] for k in keys if extra.get(k) is not None}


def _custom(entry_type: str, raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fields = {k: v for k, v in raw.items() if k not in _BASE_KEYS}
    return "custom", {"entry_type": entry_type, "fields": fields}


def _message_event(raw: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    message = _MessageEntry.model_validate(raw).message
    role = message.get("role")
    adapter = _MESSAGE_MODELS.get(role) if isinstance(role, str) else None
    if adapter is None:  # custom, bashExecution, summaries, roles we do not know
        kind, payload = _custom("message", raw)
        return kind, payload, None
    parsed = adapter.validate_python(message)
    if isinstance(parsed, _UserMessage):
        return (
            "user_message",
            {"text": _text(parsed.content), **_extras(message, _USER_EXTRAS)},
            None,
        )
    if isinstance(parsed, _ToolResultMessage):
        details = parsed.details if isinstance(parsed.details, dict) else {}
        kept = {
            k: details[k]
            for k, kinds in _TOOL_RESULT_DETAILS.items()
            if isinstance(details.get(k), kinds)
        }
        return (
            "tool_result",
            {
                "tool_call_id": parsed.toolCallId,
                "name": parsed.toolName,
                "text": _text(parsed.content),
                "is_error": parsed.isError,
                **kept,
            },
            None,
        )
    assert isinstance(parsed, _AssistantMessage)
    calls = []
    for block in parsed.content:
        if isinstance(block, _ToolCall):
            args = block.arguments
            raw_args = args.get("_raw") if set(args) == {"_raw"} else None
            text = raw_args if isinstance(raw_args, str) else json.dumps(args, ensure_ascii=False)
            calls.append({"id": block.id, "name": block.name, "arguments": text})
    reply: dict[str, Any] = {
        "text": "".join(b.text for b in parsed.content if isinstance(b, _Text)),
        "tool_calls": calls,
        "stop_reason": _PI_STOP_REASONS.get(parsed.stopReason, "stop"),
        "provider": parsed.provider,
        "model": parsed.model,
        **_extras(message, ("fenced",)),
    }
    thoughts = [b.thinking for b in parsed.content if isinstance(b, _Thinking) and b.thinking]
    if thoughts:
        reply["thinking"] = "\n\n".join(thoughts)
    usage = parsed.usage
    if usage is not None:
        cost = usage.cost.total if usage.cost is not None else 0.0
        tokens = (usage.input, usage.output, usage.cacheRead, usage.cacheWrite)
        if any(tokens) or cost > 0:
            reply["usage"] = {
                "provider": parsed.provider,
                "model": parsed.model,
                "input": usage.input,
                "output": usage.output,
                "cache_read": usage.cacheRead,
                "cache_write": usage.cacheWrite,
                # pi writes 0 for a price it does not know: never read it as "free".
                "cost_usd": cost if cost > 0 else None,
            }
    return "assistant_message", reply, _model_name(parsed.provider, parsed.model)


def _files(details: dict[str, Any] | None, key: str) -> list[str]:
    value = (details or {}).get(key)
    return [str(x) for x in value] if isinstance(value, list) else []


def _compaction(raw: dict[str, Any]) -> dict[str, Any]:
    entry = _Compaction.model_validate(raw)
    extra_raw = raw.get(PRIME_AGENT_KEY)
    extra = _CompactionExtras.model_validate(extra_raw if isinstance(extra_raw, dict) else {})
    return {
        "summary": entry.summary,
        "first_kept_event_id": entry.firstKeptEntryId,
        "tokens_before": entry.tokensBefore,
        "tokens_after": extra.tokensAfter,
        "reason": extra.reason,
        "pinned_event_id": extra.pinnedEntryId,
        "instructions": entry.customInstructions,
        "read_files": _files(entry.details, "readFiles"),
        "modified_files": _files(entry.details, "modifiedFiles"),
        "kernel_note": extra.kernelNote,
        "model": extra.model,
        "summarized_events": extra.summarizedEvents,
    }


def _convert(entry_type: str, raw: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    """(event type, payload with references still as the file's ids, model it names)."""
    if entry_type == "message":
        return _message_event(raw)
    if entry_type == "branch_summary":
        entry = _BranchSummaryEntry.model_validate(raw)
        payload = {"summary": entry.summary, "from_event_id": entry.fromId}
        return "branch_summary", {**payload, "details": entry.details}, None
    if entry_type == "compaction":
        payload = _compaction(raw)
        return "compaction", payload, payload["model"]
    if entry_type == "model_change":
        change = _ModelChange.model_validate(raw)
        model = _model_name(change.provider, change.modelId)
        if model is not None:
            previous = _extras(raw, ("previous",))
            return "model_change", {"model": model, **previous}, model
    if entry_type == "custom":
        custom = _CustomEntry.model_validate(raw)
        ours = (custom.customType or "").removeprefix(CUSTOM_TYPE_PREFIX)
        shape = EVENT_PAYLOADS.get(ours) if custom.customType != ours else None
        if shape is not None and ours not in _MESSAGE_TYPES and isinstance(custom.data, dict):
            try:  # our own event, exported as a custom entry: restore it
                return ours, shape.model_validate(custom.data).model_dump(mode="json"), None
            except ValidationError:
                pass  # someone else's data under our prefix: keep it as it is
    kind, payload = _custom(entry_type, raw)
    return kind, payload, None


def _load_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise _LineError(f"not JSON ({str(exc)[:_REASON_CHARS]})") from None
    if not isinstance(value, dict):
        raise _LineError("not a JSON object")
    return value


def parse_session_jsonl(lines: Iterator[tuple[int, str]], *, source: str) -> ParsedSession:
    """Validate a session file given as ``(line number, text)`` pairs; raise ``UserError``
    naming the first bad line."""
    line_no = 0
    try:
        parsed: ParsedSession | None = None
        ids: set[str] = set()
        aliases: dict[str, str | None] = {}  # dropped leaf markers → their parents
        previous: str | None = None
        v1_entries: list[str | None] = [None]  # index 0 is the header
        v1_compactions: list[tuple[Draft, int]] = []  # (draft, firstKeptEntryIndex)
        last_ts = utcnow()
        for line_no, text in lines:
            if not text.strip():
                continue
            raw = _load_json(text)
            if parsed is None:
                try:
                    header = _Header.model_validate(raw)
                except ValidationError as exc:
                    raise _LineError(f"not a session header ({validation_reason(exc)})") from None
                if not JSONL_MIN_VERSION <= header.version <= JSONL_VERSION:
                    raise _LineError(
                        f"session format version {header.version}; this prime-agent reads "
                        f"versions {JSONL_MIN_VERSION} to {JSONL_VERSION}"
                    )
                last_ts = _parse_ts(header.timestamp, last_ts)
                parsed = ParsedSession(
                    source, header.version, header.id, last_ts, header.cwd, header=raw
                )
                continue
            try:
                entry = _Entry.model_validate(raw)
            except ValidationError as exc:
                raise _LineError(validation_reason(exc)) from None
            if entry.type == "session":
                raise _LineError("a second session header")
            if parsed.version < _FIRST_TREE_VERSION:
                key: str = _v1_id(parsed.header_id or source, line_no, ids)
                parent = previous
                v1_entries.append(key)
            else:
                if not entry.id:
                    raise _LineError(f"a version {parsed.version} entry needs an id")
                key, parent = entry.id, entry.parentId
                while parent in aliases:
                    parent = aliases[parent]
                if parent is not None and parent not in ids:
                    raise _LineError(f"parentId {parent[:40]!r} names no earlier entry")
            if key in ids or key in aliases:
                raise _LineError(f"id {key[:40]!r} appears twice")
            if parsed.version < _FIRST_CUSTOM_ROLE_VERSION:
                message = raw.get("message")
                if isinstance(message, dict) and message.get("role") == _HOOK_ROLE:
                    raw = {**raw, "message": {**message, "role": _CUSTOM_ROLE}}
            if entry.type == "custom" and raw.get("customType") == LEAF_MARKER:
                aliases[key] = parent  # our export's leaf marker: a pointer, not history
                parsed.leaf = parent
                continue
            try:
                type_, payload, model = _convert(entry.type, raw)
            except ValidationError as exc:
                raise _LineError(f"{entry.type} entry: {validation_reason(exc)}") from None
            last_ts = _parse_ts(entry.timestamp, last_ts)
            kept = (
                _as_entry(raw, key, parent)
                if entry.type != "custom" and type_ in IMPORTED_ENTRY_TYPES
                else None
            )
            if type_ == "custom":
                payload["entry_id"] = key
            draft = Draft(line_no, key, parent, type_, payload, last_ts, model, kept)
            if entry.type == "compaction" and parsed.version < _FIRST_TREE_VERSION:
                index = _Compaction.model_validate(raw).firstKeptEntryIndex
                if index is not None:
                    v1_compactions.append((draft, index))
            if entry.type == "session_info":
                parsed.name = _SessionInfo.model_validate(raw).name or parsed.name
            parsed.drafts.append(draft)
            ids.add(key)
            parsed.leaf = key
            previous = key
        if parsed is None:
            line_no = max(line_no, 1)
            raise _LineError("no session header (the file is empty)")
    except _LineError as exc:
        raise UserError(f"{source} line {line_no}: {exc}") from None
    for draft, index in v1_compactions:  # version 1 named the kept entry by its position
        target = v1_entries[index] if index < len(v1_entries) else None
        draft.payload["first_kept_event_id"] = target
        if draft.entry is not None:  # as pi migrates it: the kept entry by id
            draft.entry = {
                ("firstKeptEntryId" if k == "firstKeptEntryIndex" else k): (
                    target if k == "firstKeptEntryIndex" else v
                )
                for k, v in draft.entry.items()
            }
    return parsed


def _v1_id(seed: str, line_no: int, taken: set[str]) -> str:
    """A version 1 entry's id: hex digits of a hash of the file's header id and the line, so
    importing the same file twice gives the same ids (rehashed past one already taken)."""
    attempt = 0
    while True:
        text = f"{seed}:{line_no}" if attempt == 0 else f"{seed}:{line_no}#{attempt}"
        key = hashlib.sha256(text.encode()).hexdigest()[:_V1_ID_HEX_CHARS]
        if key not in taken:
            return key
        attempt += 1


def _as_entry(raw: dict[str, Any], key: str, parent: str | None) -> dict[str, Any]:
    """The entry as kept: the file's fields in the file's order, ``id`` and ``parentId`` set
    (a version 1 entry gets them right after ``type``, where pi writes them)."""
    if "id" in raw:
        return {**raw, "id": key, "parentId": parent}
    rest = {k: v for k, v in raw.items() if k not in ("type", "parentId")}
    return {"type": raw["type"], "id": key, "parentId": parent, **rest}


def read_session_file(path: Path) -> ParsedSession:
    """Read and validate ``path`` (blocking: call it in a thread)."""
    try:
        with open(path, "rb") as fh:
            return parse_session_jsonl(_numbered_lines(fh, str(path)), source=str(path))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def _numbered_lines(fh: BinaryIO, source: str) -> Iterator[tuple[int, str]]:
    number = 0
    while True:
        raw = fh.readline(IMPORT_MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > IMPORT_MAX_LINE_BYTES:
            raise UserError(f"{source} line {number}: longer than {IMPORT_MAX_LINE_BYTES} bytes")
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{source} line {number}: not UTF-8 text") from None
