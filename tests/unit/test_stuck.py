"""RepeatGuard (agent/stuck.py): what counts as the same call, and when a run starts over."""

from __future__ import annotations

from orchestrator.agent.stuck import STUCK_REPEAT_LIMIT, RepeatGuard, normalise_code


def test_identical_calls_run_up_to_the_limit_then_stop() -> None:
    guard = RepeatGuard()
    verdicts = [guard.observe("print(1)\n") for _ in range(STUCK_REPEAT_LIMIT)]
    assert [v.repeats for v in verdicts] == list(range(1, STUCK_REPEAT_LIMIT + 1))
    assert [v.action for v in verdicts] == ["run"] * (STUCK_REPEAT_LIMIT - 1) + ["stop"]


def test_trailing_space_and_line_endings_do_not_make_a_call_new() -> None:
    assert normalise_code("\n x = 1  \r\nprint(x)\n\n") == " x = 1\nprint(x)"
    guard = RepeatGuard()
    guard.observe("x = 1\nprint(x)")
    assert guard.observe("x = 1   \r\nprint(x)\n").repeats == 2
    assert guard.observe("x = 2\nprint(x)").repeats == 1


def test_malformed_calls_repeat_each_other() -> None:
    guard = RepeatGuard(limit=3)
    assert [guard.observe(None).action for _ in range(3)] == ["run", "run", "stop"]
    assert guard.observe(None).malformed


def test_a_retry_after_a_failed_sandbox_starts_the_run_over() -> None:
    """The same cell sent again after its sandbox failed (or its kernel was restarted) is a fair
    retry: tests/integration/test_snapshots.py re-sends print(z) after the gateway was killed."""
    guard = RepeatGuard()
    guard.observe("print(z)")
    guard.forget()
    assert guard.observe("print(z)").repeats == 1
