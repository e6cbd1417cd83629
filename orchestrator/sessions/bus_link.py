"""Wiring the bus into the orchestrator: one NATS server, its admin connection, the router.

Each session gets its own NATS user when it is created (its credentials go to its sandbox as
environment) and loses it when it stops. Host requests arrive at the router, which hands them
to ``FamilyService`` with the caller's session id taken from the subject.

``MailboxBus`` adds the durable mailboxes (``orchestrator/bus/mailbox.py``) on the admin
connection: both the print-mode bus and the daemon's bus keep agent messages in JetStream.

With ``[nats] url`` (or ``--nats-url``) the server is an external one in operator mode
(``orchestrator/bus/external.py``): nothing is started, session users are minted JWTs, and,
because other orchestrators may share that server, the router listens per session and the
mailboxes live under this orchestrator's own namespace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Final

from orchestrator.bus.credentials import write_private_file
from orchestrator.bus.external import DecentralizedNats
from orchestrator.bus.mailbox import (
    MAILBOX_STREAM,
    Mailbox,
    MailboxMessage,
)
from orchestrator.bus.router import HostRouter
from orchestrator.bus.server import BusServer, EmbeddedNats
from orchestrator.errors import BusError
from orchestrator.ids import SESSION_ID_RE
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.settings import NatsSettings

log = logging.getLogger(__name__)

__all__ = ["REDELIVERY_TAKE_MAX", "MailboxBus", "NatsSessionBus"]

# Messages read from one mailbox at start-up. A live target holds at most MESSAGE_PENDING_MAX
# (20) queued; a mailbox can hold more only across several crashes, and the rest come at the
# next start.
REDELIVERY_TAKE_MAX: Final = 1000
# External server: this orchestrator's mailbox namespace. A print-mode run takes a new one; the
# daemon keeps one in its data dir, so a restarted daemon finds its messages (R4).
NAMESPACE_BYTES: Final = 8
NAMESPACE_FILE: Final = "mailbox-namespace"
# The daemon's routed sessions on an external server: a restarted daemon listens for them again
# at once, so sandboxes it adopts (their JWTs still valid) reach it without new credentials.
ROUTED_FILE: Final = "routed-sessions.json"
EXTERNAL_SUBDIR: Final = "nats-external"


class MailboxBus:
    """The mailbox half of a ``SessionBus`` (``sessions/session_bus.py``): call
    ``_open_mailbox(nc)`` once the admin client is up."""

    _mailbox: Mailbox | None = None
    _mailbox_nc: Any = None

    async def _open_mailbox(self, nc: Any, namespace: str | None = None) -> None:
        mailbox = Mailbox(nc, namespace=namespace)
        await mailbox.ensure_stream()
        self._mailbox_nc = nc
        self._mailbox = mailbox
        # message id -> stream sequence, from put and take: an ack deletes by sequence.
        self._seqs: dict[tuple[str, str], int] = {}

    def _box(self) -> Mailbox:
        if self._mailbox is None:
            raise BusError("the mailbox is not open")
        return self._mailbox

    async def put_message(self, session_id: str, message: dict[str, Any]) -> None:
        seq = await self._box().put(session_id, message)
        self._seqs[(session_id, str(message["id"]))] = seq

    async def pending_messages(self, session_id: str) -> list[dict[str, Any]]:
        taken = await self._box().take(session_id, max=REDELIVERY_TAKE_MAX)
        for message in taken:
            self._seqs[(session_id, message.message_id)] = message.seq
        return [{**message.data, "id": message.message_id} for message in taken]

    async def ack_message(self, session_id: str, message_id: str) -> None:
        seq = self._seqs.pop((session_id, message_id), None)
        if seq is None:  # not put or taken by this process: look it up
            found = [
                m
                for m in await self._box().take(session_id, max=REDELIVERY_TAKE_MAX)
                if m.message_id == message_id
            ]
            if not found:
                return
            seq = found[0].seq
        await self._box().ack(MailboxMessage(session_id, seq, message_id, {}))

    async def sessions_with_messages(self) -> list[str]:
        prefix = self._box().prefix + "."
        try:
            info = await self._mailbox_nc.jsm().stream_info(
                MAILBOX_STREAM, subjects_filter=prefix + "*"
            )
        except Exception as exc:
            raise BusError(f"cannot list the mailboxes: {exc}") from exc
        subjects = info.state.subjects or {}
        return sorted(s.removeprefix(prefix) for s, count in subjects.items() if count)

    async def purge_messages(self, session_id: str) -> None:
        await self._box().purge(session_id)
        for key in [k for k in self._seqs if k[0] == session_id]:
            del self._seqs[key]


def _daemon_namespace(directory: Path, instance: str) -> str:
    """The daemon's mailbox namespace on an external server, kept across restarts."""
    path = directory / NAMESPACE_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        namespace = f"{instance}-{secrets.token_hex(NAMESPACE_BYTES)}"
        write_private_file(path, namespace.encode("ascii"))
        return namespace


class NatsSessionBus(MailboxBus):
    """A NATS server with its admin connection, host-request router and mailboxes.

    Embedded server: print mode (the default constructor) runs a server private to this
    process: it dies with the process and its directories are removed afterwards. The daemon's
    (``for_daemon``) is one named instance that outlives a daemon crash and is adopted by the
    next daemon, so the JetStream mailboxes (queued agent messages, R4) survive; a clean stop
    keeps its state files (users only, no session content).

    External server (``nats`` settings with a ``url``): started by someone else, shared, kept.
    A print-mode run purges its mailbox namespace at close; the daemon's namespace persists.
    """

    def __init__(
        self,
        paths: Paths,
        *,
        instance: str | None = None,
        persistent: bool = False,
        nats: NatsSettings | None = None,
    ):
        self.persistent = persistent
        self.router: HostRouter | None = None
        self._nc: Any = None
        self.embedded: EmbeddedNats | None = None
        self.namespace: str | None = None
        self._routed_path: Path | None = None  # the daemon's, on an external server
        self._routed: set[str] = set()
        self.server: BusServer
        if nats is not None and nats.url:
            self.server = DecentralizedNats.from_settings(nats)
            if persistent and instance:
                directory = ensure_private_dir(paths.data_dir / EXTERNAL_SUBDIR / instance)
                self.namespace = _daemon_namespace(directory, instance)
                self._routed_path = directory / ROUTED_FILE
            else:
                self.namespace = f"run-{secrets.token_hex(NAMESPACE_BYTES)}"
        else:
            # One instance per process unless named: two print-mode runs must not share (and
            # kill) a server.
            self.embedded = EmbeddedNats.from_paths(
                paths,
                instance=instance or f"run-{os.getpid()}",
                reuse=persistent,
                die_with_parent=not persistent,
            )
            self.server = self.embedded

    @classmethod
    def for_daemon(
        cls, paths: Paths, instance: str, nats: NatsSettings | None = None
    ) -> NatsSessionBus:
        return cls(paths, instance=instance, persistent=True, nats=nats)

    @property
    def external(self) -> bool:
        return self.embedded is None

    async def start(self, handlers: dict[str, Any]) -> None:
        await self.server.start()
        if self.embedded is not None and self.embedded.reused:
            log.info(
                "adopted the NATS server left by a previous daemon (pid %d)", self.embedded.pid
            )
        self._nc = await self.server.admin.connect()
        # An adopted server still holds the messages a crashed daemon had accepted; the daemon
        # redelivers them at start. Print mode has no redelivery, but the same put/ack path
        # keeps one code path for agent messages.
        await self._open_mailbox(self._nc, self.namespace)
        # A shared (external) server carries other orchestrators' sessions too: answer only
        # our own, each subscribed before its credentials exist.
        self.router = HostRouter(self._nc, per_session=self.external)
        for request_type, handler in handlers.items():
            self.router.register(request_type, handler)
        await self.router.start()
        self._routed = self._load_routed()
        for session_id in sorted(self._routed):
            await self.router.add_session(session_id)

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        if self.external:
            if self.router is None:
                raise BusError("the bus is not started")
            await self.router.add_session(session_id)
            if session_id not in self._routed:
                self._routed.add(session_id)
                self._save_routed()
        return (await self.server.add_session_user(session_id)).env()

    async def forget(self, session_id: str) -> None:
        if self.router is not None:
            await self.router.remove_session(session_id)
        if session_id in self._routed:
            self._routed.discard(session_id)
            self._save_routed()
        await self.server.remove_session_user(session_id)

    def _load_routed(self) -> set[str]:
        if self._routed_path is None:
            return set()
        try:
            data = json.loads(self._routed_path.read_bytes())
            return {str(sid) for sid in data if SESSION_ID_RE.match(str(sid))}
        except FileNotFoundError:
            return set()
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", self._routed_path, exc)
            return set()

    def _save_routed(self) -> None:
        if self._routed_path is None:
            return
        try:
            write_private_file(self._routed_path, json.dumps(sorted(self._routed)).encode())
        except OSError as exc:
            raise BusError(f"cannot write {self._routed_path}: {exc}") from exc

    async def close(self) -> None:
        """Stop routing and stop the server (a clean shutdown leaves no nats-server, R8)."""
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.close()
        if self.external and not self.persistent and self._mailbox is not None:
            # A print-mode run's mailboxes hold nothing that outlives the run.
            with contextlib.suppress(Exception):
                await self._mailbox.purge_namespace()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        with contextlib.suppress(Exception):
            await self.server.stop()
        if self.embedded is not None and not self.persistent:
            # A per-run server's JetStream store holds nothing that outlives the run.
            shutil.rmtree(self.embedded.store_dir, ignore_errors=True)
            shutil.rmtree(self.embedded.runtime_dir, ignore_errors=True)
