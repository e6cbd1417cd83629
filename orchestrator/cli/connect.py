"""How CLI commands reach the daemon: find it, start it on first use, talk to it.

One daemon per user (``orchestrator/cli/daemon.py`` starts it; its socket lock keeps it one).
Commands that need one — ``agents``, ``usage``, ``attach``, ``send``, ``observe``, ``--resume``,
``--continue`` — start it when none answers, unless autostart is off: ``[daemon] autostart =
false`` in config.toml, or ``PRIME_AGENT_DAEMON_AUTOSTART=0`` (the environment wins). With
autostart off, ``agents`` and ``usage`` read the database themselves and the others say how to
start the daemon. Print mode (``-p``, ``--mode json``) uses a daemon that runs and otherwise
runs in-process (docs/cli.md says why).

Mutating commands sent with ``DaemonLink.mutate`` survive a lost connection: the link reconnects
with the same client id and resends the same command id, and the daemon's idempotency journal
(persisted across restarts, docs/protocol.md) answers with the stored result instead of running
it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, Final

from orchestrator.api.client import ControlClient
from orchestrator.api.errors import ApiCommandError, ConnectionClosed, DaemonNotRunning
from orchestrator.api.wire import E_INVALID_COMMAND
from orchestrator.cli.autostart import AUTOSTART_ENV, DAEMON_CONNECT_TIMEOUT_S
from orchestrator.errors import DaemonRefused, UserError

__all__ = [
    "AUTOSTART_ENV",
    "DaemonLink",
    "autostart_enabled",
    "daemon_error",
    "ensure_daemon",
    "require_daemon",
]

_TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS: Final = frozenset({"0", "false", "no", "off"})
# A mutating command whose connection dropped is resent this many times (same command id).
MUTATE_RETRIES: Final = 1


def autostart_enabled() -> bool:
    """``PRIME_AGENT_DAEMON_AUTOSTART`` when set, else ``[daemon] autostart`` (default on)."""
    raw = os.environ.get(AUTOSTART_ENV, "").strip().lower()
    if raw in _TRUE_WORDS:
        return True
    if raw in _FALSE_WORDS:
        return False
    if raw:
        raise UserError(f"{AUTOSTART_ENV}={raw!r} is not a switch; use 1 or 0")
    from orchestrator.paths import Paths
    from orchestrator.settings import load_settings

    return load_settings(Paths.from_env().config_file).daemon.autostart


def ensure_daemon(*, autostart: bool | None = None) -> bool:
    """True when a daemon answers, starting one first if allowed (synchronous code only)."""
    from orchestrator.cli.autostart import announce_started, daemon_info, start_daemon

    if daemon_info() is not None:
        return True
    if not (autostart_enabled() if autostart is None else autostart):
        return False
    announce_started(*start_daemon())
    return True


def require_daemon(what: str) -> None:
    """Make sure a daemon answers, or fail with one line saying how to get one."""
    if not ensure_daemon():
        raise UserError(
            f"{what} needs the daemon and none is running (autostart is off: {AUTOSTART_ENV} "
            "or [daemon] autostart in config.toml); start it with: prime-agent daemon start"
        )


def daemon_error(exc: ApiCommandError) -> UserError:
    """A daemon's refusal as a one-line user error (with a hint when it is an older daemon)."""
    if exc.code == E_INVALID_COMMAND:
        return DaemonRefused(
            f"{exc} (the daemon may be older than this prime-agent: restart it with "
            "prime-agent daemon stop)",
            exc.code,
        )
    return DaemonRefused(str(exc), exc.code)


class DaemonLink:
    """A connection to the daemon for one CLI command: ``async with DaemonLink() as link``."""

    def __init__(self) -> None:
        self._client: ControlClient | None = None
        self._client_id: str | None = None  # kept across reconnects

    async def __aenter__(self) -> DaemonLink:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def client(self) -> ControlClient:
        if self._client is None:
            raise ConnectionClosed("not connected to the daemon")
        return self._client

    async def connect(self, client_id: str | None = None) -> ControlClient:
        try:
            self._client = await ControlClient.connect(
                client_id=client_id, timeout=DAEMON_CONNECT_TIMEOUT_S
            )
        except DaemonNotRunning as exc:
            raise UserError(str(exc)) from None
        return self._client

    async def reconnect(self) -> ControlClient:
        """A new connection with the same client id (one try; the daemon may be restarting):
        ``UserError`` when none answers."""
        client_id = self._client.client_id if self._client is not None else self._client_id
        self._client_id = client_id
        await self.close()
        return await self.connect(client_id)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def call(self, command_type: str, /, **fields: Any) -> Any:
        """A command; the daemon's refusal becomes a one-line ``UserError``."""
        try:
            return await self.client.call(command_type, **fields)
        except ApiCommandError as exc:
            raise daemon_error(exc) from None

    async def mutate(self, command_type: str, /, **fields: Any) -> Any:
        """A mutating command, resent with the same ids after a lost connection (the journal
        answers a repeat with the stored result, even across a daemon restart)."""
        client_id = self.client.client_id
        command_id = self.client.new_command_id()
        for attempt in range(MUTATE_RETRIES + 1):
            try:
                return await self.client.call(command_type, command_id=command_id, **fields)
            except ApiCommandError as exc:
                raise daemon_error(exc) from None
            except ConnectionClosed:
                if attempt == MUTATE_RETRIES:
                    raise
            await self.close()
            await asyncio.to_thread(ensure_daemon)
            await self.connect(client_id)
        raise AssertionError("unreachable")  # pragma: no cover
