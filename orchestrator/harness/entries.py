"""The Continual Harness entry: its kinds, ids, limits and validation (docs/harness.md).

An entry is one piece of supplemental harness state the agent can read and edit: a prompt
note, a memory, a skill or a subagent spec. Everything that writes one (the kernel's host
requests, ``/refine``, the CLI) goes through ``orchestrator.store.harness.write_entry``, which
checks the write with the helpers here *before* touching the database, so a refused edit leaves
nothing behind (R20, docs/reliability.md). The limits keep one entry small enough to list and to put
into a prompt: the harness section of the system prompt is rebuilt from these rows every turn.

The base system prompt is deliberately not an entry: it is a versioned constant, and the id
``base_system_prompt`` is refused for every kind so no edit can pretend to replace it.
"""

from __future__ import annotations

import copy
import json
import keyword
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, get_args

from orchestrator.errors import HarnessInvalid

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

Kind = Literal["prompt", "memory", "skill", "subagent"]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
Scope = Literal["local", "global"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)
Source = Literal["agent", "refine", "user"]  # the kernel, /refine, the CLI
SOURCES: Final[tuple[Source, ...]] = get_args(Source)
Action = Literal["create", "update", "delete"]
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

# The owner of global entries; local entries are owned by their session tree's root id.
GLOBAL_OWNER: Final = "global"
# The immutable base prompt's name: never an entry id, whatever the kind.
BASE_PROMPT_ID: Final = "base_system_prompt"

ENTRY_ID_MAX_CHARS: Final = 80
ENTRY_ID_RE: Final = re.compile(rf"^[a-z0-9][a-z0-9_]{{0,{ENTRY_ID_MAX_CHARS - 1}}}$")
TITLE_MAX_CHARS: Final = 200
CONTENT_MAX_CHARS: Final = 16_000
PATH_MAX_CHARS: Final = 200
REASON_MAX_CHARS: Final = 1_000
# reference / arguments / metadata, each measured as compact UTF-8 JSON.
JSON_FIELD_MAX_BYTES: Final = 16 * 1024

# Where an entry is filed when the writer names no path: prompt notes are policy.
DEFAULT_PROMPT_PATH: Final = "policy"
DEFAULT_PATH: Final = "general"

SKILL_REFERENCE_TYPE: Final = "python"
SKILL_REFERENCE_KEYS: Final = ("type", "import", "callable")

_SLUG_SEPARATORS = re.compile(r"[^a-z0-9]+")
# How much of a refused value an error message quotes.
_QUOTE_CHARS = 60


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + "…"


# -- names ---------------------------------------------------------------------------------------


def slugify(title: str) -> str:
    """A title's default id: lower case, each run of other characters one ``_``, trimmed."""
    slug = _SLUG_SEPARATORS.sub("_", title.lower()).strip("_")
    slug = slug[:ENTRY_ID_MAX_CHARS].rstrip("_")
    if not slug:
        raise HarnessInvalid(
            f"cannot derive an id from title {_quote(title)}: it has no letters or digits"
        )
    return slug


def check_entry_id(value: object) -> str:
    if not isinstance(value, str) or not ENTRY_ID_RE.match(value):
        raise HarnessInvalid(
            f"invalid entry id {_quote(value)}: expected lower-case letters, digits and _ "
            f"(starting with a letter or digit, at most {ENTRY_ID_MAX_CHARS} characters)"
        )
    if value == BASE_PROMPT_ID:
        raise HarnessInvalid(
            f"{BASE_PROMPT_ID!r} is the immutable base prompt, not a harness entry"
        )
    return value


def check_kind(value: object) -> Kind:
    for kind in KINDS:
        if value == kind:
            return kind
    raise HarnessInvalid(
        f"unknown harness kind {_quote(value)}: expected one of {', '.join(KINDS)}"
    )


def check_scope(value: object) -> Scope:
    for scope in SCOPES:
        if value == scope:
            return scope
    raise HarnessInvalid(f"unknown scope {_quote(value)}: expected one of {', '.join(SCOPES)}")


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


def _check_text(name: str, value: object, max_chars: int, *, blank_ok: bool) -> str:
    if not isinstance(value, str):
        raise HarnessInvalid(f"{name} must be a string, got {type(value).__name__}")
    if not blank_ok and not value.strip():
        raise HarnessInvalid(f"{name} must not be empty")
    if len(value) > max_chars:
        raise HarnessInvalid(f"{name} has {len(value):,} characters; the limit is {max_chars:,}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise HarnessInvalid(f"{name} is not valid text (it has an unpaired surrogate)") from None
    return value


def check_title(value: object) -> str:
    return _check_text("title", value, TITLE_MAX_CHARS, blank_ok=False)


def check_content(value: object) -> str:
    return _check_text("content", value, CONTENT_MAX_CHARS, blank_ok=False)


def check_path(value: object) -> str:
    path = _check_text("path", value, PATH_MAX_CHARS, blank_ok=False)
    if any(ch in path for ch in "\n\r\t"):
        raise HarnessInvalid("path must be one line")
    return path


def check_reason(value: object) -> str:
    return _check_text("reason", value, REASON_MAX_CHARS, blank_ok=True)


def check_json_field(name: str, value: object) -> dict[str, Any]:
    """A JSON object of bounded size (``reference``, ``arguments``, ``metadata``)."""
    if not isinstance(value, dict):
        raise HarnessInvalid(f"{name} must be a JSON object, got {type(value).__name__}")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise HarnessInvalid(f"{name} is not plain JSON: {exc}") from None
    if size > JSON_FIELD_MAX_BYTES:
        raise HarnessInvalid(
            f"{name} is {size:,} bytes as JSON; the limit is {JSON_FIELD_MAX_BYTES:,}"
        )
    return value


def _is_identifier(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def check_skill_contract(reference: object, arguments: object) -> None:
    """A skill names the Python callable that implements it and describes each argument.

    ``reference`` is ``{"type": "python", "import": "pkg.module", "callable": "name"}``;
    ``arguments`` maps each argument name to a description string or a JSON object.
    """
    if not isinstance(reference, dict):
        raise HarnessInvalid(
            "a skill needs reference {'type': 'python', 'import': module, 'callable': name}"
        )
    unknown = sorted(str(key) for key in reference if key not in SKILL_REFERENCE_KEYS)
    if unknown:
        raise HarnessInvalid(f"skill reference has unknown key(s) {', '.join(unknown)}")
    if reference.get("type") != SKILL_REFERENCE_TYPE:
        raise HarnessInvalid(
            f"skill reference type must be {SKILL_REFERENCE_TYPE!r}, "
            f"got {_quote(reference.get('type'))}"
        )
    module = reference.get("import")
    if not isinstance(module, str) or not all(_is_identifier(p) for p in module.split(".")):
        raise HarnessInvalid(
            f"skill reference import must be a dotted module name, got {_quote(module)}"
        )
    if not _is_identifier(reference.get("callable")):
        raise HarnessInvalid(
            "skill reference callable must be a Python identifier, "
            f"got {_quote(reference.get('callable'))}"
        )
    if not isinstance(arguments, dict) or not arguments:
        raise HarnessInvalid(
            "a skill needs arguments: an object mapping each argument name to its description"
        )
    for name, spec in arguments.items():
        if not _is_identifier(name):
            raise HarnessInvalid(f"skill argument name {_quote(name)} is not a Python identifier")
        if not isinstance(spec, str | dict):
            raise HarnessInvalid(
                f"skill argument {name!r} must be described by a string or an object, "
                f"got {type(spec).__name__}"
            )


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
