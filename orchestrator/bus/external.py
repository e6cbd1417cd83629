"""An external NATS server in operator mode (``--nats-url`` / ``[nats] url``).

On a server we do not administer we cannot write users into its config and reload it, as the
embedded server does. NATS decentralized auth needs neither: the server trusts an operator,
the operator signed an account JWT that lists the account's *signing keys*, and any user JWT
signed by one of those keys is accepted, with the permissions written in it. So the
orchestrator is given one account signing seed (``[nats] account_signing_seed_file``, a 0600
file, never inline, never logged) and mints:

- its own user (unless ``[nats] creds_file`` names one), with ``admin_permissions()``; a fresh
  token at every (re)connect, valid ``ADMIN_JWT_TTL_S``;
- one user per session with exactly ``session_permissions(sid)`` (R17: publish its host
  subject, subscribe its inbox), valid ``[nats] session_credentials_ttl_s``. Its JWT and nkey
  seed reach the sandbox as ``PRIME_AGENT_NATS_JWT`` / ``PRIME_AGENT_NATS_NKEY_SEED``.

A minted JWT cannot be revoked before it expires without re-signing the account JWT (the
operator's job). What ends a session's access at once is the router: on an external server it
listens per session (``HostRouter.add_session``), so a forgotten session's requests find no
responder, and only the orchestrator ever publishes into a session's inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import nats.errors
from nats.aio.client import Client as NatsClient

from orchestrator.bus.credentials import (
    ADMIN_INBOX_PREFIX,
    SessionCredentials,
    admin_permissions,
    check_session_id,
    connect_nats,
    jwt_auth_options,
    session_permissions,
)
from orchestrator.bus.nats_jwt import (
    JwtError,
    KeyKind,
    Keys,
    encode_jwt,
    parse_creds,
    public_key_kind,
    user_claims,
)
from orchestrator.bus.server import BusServer
from orchestrator.errors import BusError, ConfigError, UserError
from orchestrator.settings import NATS_SESSION_CREDENTIALS_TTL_S, NatsSettings

__all__ = [
    "ADMIN_JWT_TTL_S",
    "NATS_URL_SCHEMES",
    "AccountIssuer",
    "DecentralizedNats",
    "JwtAdminCredentials",
    "NatsUnreachable",
    "load_signing_keys",
]

log = logging.getLogger(__name__)

ADMIN_JWT_TTL_S: Final = 24 * 3600  # re-minted at every reconnect, so only a bound on a leak
PROBE_CONNECT_TIMEOUT_S: Final = 5  # one attempt; nats-py wants an int
# nats-py retries a refused first connection max_reconnect_attempts times, reconnect_time_wait
# apart (defaults: 60 x 2 s): a wrong URL must fail in about a second instead.
PROBE_ATTEMPTS: Final = 1
PROBE_RETRY_WAIT_S: Final = 0.2
PROBE_DEADLINE_S: Final = 15.0  # everything together, DNS included
NATS_URL_SCHEMES: Final = ("nats", "tls")
PRIVATE_MODE_MASK: Final = 0o077  # group and other bits: a secret file must have none
SEED_FILE_MAX_BYTES: Final = 4096
ADMIN_USER_NAME: Final = "prime-agent-orchestrator"
CONFIG_WHERE: Final = "[nats]"
AUTH_REFUSED_MARKERS: Final = ("authorization violation", "authentication expired")


class NatsUnreachable(UserError, BusError):
    """The configured NATS server does not answer (a setup problem the user can fix)."""


def load_signing_keys(path: Path) -> Keys:
    """The account signing key from ``path``: a regular file of ours, mode 0600 (no group or
    other bits), holding one account seed (``SA…``). Errors never quote the file's content."""
    where = f"{CONFIG_WHERE} account_signing_seed_file {path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{where} is not a regular file")
    if info.st_mode & PRIVATE_MODE_MASK:
        raise ConfigError(
            f"{where} is readable by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"run chmod 600 {path}"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"{where} belongs to another user (uid {info.st_uid})")
    try:
        raw = path.read_bytes()[:SEED_FILE_MAX_BYTES].decode("ascii")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"{where} does not hold an nkey seed") from None
    seeds = [line.strip() for line in raw.splitlines() if line.strip().startswith("S")]
    if len(seeds) != 1:
        raise ConfigError(f"{where} must hold exactly one nkey seed (a line starting SA)")
    try:
        return Keys.from_seed(seeds[0], KeyKind.ACCOUNT)
    except JwtError:
        raise ConfigError(f"{where} does not hold an account seed (SA…)") from None


@dataclass(frozen=True)
class AccountIssuer:
    """Mints user JWTs for one account with one of its signing keys (or its own key)."""

    signing: Keys = field(repr=False)
    account: str  # the account's public key

    def __post_init__(self) -> None:
        if public_key_kind(self.account) != KeyKind.ACCOUNT:
            raise JwtError("the account must be an account public key (A…)")

    @property
    def issuer_account(self) -> str | None:
        # Set only when a signing key (not the account's own key) signs.
        return None if self.signing.public == self.account else self.account

    def mint(
        self,
        name: str,
        permissions: dict[str, Any] | None,
        *,
        ttl_s: float,
        user: Keys | None = None,
        now: float | None = None,
    ) -> tuple[Keys, str]:
        """A (new, unless given) user key pair and its JWT, valid ``ttl_s`` from ``now``.
        ``permissions`` is ``{"publish": {"allow": …}, "subscribe": {"allow": …}}`` (the shape
        of ``session_permissions``); ``None`` leaves the user unrestricted in the account."""
        user = user or Keys.generate(KeyKind.USER)
        moment = time.time() if now is None else now
        perms = permissions or {}
        claims = user_claims(
            user=user.public,
            name=name,
            pub_allow=perms.get("publish", {}).get("allow"),
            sub_allow=perms.get("subscribe", {}).get("allow"),
            expires_at=int(moment + ttl_s),
            issuer_account=self.issuer_account,
        )
        return user, encode_jwt(claims, self.signing, now=moment)


@dataclass(frozen=True)
class JwtAdminCredentials:
    """The orchestrator's own identity on an operator-mode server: a user we mint (fresh at
    every connect), or the user of a ``.creds`` file we were given."""

    url: str
    issuer: AccountIssuer = field(repr=False)
    creds_file: Path | None = None
    keys: Keys = field(default_factory=lambda: Keys.generate(KeyKind.USER), repr=False)

    def auth_options(self) -> dict[str, Any]:
        if self.creds_file is not None:
            return {"user_credentials": str(self.creds_file)}
        issuer, keys = self.issuer, self.keys

        def _fresh_jwt() -> str:
            _, token = issuer.mint(
                ADMIN_USER_NAME, admin_permissions(), ttl_s=ADMIN_JWT_TTL_S, user=keys
            )
            return token

        return jwt_auth_options(_fresh_jwt, keys.seed)

    async def connect(self, *, name: str = ADMIN_USER_NAME) -> NatsClient:
        """A long-lived admin connection that reconnects forever."""
        return await connect_nats(
            self.url,
            name=name,
            inbox_prefix=ADMIN_INBOX_PREFIX,
            reconnect=True,
            auth=self.auth_options(),
        )


def _check_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in NATS_URL_SCHEMES or not parts.hostname:
        raise ConfigError(
            f"{CONFIG_WHERE} url / --nats-url {url!r} is not a NATS URL "
            "(nats://HOST:PORT or tls://HOST:PORT)"
        )
    if parts.password or parts.username:
        raise ConfigError(
            f"{CONFIG_WHERE} url must not carry credentials: the orchestrator signs its own"
        )
    return url.strip()


def _check_creds_file(path: Path) -> Path:
    where = f"{CONFIG_WHERE} creds_file {path}"
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where} is not a regular file")
        if info.st_mode & PRIVATE_MODE_MASK:
            raise ConfigError(f"{where} is readable by others: run chmod 600 {path}")
        parse_creds(path.read_text(encoding="ascii"))
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError, JwtError):
        raise ConfigError(f"{where} is not a NATS .creds file") from None
    return path


class DecentralizedNats(BusServer):
    """An operator-mode NATS server someone else runs; we mint users with an account key."""

    def __init__(
        self,
        url: str,
        *,
        issuer: AccountIssuer,
        creds_file: Path | None = None,
        session_ttl_s: float = NATS_SESSION_CREDENTIALS_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._url = _check_url(url)
        self.issuer = issuer
        self._admin = JwtAdminCredentials(url=self._url, issuer=issuer, creds_file=creds_file)
        self.session_ttl_s = session_ttl_s
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: NatsSettings) -> DecentralizedNats:
        """Check the ``[nats]`` settings (one-line ``ConfigError`` on anything wrong)."""
        if not settings.url:
            raise ConfigError(f"{CONFIG_WHERE} url is not set")
        url = _check_url(settings.url)
        if settings.account_signing_seed_file is None:
            raise ConfigError(
                f"an external NATS server ({url}) needs {CONFIG_WHERE} "
                "account_signing_seed_file: the 0600 file holding the account signing seed "
                "(docs/bus.md, External NATS server)"
            )
        signing = load_signing_keys(settings.account_signing_seed_file.expanduser())
        account = settings.account or signing.public
        try:
            issuer = AccountIssuer(signing=signing, account=account)
        except JwtError:
            # Never echo it: a seed pasted here by mistake is a secret.
            hint = " (it looks like a seed: keep seeds in the seed file only)" * (
                account.startswith("S")
            )
            raise ConfigError(
                f"{CONFIG_WHERE} account is not an account public key (A…){hint}"
            ) from None
        creds = settings.creds_file
        return cls(
            url,
            issuer=issuer,
            creds_file=_check_creds_file(creds.expanduser()) if creds is not None else None,
            session_ttl_s=settings.session_credentials_ttl_s,
        )

    @property
    def url(self) -> str:
        return self._url

    @property
    def admin(self) -> JwtAdminCredentials:
        return self._admin

    async def start(self) -> None:
        """Nothing to start: check that the server answers and accepts our credentials."""

        async def _quiet(exc: Exception) -> None:
            return None

        try:
            async with asyncio.timeout(PROBE_DEADLINE_S):
                nc = await nats.connect(
                    self._url,
                    name="prime-agent-probe",
                    allow_reconnect=False,
                    connect_timeout=PROBE_CONNECT_TIMEOUT_S,
                    max_reconnect_attempts=PROBE_ATTEMPTS,
                    reconnect_time_wait=PROBE_RETRY_WAIT_S,
                    error_cb=_quiet,
                    **self._admin.auth_options(),
                )
        except nats.errors.NoServersError:
            raise NatsUnreachable(
                f"cannot reach the NATS server at {self._url} (nothing answers there)"
            ) from None
        except (OSError, TimeoutError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise NatsUnreachable(
                f"cannot reach the NATS server at {self._url}: {reason}"
            ) from None
        except nats.errors.Error as exc:
            text = str(exc).lower()
            refused = isinstance(exc, nats.errors.AuthorizationError)
            if refused or any(marker in text for marker in AUTH_REFUSED_MARKERS):
                raise ConfigError(
                    f"the NATS server at {self._url} refused the orchestrator's credentials: "
                    f"is account {self.issuer.account} with signing key "
                    f"{self.issuer.signing.public} configured there? ({exc})"
                ) from None
            raise BusError(f"cannot connect to the NATS server at {self._url}: {exc}") from None
        with contextlib.suppress(Exception):
            await nc.close()

    async def stop(self) -> None:
        return None  # not ours to stop

    async def add_session_user(self, session_id: str) -> SessionCredentials:
        """Mint a new user for the session (every call: a sandbox start gets fresh keys)."""
        check_session_id(session_id)
        keys, token = self.issuer.mint(
            session_id,
            session_permissions(session_id),
            ttl_s=self.session_ttl_s,
            now=self._clock(),
        )
        return SessionCredentials(
            url=self._url,
            user=keys.public,
            password="",
            session_id=session_id,
            jwt=token,
            seed=keys.seed,
        )

    async def remove_session_user(self, session_id: str) -> None:
        # A signed JWT stays valid until it expires; the router stops answering the session
        # (NatsSessionBus.forget), which is what ends its access to the orchestrator.
        check_session_id(session_id)
