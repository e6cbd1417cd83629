"""What every command shares: error reporting, exit codes, settings and paths."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, TypeVar

from orchestrator.errors import PrimeAgentError, UserError

__all__ = [
    "EXIT_ABORTED",
    "EXIT_BUDGET_SPENT",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_STUCK",
    "EXIT_USAGE",
    "budget_spent",
    "fail",
    "guarded",
    "report",
    "stopped_run",
    "stuck_run",
]

EXIT_OK = 0
EXIT_ERROR = 1  # the run failed (model gave up, sandbox died, internal error)
EXIT_USAGE = 2  # the user can fix it: bad option, unknown model, missing key, unreachable
EXIT_ABORTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT)
# The root's token budget is spent: an autonomous run's token limit (control/autonomous.py
# EXIT_TOKEN_LIMIT; a test pins them equal), with the same stop reason.
EXIT_BUDGET_SPENT = 4
BUDGET_STOP_REASON = "token_limit"
# The turn stopped with reason ``stuck``: the model repeated one call (agent/stuck.py). Not 3-6:
# those are the autonomous limits (control/autonomous.py repeats this value).
EXIT_STUCK = 7

T = TypeVar("T")


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"prime-agent: {message}", file=sys.stderr)
    raise SystemExit(code)


def report(exc: BaseException, *, debug: bool) -> int:
    """Print one line (or the traceback with --debug) and return the exit code."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, UserError):
        print(f"prime-agent: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(exc, PrimeAgentError):
        print(f"prime-agent: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    hint = "" if debug else " (run with --debug for the traceback)"
    print(f"prime-agent: internal error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
    return EXIT_ERROR


def guarded(fn: Callable[[], T], *, debug: bool) -> T:
    try:
        return fn()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise SystemExit(report(exc, debug=debug)) from None


def stopped_run(reason: str, detail: str, exit_code: int, final_text: str, json_mode: bool) -> int:
    """The end of an autonomous or goal run (docs/control.md): a run that stopped well prints
    its final answer like print mode; any other stop says why on stderr. Returns the exit code
    the stop reason maps to."""
    if exit_code == EXIT_OK:
        if not json_mode:
            sys.stdout.write(final_text.rstrip("\n") + "\n")
            sys.stdout.flush()
        return EXIT_OK
    shown = f"{reason}: {detail}" if detail else reason
    print(f"prime-agent: the run stopped: {shown}", file=sys.stderr)
    return exit_code


def stuck_run(detail: str) -> int:
    """A print-mode run whose turn stopped ``stuck``: one line on stderr, ``EXIT_STUCK``."""
    shown = f"stuck: {detail}" if detail else "stuck"
    print(f"prime-agent: the run stopped: {shown}", file=sys.stderr)
    return EXIT_STUCK


def budget_spent(detail: str) -> int:
    """A run whose token budget was spent (turn outcome ``budget_exceeded``): one line saying
    so, and ``EXIT_BUDGET_SPENT``."""
    return stopped_run(BUDGET_STOP_REASON, detail, EXIT_BUDGET_SPENT, "", json_mode=True)
