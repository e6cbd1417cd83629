"""Five-field cron expressions: parsing and the next fire time, with Vixie cron's semantics.

A schedule (``prime-agent schedule add``) or a heartbeat (``/heartbeat cron "…" <text>``) may be
written as the cron expression people already know, so it must mean what it means to cron: a
surprise here is a job that silently never runs, or runs at 3 a.m. instead of 2 a.m.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or ``jan``-``dec``), day of
week (0-7 or ``sun``-``sat``; 0 and 7 are both Sunday). A field is a comma list of items; an item
is ``*``, a number or name, a range ``a-b``, or a step ``*/n`` / ``a-b/n``. Names are
case-insensitive. ``a/n`` (cronie's "from a to the end") is refused with a hint rather than
guessed at, and so is a backwards range ``fri-mon``.

Day matching follows Vixie cron exactly, quirk included: when the day-of-month *and* the
day-of-week field are both restricted, a day matches if *either* matches (``0 0 1 * mon`` fires on
the 1st and on every Monday); otherwise both must match. "Restricted" is decided the way Vixie
does it, by the field's first character: a field that starts with ``*`` (also ``*/2``) counts as
unrestricted, so ``0 0 */2 * mon`` fires on odd days that are Mondays.

Time zones: fields are matched against the wall clock of a zone (UTC unless told otherwise), and
daylight-saving jumps are handled like cronie does, so a daily job runs once a day every day:

- a wall time skipped by a jump forward (02:30 on the spring-forward night in Europe) fires at the
  first instant after the jump (03:00 local); several skipped times collapse into one fire;
- a wall time that occurs twice (the fall-back hour) fires at its first occurrence only, unless
  the hour field is unrestricted (``*``, ``*/2``…): jobs that run every hour anyway run in the
  repeated hour too.

An expression that can never fire (``0 0 31 2 *``) is refused when parsed, so the search for the
next fire always ends; it looks at most ``CRON_SEARCH_YEARS`` ahead (the Gregorian calendar
repeats every 400 years, so a match exists within that window or never).
"""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

from orchestrator.errors import ScheduleSpecError

__all__ = [
    "CRON_FIELD_COUNT",
    "CRON_FOLD_LOOKBACK",
    "CRON_SEARCH_YEARS",
    "DAY_OF_MONTH_RANGE",
    "DAY_OF_WEEK_RANGE",
    "HOUR_RANGE",
    "MINUTE_RANGE",
    "MONTH_MAX_DAYS",
    "MONTH_NAMES",
    "MONTH_RANGE",
    "SPEC_ECHO_MAX_CHARS",
    "SUNDAY_ALIAS",
    "WEEKDAY_NAMES",
    "CronSpec",
    "cron_weekday",
    "next_cron_fire",
    "parse_cron",
    "shown_spec",
]

CRON_FIELD_COUNT = 5
MINUTE_RANGE = (0, 59)
HOUR_RANGE = (0, 23)
DAY_OF_MONTH_RANGE = (1, 31)
MONTH_RANGE = (1, 12)
DAY_OF_WEEK_RANGE = (0, 7)
SUNDAY_ALIAS = 7  # day of week 7 is Sunday, like 0
# The Gregorian calendar repeats every 400 years: nothing in that window means never.
CRON_SEARCH_YEARS = 400
# How far a wall time can repeat (the fall-back shift); real zones shift by at most 2 hours.
CRON_FOLD_LOOKBACK = dt.timedelta(hours=3)
# How much of a bad spec an error message quotes back.
SPEC_ECHO_MAX_CHARS = 80
# The longest each month can be (February in a leap year), for the "never fires" check.
_LEAP_YEAR = 2000
MONTH_MAX_DAYS = {month: calendar.monthrange(_LEAP_YEAR, month)[1] for month in range(1, 13)}

MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
        start=1,
    )
}
WEEKDAY_NAMES = {
    name: number for number, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}

_FIELDS: tuple[tuple[str, tuple[int, int], dict[str, int]], ...] = (
    ("minute", MINUTE_RANGE, {}),
    ("hour", HOUR_RANGE, {}),
    ("day-of-month", DAY_OF_MONTH_RANGE, {}),
    ("month", MONTH_RANGE, MONTH_NAMES),
    ("day-of-week", DAY_OF_WEEK_RANGE, WEEKDAY_NAMES),
)
_EXAMPLE = "e.g. '*/15 * * * *' or '30 9 * * mon-fri'"
_ONE_SECOND = dt.timedelta(seconds=1)


@dataclass(frozen=True)
class CronSpec:
    """A parsed cron expression. The value sets are sorted tuples; ``weekdays`` uses 0 = Sunday
    (7 already folded into 0). ``text`` is the canonical expression (lower case, single
    spaces): ``parse_cron(spec.text) == spec``."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    day_star: bool  # the day-of-month field starts with '*' (Vixie's DOM_STAR)
    weekday_star: bool  # the day-of-week field starts with '*' (Vixie's DOW_STAR)
    hour_star: bool  # the hour field starts with '*': fires in a repeated hour too
    text: str

    def matches_day(self, day: dt.date) -> bool:
        """Whether ``day`` is a day this expression runs on (month included)."""
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = cron_weekday(day) in self.weekdays
        if self.day_star or self.weekday_star:
            return by_date and by_weekday
        return by_date or by_weekday

    def matches(self, wall: dt.datetime) -> bool:
        """Whether the wall-clock minute of ``wall`` (its own fields, zone ignored) matches."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and self.matches_day(wall.date())
        )


def cron_weekday(day: dt.date) -> int:
    """Cron's day of week: 0 = Sunday … 6 = Saturday (Python's ``weekday()`` starts Monday)."""
    return (day.weekday() + 1) % 7


def shown_spec(text: str) -> str:
    """User text as an error message quotes it: on one line (whitespace runs become one space)
    and at most ``SPEC_ECHO_MAX_CHARS`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SPEC_ECHO_MAX_CHARS else flat[:SPEC_ECHO_MAX_CHARS] + "…"


# --- parsing -------------------------------------------------------------------------------------


def parse_cron(text: str) -> CronSpec:
    """Parse a five-field cron expression; ``ScheduleSpecError`` (one line) when it is invalid
    or can never fire."""
    fields = text.split()
    if len(fields) != CRON_FIELD_COUNT:
        raise ScheduleSpecError(
            f"cron '{shown_spec(text)}' has {len(fields)} fields, not {CRON_FIELD_COUNT}; write "
            f"minute hour day-of-month month day-of-week, {_EXAMPLE}"
        )
    fields = [field.lower() for field in fields]
    values = [
        _parse_field(field, name, bounds, names)
        for field, (name, bounds, names) in zip(fields, _FIELDS, strict=True)
    ]
    weekdays = tuple(sorted({0 if day == SUNDAY_ALIAS else day for day in values[4]}))
    spec = CronSpec(
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        day_star=fields[2].startswith("*"),
        weekday_star=fields[4].startswith("*"),
        hour_star=fields[1].startswith("*"),
        text=" ".join(fields),
    )
    _check_can_fire(spec)
    return spec


def _parse_field(
    field: str, name: str, bounds: tuple[int, int], names: dict[str, int]
) -> tuple[int, ...]:
    low, high = bounds
    values: set[int] = set()
    for item in field.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            step = _number(step_text, field, name, "step")
            if step < 1:
                _field_error(field, name, "a step must be 1 or more")
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _value(first, field, name, bounds, names)
            end = _value(last, field, name, bounds, names)
            if start > end:
                _field_error(
                    field,
                    name,
                    f"the range {base} runs backwards",
                    instead="the low end first, or a list of two ranges like 'a-b,c-d'",
                )
        else:
            start = end = _value(base, field, name, bounds, names)
            if slash:
                _field_error(
                    field,
                    name,
                    f"'{item}' steps from a single value",
                    instead=f"'{base}-{high}/{step_text}' or '*/{step_text}'",
                )
        values.update(range(start, end + 1, step))
    return tuple(sorted(values))


def _number(token: str, field: str, name: str, what: str) -> int:
    if not (token.isascii() and token.isdigit()):
        _field_error(field, name, f"the {what} '{token}' is not a number")
    return int(token)


def _value(
    token: str, field: str, name: str, bounds: tuple[int, int], names: dict[str, int]
) -> int:
    low, high = bounds
    if token in names:
        return names[token]
    if not (token.isascii() and token.isdigit()):
        hint = f" or a name ({', '.join(names)})" if names else ""
        _field_error(field, name, f"'{token}' is not a number {low}-{high}{hint}")
    number = int(token)
    if not low <= number <= high:
        _field_error(field, name, f"{number} is outside {low}-{high}")
    return number


def _field_error(field: str, name: str, problem: str, *, instead: str = "") -> NoReturn:
    instead = instead or (
        f"numbers, '*', ranges 'a-b', lists 'a,b' and steps '*/n' or 'a-b/n', {_EXAMPLE}"
    )
    raise ScheduleSpecError(f"cron {name} field '{shown_spec(field)}': {problem}; write {instead}")


def _check_can_fire(spec: CronSpec) -> None:
    """Refuse an expression with no day to run on. When either day field is unrestricted both
    must match, so some chosen day must exist in some chosen month (every date falls on every
    weekday over the 400-year cycle); otherwise (either one matching) any month has every
    weekday, so it always fires."""
    if not (spec.day_star or spec.weekday_star):
        return
    if any(day <= MONTH_MAX_DAYS[month] for month in spec.months for day in spec.days):
        return
    raise ScheduleSpecError(
        f"cron '{spec.text}' never fires: none of its months has any of its days; "
        f"write a day that exists in the month, {_EXAMPLE}"
    )


# --- the next fire -------------------------------------------------------------------------------


def next_cron_fire(
    spec: CronSpec, after: dt.datetime, tz: dt.tzinfo = dt.UTC
) -> dt.datetime | None:
    """The first instant strictly after ``after`` (aware) at which ``spec`` fires, its fields
    read on the wall clock of ``tz``; aware UTC, or None past ``CRON_SEARCH_YEARS`` or the end
    of ``datetime``'s range. Daylight-saving jumps: see the module docstring."""
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("next_cron_fire needs a timezone-aware 'after'")
    after = after.astimezone(dt.UTC)
    # A wall time's second occurrence lies up to one fall-back shift after its first, so start
    # the walk over wall times that far back; a fixed-offset zone repeats nothing.
    lookback = dt.timedelta(0) if isinstance(tz, dt.timezone) else CRON_FOLD_LOOKBACK
    try:
        start = (after - lookback).astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
        best: dt.datetime | None = None
        for wall in _walls(spec, start):
            first, second = _instants(wall, tz, repeat=spec.hour_star)
            if second is not None and second > after and (best is None or second < best):
                best = second
            if first > after:
                # First occurrences (and jump-forward fires) rise with the wall time, and every
                # later second occurrence comes after its own first one: nothing later is earlier.
                return first if best is None or first < best else best
        return best
    except OverflowError:
        return None


def _walls(spec: CronSpec, start: dt.datetime) -> Iterator[dt.datetime]:
    """Matching naive wall times at or after ``start``, ascending."""
    start_day = start.date()
    last_year = min(start.year + CRON_SEARCH_YEARS, dt.MAXYEAR)
    for year in range(start.year, last_year + 1):
        for month in spec.months:
            if (year, month) < (start.year, start.month):
                continue
            for day_number in range(1, calendar.monthrange(year, month)[1] + 1):
                day = dt.date(year, month, day_number)
                if day < start_day or not spec.matches_day(day):
                    continue
                for hour in spec.hours:
                    if day == start_day and hour < start.hour:
                        continue
                    for minute in spec.minutes:
                        wall = dt.datetime(year, month, day_number, hour, minute)
                        if wall >= start:
                            yield wall


def _instants(
    wall: dt.datetime, tz: dt.tzinfo, *, repeat: bool
) -> tuple[dt.datetime, dt.datetime | None]:
    """When the naive ``wall`` time happens in ``tz``: (the first or only instant, the second
    instant of a repeated wall time when ``repeat``). A skipped wall time gives the instant the
    clock jumped."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(dt.UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(dt.UTC)
    if first == second:
        return first, None
    if first < second:  # fall back: the wall time happens twice (PEP 495's fold)
        return first, second if repeat else None
    # Spring forward: fold=0 reads the wall time with the offset before the jump (an instant
    # after the jump), fold=1 with the one after it (an instant before the jump).
    return _jump_instant(wall, tz, second, first), None


def _jump_instant(
    wall: dt.datetime, tz: dt.tzinfo, before: dt.datetime, after: dt.datetime
) -> dt.datetime:
    """The first instant in (``before``, ``after``] whose wall time in ``tz`` is ``wall`` or
    later: the moment the clock jumped over ``wall``. Bisection to the second (zone transitions
    fall on whole seconds)."""
    low, high = before, after
    while high - low > _ONE_SECOND:
        middle = low + (high - low) // 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            middle = low + _ONE_SECOND
        if middle.astimezone(tz).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return high
