"""The host-request router: kernels ask, the orchestrator answers (docs/spec.md §3, R17, R18).

The router subscribes (as admin, in a queue group so several orchestrator shards could share
the load later) to ``pa.host.*``. For each request it:

1. takes the caller's session id FROM THE SUBJECT — NATS permissions let a session publish only
   on its own subject, so this is its authenticated identity; nothing in the payload is;
2. refuses a reply subject outside that session's inbox (else a session could make the
   orchestrator publish into another session's inbox);
3. parses a bounded payload into a ``HostRequest`` (unknown fields are refused, so a payload
   cannot even *claim* another identity);
4. runs the handler registered for the request type in its own task, bounded per session, and
   replies with a ``HostReply``.

On a server shared with other orchestrators (an external server) the router is made with
``per_session=True``: instead of ``pa.host.*`` it listens on ``pa.host.<sid>`` for each session
added with ``add_session`` (before its credentials are handed out), so it never takes another
orchestrator's requests, and ``remove_session`` ends a session's access at once.

A handler raising ``HostRequestError`` becomes an error reply with that code; any other failure
becomes ``internal`` and is logged. Nothing a request or handler does stops the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import ValidationError

from orchestrator.bus.protocol import HostErrorBody, HostReply, HostRequest
from orchestrator.errors import BusError, PrimeAgentError
from orchestrator.ids import SESSION_ID_RE
from orchestrator.runtime.wire import (
    ERROR_CODES,
    HOST_REQUEST_TIMEOUT_S,
    HOST_SUBJECT_PREFIX,
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUTS_S,
    inbox_prefix,
)

__all__ = [
    "CLOSE_GRACE_S",
    "HANDLER_TIMEOUT_S",
    "MAX_IN_FLIGHT_PER_SESSION",
    "MAX_IN_FLIGHT_TOTAL",
    "ROUTER_QUEUE_GROUP",
    "Handler",
    "HostRequestError",
    "HostRouter",
    "RouterStatistics",
]

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]

ROUTER_QUEUE_GROUP = "pa-host-router"
MAX_IN_FLIGHT_PER_SESSION = 32  # concurrent requests one session may have open (gather() et al.)
MAX_IN_FLIGHT_TOTAL = 4096  # across sessions: beyond it new requests are refused, not queued
HANDLER_TIMEOUT_S = HOST_REQUEST_TIMEOUT_S  # past this the caller has given up on the reply
QUOTA_RETRY_AFTER_S = 1.0  # suggested wait after "too many requests in flight"
CLOSE_GRACE_S = 5.0  # close(): how long in-flight handlers may finish before being cancelled
ERROR_MESSAGE_MAX_CHARS = 500
REQUEST_TYPE_MAX_CHARS = 64
REQUEST_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


class HostRequestError(PrimeAgentError):
    """Raised by a handler to refuse a request with one of ``runtime.wire.ERROR_CODES``."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown host error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class RouterStatistics:
    requests: int  # messages received on pa.host.*
    replies: int  # replies sent (ok or error)
    errors: int  # error replies sent
    internal_errors: int  # handler failures (a subset of errors)
    dropped: int  # not answered: bad subject, reply outside the caller's inbox, publish failed
    in_flight: int


def _error_reply(code: str, message: str, retry_after: float | None = None) -> bytes:
    body = HostErrorBody(
        code=code, message=message[:ERROR_MESSAGE_MAX_CHARS], retry_after=retry_after
    )
    return HostReply(ok=False, error=body).model_dump_json().encode()


class HostRouter:
    """Dispatches ``pa.host.<session_id>`` requests to registered async handlers.

    The NATS connection (admin) belongs to the caller; the router only subscribes on it.
    """

    def __init__(
        self,
        nc: NatsClient,
        *,
        queue: str = ROUTER_QUEUE_GROUP,
        max_in_flight_per_session: int = MAX_IN_FLIGHT_PER_SESSION,
        max_in_flight_total: int = MAX_IN_FLIGHT_TOTAL,
        handler_timeout_s: float = HANDLER_TIMEOUT_S,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        per_session: bool = False,
    ) -> None:
        self._nc = nc
        self.per_session = per_session
        self._queue = queue
        self._max_per_session = max_in_flight_per_session
        self._max_total = max_in_flight_total
        self._handler_timeout_s = handler_timeout_s
        self._max_request_bytes = max_request_bytes
        self._handlers: dict[str, Handler] = {}
        self._in_flight: defaultdict[str, int] = defaultdict(int)
        self._total_in_flight = 0
        # "*" -> the pa.host.* subscription; else session id -> its pa.host.<sid> subscription.
        self._subs: dict[str, Subscription] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._accepting = False
        self._requests = 0
        self._replies = 0
        self._errors = 0
        self._internal = 0
        self._dropped = 0

    # -- registry --

    def register(self, request_type: str, handler: Handler) -> None:
        """Route requests of ``request_type`` to ``handler(session_id, args)``."""
        if len(request_type) > REQUEST_TYPE_MAX_CHARS or not REQUEST_TYPE_RE.match(request_type):
            raise ValueError(f"bad request type {request_type!r}")
        if request_type in self._handlers:
            raise ValueError(f"a handler for {request_type!r} is already registered")
        self._handlers[request_type] = handler

    def unregister(self, request_type: str) -> None:
        self._handlers.pop(request_type, None)

    # -- lifecycle --

    async def start(self) -> None:
        if self._serve_task is not None:
            raise RuntimeError("router already started")
        ready = asyncio.Event()
        self._serve_task = asyncio.create_task(self._serve(ready), name="host-router")
        await ready.wait()
        self._accepting = True  # before subscribing: the first request may arrive at once
        if self.per_session:
            return
        try:
            await self._subscribe("*")
        except BusError:
            await self.close()
            raise

    async def _subscribe(self, key: str) -> None:
        try:
            self._subs[key] = await self._nc.subscribe(
                f"{HOST_SUBJECT_PREFIX}.{key}", queue=self._queue, cb=self._on_message
            )
            # Make sure the server has the subscription before we return, so a request sent
            # right after is not lost to "no responders".
            await self._nc.flush()
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            self._subs.pop(key, None)
            raise BusError(f"cannot subscribe the host router: {exc}") from exc

    async def add_session(self, session_id: str) -> None:
        """``per_session`` routers: start answering ``session_id`` (idempotent)."""
        if not SESSION_ID_RE.match(session_id):
            raise ValueError(f"not a session id: {session_id[:80]!r}")
        if not self.per_session or session_id in self._subs:
            return
        if not self._accepting:
            raise BusError("the host router is not running")
        await self._subscribe(session_id)

    async def remove_session(self, session_id: str) -> None:
        """``per_session`` routers: stop answering ``session_id`` (its requests find no one)."""
        sub = self._subs.pop(session_id, None) if session_id != "*" else None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await sub.unsubscribe()
                # In effect at the server on return: a request sent next finds no responder.
                await self._nc.flush()

    def sessions(self) -> list[str]:
        """The sessions a ``per_session`` router answers."""
        return sorted(key for key in self._subs if key != "*")

    async def _serve(self, ready: asyncio.Event) -> None:
        # Every handler task lives in this group: close() waits for them, then cancels leftovers.
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            ready.set()
            await self._stopping.wait()
        self._tg = None

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop receiving, let in-flight requests finish for ``grace_s``, cancel the rest."""
        self._accepting = False
        subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await sub.unsubscribe()
        self._stopping.set()
        task = self._serve_task
        if task is None or task.done():
            return
        try:
            async with asyncio.timeout(grace_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            requests=self._requests,
            replies=self._replies,
            errors=self._errors,
            internal_errors=self._internal,
            dropped=self._dropped,
            in_flight=self._total_in_flight,
        )

    # -- one request --

    async def _on_message(self, msg: Msg) -> None:
        # nats-py runs one subscription's callbacks one after another: decide quickly here and
        # move the work into a task so a slow handler never holds up other sessions.
        try:
            self._requests += 1
            session_id = msg.subject[len(HOST_SUBJECT_PREFIX) + 1 :]
            if not SESSION_ID_RE.match(session_id):
                self._drop("subject %r does not name a session", msg.subject)
                return
            reply = msg.reply
            if not reply.startswith(inbox_prefix(session_id) + "."):
                # Replying there would let one session write into another's inbox.
                self._drop("%s: reply subject outside its inbox", session_id)
                return
            if not self._accepting or self._tg is None:
                self._drop("%s: router closing", session_id)
                return
            if len(msg.data) > self._max_request_bytes:
                await self._reply(
                    reply,
                    _error_reply(
                        "invalid_argument",
                        f"request of {len(msg.data)} bytes exceeds {self._max_request_bytes}",
                    ),
                    error=True,
                )
                return
            if (
                self._in_flight[session_id] >= self._max_per_session
                or self._total_in_flight >= self._max_total
            ):
                await self._reply(
                    reply,
                    _error_reply(
                        "quota_exceeded",
                        f"more than {self._max_per_session} host requests in flight",
                        retry_after=QUOTA_RETRY_AFTER_S,
                    ),
                    error=True,
                )
                return
            self._in_flight[session_id] += 1
            self._total_in_flight += 1
            try:
                self._tg.create_task(self._handle(session_id, reply, msg.data))
            except RuntimeError:  # the group is shutting down
                self._release(session_id)
                self._drop("%s: router closing", session_id)
        except Exception:
            log.exception("host router: unexpected failure receiving a request")

    def _release(self, session_id: str) -> None:
        self._total_in_flight -= 1
        self._in_flight[session_id] -= 1
        if self._in_flight[session_id] <= 0:
            del self._in_flight[session_id]

    def _drop(self, fmt: str, *args: object) -> None:
        self._dropped += 1
        log.warning("host router dropped a request: " + fmt, *args)

    async def _handle(self, session_id: str, reply: str, data: bytes) -> None:
        try:
            payload, is_error = await self._dispatch(session_id, data)
            await self._reply(reply, payload, error=is_error)
        except Exception:
            log.exception("host router: failure answering %s", session_id)
        finally:
            self._release(session_id)

    async def _dispatch(self, session_id: str, data: bytes) -> tuple[bytes, bool]:
        """The reply bytes for one request, and whether it is an error reply."""
        try:
            request = HostRequest.model_validate(json.loads(data))
        # ValueError covers JSONDecodeError and UnicodeDecodeError; RecursionError is "[[[[…"
        except (ValueError, ValidationError, RecursionError) as exc:
            return _error_reply("invalid_argument", f"malformed host request: {_brief(exc)}"), True
        handler = self._handlers.get(request.type)
        if handler is None:
            return _error_reply("unknown_request", f"unknown request type {request.type!r}"), True
        # A request type that may take longer (an MCP tool call) has its own bound.
        limit_s = max(self._handler_timeout_s, REQUEST_TIMEOUTS_S.get(request.type, 0.0))
        deadline = asyncio.timeout(limit_s)
        try:
            async with deadline:
                result = await handler(session_id, request.args)
        except HostRequestError as exc:
            return _error_reply(exc.code, exc.message, exc.retry_after), True
        except TimeoutError as exc:
            if not deadline.expired():  # the handler's own TimeoutError, not our deadline
                log.error("host handler %s failed for %s: %r", request.type, session_id, exc)
                return self._internal_error(session_id, request.type, "TimeoutError"), True
            self._internal += 1
            log.error("host handler %s for %s timed out", request.type, session_id)
            return _error_reply("internal", f"{request.type} did not finish in {limit_s:g} s"), True
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled (close): let it through
            # A handler that raised CancelledError on its own is just a failing handler.
            return self._internal_error(session_id, request.type, "cancelled"), True
        except Exception as exc:
            log.exception("host handler %s failed for %s", request.type, session_id)
            return self._internal_error(session_id, request.type, type(exc).__name__), True
        try:
            return HostReply(ok=True, result=result).model_dump_json().encode(), False
        except (ValueError, TypeError) as exc:  # pydantic's serialization errors are ValueErrors
            log.error("host handler %s returned an unserializable result: %s", request.type, exc)
            return self._internal_error(session_id, request.type, "unserializable result"), True

    def _internal_error(self, session_id: str, request_type: str, what: str) -> bytes:
        self._internal += 1
        # Short and generic: the kernel sees that it failed, the orchestrator log says why.
        return _error_reply(
            "internal", f"the orchestrator failed handling {request_type} ({what}); see its log"
        )

    async def _reply(self, reply: str, payload: bytes, *, error: bool) -> None:
        if len(payload) > self._nc.max_payload:
            log.error("host reply of %d bytes exceeds the server's max payload", len(payload))
            payload = _error_reply(
                "internal", f"the reply ({len(payload)} bytes) exceeds the bus message limit"
            )
            self._internal += 1
            error = True
        try:
            await self._nc.publish(reply, payload)
        except (nats.errors.Error, OSError) as exc:
            self._drop("reply could not be sent: %s", exc)
            return
        self._replies += 1
        if error:
            self._errors += 1


def _brief(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(p) for p in err["loc"]) or "request"
            parts.append(f"{loc}: {err['msg']}")
        return "; ".join(parts)
    return str(exc)[:200]
