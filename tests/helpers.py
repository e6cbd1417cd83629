"""Helpers shared by integration and e2e tests (not fixtures: plain functions)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

__all__ = [
    "CliRun",
    "cli",
    "daemon_pids",
    "descendant_pids",
    "kill_process_tree",
    "need",
    "pids_alive",
    "pod_gateway",
    "stop_daemons",
    "wait_until",
    "write_config",
]

CLI_TIMEOUT_S = 120.0
# CI sets this to "true" (GitHub Actions, GitLab, .ci/run's machines): there a missing real part
# (Docker, bubblewrap) fails its tests, so a green run never means "skipped".
CI_ENV = "CI"
CI_VALUE = "true"
# A daemon's clean stop (SIGTERM) ends its sessions, sandboxes and NATS; past this, SIGKILL.
DAEMON_STOP_GRACE_S = 30.0


def cli(
    args: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = CLI_TIMEOUT_S,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``prime-agent ARGS`` as a real subprocess with the test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        cwd=cwd,
        check=False,
    )


def need(what: str, why: str) -> NoReturn:
    """A test needs ``what`` (``docker``, ``bwrap``) and it is missing for ``why``: skip, or,
    with ``CI=true``, fail, because CI must run it (the skip summary, ``-ra``, lists skips)."""
    __tracebackhide__ = True  # the summary names the test's line, not this one
    if os.environ.get(CI_ENV) == CI_VALUE:
        pytest.fail(f"{what} is missing and {CI_ENV}={CI_VALUE} runs every test: {why}")
    pytest.skip(f"{what}: {why}")


def write_config(text: str) -> Path:
    path = Path(os.environ["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def wait_until(predicate: object, *, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or the deadline: for facts with no event to wait on
    (a process disappearing from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


def pids_alive(pids: Sequence[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def threads_alive(pid: int) -> list[int]:
    """The threads of ``pid`` that are not zombies yet."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
    alive = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(tid)
        except (OSError, IndexError):
            continue
    return alive


def kill_9(pid: int, timeout: float) -> None:
    """SIGKILL, then wait for every thread: the main thread can be a zombie while another
    (the store's writer in an fsync) still exits and holds the database's lock."""
    import signal

    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not threads_alive(pid), timeout=timeout), f"pid {pid} lingers"


def descendant_pids(root: int) -> list[int]:
    """All processes whose parent chain reaches ``root`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    out: list[int] = []
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == current:
                out.append(pid)
                frontier.append(pid)
    return out


def _argv(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return None


def daemon_pids(runtime_dir: str | None = None) -> list[int]:
    """Daemons serving ``runtime_dir`` (default: this test's ``XDG_RUNTIME_DIR``); other tests
    may run their own."""
    ours = (runtime_dir or os.environ["XDG_RUNTIME_DIR"]).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _argv(int(entry))
        if not argv or b"orchestrator.daemon" not in argv:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if b"XDG_RUNTIME_DIR=" + ours in env:
            found.append(int(entry))
    return pids_alive(found)


def stop_daemons(runtime_dir: str) -> list[int]:
    """Stop every daemon a test left in ``runtime_dir`` (SIGTERM: its clean stop; SIGKILL after
    ``DAEMON_STOP_GRACE_S``), then any nats-server a killed one left there. The pids stopped."""
    import signal

    pids = daemon_pids(runtime_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not wait_until(lambda: not pids_alive(pids), timeout=DAEMON_STOP_GRACE_S):
        for pid in pids_alive(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    marker = runtime_dir.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _argv(int(entry))
        if argv and b"nats-server" in argv[0] and any(marker in arg for arg in argv):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGTERM)
    # A killed daemon's sandboxes outlive it (the next daemon would adopt them): their gateways
    # carry its socket, under runtime_dir, in their environment (local.OWNER_ENV). SIGTERM to
    # the gateway's group: it stops its kernel and sweeps the rest itself.
    owner = b"PRIME_AGENT_SANDBOX_OWNER=" + marker
    for entry in os.listdir("/proc"):
        argv = _argv(int(entry)) if entry.isdigit() else None
        if not argv or b"orchestrator.sandbox.gateway_main" not in argv:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if not any(var.startswith(owner) for var in fh.read().split(b"\0")):
                    continue
        except OSError:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(entry), signal.SIGTERM)
    return pids


def kill_process_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and every process below it (a failing test leaves nothing behind)."""
    import signal

    below = descendant_pids(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=DAEMON_STOP_GRACE_S)


class CliRun:
    """``prime-agent ARGS`` in the background: stdout lines (JSON ones parsed) and stderr are
    collected on threads. ``kill()`` (what a test's fixture calls at teardown) ends it and
    everything it started."""

    def __init__(self, args: Sequence[str], *, cwd: Path | None = None):
        import json
        import threading

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
            cwd=cwd,
        )
        self.out: list[str] = []
        self.events: list[dict[str, object]] = []
        self.err: list[str] = []

        def read_out() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.out.append(line)
                with contextlib.suppress(ValueError):
                    parsed = json.loads(line)
                    if isinstance(parsed, dict):
                        self.events.append(parsed)

        def read_err() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.err.append(line)

        self._readers = [
            threading.Thread(target=read_out, daemon=True),
            threading.Thread(target=read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def event(self, type_: str, timeout: float) -> dict[str, object] | None:
        """The first JSON line of ``type_`` (waiting up to ``timeout``), or None."""
        found: list[dict[str, object]] = []

        def seen() -> bool:
            found[:] = [e for e in list(self.events) if e.get("type") == type_]
            return bool(found) or self.proc.poll() is not None

        wait_until(seen, timeout=timeout)
        return found[0] if found else None

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it is still running after ``timeout``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for reader in self._readers:
            reader.join(timeout=timeout)
        return code

    def kill(self) -> None:
        kill_process_tree(self.proc)


def container_stopped(docker: Any, container_id: str) -> bool:
    """The engine no longer reports the container running (killed, exited, or removed): the
    condition a test waits for after killing one, instead of a fixed sleep."""
    try:
        return str(docker.containers.get(container_id).status) != "running"
    except Exception:  # docker.errors.NotFound: gone is stopped (the SDK is imported lazily)
        return True


def call_worker_pids(daemon_pid: int) -> list[int]:
    """The model-call worker processes a daemon started (its children running the module)."""
    from orchestrator.models.call_workers import WORKER_MODULE
    from orchestrator.sandbox.proctree import children

    found = []
    for child in children(daemon_pid):
        try:
            argv = Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if WORKER_MODULE.encode() in argv and child.state != "Z":
            found.append(child.pid)
    return found


# What a scripted-model test's config.toml says: fail fast on a dead endpoint.
FAST_FAIL_CONFIG = "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"


@contextlib.contextmanager
def model_behind_a_daemon(monkeypatch: pytest.MonkeyPatch, script: str) -> Iterator[Any]:
    """The scripted model serving ``script``, with the daemon started on first use by whatever
    the test runs (autostart on) and stopped afterwards."""
    from orchestrator.testing import FakeModelServer

    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    write_config(FAST_FAIL_CONFIG)
    with FakeModelServer(script) as srv:
        try:
            yield srv
        finally:
            stop_daemons(os.environ["XDG_RUNTIME_DIR"])


GATEWAY_STOP_TIMEOUT_S = 10.0


@contextlib.contextmanager
def pod_gateway(workdir: Path, token_file: Path, *extra: str) -> Iterator[str]:
    """A gateway process started as a session pod's command starts it (its token only in
    ``token_file``, a TCP port; ``extra``: more arguments such as ``--files-root``), minus the
    pod: its base URL until the block ends."""
    import json

    from orchestrator.sandbox.gateway_main import TOKEN_ENV
    from orchestrator.sandbox.local import gateway_env

    env = gateway_env("unused")
    del env[TOKEN_ENV]  # only the file holds it
    argv = [
        sys.executable, "-P", "-m", "orchestrator.sandbox.gateway_main",
        "--runtime-dir", str(workdir / "runtime"), "--port", "0",
        "--token-file", str(token_file), *extra,
    ]  # fmt: skip
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, cwd=workdir)
    try:
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())
        yield f"http://127.0.0.1:{ready['port']}"
    finally:
        child.terminate()
        child.wait(timeout=GATEWAY_STOP_TIMEOUT_S)
