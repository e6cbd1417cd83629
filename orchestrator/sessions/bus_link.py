"""Wiring the bus into the orchestrator: one NATS server, its admin connection, the router.

Each session gets its own NATS user when it is created (its credentials go to its sandbox as
environment) and loses it when it stops. Host requests arrive at the router, which hands them
to ``FamilyService`` with the caller's session id taken from the subject.

``MailboxBus`` adds the durable mailboxes (``orchestrator/bus/mailbox.py``) on the admin
connection: both the print-mode bus and the daemon's bus keep agent messages in JetStream.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Final

from orchestrator.bus.mailbox import (
    MAILBOX_STREAM,
    MAILBOX_SUBJECT_PREFIX,
    Mailbox,
    MailboxMessage,
)
from orchestrator.bus.router import HostRouter
from orchestrator.bus.server import EmbeddedNats
from orchestrator.errors import BusError
from orchestrator.paths import Paths
from orchestrator.sessions.manager import SessionBus

log = logging.getLogger(__name__)

__all__ = ["REDELIVERY_TAKE_MAX", "MailboxBus", "NatsSessionBus"]

# Messages read from one mailbox at start-up. A live target holds at most MESSAGE_PENDING_MAX
# (20) queued; a mailbox can hold more only across several crashes, and the rest come at the
# next start.
REDELIVERY_TAKE_MAX: Final = 1000


class MailboxBus(SessionBus):
    """The mailbox half of a bus: call ``_open_mailbox(nc)`` once the admin client is up."""

    _mailbox: Mailbox | None = None
    _mailbox_nc: Any = None

    async def _open_mailbox(self, nc: Any) -> None:
        mailbox = Mailbox(nc)
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
        self._box()
        prefix = MAILBOX_SUBJECT_PREFIX + "."
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


class NatsSessionBus(MailboxBus):
    """An embedded nats-server with its admin connection, host-request router and mailboxes.

    Print mode (the default constructor) runs a server private to this process: it dies with
    the process and its directories are removed afterwards. The daemon's (``for_daemon``) is
    one named instance that outlives a daemon crash and is adopted by the next daemon, so the
    JetStream mailboxes (queued agent messages, R4) survive; a clean stop keeps its state files
    (users only, no session content).
    """

    def __init__(
        self,
        paths: Paths,
        *,
        instance: str | None = None,
        persistent: bool = False,
    ):
        # One instance per process unless named: two print-mode runs must not share (and kill)
        # a server.
        self.server = EmbeddedNats.from_paths(
            paths,
            instance=instance or f"run-{os.getpid()}",
            reuse=persistent,
            die_with_parent=not persistent,
        )
        self.persistent = persistent
        self.router: HostRouter | None = None
        self._nc: Any = None

    @classmethod
    def for_daemon(cls, paths: Paths, instance: str) -> NatsSessionBus:
        return cls(paths, instance=instance, persistent=True)

    async def start(self, handlers: dict[str, Any]) -> None:
        await self.server.start()
        if self.server.reused:
            log.info("adopted the NATS server left by a previous daemon (pid %d)", self.server.pid)
        self._nc = await self.server.admin.connect()
        # An adopted server still holds the messages a crashed daemon had accepted; the daemon
        # redelivers them at start. Print mode has no redelivery, but the same put/ack path
        # keeps one code path for agent messages.
        await self._open_mailbox(self._nc)
        self.router = HostRouter(self._nc)
        for request_type, handler in handlers.items():
            self.router.register(request_type, handler)
        await self.router.start()

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        return (await self.server.add_session_user(session_id)).env()

    async def forget(self, session_id: str) -> None:
        await self.server.remove_session_user(session_id)

    async def close(self) -> None:
        """Stop routing and stop the server (a clean shutdown leaves no nats-server, R8)."""
        if self.router is not None:
            with contextlib.suppress(Exception):
                await self.router.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
        with contextlib.suppress(Exception):
            await self.server.stop()
        if not self.persistent:
            # A per-run server's JetStream store holds nothing that outlives the run.
            shutil.rmtree(self.server.store_dir, ignore_errors=True)
            shutil.rmtree(self.server.runtime_dir, ignore_errors=True)
