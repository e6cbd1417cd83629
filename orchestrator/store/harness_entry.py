"""The Continual Harness entry on the host: its record, its writes, and the host's checks.

An entry is one piece of supplemental harness state the agent can read and edit: a prompt
note, a memory, a skill or a subagent spec. Everything that writes one (the kernel's host
requests, ``/refine``, the CLI) goes through ``orchestrator.store.harness.write_entry``, which
checks the write with the helpers here *before* touching the database, so a refused edit leaves
nothing behind (R20, docs/reliability.md). The record is what the store keeps, so it lives in
the store's package; the harness package above builds on it and imports it from here.

The rules themselves (kinds, scopes, ids, limits, the skill contract) are written once in
``orchestrator/runtime/entry_rules.py``, which the kernel checks its arguments with too; each
``check_*`` here applies that rule and turns its ``TypeError`` / ``ValueError`` into
``HarnessInvalid`` (code ``invalid_argument``). What only the host knows stays here: who wrote
an entry (``Source``), the actions, the owner of global entries and the default paths.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeVar, get_args

from orchestrator.errors import HarnessInvalid
from orchestrator.runtime import entry_rules
from orchestrator.runtime.entry_rules import (
    BASE_PROMPT_ID,
    CONTENT_MAX_CHARS,
    ENTRY_ID_MAX_CHARS,
    ENTRY_ID_RE,
    JSON_FIELD_MAX_BYTES,
    KINDS,
    PATH_MAX_CHARS,
    REASON_MAX_CHARS,
    SCOPES,
    SKILL_REFERENCE_KEYS,
    SKILL_REFERENCE_TYPE,
    TITLE_MAX_CHARS,
    Kind,
    Scope,
)

__all__ = [
    "ACTIONS",
    "BASE_PROMPT_ID",
    "CONTENT_MAX_CHARS",
    "DEFAULT_PATH",
    "DEFAULT_PROMPT_PATH",
    "ENTRY_ID_MAX_CHARS",
    "ENTRY_ID_RE",
    "GLOBAL_OWNER",
    "JSON_FIELD_MAX_BYTES",
    "KINDS",
    "PATH_MAX_CHARS",
    "REASON_MAX_CHARS",
    "SCOPES",
    "SKILL_REFERENCE_KEYS",
    "SKILL_REFERENCE_TYPE",
    "SOURCES",
    "TITLE_MAX_CHARS",
    "Action",
    "EntryWrite",
    "HarnessEntry",
    "Kind",
    "Scope",
    "Source",
    "check_action",
    "check_content",
    "check_entry_id",
    "check_json_field",
    "check_kind",
    "check_path",
    "check_reason",
    "check_scope",
    "check_skill_contract",
    "check_source",
    "check_title",
    "default_path",
    "scope_of_owner",
    "slugify",
]

Source = Literal["agent", "refine", "user"]  # the kernel, /refine, the CLI
SOURCES: Final[tuple[Source, ...]] = get_args(Source)
Action = Literal["create", "update", "delete"]
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

# The owner of global entries; local entries are owned by their session tree's root id.
GLOBAL_OWNER: Final = "global"

# Where an entry is filed when the writer names no path: prompt notes are policy.
DEFAULT_PROMPT_PATH: Final = "policy"
DEFAULT_PATH: Final = "general"

# How much of a refused value an error message quotes.
_QUOTE_CHARS: Final = 60

_T = TypeVar("_T")


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + "…"


def _ruled(rule: Callable[[object], _T], value: object) -> _T:
    """``rule(value)``, its refusal as ``HarnessInvalid`` (one line, nothing written)."""
    try:
        return rule(value)
    except (TypeError, ValueError) as exc:
        raise HarnessInvalid(str(exc)) from None


# -- names ---------------------------------------------------------------------------------------


def slugify(title: str) -> str:
    """A title's default id (``entry_rules.slugify``); refused when there is none to derive."""
    slug = entry_rules.slugify(title)
    if not slug:
        raise HarnessInvalid(
            f"cannot derive an id from title {_quote(title)}: it has no letters or digits"
        )
    return slug


def check_entry_id(value: object) -> str:
    return _ruled(entry_rules.check_entry_id, value)


def check_kind(value: object) -> Kind:
    return _ruled(entry_rules.check_kind, value)


def check_scope(value: object) -> Scope:
    return _ruled(entry_rules.check_scope, value)


def check_source(value: object) -> Source:
    for source in SOURCES:
        if value == source:
            return source
    raise HarnessInvalid(f"unknown source {_quote(value)}: expected one of {', '.join(SOURCES)}")


def check_action(value: object) -> Action:
    for action in ACTIONS:
        if value == action:
            return action
    raise HarnessInvalid(f"unknown action {_quote(value)}: expected one of {', '.join(ACTIONS)}")


def scope_of_owner(owner: str) -> Scope:
    return "global" if owner == GLOBAL_OWNER else "local"


def default_path(kind: Kind) -> str:
    return DEFAULT_PROMPT_PATH if kind == "prompt" else DEFAULT_PATH


# -- fields --------------------------------------------------------------------------------------


def check_title(value: object) -> str:
    return _ruled(entry_rules.check_title, value)


def check_content(value: object) -> str:
    return _ruled(entry_rules.check_content, value)


def check_path(value: object) -> str:
    return _ruled(entry_rules.check_path, value)


def check_reason(value: object) -> str:
    return _ruled(entry_rules.check_reason, value)


def check_json_field(name: str, value: object) -> dict[str, Any]:
    """A JSON object of bounded size (``reference``, ``arguments``, ``metadata``)."""
    return _ruled(lambda v: entry_rules.check_json_object(name, v), value)


def check_skill_contract(reference: object, arguments: object) -> None:
    """A skill names the Python callable that implements it and describes each argument.

    ``reference`` is ``{"type": "python", "import": "pkg.module", "callable": "name"}``;
    ``arguments`` maps each argument name to a description string or a JSON object.
    """
    _ruled(entry_rules.check_skill_reference, reference)
    _ruled(entry_rules.check_skill_arguments, arguments)


# -- the model -----------------------------------------------------------------------------------


def _wire_time(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


@dataclass(frozen=True)
class HarnessEntry:
    """One version of an entry: a head row of ``harness_entries`` or a ``harness_versions`` row.

    ``created_at`` is when version 1 was written, ``updated_at`` when this version was. A
    tombstone (``deleted``) keeps the last title and content so a rollback can restore them.
    """

    owner: str
    scope: Scope
    kind: Kind
    id: str
    version: int
    title: str
    content: str
    path: str
    reference: dict[str, Any]
    arguments: dict[str, Any]
    metadata: dict[str, Any]
    deleted: bool
    source: Source
    reason: str
    session_id: str | None
    refinement_id: str | None
    created_at: datetime
    updated_at: datetime

    def to_wire(self) -> dict[str, Any]:
        """JSON types only (times as ISO-8601 UTC); the dicts are copies."""
        return {
            "owner": self.owner,
            "scope": self.scope,
            "kind": self.kind,
            "id": self.id,
            "version": self.version,
            "title": self.title,
            "content": self.content,
            "path": self.path,
            "reference": copy.deepcopy(self.reference),
            "arguments": copy.deepcopy(self.arguments),
            "metadata": copy.deepcopy(self.metadata),
            "deleted": self.deleted,
            "source": self.source,
            "reason": self.reason,
            "session_id": self.session_id,
            "refinement_id": self.refinement_id,
            "created_at": _wire_time(self.created_at),
            "updated_at": _wire_time(self.updated_at),
        }


@dataclass(frozen=True)
class EntryWrite:
    """What a create, update or delete says about an entry.

    On update a ``None`` field keeps the head's value; on create ``title`` and ``content`` are
    required and ``path`` defaults per kind (``default_path``). A delete uses only kind and id.
    """

    kind: Kind
    id: str
    title: str | None = None
    content: str | None = None
    path: str | None = None
    reference: dict[str, Any] | None = None
    arguments: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
