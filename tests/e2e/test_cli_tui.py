"""``prime-agent`` with no task on a terminal opens the TUI (starting the daemon first); quitting
it leaves the daemon and its sessions running. Driven through a real pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from orchestrator.testing import FakeModelServer
from tests.helpers import cli, write_config

ROWS, COLS = 30, 100
# Bounds, not expectations: the first start imports litellm and starts a daemon.
SCREEN_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 30.0
READ_CHUNK = 65536
CTRL_Q = b"\x11"


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """Terminal output until ``needle`` appears (or fail with what was seen)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{needle!r} never appeared; saw {seen[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, READ_CHUNK)
            except OSError:  # the child closed the terminal
                break
    return seen


def _spawn(args: list[str], cwd: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``prime-agent ARGS`` on a new pseudo-terminal (autostart on): the process and the
    terminal's master side."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", PRIME_AGENT_DAEMON_AUTOSTART="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


@pytest.fixture
def model() -> object:
    srv = FakeModelServer("text: hello from the model\n").start()
    write_config(f'default_model = "openai/fake"\n[models."openai/fake"]\napi_base = "{srv.url}"\n')
    yield srv
    srv.close()


def test_no_task_on_a_terminal_opens_the_tui_and_quitting_detaches(
    tmp_path: Path, model: object
) -> None:
    proc, master = _spawn([], tmp_path)
    try:
        seen = _read_until(master, b"new chat", SCREEN_TIMEOUT_S)
        assert b"Traceback" not in seen
        os.write(master, CTRL_Q)
        assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    # The daemon it started is still there after the TUI quit.
    status = cli(["daemon", "status"])
    assert status.returncode == 0, status.stderr


def _run_in_pty(args: list[str], cwd: Path, until: bytes) -> tuple[int, bytes]:
    """``prime-agent ARGS`` on a pseudo-terminal until it printed ``until``, then to its end:
    (exit code, what it printed)."""
    proc, master = _spawn(args, cwd)
    try:
        seen = _read_until(master, until, SCREEN_TIMEOUT_S)
        code = proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, seen


def test_tui_on_an_unknown_session_fails_in_one_line(tmp_path: Path, model: object) -> None:
    said = b"no session matches 'no-such-session'"
    code, seen = _run_in_pty(["tui", "no-such-session"], tmp_path, said)
    assert code == 2 and b"Traceback" not in seen


def test_tui_without_a_terminal_says_so_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "tui"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=EXIT_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "needs a terminal" in proc.stderr
    assert proc.stdout == ""
