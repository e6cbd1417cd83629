"""Starting the user's daemon from the CLI, without typer and without the daemon's own imports.

``start_daemon()`` is what ``prime-agent daemon start`` and every autostarting command use: spawn
``python -m orchestrator.daemon`` detached, wait until its socket accepts (a connect try every
``SOCKET_POLL_S``: the socket appears about a second after the spawn), then send one ``ping``
with ``wait_ready``, which the daemon answers the moment it is ready. No sleep-and-ping loop.

Print mode splits it in two so the daemon's start overlaps the client's own imports:
``spawn_early()`` runs before anything heavy is imported (a raw connect to the socket, the
autostart switch read without pydantic), and ``wait_started()`` later waits for the process it
spawned. Everything here imports only the standard library until it talks to the daemon.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from orchestrator.cli.client_config import read_config_toml
from orchestrator.cli.common import EXIT_USAGE, fail
from orchestrator.daemon.files import STARTUP_ERROR_PREFIX, daemon_log_path
from orchestrator.errors import PrimeAgentError, UserError
from orchestrator.paths import Paths, ensure_private_dir

__all__ = [
    "AUTOSTART_ENV",
    "DAEMON_CONNECT_TIMEOUT_S",
    "DAEMON_START_TIMEOUT_S",
    "DaemonStartError",
    "announce_started",
    "daemon_info",
    "socket_answers",
    "spawn_daemon",
    "spawn_early",
    "start_daemon",
    "wait_started",
]

AUTOSTART_ENV: Final = "PRIME_AGENT_DAEMON_AUTOSTART"
# Start-up is NATS + the store (well under a second) plus interpreter imports; a slow or loaded
# machine gets generous room before we call it failed.
DAEMON_START_TIMEOUT_S: Final = 60.0
# Connecting and the handshake. Generous: a daemon's event loop can be held for seconds (litellm's
# import on a loaded machine), and a slow answer is not a missing daemon.
DAEMON_CONNECT_TIMEOUT_S: Final = 30.0
# How often to try connecting to the socket of a daemon we just spawned: a refused connect on a
# Unix socket costs microseconds, so a short interval adds no load and no latency.
SOCKET_POLL_S: Final = 0.005
# How much of the daemon's log to quote when it died during start-up.
LOG_TAIL_BYTES: Final = 4096
_AUTOSTART_ON_WORDS: Final = frozenset({"1", "true", "yes", "on"})
_DAEMON_SECTION: Final = "daemon"
_AUTOSTART_KEY: Final = "autostart"


class DaemonStartError(UserError):
    """The daemon did not come up (its log's last line says why)."""


def socket_answers(path: Path) -> bool:
    """Whether something accepts connections on the control socket (no handshake: cheap)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def daemon_info() -> dict[str, Any] | None:
    """The daemon's ping answer, or None when nothing answers on the socket."""
    from orchestrator.api.client import request_sync
    from orchestrator.api.errors import ConnectionClosed, DaemonNotRunning

    try:
        result = request_sync("ping", timeout=DAEMON_CONNECT_TIMEOUT_S)
    except (DaemonNotRunning, ConnectionClosed):
        return None
    except PrimeAgentError as exc:  # another version, another user, a bad socket path
        fail(f"error: {exc}", EXIT_USAGE)
    return result if isinstance(result, dict) else None


def _log_tail_line(paths: Paths) -> str:
    try:
        with open(daemon_log_path(paths), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].removeprefix(STARTUP_ERROR_PREFIX) if lines else ""


def spawn_daemon(paths: Paths) -> subprocess.Popen[bytes]:
    """``python -m orchestrator.daemon``, detached, its output appended to its log."""
    from orchestrator.file_modes import PRIVATE_FILE_MODE

    log_path = daemon_log_path(paths)
    ensure_private_dir(log_path.parent)
    # 0600 whatever the umask: the log names sessions and paths.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    with os.fdopen(log_fd, "ab") as log_file:
        # start_new_session: the daemon must not get this terminal's SIGINT/SIGHUP, and it must
        # not be killed with this command's process group. cwd "/": it must not pin the
        # directory the user happened to start it from.
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator.daemon"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            cwd="/",
            env=dict(os.environ),
            start_new_session=True,
        )


def _died(proc: subprocess.Popen[bytes], paths: Paths) -> DaemonStartError:
    detail = _log_tail_line(paths) or f"exit status {proc.returncode}"
    return DaemonStartError(f"the daemon did not start: {detail}")


def _timed_out(proc: subprocess.Popen[bytes], paths: Paths) -> DaemonStartError:
    return DaemonStartError(
        f"the daemon (pid {proc.pid}) did not answer within "
        f"{DAEMON_START_TIMEOUT_S:.0f} s; see {daemon_log_path(paths)}"
    )


def wait_started(proc: subprocess.Popen[bytes], paths: Paths) -> tuple[dict[str, Any], bool]:
    """Wait for the daemon ``proc`` (or the one that beat it to the socket) to be ready: its
    ping answer, and whether it is ``proc``. Raises ``DaemonStartError``."""
    from orchestrator.api.client import request_sync
    from orchestrator.api.errors import ApiCommandError, ConnectionClosed, DaemonNotRunning

    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    sock = paths.control_socket
    while not socket_answers(sock):
        # Exited before binding: it failed, or lost the socket lock to a daemon started
        # at the same moment (which then answers).
        if proc.poll() is not None and not socket_answers(sock):
            raise _died(proc, paths)
        if time.monotonic() >= deadline:
            raise _timed_out(proc, paths)
        time.sleep(SOCKET_POLL_S)
    try:
        info = request_sync("ping", wait_ready=True, timeout=DAEMON_CONNECT_TIMEOUT_S)
    except (DaemonNotRunning, ConnectionClosed):
        # It went away while starting (its log says why), or it was the loser of a race.
        info = daemon_info()
        if info is None or not info.get("ready"):
            proc.poll()
            raise _died(proc, paths) from None
    except ApiCommandError as exc:  # busy: still not ready after the daemon's own bound
        raise _timed_out(proc, paths) from exc
    if not isinstance(info, dict):
        raise _died(proc, paths)
    # Another pid: we raced another start; ours lost the socket lock and exits.
    return info, info.get("pid") == proc.pid


def announce_started(info: dict[str, Any], started: bool) -> None:
    """One line on a terminal's stderr when this command started the daemon."""
    if started and sys.stderr.isatty():
        print(
            f"prime-agent: started the daemon (pid {info.get('pid')}; "
            "prime-agent daemon stop stops it)",
            file=sys.stderr,
        )


def start_daemon() -> tuple[dict[str, Any], bool]:
    """Start the daemon unless one answers: its ping answer, and whether this call started it.

    One daemon per user: two callers racing here both spawn one, the socket's lock lets one
    win, and both get the winner's answer. Raises ``DaemonStartError``.
    """
    info = daemon_info()
    if info is not None:
        return info, False
    paths = Paths.from_env()
    return wait_started(spawn_daemon(paths), paths)


def _autostart_surely_on(paths: Paths) -> bool:
    """The autostart switch when it can be read without the settings model: True only when
    it is certainly on (the full check, ``connect.autostart_enabled``, runs later anyway)."""
    raw = os.environ.get(AUTOSTART_ENV, "").strip().lower()
    if raw:
        return raw in _AUTOSTART_ON_WORDS
    config = read_config_toml(paths.config_file)  # empty without a file: the default, on
    if config is None:
        return False  # the settings loader says what is wrong
    section = config.get(_DAEMON_SECTION, {})
    return isinstance(section, dict) and section.get(_AUTOSTART_KEY, True) is True


def spawn_early(paths: Paths) -> subprocess.Popen[bytes] | None:
    """Spawn the daemon now when none listens and autostart is surely on; None otherwise
    (a daemon runs, or the ordinary check decides later). ``wait_started`` finishes it."""
    if socket_answers(paths.control_socket) or not _autostart_surely_on(paths):
        return None
    return spawn_daemon(paths)
