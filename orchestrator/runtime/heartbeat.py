"""``rlm_heartbeat``: the agent schedules prompts to itself (in the kernel).

A heartbeat puts its instruction into this session again and again (``every 10m``), or once
(``in 1h``, ``at 2026-05-09T14:00Z``), or on a cron schedule, so a long task keeps being looked
after while nobody types (docs/spec.md §3, §7; docs/control.md). The orchestrator keeps
heartbeats in its database and delivers them; nothing here runs a timer. Each call is one host
request, and the host takes the session from the request's NATS subject: a session sees and
changes only its own heartbeats.

- ``interval``: a duration (``"5m"``, ``"1h30m"``, or a number of seconds) means ``every`` that
  long, at least ``MINIMUM_INTERVAL_S`` apart; any schedule spec works too (``"in 10m"``,
  ``"at 2026-05-09T14:00Z"``, ``"*/15 * * * *"``).
- ``delivery``: ``"steer"`` (default) puts the instruction into the turn in progress at its next
  model call; ``"follow_up"`` waits until the session is between turns. A tick falls due but
  waits while the session compacts or runs a cell; ticks missed meanwhile are delivered once.
- ``label``: a name of your choice, unique among this session's live heartbeats; ``update``,
  ``pause``, ``resume`` and ``delete`` take the id or the label.

Arguments are checked before anything is sent, with the host's limits (mirrored below;
``tests/unit/test_runtime_heartbeat.py`` pins them to ``orchestrator/control/schedule_service.py``,
which this module may not import). The host checks again, and it alone reads the spec.

Wire shapes (``args`` -> ``result``; a heartbeat is ``{id, label, instruction, interval,
delivery, status, next_run_at, last_run_at, run_count, last_error, created_at, updated_at}``):

- ``rlm_heartbeat.create``: ``{instruction, interval, delivery, label?}`` -> heartbeat
- ``rlm_heartbeat.list``: ``{include_inactive}`` -> ``{heartbeats: [heartbeat], more}``
- ``rlm_heartbeat.update``: ``{id, instruction?, interval?, label?, delivery?, paused?}`` ->
  heartbeat (``label: null`` clears it)
- ``rlm_heartbeat.delete``: ``{id}`` -> heartbeat (status ``cancelled``)
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.runtime.arguments import reject_unknown, require_text
from orchestrator.runtime.errors import InvalidArgument
from orchestrator.runtime.host import HostBound
from orchestrator.runtime.replies import as_items, as_object, field_opt_str, field_str

__all__ = [
    "DEFAULT_DELIVERY",
    "DEFAULT_INTERVAL",
    "DELIVERIES",
    "INSTRUCTION_MAX_CHARS",
    "LABEL_MAX_CHARS",
    "MINIMUM_INTERVAL_S",
    "REF_MAX_CHARS",
    "SPEC_MAX_CHARS",
    "Heartbeat",
    "Heartbeats",
    "RlmHeartbeat",
    "rlm_heartbeat",
]

# Mirrors of orchestrator/control/schedule_service.py and store/timespec.py (pinned by a test).
DEFAULT_INTERVAL: Final = "5m"
DEFAULT_DELIVERY: Final = "steer"
DELIVERIES: Final = ("steer", "follow_up")
INSTRUCTION_MAX_CHARS: Final = 16 * 1024
LABEL_MAX_CHARS: Final = 64
SPEC_MAX_CHARS: Final = 200
REF_MAX_CHARS: Final = 200
MINIMUM_INTERVAL_S: Final = 10

REPR_INSTRUCTION_CHARS: Final = 60  # how much of the instruction a heartbeat's repr shows
_CUT_MARK: Final = "…"
_FORBIDDEN_LABEL_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class _Unset:
    def __repr__(self) -> str:
        return "<unchanged>"


_UNSET: Final = _Unset()


# --- argument checks --------------------------------------------------------------------------


def _instruction(where: str, value: object) -> str:
    text = require_text(where, "instruction", value).strip()
    if len(text) > INSTRUCTION_MAX_CHARS:
        raise InvalidArgument(
            f"{where}: instruction is {len(text):,} characters; the limit is "
            f"{INSTRUCTION_MAX_CHARS:,}"
        )
    return text


def _interval(where: str, value: object) -> str:
    """A spec the host reads: a str as given; seconds (int or timedelta) as ``"<n>s"``."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
        if seconds != int(seconds):
            raise InvalidArgument(f"{where}: interval must be whole seconds, not {value}")
        value = int(seconds)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(
            f"{where}: interval must be a str like '5m' or a number of seconds, "
            f"not {type(value).__name__}"
        )
    if isinstance(value, int):
        if value < MINIMUM_INTERVAL_S:
            raise InvalidArgument(
                f"{where}: the shortest interval is {MINIMUM_INTERVAL_S}s, not {value}s"
            )
        return f"{value}s"
    text = require_text(where, "interval", value).strip()
    if len(text) > SPEC_MAX_CHARS:
        raise InvalidArgument(
            f"{where}: interval is {len(text)} characters; the limit is {SPEC_MAX_CHARS}"
        )
    return text


def _label(where: str, value: object) -> str | None:
    """A label, or None to have none (an empty label is none)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{where}: label must be a str or None, not {type(value).__name__}")
    text = value.strip()
    if len(text) > LABEL_MAX_CHARS:
        raise InvalidArgument(
            f"{where}: label is {len(text)} characters; the limit is {LABEL_MAX_CHARS}"
        )
    for ch in text:
        if unicodedata.category(ch) in _FORBIDDEN_LABEL_CATEGORIES:
            raise InvalidArgument(f"{where}: label contains the control character {ch!r}")
    return text or None


def _delivery(where: str, value: object) -> str:
    if value not in DELIVERIES:
        raise InvalidArgument(
            f"{where}: delivery must be {' or '.join(repr(d) for d in DELIVERIES)}, not {value!r}"
        )
    return str(value)


def _ref(where: str, value: object) -> str:
    """A heartbeat (its id), an id or a label."""
    if isinstance(value, Heartbeat):
        return value.id
    if not isinstance(value, str):
        raise TypeError(
            f"{where}: id must be a heartbeat, its id or its label, not {type(value).__name__}"
        )
    text = value.strip()
    if not text:
        raise InvalidArgument(f"{where}: id is empty")
    if len(text) > REF_MAX_CHARS:
        raise InvalidArgument(
            f"{where}: id is {len(text)} characters; the limit is {REF_MAX_CHARS}"
        )
    return text


# --- result types -----------------------------------------------------------------------------


def _preview(text: str, limit: int = REPR_INSTRUCTION_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + _CUT_MARK


@dataclass(frozen=True, repr=False)
class Heartbeat:
    """One heartbeat. ``interval`` is the spec as the host stores it (``every 5m``; a one-shot
    as ``at <time>``); ``status`` is active, paused, completed (a one-shot that fired) or
    cancelled (deleted). Times are ISO-8601 UTC strings; ``next_run_at`` is None once it will
    not fire again. ``record`` keeps every field the host sent."""

    id: str
    instruction: str
    interval: str
    status: str
    delivery: str = DEFAULT_DELIVERY
    label: str | None = None
    next_run_at: str | None = None
    last_run_at: str | None = None
    run_count: int = 0
    last_error: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    record: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def from_wire(cls, value: object, where: str) -> Heartbeat:
        obj = as_object(value, where)
        runs = obj.get("run_count")
        return cls(
            id=field_str(obj, "id", where),
            instruction=field_str(obj, "instruction", where),
            interval=field_str(obj, "interval", where),
            status=field_str(obj, "status", where),
            delivery=field_opt_str(obj, "delivery") or DEFAULT_DELIVERY,
            label=field_opt_str(obj, "label"),
            next_run_at=field_opt_str(obj, "next_run_at"),
            last_run_at=field_opt_str(obj, "last_run_at"),
            run_count=runs if isinstance(runs, int) and not isinstance(runs, bool) else 0,
            last_error=field_opt_str(obj, "last_error"),
            created_at=field_opt_str(obj, "created_at"),
            updated_at=field_opt_str(obj, "updated_at"),
            record=dict(obj),
        )

    @property
    def active(self) -> bool:
        return self.status == "active"

    @property
    def paused(self) -> bool:
        return self.status == "paused"

    def __repr__(self) -> str:
        name = f" {self.label!r}" if self.label else ""
        nxt = f", next {self.next_run_at}" if self.next_run_at else ""
        return (
            f"Heartbeat({self.id}{name} {self.interval} ({self.delivery}, {self.status}{nxt}, "
            f"{self.run_count} runs): {_preview(self.instruction)!r})"
        )


class Heartbeats(list[Heartbeat]):
    """The heartbeats of one answer (a list), oldest first; ``more`` is True when the host cut
    the answer to its bound (the oldest were left out)."""

    more: bool

    def __init__(self, heartbeats: list[Heartbeat], *, more: bool = False) -> None:
        super().__init__(heartbeats)
        self.more = more

    def __repr__(self) -> str:
        if not self:
            return "[]"
        head = "[... (more: the answer was cut),\n " if self.more else "["
        return head + ",\n ".join(repr(hb) for hb in self) + "]"


# --- the rlm_heartbeat object -----------------------------------------------------------------


class RlmHeartbeat(HostBound):
    """Prompts this session sends itself on a schedule (module docstring).

    - ``await rlm_heartbeat.create(instruction, interval="5m", label=None,
      delivery="steer")`` -> ``Heartbeat``
    - ``await rlm_heartbeat.list(include_inactive=False)`` -> ``Heartbeats``
    - ``await rlm_heartbeat.update(id, instruction=..., interval=..., label=...,
      delivery=..., paused=...)`` -> ``Heartbeat``; ``pause(id)``, ``resume(id)``
    - ``await rlm_heartbeat.delete(id)`` -> the cancelled ``Heartbeat``

    ``id`` is a ``Heartbeat``, its id or its label.
    """

    def __repr__(self) -> str:
        return (
            "<rlm_heartbeat: await create(instruction, interval='5m', label=None, "
            "delivery='steer'|'follow_up') / update(id, instruction=, interval=, label=, "
            "delivery=, paused=) / pause(id) / resume(id) / delete(id) -> Heartbeat; "
            "list(include_inactive=False) -> [Heartbeat]>"
        )

    def create(
        self,
        instruction: str,
        interval: str | int | dt.timedelta = DEFAULT_INTERVAL,
        label: str | None = None,
        delivery: str = DEFAULT_DELIVERY,
        **unknown: Any,
    ) -> Coroutine[Any, Any, Heartbeat]:
        """Start a heartbeat: ``instruction`` comes back to this session every ``interval``
        (or once, for ``in``/``at``) as a ``delivery`` message. Refused past the host's
        per-session cap (``QuotaExceeded``) or for a label in use."""
        where = "rlm_heartbeat.create"
        reject_unknown(where, unknown, ("interval", "label", "delivery"))
        args: dict[str, Any] = {
            "instruction": _instruction(where, instruction),
            "interval": _interval(where, interval),
            "delivery": _delivery(where, delivery),
        }
        name = _label(where, label)
        if name is not None:
            args["label"] = name
        return self._one(where, args)

    def list(
        self, include_inactive: bool = False, **unknown: Any
    ) -> Coroutine[Any, Any, Heartbeats]:
        """This session's heartbeats, oldest first: active and paused ones, and with
        ``include_inactive`` also those that completed or were deleted."""
        where = "rlm_heartbeat.list"
        reject_unknown(where, unknown, ("include_inactive",))
        if not isinstance(include_inactive, bool):
            raise TypeError(f"{where}: include_inactive must be a bool")
        return self._list({"include_inactive": include_inactive})

    async def _list(self, args: dict[str, Any]) -> Heartbeats:
        where = "rlm_heartbeat.list"
        result = await self._client().request(where, args)
        items = as_items(result, "heartbeats", where)
        more = isinstance(result, dict) and result.get("more") is True
        return Heartbeats([Heartbeat.from_wire(item, where) for item in items], more=more)

    def update(
        self,
        id: str | Heartbeat,
        *,
        instruction: str | None = None,
        interval: str | int | dt.timedelta | None = None,
        label: Any = _UNSET,
        delivery: str | None = None,
        paused: bool | None = None,
        **unknown: Any,
    ) -> Coroutine[Any, Any, Heartbeat]:
        """Change a heartbeat; what is left out stays. A new ``interval`` starts counting now;
        ``label=None`` removes the label; ``paused=True`` stops it firing until
        ``paused=False`` (it then waits for its next regular tick)."""
        where = "rlm_heartbeat.update"
        reject_unknown(where, unknown, ("instruction", "interval", "label", "delivery", "paused"))
        args: dict[str, Any] = {"id": _ref(where, id)}
        if instruction is not None:
            args["instruction"] = _instruction(where, instruction)
        if interval is not None:
            args["interval"] = _interval(where, interval)
        if label is not _UNSET:
            args["label"] = _label(where, label)
        if delivery is not None:
            args["delivery"] = _delivery(where, delivery)
        if paused is not None:
            if not isinstance(paused, bool):
                raise TypeError(f"{where}: paused must be a bool")
            args["paused"] = paused
        if len(args) == 1:
            raise InvalidArgument(
                f"{where}: nothing to change; pass instruction=, interval=, label=, "
                "delivery= or paused="
            )
        return self._one(where, args)

    def pause(self, id: str | Heartbeat, **unknown: Any) -> Coroutine[Any, Any, Heartbeat]:
        """``update(id, paused=True)``."""
        reject_unknown("rlm_heartbeat.pause", unknown, ())
        return self.update(id, paused=True)

    def resume(self, id: str | Heartbeat, **unknown: Any) -> Coroutine[Any, Any, Heartbeat]:
        """``update(id, paused=False)``."""
        reject_unknown("rlm_heartbeat.resume", unknown, ())
        return self.update(id, paused=False)

    def delete(self, id: str | Heartbeat, **unknown: Any) -> Coroutine[Any, Any, Heartbeat]:
        """Stop a heartbeat for good (its record stays, status ``cancelled``). Deleting one
        that is already gone is not an error."""
        where = "rlm_heartbeat.delete"
        reject_unknown(where, unknown, ())
        return self._one(where, {"id": _ref(where, id)})

    async def _one(self, where: str, args: dict[str, Any]) -> Heartbeat:
        return Heartbeat.from_wire(await self._client().request(where, args), where)


rlm_heartbeat = RlmHeartbeat()
