"""Phase 1 of ``/refine``: the planner's prompt and the parsing of its reply (docs/harness.md).

The planner is one model call that reads the session's evidence (the harness as it is, the
refinements already made, the recent conversation) and answers with a JSON plan of small edits.
The model's reply is a boundary like any other: it may wrap the JSON in prose or a fenced
block (found by tolerant parsing), it may be cut off by the output budget, and it may propose
something invalid. Every one of those becomes a ``PlanFailed`` with a one-line ``reason`` text
("output budget exhausted", "not JSON: …", "edit 2: …"), and a failed plan changes nothing:
the plan is validated whole here, before phase 2 ever sees it. The default, when the user
gives no instructions, is to change nothing without clear evidence: an empty ``edits`` list is
a good answer and is applied (and recorded) as "no change".

The base system prompt is immutable, so an edit that targets it (id ``base_system_prompt``)
or names an unknown kind invalidates the plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.errors import HarnessInvalid, PrimeAgentError
from orchestrator.store.harness_entry import (
    GLOBAL_OWNER,
    KINDS,
    REASON_MAX_CHARS,
    Action,
    HarnessEntry,
    Kind,
    Scope,
    check_content,
    check_entry_id,
    check_json_field,
    check_path,
    check_skill_contract,
    check_title,
    slugify,
)
from orchestrator.store.history_entries import entry_of
from orchestrator.store.queries import EventRecord

__all__ = [
    "CONVERSATION_MAX_CHARS",
    "CONVERSATION_TYPES",
    "ENTRY_PREVIEW_CHARS",
    "HISTORY_MAX",
    "NO_INSTRUCTIONS",
    "PLAN_EDITS_MAX",
    "PLAN_TEXT_MAX_CHARS",
    "REFINE_SYSTEM_PROMPT",
    "STATE_ENTRIES_PER_KIND",
    "TRUNCATED",
    "HistoryItem",
    "Plan",
    "PlanFailReason",
    "PlanFailed",
    "PlannedEdit",
    "build_messages",
    "extract_object",
    "parse_plan",
    "render_history",
    "render_state",
    "serialize_conversation",
]

# What the planner sees (the reference's bounds).
STATE_ENTRIES_PER_KIND: Final = 40  # entries listed per kind in <current_harness_state>
ENTRY_PREVIEW_CHARS: Final = 240  # of each entry's content
HISTORY_MAX: Final = 20  # refinements in <refinement_history>
CONVERSATION_MAX_CHARS: Final = 80_000  # the newest part of the serialised conversation
# What it may answer.
PLAN_EDITS_MAX: Final = 10
PLAN_TEXT_MAX_CHARS: Final = 4_000  # summary, rationale, expected outcome (each)
# How many opening braces brace slicing tries before it gives up on a reply.
BRACE_STARTS_MAX: Final = 32
ERROR_TEXT_MAX_CHARS: Final = 300

# Event types that are the conversation (usage, turn ends, retries and imported custom
# entries are bookkeeping, not evidence the model should read as dialogue).
CONVERSATION_TYPES: Final[tuple[str, ...]] = (
    "user_message",
    "assistant_message",
    "tool_result",
    "error",
    "notice",
    "compaction",
    "branch_summary",
    "model_change",
    "aborted",
)

TRUNCATED: Final = "output budget exhausted"
NO_INSTRUCTIONS: Final = (
    "No specific instructions. Change nothing without clear evidence in the conversation: an "
    "empty edits list is the right answer when the evidence is weak."
)
# Ids are sometimes written the way the prompt section shows them ("local:foo").
_ID_PREFIXES: Final = ("local:", "global:")

REFINE_SYSTEM_PROMPT: Final = (
    "You refine the supplemental harness of an agent that works by running Python in an "
    "IPython kernel. The harness is a set of small, versioned entries added to the agent's "
    "system prompt after its fixed base prompt:\n"
    "- prompt: a standing note of guidance (policy, conventions, what to avoid);\n"
    "- memory: a fact worth keeping (paths, names, settings, results, user preferences);\n"
    "- skill: the description of a Python callable the agent can use: reference "
    '{"type": "python", "import": "package.module", "callable": "name"} and arguments '
    "mapping each argument name to its description;\n"
    "- subagent: the spec of a task-shaped child agent (its role and how to brief it).\n"
    "The base system prompt is fixed and is not an entry: never target it.\n\n"
    "Read the conversation for evidence: repeated mistakes, errors and retries, facts the "
    "agent had to rediscover, corrections from the user, work that a skill would shorten. "
    "Propose the fewest and smallest edits that would make the agent's future turns better, "
    "each with a reason that names its evidence. Prefer updating an existing entry to "
    "creating a near-duplicate, and delete an entry that proved wrong. Without clear "
    "evidence change nothing: an empty edits list is a good answer.\n\n"
    "Reply with exactly one JSON object and nothing else:\n"
    '{"summary": "one line: what this refinement does",\n'
    ' "rationale": "the evidence, briefly",\n'
    ' "expected_outcome": "what should measurably improve (fewer errors, retries, tokens)",\n'
    ' "edits": [{"action": "create" | "update" | "delete", "kind": "prompt" | "memory" | '
    '"skill" | "subagent", "id": "lower_case_id (required for update and delete)", '
    '"title": "...", "content": "...", "path": "optional folder-like label", '
    '"reference": {}, "arguments": {}, "metadata": {}, "reason": "why this edit"}]}\n'
    f"A create needs title and content; an update names only the fields it changes. At most "
    f"{PLAN_EDITS_MAX} edits."
)

_T = TypeVar("_T")

PlanFailReason = Literal["truncated", "not_json", "invalid", "model_failed"]


class PlanFailed(PrimeAgentError):
    """A plan that cannot be used; ``reason`` is the kind, the message one line for people."""

    def __init__(self, reason: PlanFailReason, message: str):
        super().__init__(message)
        self.reason: PlanFailReason = reason


# -- the plan (inside) -----------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedEdit:
    action: Action
    kind: Kind
    id: str
    reason: str
    title: str | None = None
    content: str | None = None
    path: str | None = None
    reference: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    @property
    def target(self) -> str:
        return f"{self.kind}:{self.id}"

    def to_record(self, baseline_version: int | None) -> dict[str, Any]:
        """The edit as the ``refinements.edits`` column stores it (absent fields left out)."""
        record: dict[str, Any] = {"action": self.action, "kind": self.kind, "id": self.id}
        for name in ("title", "content", "path", "reference", "arguments", "metadata"):
            value = getattr(self, name)
            if value is not None:
                record[name] = value
        record["reason"] = self.reason
        record["baseline_version"] = baseline_version
        return record


@dataclass(frozen=True)
class Plan:
    summary: str
    rationale: str
    expected_outcome: str
    edits: tuple[PlannedEdit, ...]


# -- the plan (the boundary) -----------------------------------------------------------------


def _harness_check(value: Any, check: Callable[[Any], _T]) -> _T:
    """Run an ``entries`` check inside a pydantic validator (which wants ``ValueError``)."""
    try:
        return check(value)
    except HarnessInvalid as exc:
        raise ValueError(str(exc)) from None


class _EditIn(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    action: Action
    kind: Kind
    id: str | None = None
    title: str | None = None
    content: str | None = None
    path: str | None = None
    reference: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    reason: str = Field(min_length=1, max_length=REASON_MAX_CHARS)

    @field_validator("id")
    @classmethod
    def _plain_id(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        for prefix in _ID_PREFIXES:
            if value.startswith(prefix):
                value = value[len(prefix) :]
        return _harness_check(value, check_entry_id)

    @model_validator(mode="after")
    def _complete(self) -> _EditIn:
        if self.action == "create":
            if not self.title or not self.content:
                raise ValueError("a create needs a title and content")
            if self.id is None:
                derived = _harness_check(self.title, slugify)
                self.id = _harness_check(derived, check_entry_id)
        elif self.id is None:
            raise ValueError(f"an {self.action} needs the id of the entry")
        if self.action == "update" and all(
            getattr(self, name) is None
            for name in ("title", "content", "path", "reference", "arguments", "metadata")
        ):
            raise ValueError("an update changes nothing: name at least one field")
        if self.action != "delete":
            self._check_fields()
        return self

    def _check_fields(self) -> None:
        """The checks ``write_entry`` will make, made now so a bad plan fails whole."""
        for value, check in (
            (self.title, check_title),
            (self.content, check_content),
            (self.path, check_path),
        ):
            if value is not None:
                _harness_check(value, check)
        for name in ("reference", "arguments", "metadata"):
            value = getattr(self, name)
            if value is not None:
                _harness_check(value, partial(check_json_field, name))
        if self.action == "create" and self.kind == "skill":
            _harness_check(None, lambda _: check_skill_contract(self.reference, self.arguments))


class _PlanIn(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    summary: str = Field(min_length=1, max_length=PLAN_TEXT_MAX_CHARS)
    rationale: str = Field(default="", max_length=PLAN_TEXT_MAX_CHARS)
    expected_outcome: str = Field(
        default="",
        max_length=PLAN_TEXT_MAX_CHARS,
        validation_alias=AliasChoices("expected_outcome", "expectedOutcome"),
    )
    edits: list[_EditIn]

    @field_validator("edits", mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > PLAN_EDITS_MAX:
            raise ValueError(f"{len(value)} edits; a plan has at most {PLAN_EDITS_MAX}")
        return value


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= ERROR_TEXT_MAX_CHARS else line[: ERROR_TEXT_MAX_CHARS - 1] + "…"


def _validation_reason(exc: ValidationError) -> str:
    """The first error as one line: ``edit 2: kind: ...`` or ``summary: ...``."""
    error = exc.errors(include_url=False)[0]
    loc = list(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    where = ""
    if len(loc) >= 2 and loc[0] == "edits" and isinstance(loc[1], int):
        where = f"edit {loc[1] + 1}"
        loc = loc[2:]
    fields = ".".join(str(part) for part in loc)
    prefix = ": ".join(part for part in (where, fields) if part)
    return _one_line(f"{prefix}: {message}" if prefix else message)


def _scan_object(text: str, start: int) -> int | None:
    """The index just past the ``}`` that closes the ``{`` at ``start`` (JSON strings
    skipped), or None when the text ends first: a reply cut off mid-object."""
    depth = 0
    in_string = False
    escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


_PLAN_KEYS: Final = frozenset({"summary", "edits"})
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\r?\n(.*?)```", re.DOTALL)


def extract_object(text: str) -> dict[str, Any]:
    """The JSON object in a reply: the whole text, else a fenced block, else the first
    balanced ``{…}`` that parses. An object that never closes means the reply was cut off."""
    stripped = text.strip()
    if not stripped:
        raise PlanFailed("not_json", "not JSON: the reply is empty")
    candidates = [stripped, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    first_error: str | None = None
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError as exc:
            first_error = first_error or str(exc)
            continue
        if isinstance(value, dict):
            return value
        first_error = first_error or f"expected an object, got {type(value).__name__}"
    # Brace slicing. An object with a plan's keys wins; an inner object of a plan cut off
    # mid-way (one complete edit) must not pass for the plan, so without one the reply is
    # truncated when some object never closed, else the first object found is the answer.
    unbalanced = False
    first_object: dict[str, Any] | None = None
    start = text.find("{")
    tries = 0
    while start >= 0 and tries < BRACE_STARTS_MAX:
        tries += 1
        end = _scan_object(text, start)
        if end is None:
            unbalanced = True
        else:
            try:
                value = json.loads(text[start:end])
            except ValueError:
                value = None
            if isinstance(value, dict):
                if _PLAN_KEYS & value.keys():
                    return value
                first_object = first_object or value
        start = text.find("{", start + 1)
    if first_object is not None and not unbalanced:
        return first_object
    if unbalanced:
        raise PlanFailed("truncated", TRUNCATED)
    if "{" not in text:
        raise PlanFailed("not_json", "not JSON: the reply has no JSON object")
    raise PlanFailed("not_json", _one_line(f"not JSON: {first_error}"))


def parse_plan(text: str, *, finish_reason: str) -> Plan:
    """The validated plan in a reply, or ``PlanFailed``. ``finish_reason`` ``"length"``
    (the model hit its output limit) is a truncated reply even when some JSON parses."""
    if finish_reason == "length":
        raise PlanFailed("truncated", TRUNCATED)
    raw = extract_object(text)
    try:
        parsed = _PlanIn.model_validate(raw)
    except ValidationError as exc:
        raise PlanFailed("invalid", _validation_reason(exc)) from None
    edits: list[PlannedEdit] = []
    seen: dict[str, int] = {}
    for number, edit in enumerate(parsed.edits, start=1):
        assert edit.id is not None  # _EditIn._complete
        planned = PlannedEdit(
            action=edit.action,
            kind=edit.kind,
            id=edit.id,
            reason=edit.reason,
            title=edit.title,
            content=edit.content,
            path=edit.path,
            reference=edit.reference,
            arguments=edit.arguments,
            metadata=edit.metadata,
        )
        if planned.target in seen:
            raise PlanFailed(
                "invalid",
                f"edit {number}: {planned.target} is already the target of edit "
                f"{seen[planned.target]}",
            )
        seen[planned.target] = number
        edits.append(planned)
    return Plan(
        summary=_one_line(parsed.summary),
        rationale=parsed.rationale,
        expected_outcome=parsed.expected_outcome,
        edits=tuple(edits),
    )


# -- the prompt ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryItem:
    """One earlier refinement as the planner sees it."""

    id: str
    status: str
    summary: str | None
    changes: tuple[str, ...]  # "create memory:foo" (applied edits only, when applied)
    outcome: str | None  # the measured outcome's line, once measured
    rollback_of: str | None = None


def _compact(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _json_short(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def render_state(entries: Sequence[HarnessEntry], *, per_kind: int) -> str:
    """The harness as it is: per kind, the count and each entry's id, version and a preview.
    ``entries`` were read at most ``per_kind`` per kind and owner (newest first)."""
    lines: list[str] = []
    for kind in KINDS:
        of_kind = [e for e in entries if e.kind == kind]
        bound = "" if len(of_kind) < per_kind else f" (the newest {per_kind} per scope shown)"
        lines.append(f"## {kind}: {len(of_kind)} entries{bound}")
        for entry in of_kind:
            extras = ""
            if entry.reference:
                extras += f" ref={_json_short(entry.reference)}"
            if entry.arguments:
                extras += f" args={_json_short(entry.arguments)}"
            lines.append(
                f"- [{entry.scope}:{entry.id}] {_compact(entry.title, ENTRY_PREVIEW_CHARS)} "
                f"({entry.path}, v{entry.version}){extras}: "
                f"{_compact(entry.content, ENTRY_PREVIEW_CHARS)}"
            )
    return "\n".join(lines)


def render_history(items: Sequence[HistoryItem]) -> str:
    if not items:
        return "No earlier refinements."
    lines = []
    for item in items:
        what = f"rollback of {item.rollback_of}" if item.rollback_of else (item.summary or "")
        changes = f"; changes: {', '.join(item.changes)}" if item.changes else ""
        measured = f"; measured: {item.outcome}" if item.outcome else ""
        lines.append(
            f"- {item.id} [{item.status}] {_compact(what, ENTRY_PREVIEW_CHARS)}{changes}{measured}"
        )
    return "\n".join(lines)


def serialize_conversation(events: Sequence[EventRecord], *, max_chars: int) -> str:
    """The conversation as ``[role] text`` blocks, the newest ``max_chars`` of it (each
    event as ``history`` shows it: ``entry_of`` is the one place an event becomes role and
    text)."""
    blocks: list[str] = []
    used = 0
    for event in reversed(events):
        if event.type not in CONVERSATION_TYPES:
            continue
        entry = entry_of(event)
        if not entry["text"].strip():
            continue
        block = f"[{entry['role']}] {entry['text']}"
        if used + len(block) > max_chars:
            room = max_chars - used
            if room > 0:
                blocks.append("…" + block[len(block) - room + 1 :])
            break
        blocks.append(block)
        used += len(block) + 2
    return "\n\n".join(reversed(blocks))


def _scope_policy(scope: Scope) -> str:
    if scope == "global":
        return (
            "This is a global refinement: every edit applies to the user's global harness, "
            "which every session of this user sees. Only make edits that hold beyond this "
            "session's task."
        )
    return (
        "This is a local refinement: every edit applies to this session tree's local "
        "harness (ids shown as local:…). Entries shown as global:… are context only and are "
        f"not changed here (owner {GLOBAL_OWNER!r}); to adjust one for this task, create a "
        "local entry."
    )


def build_messages(
    *,
    state: Sequence[HarnessEntry],
    history: Sequence[HistoryItem],
    conversation: str,
    scope: Scope,
    instructions: str | None,
) -> list[dict[str, Any]]:
    """The planner's request: the system prompt, then one user message of tagged blocks."""
    wanted = instructions.strip() if instructions and instructions.strip() else NO_INSTRUCTIONS
    blocks = [
        "<current_harness_state>\n"
        f"{render_state(state, per_kind=STATE_ENTRIES_PER_KIND)}\n"
        "</current_harness_state>",
        f"<refinement_history>\n{render_history(history)}\n</refinement_history>",
        f"<conversation>\n{conversation or '(empty)'}\n</conversation>",
        f"<scope_policy>\n{_scope_policy(scope)}\n</scope_policy>",
        f"<user_refine_instructions>\n{wanted}\n</user_refine_instructions>",
        "Reply with the JSON object only.",
    ]
    return [
        {"role": "system", "content": REFINE_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(blocks)},
    ]
