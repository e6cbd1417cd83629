"""The run command: print mode (``-p``) and ``--mode json``."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.common import (
    EXIT_ABORTED,
    EXIT_ERROR,
    EXIT_OK,
    budget_spent,
    fail,
    guarded,
    report,
    stopped_run,
    stuck_run,
)
from orchestrator.cli.controls import Controls, controls_from_flags
from orchestrator.cli.interrupts import install_handlers, run_interruptible
from orchestrator.cli.progress import JsonLinesSink, ProgressSink
from orchestrator.errors import UserError
from orchestrator.paths import Paths
from orchestrator.settings import Settings

__all__ = ["Mode", "run"]

STDIN_MAX_BYTES = 10 * 1024 * 1024
INTERRUPTED_LINE = "prime-agent: interrupted; the session history is kept"


class Mode(StrEnum):
    text = "text"
    json = "json"


class Backend(StrEnum):
    """``--backend``: orchestrator/sandbox/choice.py's BACKEND_CHOICES (a test keeps them equal)."""

    auto = "auto"  # docker when usable, else bwrap, else refused
    docker = "docker"
    bwrap = "bwrap"
    local = "local"  # only when asked for: NOT isolated (a warning says so)


class Workspace(StrEnum):
    """How the project directory reaches the sandbox (docs/docker.md, "Workspace modes")."""

    rw = "rw"
    ro = "ro"  # read-only (the local backend cannot enforce it and says so)
    copy = "copy"  # a private copy, synced back into the project when the sandbox stops


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
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            "-r",
            help="Continue this session (id, prefix or name): run the task as a follow-up, or "
            "attach when there is none.",
        ),
    ] = None,
    continue_last: Annotated[
        bool,
        typer.Option(
            "--continue", "-c", help="Like --resume, with the newest session of this directory."
        ),
    ] = False,
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
            "there, else bwrap when bubblewrap works here, else an error), docker, bwrap, or "
            "local (not isolated; a warning says so). `prime-agent doctor` says which work.",
        ),
    ] = Backend.auto,
    network: Annotated[
        bool,
        typer.Option(
            "--network/--no-network",
            help="Let sandboxes reach the network (default: no network; docker and bwrap).",
        ),
    ] = False,
    no_daemon: Annotated[
        bool,
        typer.Option("--no-daemon", help="Run in this process even when a daemon is running."),
    ] = False,
    nats_url: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            help="Use this external NATS server (operator mode; the account signing key "
            "comes from [nats] in config.toml) instead of starting one.",
        ),
    ] = None,
    workspace: Annotated[
        Workspace | None,
        typer.Option(
            "--workspace",
            help="Project directory in the sandbox: rw, ro (read-only) or copy (a private "
            "copy synced back at the end). Default: sandbox.workspace in config.toml, rw.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="Sandbox image (docker): session, rust, cuda or an image tag. Default: "
            "sandbox.image in config.toml, session.",
        ),
    ] = None,
    no_refine: Annotated[
        bool,
        typer.Option("--no-refine", help="This session may not /refine its harness."),
    ] = False,
    autonomous: Annotated[
        bool,
        typer.Option("--autonomous", help="Keep the agent working until a gate passes or a limit."),
    ] = False,
    gates: Annotated[
        list[str] | None,
        typer.Option(
            "--autonomous-gate",
            help="Shell command that must exit 0 before the run may finish (repeatable; runs "
            "in the sandbox, in the workspace).",
        ),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option("--autonomous-max-turns", min=1, help="Default 12.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--autonomous-max-tokens", min=1, help="Default 80000.")
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--autonomous-timeout-ms", min=1, help="Default 1800000 (30 min)."),
    ] = None,
    goal: Annotated[
        str | None, typer.Option("--goal", help="An objective to keep working toward.")
    ] = None,
    goal_budget: Annotated[
        int | None, typer.Option("--goal-budget", min=1, help="The goal's token budget.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    text = " ".join(task or []).strip()
    piped = _read_stdin()
    if piped.strip():
        text = f"{text}\n\n{piped}".strip() if text else piped.strip()
    if resume is not None or continue_last:
        from orchestrator.cli.resume import ResumeRequest, resume_session

        request = ResumeRequest(
            resume, continue_last, text, cwd, mode is Mode.json, model, api_base, no_daemon
        )
        if text:  # a follow-up run (without a task it attaches: Ctrl-C detaches there)
            install_handlers()
        raise SystemExit(guarded(lambda: resume_session(request), debug=debug))
    controls = guarded(
        lambda: controls_from_flags(
            autonomous, gates, max_turns, max_tokens, timeout_ms, goal, goal_budget
        ),
        debug=debug,
    )
    if not text and controls.goal is None:
        if sys.stdin is not None and sys.stdin.isatty() and not print_mode:
            from orchestrator.cli.tui_cmd import open_tui

            chosen = backend.value
            raise SystemExit(
                guarded(lambda: open_tui(cwd=cwd, model=model, backend=chosen), debug=debug)
            )
        fail('no task given: prime-agent -p "your task" (or pipe the task on stdin)')
    workdir = (cwd or Path.cwd()).expanduser()
    if not workdir.is_dir():
        fail(f"--cwd {workdir} is not a directory")
    install_handlers()  # from here on a signal is an abort (cli/interrupts.py)
    code = guarded(
        lambda: _run(
            text,
            model,
            api_base,
            workdir.resolve(),
            backend.value,
            mode,
            debug,
            network,
            no_daemon,
            nats_url,
            workspace.value if workspace is not None else None,
            image,
            no_refine,
            controls,
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
    controls: Controls | None = None,
    sandbox: dict[str, Any] | None = None,
) -> int:
    from orchestrator.cli.via_daemon import run_via_daemon

    controls = controls or Controls()

    code = run_interruptible(
        lambda abort: run_via_daemon(
            text=text,
            model=model_sel,
            api_base=api_base,
            cwd=cwd,
            backend=backend,
            json_mode=mode is Mode.json,
            wait_timeout_s=settings.family_wait_timeout_s,
            refine=None if settings.harness.refine_enabled else False,
            autonomous=controls.autonomous,
            goal=controls.goal,
            sandbox=sandbox,
            abort=abort,
        )
    )
    if code == EXIT_ABORTED:
        print(INTERRUPTED_LINE, file=sys.stderr)
    return code


def _daemon_for_run(own_bus: bool) -> bool:
    """Whether this run goes through the user's daemon: one that runs, else one started now
    (autostart: ``[daemon] autostart``, ``PRIME_AGENT_DAEMON_AUTOSTART``), so any number of
    runs share one host. A run on its own ``--nats-url`` starts none: it runs here."""
    from orchestrator.cli.autostart import daemon_info
    from orchestrator.cli.connect import ensure_daemon

    if daemon_info() is not None:
        return True
    return not own_bus and ensure_daemon()


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
    nats_url: str | None = None,
    workspace: str | None = None,
    image: str | None = None,
    no_refine: bool = False,
    controls: Controls | None = None,
) -> int:
    # Only what both paths need: a run through the daemon must not pay for importing the
    # session stack (~0.5 s of the CLI's start) it does not use.
    from orchestrator.settings import load_settings

    paths = Paths.from_env()
    settings = load_settings(paths.config_file)
    configured_nats_url = settings.nats.url
    if nats_url is not None:
        settings = settings.with_overrides(nats=settings.nats.model_copy(update={"url": nats_url}))
    if no_refine:
        settings = settings.with_overrides(
            harness=settings.harness.model_copy(update={"refine_enabled": False})
        )
    sandbox_options = {"workspace": workspace, "image": image}
    sandbox_options = {k: v for k, v in sandbox_options.items() if v is not None}
    if sandbox_options:
        settings = settings.with_overrides(
            sandbox=settings.sandbox.model_copy(update=sandbox_options)
        )
    own_bus = nats_url is not None and nats_url != configured_nats_url
    if not no_daemon and _daemon_for_run(own_bus):
        if own_bus:
            raise UserError(
                "--nats-url: a running daemon uses the bus from its config.toml; "
                "set [nats] url there, or add --no-daemon"
            )
        # A running daemon owns the database: go through it (same output, same exit codes).
        from orchestrator.models.registry import client_env_names

        # The sandbox choices travel with the session (stored in its policy), and so do this
        # shell's key and OPENAI_BASE_URL (in the daemon's memory only).
        client_env = {
            name: os.environ[name]
            for name in client_env_names(model_sel, settings)
            if os.environ.get(name)
        }
        sandbox = {**sandbox_options, "network": network, "client_env": client_env}
        return _through_daemon(
            text, model_sel, api_base, cwd, backend, mode, settings, controls, sandbox
        )
    from orchestrator.models.lite import preload_in_background
    from orchestrator.models.registry import resolve_model
    from orchestrator.sessions.runner import RunOptions, run_session

    # Resolve before starting anything: a bad model or missing key is a one-line error.
    resolved = resolve_model(model_sel, settings, api_base=api_base)
    if settings.model_client == "litellm" or not (resolved.embedded or resolved.speaks_openai):
        preload_in_background()  # this run's model goes through litellm: overlap its import

    if mode is Mode.json:
        sink: JsonLinesSink | ProgressSink | None = JsonLinesSink()
    elif sys.stderr.isatty():
        sink = ProgressSink()
    else:
        sink = None

    def header(session_id: str) -> None:
        if isinstance(sink, JsonLinesSink):
            sink({"type": "session", "version": 3, "id": session_id, "cwd": str(cwd)})

    async def main(abort: asyncio.Event) -> int:
        # SIGINT and SIGTERM set ``abort`` (cli/interrupts.py): the tree's turns are aborted
        # and recorded, its sandboxes stop, and the run exits EXIT_ABORTED.
        result = await run_session(
            RunOptions(
                task=text,
                cwd=cwd,
                backend=backend,  # type: ignore[arg-type]
                network=network,
                autonomous=controls.policy() if controls is not None else None,
                goal=controls.goal_pair() if controls is not None else None,
            ),
            resolved,
            settings,
            paths,
            sink=sink,
            on_session=header,
            abort=abort,
        )
        outcome = result.outcome
        if abort.is_set() or outcome.reason == "aborted":
            return EXIT_ABORTED
        if result.stop is not None:
            stop = result.stop
            return stopped_run(
                stop.reason, stop.detail, stop.exit_code, outcome.final_text, mode is Mode.json
            )
        if outcome.reason == "completed":
            if mode is Mode.text:
                sys.stdout.write(outcome.final_text.rstrip("\n") + "\n")
                sys.stdout.flush()
            return EXIT_OK
        if outcome.reason == "budget_exceeded":
            return budget_spent(outcome.final_text)
        if outcome.error is not None:
            return report(outcome.error, debug=debug)
        if outcome.reason == "stuck":
            return stuck_run(outcome.final_text)
        print(f"prime-agent: the run ended: {outcome.reason}", file=sys.stderr)
        return EXIT_ERROR

    try:
        code = run_interruptible(main)
        if code == EXIT_ABORTED:
            print(INTERRUPTED_LINE, file=sys.stderr)
        # Everything is closed; tearing down litellm's ~4,000 modules object by object costs
        # ~1 s at exit. Freezing the heap lets the interpreter skip collecting it.
        gc.freeze()
        return code
    except UserError:
        raise
    finally:
        # Flush stdout before exit so a closed pipe does not turn into a traceback.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
