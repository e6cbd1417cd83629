"""The kernel's client for host requests over NATS (stdlib + nats-py, imported lazily).

``await default_client().request("rlm.run", {...})`` publishes ``{"v": 1, "type", "args"}`` on
the session's host subject and returns the reply's ``result``; an error reply raises the typed
exception for its code (``orchestrator/runtime/errors.py``).

- **Lazy.** Neither the environment nor ``nats`` is touched before the first request: the warm
  pool starts kernels before their session is known and sets ``os.environ`` afterwards, and
  every kernel start would otherwise pay for the nats import. The environment is re-read on
  every request (cheap), so a changed session env gives a fresh connection.
- **One connection per event loop.** A nats-py connection belongs to the loop it was made on.
  ipykernel runs every cell (top-level ``await`` or not) and every task a cell creates on one
  loop, so in a kernel there is one connection; a request from another loop (``asyncio.run``
  in a thread) gets its own, and connections of loops that have closed are dropped.
- **Failures are typed.** No env -> ``HostUnavailable``; bus unreachable or credentials refused
  -> ``HostUnavailable``; nobody subscribed to the host subject -> ``HostUnavailable``; the
  bus silently refusing the request (a permissions violation, reported only through
  ``error_cb``) -> ``HostUnavailable`` naming the violation; no answer in time -> ``HostTimeout``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.runtime import wire
from orchestrator.runtime.errors import (
    HostTimeout,
    HostUnavailable,
    InternalHostError,
    InvalidArgument,
    error_from_reply,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

__all__ = [
    "CONNECT_DEADLINE_S",
    "HostBound",
    "HostClient",
    "HostConfig",
    "decode_reply",
    "default_client",
    "encode_request",
    "host_request",
]

CONNECT_DEADLINE_S = 10.0  # first connection (all attempts together) must succeed within this
CONNECT_ATTEMPT_TIMEOUT_S = 2  # one TCP + handshake attempt (nats-py wants an int)
RECONNECT_WAIT_S = 1  # between reconnect attempts after a connection was lost (int for nats-py)
# The first connection gives up after this many retries (a wrong URL or password should fail
# in about a second, not hang); once connected, a kernel outlives daemon restarts: reconnect
# forever.
INITIAL_CONNECT_RETRIES = 1
RECONNECT_FOREVER = -1
CLOSE_TIMEOUT_S = 2.0
MAX_RECORDED_ERRORS = 16
PERMISSION_VIOLATION = "permissions violation"  # nats-py lowercases the server's -ERR text
AUTHORIZATION_VIOLATION = "authorization violation"
CONNECTION_NAME_PREFIX = "prime-agent-kernel"
NOT_IN_SESSION = (
    "this kernel is not connected to an orchestrator ({detail}); host requests such as "
    "rlm(...) and agent_message.send(...) work only inside a Prime Agent session"
)


@dataclass(frozen=True)
class HostConfig:
    """Where and as whom to send host requests; read from the kernel's environment."""

    url: str
    session_id: str
    subject: str
    inbox_prefix: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = wire.HOST_REQUEST_TIMEOUT_S
    # External NATS server (operator mode): a user JWT and the nkey seed that signs the nonce.
    jwt: str | None = field(default=None, repr=False)
    nkey_seed: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HostConfig:
        env = _with_credential_files(os.environ if environ is None else environ)
        url = env.get(wire.ENV_NATS_URL, "").strip()
        session_id = env.get(wire.ENV_SESSION_ID, "").strip()
        if not url:
            raise HostUnavailable(NOT_IN_SESSION.format(detail=f"{wire.ENV_NATS_URL} is not set"))
        if not session_id:
            raise HostUnavailable(NOT_IN_SESSION.format(detail=f"{wire.ENV_SESSION_ID} is not set"))
        return cls(
            url=url,
            session_id=session_id,
            subject=env.get(wire.ENV_HOST_SUBJECT, "").strip() or wire.host_subject(session_id),
            inbox_prefix=(
                env.get(wire.ENV_INBOX_PREFIX, "").strip() or wire.inbox_prefix(session_id)
            ),
            user=env.get(wire.ENV_NATS_USER) or None,
            password=env.get(wire.ENV_NATS_PASSWORD) or None,
            timeout_s=_parse_timeout(env.get(wire.ENV_REQUEST_TIMEOUT_S)),
            jwt=env.get(wire.ENV_NATS_JWT, "").strip() or None,
            nkey_seed=env.get(wire.ENV_NATS_NKEY_SEED, "").strip() or None,
        )

    def auth_options(self) -> dict[str, Any]:
        """nats-py ``connect`` options that log in: user JWT + nonce signature, or password."""
        if not self.jwt:
            return {"user": self.user, "password": self.password}
        if not self.nkey_seed:
            raise HostUnavailable(f"{wire.ENV_NATS_JWT} is set without {wire.ENV_NATS_NKEY_SEED}")
        try:
            import nkeys
        except ImportError:
            raise HostUnavailable(
                "this sandbox lacks the nkeys package, which NATS JWT credentials need"
            ) from None
        token, seed = self.jwt.encode("ascii"), self.nkey_seed

        def _signature(nonce: str) -> bytes:
            pair = nkeys.from_seed(bytearray(seed.encode("ascii")))
            try:
                return base64.b64encode(pair.sign(nonce.encode("ascii")))
            finally:
                pair.wipe()

        return {"user_jwt_cb": lambda: token, "signature_cb": _signature}


def _with_credential_files(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with the NATS credentials it lacks read from the files of
    ``ENV_NATS_CREDENTIALS_DIR`` (a pod's Secret), where it names a directory."""
    directory = env.get(wire.ENV_NATS_CREDENTIALS_DIR, "").strip()
    if not directory:
        return env
    merged = dict(env)
    for name, file_name in wire.NATS_CREDENTIAL_FILES.items():
        if merged.get(name):
            continue
        try:
            with open(os.path.join(directory, file_name), encoding="utf-8") as fh:
                merged[name] = fh.read().strip()
        except FileNotFoundError:
            continue  # user and password, or JWT and seed: the other pair is absent
        except OSError as exc:
            raise HostUnavailable(
                f"cannot read the NATS credential {file_name} in {directory}: {exc}"
            ) from None
    return merged


def _parse_timeout(raw: str | None) -> float:
    try:
        value = float(raw) if raw else wire.HOST_REQUEST_TIMEOUT_S
    except ValueError:
        return wire.HOST_REQUEST_TIMEOUT_S
    return value if value > 0 else wire.HOST_REQUEST_TIMEOUT_S


def encode_request(request_type: str, args: Mapping[str, Any] | None) -> bytes:
    """The request's JSON bytes; ``InvalidArgument`` if it is not JSON or too large."""
    if not isinstance(request_type, str) or not request_type.strip():
        raise InvalidArgument("the request type must be a non-empty string")
    if args is not None and not isinstance(args, Mapping):
        raise TypeError(f"{request_type}: args must be a dict, not {type(args).__name__}")
    body = {"v": wire.PROTOCOL_VERSION, "type": request_type, "args": dict(args or {})}
    try:
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"{request_type}: arguments are not plain JSON data ({exc})"
        ) from None
    if len(data) > wire.MAX_REQUEST_BYTES:
        raise InvalidArgument(
            f"{request_type}: the request is {len(data)} bytes, over the "
            f"{wire.MAX_REQUEST_BYTES}-byte limit"
        )
    return data


def decode_reply(data: bytes, request_type: str) -> Any:
    """The ``result`` of a reply, or raise the typed exception of an error reply."""
    try:
        reply = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise InternalHostError(
            f"the orchestrator sent an unreadable reply to {request_type}"
        ) from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise InternalHostError(f"the orchestrator sent a malformed reply to {request_type}")
    if reply["ok"]:
        return reply.get("result")
    raise error_from_reply(reply.get("error"))


@dataclass
class _Link:
    """One nats-py connection, bound to one event loop and one config."""

    config: HostConfig
    nc: NatsClient
    errors: collections.deque[tuple[float, str]]
    violations: int = 0

    def violations_since(self, mark: int) -> str | None:
        if self.violations <= mark:
            return None
        for _, text in reversed(self.errors):
            if PERMISSION_VIOLATION in text.lower():
                return text
        return PERMISSION_VIOLATION

    async def close(self) -> None:
        # Best effort: the connection is abandoned either way.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.close(), CLOSE_TIMEOUT_S)


@dataclass
class _Slot:
    lock: asyncio.Lock
    link: _Link | None = None


class HostClient:
    """Host requests from this process; safe to share between cells, tasks and threads."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        # None: read os.environ at each request (the normal case inside a kernel).
        self._environ = environ
        self._slots: dict[asyncio.AbstractEventLoop, _Slot] = {}
        self._mutex = threading.Lock()
        self.connections_opened = 0

    def config(self) -> HostConfig:
        return HostConfig.from_env(self._environ)

    async def request(
        self,
        request_type: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Send one host request and return its result (see the module docstring)."""
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise InvalidArgument(f"timeout must be a positive number of seconds, not {timeout!r}")
        payload = encode_request(request_type, args)
        config = self.config()
        wait_s = float(timeout) if timeout is not None else config.timeout_s
        link = await self._link(config)
        mark = link.violations
        from nats import errors as nats_errors

        try:
            msg = await link.nc.request(config.subject, payload, timeout=wait_s)
        except nats_errors.NoRespondersError:
            raise HostUnavailable(
                f"no orchestrator is listening on {config.subject} (it may be restarting; "
                "try again in a few seconds)"
            ) from None
        except (TimeoutError, nats_errors.TimeoutError):
            violation = link.violations_since(mark)
            if violation is not None:
                raise HostUnavailable(
                    f"the message bus refused {request_type} from this kernel ({violation})"
                ) from None
            raise HostTimeout(
                f"the orchestrator did not answer {request_type} within {wait_s:g} s"
            ) from None
        except nats_errors.MaxPayloadError:
            raise InvalidArgument(
                f"{request_type}: the request is larger than the message bus accepts"
            ) from None
        except (
            nats_errors.ConnectionClosedError,
            nats_errors.ConnectionDrainingError,
            nats_errors.OutboundBufferLimitError,
        ):
            raise HostUnavailable(
                f"the connection to the orchestrator closed while sending {request_type}; try again"
            ) from None
        return decode_reply(msg.data, request_type)

    async def close(self) -> None:
        """Close this loop's connection (the next request opens a new one)."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            slot = self._slots.get(loop)
        if slot is None:
            return
        async with slot.lock:
            if slot.link is not None:
                await slot.link.close()
                slot.link = None

    def open_connections(self) -> int:
        """How many loops hold a live connection (for tests and diagnostics)."""
        with self._mutex:
            self._prune_closed_loops()
            return sum(
                1
                for slot in self._slots.values()
                if slot.link is not None and not slot.link.nc.is_closed
            )

    # --- connections ---------------------------------------------------------------------

    def _prune_closed_loops(self) -> None:
        # A loop that has closed (asyncio.run in a thread finished) took its connection's
        # tasks with it; nothing can be awaited there any more, so just forget it.
        for loop in [loop for loop in self._slots if loop.is_closed()]:
            del self._slots[loop]

    async def _link(self, config: HostConfig) -> _Link:
        loop = asyncio.get_running_loop()
        with self._mutex:
            self._prune_closed_loops()
            slot = self._slots.get(loop)
            if slot is None:
                slot = self._slots[loop] = _Slot(lock=asyncio.Lock())
        async with slot.lock:
            link = slot.link
            if link is not None and (link.config != config or link.nc.is_closed):
                await link.close()
                slot.link = link = None
            if link is None:
                link = slot.link = await self._connect(config)
            return link

    async def _connect(self, config: HostConfig) -> _Link:
        _quiet_nats_logging()
        from nats import errors as nats_errors
        from nats.aio.client import Client

        errors: collections.deque[tuple[float, str]] = collections.deque(maxlen=MAX_RECORDED_ERRORS)
        nc = Client()
        link = _Link(config=config, nc=nc, errors=errors)

        async def on_error(exc: Exception) -> None:
            text = str(exc) or type(exc).__name__
            errors.append((time.monotonic(), text))
            if PERMISSION_VIOLATION in text.lower():
                link.violations += 1

        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=[config.url],
                    **config.auth_options(),
                    inbox_prefix=config.inbox_prefix,
                    name=f"{CONNECTION_NAME_PREFIX}:{config.session_id}",
                    error_cb=on_error,
                    allow_reconnect=True,
                    connect_timeout=CONNECT_ATTEMPT_TIMEOUT_S,
                    reconnect_time_wait=RECONNECT_WAIT_S,
                    max_reconnect_attempts=INITIAL_CONNECT_RETRIES,
                ),
                CONNECT_DEADLINE_S,
            )
        except asyncio.CancelledError:
            # Interrupted (the cell was stopped): do not leave a half-made connection running.
            _close_later(link)
            raise
        except (TimeoutError, OSError, nats_errors.Error) as exc:
            await link.close()
            last = errors[-1][1] if errors else (str(exc) or type(exc).__name__)
            # Any attempt refused for authorization says it: after the refusal the server
            # closes the connection, so a later attempt may only record a reset.
            refused = [text for _, text in errors if AUTHORIZATION_VIOLATION in text.lower()]
            if refused or AUTHORIZATION_VIOLATION in last.lower():
                raise HostUnavailable(
                    f"the orchestrator's message bus at {config.url} refused this kernel's "
                    f"credentials ({refused[-1] if refused else last})"
                ) from None
            raise HostUnavailable(
                f"cannot reach the orchestrator's message bus at {config.url} ({last})"
            ) from None
        nc.options["max_reconnect_attempts"] = RECONNECT_FOREVER
        self.connections_opened += 1
        return link


_closing: set[asyncio.Task[None]] = set()  # strong references until the close has run


def _close_later(link: _Link) -> None:
    task = asyncio.get_running_loop().create_task(link.close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _quiet_nats_logging() -> None:
    # nats-py logs some internal errors; with no handler configured, logging's last-resort
    # handler would print them into whatever cell runs. They reach error_cb anyway.
    logger = logging.getLogger("nats")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


_default_lock = threading.Lock()
_default: HostClient | None = None


def default_client() -> HostClient:
    """The process-wide client the runtime's ``rlm`` / ``agent_message`` / ... use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = HostClient()
        return _default


async def host_request(
    request_type: str, args: Mapping[str, Any] | None = None, *, timeout: float | None = None
) -> Any:
    """Send one host request with the default client and return its result."""
    return await default_client().request(request_type, args, timeout=timeout)


class HostBound:
    """Base of the runtime's API objects (``rlm``, ``agent_message``, ``agent_observe``): they
    use the process-wide client unless a test hands them one."""

    def __init__(self, client: HostClient | None = None) -> None:
        self._client_override = client

    def _client(self) -> HostClient:
        return self._client_override or default_client()
