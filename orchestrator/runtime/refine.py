"""``refine``: have the orchestrator refine the harness from session evidence (in the kernel).

``/refine`` turns what happened in a session into small, versioned, reversible edits of the
Continual Harness (``rlm.harness``, ``harness.py``; docs/spec.md §6, docs/harness.md). Planning is
one model call made by the orchestrator in the background while the agent keeps working; the
edits are applied at the next turn boundary, and an edit whose target changed since planning is
rejected. The kernel only asks, watches and rolls back; the orchestrator does the rest.

Wire shapes (``args`` -> ``result``):

- ``refine.run``: ``{instructions?, scope}`` -> ``{scheduled, id?, reason?}``
- ``refine.status``: ``{}`` -> ``{pending: [...], in_flight, last}``
- ``refine.rollback``: ``{id}`` -> a refinement record ``{id, status, scope, edits, ...}``
"""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.runtime.arguments import reject_unknown
from orchestrator.runtime.errors import InvalidArgument
from orchestrator.runtime.harness import DEFAULT_SCOPE, check_scope, check_text
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_object, field_opt_str, field_str

__all__ = [
    "REFINE_INSTRUCTIONS_MAX_CHARS",
    "Refine",
    "RefineRequest",
    "RefineStatus",
    "Refinement",
    "refine",
]

REFINE_INSTRUCTIONS_MAX_CHARS: Final = 4000


# --- result types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RefineRequest:
    """``refine.run``: ``scheduled`` (planning started; ``id`` names the refinement) or not,
    and why (``reason``)."""

    scheduled: bool
    id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RefineStatus:
    """Refinements of this session: ``pending`` (planned, applied at the next turn boundary),
    ``in_flight`` (the one being planned, or None) and ``last`` (the newest record, or None)."""

    pending: list[Any] = field(default_factory=list, hash=False)
    in_flight: str | None = None
    last: dict[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class Refinement:
    """A refinement record (``refine.rollback`` returns the rollback's own record).

    ``edits`` are the applied (or rejected) edits with their before/after versions;
    ``rollback_of`` names the refinement a rollback undid. ``record`` keeps every field the
    host sent.
    """

    id: str
    status: str | None = None
    scope: str | None = None
    summary: str | None = None
    rollback_of: str | None = None
    error: str | None = None
    edits: list[dict[str, Any]] = field(default_factory=list, hash=False)
    record: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @classmethod
    def from_wire(cls, value: object, where: str) -> Refinement:
        obj = as_object(value, where)
        edits = obj.get("edits")
        return cls(
            id=field_str(obj, "id", where),
            status=field_opt_str(obj, "status"),
            scope=field_opt_str(obj, "scope"),
            summary=field_opt_str(obj, "summary"),
            rollback_of=field_opt_str(obj, "rollback_of"),
            error=field_opt_str(obj, "error"),
            edits=[dict(e) for e in edits if isinstance(e, dict)]
            if isinstance(edits, list)
            else [],
            record=dict(obj),
        )


# --- the refine object ----------------------------------------------------------------------


class Refine(HostBound):
    """``/refine`` from the kernel: turn evidence from this session into small, versioned,
    reversible harness edits.

    - ``await refine.run(instructions=None, scope="local")`` -> ``RefineRequest``: planning
      starts in the background; the edits apply at the next turn boundary (none without clear
      evidence).
    - ``await refine.status()`` -> ``RefineStatus``
    - ``await refine.rollback(id)`` -> the rollback's ``Refinement`` (every edit of ``id``
      restored to its before-state, recorded as a refinement itself)
    """

    def __repr__(self) -> str:
        return (
            "<refine: await refine.run(instructions=None, scope='local') -> RefineRequest; "
            "await refine.status() -> RefineStatus; await refine.rollback(id) -> Refinement>"
        )

    def run(
        self, instructions: str | None = None, scope: str = DEFAULT_SCOPE, **unknown: Any
    ) -> Coroutine[Any, Any, RefineRequest]:
        """Ask for a refinement of the ``local`` (or ``global``) harness; ``instructions``
        say what to look at."""
        where = "refine.run"
        reject_unknown(where, unknown, ("instructions", "scope"))
        args: dict[str, Any] = {"scope": check_scope(where, scope) or DEFAULT_SCOPE}
        if instructions is not None:
            text = check_text(where, "instructions", instructions, REFINE_INSTRUCTIONS_MAX_CHARS)
            args["instructions"] = text.strip()
        return self._run(args)

    async def _run(self, args: dict[str, Any]) -> RefineRequest:
        where = "refine.run"
        obj = as_object(await self._client().request(where, args), where)
        return RefineRequest(
            scheduled=obj.get("scheduled") is True,
            id=field_opt_str(obj, "id"),
            reason=field_opt_str(obj, "reason"),
        )

    def status(self, **unknown: Any) -> Coroutine[Any, Any, RefineStatus]:
        """What is pending, in flight and last done for this session."""
        reject_unknown("refine.status", unknown, ())
        return self._status()

    async def _status(self) -> RefineStatus:
        where = "refine.status"
        obj = as_object(await self._client().request(where, {}), where)
        pending = obj.get("pending")
        last = obj.get("last")
        return RefineStatus(
            pending=list(pending) if isinstance(pending, list) else [],
            in_flight=field_opt_str(obj, "in_flight"),
            last=dict(last) if isinstance(last, dict) else None,
        )

    def rollback(self, id: str | Refinement, **unknown: Any) -> Coroutine[Any, Any, Refinement]:
        """Undo refinement ``id``: each of its edits goes back to its before-state as a new
        version (refused with ``Conflict`` if an entry changed since)."""
        where = "refine.rollback"
        reject_unknown(where, unknown, ())
        target = id.id if isinstance(id, Refinement) else id
        if not isinstance(target, str):
            raise TypeError(f"{where}: id must be a str, not {type(target).__name__}")
        if not target.strip():
            raise InvalidArgument(f"{where}: id is empty")
        return self._rollback({"id": target.strip()})

    async def _rollback(self, args: dict[str, Any]) -> Refinement:
        where = "refine.rollback"
        return Refinement.from_wire(await self._client().request(where, args), where)


refine = Refine()
