"""Heartbeats and schedules: the kernel's ``rlm_heartbeat.*`` host requests, and the functions
behind ``/heartbeat`` and ``prime-agent schedule add|list|cancel`` (docs/spec.md §3, §7; issue 8).

Three kinds of schedule share one table (``orchestrator/store/schedules.py``) and one grammar
(``orchestrator/store/timespec.py``); they differ in who may make and see them:

- ``rlm_heartbeat``: the agent's own, from ``await rlm_heartbeat.create(...)`` in its kernel.
  Several per session (at most ``MAX_LIVE_HEARTBEATS``), each with an optional label, unique
  among its live heartbeats so the agent can name one by it. The caller is the session whose
  NATS subject the request came on, never a payload field, and it sees and changes only its
  own ``rlm_heartbeat`` schedules: a user's schedule is not the agent's to cancel.
- ``heartbeat``: the person's ``/heartbeat every 10m <text>``; one per session, a new one
  replaces the old (``heartbeat_command``).
- ``user``: ``prime-agent schedule add <session> <spec> -- <prompt>`` (``add_schedule``).

Every change pokes the scheduler (``poke``; the host handlers find it as ``orch.scheduler``)
so a new or changed schedule's first tick is not missed by a scheduler sleeping until a later
one. Answers are bounded (``HEARTBEAT_LIST_MAX_ITEMS``, ``HEARTBEAT_REPLY_MAX_BYTES``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import duckdb
from pydantic import Field

from orchestrator.bus.request_args import RequestArgs, parse_args
from orchestrator.bus.router import HostRequestError
from orchestrator.errors import ScheduleSpecError
from orchestrator.store import schedules as schedule_store
from orchestrator.store.db import Store
from orchestrator.store.queries import utcnow
from orchestrator.store.schedules import (
    Delivery,
    ScheduleError,
    ScheduleLimitReached,
    ScheduleNotFound,
    ScheduleRow,
    ScheduleSource,
)
from orchestrator.store.timespec import (
    HEARTBEAT_COMMAND,
    HEARTBEAT_USAGE,
    ScheduleSpec,
    parse_heartbeat_command,
    parse_schedule,
)

__all__ = [
    "DEFAULT_DELIVERY",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DESCRIBE_PROMPT_CHARS",
    "HEARTBEAT_LIST_MAX_ITEMS",
    "HEARTBEAT_REPLY_MAX_BYTES",
    "LABEL_MAX_CHARS",
    "MAX_LIVE_HEARTBEATS",
    "MAX_LIVE_SCHEDULES",
    "PROMPT_MAX_CHARS",
    "REF_MAX_CHARS",
    "SCHEDULE_LIST_MAX_ITEMS",
    "SPEC_MAX_CHARS",
    "HeartbeatCaller",
    "HeartbeatCommandResult",
    "HeartbeatHost",
    "ScheduleService",
    "add_schedule",
    "cancel_schedule",
    "describe",
    "heartbeat_command",
    "heartbeat_wire",
    "interval_spec",
    "list_schedules",
    "pause_schedule",
]

DEFAULT_HEARTBEAT_INTERVAL: Final = "5m"  # docs/spec.md §3: rlm_heartbeat.create(interval="5m")
DEFAULT_DELIVERY: Final[Delivery] = "steer"
# Live (active or paused) rlm_heartbeat schedules per session.
MAX_LIVE_HEARTBEATS: Final = 16
# Live ``prime-agent schedule`` schedules per session.
MAX_LIVE_SCHEDULES: Final = 64
# An instruction is a prompt put into the session: as long as an agent message may be.
PROMPT_MAX_CHARS: Final = 16 * 1024
LABEL_MAX_CHARS: Final = 64
SPEC_MAX_CHARS: Final = 200
# rlm_heartbeat.list: newest heartbeats kept when there are more; and all of them as JSON.
HEARTBEAT_LIST_MAX_ITEMS: Final = 50
HEARTBEAT_REPLY_MAX_BYTES: Final = 256 * 1024
# list_schedules (control API): at most this many rows.
SCHEDULE_LIST_MAX_ITEMS: Final = 500
# How much of the prompt a one-line description shows.
DESCRIBE_PROMPT_CHARS: Final = 60
# An id, id prefix or label naming a heartbeat in update/delete.
REF_MAX_CHARS: Final = 200

RLM_HEARTBEAT: Final[ScheduleSource] = "rlm_heartbeat"
USER_HEARTBEAT: Final[ScheduleSource] = "heartbeat"
USER_SCHEDULE: Final[ScheduleSource] = "user"
_DELIVERY_FLAGS: Final[dict[str, Delivery]] = {
    "--follow-up": "follow_up",
    "--followup": "follow_up",
    "--steer": "steer",
}
_HEARTBEAT_ACTIONS: Final = ("status", "pause", "resume", "stop", "clear")
_FORBIDDEN_LABEL_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# A duration on its own (``5m``, ``1h30m``): the shape only; parse_duration judges the value.
_BARE_DURATION_RE: Final = re.compile(r"(?:\d+[dhms])+", re.IGNORECASE | re.ASCII)
_WORD_RE: Final = re.compile(r"\S*")

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]
Poke = Callable[[], None]


# -- checks shared by every way in ---------------------------------------------------------------


def interval_spec(text: str) -> str:
    """An ``interval`` as a schedule spec: a bare duration (``5m``, ``1h30m``) means
    ``every <duration>``; anything else (``every 10m``, ``in 1h``, ``at …``, cron) is a spec."""
    stripped = text.strip()
    if _BARE_DURATION_RE.fullmatch(stripped):
        return f"every {stripped}"
    return stripped


def _check_prompt(prompt: str, what: str = "prompt") -> str:
    text = prompt.strip()
    if not text:
        raise ScheduleError(f"the {what} is empty; write what the session should do")
    if len(text) > PROMPT_MAX_CHARS:
        raise ScheduleError(
            f"the {what} is {len(text)} characters; the limit is {PROMPT_MAX_CHARS}"
        )
    return text


def _check_label(label: str | None) -> str | None:
    if label is None:
        return None
    text = label.strip()
    if not text:
        return None
    if len(text) > LABEL_MAX_CHARS:
        raise ScheduleError(f"the label is {len(text)} characters; the limit is {LABEL_MAX_CHARS}")
    for ch in text:
        if unicodedata.category(ch) in _FORBIDDEN_LABEL_CATEGORIES:
            raise ScheduleError(f"the label contains the control character {ch!r}")
    return text


def _check_delivery(delivery: str) -> Delivery:
    for known in schedule_store.DELIVERIES:
        if delivery == known:
            return known
    raise ScheduleError(
        f"delivery {delivery!r} is not known; write {' or '.join(schedule_store.DELIVERIES)}"
    )


def _parse_spec(text: str, now: dt.datetime, local_tz: dt.tzinfo | None) -> ScheduleSpec:
    if len(text) > SPEC_MAX_CHARS:
        raise ScheduleSpecError(
            f"the schedule is {len(text)} characters; the limit is {SPEC_MAX_CHARS}"
        )
    return parse_schedule(text, now=now, local_tz=local_tz)


def _poke(poke: Poke | None) -> None:
    if poke is not None:
        poke()


def _resolve(
    con: duckdb.DuckDBPyConnection,
    ref: str,
    *,
    session_id: str | None,
    sources: Sequence[str] | None,
    by_label: bool = False,
) -> ScheduleRow:
    """The schedule named by ``ref``: its id, a unique id prefix, or (``by_label``) the label of
    a live one; only among ``session_id``'s and ``sources``' schedules when given."""

    def visible(row: ScheduleRow | None) -> bool:
        return (
            row is not None
            and (session_id is None or row.session_id == session_id)
            and (sources is None or row.source in sources)
        )

    ref = ref.strip()
    if not ref:
        raise ScheduleError("the schedule id is empty")
    row = schedule_store.select_schedule(con, ref)
    if row is not None and visible(row):
        return row
    if by_label:
        labelled = [
            r
            for r in schedule_store.select_schedules(con, session_id=session_id, sources=sources)
            if r.label == ref
        ]
        if len(labelled) == 1:
            return labelled[0]
    found = schedule_store.select_schedules(
        con, session_id=session_id, sources=sources, include_inactive=True, id_prefix=ref
    )
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ScheduleError(
            f"{ref!r} matches {len(found)} schedules; write more of the id "
            f"({', '.join(r.id for r in found[:3])}…)"
        )
    raise ScheduleNotFound(f"no schedule {ref!r}")


def _check_cap(
    con: duckdb.DuckDBPyConnection, session_id: str, source: ScheduleSource, cap: int
) -> None:
    if schedule_store.count_live(con, session_id, [source]) >= cap:
        what = "heartbeats" if source == RLM_HEARTBEAT else "schedules"
        raise ScheduleLimitReached(
            f"this session has {cap} {what} already (the limit); delete or cancel one first"
        )


def _check_unique_label(
    con: duckdb.DuckDBPyConnection,
    session_id: str,
    label: str | None,
    *,
    source: ScheduleSource,
    except_id: str | None = None,
) -> None:
    if label is None:
        return
    for row in schedule_store.select_schedules(con, session_id=session_id, sources=[source]):
        if row.label == label and row.id != except_id:
            raise ScheduleError(
                f"label {label!r} is taken by {row.id}; choose another or update that one"
            )


# -- the control API's functions -----------------------------------------------------------------


async def add_schedule(
    store: Store,
    session_id: str,
    spec_text: str,
    prompt: str,
    *,
    source: ScheduleSource = USER_SCHEDULE,
    label: str | None = None,
    delivery: str = DEFAULT_DELIVERY,
    now: dt.datetime | None = None,
    tz: dt.tzinfo = dt.UTC,
    local_tz: dt.tzinfo | None = None,
    poke: Poke | None = None,
) -> ScheduleRow:
    """``prime-agent schedule add``: a new schedule of ``session_id`` (which the caller has
    checked exists). ``ScheduleSpecError`` / ``ScheduleError`` say what to write instead;
    ``ScheduleLimitReached`` past ``MAX_LIVE_SCHEDULES`` (``MAX_LIVE_HEARTBEATS`` for
    ``rlm_heartbeat``). A ``heartbeat`` replaces the session's previous one."""
    when = now or utcnow()
    spec = _parse_spec(spec_text, when, local_tz)
    text = _check_prompt(prompt)
    name = _check_label(label)
    mode = _check_delivery(delivery)

    def write(con: duckdb.DuckDBPyConnection) -> ScheduleRow:
        if source == USER_HEARTBEAT:
            for old in schedule_store.select_schedules(
                con, session_id=session_id, sources=[USER_HEARTBEAT]
            ):
                schedule_store.update_schedule(con, old.id, status="cancelled", now=when, tz=tz)
        else:
            cap = MAX_LIVE_HEARTBEATS if source == RLM_HEARTBEAT else MAX_LIVE_SCHEDULES
            _check_cap(con, session_id, source, cap)
        if source == RLM_HEARTBEAT:
            _check_unique_label(con, session_id, name, source=source)
        return schedule_store.insert_schedule(
            con,
            session_id=session_id,
            source=source,
            spec=spec,
            prompt=text,
            delivery=mode,
            label=name,
            now=when,
            tz=tz,
        )

    row = await store.transaction(write)
    _poke(poke)
    return row


async def list_schedules(
    store: Store,
    *,
    session_id: str | None = None,
    include_inactive: bool = False,
    sources: Sequence[str] | None = None,
    limit: int = SCHEDULE_LIST_MAX_ITEMS,
) -> list[ScheduleRow]:
    """``prime-agent schedule list``: schedules oldest first (live ones unless
    ``include_inactive``), at most ``limit``."""
    return await store.read(
        lambda con: schedule_store.select_schedules(
            con,
            session_id=session_id,
            include_inactive=include_inactive,
            sources=sources,
            limit=limit,
        )
    )


async def _change(
    store: Store,
    ref: str,
    *,
    session_id: str | None,
    sources: Sequence[str] | None,
    poke: Poke | None,
    now: dt.datetime | None,
    **changes: Any,
) -> ScheduleRow:
    when = now or utcnow()

    def write(con: duckdb.DuckDBPyConnection) -> ScheduleRow:
        row = _resolve(con, ref, session_id=session_id, sources=sources)
        return schedule_store.update_schedule(con, row.id, now=when, **changes)

    row = await store.transaction(write)
    _poke(poke)
    return row


async def cancel_schedule(
    store: Store,
    schedule_id: str,
    *,
    session_id: str | None = None,
    now: dt.datetime | None = None,
    poke: Poke | None = None,
) -> ScheduleRow:
    """``prime-agent schedule cancel``: by id or unique id prefix (of ``session_id``'s when
    given). ``ScheduleNotFound``; ``ScheduleError`` if ambiguous or already finished."""
    return await _change(
        store,
        schedule_id,
        session_id=session_id,
        sources=None,
        poke=poke,
        now=now,
        status="cancelled",
    )


async def pause_schedule(
    store: Store,
    schedule_id: str,
    paused: bool,
    *,
    session_id: str | None = None,
    now: dt.datetime | None = None,
    tz: dt.tzinfo = dt.UTC,
    poke: Poke | None = None,
) -> ScheduleRow:
    """Pause (``paused=True``) or resume a schedule, by id or unique id prefix."""
    return await _change(
        store,
        schedule_id,
        session_id=session_id,
        sources=None,
        poke=poke,
        now=now,
        status="paused" if paused else "active",
        tz=tz,
    )


# -- /heartbeat ----------------------------------------------------------------------------------

HeartbeatAction = Literal["set", "status", "paused", "resumed", "stopped"]


@dataclass(frozen=True)
class HeartbeatCommandResult:
    """What ``/heartbeat …`` did: ``schedule`` is the session's heartbeat afterwards (None when
    it has none); ``message`` is one line for the person."""

    action: HeartbeatAction
    schedule: ScheduleRow | None
    message: str


def describe(row: ScheduleRow) -> str:
    """One line: ``sch-… every 10m (steer, active, next 2026-…): <the prompt's start>``."""
    first_line = row.prompt.splitlines()[0] if row.prompt else ""
    if len(first_line) > DESCRIBE_PROMPT_CHARS:
        first_line = first_line[: DESCRIBE_PROMPT_CHARS - 1] + "…"
    preview = first_line
    nxt = row.next_run_at.isoformat(timespec="seconds") if row.next_run_at else "none"
    return f"{row.id} {row.spec} ({row.delivery}, {row.status}, next {nxt}): {preview}"


def _first_word(text: str) -> tuple[str, str]:
    """(the first word, the text after it, its spacing kept)."""
    text = text.lstrip()
    match = _WORD_RE.match(text)
    size = match.end() if match else 0
    return text[:size], text[size:]


def _split_flags(text: str) -> tuple[str, str, Delivery | None]:
    """``/heartbeat --follow-up every …`` → (``/heartbeat``, `` every …``, ``follow_up``)."""
    command, rest = _first_word(text)
    delivery: Delivery | None = None
    while True:
        word, after = _first_word(rest)
        mode = _DELIVERY_FLAGS.get(word.lower())
        if mode is None:
            return command, rest, delivery
        delivery, rest = mode, after


async def heartbeat_command(
    store: Store,
    session_id: str,
    text: str,
    *,
    now: dt.datetime | None = None,
    tz: dt.tzinfo = dt.UTC,
    local_tz: dt.tzinfo | None = None,
    poke: Poke | None = None,
) -> HeartbeatCommandResult:
    """Run one ``/heartbeat`` line for ``session_id`` (the person's heartbeat, one per session):

    - ``/heartbeat [--follow-up] every 10m <text>`` (or ``in``, ``at``, ``cron "…"``, or a bare
      duration ``10m``): set it, replacing the previous one; delivered as a steer unless
      ``--follow-up``.
    - ``/heartbeat`` or ``/heartbeat status``: show it; ``pause``, ``resume``; ``stop`` or
      ``clear``: cancel it.

    ``ScheduleSpecError`` (one line, with the usage) for anything else.
    """
    when = now or utcnow()
    command, rest, delivery = _split_flags(text)
    if command.lower() != HEARTBEAT_COMMAND:
        raise ScheduleSpecError(f"not a heartbeat command; {HEARTBEAT_USAGE}")
    words = rest.split()
    action = words[0].lower() if words else "status"
    if action in _HEARTBEAT_ACTIONS and len(words) <= 1:
        return await _manage_heartbeat(store, session_id, action, when, tz, poke)
    first, tail = _first_word(rest)
    line = f"{HEARTBEAT_COMMAND} {rest}"
    if _BARE_DURATION_RE.fullmatch(first):
        line = f"{HEARTBEAT_COMMAND} every {first}{tail}"
    spec, instruction = parse_heartbeat_command(line, now=when, local_tz=local_tz)
    row = await add_schedule(
        store,
        session_id,
        schedule_store.canonical_spec_text(spec),
        instruction,
        source=USER_HEARTBEAT,
        delivery=delivery or DEFAULT_DELIVERY,
        now=when,
        tz=tz,
        poke=poke,
    )
    return HeartbeatCommandResult("set", row, f"heartbeat set: {describe(row)}")


async def _manage_heartbeat(
    store: Store,
    session_id: str,
    action: str,
    when: dt.datetime,
    tz: dt.tzinfo,
    poke: Poke | None,
) -> HeartbeatCommandResult:
    def run(con: duckdb.DuckDBPyConnection) -> tuple[HeartbeatAction, ScheduleRow | None]:
        live = schedule_store.select_schedules(con, session_id=session_id, sources=[USER_HEARTBEAT])
        row = live[-1] if live else None
        if row is None or action == "status":
            return "status", row
        if action == "pause":
            if row.status == "paused":
                return "paused", row
            return "paused", schedule_store.update_schedule(
                con, row.id, status="paused", now=when, tz=tz
            )
        if action == "resume":
            if row.status == "active":
                return "resumed", row
            return "resumed", schedule_store.update_schedule(
                con, row.id, status="active", now=when, tz=tz
            )
        return "stopped", schedule_store.update_schedule(
            con, row.id, status="cancelled", now=when, tz=tz
        )

    done, row = await store.transaction(run)
    if done != "status":
        _poke(poke)
    if row is None:
        return HeartbeatCommandResult(
            "status", None, "no heartbeat; set one with '/heartbeat every 10m <text>'"
        )
    return HeartbeatCommandResult(done, row, f"heartbeat {done}: {describe(row)}")


# -- the kernel's rlm_heartbeat ------------------------------------------------------------------


def heartbeat_wire(row: ScheduleRow) -> dict[str, Any]:
    """A heartbeat as the kernel sees it (``orchestrator/runtime/heartbeat.py``)."""
    wire = row.to_wire()
    return {
        "id": row.id,
        "label": row.label,
        "instruction": row.prompt,
        "interval": row.spec,
        "delivery": row.delivery,
        "status": row.status,
        "next_run_at": wire["next_run_at"],
        "last_run_at": wire["last_run_at"],
        "run_count": row.run_count,
        "last_error": row.last_error,
        "created_at": wire["created_at"],
        "updated_at": wire["updated_at"],
    }


class CreateArgs(RequestArgs):
    instruction: str = Field(max_length=PROMPT_MAX_CHARS)
    interval: str = Field(default=DEFAULT_HEARTBEAT_INTERVAL, max_length=SPEC_MAX_CHARS)
    label: str | None = Field(default=None, max_length=LABEL_MAX_CHARS)
    delivery: Delivery = DEFAULT_DELIVERY


class ListArgs(RequestArgs):
    include_inactive: bool = False


class UpdateArgs(RequestArgs):
    id: str = Field(min_length=1, max_length=REF_MAX_CHARS)
    instruction: str | None = Field(default=None, max_length=PROMPT_MAX_CHARS)
    interval: str | None = Field(default=None, max_length=SPEC_MAX_CHARS)
    label: str | None = Field(default=None, max_length=LABEL_MAX_CHARS)
    delivery: Delivery | None = None
    paused: bool | None = None


class DeleteArgs(RequestArgs):
    id: str = Field(min_length=1, max_length=REF_MAX_CHARS)


def _refused(where: str, exc: ScheduleError | ScheduleSpecError) -> HostRequestError:
    code = exc.code if isinstance(exc, ScheduleError) else "invalid_argument"
    return HostRequestError(code, f"{where}: {exc}")


class HeartbeatCaller(Protocol):
    """What the handlers read of the live session a request came from (a ``LiveSession``)."""

    @property
    def state(self) -> str: ...


class HeartbeatHost(Protocol):
    """What the handlers need of the orchestrator: its live sessions by id and its store.

    ``scheduler`` is an optional hook (the daemon's), looked up when a change must wake it.
    """

    @property
    def sessions(self) -> Mapping[str, HeartbeatCaller]: ...

    @property
    def store(self) -> Store: ...


class ScheduleService:
    """The ``rlm_heartbeat.*`` handlers over an ``Orchestrator`` (its ``store``, ``sessions``
    and, when it has one, ``scheduler``)."""

    def __init__(
        self,
        orch: HeartbeatHost,
        *,
        clock: Callable[[], dt.datetime] = utcnow,
        tz: dt.tzinfo = dt.UTC,
    ) -> None:
        self.orch = orch
        self._clock = clock
        self._tz = tz

    def handlers(self) -> dict[str, Handler]:
        return {
            "rlm_heartbeat.create": self.create,
            "rlm_heartbeat.list": self.list_heartbeats,
            "rlm_heartbeat.update": self.update,
            "rlm_heartbeat.delete": self.delete,
        }

    def _check_caller(self, session_id: str) -> None:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted":
            raise HostRequestError("not_found", f"session {session_id} is not live here")

    def _poke(self) -> None:
        # The integrator's daemon has a scheduler; an orchestrator built without one (tests,
        # print mode) has nothing to wake.
        scheduler = getattr(self.orch, "scheduler", None)
        if scheduler is not None:
            scheduler.poke()

    async def create(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        where = "rlm_heartbeat.create"
        self._check_caller(caller)
        a = parse_args(CreateArgs, where, args)
        try:
            row = await add_schedule(
                self.orch.store,
                caller,
                interval_spec(a.interval),
                a.instruction,
                source=RLM_HEARTBEAT,
                label=a.label,
                delivery=a.delivery,
                now=self._clock(),
                tz=self._tz,
                poke=self._poke,
            )
        except (ScheduleError, ScheduleSpecError) as exc:
            raise _refused(where, exc) from None
        return heartbeat_wire(row)

    async def list_heartbeats(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        self._check_caller(caller)
        a = parse_args(ListArgs, "rlm_heartbeat.list", args)
        rows = await list_schedules(
            self.orch.store,
            session_id=caller,
            include_inactive=a.include_inactive,
            sources=[RLM_HEARTBEAT],
        )
        # The newest ones when there are too many (the live ones come first anyway).
        kept = rows[-HEARTBEAT_LIST_MAX_ITEMS:]
        out: list[dict[str, Any]] = []
        used = 0
        for row in reversed(kept):
            wire = heartbeat_wire(row)
            used += len(json.dumps(wire))
            if out and used > HEARTBEAT_REPLY_MAX_BYTES:
                break
            out.append(wire)
        out.reverse()
        return {"heartbeats": out, "more": len(out) < len(rows)}

    async def update(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        where = "rlm_heartbeat.update"
        self._check_caller(caller)
        a = parse_args(UpdateArgs, where, args)
        now = self._clock()
        tz = self._tz
        try:
            prompt = None if a.instruction is None else _check_prompt(a.instruction, "instruction")
            spec = None if a.interval is None else _parse_spec(interval_spec(a.interval), now, None)
            changes: dict[str, Any] = {}
            if "label" in a.model_fields_set:
                changes["label"] = _check_label(a.label)
            if a.paused is not None:
                changes["status"] = "paused" if a.paused else "active"

            def write(con: duckdb.DuckDBPyConnection) -> ScheduleRow:
                row = _resolve(con, a.id, session_id=caller, sources=[RLM_HEARTBEAT], by_label=True)
                if "label" in changes:
                    _check_unique_label(
                        con, caller, changes["label"], source=RLM_HEARTBEAT, except_id=row.id
                    )
                return schedule_store.update_schedule(
                    con,
                    row.id,
                    prompt=prompt,
                    spec=spec,
                    delivery=a.delivery,
                    now=now,
                    tz=tz,
                    **changes,
                )

            row = await self.orch.store.transaction(write)
        except (ScheduleError, ScheduleSpecError) as exc:
            raise _refused(where, exc) from None
        self._poke()
        return heartbeat_wire(row)

    async def delete(self, caller: str, args: dict[str, Any]) -> dict[str, Any]:
        where = "rlm_heartbeat.delete"
        self._check_caller(caller)
        a = parse_args(DeleteArgs, where, args)
        now = self._clock()

        def write(con: duckdb.DuckDBPyConnection) -> ScheduleRow:
            row = _resolve(con, a.id, session_id=caller, sources=[RLM_HEARTBEAT], by_label=True)
            if row.final:
                return row  # deleting twice is not an error: it is gone either way
            return schedule_store.update_schedule(con, row.id, status="cancelled", now=now)

        try:
            row = await self.orch.store.transaction(write)
        except (ScheduleError, ScheduleSpecError) as exc:
            raise _refused(where, exc) from None
        self._poke()
        return heartbeat_wire(row)
