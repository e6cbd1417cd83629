"""``prime-agent``: the command line (typer), for every command line the lean pre-dispatch
(``cli/entry.py``, the entry point) does not take itself.

``main()`` dispatches: a first argument naming a subcommand (usage, export, ...) goes to the
typer group; anything else is a task for the run command. A click group cannot take an optional
free-text argument next to subcommands, hence the split.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

try:  # typer >= 0.20 vendors click; its UsageError is the base of every parse error.
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on plain click
    from click.exceptions import UsageError  # type: ignore[assignment]

from orchestrator.cli import abort as abort_cmd
from orchestrator.cli import agents as agents_cmd
from orchestrator.cli import compact as compact_cmd
from orchestrator.cli import control as control_cmd
from orchestrator.cli import daemon as daemon_cmd
from orchestrator.cli import doctor as doctor_cmd
from orchestrator.cli import eval_run as eval_cmd
from orchestrator.cli import export as export_cmd
from orchestrator.cli import harness as harness_cmd
from orchestrator.cli import images as images_cmd
from orchestrator.cli import import_ as import_cmd
from orchestrator.cli import run as run_cmd
from orchestrator.cli import sessions as sessions_cmd
from orchestrator.cli import shutdown as shutdown_cmd
from orchestrator.cli import sweep as sweep_cmd
from orchestrator.cli import tree as tree_cmd
from orchestrator.cli import tui_cmd
from orchestrator.cli import usage as usage_cmd
from orchestrator.cli.common import EXIT_ABORTED, EXIT_USAGE, fail
from orchestrator.cli.dispatch_names import HELP_WORDS, SUBCOMMANDS

__all__ = ["SUBCOMMANDS", "app", "main"]

app = typer.Typer(
    name="prime-agent",
    help="Prime Agent: long-horizon agents whose one tool is a persistent IPython REPL.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("usage", help="Tokens and cost per session.")(usage_cmd.usage)
app.add_typer(daemon_cmd.daemon_app, name="daemon", help="Start, stop or check the daemon.")
app.command(
    "shutdown", help="Stop the daemon, its sessions and sandboxes; remove stale containers."
)(shutdown_cmd.shutdown)
app.command("agents", help="Session trees: status, depth, backend, usage.")(agents_cmd.agents)
app.command("attach", help="Follow a session's events (Ctrl-C detaches; it keeps running).")(
    sessions_cmd.attach
)
app.command("send", help="Send a session a message (a user turn).")(sessions_cmd.send)
app.command("abort", help="Stop a session's running turn and its subagents' turns.")(
    abort_cmd.abort
)
app.command("observe", help="A session's state, usage and newest events.")(sessions_cmd.observe)
app.command("export", help="Write a session as JSONL (Prime Agent / pi session format).")(
    export_cmd.export
)
app.command("import", help="Read a pi / Prime Agent session file into a new session.")(
    import_cmd.import_session
)
app.command("tree", help="A session's event tree: branches, the active path, the leaf.")(
    tree_cmd.tree
)
app.command("branch", help="Move a session's leaf to an earlier event (--summary: keep why).")(
    tree_cmd.branch
)
app.command("fork", help="A new session from a session's path up to an event.")(tree_cmd.fork)
app.command("clone", help="A new session holding a copy of a session's active path.")(
    tree_cmd.clone
)
app.command("compact", help="Summarise the older part of a session's context (/compact).")(
    compact_cmd.compact
)
app.command("model", help="Switch a session's model from its next turn on (/model).")(
    harness_cmd.model
)
app.command("refine", help="Refine a session's harness (/refine), or: refine rollback ID.")(
    harness_cmd.refine
)
app.add_typer(harness_cmd.harness_app, name="harness")
app.command("run", help="Run an evaluation config (YAML) and record its result.")(eval_cmd.eval_run)
app.add_typer(control_cmd.schedule_app, name="schedule")
app.add_typer(sweep_cmd.sweep_app, name="sweep")
app.command("heartbeat", help="A session's heartbeat (/heartbeat every 10m TEXT).")(
    control_cmd.heartbeat
)
app.command("goal", help="Set, show, pause, resume or clear a session's goal (/goal).")(
    control_cmd.goal
)
app.add_typer(images_cmd.images_app, name="images")
app.command("tui", help="The interactive TUI (what prime-agent with no task opens).")(tui_cmd.tui)
app.command("doctor", help="Report (--fix: remove) orphaned sandbox containers.")(doctor_cmd.doctor)

run_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
run_app.command(
    help="Run a task: prime-agent -p 'task' prints only the final answer on stdout.",
    epilog=(
        f"Commands: {', '.join(sorted(SUBCOMMANDS))}. `prime-agent help` says what each does; "
        "`prime-agent COMMAND --help` its options. `prime-agent --version` prints the version."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)(run_cmd.run)


def _invoke(group: typer.Typer, args: list[str]) -> NoReturn:
    try:
        code = group(args=args, prog_name="prime-agent", standalone_mode=False)
    except UsageError as exc:
        # One line, not click's usage block: say what was wrong and where help is.
        fail(f"error: {exc.format_message()} (see prime-agent --help)", EXIT_USAGE)
    except typer.Abort:
        fail("aborted", EXIT_ABORTED)
    raise SystemExit(code if isinstance(code, int) else 0)


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        _invoke(app, args)
    elif args and args[0] in HELP_WORDS:
        _invoke(app, ["--help"])
    else:
        _invoke(run_app, args)


if __name__ == "__main__":
    main()
