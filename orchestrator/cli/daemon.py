"""``prime-agent daemon start|stop|status``: run the orchestrator daemon in the background.

Each command prints one line. ``start`` spawns ``python -m orchestrator.daemon`` in its own
session (so it survives the terminal and this command) and returns once the socket answers
``ping`` with ``ready``; a daemon that is already running is not an error. ``stop`` sends
``shutdown`` and waits until the process is gone. ``status`` asks the running daemon. Errors are
one line on stderr with exit status 2 (``EXIT_USAGE``); ``status`` exits 3 when no daemon runs
(the LSB convention for "not running"), so scripts can test it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Final

import typer

from orchestrator.api.client import request_sync
from orchestrator.api.errors import ApiCommandError, ConnectionClosed
from orchestrator.api.server import default_socket_path
from orchestrator.api.wire import E_BUSY
from orchestrator.cli.autostart import (
    DAEMON_CONNECT_TIMEOUT_S,
    DAEMON_START_TIMEOUT_S,
    DaemonStartError,
    daemon_info,
    start_daemon,
)
from orchestrator.cli.common import EXIT_USAGE, fail
from orchestrator.daemon.files import daemon_log_path
from orchestrator.errors import PrimeAgentError

__all__ = [
    "DAEMON_CONNECT_TIMEOUT_S",
    "DAEMON_START_TIMEOUT_S",
    "DAEMON_STOP_TIMEOUT_S",
    "EXIT_NOT_RUNNING",
    "DaemonStartError",
    "daemon_app",
    "daemon_info",
    "start_daemon",
]

# Stopping aborts running turns and stops every sandbox (each bounded by PROCESS_STOP_GRACE_S).
DAEMON_STOP_TIMEOUT_S: Final = 60.0
POLL_INTERVAL_S: Final = 0.1
EXIT_NOT_RUNNING: Final = 3

daemon_app = typer.Typer(
    help="The orchestrator daemon: sessions that outlive the terminal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state == "Z"  # exited, waiting for its parent (init) to reap it


def _describe(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid')}, socket {info.get('socket')}"


@daemon_app.command("start", help="Start the daemon in the background (no-op if it runs).")
def start() -> None:
    try:
        info, started = start_daemon()
    except DaemonStartError as exc:
        fail(f"error: {exc}", EXIT_USAGE)
    if started:
        typer.echo(f"daemon started ({_describe(info)}, log {daemon_log_path()})")
    else:
        typer.echo(f"daemon already running ({_describe(info)})")


@daemon_app.command("stop", help="Stop the daemon and every session and sandbox it runs.")
def stop(
    force: Annotated[
        bool, typer.Option("--force", help="Abort running turns instead of refusing.")
    ] = False,
) -> None:
    info = daemon_info()
    if info is None:
        typer.echo(f"daemon not running (socket {default_socket_path()})")
        return
    pid = int(info["pid"])
    try:
        request_sync("shutdown", force=force, timeout=DAEMON_CONNECT_TIMEOUT_S)
    except ApiCommandError as exc:
        hint = " (use --force)" if exc.code == E_BUSY else ""
        fail(f"error: {exc}{hint}", EXIT_USAGE)
    except ConnectionClosed:
        pass  # it went away while answering: the wait below tells
    except PrimeAgentError as exc:
        fail(f"error: {exc}", EXIT_USAGE)
    deadline = time.monotonic() + DAEMON_STOP_TIMEOUT_S
    while not _pid_gone(pid):
        if time.monotonic() >= deadline:
            fail(
                f"error: the daemon (pid {pid}) did not stop within {DAEMON_STOP_TIMEOUT_S:.0f} s",
                EXIT_USAGE,
            )
        time.sleep(POLL_INTERVAL_S)
    typer.echo(f"daemon stopped (pid {pid})")


@daemon_app.command("status", help="Is the daemon running? pid, socket, sessions, uptime.")
def status() -> None:
    info = daemon_info()
    if info is None:
        typer.echo(f"daemon not running (socket {default_socket_path()})")
        raise typer.Exit(EXIT_NOT_RUNNING)
    state = "running" if info.get("ready") else "starting"
    if info.get("stopping"):
        state = "stopping"
    typer.echo(
        f"daemon {state} ({_describe(info)}, sessions {info.get('sessions', 0)}, "
        f"running {info.get('running', 0)}, uptime {float(info.get('uptime_s', 0.0)):.0f} s)"
    )
