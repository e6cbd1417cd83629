"""Bus credentials: a session's (for its sandbox) and the orchestrator's admin identity.

A session's user may publish only on its host subject and subscribe only to its inbox
(``session_permissions``, R17). On the embedded server a user has a password; on an external
server in operator mode (``orchestrator/bus/external.py``) it has a user JWT and the nkey seed
that signs the server's nonce. Passwords and seeds are never logged or shown in ``repr``;
files holding them are written 0600, atomically.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from orchestrator.bus.mailbox import MAILBOX_SUBJECT_PREFIX
from orchestrator.errors import BusError
from orchestrator.ids import SESSION_ID_RE
from orchestrator.runtime.wire import (
    ENV_HOST_SUBJECT,
    ENV_INBOX_PREFIX,
    ENV_NATS_JWT,
    ENV_NATS_NKEY_SEED,
    ENV_NATS_PASSWORD,
    ENV_NATS_URL,
    ENV_NATS_USER,
    ENV_SESSION_ID,
    HOST_SUBJECT_PREFIX,
    INBOX_PREFIX,
    host_subject,
    inbox_prefix,
)

__all__ = [
    "ADMIN_INBOX_PREFIX",
    "CONNECT_TIMEOUT_S",
    "AdminConnector",
    "AdminCredentials",
    "SessionCredentials",
    "admin_permissions",
    "check_session_id",
    "connect_nats",
    "jwt_auth_options",
    "session_permissions",
    "write_private_file",
]

log = logging.getLogger(__name__)

# Admin replies/inboxes live outside "_INBOX.*", so no session grant can ever match them.
ADMIN_INBOX_PREFIX = "_PA_ADMIN_INBOX"
CONNECT_TIMEOUT_S = 2
ADMIN_RECONNECT_WAIT_S = 0.25  # the server restarts in ~10 ms; nats-py's default waits 2 s
PRIVATE_FILE_MODE = 0o600


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise ValueError(f"not a session id: {str(session_id)[:80]!r}")
    return session_id


def session_permissions(session_id: str) -> dict[str, Any]:
    """The exact NATS permissions of a session's user (R17)."""
    check_session_id(session_id)
    return {
        "publish": {"allow": [host_subject(session_id)]},
        "subscribe": {"allow": [inbox_prefix(session_id) + ".>"]},
    }


def admin_permissions() -> dict[str, Any]:
    """What the orchestrator's own user needs where it is not simply unrestricted (a user we
    mint on an external server): answer host requests, reply into session inboxes, and run
    the mailbox stream through the JetStream API."""
    return {
        "publish": {"allow": [f"{INBOX_PREFIX}.>", "$JS.API.>", f"{MAILBOX_SUBJECT_PREFIX}.>"]},
        "subscribe": {"allow": [f"{HOST_SUBJECT_PREFIX}.*", f"{ADMIN_INBOX_PREFIX}.>"]},
    }


def jwt_auth_options(jwt: Callable[[], str], seed: str) -> dict[str, Any]:
    """nats-py ``connect`` options for a user JWT: ``jwt()`` is asked at every (re)connect
    (so a minted token can be fresh), and the seed signs the server's nonce."""
    from orchestrator.bus.nats_jwt import Keys  # nkeys is only needed in JWT mode

    keys = Keys.from_seed(seed)

    def _signature(nonce: str) -> bytes:
        return base64.b64encode(keys.sign(nonce.encode("ascii")))

    return {"user_jwt_cb": lambda: jwt().encode("ascii"), "signature_cb": _signature}


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically with mode 0600 (never briefly world-readable)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, PRIVATE_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@dataclass(frozen=True)
class SessionCredentials:
    """What one sandbox needs to reach the bus as its session (and nothing more).

    Embedded server: ``user`` (the session id) and ``password``. External server: ``user`` is
    the user's public nkey, ``jwt`` its signed user JWT and ``seed`` its nkey seed (secret).
    """

    url: str
    user: str
    password: str = field(repr=False)
    session_id: str
    jwt: str = field(default="", repr=False)
    seed: str = field(default="", repr=False)

    @property
    def host_subject(self) -> str:
        return host_subject(self.session_id)

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.session_id)

    def env(self) -> dict[str, str]:
        """The ``PRIME_AGENT_*`` variables for the sandbox (contains the password or seed)."""
        if self.jwt:
            auth = {ENV_NATS_JWT: self.jwt, ENV_NATS_NKEY_SEED: self.seed}
        else:
            auth = {ENV_NATS_USER: self.user, ENV_NATS_PASSWORD: self.password}
        return {
            ENV_NATS_URL: self.url,
            **auth,
            ENV_SESSION_ID: self.session_id,
            ENV_HOST_SUBJECT: self.host_subject,
            ENV_INBOX_PREFIX: self.inbox_prefix,
        }

    def connect_options(self) -> dict[str, Any]:
        """nats-py ``connect`` keyword arguments that log in as this session."""
        options: dict[str, Any] = {"inbox_prefix": self.inbox_prefix}
        if self.jwt:
            jwt = self.jwt
            options.update(jwt_auth_options(lambda: jwt, self.seed))
        else:
            options.update(user=self.user, password=self.password)
        return options

    def write(self, path: Path) -> None:
        """Write these credentials as a 0600 JSON file (atomically)."""
        data = {
            "url": self.url,
            "user": self.user,
            "password": self.password,
            "session_id": self.session_id,
            "host_subject": self.host_subject,
            "inbox_prefix": self.inbox_prefix,
            "jwt": self.jwt,
            "seed": self.seed,
        }
        try:
            write_private_file(path, json.dumps(data).encode())
        except OSError as exc:
            raise BusError(f"cannot write NATS credentials to {path}: {exc}") from exc

    @classmethod
    def read(cls, path: Path) -> SessionCredentials:
        try:
            data = json.loads(path.read_bytes())
            return cls(
                url=str(data["url"]),
                user=str(data["user"]),
                password=str(data["password"]),
                session_id=check_session_id(str(data["session_id"])),
                jwt=str(data.get("jwt", "")),
                seed=str(data.get("seed", "")),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BusError(f"cannot read NATS credentials from {path}: {exc}") from exc


class AdminConnector(Protocol):
    """How the orchestrator opens its own long-lived bus connection."""

    @property
    def url(self) -> str: ...

    async def connect(self, *, name: str = ...) -> NatsClient: ...


@dataclass(frozen=True)
class AdminCredentials:
    """The orchestrator's own (unrestricted) identity on the bus."""

    url: str
    user: str
    password: str = field(repr=False)

    async def connect(self, *, name: str = "prime-agent-orchestrator") -> NatsClient:
        """A long-lived admin connection that reconnects forever (the server may restart)."""
        return await connect_nats(
            self.url,
            user=self.user,
            password=self.password,
            name=name,
            inbox_prefix=ADMIN_INBOX_PREFIX,
            reconnect=True,
        )


async def _log_nats_error(exc: Exception) -> None:
    # Connection errors are expected during server restarts; the client reconnects by itself.
    log.warning("nats: %s", exc)


async def connect_nats(
    url: str,
    *,
    user: str | None = None,
    password: str | None = None,
    name: str,
    inbox_prefix: str | None = None,
    reconnect: bool = True,
    error_cb: Callable[[Exception], Any] | None = None,
    auth: dict[str, Any] | None = None,
) -> NatsClient:
    """Connect with nats-py; any failure becomes ``BusError`` (no secret is ever shown).

    Log in with ``user``/``password``, or with ``auth`` (``jwt_auth_options``, or a
    ``user_credentials`` .creds path)."""
    options: dict[str, Any] = {
        **(auth or {"user": user, "password": password}),
        "name": name,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "error_cb": error_cb or _log_nats_error,
        "allow_reconnect": reconnect,
    }
    if reconnect:
        options["max_reconnect_attempts"] = -1
        options["reconnect_time_wait"] = ADMIN_RECONNECT_WAIT_S
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    try:
        return await nats.connect(url, **options)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        who = repr(user) if user is not None else "the orchestrator's JWT user"
        raise BusError(f"cannot connect to NATS at {url} as {who}: {exc}") from exc
