"""The few host-request wire constants the in-kernel runtime needs (stdlib only).

These duplicate ``orchestrator/bus/protocol.py`` on purpose: code under ``orchestrator/runtime``
runs inside the kernel and may import nothing from the host side (no pydantic).
``tests/unit/test_runtime_api.py`` asserts that both stay equal.
"""

from __future__ import annotations

__all__ = [
    "ENV_DEPTH",
    "ENV_HOST_SUBJECT",
    "ENV_INBOX_PREFIX",
    "ENV_MAX_DEPTH",
    "ENV_NATS_JWT",
    "ENV_NATS_NKEY_SEED",
    "ENV_NATS_PASSWORD",
    "ENV_NATS_URL",
    "ENV_NATS_USER",
    "ENV_REQUEST_TIMEOUT_S",
    "ENV_SESSION_ID",
    "HOST_REQUEST_TIMEOUT_S",
    "HOST_SUBJECT_PREFIX",
    "INBOX_PREFIX",
    "MAX_REQUEST_BYTES",
    "PROTOCOL_VERSION",
    "host_subject",
    "inbox_prefix",
]

PROTOCOL_VERSION = 1
HOST_SUBJECT_PREFIX = "pa.host"
INBOX_PREFIX = "_INBOX"
HOST_REQUEST_TIMEOUT_S = 30.0
MAX_REQUEST_BYTES = 1024 * 1024

ENV_NATS_URL = "PRIME_AGENT_NATS_URL"
ENV_NATS_USER = "PRIME_AGENT_NATS_USER"
ENV_NATS_PASSWORD = "PRIME_AGENT_NATS_PASSWORD"
ENV_NATS_JWT = "PRIME_AGENT_NATS_JWT"
ENV_NATS_NKEY_SEED = "PRIME_AGENT_NATS_NKEY_SEED"
ENV_SESSION_ID = "PRIME_AGENT_SESSION_ID"
ENV_HOST_SUBJECT = "PRIME_AGENT_HOST_SUBJECT"
ENV_INBOX_PREFIX = "PRIME_AGENT_INBOX_PREFIX"
ENV_DEPTH = "PRIME_AGENT_DEPTH"
ENV_MAX_DEPTH = "PRIME_AGENT_MAX_DEPTH"
ENV_REQUEST_TIMEOUT_S = "PRIME_AGENT_REQUEST_TIMEOUT_S"


def host_subject(session_id: str) -> str:
    return f"{HOST_SUBJECT_PREFIX}.{session_id}"


def inbox_prefix(session_id: str) -> str:
    return f"{INBOX_PREFIX}.{session_id}"
