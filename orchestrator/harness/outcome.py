"""The measured outcome of a refinement: what changed over the turns after it (docs/spec.md §6).

A refinement states an *expected* outcome; this module records the *measured* one, which the
reference never did. Once the session has finished ``turns`` more turns after the refinement
was applied (``turn_index`` T: the number of ``turn_end`` events when it was applied), the
events of turns T+1 … T+N are compared with those of turns T-N+1 … T (fewer when the session
was younger; the outcome says how many): turns, errors (``error`` events and tool results
with ``is_error``), model retries, tokens (input + output of ``usage`` events), the sum of
known costs, and autonomous gates (``gate_result`` events and how many ``passed``; null while a
window has none). It is written once, as JSON on the
refinement row, and later refinements' planners read it in their history.

A turn is the span of events after the previous ``turn_end`` up to and including its own, so
the windows are ``seq`` ranges and each is read with one aggregate query over the events of
that range: nothing loads a session's events to count them. Events between turns (notices)
fall into the turn that follows them; a refinement's own planning call (a ``usage`` event
with ``purpose`` "refine") is left out of tokens and cost: it is not the agent's work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

import duckdb

from orchestrator.store.refinements import RefinementRow

__all__ = [
    "OUTCOME_TURNS",
    "WindowStats",
    "due_refinement_ids",
    "measure_outcome",
    "outcome_line",
    "turn_count",
    "turn_end_seqs",
    "window_stats",
]

# Turns compared on each side of a refinement (a setting; this is its default).
OUTCOME_TURNS: Final = 10
THOUSAND: Final = 1_000
MILLION: Final = 1_000_000
COST_DECIMALS: Final = 4

_TURN_COUNT = "SELECT count(*) FROM events WHERE session_id = $1 AND type = 'turn_end'"
# The seq of the n-th turn_end (1-based) for each n asked for.
_TURN_END_SEQS = """
SELECT n, seq FROM (
    SELECT seq, row_number() OVER (ORDER BY seq) AS n
    FROM events WHERE session_id = $1 AND type = 'turn_end'
) WHERE list_contains($2::BIGINT[], n)
"""
_WINDOW = """
SELECT
    count(*) FILTER (WHERE type = 'turn_end'),
    count(*) FILTER (WHERE type = 'error'
        OR (type = 'tool_result' AND coalesce(CAST(payload->>'$.is_error' AS BOOLEAN), FALSE))),
    count(*) FILTER (WHERE type = 'retry'),
    coalesce(sum(coalesce(CAST(payload->>'$.input' AS BIGINT), 0)
                 + coalesce(CAST(payload->>'$.output' AS BIGINT), 0))
             FILTER (WHERE type = 'usage' AND NOT refining), 0),
    sum(CAST(payload->>'$.cost_usd' AS DOUBLE)) FILTER (WHERE type = 'usage' AND NOT refining),
    count(*) FILTER (WHERE type = 'usage' AND NOT refining AND payload->>'$.cost_usd' IS NULL),
    count(*) FILTER (WHERE type = 'gate_result'),
    count(*) FILTER (WHERE type = 'gate_result'
        AND coalesce(CAST(payload->>'$.passed' AS BOOLEAN), FALSE))
FROM (
    SELECT type, payload, coalesce(payload->>'$.purpose', '') = 'refine' AS refining
    FROM events WHERE session_id = $1 AND seq > $2 AND seq <= $3
)
"""
_DUE = """
SELECT id FROM refinements
WHERE session_id = $1 AND status = 'applied' AND outcome IS NULL AND turn_index IS NOT NULL
ORDER BY created_at, id
"""


@dataclass(frozen=True)
class WindowStats:
    """What happened over a run of consecutive turns."""

    turns: int
    errors: int
    retries: int
    tokens: int
    cost_usd: float | None  # the sum of known costs; None when no call had a known price
    cost_unknown_calls: int  # model calls whose price is unknown (not counted as 0)
    gates_total: int | None  # None: no gate ran in the window
    gates_passed: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def turn_count(con: duckdb.DuckDBPyConnection, session_id: str) -> int:
    """Completed turns of the session: its ``turn_end`` events."""
    row = con.execute(_TURN_COUNT, [session_id]).fetchone()
    return int(row[0]) if row is not None else 0


def turn_end_seqs(
    con: duckdb.DuckDBPyConnection, session_id: str, numbers: list[int]
) -> dict[int, int]:
    """``{n: seq of the n-th turn_end}``; turn 0 "ends" at seq 0 (before the first event)."""
    wanted = sorted({n for n in numbers if n > 0})
    found = {0: 0} if 0 in numbers else {}
    if wanted:
        rows = con.execute(_TURN_END_SEQS, [session_id, wanted]).fetchall()
        found.update({int(n): int(seq) for n, seq in rows})
    return found


def window_stats(
    con: duckdb.DuckDBPyConnection, session_id: str, after_seq: int, to_seq: int
) -> WindowStats:
    """Aggregates over the events with ``after_seq < seq <= to_seq``."""
    row = con.execute(_WINDOW, [session_id, after_seq, to_seq]).fetchone()
    assert row is not None  # an aggregate always yields one row
    turns, errors, retries, tokens, cost, unknown, gates, passed = row
    return WindowStats(
        turns=int(turns),
        errors=int(errors),
        retries=int(retries),
        tokens=int(tokens),
        cost_usd=None if cost is None else round(float(cost), 10),
        cost_unknown_calls=int(unknown),
        gates_total=int(gates) if gates else None,
        gates_passed=int(passed) if gates else None,
    )


def _delta(after: float | None, before: float | None) -> float | None:
    if after is None or before is None:
        return None
    return after - before


def measure_outcome(
    con: duckdb.DuckDBPyConnection, session_id: str, turn_index: int, *, turns: int
) -> dict[str, Any] | None:
    """The outcome of a refinement applied after turn ``turn_index``, or None while fewer
    than ``turns`` turns have ended since."""
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    if turn_count(con, session_id) < turn_index + turns:
        return None
    first_before = max(0, turn_index - turns)
    seqs = turn_end_seqs(con, session_id, [first_before, turn_index, turn_index + turns])
    before = window_stats(con, session_id, seqs[first_before], seqs[turn_index])
    after = window_stats(con, session_id, seqs[turn_index], seqs[turn_index + turns])
    return {
        "turns": turns,
        "turns_before": before.turns,
        "turns_after": after.turns,
        "from_turn": turn_index,
        "before": before.to_json(),
        "after": after.to_json(),
        "delta": {
            "errors": after.errors - before.errors,
            "retries": after.retries - before.retries,
            "tokens": after.tokens - before.tokens,
            "cost_usd": _delta(after.cost_usd, before.cost_usd),
            "gates_passed": _delta(after.gates_passed, before.gates_passed),
        },
    }


def due_refinement_ids(con: duckdb.DuckDBPyConnection, session_id: str) -> list[str]:
    """Applied refinements of the session whose outcome is not written yet, oldest first."""
    return [str(row[0]) for row in con.execute(_DUE, [session_id]).fetchall()]


# -- for people ----------------------------------------------------------------------------


def _tokens(value: int) -> str:
    if value >= MILLION:
        return f"{value / MILLION:.1f}M"
    if value >= THOUSAND:
        return f"{value / THOUSAND:.1f}k"
    return str(value)


def _cost(value: Any) -> str:
    return "?" if value is None else f"${float(value):.{COST_DECIMALS}f}"


def _gates(stats: dict[str, Any]) -> str:
    total = stats.get("gates_total")
    return "none" if not total else f"{stats.get('gates_passed')}/{total}"


def outcome_line(row: RefinementRow) -> str:
    """``errors 4→1, retries 2→0, tokens 12.3k→9.8k over 10 turns`` (costs and gates when
    there are any; the number of turns before when it was smaller)."""
    outcome = row.outcome
    if not outcome:
        return "outcome not measured yet"
    before: dict[str, Any] = outcome.get("before") or {}
    after: dict[str, Any] = outcome.get("after") or {}
    parts = [
        f"errors {before.get('errors', 0)}→{after.get('errors', 0)}",
        f"retries {before.get('retries', 0)}→{after.get('retries', 0)}",
        f"tokens {_tokens(int(before.get('tokens', 0)))}→{_tokens(int(after.get('tokens', 0)))}",
    ]
    if before.get("cost_usd") is not None or after.get("cost_usd") is not None:
        parts.append(f"cost {_cost(before.get('cost_usd'))}→{_cost(after.get('cost_usd'))}")
    if before.get("gates_total") or after.get("gates_total"):
        parts.append(f"gates passed {_gates(before)}→{_gates(after)}")
    turns = outcome.get("turns_after", outcome.get("turns"))
    line = ", ".join(parts) + f" over {turns} turn{'' if turns == 1 else 's'}"
    turns_before = outcome.get("turns_before")
    if turns_before is not None and turns_before != turns:
        line += f" ({turns_before} before)"
    return line
