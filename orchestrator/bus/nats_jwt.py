"""NATS decentralized-auth JWTs (operator, account, user) and nkey helpers, written here.

The format is nats-io/jwt v2 (what nats-server validates in operator mode):

- header ``{"typ": "JWT", "alg": "ed25519-nkey"}``;
- claims: ``jti``, ``iat``, ``iss`` (the signer's public nkey), ``name``, ``sub`` (the subject's
  public nkey), optional ``exp``, and ``nats`` (type-specific, with ``type`` and ``version: 2``);
- ``jti`` is the unpadded base32 of SHA-512/256 over the compact JSON of the standard claims
  (``aud exp jti iat iss name nbf sub``, in that order, empty ones left out, ``jti`` empty);
- token = ``b64url(header) "." b64url(claims) "." b64url(ed25519(first two parts))``, base64url
  without padding.

A user JWT signed by one of the account's *signing keys* carries ``issuer_account`` (the account's
own public key), so the server can find the account and check that the signer is one of its keys.

Seeds (``S…``) are secrets: nothing here logs them or puts them in an exception message. The
``nkeys`` package does the ed25519 work (the same package nats-py signs nonces with); verifying
against a public key uses PyNaCl directly, which ``nkeys`` is built on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import nacl.exceptions
import nacl.signing
import nkeys

__all__ = [
    "CLAIMS_VERSION",
    "JWT_ALGORITHM",
    "JWT_TYPE",
    "NO_LIMIT",
    "JwtError",
    "KeyKind",
    "Keys",
    "account_claims",
    "creds_text",
    "decode_jwt",
    "encode_jwt",
    "jti_of",
    "operator_claims",
    "parse_creds",
    "public_key_kind",
    "seed_kind",
    "user_claims",
    "verify_jwt",
]

JWT_TYPE: Final = "JWT"
JWT_ALGORITHM: Final = "ed25519-nkey"
CLAIMS_VERSION: Final = 2
NO_LIMIT: Final = -1  # nats-io/jwt: a negative limit means unlimited
SEED_BYTES: Final = 32  # ed25519 seed
PUBLIC_KEY_BYTES: Final = 32
CRC_BYTES: Final = 2
PREFIX_BYTES: Final = 1
JWT_PARTS: Final = 3
BASE32_BLOCK: Final = 8  # base32 pads to a multiple of 8 characters
BASE64_BLOCK: Final = 4
# The standard claims nats-io/jwt hashes for ``jti`` (Go struct order of ClaimsData).
_HASHED_CLAIMS: Final = ("aud", "exp", "jti", "iat", "iss", "name", "nbf", "sub")
# Go's encoding/json escapes these inside strings; the jti hash is over Go's bytes.
_GO_JSON_ESCAPES: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
CREDS_JWT_BEGIN: Final = "-----BEGIN NATS USER JWT-----"
CREDS_JWT_END: Final = "------END NATS USER JWT------"
CREDS_SEED_BEGIN: Final = "-----BEGIN USER NKEY SEED-----"
CREDS_SEED_END: Final = "------END USER NKEY SEED------"


class JwtError(ValueError):
    """A token, key or seed is malformed, forged, of the wrong kind, or expired."""


class KeyKind:
    """nkey roles by their prefix byte (the first letter of the encoded key)."""

    OPERATOR: Final = nkeys.PREFIX_BYTE_OPERATOR  # "O…", seeds "SO…"
    ACCOUNT: Final = nkeys.PREFIX_BYTE_ACCOUNT  # "A…", seeds "SA…"
    USER: Final = nkeys.PREFIX_BYTE_USER  # "U…", seeds "SU…"

    NAMES: Final = {OPERATOR: "operator", ACCOUNT: "account", USER: "user"}


@dataclass(frozen=True)
class Keys:
    """One nkey pair. ``seed`` is the secret (hidden from ``repr``); ``public`` is its id."""

    seed: str = field(repr=False)
    public: str

    @classmethod
    def generate(cls, kind: int) -> Keys:
        if kind not in KeyKind.NAMES:
            raise JwtError(f"unknown nkey kind {kind}")
        seed = nkeys.encode_seed(os.urandom(SEED_BYTES), kind).decode("ascii")
        return cls.from_seed(seed, kind)

    @classmethod
    def from_seed(cls, seed: str, kind: int | None = None) -> Keys:
        """The pair for ``seed``; ``kind`` (a ``KeyKind``) is checked when given."""
        actual = seed_kind(seed)
        if kind is not None and actual != kind:
            raise JwtError(
                f"expected a {KeyKind.NAMES.get(kind, '?')} seed, got a "
                f"{KeyKind.NAMES.get(actual, 'different')} seed"
            )
        pair = nkeys.from_seed(bytearray(seed.encode("ascii")))
        return cls(seed=seed, public=bytes(pair.public_key).decode("ascii"))

    def sign(self, data: bytes) -> bytes:
        pair = nkeys.from_seed(bytearray(self.seed.encode("ascii")))
        try:
            return bytes(pair.sign(data))
        finally:
            pair.wipe()


def seed_kind(seed: str) -> int:
    """The ``KeyKind`` of a seed; ``JwtError`` (without the seed in it) if it is not one."""
    try:
        raw = seed.strip().encode("ascii")
        prefix, body = nkeys.decode_seed(bytearray(raw))
    except (UnicodeEncodeError, nkeys.NkeysError, ValueError, IndexError, TypeError):
        raise JwtError("not an nkey seed") from None
    if len(body) != SEED_BYTES or prefix not in KeyKind.NAMES:
        raise JwtError("not an nkey seed of a known kind")
    return int(prefix)


def _decode_public(public: str) -> tuple[int, bytes]:
    try:
        padded = public + "=" * (-len(public) % BASE32_BLOCK)
        raw = base64.b32decode(padded.encode("ascii"))
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise JwtError(f"not a public nkey: {public[:60]!r}") from None
    if len(raw) != PREFIX_BYTES + PUBLIC_KEY_BYTES + CRC_BYTES:
        raise JwtError(f"not a public nkey: {public[:60]!r}")
    body, crc = raw[:-CRC_BYTES], raw[-CRC_BYTES:]
    if nkeys.crc16(bytearray(body)) != int.from_bytes(crc, "little"):
        raise JwtError(f"bad checksum in public nkey {public[:60]!r}")
    return body[0], bytes(body[PREFIX_BYTES:])


def public_key_kind(public: str) -> int:
    """The ``KeyKind`` of a public nkey (checksum checked)."""
    kind, _ = _decode_public(public)
    if kind not in KeyKind.NAMES:
        raise JwtError(f"not an operator, account or user key: {public[:60]!r}")
    return kind


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % BASE64_BLOCK))
    except (binascii.Error, ValueError):
        raise JwtError("bad base64url in token") from None


def _go_json(value: Any) -> str:
    """Compact JSON as Go's encoding/json writes it (for a hash that matches nats-io/jwt)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_JSON_ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def jti_of(claims: Mapping[str, Any]) -> str:
    """The ``jti`` nats-io/jwt gives these claims (``jti`` itself is left out of the hash)."""
    standard = {
        name: claims[name]
        for name in _HASHED_CLAIMS
        if name != "jti" and claims.get(name) not in (None, "", 0)
    }
    digest = hashlib.new("sha512_256", _go_json(standard).encode("utf-8")).digest()
    return base64.b32encode(digest).rstrip(b"=").decode("ascii")


def encode_jwt(claims: Mapping[str, Any], signer: Keys, *, now: float | None = None) -> str:
    """Sign ``claims`` with ``signer``: sets ``iss``, ``iat`` and ``jti``; keeps the rest."""
    if not claims.get("sub"):
        raise JwtError("claims need a subject (sub)")
    body: dict[str, Any] = {"jti": "", **claims}
    body["iss"] = signer.public
    body["iat"] = int(time.time() if now is None else now)
    body["jti"] = jti_of(body)
    header = _b64url(_go_json({"typ": JWT_TYPE, "alg": JWT_ALGORITHM}).encode())
    payload = _b64url(_go_json(body).encode("utf-8"))
    signing_input = f"{header}.{payload}"
    return f"{signing_input}.{_b64url(signer.sign(signing_input.encode('ascii')))}"


def decode_jwt(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and claims of ``token``, NOT verified (use ``verify_jwt`` for that)."""
    parts = token.strip().split(".")
    if len(parts) != JWT_PARTS:
        raise JwtError("a JWT has three dot-separated parts")
    try:
        header = json.loads(_b64url_decode(parts[0]))
        claims = json.loads(_b64url_decode(parts[1]))
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, JwtError):
            raise
        raise JwtError("the JWT's header or claims are not JSON") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise JwtError("the JWT's header and claims must be JSON objects")
    return header, claims


def verify_jwt(token: str, *, now: float | None = None) -> dict[str, Any]:
    """The claims of ``token`` after checking header, signature (by ``iss``), ``jti`` and
    expiry. It does not check that the issuer is trusted: that is the caller's (server's)."""
    header, claims = decode_jwt(token)
    if header.get("typ") != JWT_TYPE or header.get("alg") != JWT_ALGORITHM:
        raise JwtError(f"unsupported JWT header {header!r}")
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise JwtError("the JWT has no issuer")
    _, raw_key = _decode_public(issuer)
    signing_input, _, signature = token.strip().rpartition(".")
    try:
        nacl.signing.VerifyKey(raw_key).verify(
            signing_input.encode("ascii"), _b64url_decode(signature)
        )
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        raise JwtError("the JWT's signature does not match its issuer") from None
    if claims.get("jti") != jti_of(claims):
        raise JwtError("the JWT's jti does not match its claims")
    expires = claims.get("exp")
    moment = time.time() if now is None else now
    if isinstance(expires, int) and expires > 0 and moment > expires:
        raise JwtError("the JWT has expired")
    return claims


# --- claims -----------------------------------------------------------------------------------


def _nats_limits() -> dict[str, int]:
    return {"subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT}


def user_claims(
    *,
    user: str,
    name: str,
    pub_allow: Sequence[str] | None,
    sub_allow: Sequence[str] | None,
    expires_at: int | None = None,
    issuer_account: str | None = None,
) -> dict[str, Any]:
    """A user's claims. ``None`` for an allow list means no limit on that side; an empty list
    is not accepted (nats-io/jwt would drop it, which means "everything")."""
    if public_key_kind(user) != KeyKind.USER:
        raise JwtError("the subject of a user JWT must be a user key (U…)")
    permissions: dict[str, Any] = {}
    for side, allow in (("pub", pub_allow), ("sub", sub_allow)):
        if allow is None:
            continue
        if not allow:
            raise JwtError(f"an empty {side} allow list would allow everything")
        permissions[side] = {"allow": list(allow)}
    nats: dict[str, Any] = {**permissions, **_nats_limits()}
    if issuer_account is not None:
        if public_key_kind(issuer_account) != KeyKind.ACCOUNT:
            raise JwtError("issuer_account must be an account key (A…)")
        nats["issuer_account"] = issuer_account
    nats.update({"type": "user", "version": CLAIMS_VERSION})
    claims: dict[str, Any] = {"name": name, "sub": user, "nats": nats}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    return claims


def account_claims(
    *,
    account: str,
    name: str,
    signing_keys: Sequence[str] = (),
    jetstream_memory_bytes: int = 0,
    jetstream_disk_bytes: int = 0,
) -> dict[str, Any]:
    """An account's claims (signed by the operator). JetStream is enabled when either storage
    limit is non-zero (``NO_LIMIT`` = unlimited)."""
    if public_key_kind(account) != KeyKind.ACCOUNT:
        raise JwtError("the subject of an account JWT must be an account key (A…)")
    for key in signing_keys:
        if public_key_kind(key) != KeyKind.ACCOUNT:
            raise JwtError("an account signing key must be an account key (A…)")
    limits: dict[str, Any] = {
        **_nats_limits(),
        "imports": NO_LIMIT,
        "exports": NO_LIMIT,
        "wildcards": True,
        "conn": NO_LIMIT,
        "leaf": NO_LIMIT,
    }
    if jetstream_memory_bytes or jetstream_disk_bytes:
        limits.update(
            {
                "mem_storage": jetstream_memory_bytes,
                "disk_storage": jetstream_disk_bytes,
                "streams": NO_LIMIT,
                "consumer": NO_LIMIT,
            }
        )
    nats: dict[str, Any] = {"limits": limits}
    if signing_keys:
        nats["signing_keys"] = list(signing_keys)
    nats.update({"type": "account", "version": CLAIMS_VERSION})
    return {"name": name, "sub": account, "nats": nats}


def operator_claims(
    *, operator: str, name: str, system_account: str | None = None
) -> dict[str, Any]:
    """A (self-signed) operator's claims."""
    if public_key_kind(operator) != KeyKind.OPERATOR:
        raise JwtError("the subject of an operator JWT must be an operator key (O…)")
    nats: dict[str, Any] = {}
    if system_account is not None:
        nats["system_account"] = system_account
    nats.update({"type": "operator", "version": CLAIMS_VERSION})
    return {"name": name, "sub": operator, "nats": nats}


# --- .creds files -----------------------------------------------------------------------------


def creds_text(jwt: str, seed: str) -> str:
    """The standard ``.creds`` file body (what ``nsc`` writes and NATS clients read)."""
    return (
        f"{CREDS_JWT_BEGIN}\n{jwt}\n{CREDS_JWT_END}\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        f"{CREDS_SEED_BEGIN}\n{seed}\n{CREDS_SEED_END}\n\n"
        "*************************************************************\n"
    )


def parse_creds(text: str) -> tuple[str, str]:
    """``(jwt, seed)`` from a ``.creds`` body; ``JwtError`` (without secrets) if malformed."""
    lines = [line.strip() for line in text.splitlines()]

    def _after(marker: str) -> str:
        for index, line in enumerate(lines[:-1]):
            if line == marker and lines[index + 1]:
                return lines[index + 1]
        raise JwtError(f"no {marker!r} block in the credentials")

    jwt, seed = _after(CREDS_JWT_BEGIN), _after(CREDS_SEED_BEGIN)
    decode_jwt(jwt)
    if seed_kind(seed) != KeyKind.USER:
        raise JwtError("the credentials' seed is not a user seed")
    return jwt, seed
