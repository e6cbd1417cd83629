"""``rlm.harness``: the agent reads and edits its own Continual Harness (in the kernel).

The harness is supplemental state the orchestrator puts into the system prompt (bounded) and
keeps versioned in its database: prompt notes, memories, skills (a Python callable plus its
argument contract) and subagent specs (docs/spec.md §3, §6; docs/harness.md). Every write is a new
version; nothing here touches the database or a file: each call is one host request, and the
host takes the writer's identity (and so the owner of ``local`` entries: the session tree's
root) from the request's NATS subject. ``refine`` (``refine.py``) asks the orchestrator to
make such edits itself, from the session's evidence.

- ``scope``: ``local`` entries belong to this session tree (a child sees and edits its root's),
  ``global`` ones outlive it. Writes default to ``local``; ``get``/``history`` without a scope
  look in ``local`` first, then ``global``; ``list`` without one lists both. An id written
  ``"local:<id>"`` / ``"global:<id>"`` (as the prompt shows them) names its scope.
- ``version``: pass the version you read to ``update``/``delete``; if the entry changed since,
  the write is refused with ``Conflict`` and nothing changes (no lost update, R20).
- A ``global`` write from here is a *proposal*: the user accepts it (``prime-agent harness
  accept ID``) before it reaches any prompt. The answer is the version accepting it would
  write, with ``entry.proposal`` set to the proposal's id (None for a write that happened).

Arguments are checked when a method is called, before anything is sent, with the rules the
host applies too (``entry_rules.py``, the one copy); the host checks again.

Wire shapes (``args`` -> ``result``; optional keys are left out when None; an entry is the
host's ``HarnessEntry.to_wire()``):

- ``harness.create``: ``{kind, title, content, id, scope, path?, reference?, arguments?,
  metadata?, reason?}`` -> entry
- ``harness.update``: ``{kind, id, scope, title?, content?, path?, reference?, arguments?,
  metadata?, version?, reason?}`` -> entry (the new version)
- ``harness.delete``: ``{kind, id, scope, version?, reason?}`` -> entry (the tombstone)
- ``harness.list``: ``{kind?, scope?}`` -> ``{entries: [entry], more}``
- ``harness.get``: ``{kind, id, scope?}`` -> entry
- ``harness.history``: ``{kind, id, scope?}`` -> ``{entries: [entry], more}``, oldest first
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from orchestrator.runtime import entry_rules
from orchestrator.runtime.arguments import reject_unknown
from orchestrator.runtime.entry_rules import (
    BASE_PROMPT_ID,
    CONTENT_MAX_CHARS,
    ENTRY_ID_MAX_CHARS,
    JSON_FIELD_MAX_BYTES,
    KINDS,
    PATH_MAX_CHARS,
    REASON_MAX_CHARS,
    SCOPES,
    SKILL_REFERENCE_KEYS,
    SKILL_REFERENCE_TYPE,
    TITLE_MAX_CHARS,
    slugify,
)
from orchestrator.runtime.errors import InternalHostError, InvalidArgument
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_items, as_object, field_opt_str, field_str

__all__ = [
    "BASE_PROMPT_ID",
    "CONTENT_MAX_CHARS",
    "DEFAULT_SCOPE",
    "ENTRY_ID_MAX_CHARS",
    "JSON_FIELD_MAX_BYTES",
    "KINDS",
    "PATH_MAX_CHARS",
    "REASON_MAX_CHARS",
    "SCOPES",
    "SKILL_REFERENCE_KEYS",
    "SKILL_REFERENCE_TYPE",
    "TITLE_MAX_CHARS",
    "Harness",
    "HarnessEntries",
    "HarnessEntry",
    "check_scope",
    "check_text",
    "harness",
    "slugify",
]

DEFAULT_SCOPE: Final = "local"
SCOPE_SEPARATOR: Final = ":"
FIRST_VERSION: Final = 1
REPR_CONTENT_CHARS: Final = 60  # how much content an entry's repr previews

_CUT_MARK: Final = "…"

_T = TypeVar("_T")


# --- argument checks --------------------------------------------------------------------------


def _ruled(where: str, rule: Callable[[object], _T], value: object) -> _T:
    """``rule(value)`` with ``where`` in front of its message: a wrong type stays a
    ``TypeError``, a broken rule becomes ``InvalidArgument``."""
    try:
        return rule(value)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise InvalidArgument(f"{where}: {exc}") from None


def check_text(
    where: str, what: str, value: object, max_chars: int, *, blank_ok: bool = False
) -> str:
    return _ruled(
        where, lambda v: entry_rules.check_text(what, v, max_chars, blank_ok=blank_ok), value
    )


def _kind(where: str, value: object) -> str:
    return _ruled(where, entry_rules.check_kind, value)


def check_scope(where: str, value: object) -> str | None:
    if value is None:
        return None
    return _ruled(where, entry_rules.check_scope, value)


def _entry_id(where: str, value: object) -> str:
    return _ruled(where, entry_rules.check_entry_id, value)


def _target(where: str, value: object, scope: object) -> tuple[str, str | None]:
    """(id, scope) from an id, a ``scope:id`` string or a ``HarnessEntry``; a scope given
    both ways must agree."""
    explicit = check_scope(where, scope)
    if isinstance(value, HarnessEntry):
        named: str | None = value.scope
        entry_id = value.id
    elif isinstance(value, str):
        prefix, sep, rest = value.partition(SCOPE_SEPARATOR)
        named, entry_id = (prefix, rest) if sep and prefix in SCOPES else (None, value)
    else:
        raise TypeError(
            f"{where}: id must be a str (or a HarnessEntry), not {type(value).__name__}"
        )
    if named is not None and explicit is not None and named != explicit:
        raise InvalidArgument(f"{where}: the id says scope {named!r} but scope={explicit!r}")
    return _entry_id(where, entry_id), named or explicit


def _version(where: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: version must be an int, not {type(value).__name__}")
    if value < FIRST_VERSION:
        raise InvalidArgument(f"{where}: version must be at least {FIRST_VERSION}, not {value}")
    return value


def _json_object(where: str, what: str, value: object) -> dict[str, Any]:
    return _ruled(where, lambda v: entry_rules.check_json_object(what, v), value)


def _skill_reference(where: str, value: object) -> dict[str, Any]:
    return _ruled(where, entry_rules.check_skill_reference, value)


def _skill_arguments(where: str, value: object) -> dict[str, Any]:
    return _ruled(where, entry_rules.check_skill_arguments, value)


def _put(args: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        args[key] = value


# --- result types -----------------------------------------------------------------------------


def _preview(text: str, limit: int = REPR_CONTENT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + _CUT_MARK


def _wire_dict(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True, repr=False)
class HarnessEntry:
    """One version of a harness entry (the kernel's copy of the host's ``to_wire()``).

    ``qualified_id`` (``"local:<id>"`` / ``"global:<id>"``) names it from any scope; pass
    ``version`` back to ``update``/``delete`` to refuse the write if it changed meanwhile.
    Times are ISO-8601 UTC strings. ``print(entry)`` shows the whole content.
    """

    kind: str
    id: str
    scope: str
    version: int
    title: str
    content: str
    path: str = ""
    reference: dict[str, Any] = field(default_factory=dict, hash=False)
    arguments: dict[str, Any] = field(default_factory=dict, hash=False)
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    deleted: bool = False
    source: str = ""
    reason: str = ""
    owner: str = ""
    session_id: str | None = None
    refinement_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    proposal: str | None = None  # a global write waiting for the user: the proposal's id

    @classmethod
    def from_wire(cls, value: object, where: str) -> HarnessEntry:
        obj = as_object(value, where)
        version = obj.get("version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise InternalHostError(f"the orchestrator's reply to {where} has no 'version'")
        return cls(
            kind=field_str(obj, "kind", where),
            id=field_str(obj, "id", where),
            scope=field_str(obj, "scope", where),
            version=version,
            title=field_str(obj, "title", where),
            content=field_str(obj, "content", where),
            path=field_opt_str(obj, "path") or "",
            reference=_wire_dict(obj, "reference"),
            arguments=_wire_dict(obj, "arguments"),
            metadata=_wire_dict(obj, "metadata"),
            deleted=obj.get("deleted") is True,
            source=field_opt_str(obj, "source") or "",
            reason=field_opt_str(obj, "reason") or "",
            owner=field_opt_str(obj, "owner") or "",
            session_id=field_opt_str(obj, "session_id"),
            refinement_id=field_opt_str(obj, "refinement_id"),
            created_at=field_opt_str(obj, "created_at"),
            updated_at=field_opt_str(obj, "updated_at"),
            proposal=field_opt_str(obj, "proposal"),
        )

    @property
    def qualified_id(self) -> str:
        return f"{self.scope}{SCOPE_SEPARATOR}{self.id}"

    def _head(self) -> str:
        state = " deleted" if self.deleted else ""
        if self.proposal:
            state += f" PROPOSED as {self.proposal} (not written until the user accepts it)"
        head = f"{self.kind} {self.qualified_id} v{self.version}{state} {self.title!r}"
        if self.kind == "skill" and self.reference:
            names = ", ".join(self.arguments)
            head += f" -> {self.reference.get('import')}.{self.reference.get('callable')}({names})"
        return head

    def __repr__(self) -> str:
        return f"HarnessEntry({self._head()}: {_preview(self.content)!r})"

    def __str__(self) -> str:
        who = f"{self.source} {self.updated_at or ''}".strip()
        why = f": {self.reason}" if self.reason else ""
        return f"[{self._head()}] ({who}{why})\n{self.content}"


class HarnessEntries(list[HarnessEntry]):
    """The entries of one answer (a list); ``more`` is True when the host cut the answer to
    its bound (ask with a ``kind`` or ``scope`` to see the rest)."""

    more: bool

    def __init__(self, entries: list[HarnessEntry], *, more: bool = False) -> None:
        super().__init__(entries)
        self.more = more

    def __repr__(self) -> str:
        if not self:
            return "[]"
        tail = ",\n ... (more: the answer was cut)" if self.more else ""
        return "[" + ",\n ".join(repr(entry) for entry in self) + tail + "]"


def _entries(result: object, where: str) -> HarnessEntries:
    items = as_items(result, "entries", where)
    more = isinstance(result, dict) and result.get("more") is True
    return HarnessEntries([HarnessEntry.from_wire(item, where) for item in items], more=more)


# --- skills -----------------------------------------------------------------------------------


def _resolve_callable(entry: HarnessEntry) -> Callable[..., Any]:
    """Import the skill's module and return its callable (plain ``ImportError`` /
    ``AttributeError`` / ``TypeError`` naming the skill when that fails)."""
    module_name = entry.reference.get("import")
    attr = entry.reference.get("callable")
    if entry.reference.get("type") != SKILL_REFERENCE_TYPE or not (
        isinstance(module_name, str) and isinstance(attr, str)
    ):
        raise InvalidArgument(
            f"skill {entry.qualified_id} has no python reference: {entry.reference!r}"
        )
    if module_name not in sys.modules:
        # A module written after the kernel started is invisible to the import system's
        # cached directory listings until they are dropped.
        importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"skill {entry.qualified_id}: cannot import {module_name!r}: {exc}", name=module_name
        ) from exc
    try:
        target: Callable[..., Any] = getattr(module, attr)
    except AttributeError:
        raise AttributeError(
            f"skill {entry.qualified_id}: module {module_name!r} has no {attr!r}"
        ) from None
    if not callable(target):
        raise TypeError(
            f"skill {entry.qualified_id}: {module_name}.{attr} is a "
            f"{type(target).__name__}, not a callable"
        )
    return target


# --- the harness object -----------------------------------------------------------------------


class Harness(HostBound):
    """The agent's Continual Harness: prompt notes, memories, skills, subagent specs.

    - ``await rlm.harness.create_memory(title, content)`` (also ``create_prompt``,
      ``create_subagent``, ``create_skill(title, content, reference=..., arguments=...)``),
      ``update_<kind>(id, content=..., version=...)``, ``delete_<kind>(id)`` -> ``HarnessEntry``
    - generic ``create(kind, title, content, ...)``, ``update(kind, id, ...)``,
      ``delete(kind, id)``
    - ``await rlm.harness.list(kind=None, scope=None)``, ``get(kind, id)``,
      ``history(kind, id)`` (every version, oldest first)
    - ``await rlm.harness.load_skill(id)`` -> the skill's callable;
      ``await rlm.harness.call_skill(id, **kwargs)`` calls it (and awaits a coroutine)

    Every call takes ``scope="local"|"global"`` (or an id written ``"global:<id>"``) and writes
    take ``reason=``. Ids default to the title's slug.
    """

    def __repr__(self) -> str:
        return (
            "<rlm.harness: await create_<kind>(title, content, id=None, scope='local', "
            "reason=None) / update_<kind>(id, content=..., version=None) / delete_<kind>(id) "
            "for kind in prompt, memory, skill (reference=, arguments=), subagent; "
            "list(kind=None, scope=None), get(kind, id), history(kind, id), "
            "load_skill(id), call_skill(id, **kwargs) -> HarnessEntry / [HarnessEntry]>"
        )

    # -- generic ---------------------------------------------------------------------------

    def create(
        self,
        kind: str,
        title: str,
        content: str,
        *,
        id: str | None = None,
        path: str | None = None,
        reference: Mapping[str, Any] | None = None,
        arguments: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scope: str | None = None,
        reason: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Create an entry (version 1; refused with ``Conflict`` if the id exists). ``id``
        defaults to the title's slug. Skills need ``reference`` and ``arguments``."""
        where = "harness.create"
        reject_unknown(
            where,
            unknown,
            ("id", "path", "reference", "arguments", "metadata", "scope", "reason"),
        )
        kind = _kind(where, kind)
        title = check_text(where, "title", title, TITLE_MAX_CHARS)
        if id is None:
            slug = slugify(title)
            if not slug:
                raise InvalidArgument(
                    f"{where}: cannot derive an id from title {title!r} (no letters or "
                    "digits); pass id="
                )
            entry_id, named = _entry_id(where, slug), check_scope(where, scope)
        else:
            entry_id, named = _target(where, id, scope)
        args: dict[str, Any] = {
            "kind": kind,
            "title": title,
            "content": check_text(where, "content", content, CONTENT_MAX_CHARS),
            "id": entry_id,
            "scope": named or DEFAULT_SCOPE,
        }
        if kind == "skill":
            args["reference"] = _skill_reference(where, reference)
            args["arguments"] = _skill_arguments(where, arguments)
        else:
            _put(args, "reference", _opt_json(where, "reference", reference))
            _put(args, "arguments", _opt_json(where, "arguments", arguments))
        self._common(where, args, path=path, metadata=metadata, reason=reason)
        return self._entry(where, args)

    def update(
        self,
        kind: str,
        id: str | HarnessEntry,
        *,
        title: str | None = None,
        content: str | None = None,
        path: str | None = None,
        reference: Mapping[str, Any] | None = None,
        arguments: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        scope: str | None = None,
        version: int | None = None,
        reason: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Write a new version; fields left None keep their value (``{}`` clears a dict).

        ``version``: the version you read; if the entry has moved on, ``Conflict`` is raised
        and nothing changes. Returns the new version."""
        where = "harness.update"
        reject_unknown(
            where,
            unknown,
            (
                "title",
                "content",
                "path",
                "reference",
                "arguments",
                "metadata",
                "scope",
                "version",
                "reason",
            ),
        )
        kind = _kind(where, kind)
        entry_id, named = _target(where, id, scope)
        args: dict[str, Any] = {"kind": kind, "id": entry_id, "scope": named or DEFAULT_SCOPE}
        if title is not None:
            args["title"] = check_text(where, "title", title, TITLE_MAX_CHARS)
        if content is not None:
            args["content"] = check_text(where, "content", content, CONTENT_MAX_CHARS)
        if kind == "skill":
            if reference is not None:
                args["reference"] = _skill_reference(where, reference)
            if arguments is not None:
                args["arguments"] = _skill_arguments(where, arguments)
        else:
            _put(args, "reference", _opt_json(where, "reference", reference))
            _put(args, "arguments", _opt_json(where, "arguments", arguments))
        self._common(where, args, path=path, metadata=metadata, reason=reason)
        if len(set(args) - {"kind", "id", "scope", "reason"}) == 0:
            raise InvalidArgument(
                f"{where}: nothing to update; pass title, content, path, reference, arguments "
                "or metadata"
            )
        _put(args, "version", _version(where, version))
        return self._entry(where, args)

    def delete(
        self,
        kind: str,
        id: str | HarnessEntry,
        *,
        scope: str | None = None,
        version: int | None = None,
        reason: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Delete an entry (a tombstone version: ``history`` keeps every earlier one, and a
        later ``create`` of the id revives it). Returns the tombstone."""
        where = "harness.delete"
        reject_unknown(where, unknown, ("scope", "version", "reason"))
        kind = _kind(where, kind)
        entry_id, named = _target(where, id, scope)
        args: dict[str, Any] = {"kind": kind, "id": entry_id, "scope": named or DEFAULT_SCOPE}
        _put(args, "version", _version(where, version))
        self._common(where, args, reason=reason)
        return self._entry(where, args)

    def list(
        self, kind: str | None = None, scope: str | None = None, **unknown: Any
    ) -> Coroutine[Any, Any, HarnessEntries]:
        """Live entries (of one ``kind``, one ``scope``, or all), per kind newest first;
        ``local`` before ``global``. ``.more`` says the host cut the answer to its bound."""
        where = "harness.list"
        reject_unknown(where, unknown, ("kind", "scope"))
        args: dict[str, Any] = {}
        if kind is not None:
            args["kind"] = _kind(where, kind)
        _put(args, "scope", check_scope(where, scope))
        return self._entries(where, args)

    def get(
        self,
        kind: str,
        id: str | HarnessEntry,
        scope: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """The entry's newest version (``NotFound`` if there is none or it is deleted).
        Without a scope: ``local`` first, then ``global``."""
        where = "harness.get"
        reject_unknown(where, unknown, ("scope",))
        args = self._read_args(where, kind, id, scope)
        return self._entry(where, args)

    def history(
        self,
        kind: str,
        id: str | HarnessEntry,
        scope: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, HarnessEntries]:
        """Every version of the entry, oldest first, deletions (tombstones) included, each
        with its source, time and reason."""
        where = "harness.history"
        reject_unknown(where, unknown, ("scope",))
        return self._entries(where, self._read_args(where, kind, id, scope))

    # -- typed helpers ---------------------------------------------------------------------

    def create_prompt(
        self, title: str, content: str, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Create a prompt note (a behavioural rule added to the system prompt; the base
        prompt itself cannot be changed). Options: id, path, metadata, scope, reason."""
        return self.create("prompt", title, content, **_no_skill("create_prompt", options))

    def update_prompt(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Update a prompt note: title, content, path, metadata, scope, version, reason."""
        return self.update("prompt", id, **_no_skill("update_prompt", options))

    def delete_prompt(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Delete a prompt note. Options: scope, version, reason."""
        return self.delete("prompt", id, **options)

    def create_memory(
        self, title: str, content: str, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Create a memory (a fact worth keeping). Options: id, path, metadata, scope,
        reason."""
        return self.create("memory", title, content, **_no_skill("create_memory", options))

    def update_memory(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Update a memory: title, content, path, metadata, scope, version, reason."""
        return self.update("memory", id, **_no_skill("update_memory", options))

    def delete_memory(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Delete a memory. Options: scope, version, reason."""
        return self.delete("memory", id, **options)

    def create_skill(
        self,
        title: str,
        content: str,
        *,
        reference: Mapping[str, Any],
        arguments: Mapping[str, Any],
        **options: Any,
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Create a skill: ``content`` says what it does and when to use it; ``reference``
        is ``{"type": "python", "import": "module", "callable": "name"}`` and ``arguments``
        names each argument (``{"path": "the file to read"}``). Options: id, path, metadata,
        scope, reason."""
        return self.create(
            "skill", title, content, reference=reference, arguments=arguments, **options
        )

    def update_skill(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Update a skill: title, content, reference, arguments, path, metadata, scope,
        version, reason (a reference or arguments given are checked again)."""
        return self.update("skill", id, **options)

    def delete_skill(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Delete a skill entry (the Python code it names is not touched)."""
        return self.delete("skill", id, **options)

    def create_subagent(
        self, title: str, content: str, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Create a subagent spec (a reusable role or division of labour). Options: id,
        path, metadata, scope, reason."""
        return self.create("subagent", title, content, **_no_skill("create_subagent", options))

    def update_subagent(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Update a subagent spec: title, content, path, metadata, scope, version, reason."""
        return self.update("subagent", id, **_no_skill("update_subagent", options))

    def delete_subagent(
        self, id: str | HarnessEntry, **options: Any
    ) -> Coroutine[Any, Any, HarnessEntry]:
        """Delete a subagent spec. Options: scope, version, reason."""
        return self.delete("subagent", id, **options)

    # -- skills ----------------------------------------------------------------------------

    def load_skill(
        self,
        id: str | HarnessEntry,
        scope: str | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, Callable[..., Any]]:
        """The skill's Python callable: its entry is read from the host, its module imported
        (from the kernel's ``sys.path``)."""
        where = "harness.load_skill"
        reject_unknown(where, unknown, ("scope",))
        return self._load(self._read_args(where, "skill", id, scope))

    def call_skill(
        self,
        id: str | HarnessEntry,
        /,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, Any]:
        """Load the skill and call it with ``kwargs``; a coroutine result is awaited. Name a
        global skill as ``"global:<id>"``."""
        where = "harness.call_skill"
        return self._call(self._read_args(where, "skill", id, None), kwargs)

    # -- plumbing --------------------------------------------------------------------------

    @staticmethod
    def _read_args(where: str, kind: str, target: object, scope: object) -> dict[str, Any]:
        entry_id, named = _target(where, target, scope)
        args: dict[str, Any] = {"kind": _kind(where, kind), "id": entry_id}
        _put(args, "scope", named)
        return args

    @staticmethod
    def _common(
        where: str,
        args: dict[str, Any],
        *,
        path: object = None,
        metadata: object = None,
        reason: object = None,
    ) -> None:
        if path is not None:
            text = check_text(where, "path", path, PATH_MAX_CHARS)
            if any(ch in text for ch in "\n\r\t"):
                raise InvalidArgument(f"{where}: path must be one line")
            args["path"] = text
        _put(args, "metadata", _opt_json(where, "metadata", metadata))
        if reason is not None:
            args["reason"] = check_text(where, "reason", reason, REASON_MAX_CHARS, blank_ok=True)

    async def _entry(self, where: str, args: dict[str, Any]) -> HarnessEntry:
        return HarnessEntry.from_wire(await self._client().request(where, args), where)

    async def _entries(self, where: str, args: dict[str, Any]) -> HarnessEntries:
        return _entries(await self._client().request(where, args), where)

    async def _load(self, args: dict[str, Any]) -> Callable[..., Any]:
        entry = await self._entry("harness.get", args)
        return _resolve_callable(entry)

    async def _call(self, args: dict[str, Any], kwargs: dict[str, Any]) -> Any:
        function = await self._load(args)
        result = function(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def _opt_json(where: str, what: str, value: object) -> dict[str, Any] | None:
    return None if value is None else _json_object(where, what, value)


def _no_skill(where: str, options: dict[str, Any]) -> dict[str, Any]:
    for key in ("reference", "arguments"):
        if key in options:
            raise TypeError(
                f"{where}() got an unsupported keyword argument {key!r}: only skills have one"
            )
    return options


harness = Harness()
