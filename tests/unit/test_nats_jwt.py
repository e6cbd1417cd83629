"""NATS JWT encoding (orchestrator/bus/nats_jwt.py), the signing-seed file checks, the JWT
credentials a sandbox gets, and the operator-setup helper. No server here: the real server
accepting these tokens is tests/integration/test_external_nats.py."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from pathlib import Path

import nkeys
import pytest

from orchestrator.bus.credentials import SessionCredentials, admin_permissions
from orchestrator.bus.external import AccountIssuer, DecentralizedNats, load_signing_keys
from orchestrator.bus.nats_jwt import (
    CLAIMS_VERSION,
    JwtError,
    KeyKind,
    Keys,
    account_claims,
    creds_text,
    decode_jwt,
    encode_jwt,
    jti_of,
    operator_claims,
    parse_creds,
    public_key_kind,
    seed_kind,
    user_claims,
    verify_jwt,
)
from orchestrator.bus.operator import (
    ACCOUNT_JWT_FILE,
    AUTH_CONFIG_FILE,
    OPERATOR_JWT_FILE,
    SERVER_CONFIG_FILE,
    SIGNING_SEED_FILE,
    OperatorSetup,
    main,
)
from orchestrator.bus.server import session_permissions
from orchestrator.errors import ConfigError
from orchestrator.ids import new_session_id
from orchestrator.runtime.host import HostConfig
from orchestrator.runtime.wire import (
    ENV_NATS_JWT,
    ENV_NATS_NKEY_SEED,
    ENV_NATS_PASSWORD,
    ENV_NATS_USER,
    host_subject,
    inbox_prefix,
)
from orchestrator.settings import NatsSettings, Settings

NOW = 1_800_000_000
TTL_S = 600


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture(scope="module")
def account() -> Keys:
    return Keys.generate(KeyKind.ACCOUNT)


@pytest.fixture(scope="module")
def signing() -> Keys:
    return Keys.generate(KeyKind.ACCOUNT)


@pytest.fixture(scope="module")
def user() -> Keys:
    return Keys.generate(KeyKind.USER)


def _session_token(user: Keys, account: Keys, signing: Keys, sid: str) -> str:
    perms = session_permissions(sid)
    claims = user_claims(
        user=user.public,
        name=sid,
        pub_allow=perms["publish"]["allow"],
        sub_allow=perms["subscribe"]["allow"],
        expires_at=NOW + TTL_S,
        issuer_account=account.public,
    )
    return encode_jwt(claims, signing, now=NOW)


# --- keys ----------------------------------------------------------------------------------------


def test_keys_have_the_nkey_prefixes_and_hide_the_seed() -> None:
    for kind, seed_prefix, public_prefix in (
        (KeyKind.OPERATOR, "SO", "O"),
        (KeyKind.ACCOUNT, "SA", "A"),
        (KeyKind.USER, "SU", "U"),
    ):
        keys = Keys.generate(kind)
        assert keys.seed.startswith(seed_prefix) and keys.public.startswith(public_prefix)
        assert seed_kind(keys.seed) == kind and public_key_kind(keys.public) == kind
        assert keys.seed not in repr(keys)
        # The same pair as the nkeys package derives from the seed.
        assert nkeys.from_seed(bytearray(keys.seed.encode())).public_key.decode() == keys.public
        assert Keys.from_seed(keys.seed) == keys


def test_bad_seeds_and_keys_are_refused_without_echo(account: Keys) -> None:
    with pytest.raises(JwtError, match="expected a user seed") as caught:
        Keys.from_seed(account.seed, KeyKind.USER)
    assert account.seed not in str(caught.value)
    for garbage in ("", "SAXXXX", "hello", "ü" * 58):
        with pytest.raises(JwtError) as caught:
            seed_kind(garbage)
        assert "not an nkey seed" in str(caught.value)
    broken = account.public[:-1] + ("A" if account.public[-1] != "A" else "B")
    with pytest.raises(JwtError):
        public_key_kind(broken)  # checksum
    with pytest.raises(JwtError):
        public_key_kind(account.seed)


# --- encoding --------------------------------------------------------------------------------


def test_user_jwt_decodes_and_its_signature_verifies_with_nkeys(
    account: Keys, signing: Keys, user: Keys
) -> None:
    sid = new_session_id()
    token = _session_token(user, account, signing, sid)
    header_b64, payload_b64, sig_b64 = token.split(".")
    assert "=" not in token  # base64url without padding
    header, claims = decode_jwt(token)
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    assert claims["iss"] == signing.public and claims["sub"] == user.public
    assert claims["iat"] == NOW and claims["exp"] == NOW + TTL_S and claims["name"] == sid
    assert claims["nats"] == {
        "pub": {"allow": [host_subject(sid)]},
        "sub": {"allow": [inbox_prefix(sid) + ".>"]},
        "subs": -1,
        "data": -1,
        "payload": -1,
        "issuer_account": account.public,
        "type": "user",
        "version": CLAIMS_VERSION,
    }
    # The signature covers "header.payload" and verifies with the issuer's key (nkeys).
    pair = nkeys.from_seed(bytearray(signing.seed.encode()))
    assert pair.verify(f"{header_b64}.{payload_b64}".encode(), _b64url_decode(sig_b64))
    assert verify_jwt(token, now=NOW) == claims


def test_jti_is_the_base32_sha512_256_of_the_standard_claims(
    account: Keys, signing: Keys, user: Keys
) -> None:
    token = _session_token(user, account, signing, new_session_id())
    _, claims = decode_jwt(token)
    # nats-io/jwt: hash of ClaimsData as Go marshals it (aud exp jti iat iss name nbf sub,
    # empty ones omitted, jti empty), SHA-512/256, base32 without padding.
    standard = {
        "exp": claims["exp"],
        "iat": claims["iat"],
        "iss": claims["iss"],
        "name": claims["name"],
        "sub": claims["sub"],
    }
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode())
    expected = base64.b32encode(digest.digest()).decode().rstrip("=")
    assert claims["jti"] == expected == jti_of(claims)
    assert len(claims["jti"]) == 52


def test_verify_refuses_tampering_expiry_and_a_wrong_jti(
    account: Keys, signing: Keys, user: Keys
) -> None:
    token = _session_token(user, account, signing, new_session_id())
    header, payload, sig = token.split(".")
    claims = json.loads(_b64url_decode(payload))
    claims["nats"]["pub"]["allow"] = [">"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(JwtError, match="signature"):
        verify_jwt(f"{header}.{forged}.{sig}", now=NOW)
    with pytest.raises(JwtError, match="expired"):
        verify_jwt(token, now=NOW + TTL_S + 1)
    # Re-signed by the right key but with a stale jti: caught too.
    claims["jti"] = "X" * 52
    with pytest.raises(JwtError, match="jti"):
        payload2 = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        sig2 = base64.urlsafe_b64encode(signing.sign(f"{header}.{payload2}".encode()))
        verify_jwt(f"{header}.{payload2}.{sig2.rstrip(b'=').decode()}", now=NOW)
    for garbage in ("", "a.b", "a.b.c", "!!.??.##"):
        with pytest.raises(JwtError):
            verify_jwt(garbage)


def test_claims_builders_refuse_wrong_key_kinds_and_empty_allow_lists(
    account: Keys, user: Keys
) -> None:
    with pytest.raises(JwtError):
        user_claims(user=account.public, name="x", pub_allow=None, sub_allow=None)
    with pytest.raises(JwtError, match="allow everything"):
        user_claims(user=user.public, name="x", pub_allow=[], sub_allow=None)
    with pytest.raises(JwtError):
        user_claims(
            user=user.public, name="x", pub_allow=None, sub_allow=None, issuer_account=user.public
        )
    with pytest.raises(JwtError):
        account_claims(account=user.public, name="x")
    with pytest.raises(JwtError):
        operator_claims(operator=account.public, name="x")
    with pytest.raises(JwtError, match="subject"):
        encode_jwt({"name": "x"}, account)
    # Unrestricted user: no pub/sub sections at all.
    open_claims = user_claims(user=user.public, name="x", pub_allow=None, sub_allow=None)
    assert "pub" not in open_claims["nats"] and "sub" not in open_claims["nats"]


def test_account_claims_enable_jetstream_and_list_signing_keys(
    account: Keys, signing: Keys
) -> None:
    claims = account_claims(
        account=account.public,
        name="pa",
        signing_keys=[signing.public],
        jetstream_memory_bytes=1,
        jetstream_disk_bytes=2,
    )
    limits = claims["nats"]["limits"]
    assert limits["mem_storage"] == 1 and limits["disk_storage"] == 2
    assert claims["nats"]["signing_keys"] == [signing.public]
    assert claims["nats"]["type"] == "account"
    assert "mem_storage" not in account_claims(account=account.public, name="x")["nats"]["limits"]


def test_creds_text_round_trip(user: Keys, account: Keys) -> None:
    token = encode_jwt(
        user_claims(user=user.public, name="u", pub_allow=None, sub_allow=None), account
    )
    assert parse_creds(creds_text(token, user.seed)) == (token, user.seed)
    with pytest.raises(JwtError):
        parse_creds(creds_text(token, account.seed))  # not a user seed
    with pytest.raises(JwtError):
        parse_creds("no blocks here")


# --- issuing for sessions ----------------------------------------------------------------------


def test_issuer_mints_session_users_with_r17_permissions(account: Keys, signing: Keys) -> None:
    issuer = AccountIssuer(signing=signing, account=account.public)
    sid = new_session_id()
    keys, token = issuer.mint(sid, session_permissions(sid), ttl_s=TTL_S, now=NOW)
    claims = verify_jwt(token, now=NOW)
    assert claims["sub"] == keys.public and claims["iss"] == signing.public
    assert claims["nats"]["issuer_account"] == account.public
    assert claims["nats"]["pub"]["allow"] == [host_subject(sid)]
    assert claims["nats"]["sub"]["allow"] == [inbox_prefix(sid) + ".>"]
    # Signed by the account's own key: no issuer_account.
    own = AccountIssuer(signing=account, account=account.public)
    _, token = own.mint(sid, None, ttl_s=TTL_S, now=NOW)
    assert "issuer_account" not in verify_jwt(token, now=NOW)["nats"]
    # The orchestrator's own grants: serve pa.host.*, answer inboxes, run the mailbox.
    perms = admin_permissions()
    assert "pa.host.*" in perms["subscribe"]["allow"]
    assert "$JS.API.>" in perms["publish"]["allow"]
    assert ">" not in perms["publish"]["allow"] + perms["subscribe"]["allow"]


async def test_session_credentials_carry_jwt_and_seed_not_a_password(
    account: Keys, signing: Keys
) -> None:
    server = DecentralizedNats(
        "nats://127.0.0.1:4222", issuer=AccountIssuer(signing=signing, account=account.public)
    )
    sid = new_session_id()
    creds = await server.add_session_user(sid)
    assert creds.seed not in repr(creds) and creds.jwt not in repr(creds)
    env = creds.env()
    assert env[ENV_NATS_JWT] == creds.jwt and env[ENV_NATS_NKEY_SEED] == creds.seed
    assert ENV_NATS_USER not in env and ENV_NATS_PASSWORD not in env
    assert seed_kind(creds.seed) == KeyKind.USER
    # Every sandbox start gets fresh keys.
    assert (await server.add_session_user(sid)).user != creds.user
    # The kernel side reads the same variables and signs the nonce with the seed.
    config = HostConfig.from_env(env)
    assert config.jwt == creds.jwt and creds.seed not in repr(config)
    options = config.auth_options()
    assert options["user_jwt_cb"]() == creds.jwt.encode()
    signature = base64.b64decode(options["signature_cb"]("nonce-1"))
    pair = nkeys.from_seed(bytearray(creds.seed.encode()))
    assert pair.verify(b"nonce-1", signature)


def test_session_credentials_file_round_trip(account: Keys, signing: Keys, tmp_path: Path) -> None:
    sid = new_session_id()
    keys, token = AccountIssuer(signing=signing, account=account.public).mint(
        sid, session_permissions(sid), ttl_s=TTL_S
    )
    creds = SessionCredentials(
        url="nats://h:1", user=keys.public, password="", session_id=sid, jwt=token, seed=keys.seed
    )
    path = tmp_path / "creds.json"
    creds.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SessionCredentials.read(path) == creds


# --- config ----------------------------------------------------------------------------------


def _seed_file(tmp_path: Path, text: str, mode: int = 0o600, name: str = "signing.nk") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_signing_seed_file_checks(signing: Keys, user: Keys, tmp_path: Path) -> None:
    assert load_signing_keys(_seed_file(tmp_path, f"# nsc\n{signing.seed}\n")) == signing
    cases = [
        (tmp_path / "missing.nk", "does not exist"),
        (_seed_file(tmp_path, signing.seed, 0o640, "group.nk"), "chmod 600"),
        (_seed_file(tmp_path, user.seed, name="user.nk"), "account seed"),
        (_seed_file(tmp_path, "nothing", name="empty.nk"), "exactly one"),
        (tmp_path, "not a regular file"),
    ]
    for path, expected in cases:
        with pytest.raises(ConfigError, match=expected) as caught:
            load_signing_keys(path)
        assert signing.seed not in str(caught.value) and user.seed not in str(caught.value)


def test_nats_settings_validate_into_one_line_errors(
    account: Keys, signing: Keys, tmp_path: Path
) -> None:
    seed = _seed_file(tmp_path, signing.seed)
    ok = DecentralizedNats.from_settings(
        NatsSettings(url="nats://h:4222", account=account.public, account_signing_seed_file=seed)
    )
    assert ok.url == "nats://h:4222" and ok.issuer.issuer_account == account.public
    for settings, expected in (
        (NatsSettings(url="http://h:4222", account_signing_seed_file=seed), "not a NATS URL"),
        (NatsSettings(url="nats://u:p@h:4222", account_signing_seed_file=seed), "credentials"),
        (NatsSettings(url="nats://h:4222"), "account_signing_seed_file"),
        (
            NatsSettings(url="nats://h", account=signing.seed, account_signing_seed_file=seed),
            "account public key",
        ),
        (
            NatsSettings(
                url="nats://h", account_signing_seed_file=seed, creds_file=tmp_path / "no.creds"
            ),
            "creds_file",
        ),
    ):
        with pytest.raises(ConfigError, match=expected) as caught:
            DecentralizedNats.from_settings(settings)
        assert "\n" not in str(caught.value) and signing.seed not in str(caught.value)
    parsed = Settings.model_validate(
        {"nats": {"url": "nats://h:4222", "account_signing_seed_file": str(seed)}}
    )
    assert parsed.nats.account_signing_seed_file == seed
    assert Settings().nats.url is None


# --- the operator-setup helper -------------------------------------------------------------------


def test_operator_setup_is_a_valid_chain(tmp_path: Path) -> None:
    setup = OperatorSetup.generate()
    operator = verify_jwt(setup.operator_jwt)
    assert operator["iss"] == operator["sub"] == setup.operator.public
    assert operator["nats"]["system_account"] == setup.system_account.public
    account = verify_jwt(setup.account_jwt)
    assert account["iss"] == setup.operator.public and account["sub"] == setup.account.public
    assert account["nats"]["signing_keys"] == [setup.signing.public]
    assert account["nats"]["limits"]["disk_storage"] > 0  # JetStream on for the mailbox
    config = setup.server_config(host="127.0.0.1", port=1, store_dir=tmp_path)
    assert config["resolver"] == "MEMORY" and config["operator"] == setup.operator_jwt
    assert config["resolver_preload"][setup.account.public] == setup.account_jwt


def test_operator_helper_writes_private_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "nats-setup"
    assert main(["init", str(directory)]) == 0
    out = capsys.readouterr().out
    seed_path = directory / SIGNING_SEED_FILE
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(seed_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / SERVER_CONFIG_FILE).stat().st_mode) == 0o600
    # The auth part alone (k8s/'s NATS includes it) is the whole config's, and as private.
    auth = json.loads((directory / AUTH_CONFIG_FILE).read_text())
    whole = json.loads((directory / SERVER_CONFIG_FILE).read_text())
    assert auth == {key: whole[key] for key in auth} and "operator" in auth
    assert stat.S_IMODE((directory / AUTH_CONFIG_FILE).stat().st_mode) == 0o600
    for name in (OPERATOR_JWT_FILE, ACCOUNT_JWT_FILE):
        verify_jwt((directory / name).read_text())
    seed = seed_path.read_text().strip()
    assert seed_kind(seed) == KeyKind.ACCOUNT and seed not in out
    assert "[nats]" in out and str(seed_path) in out
    assert main(["init", str(directory)]) == 2  # never overwrites a key
    assert seed_path.read_text().strip() == seed
