"""Schedule specs: ``in 10m``, ``every 30s``, ``at <ISO time>`` or a cron expression, parsed into
frozen values, and the next time each one fires. Groundwork of issue 8 (docs/schedules.md).

Schedules (``prime-agent schedule add``) and heartbeats (``/heartbeat every 10m <text>``) share
this grammar, so a person learns it once and both agree on what a spec means:

- ``in <duration>``: once, that long after the spec was parsed (``Once``).
- ``every <duration>``: repeatedly, every that long after the spec was parsed (``Every``); never
  more often than every ``MINIMUM_INTERVAL_S`` seconds, so a typo cannot flood a session.
- ``at <ISO-8601 time>``: once, at that time (``Once``). A time with an offset or ``Z`` means
  exactly that; a time without one is local time (``local_tz``, else the system's zone) the way
  a person reading a clock means it. A time that is not in the future is refused.
- ``cron <five fields>`` or just the five fields: Vixie cron (``orchestrator.store.cron``).

A duration is whole numbers with units ``d``, ``h``, ``m``, ``s`` in that order, each at most once,
without spaces: ``30s``, ``10m``, ``1h30m``, ``1d12h``; from 1 second up to ``MAX_DURATION_S``.

Specs are values: ``Once.at`` and ``Every.start`` are anchored at the ``now`` given to the
parser, and ``spec.text`` is a canonical spelling with ``parse_schedule(spec.text, now=now) ==
spec``; a store keeps the text and the creation time, never a pickled object.

The grammar lives in the store's package because the store reads it: ``store/schedules.py``
parses a stored spec and finds its next fire inside the transaction that claims a tick. The
control layer (``control/schedule_service.py``) and the daemon import it from here.

``next_fire(spec, after)`` is the first fire strictly after ``after``, where ``after`` is the
tick last claimed (or the creation time before the first). A one-shot therefore answers None once
its tick was claimed, with no separate "fired" flag to keep in step: the tick is the record. The
scheduler claims a due tick before delivering it (a crash never replays it) and asks
``next_fire_after_claim`` for the one after, which also folds ticks missed while the daemon was
down into the single late delivery just claimed.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import TypeAlias

from orchestrator.errors import ScheduleSpecError
from orchestrator.store.cron import (
    CRON_FIELD_COUNT,
    CronSpec,
    next_cron_fire,
    parse_cron,
    shown_spec,
)

__all__ = [
    "DURATION_MAX_CHARS",
    "DURATION_UNITS",
    "HEARTBEAT_COMMAND",
    "HEARTBEAT_USAGE",
    "MAX_DURATION_S",
    "MINIMUM_DELAY_S",
    "MINIMUM_INTERVAL_S",
    "SCHEDULE_USAGE",
    "CronSpec",
    "Every",
    "Once",
    "ScheduleSpec",
    "format_duration",
    "next_fire",
    "next_fire_after_claim",
    "parse_duration",
    "parse_heartbeat_command",
    "parse_schedule",
]

MINIMUM_INTERVAL_S = 10
MINIMUM_DELAY_S = 1
MAX_DURATION_S = 365 * 24 * 3600
# Longer than any valid duration ("365d" or "31535999s"): refused before any number is read.
DURATION_MAX_CHARS = 32
DURATION_UNITS = {"d": 24 * 3600, "h": 3600, "m": 60, "s": 1}
HEARTBEAT_COMMAND = "/heartbeat"

SCHEDULE_USAGE = (
    "write 'in 10m', 'every 30s', 'at 2026-05-09T14:00' (local time, or add an offset like "
    "+02:00 or Z) or five cron fields like '*/15 * * * *'"
)
HEARTBEAT_USAGE = (
    "write '/heartbeat every 10m <text>' (or 'in 5m', 'at 2026-05-09T14:00', "
    "'cron \"*/15 * * * *\"' in place of 'every 10m')"
)
_DURATION_EXAMPLE = "a number and a unit d, h, m or s, largest first, e.g. 30s, 10m, 1h30m"
_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", re.ASCII)
_WORD_RE = re.compile(r"\S*")
_CLOCK_RE = re.compile(
    r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?", re.I | re.A
)
_QUOTES = ("'", '"')


@dataclass(frozen=True)
class Once:
    """Fires once, at ``at`` (aware UTC); from ``in <duration>`` or ``at <time>``."""

    at: dt.datetime
    text: str


@dataclass(frozen=True)
class Every:
    """Fires at ``start + k * seconds`` for k = 1, 2, …: a fixed grid that never drifts, however
    late each tick is delivered. ``start`` is aware UTC."""

    seconds: int
    start: dt.datetime
    text: str


ScheduleSpec: TypeAlias = Once | Every | CronSpec


# --- durations -----------------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``30s``, ``10m`` or ``1h30m`` (see the module docstring)."""
    word = text.strip().lower()
    if len(word) > DURATION_MAX_CHARS:
        raise ScheduleSpecError(
            f"duration '{shown_spec(word)}' is too long; write {_DURATION_EXAMPLE}"
        )
    match = _DURATION_RE.fullmatch(word)
    if not word or match is None:
        raise ScheduleSpecError(
            f"duration '{shown_spec(word)}' is not understood; write {_DURATION_EXAMPLE}"
        )
    seconds = sum(
        int(number) * unit
        for number, unit in zip(match.groups(), DURATION_UNITS.values(), strict=True)
        if number is not None
    )
    if seconds > MAX_DURATION_S:
        raise ScheduleSpecError(
            f"duration '{word}' is longer than {format_duration(MAX_DURATION_S)}; "
            f"write {format_duration(MAX_DURATION_S)} or less"
        )
    return seconds


def format_duration(seconds: int) -> str:
    """The canonical spelling of a duration: ``5400`` → ``1h30m``; ``0`` → ``0s``."""
    parts = []
    left = seconds
    for unit, size in DURATION_UNITS.items():
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


# --- schedule specs ------------------------------------------------------------------------------


def parse_schedule(
    text: str, *, now: dt.datetime, local_tz: dt.tzinfo | None = None
) -> ScheduleSpec:
    """Parse a schedule spec (module docstring). ``now`` (aware) anchors ``in`` and ``every``
    and decides what is in the past; ``local_tz`` is the zone of an ``at`` time written without
    an offset (default: the system's local zone)."""
    now = _aware_utc(now, "now")
    shown = shown_spec(text)
    words = text.split()
    if not words:
        raise ScheduleSpecError(f"the schedule is empty; {SCHEDULE_USAGE}")
    head, rest = words[0].lower(), words[1:]
    if head in ("in", "every"):
        if len(rest) != 1:
            raise ScheduleSpecError(
                f"schedule '{shown}': '{head}' takes one duration; "
                f"write '{head} 10m' or '{head} 1h30m'"
            )
        seconds = parse_duration(rest[0])
        canonical = f"{head} {format_duration(seconds)}"
        if head == "in":
            if seconds < MINIMUM_DELAY_S:
                raise ScheduleSpecError(
                    f"schedule '{shown}': the delay must be at least "
                    f"{MINIMUM_DELAY_S}s; write e.g. 'in 10s'"
                )
            return Once(at=now + dt.timedelta(seconds=seconds), text=canonical)
        if seconds < MINIMUM_INTERVAL_S:
            raise ScheduleSpecError(
                f"schedule '{shown}': the shortest interval is {MINIMUM_INTERVAL_S}s; "
                f"write 'every {MINIMUM_INTERVAL_S}s' or longer"
            )
        return Every(seconds=seconds, start=now, text=canonical)
    if head == "at":
        at = _parse_time(" ".join(rest), now=now, local_tz=local_tz)
        return Once(at=at, text=f"at {at.isoformat()}")
    if head == "cron":
        return parse_cron(" ".join(rest))
    if len(words) == CRON_FIELD_COUNT:
        return parse_cron(" ".join(words))
    raise ScheduleSpecError(f"schedule '{shown}' is not understood; {SCHEDULE_USAGE}")


def _parse_time(text: str, *, now: dt.datetime, local_tz: dt.tzinfo | None) -> dt.datetime:
    example = "e.g. 'at 2026-05-09T14:00' (local time) or 'at 2026-05-09T14:00Z'"
    if not text:
        raise ScheduleSpecError(f"'at' needs a time; write {example}")
    try:
        # Upper case: fromisoformat reads 'T' and 'Z' but not 't' and 'z'.
        parsed = dt.datetime.fromisoformat(text.upper())
        if parsed.tzinfo is None:
            # Naive means local wall time; fold=0 reads a repeated time's first occurrence.
            parsed = (
                parsed.replace(tzinfo=local_tz) if local_tz is not None else parsed.astimezone()
            )
        at = parsed.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        raise ScheduleSpecError(
            f"time '{shown_spec(text)}' is not an ISO-8601 time; write {example}"
        ) from None
    if at <= now:
        raise ScheduleSpecError(
            f"time '{shown_spec(text)}' ({at.isoformat()}) is in the past; "
            f"write a future time, {example}"
        )
    return at


# --- when a spec fires ---------------------------------------------------------------------------


def next_fire(
    spec: ScheduleSpec, after: dt.datetime, *, tz: dt.tzinfo = dt.UTC
) -> dt.datetime | None:
    """The first instant strictly after ``after`` at which ``spec`` fires (aware UTC), or None
    when it never fires again. ``after`` is the last claimed tick, or the creation time before
    the first; ``tz`` is the zone whose wall clock a cron expression is read in (zoneinfo),
    unused by the other specs."""
    after = _aware_utc(after, "after")
    if isinstance(spec, CronSpec):
        return next_cron_fire(spec, after, tz)
    if isinstance(spec, Once):
        return spec.at if spec.at > after else None
    step = dt.timedelta(seconds=spec.seconds)
    ticks = max(1, (after - spec.start) // step + 1)
    try:
        return spec.start + ticks * step
    except OverflowError:
        return None


def next_fire_after_claim(
    spec: ScheduleSpec, claimed: dt.datetime, now: dt.datetime, *, tz: dt.tzinfo = dt.UTC
) -> dt.datetime | None:
    """The tick to wait for once the tick ``claimed`` was claimed at ``now``: the first fire
    after both, so ticks missed while nothing ran are folded into the one just claimed instead
    of being delivered in a burst."""
    return next_fire(spec, max(_aware_utc(claimed, "claimed"), _aware_utc(now, "now")), tz=tz)


def _aware_utc(value: dt.datetime, name: str) -> dt.datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime")
    return value.astimezone(dt.UTC)


# --- /heartbeat ----------------------------------------------------------------------------------


def parse_heartbeat_command(
    text: str, *, now: dt.datetime, local_tz: dt.tzinfo | None = None
) -> tuple[ScheduleSpec, str]:
    """Parse ``/heartbeat <when> <instruction>`` into (spec, instruction).

    Grammar (words separated by whitespace; keywords case-insensitive)::

        /heartbeat every <duration> <instruction>
        /heartbeat in <duration> <instruction>
        /heartbeat at <ISO-8601 time as one word> <instruction>
        /heartbeat cron "<five fields>" <instruction>      ('…' works too; quotes optional)

    ``<duration>`` and the time follow ``parse_schedule``; an ``at`` time is one word, so write
    ``2026-05-09T14:00``; ``2026-05-09 14:00`` is refused rather than read as midnight. Without
    quotes, ``cron`` takes the next five words. The instruction is the rest of the text with
    surrounding whitespace removed (inner spacing and newlines kept) and must not be empty.
    """
    command, rest = _next_word(text)
    if command.lower() != HEARTBEAT_COMMAND:
        raise ScheduleSpecError(f"not a heartbeat command; {HEARTBEAT_USAGE}")
    form, rest = _next_word(rest)
    form = form.lower()
    spec: ScheduleSpec
    if form in ("every", "in", "at"):
        when, rest = _next_word(rest)
        if not when:
            raise ScheduleSpecError(
                f"'/heartbeat {shown_spec(form)}' needs a time; {HEARTBEAT_USAGE}"
            )
        date_only = "t" not in when.lower()
        if form == "at" and date_only and _CLOCK_RE.fullmatch(_next_word(rest)[0]):
            # "at 2026-05-09 14:00 …" would silently mean midnight with "14:00 …" to do.
            raise ScheduleSpecError(
                f"write the date and time of '/heartbeat at' as one word, "
                f"e.g. '{when}T{_next_word(rest)[0]}'"
            )
        spec = parse_schedule(f"{form} {when}", now=now, local_tz=local_tz)
    elif form == "cron":
        expression, rest = _cron_words(rest)
        spec = parse_cron(expression)
    else:
        raise ScheduleSpecError(
            f"'/heartbeat {shown_spec(form)}' is not understood; {HEARTBEAT_USAGE}"
        )
    instruction = rest.strip()
    if not instruction:
        raise ScheduleSpecError(
            f"'/heartbeat {shown_spec(form)}' has no instruction; write what to do after the time, "
            f"e.g. '/heartbeat every 10m check the build'"
        )
    return spec, instruction


def _next_word(text: str) -> tuple[str, str]:
    """(the first word, the text after it)."""
    text = text.lstrip()
    end = _WORD_RE.match(text)
    size = end.end() if end else 0
    return text[:size], text[size:]


def _cron_words(text: str) -> tuple[str, str]:
    """(the cron expression, the text after it): a quoted string or the next five words."""
    text = text.lstrip()
    if text[:1] in _QUOTES:
        close = text.find(text[0], 1)
        if close < 0:
            raise ScheduleSpecError(
                f"the cron expression has no closing {text[0]}; "
                f"write '/heartbeat cron \"*/15 * * * *\" <text>'"
            )
        after = text[close + 1 :]
        if after[:1] and not after[:1].isspace():
            raise ScheduleSpecError(
                "put a space after the quoted cron expression; "
                "write '/heartbeat cron \"*/15 * * * *\" <text>'"
            )
        return text[1:close], after
    words: list[str] = []
    rest = text
    for _ in range(CRON_FIELD_COUNT):
        word, rest = _next_word(rest)
        if word:
            words.append(word)
    return " ".join(words), rest
