"""How a print-mode run meets SIGINT and SIGTERM: one mechanism, whenever the signal comes.

``run_interruptible(main)`` runs ``main(abort)`` on a fresh event loop, where ``abort`` is an
``asyncio.Event``. From before the loop starts until the process exits:

- the **first** SIGINT or SIGTERM sets ``abort`` (from the loop, so nothing is interrupted at
  an arbitrary bytecode) and arms a deadline: the run aborts its turn and its subagents'
  (in-process: ``sessions/runner.py``; through the daemon: the ``abort`` command, which cascades),
  records it, and ``run_interruptible`` returns ``EXIT_ABORTED``. A run that has not ended
  ``ABORT_EXIT_DEADLINE_S`` after the signal exits with ``EXIT_ABORTED`` anyway;
- a **second** signal exits at once (``EXIT_ABORTED``), whatever is still running;
- a signal while no run is in progress (``install_handlers`` was called, the run has not
  reached its loop yet, or has ended) exits at once (``EXIT_ABORTED``).

The run's code never waits for a cancellation to travel through it: ``abort`` is an event it
races against its work, so a cancellation swallowed somewhere below cannot lose the signal.
The handlers are Python-level (``signal.signal``) with the loop's wakeup fd, installed before
``asyncio`` code runs and kept until exit, so a signal that arrives during start-up, between
two awaits or during the clean-up is seen as well. A signal before the loop exists is kept and
sets ``abort`` as soon as it does.

Exit itself is bounded too: once ``main`` has returned, a daemon thread ends the process with
its exit code if the interpreter has not exited within ``EXIT_GRACE_S`` (a worker thread of a
library that never returns cannot keep a finished run alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Final

from orchestrator.cli.common import EXIT_ABORTED, EXIT_ERROR

__all__ = [
    "ABORT_EXIT_DEADLINE_S",
    "ABORT_SIGNALS",
    "EXIT_GRACE_S",
    "SignalAbort",
    "install_handlers",
    "run_interruptible",
]

ABORT_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
# After the first signal, the run has this long to abort, record it and stop its sandboxes.
ABORT_EXIT_DEADLINE_S: Final = 45.0
# After the run's result, the interpreter has this long to exit (threads, executors).
EXIT_GRACE_S: Final = 15.0
_DEADLINE_POLL_S: Final = 0.5
_SECOND_SIGNAL_LINE: Final = b"prime-agent: interrupted again; exiting now\n"
_NO_RUN_LINE: Final = b"prime-agent: interrupted\n"
_DEADLINE_LINE: Final = b"prime-agent: the abort did not finish in time; exiting now\n"


def _exit_now(code: int, line: bytes) -> None:
    if line:
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), line)
    os._exit(code)


class _Deadline:
    """A daemon thread, started before any signal can come, that ends the process at the
    earliest deadline armed (arming only sets fields and an event: safe in a handler)."""

    def __init__(self) -> None:
        self._armed = threading.Event()
        self._at = float("inf")
        self._code = EXIT_ABORTED
        self._line = b""
        threading.Thread(target=self._run, name="prime-agent-exit-deadline", daemon=True).start()

    def arm(self, code: int, after_s: float, line: bytes) -> None:
        at = time.monotonic() + after_s
        if at < self._at:
            self._at, self._code, self._line = at, code, line
        self._armed.set()

    def _run(self) -> None:
        self._armed.wait()
        while (left := self._at - time.monotonic()) > 0:
            time.sleep(min(left, _DEADLINE_POLL_S))
        _exit_now(self._code, self._line)


class SignalAbort:
    """The handlers' state: how many signals came, and the loop's ``abort`` event."""

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._previous: dict[int, object] = {}
        self.deadline = _Deadline()

    @property
    def requested(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        for sig in ABORT_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def bind(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        """From now on the first signal sets ``event`` on ``loop`` (at once if one came)."""
        self._loop, self._event = loop, event
        if self.requested:
            event.set()

    def unbind(self) -> None:
        self._loop, self._event = None, None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            _exit_now(EXIT_ABORTED, _SECOND_SIGNAL_LINE)
        if self._loop is None:  # no run in progress: nothing to abort
            _exit_now(EXIT_ABORTED, _NO_RUN_LINE)
        self.signum = signum
        self.deadline.arm(EXIT_ABORTED, ABORT_EXIT_DEADLINE_S, _DEADLINE_LINE)
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            # Thread-safe and wakes the selector: the event is set from the loop itself.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)


_installed: SignalAbort | None = None


def install_handlers() -> SignalAbort:
    """Take over SIGINT and SIGTERM now (idempotent): the run command calls this as soon as
    it knows it will run, so a signal during its start-up is not a traceback. Until a run is
    bound to its loop (and after it ended) a signal exits at once: nothing exists yet that an
    abort would have to stop."""
    global _installed
    if _installed is None:
        _installed = SignalAbort()
        _installed.install()
    return _installed


def run_interruptible(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``main(abort)`` to its exit code; a signal makes it ``EXIT_ABORTED`` (see module).

    Must be called from the main thread (signal handlers live there).
    """
    state = install_handlers()
    loop = asyncio.new_event_loop()
    # The loop's self-pipe is the wakeup fd: a signal wakes the selector even when it is
    # delivered to another thread of the process.
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(loop._csock.fileno())  # type: ignore[attr-defined]
    code = EXIT_ERROR  # what a run that raised exits with, should its exit hang
    try:
        abort = asyncio.Event()

        async def guarded() -> int:
            state.bind(asyncio.get_running_loop(), abort)
            return await main(abort)

        code = loop.run_until_complete(guarded())
        return EXIT_ABORTED if state.requested else code
    finally:
        state.unbind()
        state.deadline.arm(EXIT_ABORTED if state.requested else code, EXIT_GRACE_S, b"")
        try:
            _close_loop(loop)
        finally:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(-1)
            # The handlers stay: a signal during the interpreter's exit is a second signal
            # (exit at once) or a first one (exit within the deadline), never a traceback.


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left, then close; worker threads are not waited for (the exit deadline
    ends a process whose threads do not stop)."""
    try:
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=EXIT_GRACE_S))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
