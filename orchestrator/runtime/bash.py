"""``%%bash``: run a cell body in a throwaway bash, in its own process group.

- Output streams into the cell as it arrives (stdout to stdout, stderr to stderr), decoded as
  UTF-8 with invalid bytes replaced.
- A non-zero exit status raises ``BashExitError`` whose whole traceback is one line, so the
  model sees ``bash exited with status N`` and the cell's status is error.
- A kernel interrupt (KeyboardInterrupt) terminates the whole process group (SIGTERM, a short
  grace, then SIGKILL) before the interrupt propagates. The shell runs in its own session, so the
  SIGINT that jupyter sends to the kernel's process group never reaches it: we decide.
- The shell inherits the kernel's cwd and ``os.environ`` (``%cd`` and environment changes made
  in Python apply); nothing the shell does (``cd``, ``export``) flows back.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO

__all__ = ["BashExitError", "run_bash_cell"]

READ_CHUNK_BYTES = 64 * 1024
# How often the loop wakes to notice that bash exited while a background job still holds the
# pipes open (``server &``): we stop reading then instead of waiting for the job to end.
EXIT_POLL_INTERVAL_S = 0.05
# After bash exits, read at most this much more of what its background jobs already wrote.
DRAIN_AFTER_EXIT_MAX_BYTES = 1024 * 1024
KILL_GRACE_S = 1.0  # SIGTERM -> this long -> SIGKILL of the shell's process group
# Linux refuses a single argv string over 128 KiB (MAX_ARG_STRLEN); longer cells go via a file.
MAX_INLINE_SCRIPT_BYTES = 100 * 1024


class BashExitError(Exception):
    """bash exited with a non-zero status."""

    def __init__(self, status: int):
        super().__init__(f"bash exited with status {status}")
        self.status = status

    def _render_traceback_(self) -> list[str]:
        # IPython prints this instead of a Python traceback (nothing in it would help).
        return [f"BashExitError: bash exited with status {self.status}"]


def run_bash_cell(line: str, cell: str) -> None:
    options = shlex.split(line)
    script_file: str | None = None
    if len(cell.encode("utf-8", "surrogateescape")) > MAX_INLINE_SCRIPT_BYTES:
        fd, script_file = tempfile.mkstemp(prefix="prime-bash-", suffix=".sh")
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(cell)
        argv = ["bash", *options, script_file]
    else:
        argv = ["bash", *options, "-c", cell]
    try:
        status = _run(argv)
    finally:
        if script_file is not None:
            os.unlink(script_file)
    if status != 0:
        raise BashExitError(status)


def _run(argv: list[str]) -> int:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    sinks = {proc.stdout.fileno(): sys.stdout, proc.stderr.fileno(): sys.stderr}
    decoders: dict[int, codecs.IncrementalDecoder] = {
        fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in sinks
    }
    try:
        _pump(proc, sinks, decoders)
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    finally:
        for fd, sink in sinks.items():
            tail = decoders[fd].decode(b"", final=True)
            if tail:
                sink.write(tail)
            sink.flush()
        proc.stdout.close()
        proc.stderr.close()
    return proc.wait()


def _pump(
    proc: subprocess.Popen[bytes],
    sinks: dict[int, IO[str]],
    decoders: dict[int, codecs.IncrementalDecoder],
) -> None:
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            sel.register(fd, selectors.EVENT_READ)
        drained_after_exit = 0
        while sel.get_map():
            exited = proc.poll() is not None
            for key, _ in sel.select(0 if exited else EXIT_POLL_INTERVAL_S):
                fd = int(key.fd)
                data = os.read(fd, READ_CHUNK_BYTES)
                if not data:
                    sel.unregister(fd)
                    continue
                if exited:
                    drained_after_exit += len(data)
                sinks[fd].write(decoders[fd].decode(data))
                sinks[fd].flush()
            if exited and (drained_after_exit >= DRAIN_AFTER_EXIT_MAX_BYTES or not _ready(sel)):
                # bash is gone; a background job may hold the pipes open for ever.
                return


def _ready(sel: selectors.BaseSelector) -> bool:
    return bool(sel.get_map()) and bool(sel.select(0))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(EXIT_POLL_INTERVAL_S)
    # SIGKILL the group even if bash exited: its background jobs are members too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
