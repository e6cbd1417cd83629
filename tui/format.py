"""Pure formatting helpers for the TUI: token counts, costs, durations, relative times, and one
line of a longer text. No Textual, no daemon: each takes values and returns a short string."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

__all__ = [
    "DURATION_CHARS",
    "ELLIPSIS",
    "NO_TIME",
    "UNKNOWN_COST",
    "ago",
    "cost",
    "duration",
    "first_line",
    "tokens",
]

# tokens(): below KILO the exact count; then one decimal with a unit.
KILO: Final = 1_000
TOKEN_UNITS: Final = ((1_000, "k"), (1_000_000, "M"), (1_000_000_000, "B"))
# cost(): amounts below a cent keep four decimals (a turn of a cheap model costs $0.0042).
CENT: Final = 0.01
SMALL_COST_DECIMALS: Final = 4
COST_DECIMALS: Final = 2
UNKNOWN_COST: Final = "unknown"
PARTIAL_COST_MARK: Final = "+"  # a known part plus calls of unknown price: "at least"
# duration(): milliseconds below a second, tenths below a minute, then two units.
MS_PER_S: Final = 1000
MINUTE_S: Final = 60
HOUR_S: Final = 3600
DAY_S: Final = 86_400
# The widest duration() gives ("850ms", "3m 05s"): columns pad to it so they stay aligned.
DURATION_CHARS: Final = 6
# ago(): closer than this is "just now"; clock skew (a time in the future) is too.
JUST_NOW_S: Final = 5
JUST_NOW: Final = "just now"
NO_TIME: Final = "—"
ELLIPSIS: Final = "…"


def tokens(n: int) -> str:
    """``950``, ``12.3k``, ``1.2M``, ``3.4B``."""
    if abs(n) < KILO:
        return str(n)
    # The smallest unit that shows under a thousand once rounded: 999,950 is "1.0M", not
    # "1000.0k"; the largest unit takes whatever is left.
    for scale, unit in TOKEN_UNITS:
        if round(abs(n) / scale, 1) < KILO or unit == TOKEN_UNITS[-1][1]:
            break
    return f"{n / scale:.1f}{unit}"


def cost(usd: float | None, unknown_calls: int = 0) -> str:
    """``$0.0042``, ``$1.23``; ``unknown`` when no call had a known price; ``$1.23+`` when
    some calls had no known price (the amount is a lower bound)."""
    if usd is None or (usd == 0 and unknown_calls > 0):
        return UNKNOWN_COST
    decimals = SMALL_COST_DECIMALS if abs(usd) < CENT else COST_DECIMALS
    text = f"${usd:.{decimals}f}"
    return text + PARTIAL_COST_MARK if unknown_calls > 0 else text


def duration(seconds: float) -> str:
    """``850ms``, ``4.2s``, ``3m 05s``, ``2h 01m``, ``3d 04h`` (negative counts as 0)."""
    seconds = max(0.0, seconds)
    if round(seconds * MS_PER_S) < MS_PER_S:
        return f"{round(seconds * MS_PER_S)}ms"
    if round(seconds, 1) < MINUTE_S:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < HOUR_S:
        return f"{whole // MINUTE_S}m {whole % MINUTE_S:02d}s"
    if whole < DAY_S:
        return f"{whole // HOUR_S}h {whole % HOUR_S // MINUTE_S:02d}m"
    return f"{whole // DAY_S}d {whole % DAY_S // HOUR_S:02d}h"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def ago(ts_iso: str | None, now: datetime) -> str:
    """How long before ``now`` the ISO time ``ts_iso`` was: ``just now``, ``12s ago``,
    ``5m ago``, ``3h ago``, ``2d ago``; ``—`` for None or an unreadable time. A time without
    a zone is UTC (as the daemon writes them)."""
    if not ts_iso:
        return NO_TIME
    try:
        then = datetime.fromisoformat(ts_iso)
    except ValueError:
        return NO_TIME
    elapsed = int((_aware(now) - _aware(then)).total_seconds())
    if elapsed < JUST_NOW_S:
        return JUST_NOW
    if elapsed < MINUTE_S:
        return f"{elapsed}s ago"
    if elapsed < HOUR_S:
        return f"{elapsed // MINUTE_S}m ago"
    if elapsed < DAY_S:
        return f"{elapsed // HOUR_S}h ago"
    return f"{elapsed // DAY_S}d ago"


def first_line(text: str | None, width: int) -> str:
    """The first line of ``text`` that is not blank (stripped), at most ``width`` characters:
    a longer one is cut and ends with ``…``."""
    if width <= 0 or not text:
        return ""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if len(line) <= width:
        return line
    return line[: width - len(ELLIPSIS)] + ELLIPSIS
