"""``prime-agent``: the command line (typer).

``main()`` dispatches: a first argument naming a subcommand (usage, export, ...) goes to the
typer group; anything else is a task for the run command. A click group cannot take an optional
free-text argument next to subcommands, hence the split.
"""

from __future__ import annotations

import sys

import typer

from orchestrator.cli import export as export_cmd
from orchestrator.cli import run as run_cmd
from orchestrator.cli import usage as usage_cmd

__all__ = ["SUBCOMMANDS", "app", "main"]

app = typer.Typer(
    name="prime-agent",
    help="Prime Agent: long-horizon agents whose one tool is a persistent IPython REPL.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("usage", help="Tokens and cost per session.")(usage_cmd.usage)
app.command("export", help="Write a session as JSONL (Prime Agent / pi session format).")(
    export_cmd.export
)

run_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
run_app.command(
    help="Run a task: prime-agent -p 'task' prints only the final answer on stdout.",
    context_settings={"help_option_names": ["-h", "--help"]},
)(run_cmd.run)

SUBCOMMANDS = frozenset({"usage", "export"})


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        app(args=args, prog_name="prime-agent")
    elif args and args[0] in ("help", "--help-commands"):
        app(args=["--help"], prog_name="prime-agent")
    else:
        run_app(args=args, prog_name="prime-agent")


if __name__ == "__main__":
    main()
