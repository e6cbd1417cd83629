"""The host-request wire format between a kernel and the orchestrator (over NATS).

A kernel publishes requests on its own subject ``pa.host.<session_id>`` and receives replies on
its own inbox ``_INBOX.<session_id>.>``; NATS permissions allow it nothing else (R17), so the
subject a request arrives on *is* the sender's identity (R18) — nothing in the payload is.

Request (JSON):  ``{"v": 1, "type": "rlm.run", "args": {...}}``
Reply (JSON):    ``{"ok": true, "result": <any JSON>}``
             or  ``{"ok": false, "error": {"code": "...", "message": "...", "retry_after": 1.5}}``

The in-kernel runtime (``orchestrator/runtime``, stdlib + nats-py only) builds and reads these
as plain dicts; this module is the host side's validated view of the same shapes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    "ERROR_CODES",
    "HOST_REQUEST_TIMEOUT_S",
    "HOST_SUBJECT_PREFIX",
    "INBOX_PREFIX",
    "PROTOCOL_VERSION",
    "REQUEST_TYPES",
    "HostErrorBody",
    "HostReply",
    "HostRequest",
    "host_subject",
    "inbox_prefix",
]

PROTOCOL_VERSION: Literal[1] = 1
HOST_SUBJECT_PREFIX = "pa.host"
INBOX_PREFIX = "_INBOX"
HOST_REQUEST_TIMEOUT_S = 30.0  # docs/spec.md §3: every host request has this default timeout
MAX_REQUEST_BYTES = 1024 * 1024

# Environment a sandbox gets (names only; values are per-session and never logged).
ENV_NATS_URL = "PRIME_AGENT_NATS_URL"
ENV_NATS_USER = "PRIME_AGENT_NATS_USER"
ENV_NATS_PASSWORD = "PRIME_AGENT_NATS_PASSWORD"
# External server (decentralized auth): a user JWT and its nkey seed instead of user/password.
ENV_NATS_JWT = "PRIME_AGENT_NATS_JWT"
ENV_NATS_NKEY_SEED = "PRIME_AGENT_NATS_NKEY_SEED"
ENV_SESSION_ID = "PRIME_AGENT_SESSION_ID"
ENV_HOST_SUBJECT = "PRIME_AGENT_HOST_SUBJECT"
ENV_INBOX_PREFIX = "PRIME_AGENT_INBOX_PREFIX"
ENV_DEPTH = "PRIME_AGENT_DEPTH"
ENV_MAX_DEPTH = "PRIME_AGENT_MAX_DEPTH"
ENV_REQUEST_TIMEOUT_S = "PRIME_AGENT_REQUEST_TIMEOUT_S"

REQUEST_TYPES = frozenset(
    {
        "rlm.run",
        "rlm.list_subagents",
        "rlm.delete_subagent",
        "rlm.find_models",
        "rlm.query",
        "rlm.query_batched",
        "agent_message.send",
        "agent_message.list_agents",
        "agent_observe.list",
        "agent_observe.get",
        "agent_observe.recent",
        "history.search",
        "history.get",
        "history.tail",
        "compact.run",
        "compact.status",
        "harness.create",
        "harness.update",
        "harness.delete",
        "harness.list",
        "harness.get",
        "harness.history",
        "refine.run",
        "refine.status",
        "refine.rollback",
        # docs/control.md: goals and heartbeats
        "goal.create",
        "goal.get",
        "goal.complete",
        "rlm_heartbeat.create",
        "rlm_heartbeat.list",
        "rlm_heartbeat.update",
        "rlm_heartbeat.delete",
    }
)

# code -> meaning. The runtime maps each to an exception class (orchestrator/runtime/errors.py).
ERROR_CODES = {
    "invalid_argument": "a bad argument (wrong type, too long, unknown name)",
    "unknown_request": "the request type does not exist or is not enabled",
    "not_found": "the named agent or child does not exist",
    "not_family": "the target is not the caller's parent, sibling or child",
    "depth_limit": "spawning would exceed the maximum depth",
    "quota_exceeded": "too many live children, or too many pending messages for a target",
    "budget_exceeded": "the token budget does not allow this",
    "rate_limited": "too many messages per second to one target (see retry_after)",
    "model_unavailable": "the requested model cannot be used with current credentials",
    "conflict": "the harness entry changed since the version the write was based on",
    "internal": "the orchestrator failed; the message says how",
}


def host_subject(session_id: str) -> str:
    return f"{HOST_SUBJECT_PREFIX}.{session_id}"


def inbox_prefix(session_id: str) -> str:
    return f"{INBOX_PREFIX}.{session_id}"


class HostRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    v: Literal[1] = PROTOCOL_VERSION
    type: str
    args: dict[str, Any] = Field(default_factory=dict)


class HostErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    message: str
    retry_after: float | None = None


class HostReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    result: Any = None
    error: HostErrorBody | None = None
