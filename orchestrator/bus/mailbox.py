"""Durable per-session mailboxes in JetStream, host side (admin only).

One file-backed stream, ``PA_MAILBOX``, holds every session's pending agent messages on
``pa.mbox.<session_id>`` (work-queue retention: a message lives until it is taken and acked).
Kernels never touch it: the orchestrator puts a message when it accepts an
``agent_message.send``, and takes the recipient's messages when it can deliver them into that
session's context.

Guarantee: at-least-once, across orchestrator crashes and nats-server restarts.

- ``put`` publishes with ``Nats-Msg-Id`` = the message id, so a retried put inside the stream's
  duplicate window is stored once (JetStream de-duplication) and returns the first sequence.
- ``take`` reads the session's pending messages in order WITHOUT removing them; ``ack`` removes
  them. The caller records messages durably (its store), then acks. A crash between the two
  leaves them in the mailbox, so the next ``take`` returns them again and the caller drops the
  ones it already has by message id: exactly-once entry is the caller's job.

Namespaces: on a server several orchestrators share (an external server, ``--nats-url``), each
keeps its mailboxes under its own ``pa.mbox.<namespace>.<session_id>`` in the one stream (whose
subjects are then ``pa.mbox.>``), so one orchestrator's listing and purges never touch another's
messages, and the account reserves storage for one stream only.

Why reads by subject instead of a durable pull consumer per session: a consumer redelivers an
un-acked message only after its ack-wait expires, so an orchestrator restarting after a crash
would wait that long for its own in-flight messages, and every session would carry consumer
state on the server. Reading the stream by subject returns un-acked messages immediately on the
next ``take``, and deleting by sequence is the ack. One taker per session is assumed (the
orchestrator that owns the session); concurrent takers would see the same messages, which the
caller's de-duplication absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from orchestrator.errors import BusError
from orchestrator.ids import SESSION_ID_RE

__all__ = [
    "MAILBOX_DUPLICATE_WINDOW_S",
    "MAILBOX_MAX_BYTES",
    "MAILBOX_MAX_MESSAGE_BYTES",
    "MAILBOX_STREAM",
    "MAILBOX_SUBJECT_PREFIX",
    "TAKE_DEFAULT_MAX",
    "Mailbox",
    "MailboxMessage",
    "mailbox_prefix",
    "mailbox_subject",
]

log = logging.getLogger(__name__)

MAILBOX_STREAM = "PA_MAILBOX"
MAILBOX_SUBJECT_PREFIX = "pa.mbox"
# docs/spec.md §3: 16 KiB of text per message (MESSAGE_MAX_BYTES), plus its envelope.
MAILBOX_MAX_MESSAGE_BYTES = 64 * 1024
MAILBOX_MAX_BYTES = 256 * 1024 * 1024  # the whole stream; beyond it new puts are refused
MAILBOX_DUPLICATE_WINDOW_S = 120.0  # a put retried within this is stored once
MESSAGE_ID_MAX_CHARS = 128
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # one subject token
TAKE_DEFAULT_MAX = 100
JS_API_TIMEOUT_S = 5.0
MSG_ID_HEADER = "Nats-Msg-Id"
_STREAM_IN_USE = 10058  # JetStream err_code: stream name in use with a different configuration
_NO_MESSAGE = "no message found"  # JetStream description when a sequence is already gone
_STATUS_END_OF_BATCH = "204"  # direct get: the batch is complete
_STATUS_NOT_FOUND = "404"  # direct get: nothing pending
# Batched direct get (ADR-31) arrived in nats-server 2.11; older servers get one request each.
BATCH_GET_MIN_SERVER = (2, 11)


def mailbox_prefix(namespace: str | None = None) -> str:
    """``pa.mbox``, or ``pa.mbox.<namespace>`` for an orchestrator sharing its server."""
    if namespace is None:
        return MAILBOX_SUBJECT_PREFIX
    if not isinstance(namespace, str) or not NAMESPACE_RE.match(namespace):
        raise ValueError(f"bad mailbox namespace {str(namespace)[:80]!r}")
    return f"{MAILBOX_SUBJECT_PREFIX}.{namespace}"


def mailbox_subject(session_id: str, namespace: str | None = None) -> str:
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise ValueError(f"not a session id: {str(session_id)[:80]!r}")
    return f"{mailbox_prefix(namespace)}.{session_id}"


@dataclass(frozen=True)
class MailboxMessage:
    session_id: str
    seq: int  # stream sequence: increases with put order; what ``ack`` removes
    message_id: str
    data: dict[str, Any]


_Raw = tuple[int, bytes, Mapping[str, str]]  # (sequence, payload, headers) as read from the stream


class Mailbox:
    """Session mailboxes over an admin NATS connection owned by the caller."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        stream: str = MAILBOX_STREAM,
        namespace: str | None = None,
        timeout_s: float = JS_API_TIMEOUT_S,
        duplicate_window_s: float = MAILBOX_DUPLICATE_WINDOW_S,
    ) -> None:
        self.namespace = namespace
        self.prefix = mailbox_prefix(namespace)
        self._nc = nc
        self._js = nc.jetstream(timeout=timeout_s)
        self._jsm = nc.jsm(timeout=timeout_s)
        self._stream = stream
        self._timeout_s = timeout_s
        self._duplicate_window_s = duplicate_window_s

    async def ensure_stream(self) -> None:
        """Create the stream, or bring an existing one to this configuration (idempotent)."""
        config = StreamConfig(
            name=self._stream,
            # Namespaced mailboxes share the stream: pa.mbox.<namespace>.<session_id>.
            subjects=[f"{MAILBOX_SUBJECT_PREFIX}.{'*' if self.namespace is None else '>'}"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            discard=DiscardPolicy.NEW,
            max_bytes=MAILBOX_MAX_BYTES,
            max_msg_size=MAILBOX_MAX_MESSAGE_BYTES,
            duplicate_window=self._duplicate_window_s,
            num_replicas=1,
            allow_direct=True,  # take() reads with batched direct gets
        )
        try:
            try:
                await self._jsm.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != _STREAM_IN_USE:
                    raise
                await self._jsm.update_stream(config)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot create the mailbox stream {self._stream}: {exc}") from exc

    async def put(self, session_id: str, message: Mapping[str, Any]) -> int:
        """Store ``message`` (a JSON object with a string ``id``) for ``session_id``; returns
        its stream sequence (the first one's, if this id was put before within the window)."""
        subject = mailbox_subject(session_id, self.namespace)
        message_id = message.get("id")
        if (
            not isinstance(message_id, str)
            or not message_id
            or len(message_id) > MESSAGE_ID_MAX_CHARS
            or not message_id.isprintable()
        ):
            raise ValueError("a mailbox message needs a printable string 'id'")
        try:
            payload = json.dumps(dict(message), separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"mailbox message is not JSON: {exc}") from exc
        if len(payload) > MAILBOX_MAX_MESSAGE_BYTES:
            raise ValueError(
                f"mailbox message of {len(payload)} bytes exceeds {MAILBOX_MAX_MESSAGE_BYTES}"
            )
        try:
            ack = await self._js.publish(
                subject,
                payload,
                timeout=self._timeout_s,
                stream=self._stream,
                headers={MSG_ID_HEADER: message_id},
            )
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot store a message for {session_id}: {exc}") from exc
        return int(ack.seq)

    async def take(self, session_id: str, *, max: int = TAKE_DEFAULT_MAX) -> list[MailboxMessage]:
        """Up to ``max`` pending messages for ``session_id``, oldest first, left in place until
        ``ack``. Returns [] when there are none."""
        subject = mailbox_subject(session_id, self.namespace)
        if max < 1:
            raise ValueError("max must be at least 1")
        try:
            if self._batch_get_supported():
                raws = await self._batch_get(subject, max)
            else:
                raws = await self._get_one_by_one(subject, max)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot read the mailbox of {session_id}: {exc}") from exc
        out: list[MailboxMessage] = []
        for seq, data, headers in raws:
            message = self._decode(session_id, seq, data, headers)
            if message is None:
                await self._delete(seq)  # poison: never deliverable, must not wedge the box
                continue
            out.append(message)
        return out

    def _batch_get_supported(self) -> bool:
        version = self._nc.connected_server_version
        return (version.major, version.minor) >= BATCH_GET_MIN_SERVER

    async def _batch_get(self, subject: str, max: int) -> list[_Raw]:
        # One direct-get request answered by a run of messages and an end-of-batch status:
        # ~1 ms for 20 messages where one JetStream API request per message takes ~0.5 ms each.
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox)
        out: list[_Raw] = []
        try:
            request = {"seq": 1, "next_by_subj": subject, "batch": max}
            await self._nc.publish(
                f"$JS.API.DIRECT.GET.{self._stream}", json.dumps(request).encode(), reply=inbox
            )
            async with asyncio.timeout(self._timeout_s):
                while True:
                    msg = await sub.next_msg(timeout=None)
                    headers = msg.headers or {}
                    status = headers.get("Status")
                    if status in (_STATUS_END_OF_BATCH, _STATUS_NOT_FOUND):
                        return out
                    if status:
                        raise BusError(
                            f"direct get failed: {status} {headers.get('Description', '')}"
                        )
                    out.append((int(headers["Nats-Sequence"]), msg.data, headers))
        except TimeoutError:
            raise BusError(f"direct get timed out after {self._timeout_s:g} s") from None
        except (KeyError, ValueError) as exc:
            raise BusError(f"direct get returned a malformed message: {exc}") from exc
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _get_one_by_one(self, subject: str, max: int) -> list[_Raw]:
        """For servers before batch direct get: one JetStream API request per message."""
        out: list[_Raw] = []
        seq = 1
        while len(out) < max:
            try:
                raw = await self._jsm.get_msg(self._stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            if raw.seq is None:
                break
            seq = raw.seq + 1
            out.append((raw.seq, raw.data or b"", raw.headers or {}))
        return out

    def _decode(
        self, session_id: str, seq: int, data: bytes, headers: Mapping[str, str]
    ) -> MailboxMessage | None:
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            log.error("dropping undecodable mailbox message %s seq %d: %s", session_id, seq, exc)
            return None
        message_id = str(headers.get(MSG_ID_HEADER) or body.get("id") or "")
        return MailboxMessage(session_id=session_id, seq=seq, message_id=message_id, data=body)

    async def ack(self, messages: MailboxMessage | Iterable[MailboxMessage]) -> None:
        """Remove messages the caller has recorded (any subset). Acking twice is harmless."""
        if isinstance(messages, MailboxMessage):
            messages = [messages]
        for message in messages:
            await self._delete(message.seq)

    async def ack_through(self, session_id: str, seq: int) -> None:
        """Remove every message for ``session_id`` up to and including ``seq`` in one request:
        the usual ack after recording a whole ``take`` in order."""
        subject = mailbox_subject(session_id, self.namespace)
        try:
            await self._jsm.purge_stream(self._stream, seq=seq + 1, subject=subject)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot acknowledge the mailbox of {session_id}: {exc}") from exc

    async def _delete(self, seq: int) -> None:
        # no_erase: a plain delete; overwriting the bytes on disk buys nothing here.
        request = json.dumps({"seq": seq, "no_erase": True}).encode()
        try:
            reply = await self._nc.request(
                f"$JS.API.STREAM.MSG.DELETE.{self._stream}", request, timeout=self._timeout_s
            )
            body = json.loads(reply.data)
        except (nats.errors.Error, OSError, TimeoutError, ValueError) as exc:
            raise BusError(f"cannot remove mailbox message {seq}: {exc}") from exc
        error = body.get("error") if isinstance(body, dict) else None
        if error and _NO_MESSAGE not in str(error.get("description", "")).lower():
            raise BusError(f"cannot remove mailbox message {seq}: {error.get('description')}")

    async def pending(self, session_id: str) -> int:
        """How many messages wait for ``session_id`` (for the per-target quota)."""
        subject = mailbox_subject(session_id, self.namespace)
        try:
            info = await self._jsm.stream_info(self._stream, subjects_filter=subject)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot count the mailbox of {session_id}: {exc}") from exc
        return int((info.state.subjects or {}).get(subject, 0))

    async def purge_namespace(self) -> None:
        """Drop every pending message in this namespace (a print-mode run ending)."""
        if self.namespace is None:
            raise ValueError("purge_namespace() needs a namespace")
        try:
            await self._jsm.purge_stream(self._stream, subject=f"{self.prefix}.>")
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot purge the mailboxes of {self.namespace}: {exc}") from exc

    async def purge(self, session_id: str) -> None:
        """Drop every pending message for ``session_id`` (the session was deleted)."""
        subject = mailbox_subject(session_id, self.namespace)
        try:
            await self._jsm.purge_stream(self._stream, subject=subject)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BusError(f"cannot purge the mailbox of {session_id}: {exc}") from exc
