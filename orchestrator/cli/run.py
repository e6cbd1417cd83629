"""The run command: print mode (``-p``) and ``--mode json``."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import EXIT_ABORTED, EXIT_ERROR, EXIT_OK, fail, guarded, report
from orchestrator.cli.progress import JsonLinesSink, ProgressSink
from orchestrator.errors import UserError
from orchestrator.paths import Paths
from orchestrator.settings import Settings

__all__ = ["Mode", "run"]

STDIN_MAX_BYTES = 10 * 1024 * 1024


class Mode(StrEnum):
    text = "text"
    json = "json"


class Backend(StrEnum):
    auto = "auto"  # docker when usable, else local (with a warning)
    docker = "docker"
    local = "local"


def _read_stdin() -> str:
    if sys.stdin is None or sys.stdin.closed or sys.stdin.isatty():
        return ""
    data = sys.stdin.read(STDIN_MAX_BYTES + 1)
    if len(data) > STDIN_MAX_BYTES:
        fail(f"standard input is larger than {STDIN_MAX_BYTES // (1024 * 1024)} MiB")
    return data


def run(
    task: Annotated[
        list[str] | None, typer.Argument(help="The task (or pipe it on stdin).")
    ] = None,
    print_mode: Annotated[
        bool, typer.Option("-p", "--print", help="Run to the end; print only the final answer.")
    ] = False,
    mode: Annotated[Mode, typer.Option("--mode", help="text, or json: every event as a line.")] = (
        Mode.text
    ),
    model: Annotated[
        str | None, typer.Option("--model", help="provider/name, e.g. openai/gpt-4o-mini.")
    ] = None,
    api_base: Annotated[
        str | None, typer.Option("--api-base", help="Base URL of an OpenAI-compatible server.")
    ] = None,
    cwd: Annotated[
        Path | None, typer.Option("--cwd", help="Working directory of the session.")
    ] = None,
    backend: Annotated[
        Backend,
        typer.Option(
            "--backend",
            envvar="PRIME_AGENT_BACKEND",
            help="Sandbox backend: auto (docker when an engine and the session image are "
            "there, else local with a warning), docker or local.",
        ),
    ] = Backend.auto,
    network: Annotated[
        bool,
        typer.Option(
            "--network/--no-network",
            help="Let sandboxes reach the network (default: no network; docker only).",
        ),
    ] = False,
    no_daemon: Annotated[
        bool,
        typer.Option("--no-daemon", help="Run in this process even when a daemon is running."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    text = " ".join(task or []).strip()
    piped = _read_stdin()
    if piped.strip():
        text = f"{text}\n\n{piped}".strip() if text else piped.strip()
    if not text:
        if sys.stdin is not None and sys.stdin.isatty() and not print_mode:
            fail('the interactive TUI is not built yet: run prime-agent -p "your task"')
        fail('no task given: prime-agent -p "your task" (or pipe the task on stdin)')
    workdir = (cwd or Path.cwd()).expanduser()
    if not workdir.is_dir():
        fail(f"--cwd {workdir} is not a directory")
    code = guarded(
        lambda: _run(
            text, model, api_base, workdir.resolve(), backend.value, mode, debug, network, no_daemon
        ),
        debug=debug,
    )
    raise SystemExit(code)


def _through_daemon(
    text: str,
    model_sel: str | None,
    api_base: str | None,
    cwd: Path,
    backend: str,
    mode: Mode,
    settings: Settings,
) -> int:
    from orchestrator.cli.via_daemon import run_via_daemon

    try:
        return asyncio.run(
            run_via_daemon(
                text=text,
                model=model_sel,
                api_base=api_base,
                cwd=cwd,
                backend=backend,
                json_mode=mode is Mode.json,
                wait_timeout_s=settings.family_wait_timeout_s,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("prime-agent: interrupted; the session history is kept", file=sys.stderr)
        return EXIT_ABORTED


def _run(
    text: str,
    model_sel: str | None,
    api_base: str | None,
    cwd: Path,
    backend: str,
    mode: Mode,
    debug: bool,
    network: bool = False,
    no_daemon: bool = False,
) -> int:
    from orchestrator.cli.daemon import daemon_info
    from orchestrator.models.lite import preload_in_background
    from orchestrator.models.registry import resolve_model
    from orchestrator.sessions.runner import RunOptions, run_session
    from orchestrator.settings import load_settings

    paths = Paths.from_env()
    settings = load_settings(paths.config_file)
    if not no_daemon and daemon_info() is not None:
        # A running daemon owns the database: go through it (same output, same exit codes).
        return _through_daemon(text, model_sel, api_base, cwd, backend, mode, settings)
    # Resolve before starting anything: a bad model or missing key is a one-line error.
    resolved = resolve_model(model_sel, settings, api_base=api_base)
    preload_in_background()

    if mode is Mode.json:
        sink: JsonLinesSink | ProgressSink | None = JsonLinesSink()
    elif sys.stderr.isatty():
        sink = ProgressSink()
    else:
        sink = None

    def header(session_id: str) -> None:
        if isinstance(sink, JsonLinesSink):
            sink({"type": "session", "version": 3, "id": session_id, "cwd": str(cwd)})

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        # SIGTERM stops like Ctrl-C: cancel, record the abort, stop the sandbox.
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        result = await run_session(
            RunOptions(task=text, cwd=cwd, backend=backend, network=network),  # type: ignore[arg-type]
            resolved,
            settings,
            paths,
            sink=sink,
            on_session=header,
        )
        outcome = result.outcome
        if outcome.reason == "completed":
            if mode is Mode.text:
                sys.stdout.write(outcome.final_text.rstrip("\n") + "\n")
                sys.stdout.flush()
            return EXIT_OK
        if outcome.error is not None:
            return report(outcome.error, debug=debug)
        print(f"prime-agent: the run ended: {outcome.reason}", file=sys.stderr)
        return EXIT_ERROR

    try:
        code = asyncio.run(main())
        # Everything is closed; tearing down litellm's ~4,000 modules object by object costs
        # ~1 s at exit. Freezing the heap lets the interpreter skip collecting it.
        gc.freeze()
        return code
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("prime-agent: interrupted; the session history is kept", file=sys.stderr)
        return EXIT_ABORTED
    except UserError:
        raise
    finally:
        # Flush stdout before exit so a closed pipe does not turn into a traceback.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
