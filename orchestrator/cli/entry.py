"""``prime-agent``'s entry point: a plain print-mode run skips typer; everything else is typer's.

A command line made only of task words and the run options below (``-p "task" --model M``,
``--mode json``, ...) is parsed here, with the standard library alone: the daemon is spawned
at once when none runs (so its start overlaps this process's own imports), and the run goes
straight to ``cli/print_run.py``. Anything else (a subcommand, ``--help``, ``--resume``, an
option or a value this parser does not know, a missing value, no task) goes to typer
(``cli/app.py``) untouched, so help, usage and every error message stay typer's own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NoReturn

from orchestrator.cli.common import EXIT_USAGE
from orchestrator.cli.dispatch_names import HELP_WORDS, SUBCOMMANDS
from orchestrator.cli.first_word import VERSION_WORDS, refused_first_word, version_line
from orchestrator.cli.run_options import PLAIN_MODES, Backend, Mode, Workspace

__all__ = ["SUBCOMMANDS", "PlainRun", "main", "parse_plain_run"]

BACKEND_ENV: Final = "PRIME_AGENT_BACKEND"  # --backend's environment variable (cli/run.py)
_OPTION_PREFIX: Final = "-"
_VALUE_SEPARATOR: Final = "="
# Flags: option → (field, value it sets).
_FLAGS: Final = {
    "-p": ("print_mode", True),
    "--print": ("print_mode", True),
    "--network": ("network", True),
    "--no-network": ("network", False),
    "--no-refine": ("no_refine", True),
    "--debug": ("debug", True),
}
# Options with a value: option → (field, allowed values or None for any).
_VALUED: Final[dict[str, tuple[str, frozenset[str] | None]]] = {
    "--mode": ("mode", PLAIN_MODES),
    "--model": ("model", None),
    "--api-base": ("api_base", None),
    "--cwd": ("cwd", None),
    "--backend": ("backend", frozenset(b.value for b in Backend)),
    "--workspace": ("workspace", frozenset(w.value for w in Workspace)),
    "--image": ("image", None),
    "--max-turns": ("max_turns", None),
    "--system-prompt": ("system_prompt", None),
    "--append-system-prompt": ("append_system_prompt", None),
    "--mcp-config": ("mcp_config", None),
}


@dataclass
class PlainRun:
    """A run command line the lean path takes (the typer command's defaults)."""

    task: list[str] = field(default_factory=list)
    print_mode: bool = False
    mode: str = Mode.text.value
    model: str | None = None
    api_base: str | None = None
    cwd: str | None = None
    backend: str = Backend.auto.value
    network: bool = False
    workspace: str | None = None
    image: str | None = None
    no_refine: bool = False
    debug: bool = False
    max_turns: str | None = None
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    mcp_config: str | None = None


def parse_plain_run(args: list[str], environ: dict[str, str] | None = None) -> PlainRun | None:
    """The run ``args`` describe, or None when typer must read them (anything unusual)."""
    env = os.environ if environ is None else environ
    if args and (args[0] in SUBCOMMANDS or args[0] in HELP_WORDS):
        return None
    run = PlainRun()
    given: set[str] = set()
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith(_OPTION_PREFIX):
            run.task.append(arg)
            continue
        if arg in _FLAGS:
            name, flag = _FLAGS[arg]
            setattr(run, name, flag)
            continue
        option, sep, inline = arg.partition(_VALUE_SEPARATOR)
        if option not in _VALUED:
            return None  # --help, --resume, a typo, "--", "-": typer's to answer
        if sep:
            value = inline
        elif rest and not rest[0].startswith(_OPTION_PREFIX):
            value = rest.pop(0)
        else:
            return None  # a missing value (or one that looks like an option)
        name, allowed = _VALUED[option]
        if allowed is not None and value not in allowed:
            return None
        if name == "max_turns" and not (value.isdigit() and int(value) >= 1):
            return None  # typer says what is wrong with it
        setattr(run, name, value)
        given.add(name)
    backend_env = env.get(BACKEND_ENV, "")
    if "backend" not in given and backend_env:
        if backend_env not in {b.value for b in Backend}:
            return None
        run.backend = backend_env
    return run


def _run_plain(run: PlainRun, args: list[str]) -> NoReturn:
    """The typer run command's steps, in its order, for ``run``; typer's for what it lacks."""
    from orchestrator.cli.autostart import spawn_early
    from orchestrator.cli.common import fail, guarded
    from orchestrator.paths import Paths

    workdir = Path(run.cwd).expanduser() if run.cwd is not None else Path.cwd()
    usable = workdir.is_dir()
    text = " ".join(run.task).strip()
    # A task and a directory: start the daemon before reading stdin or importing anything
    # heavy, so that its start overlaps the rest of this process's.
    early = None
    if text and usable:
        early = guarded(lambda: spawn_early(Paths.from_env()), debug=run.debug)
    from orchestrator.cli.print_run import read_stdin, run_print

    piped = read_stdin()
    if piped.strip():
        text = f"{text}\n\n{piped}".strip() if text else piped.strip()
    if not text:  # the typer command says what is missing (stdin is read: it finds none)
        from orchestrator.cli.app import main as typer_main

        typer_main(args)
    if not usable:
        fail(f"--cwd {workdir} is not a directory")
    if early is None:
        early = guarded(lambda: spawn_early(Paths.from_env()), debug=run.debug)
    from orchestrator.cli.controls import Controls
    from orchestrator.cli.interrupts import install_handlers
    from orchestrator.cli.session_choices import SessionChoices

    choices = guarded(
        lambda: SessionChoices.from_flags(
            int(run.max_turns) if run.max_turns is not None else None,
            run.system_prompt,
            run.append_system_prompt,
            mcp_config=run.mcp_config,
        ),
        debug=run.debug,
    )

    install_handlers()  # from here on a signal is an abort (cli/interrupts.py)
    code = guarded(
        lambda: run_print(
            text,
            run.model,
            run.api_base,
            workdir.resolve(),
            run.backend,
            Mode(run.mode),
            run.debug,
            run.network,
            False,  # --no-daemon sends the command line to typer
            None,  # so does --nats-url
            run.workspace,
            run.image,
            run.no_refine,
            Controls(),
            early=early,
            choices=choices,
        ),
        debug=run.debug,
    )
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in VERSION_WORDS:
        print(version_line())
        raise SystemExit(0)
    refused = refused_first_word(args)
    if refused is not None:
        print(f"prime-agent: error: {refused}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    run = parse_plain_run(args)
    if run is not None and (run.task or not _stdin_is_terminal()):
        _run_plain(run, args)
    from orchestrator.cli.app import main as typer_main

    typer_main(args)


def _stdin_is_terminal() -> bool:
    return sys.stdin is None or sys.stdin.closed or sys.stdin.isatty()
