"""Print mode (``-p``) and ``--mode json`` once the command line is parsed: no typer here.

Both ways in share it: the typer command (``cli/run.py``) and the lean pre-dispatch
(``cli/entry.py``), which parses a plain ``-p`` run itself so that it imports neither typer nor
the other commands. A run goes through the user's daemon (started when none runs, autostart);
``--no-daemon`` or a ``--nats-url`` of its own runs the session in this process.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.cli.client_config import ClientConfig, load_client_config
from orchestrator.cli.common import (
    EXIT_ABORTED,
    EXIT_ERROR,
    EXIT_OK,
    budget_spent,
    fail,
    report,
    stopped_run,
    stuck_run,
)
from orchestrator.cli.controls import Controls
from orchestrator.cli.interrupts import run_interruptible
from orchestrator.cli.progress import JsonLinesSink, ProgressSink
from orchestrator.cli.run_options import Backend, Mode, Workspace
from orchestrator.cli.session_choices import SessionChoices
from orchestrator.errors import UserError
from orchestrator.paths import Paths

if TYPE_CHECKING:
    import subprocess

    from orchestrator.settings import Settings

__all__ = [
    "INTERRUPTED_LINE",
    "STDIN_MAX_BYTES",
    "Backend",
    "Mode",
    "Workspace",
    "daemon_for_run",
    "read_stdin",
    "run_print",
]

STDIN_MAX_BYTES: Final = 10 * 1024 * 1024
INTERRUPTED_LINE: Final = "prime-agent: interrupted; the session history is kept"


def read_stdin() -> str:
    if sys.stdin is None or sys.stdin.closed or sys.stdin.isatty():
        return ""
    data = sys.stdin.read(STDIN_MAX_BYTES + 1)
    if len(data) > STDIN_MAX_BYTES:
        fail(f"standard input is larger than {STDIN_MAX_BYTES // (1024 * 1024)} MiB")
    return data


def _through_daemon(
    text: str,
    model_sel: str | None,
    api_base: str | None,
    cwd: Path,
    backend: str,
    mode: Mode,
    config: ClientConfig,
    no_refine: bool,
    sandbox: dict[str, Any],
    controls: Controls | None = None,
    *,
    choices: SessionChoices | None = None,
) -> int:
    """The run through the daemon. The daemon applies config.toml itself (refine default,
    sandbox settings); the client adds its options and this shell's key variables."""
    from orchestrator.cli.via_daemon import run_via_daemon
    from orchestrator.model_names import client_env_names

    controls = controls or Controls()
    # The sandbox choices travel with the session (stored in its policy), and so do this
    # shell's key and OPENAI_BASE_URL (in the daemon's memory only).
    names = client_env_names(model_sel, config.default_model, config.models)
    client_env = {name: os.environ[name] for name in names if os.environ.get(name)}
    code = run_interruptible(
        lambda abort: run_via_daemon(
            text=text,
            model=model_sel,
            api_base=api_base,
            cwd=cwd,
            backend=backend,
            json_mode=mode is Mode.json,
            wait_timeout_s=config.family_wait_timeout_s,
            refine=False if no_refine else None,  # None: the daemon's config.toml decides
            autonomous=controls.autonomous,
            goal=controls.goal,
            sandbox={**sandbox, "client_env": client_env},
            abort=abort,
            settings=choices.settings() if choices is not None else None,
        )
    )
    if code == EXIT_ABORTED:
        print(INTERRUPTED_LINE, file=sys.stderr)
    return code


def daemon_for_run(own_bus: bool, early: subprocess.Popen[bytes] | None = None) -> bool:
    """Whether this run goes through the user's daemon: one that runs, else one started now
    (autostart: ``[daemon] autostart``, ``PRIME_AGENT_DAEMON_AUTOSTART``), so any number of
    runs share one host (``-p`` and ``run --config``). A run on its own ``--nats-url`` starts
    none: it runs here. ``early``:
    the daemon the lean pre-dispatch already spawned (``autostart.spawn_early``)."""
    from orchestrator.cli.autostart import announce_started, daemon_info, wait_started
    from orchestrator.cli.connect import ensure_daemon

    if early is not None:
        announce_started(*wait_started(early, Paths.from_env()))
        return True
    if daemon_info() is not None:
        return True
    return not own_bus and ensure_daemon()


def _daemon_for_run(
    own_bus: bool, early: subprocess.Popen[bytes] | None, paths: Paths, *, checked: bool
) -> bool:
    """``daemon_for_run``; when the daemon does not start and config.toml was only peeked at
    (not ``checked``), the settings loader reads it: a bad file, which is what stops a daemon
    at its start, is then reported as it always was, not as the daemon's failure."""
    from orchestrator.cli.autostart import DaemonStartError

    try:
        return daemon_for_run(own_bus, early)
    except DaemonStartError:
        if not checked:
            _full_settings(paths)  # ConfigError when the file is what is wrong
        raise


def _full_settings(paths: Paths) -> Settings:
    """config.toml through the settings models: what an in-process run needs."""
    from orchestrator.settings import load_settings

    return load_settings(paths.config_file)


def run_print(
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
    early: subprocess.Popen[bytes] | None = None,
    *,
    choices: SessionChoices | None = None,
) -> int:
    # A run through the daemon reads three values of config.toml without the settings models
    # (cli/client_config.py): the client's start is its own imports (docs/cli.md, "Start-up
    # cost"). Its own bus (--nats-url) or --no-daemon need the settings in any case.
    paths = Paths.from_env()
    settings: Settings | None = None
    own_bus = False
    if no_daemon or nats_url is not None:
        settings = _full_settings(paths)
        own_bus = nats_url is not None and nats_url != settings.nats.url
    if settings is None:
        config = load_client_config(paths.config_file)  # before the wait: a bad file fails now
    else:
        config = ClientConfig.from_settings(settings)
    sandbox_options = {"workspace": workspace, "image": image}
    sandbox_options = {k: v for k, v in sandbox_options.items() if v is not None}
    if not no_daemon and _daemon_for_run(own_bus, early, paths, checked=settings is not None):
        if own_bus:
            raise UserError(
                "--nats-url: a running daemon uses the bus from its config.toml; "
                "set [nats] url there, or add --no-daemon"
            )
        # A running daemon owns the database: go through it (same output, same exit codes).
        sandbox = {**sandbox_options, "network": network}
        return _through_daemon(
            text,
            model_sel,
            api_base,
            cwd,
            backend,
            mode,
            config,
            no_refine,
            sandbox,
            controls,
            choices=choices,
        )
    if settings is None:
        settings = _full_settings(paths)
    if nats_url is not None:
        settings = settings.with_overrides(nats=settings.nats.model_copy(update={"url": nats_url}))
    if no_refine:
        settings = settings.with_overrides(
            harness=settings.harness.model_copy(update={"refine_enabled": False})
        )
    if sandbox_options:
        settings = settings.with_overrides(
            sandbox=settings.sandbox.model_copy(update=sandbox_options)
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
                run_settings=choices.stored() if choices is not None else None,
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
