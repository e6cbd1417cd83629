"""``python -m orchestrator.daemon``: run the daemon in the foreground until it is stopped.

``prime-agent daemon start`` runs this detached (its own session, stdout and stderr appended to
the log). Logs go to ``daemon_log_path()`` (``$XDG_RUNTIME_DIR/prime-agent/daemon.log``); a
failure to start is also one line on stderr, and the exit status says which kind.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, Final

from orchestrator.bus.lean_import import WEBSOCKET_SCHEMES, import_nats_without_websockets
from orchestrator.errors import UserError
from orchestrator.file_modes import tighten_state, use_private_umask
from orchestrator.paths import Paths, ensure_private_dir

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1  # a bug or an unexpected failure; the traceback is in the log
EXIT_USAGE: Final = 2  # the user can fix it: another daemon runs, bad config, locked database
LOG_FILE_MODE: Final = 0o600  # the log names sessions and paths: owner-only
NOISY_LOGGERS: Final = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx")
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Set to a file path, the daemon runs under cProfile (timed by the event loop thread's CPU
# time) and writes its stats there when it stops (``python -m pstats PATH``): how we find where
# a step's host CPU goes (docs/benchmarks.md).
PROFILE_ENV: Final = "PRIME_AGENT_DAEMON_PROFILE"
# ``kill -USR1 PID`` writes every thread's Python stack to the daemon's log: how a daemon that
# hangs or spins is read without a debugger (docs/daemon.md, "When the daemon hangs").
STACK_DUMP_SIGNAL: Final = signal.SIGUSR1


def _setup_logging(paths: Paths, level: str) -> None:
    from orchestrator.daemon.files import daemon_log_path

    path = daemon_log_path(paths)
    ensure_private_dir(path.parent)
    # Create it 0600 before logging opens it (FileHandler would use the umask); one an
    # earlier version made 0644 is made private here, with the rest of its state.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_FILE_MODE))
    tighten_state(paths, log_file=path)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    if handler.stream is not None:  # opened now (FileHandler without delay)
        faulthandler.register(STACK_DUMP_SIGNAL, file=handler.stream, all_threads=True)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    # litellm logs every call at INFO (and to stdout through its own handler): keep it quiet.
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _run(daemon: Coroutine[Any, Any, None]) -> None:
    profile_path = os.environ.get(PROFILE_ENV)
    if not profile_path:
        asyncio.run(daemon)
        return
    import cProfile
    import time

    profile = cProfile.Profile(time.thread_time)  # the loop thread's CPU, not wall time
    try:
        profile.runcall(asyncio.run, daemon)
    finally:
        profile.dump_stats(profile_path)


def _websocket_bus_configured(paths: Paths) -> bool:
    """Whether config.toml may name a ``ws://`` NATS server (a plain text search: it errs on
    the side of keeping nats-py's websocket transport; the settings are validated later)."""
    try:
        text = paths.config_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(scheme in text for scheme in WEBSOCKET_SCHEMES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.daemon", description="Run the Prime Agent daemon."
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])
    args = parser.parse_args(argv)
    # Everything the daemon writes from now on is owner-only (R15): the store and its WAL,
    # the NATS store and logs; local sandboxes get the user's umask back (file_modes.py).
    use_private_umask()
    paths = Paths.from_env()
    _setup_logging(paths, args.log_level)
    log = logging.getLogger("orchestrator.daemon")
    log.info("daemon starting: pid %d", os.getpid())
    if not _websocket_bus_configured(paths):
        import_nats_without_websockets()  # aiohttp is not needed: ~0.2 s off the start
    from orchestrator.daemon.service import STARTUP_ERROR_PREFIX, Daemon

    try:
        _run(Daemon(paths=paths).run())
    except UserError as exc:
        log.error("daemon did not start: %s", exc)
        print(f"{STARTUP_ERROR_PREFIX}{exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        log.exception("daemon failed")
        print(f"prime-agent daemon: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
