"""tui/format.py: the short strings the TUI shows for counts, costs, durations and times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tui import format as fmt

NOW = datetime(2026, 5, 9, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (950, "950"),
        (999, "999"),
        (1_000, "1.0k"),
        (12_345, "12.3k"),
        (999_949, "999.9k"),
        (999_950, "1.0M"),  # rounds up into the next unit, never "1000.0k"
        (1_234_567, "1.2M"),
        (3_400_000_000, "3.4B"),
    ],
)
def test_tokens(n: int, text: str) -> None:
    assert fmt.tokens(n) == text


@pytest.mark.parametrize(
    ("usd", "unknown", "text"),
    [
        (0.0042, 0, "$0.0042"),
        (0.0, 0, "$0.0000"),
        (1.234, 0, "$1.23"),
        (12.5, 0, "$12.50"),
        (None, 0, "unknown"),
        (0.0, 3, "unknown"),  # no call had a known price
        (1.234, 2, "$1.23+"),  # a lower bound
    ],
)
def test_cost(usd: float | None, unknown: int, text: str) -> None:
    assert fmt.cost(usd, unknown) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.85, "850ms"),
        (0.9996, "1.0s"),
        (4.2, "4.2s"),
        (59.94, "59.9s"),
        (59.96, "1m 00s"),
        (185, "3m 05s"),
        (3599.6, "1h 00m"),
        (7260, "2h 01m"),
        (2 * 86_400 + 3 * 3600, "2d 03h"),
        (-3, "0ms"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert fmt.duration(seconds) == text


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=2), "just now"),
        (timedelta(seconds=-30), "just now"),  # clock skew: a time ahead of now
        (timedelta(seconds=12), "12s ago"),
        (timedelta(minutes=5, seconds=40), "5m ago"),
        (timedelta(hours=3, minutes=59), "3h ago"),
        (timedelta(days=2, hours=5), "2d ago"),
    ],
)
def test_ago(delta: timedelta, text: str) -> None:
    assert fmt.ago((NOW - delta).isoformat(), NOW) == text


def test_ago_without_a_time_or_zone() -> None:
    assert fmt.ago(None, NOW) == "—"
    assert fmt.ago("", NOW) == "—"
    assert fmt.ago("yesterday", NOW) == "—"
    assert fmt.ago("2026-05-09T11:59:00", NOW) == "1m ago"  # no zone: UTC
    assert fmt.ago("2026-05-09T11:59:00Z", NOW.replace(tzinfo=None)) == "1m ago"


def test_first_line() -> None:
    assert fmt.first_line("\n  \n  import os\nprint(1)", 20) == "import os"
    assert fmt.first_line("abcdefghij", 10) == "abcdefghij"
    assert fmt.first_line("abcdefghijk", 10) == "abcdefghi…"
    assert len(fmt.first_line("x" * 100, 10)) == 10
    assert fmt.first_line("", 10) == ""
    assert fmt.first_line(" \n\t\n", 10) == ""
    assert fmt.first_line("abc", 0) == ""
