"""``prime-agent daemon start|stop|status``: run the orchestrator daemon in the background.

Each command prints one line. ``start`` spawns ``python -m orchestrator.daemon`` in its own
session (so it survives the terminal and this command) and returns once the socket answers
``ping`` with ``ready``; a daemon that is already running is not an error. ``stop`` sends
``shutdown`` and waits until the process is gone. ``status`` asks the running daemon. Errors are
one line on stderr with exit status 2 (``EXIT_USAGE``); ``status`` exits 3 when no daemon runs
(the LSB convention for "not running"), so scripts can test it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Annotated, Any, Final

import typer

from orchestrator.api.client import request_sync
from orchestrator.api.errors import ApiCommandError, ConnectionClosed, DaemonNotRunning
from orchestrator.api.protocol import E_BUSY
from orchestrator.api.server import default_socket_path
from orchestrator.cli.common import EXIT_USAGE, fail
from orchestrator.errors import PrimeAgentError, UserError
from orchestrator.paths import Paths, ensure_private_dir

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

# Start-up is NATS + the store (well under a second) plus interpreter imports; a slow or loaded
# machine gets generous room before we call it failed.
DAEMON_START_TIMEOUT_S: Final = 60.0
# Stopping aborts running turns and stops every sandbox (each bounded by PROCESS_STOP_GRACE_S).
DAEMON_STOP_TIMEOUT_S: Final = 60.0
# Connecting and the handshake. Generous: a daemon's event loop can be held for seconds (litellm's
# import on a loaded machine), and a slow answer is not a missing daemon.
DAEMON_CONNECT_TIMEOUT_S: Final = 30.0
POLL_INTERVAL_S: Final = 0.1
EXIT_NOT_RUNNING: Final = 3
# How much of the daemon's log to quote when it died during start-up.
LOG_TAIL_BYTES: Final = 4096

daemon_app = typer.Typer(
    help="The orchestrator daemon: sessions that outlive the terminal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def daemon_info() -> dict[str, Any] | None:
    """The daemon's ping answer, or None when nothing answers on the socket."""
    try:
        result = request_sync("ping", timeout=DAEMON_CONNECT_TIMEOUT_S)
    except (DaemonNotRunning, ConnectionClosed):
        return None
    except PrimeAgentError as exc:  # another version, another user, a bad socket path
        fail(f"error: {exc}", EXIT_USAGE)
    return result if isinstance(result, dict) else None


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state == "Z"  # exited, waiting for its parent (init) to reap it


def _log_tail_line(paths: Paths) -> str:
    from orchestrator.daemon.service import STARTUP_ERROR_PREFIX, daemon_log_path

    try:
        with open(daemon_log_path(paths), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].removeprefix(STARTUP_ERROR_PREFIX) if lines else ""


def _describe(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid')}, socket {info.get('socket')}"


class DaemonStartError(UserError):
    """The daemon did not come up (its log's last line says why)."""


def start_daemon() -> tuple[dict[str, Any], bool]:
    """Start the daemon unless one answers: its ping answer, and whether this call started it.

    One daemon per user: two callers racing here both spawn one, the socket's lock lets one
    win, and both get the winner's answer. Raises ``DaemonStartError``.
    """
    from orchestrator.daemon.service import daemon_log_path

    info = daemon_info()
    if info is not None:
        return info, False
    paths = Paths.from_env()
    log_path = daemon_log_path(paths)
    ensure_private_dir(log_path.parent)
    from orchestrator.file_modes import PRIVATE_FILE_MODE

    # 0600 whatever the umask: the log names sessions and paths.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    with os.fdopen(log_fd, "ab") as log_file:
        # start_new_session: the daemon must not get this terminal's SIGINT/SIGHUP, and it must
        # not be killed with this command's process group. cwd "/": it must not pin the
        # directory the user happened to start it from.
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.daemon"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            cwd="/",
            env=dict(os.environ),
            start_new_session=True,
        )
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = daemon_info()
        if info is not None and info.get("ready"):
            # Another pid: we raced another start; ours lost the socket lock and exits.
            return info, info.get("pid") == proc.pid
        if proc.poll() is not None and info is None:
            detail = _log_tail_line(paths) or f"exit status {proc.returncode}"
            raise DaemonStartError(f"the daemon did not start: {detail}")
        time.sleep(POLL_INTERVAL_S)
    raise DaemonStartError(
        f"the daemon (pid {proc.pid}) did not answer within "
        f"{DAEMON_START_TIMEOUT_S:.0f} s; see {log_path}"
    )


@daemon_app.command("start", help="Start the daemon in the background (no-op if it runs).")
def start() -> None:
    from orchestrator.daemon.service import daemon_log_path

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
