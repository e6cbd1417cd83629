"""The host-request contract between a kernel and the orchestrator (stdlib only; the one copy).

A kernel publishes requests on its own subject ``pa.host.<session_id>`` and receives replies on
its own inbox ``_INBOX.<session_id>.>``; NATS permissions allow it nothing else (R17), so the
subject a request arrives on *is* the sender's identity (R18) — nothing in the payload is.

Request (JSON):  ``{"v": 1, "type": "rlm.run", "args": {...}}``
Reply (JSON):    ``{"ok": true, "result": <any JSON>}``
             or  ``{"ok": false, "error": {"code": "...", "message": "...", "retry_after": 1.5}}``

This module is written once, on the kernel's side of the boundary: code under
``orchestrator/runtime`` runs inside the sandbox and imports only the stdlib and what the session
image carries, so the host imports these names from here (``orchestrator/bus/router.py``,
``credentials.py``, the sandbox backends), never the other way round. The host's validated view
of the shapes above (pydantic models) is ``orchestrator/bus/protocol.py``; the kernel builds and
reads them as plain dicts (``orchestrator/runtime/host.py``).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ENV_DEPTH",
    "ENV_HOST_SUBJECT",
    "ENV_INBOX_PREFIX",
    "ENV_MAX_DEPTH",
    "ENV_NATS_CREDENTIALS_DIR",
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
    "MAX_REQUEST_BYTES",
    "MCP_CALL_TIMEOUT_MAX_S",
    "MCP_CALL_TIMEOUT_S",
    "MCP_REQUEST_TYPES",
    "NATS_CREDENTIAL_FILES",
    "PROTOCOL_VERSION",
    "REPL_CONTEXT_FILE_ENV",
    "REPL_CONTEXT_VARIABLE",
    "REQUEST_TIMEOUTS_S",
    "REQUEST_TYPES",
    "host_subject",
    "inbox_prefix",
]

PROTOCOL_VERSION: Final[Literal[1]] = 1
# The kernel env variable naming a workspace file that session setup binds to the REPL
# variable REPL_CONTEXT_VARIABLE (a sweep's rlm variant; docs/sweeps.md).
REPL_CONTEXT_FILE_ENV: Final = "PRIME_AGENT_CONTEXT_FILE"
REPL_CONTEXT_VARIABLE: Final = "context"
HOST_SUBJECT_PREFIX: Final = "pa.host"
INBOX_PREFIX: Final = "_INBOX"
HOST_REQUEST_TIMEOUT_S: Final = 30.0  # docs/spec.md §3: every host request has this default
MAX_REQUEST_BYTES: Final = 1024 * 1024

# Environment a sandbox gets (names only; values are per-session and never logged).
ENV_NATS_URL: Final = "PRIME_AGENT_NATS_URL"
ENV_NATS_USER: Final = "PRIME_AGENT_NATS_USER"
ENV_NATS_PASSWORD: Final = "PRIME_AGENT_NATS_PASSWORD"
# External server (decentralized auth): a user JWT and its nkey seed instead of user/password.
ENV_NATS_JWT: Final = "PRIME_AGENT_NATS_JWT"
ENV_NATS_NKEY_SEED: Final = "PRIME_AGENT_NATS_NKEY_SEED"
# A directory holding the credentials above as files, named by NATS_CREDENTIAL_FILES (a
# Kubernetes pod's Secret): the kernel reads them there, so they need not cross the network
# in its environment. A variable that is set wins over its file.
ENV_NATS_CREDENTIALS_DIR: Final = "PRIME_AGENT_NATS_CREDENTIALS_DIR"
NATS_CREDENTIAL_FILES: Final = {
    ENV_NATS_USER: "nats-user",
    ENV_NATS_PASSWORD: "nats-password",
    ENV_NATS_JWT: "nats-jwt",
    ENV_NATS_NKEY_SEED: "nats-seed",
}
ENV_SESSION_ID: Final = "PRIME_AGENT_SESSION_ID"
ENV_HOST_SUBJECT: Final = "PRIME_AGENT_HOST_SUBJECT"
ENV_INBOX_PREFIX: Final = "PRIME_AGENT_INBOX_PREFIX"
ENV_DEPTH: Final = "PRIME_AGENT_DEPTH"
ENV_MAX_DEPTH: Final = "PRIME_AGENT_MAX_DEPTH"
ENV_REQUEST_TIMEOUT_S: Final = "PRIME_AGENT_REQUEST_TIMEOUT_S"

# Every request type the host answers; the runtime's helpers send exactly these.
REQUEST_TYPES: Final = frozenset(
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
        # docs/mcp.md: MCP servers the orchestrator runs on the host
        "mcp.list",
        "mcp.call_tool",
        "mcp.read_resource",
        "mcp.get_prompt",
        "mcp.cancel",
    }
)

# MCP calls (docs/mcp.md): a tool may run far longer than the 30 s host-request default. The
# kernel waits MCP_CALL_TIMEOUT_S unless told otherwise (the cell's own timeout interrupts it
# sooner, and the kernel then sends ``mcp.cancel``); the host answers within the timeout the
# call carries, at most MCP_CALL_TIMEOUT_MAX_S.
MCP_CALL_TIMEOUT_S: Final = 600.0
MCP_CALL_TIMEOUT_MAX_S: Final = 3600.0
MCP_REQUEST_TYPES: Final = frozenset({"mcp.call_tool", "mcp.read_resource", "mcp.get_prompt"})
# Request types whose handler may run longer than HOST_REQUEST_TIMEOUT_S (the router's bound).
REQUEST_TIMEOUTS_S: Final = {
    request_type: MCP_CALL_TIMEOUT_MAX_S for request_type in MCP_REQUEST_TYPES
}

# code -> meaning. The runtime maps each to an exception class (``runtime/errors.py``
# ``ERROR_CLASSES``); the host refuses any other code (``bus/router.py`` ``HostRequestError``).
ERROR_CODES: Final = {
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
    "mcp_unavailable": "the MCP server is down (crashed, restarting or not started)",
    "mcp_tool_error": "the MCP tool ran and reported an error",
    "mcp_timeout": "the MCP server did not answer within the call's timeout",
    "internal": "the orchestrator failed; the message says how",
}


def host_subject(session_id: str) -> str:
    """The one subject ``session_id`` may publish requests on."""
    return f"{HOST_SUBJECT_PREFIX}.{session_id}"


def inbox_prefix(session_id: str) -> str:
    """The prefix of the only inboxes ``session_id`` may subscribe to (replies)."""
    return f"{INBOX_PREFIX}.{session_id}"
