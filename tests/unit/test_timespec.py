"""Schedule specs (in / every / at / cron), their next fire time, and the /heartbeat grammar."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ScheduleSpecError, UserError
from orchestrator.store import cron, timespec
from orchestrator.store.cron import CronSpec, cron_weekday, parse_cron
from orchestrator.store.timespec import (
    MAX_DURATION_S,
    MINIMUM_INTERVAL_S,
    Every,
    Once,
    format_duration,
    next_fire,
    next_fire_after_claim,
    parse_duration,
    parse_heartbeat_command,
    parse_schedule,
)

UTC = dt.UTC
NOW = dt.datetime(2026, 5, 9, 12, 0, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
MINUTE = dt.timedelta(minutes=1)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fires(
    spec: timespec.ScheduleSpec, after: dt.datetime, count: int, *, tz: dt.tzinfo = UTC
) -> list[dt.datetime]:
    out = []
    for _ in range(count):
        nxt = next_fire(spec, after, tz=tz)
        assert nxt is not None
        out.append(nxt)
        after = nxt
    return out


def test_public_surface() -> None:
    for module in (timespec, cron):
        assert module.__all__ and all(hasattr(module, name) for name in module.__all__)
    assert MINIMUM_INTERVAL_S == 10
    assert issubclass(ScheduleSpecError, UserError)


# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        ("1H30M", 5400),
        (" 45s ", 45),
        ("0s", 0),
        ("365d", MAX_DURATION_S),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "10", "m", "30m1h", "1h1h", "10x", "1.5h", "-5m", "1 h", "5 m", "1w", "٣s"]
)
def test_bad_duration_says_what_to_write(text: str) -> None:
    with pytest.raises(ScheduleSpecError, match=re.escape("e.g. 30s, 10m, 1h30m")):
        parse_duration(text)


def test_duration_is_bounded() -> None:
    with pytest.raises(ScheduleSpecError, match="longer than 365d; write 365d or less"):
        parse_duration("366d")
    with pytest.raises(ScheduleSpecError, match="too long"):
        parse_duration("9" * 5000 + "s")


@given(st.integers(0, MAX_DURATION_S))
def test_format_duration_round_trips(seconds: int) -> None:
    text = format_duration(seconds)
    assert parse_duration(text) == seconds
    assert text == format_duration(parse_duration(text.upper()))


# --- parse_schedule ------------------------------------------------------------------------------


def test_in_is_once_after_the_delay() -> None:
    spec = parse_schedule("in 1h30m", now=NOW)
    assert spec == Once(at=NOW + dt.timedelta(minutes=90), text="in 1h30m")
    assert parse_schedule("IN 90m", now=NOW) == spec


def test_every_is_a_grid_from_now() -> None:
    assert parse_schedule("every 30s", now=NOW) == Every(seconds=30, start=NOW, text="every 30s")
    assert parse_schedule(f"every {MINIMUM_INTERVAL_S}s", now=NOW) == Every(10, NOW, "every 10s")


def test_every_below_the_minimum_is_one_line_with_the_fix() -> None:
    with pytest.raises(ScheduleSpecError) as caught:
        parse_schedule("every 9s", now=NOW)
    message = str(caught.value)
    assert "\n" not in message and "write 'every 10s' or longer" in message


def test_in_zero_is_refused() -> None:
    with pytest.raises(ScheduleSpecError, match="at least 1s"):
        parse_schedule("in 0s", now=NOW)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("at 2026-05-09T14:30+02:00", utc(2026, 5, 9, 12, 30)),
        ("at 2026-05-09T14:00Z", utc(2026, 5, 9, 14, 0)),
        ("at 2026-05-09t14:00z", utc(2026, 5, 9, 14, 0)),
        ("at 2026-05-10 08:15:30-04:00", utc(2026, 5, 10, 12, 15, 30)),
        ("at 2026-05-10", utc(2026, 5, 9, 22, 0)),  # midnight in Berlin (CEST)
        ("at 2026-05-09T18:00", utc(2026, 5, 9, 16, 0)),  # naive: local_tz
    ],
)
def test_at_times(text: str, expected: dt.datetime) -> None:
    spec = parse_schedule(text, now=NOW, local_tz=BERLIN)
    assert isinstance(spec, Once)
    assert spec.at == expected and spec.at.tzinfo is UTC
    assert spec.text == f"at {expected.isoformat()}"


@pytest.fixture
def tokyo_local() -> Iterator[None]:
    """The process's local zone is Asia/Tokyo (+09:00, no DST) for one test."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.mark.usefixtures("tokyo_local")
def test_naive_at_without_a_zone_is_the_system_local_time() -> None:
    spec = parse_schedule("at 2026-05-10T09:00", now=NOW)
    assert isinstance(spec, Once) and spec.at == utc(2026, 5, 10, 0, 0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("at 2026-05-09T11:59Z", "in the past; write a future time"),
        ("at 2026-05-09T14:00+02:00", "in the past"),  # exactly now is not the future
        ("at tomorrow", "not an ISO-8601 time"),
        ("at 2026-13-01", "not an ISO-8601 time"),
        ("at", "'at' needs a time"),
        ("at 9999-12-31T23:59-05:00", "not an ISO-8601 time"),
        ("every", "takes one duration"),
        ("every 10m check the build", "takes one duration"),
        ("in 5 m", "takes one duration"),
        ("", "the schedule is empty"),
        ("daily", "is not understood; write 'in 10m'"),
        ("1 2 3", "is not understood"),
        ("cron 1 2 3", "has 3 fields, not 5"),
    ],
)
def test_schedule_errors(text: str, match: str) -> None:
    with pytest.raises(ScheduleSpecError, match=match) as caught:
        parse_schedule(text, now=NOW, local_tz=BERLIN)
    assert "\n" not in str(caught.value)


def test_cron_with_and_without_keyword() -> None:
    bare = parse_schedule("*/15  9-17 * * MON-FRI", now=NOW)
    assert isinstance(bare, CronSpec) and bare.text == "*/15 9-17 * * mon-fri"
    assert parse_schedule("cron */15 9-17 * * mon-fri", now=NOW) == bare


@pytest.mark.parametrize(
    "text", ["in 10m", "every 1h30m", "every 10s", "at 2027-01-01T00:00+05:30", "0 9 * * 1-5"]
)
def test_text_is_canonical_and_reparses_to_the_same_spec(text: str) -> None:
    spec = parse_schedule(text, now=NOW, local_tz=NEW_YORK)
    assert parse_schedule(spec.text, now=NOW, local_tz=BERLIN) == spec


def test_now_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_schedule("in 10m", now=dt.datetime(2026, 5, 9))


_WORDS = ["in", "every", "at", "cron", "*", "*/0", "5", "mon", "10m", "5s", "-", "2026-01-01", "x"]


@given(st.one_of(st.text(), st.lists(st.sampled_from(_WORDS), max_size=7).map(" ".join)))
def test_any_input_parses_or_fails_with_one_line(text: str) -> None:
    try:
        parse_schedule(text, now=NOW, local_tz=BERLIN)
    except ScheduleSpecError as exc:
        assert str(exc) and "\n" not in str(exc)
    try:
        parse_heartbeat_command("/heartbeat " + text, now=NOW, local_tz=BERLIN)
    except ScheduleSpecError as exc:
        assert str(exc) and "\n" not in str(exc)


# --- cron parsing --------------------------------------------------------------------------------


def test_cron_fields() -> None:
    spec = parse_cron("*/15 1-10/3 1,15,31 jan-mar,DEC 1-5")
    assert spec.minutes == (0, 15, 30, 45)
    assert spec.hours == (1, 4, 7, 10)
    assert spec.days == (1, 15, 31)
    assert spec.months == (1, 2, 3, 12)
    assert spec.weekdays == (1, 2, 3, 4, 5)
    assert not (spec.day_star or spec.weekday_star or spec.hour_star)
    assert spec.text == "*/15 1-10/3 1,15,31 jan-mar,dec 1-5"
    assert parse_cron(spec.text) == spec


def test_cron_sunday_is_zero_and_seven() -> None:
    assert parse_cron("0 0 * * 7").weekdays == (0,)
    assert parse_cron("0 0 * * 0,7,sun").weekdays == (0,)
    assert parse_cron("0 0 * * 5-7").weekdays == (0, 5, 6)
    assert parse_cron("0 0 * * *").weekdays == tuple(range(7))


def test_cron_star_flags_follow_vixie() -> None:
    spec = parse_cron("0 */2 */2 * mon")
    assert spec.hour_star and spec.day_star and not spec.weekday_star


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("* * * *", "has 4 fields, not 5; write minute hour"),
        ("* * * * * *", "has 6 fields"),
        ("60 * * * *", "minute field '60': 60 is outside 0-59"),
        ("* 24 * * *", "hour field '24': 24 is outside 0-23"),
        ("* * 0 * *", "day-of-month field '0': 0 is outside 1-31"),
        ("* * * 13 *", "month field '13'"),
        ("* * * * 8", "day-of-week field '8'"),
        ("*/0 * * * *", "a step must be 1 or more"),
        ("*/x * * * *", "the step 'x' is not a number"),
        ("5/2 * * * *", "write '5-59/2' or '\\*/2'"),
        ("10-5 * * * *", "the range 10-5 runs backwards; write the low end first"),
        ("* * * * fri-mon", "runs backwards"),
        ("1,,2 * * * *", "'' is not a number"),
        ("* * * foo *", "not a number 1-12 or a name \\(jan, feb"),
        ("mon * * * *", "'mon' is not a number 0-59;"),
        ("0 0 31 2 *", "never fires"),
        ("0 0 30,31 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 31 feb */2", "never fires"),
    ],
)
def test_cron_errors(text: str, match: str) -> None:
    with pytest.raises(ScheduleSpecError, match=match) as caught:
        parse_cron(text)
    assert "\n" not in str(caught.value) and "write" in str(caught.value)


@pytest.mark.parametrize("text", ["0 0 29 2 *", "0 0 31 2 mon", "0 0 31 1-2 *", "0 0 */31 2 1"])
def test_cron_that_can_fire_is_accepted(text: str) -> None:
    assert next_fire(parse_cron(text), NOW) is not None


# --- next_fire: once and every -------------------------------------------------------------------


def test_once_fires_once() -> None:
    spec = parse_schedule("in 10m", now=NOW)
    assert next_fire(spec, NOW) == NOW + dt.timedelta(minutes=10)
    assert next_fire(spec, NOW + dt.timedelta(minutes=10)) is None  # its tick was claimed
    assert next_fire(spec, NOW + dt.timedelta(days=1)) is None


def test_every_keeps_its_grid() -> None:
    spec = parse_schedule("every 30s", now=NOW)
    step = dt.timedelta(seconds=30)
    assert next_fire(spec, NOW - dt.timedelta(hours=1)) == NOW + step
    assert next_fire(spec, NOW) == NOW + step
    assert next_fire(spec, NOW + step) == NOW + 2 * step
    assert next_fire(spec, NOW + step + dt.timedelta(microseconds=1)) == NOW + 2 * step
    assert next_fire(spec, NOW + dt.timedelta(seconds=95)) == NOW + 4 * step


def test_claiming_folds_missed_ticks_into_one() -> None:
    every = parse_schedule("every 10s", now=NOW)
    claimed = NOW + dt.timedelta(seconds=10)  # due long ago, claimed now
    late = NOW + dt.timedelta(seconds=95)
    assert next_fire_after_claim(every, claimed, late) == NOW + dt.timedelta(seconds=100)
    assert next_fire_after_claim(every, claimed, claimed) == NOW + dt.timedelta(seconds=20)
    once = parse_schedule("in 1m", now=NOW)
    assert next_fire_after_claim(once, NOW + MINUTE, NOW + dt.timedelta(hours=5)) is None


def test_next_fire_needs_an_aware_time_and_answers_in_utc() -> None:
    spec = parse_cron("0 9 * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire(spec, dt.datetime(2026, 5, 9))
    berlin_after = dt.datetime(2026, 5, 9, 8, 0, tzinfo=BERLIN)  # 06:00 UTC
    result = next_fire(spec, berlin_after)
    assert result == utc(2026, 5, 9, 9, 0) and result.tzinfo is UTC


# --- next_fire: cron in UTC ----------------------------------------------------------------------


def test_cron_next_is_strictly_after() -> None:
    spec = parse_cron("*/15 * * * *")
    assert next_fire(spec, utc(2026, 5, 9, 12, 7)) == utc(2026, 5, 9, 12, 15)
    assert next_fire(spec, utc(2026, 5, 9, 12, 15)) == utc(2026, 5, 9, 12, 30)
    assert next_fire(spec, utc(2026, 5, 9, 12, 14, 59) + dt.timedelta(microseconds=999999)) == utc(
        2026, 5, 9, 12, 15
    )
    assert next_fire(spec, utc(2026, 12, 31, 23, 50)) == utc(2027, 1, 1, 0, 0)


def test_cron_month_ends() -> None:
    day31 = parse_cron("0 0 31 * *")
    assert fires(day31, utc(2026, 1, 31), 3) == [
        utc(2026, 3, 31),
        utc(2026, 5, 31),
        utc(2026, 7, 31),
    ]
    day30 = parse_cron("0 0 30 * *")
    assert fires(day30, utc(2026, 1, 30), 2) == [utc(2026, 3, 30), utc(2026, 4, 30)]


def test_cron_leap_day() -> None:
    spec = parse_cron("0 0 29 2 *")
    assert next_fire(spec, utc(2026, 1, 1)) == utc(2028, 2, 29)
    assert next_fire(spec, utc(2028, 2, 29)) == utc(2032, 2, 29)
    assert next_fire(spec, utc(2096, 2, 29)) == utc(2104, 2, 29)  # 2100 is no leap year


def test_cron_day_of_month_or_day_of_week() -> None:
    # Both restricted: the 13th (a Tuesday in January 2026) *or* any Friday.
    spec = parse_cron("0 0 13 * fri")
    assert fires(spec, utc(2026, 1, 1), 4) == [
        utc(2026, 1, 2),
        utc(2026, 1, 9),
        utc(2026, 1, 13),
        utc(2026, 1, 16),
    ]


def test_cron_star_step_day_means_both_must_match() -> None:
    # Vixie: '*/2' starts with '*', so odd days *and* Mondays.
    spec = parse_cron("0 0 */2 * mon")
    assert fires(spec, utc(2026, 1, 1), 4) == [
        utc(2026, 1, 5),
        utc(2026, 1, 19),
        utc(2026, 2, 9),
        utc(2026, 2, 23),
    ]


def test_cron_weekday_only_and_sunday_seven() -> None:
    assert fires(parse_cron("30 6 * * 7"), utc(2026, 5, 9), 2) == [
        utc(2026, 5, 10, 6, 30),
        utc(2026, 5, 17, 6, 30),
    ]


# --- next_fire: cron across daylight-saving changes ----------------------------------------------


def test_spring_forward_runs_a_skipped_time_when_the_clock_jumps() -> None:
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
    daily = parse_cron("30 2 * * *")
    assert fires(daily, utc(2026, 3, 28, 12), 3, tz=BERLIN) == [
        utc(2026, 3, 29, 1, 0),  # 03:00 CEST, the instant after the jump
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
    ]
    quarter = parse_cron("*/15 * * * *")
    assert fires(quarter, utc(2026, 3, 29, 0, 40), 3, tz=BERLIN) == [
        utc(2026, 3, 29, 0, 45),  # 01:45 CET
        utc(2026, 3, 29, 1, 0),  # 02:00-02:45 do not exist: one fire at 03:00 CEST
        utc(2026, 3, 29, 1, 15),
    ]
    # America/New_York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    two_am = parse_cron("0 2 * * *")
    assert fires(two_am, utc(2026, 3, 7, 12), 2, tz=NEW_YORK) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 9, 6, 0),
    ]


def test_fall_back_runs_a_fixed_time_once() -> None:
    # Europe/Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC).
    daily = parse_cron("30 2 * * *")
    assert fires(daily, utc(2026, 10, 24, 12), 2, tz=BERLIN) == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first occurrence
        utc(2026, 10, 26, 1, 30),  # 02:30 CET the next day
    ]
    pinned = parse_cron("0,30 2 * * *")
    assert fires(pinned, utc(2026, 10, 24, 23, 45), 3, tz=BERLIN) == [
        utc(2026, 10, 25, 0, 0),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 0),
    ]


def test_fall_back_runs_hourly_jobs_in_both_hours() -> None:
    half_hourly = parse_cron("*/30 * * * *")
    assert fires(half_hourly, utc(2026, 10, 24, 23, 45), 5, tz=BERLIN) == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 1, 0),  # 02:00 CET
        utc(2026, 10, 25, 1, 30),  # 02:30 CET
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
    ]
    # Asked from inside the repeated hour's second pass, the answer is still in order.
    assert next_fire(half_hourly, utc(2026, 10, 25, 1, 10), tz=BERLIN) == utc(2026, 10, 25, 1, 30)


# --- properties ----------------------------------------------------------------------------------


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    pair = st.tuples(number, number).map(sorted)
    item = st.one_of(
        number.map(str),
        pair.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.integers(1, high - low + 1).map(lambda n: f"*/{n}"),
        st.tuples(pair, st.integers(1, 10)).map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
    )
    return st.one_of(st.just("*"), st.lists(item, min_size=1, max_size=3).map(",".join))


CRON_TEXTS = st.tuples(
    _field(0, 59), _field(0, 23), _field(1, 31), _field(1, 12), _field(0, 7)
).map(" ".join)
AFTERS = st.datetimes(
    min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2150, 1, 1), timezones=st.just(UTC)
)
ZONES = st.sampled_from(
    ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago"]
)
BRUTE_FORCE_SPAN = dt.timedelta(days=2)


def _parsed(text: str) -> CronSpec:
    try:
        return parse_cron(text)
    except ScheduleSpecError:
        assume(False)
        raise


@settings(deadline=None)
@given(CRON_TEXTS, AFTERS)
def test_cron_next_is_after_matches_and_is_the_first(text: str, after: dt.datetime) -> None:
    spec = _parsed(text)
    result = next_fire(spec, after)
    assert result is not None and result > after and result.tzinfo is UTC
    assert result.second == 0 and result.microsecond == 0
    assert spec.matches(result)
    if result - after <= BRUTE_FORCE_SPAN:
        minute = after.replace(second=0, microsecond=0) + MINUTE
        while minute < result:
            assert not spec.matches(minute), minute
            minute += MINUTE


@settings(deadline=None)
@given(CRON_TEXTS, AFTERS, ZONES)
def test_cron_next_in_a_zone_matches_its_wall_clock(
    text: str, after: dt.datetime, zone: str
) -> None:
    spec, tz = _parsed(text), ZoneInfo(zone)
    result = next_fire(spec, after, tz=tz)
    assert result is not None and result > after and result.tzinfo is UTC
    wall = result.astimezone(tz)
    jumped = (result - dt.timedelta(seconds=1)).astimezone(tz).utcoffset() != wall.utcoffset()
    assert spec.matches(wall) or jumped


@given(st.integers(MINIMUM_INTERVAL_S, MAX_DURATION_S), AFTERS)
def test_every_next_is_the_next_grid_point(seconds: int, after: dt.datetime) -> None:
    spec = parse_schedule(f"every {format_duration(seconds)}", now=NOW)
    result = next_fire(spec, after)
    assert result is not None and result > after
    ticks, rest = divmod(result - NOW, dt.timedelta(seconds=seconds))
    assert ticks >= 1 and rest == dt.timedelta(0)
    assert result - dt.timedelta(seconds=seconds) <= max(after, NOW)


@given(st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2200, 12, 31)))
def test_cron_weekday_counts_from_sunday(day: dt.date) -> None:
    assert cron_weekday(day) == int(day.strftime("%w"))


# --- /heartbeat ----------------------------------------------------------------------------------


def test_heartbeat_every() -> None:
    spec, instruction = parse_heartbeat_command("/heartbeat every 10m check the build", now=NOW)
    assert spec == Every(seconds=600, start=NOW, text="every 10m")
    assert instruction == "check the build"


def test_heartbeat_in_and_at() -> None:
    spec, text = parse_heartbeat_command("  /HEARTBEAT In 5M  ping me ", now=NOW)
    assert spec == Once(at=NOW + dt.timedelta(minutes=5), text="in 5m") and text == "ping me"
    spec, text = parse_heartbeat_command(
        "/heartbeat at 2026-05-09T18:00 standup notes", now=NOW, local_tz=BERLIN
    )
    assert isinstance(spec, Once) and spec.at == utc(2026, 5, 9, 16, 0)
    assert text == "standup notes"


@pytest.mark.parametrize(
    "command",
    [
        '/heartbeat cron "*/15 9-17 * * mon-fri" run the tests',
        "/heartbeat cron '*/15 9-17 * * mon-fri' run the tests",
        "/heartbeat cron */15 9-17 * * mon-fri run the tests",
        "/heartbeat CRON   */15 9-17 * * MON-FRI \t run the tests",
    ],
)
def test_heartbeat_cron(command: str) -> None:
    spec, instruction = parse_heartbeat_command(command, now=NOW)
    assert spec == parse_cron("*/15 9-17 * * mon-fri")
    assert instruction == "run the tests"


def test_heartbeat_instruction_keeps_inner_text() -> None:
    _, instruction = parse_heartbeat_command(
        "/heartbeat every 1h  first line\n  second   line \n", now=NOW
    )
    assert instruction == "first line\n  second   line"


@pytest.mark.parametrize(
    ("command", "match"),
    [
        ("heartbeat every 10m x", "not a heartbeat command; write '/heartbeat every 10m"),
        ("/heartbeats every 10m x", "not a heartbeat command"),
        ("/heartbeat", "'/heartbeat ' is not understood"),
        ("/heartbeat daily check", "'/heartbeat daily' is not understood"),
        ("/heartbeat every", "needs a time"),
        ("/heartbeat every 10m", "has no instruction; write what to do"),
        ("/heartbeat every 10m   \n ", "has no instruction"),
        ("/heartbeat every 5s check", "the shortest interval is 10s"),
        ("/heartbeat in soon check", "duration 'soon' is not understood"),
        ("/heartbeat at 2026-05-10 14:00 check", "one word, e.g. '2026-05-10T14:00'"),
        ("/heartbeat at 2020-01-01T00:00Z check", "in the past"),
        ('/heartbeat cron "*/15 * * * * check', 'no closing "'),
        ('/heartbeat cron "*/15 * * * *"check', "put a space after"),
        ('/heartbeat cron "*/15 * * *" check', "has 4 fields"),
        ("/heartbeat cron */15 * * check", "has 4 fields"),
        ("/heartbeat cron 0 0 31 2 * check", "never fires"),
    ],
)
def test_heartbeat_errors(command: str, match: str) -> None:
    with pytest.raises(ScheduleSpecError, match=match) as caught:
        parse_heartbeat_command(command, now=NOW, local_tz=BERLIN)
    assert "\n" not in str(caught.value)


def test_heartbeat_at_with_a_time_keeps_a_clock_in_the_instruction() -> None:
    spec, instruction = parse_heartbeat_command(
        "/heartbeat at 2026-05-10T08:00Z 10:30 meeting prep", now=NOW
    )
    assert isinstance(spec, Once) and instruction == "10:30 meeting prep"
