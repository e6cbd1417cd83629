"""The ``schedules`` and ``dispatches`` tables: heartbeats and schedules (docs/spec.md §7, issue 8).

A schedule is a prompt put into a session when its spec (``orchestrator/store/timespec.py``)
fires. ``source`` says who made it: ``user`` (``prime-agent schedule add``), ``heartbeat``
(``/heartbeat``, one per session) or ``rlm_heartbeat`` (the kernel's ``rlm_heartbeat``, several
per session). ``status`` moves active ⇄ paused → completed | cancelled.

**Claim before delivery.** A due tick is *claimed* in one transaction (``claim_due``): a
``dispatches`` row with status ``claimed`` is written and the schedule's ``next_run_at`` moves on,
so the tick is never handed out twice. Only then is the prompt delivered, and the dispatch is
marked ``delivered`` or ``failed`` (``mark_dispatch``). A crash between the two leaves the claim;
the next daemon marks it ``interrupted`` (``recover_interrupted``) and never replays it: we
cannot know whether the prompt reached the session, and a replayed prompt is a side effect
done twice. Ticks missed while nothing ran fold into the one late tick claimed
(``next_fire_after_claim``).

**The spec is text.** ``spec`` is the canonical text of the spec and ``created_at`` its anchor
(``parse_schedule(spec, now=created_at)``): the grid of ``every`` starts there. Changing the spec
moves the anchor to the time of the change. A one-shot is stored as ``at <ISO time>``, which
means the same instant whatever the anchor.

Like ``queries``, these functions take the DuckDB connection and run on the store's writer
thread (``Store.read`` / ``Store.transaction``); the ones that write more than one row must run
in ``Store.transaction`` so that their writes commit together.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal, get_args

import duckdb

from orchestrator.errors import ScheduleSpecError, UserError
from orchestrator.ids import new_event_id
from orchestrator.store.queries import from_db_ts, to_db_ts, utcnow
from orchestrator.store.timespec import (
    Every,
    Once,
    ScheduleSpec,
    next_fire,
    next_fire_after_claim,
    parse_schedule,
)

__all__ = [
    "DELIVERIES",
    "DETAIL_MAX_CHARS",
    "DISPATCH_ID_PREFIX",
    "DISPATCH_STATUSES",
    "FINAL_STATUSES",
    "HEARTBEAT_SOURCES",
    "INTERRUPTED_DETAIL",
    "LIVE_STATUSES",
    "SCHEDULE_ID_PREFIX",
    "SCHEDULE_SOURCES",
    "SCHEDULE_STATUSES",
    "Delivery",
    "DispatchRow",
    "DispatchStatus",
    "ScheduleError",
    "ScheduleLimitReached",
    "ScheduleNotFound",
    "ScheduleRow",
    "ScheduleSource",
    "ScheduleStatus",
    "active_heartbeat_sessions",
    "canonical_spec_text",
    "claim_due",
    "count_live",
    "insert_schedule",
    "mark_dispatch",
    "new_dispatch_id",
    "new_schedule_id",
    "next_due_at",
    "recover_interrupted",
    "row_spec",
    "select_dispatches",
    "select_due",
    "select_schedule",
    "select_schedules",
    "update_schedule",
]

ScheduleStatus = Literal["active", "paused", "completed", "cancelled"]
SCHEDULE_STATUSES: Final[tuple[ScheduleStatus, ...]] = get_args(ScheduleStatus)
# A schedule in one of these never fires again and cannot be changed.
FINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "cancelled"})
# Not final: counted by the per-session caps.
LIVE_STATUSES: Final[tuple[ScheduleStatus, ...]] = ("active", "paused")

ScheduleSource = Literal["user", "heartbeat", "rlm_heartbeat"]
SCHEDULE_SOURCES: Final[tuple[ScheduleSource, ...]] = get_args(ScheduleSource)
# An active schedule of these sources keeps its session loaded (docs/spec.md §4, idle unload).
HEARTBEAT_SOURCES: Final[tuple[ScheduleSource, ...]] = ("heartbeat", "rlm_heartbeat")

Delivery = Literal["steer", "follow_up"]
DELIVERIES: Final[tuple[Delivery, ...]] = get_args(Delivery)

DispatchStatus = Literal["claimed", "delivered", "deferred", "interrupted", "failed"]
DISPATCH_STATUSES: Final[tuple[DispatchStatus, ...]] = get_args(DispatchStatus)

SCHEDULE_ID_PREFIX: Final = "sch-"
DISPATCH_ID_PREFIX: Final = "dsp-"
# How much of an error a dispatch (``detail``) or a schedule (``last_error``) keeps.
DETAIL_MAX_CHARS: Final = 1000
INTERRUPTED_DETAIL: Final = (
    "the daemon stopped after this tick was claimed and before it was known to be delivered; "
    "it is not replayed"
)
_CUT_MARK: Final = "…"


class ScheduleError(UserError):
    """A schedule change was refused; ``code`` is a host error code (``runtime.wire``) so a
    handler passes it on unchanged, and the control API maps it to its own."""

    code = "invalid_argument"


class ScheduleNotFound(ScheduleError):
    """No such schedule (or not one of the caller's)."""

    code = "not_found"


class ScheduleLimitReached(ScheduleError):
    """The session already has as many live schedules of this kind as it may."""

    code = "quota_exceeded"


def new_schedule_id() -> str:
    """``sch-`` and a sortable unique suffix: ids sort in creation order."""
    return SCHEDULE_ID_PREFIX + new_event_id()


def new_dispatch_id() -> str:
    return DISPATCH_ID_PREFIX + new_event_id()


def _one_line(text: str | None) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    if len(flat) > DETAIL_MAX_CHARS:
        flat = flat[: DETAIL_MAX_CHARS - len(_CUT_MARK)] + _CUT_MARK
    return flat


# -- rows ----------------------------------------------------------------------------------------


def _wire(row: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(row):  # type: ignore[arg-type]
        value = getattr(row, f.name)
        out[f.name] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out


@dataclass(frozen=True)
class ScheduleRow:
    """One row of ``schedules``; the migration (0006) documents each column."""

    id: str
    session_id: str
    source: ScheduleSource
    label: str | None
    spec: str
    prompt: str
    delivery: Delivery
    status: ScheduleStatus
    next_run_at: dt.datetime | None
    last_run_at: dt.datetime | None
    run_count: int
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_wire(self) -> dict[str, Any]:
        """JSON types (times as ISO-8601 UTC), as the control API sees it."""
        return _wire(self)


@dataclass(frozen=True)
class DispatchRow:
    """One row of ``dispatches``: one claimed tick and what became of it."""

    id: str
    schedule_id: str
    session_id: str
    scheduled_for: dt.datetime
    claimed_at: dt.datetime
    status: DispatchStatus
    delivered_at: dt.datetime | None = None
    detail: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return _wire(self)


_SCHEDULE_COLUMNS: Final = tuple(f.name for f in fields(ScheduleRow))
_DISPATCH_COLUMNS: Final = tuple(f.name for f in fields(DispatchRow))
_SCHEDULE_LIST = ", ".join(_SCHEDULE_COLUMNS)
_DISPATCH_LIST = ", ".join(_DISPATCH_COLUMNS)
_SCHEDULE_TIMES = frozenset({"next_run_at", "last_run_at", "created_at", "updated_at"})
_DISPATCH_TIMES = frozenset({"scheduled_for", "claimed_at", "delivered_at"})
# A schedule whose last tick is still being delivered: not handed out again until that ends
# (a still-open claim folds the ticks that fall due meanwhile into the next one).
_NOT_IN_FLIGHT = (
    "NOT EXISTS (SELECT 1 FROM dispatches d "
    "WHERE d.schedule_id = schedules.id AND d.status = 'claimed')"
)


def _to_db(value: Any) -> Any:
    return to_db_ts(value) if isinstance(value, dt.datetime) else value


def _schedule(values: Sequence[Any]) -> ScheduleRow:
    data = dict(zip(_SCHEDULE_COLUMNS, values, strict=True))
    for name in _SCHEDULE_TIMES:
        if data[name] is not None:
            data[name] = from_db_ts(data[name])
    return ScheduleRow(**data)


def _dispatch(values: Sequence[Any]) -> DispatchRow:
    data = dict(zip(_DISPATCH_COLUMNS, values, strict=True))
    for name in _DISPATCH_TIMES:
        if data[name] is not None:
            data[name] = from_db_ts(data[name])
    return DispatchRow(**data)


def _check(value: object, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}: expected one of {', '.join(allowed)}")


def _aware(value: dt.datetime, name: str) -> dt.datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")
    return value.astimezone(dt.UTC)


# -- specs ---------------------------------------------------------------------------------------


def canonical_spec_text(spec: ScheduleSpec) -> str:
    """The text stored for ``spec``: its own canonical text, except that a one-shot is kept as
    ``at <ISO time>`` (``in 10m`` would mean another instant under another anchor)."""
    if isinstance(spec, Once):
        return f"at {spec.at.isoformat()}"
    return spec.text


def row_spec(row: ScheduleRow) -> ScheduleSpec:
    """The spec of a stored schedule (``ScheduleSpecError`` if the text no longer parses)."""
    return parse_schedule(row.spec, now=row.created_at)


def _anchored(
    spec: ScheduleSpec | str, now: dt.datetime, local_tz: dt.tzinfo | None
) -> tuple[ScheduleSpec, dt.datetime]:
    """(spec, anchor): an ``every`` grid starts at the spec's own start, anything else at now."""
    parsed = parse_schedule(spec, now=now, local_tz=local_tz) if isinstance(spec, str) else spec
    anchor = parsed.start if isinstance(parsed, Every) else now
    return parsed, anchor


# -- writes --------------------------------------------------------------------------------------


def insert_schedule(
    con: duckdb.DuckDBPyConnection,
    *,
    session_id: str,
    source: ScheduleSource,
    spec: ScheduleSpec | str,
    prompt: str,
    delivery: Delivery = "steer",
    label: str | None = None,
    now: dt.datetime | None = None,
    tz: dt.tzinfo = dt.UTC,
    local_tz: dt.tzinfo | None = None,
    schedule_id: str | None = None,
) -> ScheduleRow:
    """Store a new active schedule whose first tick is ``next_fire(spec, anchor)``.

    ``spec``: a parsed spec or its text (parsed with ``now``; ``local_tz`` reads an ``at`` time
    without an offset). ``tz``: the wall clock a cron expression is read on.
    ``ScheduleSpecError`` for a bad spec or one that will never fire.
    """
    _check(source, SCHEDULE_SOURCES, "schedule source")
    _check(delivery, DELIVERIES, "delivery")
    now = _aware(now or utcnow(), "now")
    parsed, anchor = _anchored(spec, now, local_tz)
    first = next_fire(parsed, anchor, tz=tz)
    if first is None:
        raise ScheduleSpecError(f"schedule '{parsed.text}' never fires again")
    row = ScheduleRow(
        id=schedule_id or new_schedule_id(),
        session_id=session_id,
        source=source,
        label=label,
        spec=canonical_spec_text(parsed),
        prompt=prompt,
        delivery=delivery,
        status="active",
        next_run_at=first,
        last_run_at=None,
        run_count=0,
        last_error=None,
        created_at=anchor,
        updated_at=now,
    )
    placeholders = ", ".join(f"${i}" for i in range(1, len(_SCHEDULE_COLUMNS) + 1))
    con.execute(
        f"INSERT INTO schedules ({_SCHEDULE_LIST}) VALUES ({placeholders})",
        [_to_db(getattr(row, name)) for name in _SCHEDULE_COLUMNS],
    )
    return row


_KEEP: Final[Any] = object()


def _write_schedule(con: duckdb.DuckDBPyConnection, row: ScheduleRow) -> None:
    names = [name for name in _SCHEDULE_COLUMNS if name != "id"]
    assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=2))
    con.execute(
        f"UPDATE schedules SET {assignments} WHERE id = $1",
        [row.id, *(_to_db(getattr(row, name)) for name in names)],
    )


def update_schedule(
    con: duckdb.DuckDBPyConnection,
    schedule_id: str,
    *,
    status: ScheduleStatus | None = None,
    label: str | None = _KEEP,
    prompt: str | None = None,
    spec: ScheduleSpec | str | None = None,
    delivery: Delivery | None = None,
    now: dt.datetime | None = None,
    tz: dt.tzinfo = dt.UTC,
    local_tz: dt.tzinfo | None = None,
) -> ScheduleRow:
    """Change one schedule; returns it as stored afterwards. Arguments left out stay as they
    are (``label=None`` clears the label).

    - ``status="paused"`` stops it firing; ``"active"`` resumes it: a recurring schedule waits
      for its next regular tick after now (no burst for what it missed), a one-shot whose time
      passed while it was paused falls due at once. ``"cancelled"`` ends it for good.
    - a new ``spec`` is anchored at ``now`` and its first tick follows from there.

    ``ScheduleNotFound``; ``ScheduleError`` for a completed or cancelled schedule (they never
    change); ``ScheduleSpecError`` for a bad spec; ``ValueError`` for an unknown status or
    delivery (a caller's bug).
    """
    if status is not None:
        _check(status, SCHEDULE_STATUSES, "schedule status")
    if delivery is not None:
        _check(delivery, DELIVERIES, "delivery")
    now = _aware(now or utcnow(), "now")
    row = select_schedule(con, schedule_id)
    if row is None:
        raise ScheduleNotFound(f"no schedule {schedule_id!r}")
    if row.final:
        raise ScheduleError(f"schedule {schedule_id} is {row.status}; it cannot change any more")
    new = replace(row, updated_at=now)
    if label is not _KEEP:
        new = replace(new, label=label)
    if prompt is not None:
        new = replace(new, prompt=prompt)
    if delivery is not None:
        new = replace(new, delivery=delivery)
    resumed = status == "active" and row.status == "paused"
    if spec is not None:
        parsed, anchor = _anchored(spec, now, local_tz)
        new = replace(
            new,
            spec=canonical_spec_text(parsed),
            created_at=anchor,
            next_run_at=next_fire(parsed, anchor, tz=tz),
        )
    elif resumed:
        parsed = row_spec(row)
        if isinstance(parsed, Once):
            new = replace(new, next_run_at=next_fire(parsed, row.last_run_at or row.created_at))
        else:
            new = replace(new, next_run_at=next_fire(parsed, now, tz=tz))
    if status is not None:
        new = replace(new, status=status)
    if new.status == "cancelled":
        new = replace(new, next_run_at=None)
    elif new.next_run_at is None:
        new = replace(new, status="completed")  # a spec that will not fire again
    _write_schedule(con, new)
    return new


def claim_due(
    con: duckdb.DuckDBPyConnection,
    schedule_id: str,
    now: dt.datetime,
    *,
    tz: dt.tzinfo = dt.UTC,
) -> DispatchRow | None:
    """Claim the due tick of one schedule; run it inside the caller's ONE transaction.

    Re-checks that the schedule is active, due at ``now`` and not still delivering its last
    tick; then writes a ``claimed`` dispatch for the tick (``scheduled_for`` = the old
    ``next_run_at``), moves ``next_run_at`` to the first fire after both that tick and ``now``
    (ticks missed meanwhile fold into this one), counts the run, and completes a schedule that
    will not fire again. None when there is nothing to claim (not due, changed meanwhile, or
    already claimed): the same tick is never handed out twice.
    """
    now = _aware(now, "now")
    row = select_schedule(con, schedule_id)
    if row is None or row.status != "active" or row.next_run_at is None or row.next_run_at > now:
        return None
    open_claim = con.execute(
        "SELECT 1 FROM dispatches WHERE schedule_id = $1 AND status = 'claimed' LIMIT 1",
        [schedule_id],
    ).fetchone()
    if open_claim is not None:
        return None
    try:
        spec = row_spec(row)
    except ScheduleSpecError as exc:
        # A row this version can no longer read: stop it rather than fail every pass.
        _write_schedule(
            con,
            replace(
                row,
                status="cancelled",
                next_run_at=None,
                last_error=_one_line(str(exc)),
                updated_at=now,
            ),
        )
        return None
    dispatch = DispatchRow(
        id=new_dispatch_id(),
        schedule_id=row.id,
        session_id=row.session_id,
        scheduled_for=row.next_run_at,
        claimed_at=now,
        status="claimed",
    )
    placeholders = ", ".join(f"${i}" for i in range(1, len(_DISPATCH_COLUMNS) + 1))
    con.execute(
        f"INSERT INTO dispatches ({_DISPATCH_LIST}) VALUES ({placeholders})",
        [_to_db(getattr(dispatch, name)) for name in _DISPATCH_COLUMNS],
    )
    following = next_fire_after_claim(spec, row.next_run_at, now, tz=tz)
    _write_schedule(
        con,
        replace(
            row,
            next_run_at=following,
            status="active" if following is not None else "completed",
            run_count=row.run_count + 1,
            last_run_at=now,
            updated_at=now,
        ),
    )
    return dispatch


def mark_dispatch(
    con: duckdb.DuckDBPyConnection,
    dispatch_id: str,
    status: DispatchStatus,
    detail: str | None = None,
    *,
    now: dt.datetime | None = None,
) -> DispatchRow | None:
    """Record what became of a claimed tick: ``delivered`` (``delivered_at`` = now), ``failed``
    (``detail`` also becomes the schedule's ``last_error``) or ``interrupted``. Only a
    ``claimed`` dispatch changes; None when there is none with this id (already settled)."""
    _check(status, DISPATCH_STATUSES, "dispatch status")
    if status == "claimed":
        raise ValueError("a dispatch is claimed only by claim_due")
    now = _aware(now or utcnow(), "now")
    detail = _one_line(detail)
    found = con.execute(
        f"SELECT {_DISPATCH_LIST} FROM dispatches WHERE id = $1 AND status = 'claimed'",
        [dispatch_id],
    ).fetchone()
    if found is None:
        return None
    dispatch = replace(
        _dispatch(found),
        status=status,
        detail=detail,
        delivered_at=now if status == "delivered" else None,
    )
    con.execute(
        "UPDATE dispatches SET status = $2, detail = $3, delivered_at = $4 WHERE id = $1",
        [dispatch_id, status, detail, _to_db(dispatch.delivered_at)],
    )
    if status == "failed":
        con.execute(
            "UPDATE schedules SET last_error = $2, updated_at = $3 WHERE id = $1",
            [dispatch.schedule_id, detail, to_db_ts(now)],
        )
    return dispatch


def recover_interrupted(
    con: duckdb.DuckDBPyConnection, detail: str = INTERRUPTED_DETAIL
) -> list[DispatchRow]:
    """Mark every ``claimed`` dispatch ``interrupted`` and return them, oldest first: run once
    when a daemon starts, before it claims anything, because a claim that is still open then
    was left by a daemon that stopped mid-delivery."""
    found = con.execute(
        f"SELECT {_DISPATCH_LIST} FROM dispatches WHERE status = 'claimed' ORDER BY claimed_at, id"
    ).fetchall()
    if not found:
        return []
    detail_text = _one_line(detail)
    con.execute(
        "UPDATE dispatches SET status = 'interrupted', detail = $1 WHERE status = 'claimed'",
        [detail_text],
    )
    return [replace(_dispatch(v), status="interrupted", detail=detail_text) for v in found]


# -- reads ---------------------------------------------------------------------------------------


def select_schedule(con: duckdb.DuckDBPyConnection, schedule_id: str) -> ScheduleRow | None:
    values = con.execute(
        f"SELECT {_SCHEDULE_LIST} FROM schedules WHERE id = $1", [schedule_id]
    ).fetchone()
    return None if values is None else _schedule(values)


def select_schedules(
    con: duckdb.DuckDBPyConnection,
    *,
    session_id: str | None = None,
    include_inactive: bool = False,
    sources: Sequence[str] | None = None,
    id_prefix: str | None = None,
    limit: int | None = None,
) -> list[ScheduleRow]:
    """Schedules, oldest first: of one session, of some sources, whose id starts with
    ``id_prefix``; only active and paused ones unless ``include_inactive``."""
    conditions = ["TRUE"]
    params: list[Any] = []
    if session_id is not None:
        params.append(session_id)
        conditions.append(f"session_id = ${len(params)}")
    if not include_inactive:
        params.append(list(LIVE_STATUSES))
        conditions.append(f"list_contains(${len(params)}::VARCHAR[], status)")
    if sources is not None:
        params.append(list(dict.fromkeys(sources)))
        conditions.append(f"list_contains(${len(params)}::VARCHAR[], source)")
    if id_prefix is not None:
        params.append(id_prefix)
        conditions.append(f"starts_with(id, ${len(params)})")
    bound = ""
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        params.append(limit)
        bound = f" LIMIT ${len(params)}"
    rows = con.execute(
        f"SELECT {_SCHEDULE_LIST} FROM schedules WHERE {' AND '.join(conditions)} "
        f"ORDER BY created_at, id{bound}",
        params,
    ).fetchall()
    return [_schedule(values) for values in rows]


def count_live(con: duckdb.DuckDBPyConnection, session_id: str, sources: Sequence[str]) -> int:
    """Active and paused schedules of one session from ``sources`` (the per-session caps)."""
    found = con.execute(
        "SELECT count(*) FROM schedules WHERE session_id = $1 "
        "AND list_contains($2::VARCHAR[], status) AND list_contains($3::VARCHAR[], source)",
        [session_id, list(LIVE_STATUSES), list(sources)],
    ).fetchone()
    return int(found[0]) if found else 0


def select_due(
    con: duckdb.DuckDBPyConnection,
    now: dt.datetime,
    limit: int,
    *,
    exclude: Sequence[str] = (),
) -> list[ScheduleRow]:
    """Active schedules due at ``now``, not in ``exclude``, whose last tick is not still being
    delivered; the most overdue first, at most ``limit``."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = con.execute(
        f"SELECT {_SCHEDULE_LIST} FROM schedules WHERE status = 'active' "
        "AND next_run_at IS NOT NULL AND next_run_at <= $1 "
        f"AND NOT list_contains($3::VARCHAR[], id) AND {_NOT_IN_FLIGHT} "
        "ORDER BY next_run_at, id LIMIT $2",
        [to_db_ts(_aware(now, "now")), limit, list(exclude)],
    ).fetchall()
    return [_schedule(values) for values in rows]


def next_due_at(
    con: duckdb.DuckDBPyConnection, *, exclude: Sequence[str] = ()
) -> dt.datetime | None:
    """The earliest ``next_run_at`` of an active schedule that is not in ``exclude`` and not
    still delivering its last tick: when a scheduler must look again."""
    found = con.execute(
        "SELECT min(next_run_at) FROM schedules WHERE status = 'active' "
        f"AND next_run_at IS NOT NULL AND NOT list_contains($1::VARCHAR[], id) "
        f"AND {_NOT_IN_FLIGHT}",
        [list(exclude)],
    ).fetchone()
    return None if found is None or found[0] is None else from_db_ts(found[0])


def select_dispatches(
    con: duckdb.DuckDBPyConnection,
    *,
    schedule_id: str | None = None,
    status: DispatchStatus | None = None,
    limit: int = 100,
) -> list[DispatchRow]:
    """Dispatches, oldest claim first, of one schedule and/or with one status."""
    conditions = ["TRUE"]
    params: list[Any] = [limit]
    if schedule_id is not None:
        params.append(schedule_id)
        conditions.append(f"schedule_id = ${len(params)}")
    if status is not None:
        params.append(status)
        conditions.append(f"status = ${len(params)}")
    rows = con.execute(
        f"SELECT {_DISPATCH_LIST} FROM dispatches WHERE {' AND '.join(conditions)} "
        "ORDER BY claimed_at, id LIMIT $1",
        params,
    ).fetchall()
    return [_dispatch(values) for values in rows]


def active_heartbeat_sessions(
    con: duckdb.DuckDBPyConnection, sources: Sequence[str] = HEARTBEAT_SOURCES
) -> set[str]:
    """Sessions with an active (not paused) schedule from ``sources``: idle unload leaves them
    loaded, so a heartbeat does not pay a sandbox start at every tick."""
    rows = con.execute(
        "SELECT DISTINCT session_id FROM schedules WHERE status = 'active' "
        "AND list_contains($1::VARCHAR[], source)",
        [list(sources)],
    ).fetchall()
    return {str(values[0]) for values in rows}
