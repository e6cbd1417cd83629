"""``prime-agent`` with no task, and ``prime-agent tui [SESSION]``: the Textual TUI (docs/tui.md).

The TUI talks to the daemon only; this starts one first when none runs (unless autostart is
off), then hands the terminal to ``tui.app.run_tui``. Quitting the TUI detaches: the daemon and
its sessions keep running.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.api import ApiCommandError, request_sync
from orchestrator.cli.common import guarded
from orchestrator.cli.connect import daemon_error, require_daemon
from orchestrator.errors import UserError

__all__ = ["open_tui", "tui"]


def open_tui(
    session: str | None = None,
    *,
    cwd: Path | None = None,
    model: str | None = None,
    backend: str | None = None,
    api_base: str | None = None,
) -> int:
    """Run the TUI on this terminal; its exit code."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError(
            'the TUI needs a terminal; for scripts use prime-agent -p "task" or --mode json'
        )
    workdir = (cwd or Path.cwd()).expanduser()
    if not workdir.is_dir():
        raise UserError(f"--cwd {workdir} is not a directory")
    require_daemon("the TUI")
    if session is not None:  # a wrong name is a usage error, said before the screen changes
        try:
            found = request_sync("get_session", session=session)
        except ApiCommandError as exc:
            raise daemon_error(exc) from None
        session = str(found["session"]["id"])  # the app needs no second lookup
    from tui.app import run_tui

    return run_tui(
        cwd=workdir.resolve(),
        session=session,
        model=model,
        backend=None if backend in (None, "auto") else backend,
        api_base=api_base,
    )


def tui(
    session: Annotated[
        str | None, typer.Argument(help="Open this session's chat (id, prefix or name).")
    ] = None,
    cwd: Annotated[Path | None, typer.Option("--cwd", help="Directory for new chats.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model for new chats.")] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Sandbox backend for new chats: auto, docker, bwrap, local or kubernetes.",
        ),
    ] = None,
    api_base: Annotated[
        str | None,
        typer.Option("--api-base", help="Base URL of an OpenAI-compatible server for --model."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    raise SystemExit(
        guarded(
            lambda: open_tui(session, cwd=cwd, model=model, backend=backend, api_base=api_base),
            debug=debug,
        )
    )
