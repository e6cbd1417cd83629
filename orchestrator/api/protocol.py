"""The control protocol's messages: one discriminated union per direction, validated by pydantic.

Everything here is data; the socket server (``server.py``) and client (``client.py``) move these
messages as JSON lines (``framing.py``). The daemon validates every line a client sends against
the pydantic models below, and writes its own through ``server_message_adapter``. What the
daemon sends is plain dataclasses (``messages.py``), and the version, capabilities and error
codes are plain constants (``wire.py``), so that a client can read the daemon without pydantic:
the lean ``-p`` client does.
docs/protocol.md is the page a client author reads; its "Protocol version:" line is pinned to
``PROTOCOL_VERSION`` by a test.

Change policy: a new optional field or a new command behind a capability is compatible; removing
or renaming anything, or changing a meaning, bumps ``PROTOCOL_VERSION``. Commands forbid unknown
fields (a newer client talking to an older daemon gets ``invalid_command`` instead of having an
option silently ignored); server messages ignore unknown fields so an older client keeps working
against a daemon that adds to them.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, field_validator

from orchestrator.api.messages import AnyServerMessage
from orchestrator.api.wire import WAIT_QUIET_DEFAULT_S
from orchestrator.mcp_config import McpServerConfig, named_servers_field

__all__ = [
    "COMMAND_TYPES",
    "EXIT_CODE_MAX",
    "HARNESS_LOG_MAX_ROWS",
    "LIST_SESSIONS_LIMIT_MAX",
    "MAX_CAPABILITIES",
    "MAX_ID_CHARS",
    "MUTATING_COMMAND_TYPES",
    "RECENT_EVENTS_MAX",
    "SWEEP_CELLS_PER_CALL",
    "TREE_PAGE_MAX_NODES",
    "USAGE_ROWS_LIMIT_MAX",
    "Abort",
    "Attach",
    "Autonomous",
    "AutonomousSpec",
    "Branch",
    "ClientMessage",
    "Clone",
    "Command",
    "Compact",
    "CompactionChoice",
    "CreateSession",
    "Detach",
    "ExportSession",
    "Fork",
    "GetSession",
    "GetUsage",
    "Goal",
    "GoalSpec",
    "HarnessAccept",
    "HarnessEdit",
    "HarnessList",
    "HarnessLog",
    "HarnessReject",
    "Heartbeat",
    "Hello",
    "ImportSession",
    "ListSessions",
    "ModelChoice",
    "Ping",
    "Prompt",
    "RecordEvalResult",
    "Refine",
    "RefineRollback",
    "RunCheck",
    "SandboxControl",
    "SandboxInfo",
    "ScheduleAdd",
    "ScheduleCancel",
    "ScheduleList",
    "SendMessage",
    "ServerMessage",
    "SessionSettings",
    "SetModel",
    "SetSessionName",
    "Shutdown",
    "SweepAddCells",
    "SweepCancel",
    "SweepCellSpec",
    "SweepClose",
    "SweepList",
    "SweepOpen",
    "SweepProviderLimits",
    "SweepStatus",
    "SweepTrialFinish",
    "SweepTrialStart",
    "Tree",
    "WaitQuiet",
    "client_message_adapter",
    "command_adapter",
    "command_fingerprint",
    "server_message_adapter",
]

# Identifiers (client ids, command ids, session references, capability names) are short tokens.
MAX_API_BASE_CHARS = 2048
MAX_CLIENT_ENV = 8  # a key variable and OPENAI_BASE_URL; room to spare
MAX_ENV_VALUE_CHARS = 8192
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE_CHARS)]
EXIT_CODE_MAX: Final = 255  # a process exit status
# The protocol's own copies of two rules of the layers below, so that a client (the TUI, the
# lean -p path) loads neither the settings nor the stored specs: a stored key variable's name
# (session_specs.ENV_NAME_PATTERN) and the smallest sandbox memory (settings.
# SANDBOX_MEMORY_MIN_MIB). tests/unit/test_run_settings.py keeps them equal.
KEY_ENV_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
SANDBOX_MEMORY_MIN_MIB: Final = 128
# A variable of the client's environment sent with a session: any name a config may give as
# api_key_env (a lower-case one too), so what a config accepts the daemon accepts.
EnvName = Annotated[str, StringConstraints(pattern=KEY_ENV_NAME_PATTERN)]
MAX_IMAGE_CHARS = 256  # an image tag (docker allows 128 for the tag, plus the repository)
WAIT_QUIET_MAX_S = 7 * 24 * 3600.0
MAX_ID_CHARS = 128
# `list_sessions {limit}` at most: about 700 bytes a row keeps the answer under the line cap.
LIST_SESSIONS_LIMIT_MAX = 1000
USAGE_ROWS_LIMIT_MAX = 1000  # a usage row is ~300 bytes: a page stays well under a line
# `get_session {recent}` returns at most this many of the newest events (as attach replays).
RECENT_EVENTS_MAX = 1000
# A hello listing more capabilities than this is a broken or hostile client.
MAX_CAPABILITIES = 64
# An export's target path (PATH_MAX on Linux).
MAX_PATH_CHARS = 4096
MAX_PROMPT_CHARS = 200_000  # a system prompt a run gives its root (session_specs's, pinned)
MAX_SKILL_PATHS = 64  # --skill PATH, repeatable (session_specs's, pinned)
MAX_SKILL_PATH_CHARS = 4096
MAX_CHECK_COMMAND_CHARS = 4096  # a run_check's shell command
MAX_CHECK_TIMEOUT_S = 86_400.0
MAX_MOUNTS = 8  # extra mounts of a session (sandbox/mounts.py's, pinned equal by a test)
# `compact` instructions (the kernel's compact.run has the same limit).
COMPACT_INSTRUCTIONS_MAX_CHARS = 4000
# `tree` answers at most this many events per page (each about 200 bytes of JSON: far below the
# 1 MiB line cap); the client asks again from `next_after`.
TREE_PAGE_MAX_NODES = 2000
# `refine` instructions (the kernel's refine.run has the same limit); harness text fields.
REFINE_INSTRUCTIONS_MAX_CHARS = 4000
HARNESS_CONTENT_MAX_CHARS = 16_000
HARNESS_TITLE_MAX_CHARS = 200
# `harness_log` answers at most this many versions/refinements (newest first).
HARNESS_LOG_MAX_ROWS = 500
# Autonomous gates and goals in `create_session` (docs/control.md).
GATES_MAX = 16
GATE_MAX_CHARS = 4000
GOAL_OBJECTIVE_MAX_CHARS = 4000
SCHEDULE_SPEC_MAX_CHARS = 200
SCHEDULE_PROMPT_MAX_CHARS = 16_000

Token = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
JsonObject = dict[str, Any]


class _ClientModel(BaseModel):
    # Strict about what a client sends: unknown fields are an error, not silently dropped.
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------- client → server


class Hello(_ClientModel):
    """The first line of every connection."""

    type: Literal["hello"] = "hello"
    protocol_version: int
    client_id: Token
    capabilities: list[Token] = Field(default_factory=list, max_length=MAX_CAPABILITIES)


class _Command(_ClientModel):
    # MUTATING commands go through the idempotency journal keyed by (client_id, command_id).
    MUTATING: ClassVar[bool] = False
    command_id: Token


class Ping(_Command):
    type: Literal["ping"] = "ping"
    # Answer only once the daemon is ready (bounded by its own start-up wait): a client that
    # just started the daemon waits for it without polling.
    wait_ready: bool = False


class ListSessions(_Command):
    type: Literal["list_sessions"] = "list_sessions"
    # Filters (optional, so a client that sends none talks to any version-1 daemon).
    roots_only: bool = False
    cwd: str | None = Field(default=None, min_length=1)
    parent: Token | None = None  # only the direct children of this session id
    # Only the newest ``limit`` matching sessions (by creation); the answer's ``total`` counts
    # them all. Without it, every match (a very large store may exceed the line cap).
    limit: int | None = Field(default=None, ge=1, le=LIST_SESSIONS_LIMIT_MAX)


class GetSession(_Command):
    type: Literal["get_session"] = "get_session"
    session: Token
    # Also return the newest `recent` events (bounded like an attach replay) and the cursor.
    recent: int = Field(default=0, ge=0, le=RECENT_EVENTS_MAX)


class MountChoice(_ClientModel):
    """A host directory shown at one more path in the session's sandbox (docker only; a
    Harbor task's /app, /tests, /logs). The daemon checks both paths (sandbox/mounts.py)."""

    source: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    target: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    read_only: bool = False


class AutonomousSpec(_ClientModel):
    """Autonomous mode for a new session (docs/control.md); None fields: the defaults."""

    gates: list[Annotated[str, StringConstraints(min_length=1, max_length=GATE_MAX_CHARS)]] = Field(
        default_factory=list, max_length=GATES_MAX
    )
    max_turns: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_ms: int | None = Field(default=None, ge=1)
    gate_timeout_s: float | None = Field(default=None, gt=0)


class GoalSpec(_ClientModel):
    """A goal for a new session (``--goal``; docs/control.md)."""

    objective: str = Field(min_length=1, max_length=GOAL_OBJECTIVE_MAX_CHARS)
    token_budget: int | None = Field(default=None, ge=1)


class ModelChoice(_ClientModel):
    """What a run says about its model over the daemon's ``[models]`` entry (an eval
    config's ``model`` section): stored in the session's model spec, nowhere else."""

    # a name, never a key
    api_key_env: str | None = Field(default=None, pattern=KEY_ENV_NAME_PATTERN)
    context_window: int | None = Field(default=None, ge=1)
    input_cost_per_mtok: float | None = Field(default=None, ge=0)
    output_cost_per_mtok: float | None = Field(default=None, ge=0)
    tool_protocol: Literal["native", "fenced"] | None = None


class CompactionChoice(_ClientModel):
    enabled: bool | None = None
    reserve_tokens: int | None = Field(default=None, ge=0)
    keep_recent_tokens: int | None = Field(default=None, ge=1)


class SessionSettings(_ClientModel):
    """The settings one run chooses for its session over the daemon's ``config.toml``
    (``prime-agent run --config``; docs/control.md). Each ``None`` keeps the daemon's. They
    apply to this session and its family only and are stored with it (docs/daemon.md)."""

    model: ModelChoice | None = None
    memory_mib: int | None = Field(default=None, ge=SANDBOX_MEMORY_MIN_MIB)
    cpus: float | None = Field(default=None, gt=0)
    compaction: CompactionChoice | None = None
    model_max_retries: int | None = Field(default=None, ge=0)
    retry_base_delay_s: float | None = Field(default=None, ge=0)
    session_token_budget: int | None = Field(default=None, ge=1)
    max_depth: int | None = Field(default=None, ge=0)
    # A workspace file (relative, no ".."), bound to the REPL variable ``context`` at every
    # kernel start (a sweep's rlm variant; docs/sweeps.md).
    repl_context_file: str | None = Field(default=None, min_length=1, max_length=255)
    # --max-turns: model calls per user prompt, for the family.
    max_turn_steps: int | None = Field(default=None, ge=1)
    # --system-prompt (instead of the built-in base) and --append-system-prompt (after it):
    # the root's system prompt; its subagents keep their own.
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHARS)
    append_system_prompt: str | None = Field(
        default=None, min_length=1, max_length=MAX_PROMPT_CHARS
    )
    # --mcp-config, an ACP client's session/new mcpServers: the family's own MCP servers,
    # run by the daemon (docs/mcp.md); by the names the kernel reads them by.
    mcp_servers: dict[str, McpServerConfig] | None = None

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _server_names(cls, value: object) -> object:
        return named_servers_field(value, "settings.mcp_servers")

    # --skill PATH (repeatable): absolute paths of skills the family sees (docs/harness.md).
    skill_paths: (
        list[Annotated[str, Field(min_length=1, max_length=MAX_SKILL_PATH_CHARS)]] | None
    ) = Field(default=None, max_length=MAX_SKILL_PATHS)

    @field_validator("skill_paths")
    @classmethod
    def _absolute(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not path.startswith("/") for path in value):
            raise ValueError("skill paths must be absolute")
        return value

    @field_validator("repl_context_file")
    @classmethod
    def _inside_the_workspace(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in value.split("/")):
            raise ValueError("must be a path inside the workspace (relative, no '..')")
        return value


class CreateSession(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["create_session"] = "create_session"
    cwd: str = Field(min_length=1)
    task: str | None = None
    model: str | None = None
    # An OpenAI-compatible endpoint for ``model`` (like the CLI's --api-base).
    api_base: str | None = Field(default=None, max_length=MAX_API_BASE_CHARS)
    backend: str | None = None
    name: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    refine: bool | None = None  # False: this session may not /refine (default: the config's)
    autonomous: AutonomousSpec | None = None
    goal: GoalSpec | None = None
    # The sandbox this session asks for (the CLI's --image, --workspace, --network); each left
    # out is the daemon's config. Stored with the session: every later start uses it.
    image: str | None = Field(
        default=None, min_length=1, max_length=MAX_IMAGE_CHARS, pattern=r"^\S+$"
    )
    workspace: Literal["rw", "ro", "copy"] | None = None
    network: bool | None = None
    mounts: list[MountChoice] | None = Field(default=None, max_length=MAX_MOUNTS)
    # The client's values of the variables the model reads (its key, OPENAI_BASE_URL): used
    # for this session (and its family) only, held in the daemon's memory, never written
    # anywhere (not even into the idempotency journal's fingerprint). None: the daemon's own.
    client_env: dict[EnvName, EnvValue] | None = Field(default=None, max_length=MAX_CLIENT_ENV)
    # What the run chose over the daemon's config (an eval config); None: the config's.
    settings: SessionSettings | None = None


class Prompt(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["prompt"] = "prompt"
    session: Token
    text: str
    # steer: delivered into the running turn; follow_up: queued for after it.
    mode: Literal["steer", "follow_up"] = "follow_up"


class Abort(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["abort"] = "abort"
    session: Token


class Attach(_Command):
    type: Literal["attach"] = "attach"
    session: Token
    # The last cursor the client applied; the daemon replays what follows or sends a snapshot.
    cursor: int | None = Field(default=None, ge=0)
    # Also push the events of the session's descendants (children spawned later included); the
    # answer lists the descendants that exist already, so the client can attach to each.
    family: bool = False


class Detach(_Command):
    type: Literal["detach"] = "detach"
    session: Token


class SendMessage(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["send_message"] = "send_message"
    session: Token
    text: str


class GetUsage(_Command):
    type: Literal["get_usage"] = "get_usage"
    session: Token | None = None
    tree: bool = False
    # Without `session`: only the `limit` most recently created root sessions.
    limit: int | None = Field(default=None, ge=1)
    # Also return per-session rows (calls, tokens, cost, models) for the selection.
    rows: bool = False
    # A page of rows instead (with `rows`): rows [rows_offset, rows_offset + rows_limit) and
    # `rows_total`; `usage` is then empty. Every row of a large store fits no single line.
    rows_offset: int = Field(default=0, ge=0)
    rows_limit: int | None = Field(default=None, ge=1, le=USAGE_ROWS_LIMIT_MAX)


class ExportSession(_Command):
    """Write the session as pi v3 JSONL to ``path`` (absolute; created 0600, replaced if it
    exists): the daemon owns the database while it runs, so exports go through it. Same uid
    as the client (R15), so the daemon writes nothing the client could not write itself."""

    type: Literal["export_session"] = "export_session"
    session: Token
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


class Tree(_Command):
    """One page of the session's event tree (docs/tree.md): events after ``after_seq``."""

    type: Literal["tree"] = "tree"
    session: Token
    after_seq: int = Field(default=0, ge=0)
    limit: int = Field(default=TREE_PAGE_MAX_NODES, ge=1, le=TREE_PAGE_MAX_NODES)


class Branch(_Command):
    """Move the session's leaf to ``event`` (a seq number or an event id), recording
    ``summary`` there first when given. Refused (busy) while the session or a loaded
    descendant runs; an idle loaded session is unloaded, so it reloads from the new leaf."""

    MUTATING: ClassVar[bool] = True
    type: Literal["branch"] = "branch"
    session: Token
    event: Token
    summary: str | None = None


class Fork(_Command):
    """A new inactive session holding the path up to ``event`` (default: the leaf)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["fork"] = "fork"
    session: Token
    event: Token | None = None


class Clone(_Command):
    """A new inactive session holding a copy of the session's active path."""

    MUTATING: ClassVar[bool] = True
    type: Literal["clone"] = "clone"
    session: Token


class ImportSession(_Command):
    """Read the pi / Prime Agent session file at ``path`` (absolute, read by the daemon: same
    uid as the client) into a new inactive session. ``cwd`` overrides the file's; the file's
    is used when it is a directory here, else ``fallback_cwd``."""

    MUTATING: ClassVar[bool] = True
    type: Literal["import_session"] = "import_session"
    path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    model: str | None = Field(default=None, min_length=1, max_length=MAX_API_BASE_CHARS)
    cwd: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_CHARS)
    fallback_cwd: str | None = Field(default=None, min_length=1, max_length=MAX_PATH_CHARS)
    backend: str | None = None
    name: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)


class Compact(_Command):
    """``/compact [instructions]``: summarise the older part of the session's context
    (docs/compaction.md). An idle session is compacted before the answer; a session in a turn
    compacts at its next step boundary (``scheduled: true``)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["compact"] = "compact"
    session: Token
    instructions: str | None = Field(default=None, max_length=COMPACT_INSTRUCTIONS_MAX_CHARS)


class SetModel(_Command):
    """``/model``: use ``model`` from the session's next model call on (a ``model_change``
    event on its path, docs/tree.md). Refused while the session is in a turn."""

    MUTATING: ClassVar[bool] = True
    type: Literal["set_model"] = "set_model"
    session: Token
    model: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    api_base: str | None = Field(default=None, max_length=MAX_API_BASE_CHARS)


class SetSessionName(_Command):
    """Give a session its display name (RPC mode's ``set_session_name``); the name resolves
    it in every command, so it must not be blank."""

    MUTATING: ClassVar[bool] = True
    type: Literal["set_session_name"] = "set_session_name"
    session: Token
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS)


class Refine(_Command):
    """``/refine [instructions]`` (docs/harness.md): plan in the background, apply at the
    session's next turn boundary (now, when it is idle)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["refine"] = "refine"
    session: Token
    instructions: str | None = Field(default=None, max_length=REFINE_INSTRUCTIONS_MAX_CHARS)
    scope: Literal["local", "global"] = "local"


class RefineRollback(_Command):
    """``refine rollback ID``: restore the before-state of every edit of refinement ``id``;
    recorded as a refinement of its own."""

    MUTATING: ClassVar[bool] = True
    type: Literal["refine_rollback"] = "refine_rollback"
    id: Token


class HarnessLog(_Command):
    """Who changed what, when and why: harness versions and refinements (with their measured
    outcome), newest first; of one session tree (and the global entries) or of everything."""

    type: Literal["harness_log"] = "harness_log"
    session: Token | None = None
    limit: int = Field(default=50, ge=1, le=HARNESS_LOG_MAX_ROWS)


class HarnessList(_Command):
    """The live harness entries a session sees (its tree's local ones and the global ones)."""

    type: Literal["harness_list"] = "harness_list"
    session: Token | None = None  # None: global entries only
    kind: Literal["prompt", "memory", "skill", "subagent"] | None = None


class HarnessEdit(_Command):
    """A user's own harness write (source ``user``): create, update or delete one entry."""

    MUTATING: ClassVar[bool] = True
    type: Literal["harness_edit"] = "harness_edit"
    action: Literal["create", "update", "delete"]
    kind: Literal["prompt", "memory", "skill", "subagent"]
    session: Token | None = None  # the tree of a local entry; None with scope global
    scope: Literal["local", "global"] = "local"
    id: Token | None = None
    title: str | None = Field(default=None, max_length=HARNESS_TITLE_MAX_CHARS)
    content: str | None = Field(default=None, max_length=HARNESS_CONTENT_MAX_CHARS)
    version: int | None = Field(default=None, ge=1)
    reason: str | None = Field(default=None, max_length=REFINE_INSTRUCTIONS_MAX_CHARS)


class HarnessAccept(_Command):
    """The user accepts a pending harness proposal (a kernel's global write): it is written."""

    MUTATING: ClassVar[bool] = True
    type: Literal["harness_accept"] = "harness_accept"
    id: Token
    reason: str | None = Field(default=None, max_length=REFINE_INSTRUCTIONS_MAX_CHARS)


class HarnessReject(_Command):
    """The user rejects a pending harness proposal: nothing is written."""

    MUTATING: ClassVar[bool] = True
    type: Literal["harness_reject"] = "harness_reject"
    id: Token
    reason: str | None = Field(default=None, max_length=REFINE_INSTRUCTIONS_MAX_CHARS)


class ScheduleAdd(_Command):
    """``prime-agent schedule add``: a prompt for ``session`` at the times ``spec`` says
    (``in 10m``, ``every 30s``, ``at <ISO time>``, 5-field cron; docs/schedules.md)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["schedule_add"] = "schedule_add"
    session: Token
    spec: str = Field(min_length=1, max_length=SCHEDULE_SPEC_MAX_CHARS)
    prompt: str = Field(min_length=1, max_length=SCHEDULE_PROMPT_MAX_CHARS)
    label: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    delivery: Literal["steer", "follow_up"] = "follow_up"


class ScheduleList(_Command):
    type: Literal["schedule_list"] = "schedule_list"
    session: Token | None = None
    include_inactive: bool = False


class ScheduleCancel(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["schedule_cancel"] = "schedule_cancel"
    id: Token


class Heartbeat(_Command):
    """``/heartbeat every 10m <text>`` (and ``status``, ``pause``, ``resume``, ``stop``): the
    user's heartbeat of ``session``, one per session."""

    MUTATING: ClassVar[bool] = True
    type: Literal["heartbeat"] = "heartbeat"
    session: Token
    text: str = Field(default="", max_length=SCHEDULE_PROMPT_MAX_CHARS)


class Goal(_Command):
    """``/goal``: set a goal (``objective``, ``token_budget``), or ``status``, ``pause``,
    ``resume``, ``clear`` the session's goal (docs/control.md)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["goal"] = "goal"
    session: Token
    action: Literal["set", "status", "pause", "resume", "clear"] = "status"
    objective: str | None = Field(default=None, max_length=GOAL_OBJECTIVE_MAX_CHARS)
    token_budget: int | None = Field(default=None, ge=1)


class SandboxInfo(_Command):
    """The session's sandbox as it is now (backend, name, state, CPU, memory, log tail); a
    session that is not loaded is not woken for this (``sandbox`` is null)."""

    type: Literal["sandbox_info"] = "sandbox_info"
    session: Token


class SandboxControl(_Command):
    """``stop``: unload the session (snapshot saved, sandbox stopped, status inactive);
    ``restart``: unload and load it again (a new sandbox, namespace revived). Refused (busy)
    while the session or a loaded descendant is in a turn."""

    MUTATING: ClassVar[bool] = True
    type: Literal["sandbox_control"] = "sandbox_control"
    session: Token
    action: Literal["stop", "restart"]


class Autonomous(_Command):
    """``/autonomous``: turn autonomous mode on (the limits and gates given, the rest the
    defaults; counters from zero) or off for an existing session, or read its state."""

    MUTATING: ClassVar[bool] = True
    type: Literal["autonomous"] = "autonomous"
    session: Token
    action: Literal["on", "off", "status"] = "status"
    gates: (
        list[Annotated[str, StringConstraints(min_length=1, max_length=GATE_MAX_CHARS)]] | None
    ) = Field(default=None, max_length=GATES_MAX)
    max_turns: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_ms: int | None = Field(default=None, ge=1)


class WaitQuiet(_Command):
    """Wait until the session's whole tree is quiet (nothing running, no input waiting) and
    answer with its last turn's outcome: print mode through the daemon. ``release`` unloads
    the tree afterwards (sandboxes stopped, state inactive; it reloads on demand)."""

    type: Literal["wait_quiet"] = "wait_quiet"
    session: Token
    timeout_s: float = Field(default=WAIT_QUIET_DEFAULT_S, gt=0, le=WAIT_QUIET_MAX_S)
    release: bool = False


class RunCheck(_Command):
    """Run a shell command in a quiet session's sandbox, in its workspace, the way an
    autonomous gate runs (control/gates.py), and answer with its exit code and bounded
    output: a sweep's verifier after the agent's turn (a Harbor task's ``tests/test.sh``).
    ``release`` unloads the tree afterwards, as ``wait_quiet``'s does."""

    MUTATING: ClassVar[bool] = True
    type: Literal["run_check"] = "run_check"
    session: Token
    command: str = Field(min_length=1, max_length=MAX_CHECK_COMMAND_CHARS)
    timeout_s: float = Field(gt=0, le=MAX_CHECK_TIMEOUT_S)
    release: bool = False


class RecordEvalResult(_Command):
    """Write the result of a ``run --config`` whose root is ``session`` (it stopped) to
    ``eval_results``: the daemon owns the database. The daemon sums the tree's tokens and
    cost and reads its gate results; the client sends what only it knows. The answer's
    ``result`` is the row as the JSON file holds it (docs/control.md)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["record_eval_result"] = "record_eval_result"
    session: Token
    config: dict[str, Any]  # the normalised config and its fingerprint
    config_path: str | None = Field(default=None, min_length=1)
    stop_reason: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    exit_code: int = Field(ge=0, le=EXIT_CODE_MAX)
    started_at: datetime
    finished_at: datetime


# -- sweeps (docs/sweeps.md): the runner (``cli/sweep_runner.py``) drives, the daemon keeps the
# tables. Opening and adding cells are idempotent (not journaled: their answers are large);
# starting and finishing a trial are journaled, so a repeat never counts a trial twice.

SWEEP_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SWEEP_CELLS_PER_CALL: Final = 500  # keeps a call's line and its answer well under 1 MiB
MAX_ANSWER_CHARS: Final = 20_000
MAX_ERROR_CHARS: Final = 2_000
SweepName = Annotated[str, StringConstraints(pattern=SWEEP_NAME_PATTERN)]


class SweepProviderLimits(_ClientModel):
    """The protocol's copy of ``settings.ProviderLimitsConfig`` (a client loads no settings;
    tests/unit/test_run_settings.py keeps the two equal)."""

    connections: int | None = Field(default=None, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class SweepOpen(_Command):
    """Create the sweep ``name`` or take it over for the runner ``runner_pid`` (refused while
    another runner of it is alive); a dead runner's trials are abandoned."""

    type: Literal["sweep_open"] = "sweep_open"
    name: SweepName
    spec: dict[str, Any]
    digest: Token
    runner_pid: int = Field(ge=1)
    # Per endpoint key: {connections, requests_per_minute, tokens_per_minute}, applied to the
    # daemon's provider gates (models/provider_gate.py) for every session from now on.
    providers: dict[Token, SweepProviderLimits] = Field(default_factory=dict, max_length=64)


class SweepCellSpec(_ClientModel):
    fingerprint: Token
    suite: Token
    task_id: Token
    model: str = Field(min_length=1, max_length=MAX_API_BASE_CHARS + MAX_ID_CHARS)
    variant: Token
    seed: int
    context_tokens: int | None = Field(default=None, ge=0)
    # Why this machine cannot run the cell (a GPU task without a GPU runtime, an image that is
    # not here): the cell is marked ``unrunnable`` with the reason instead of being run; a cell
    # given without one that was ``unrunnable`` becomes ``pending`` again.
    unrunnable: str | None = Field(default=None, min_length=1, max_length=MAX_ERROR_CHARS)


class SweepAddCells(_Command):
    """Add the cells that are new (by fingerprint); answer every given cell's row."""

    type: Literal["sweep_add_cells"] = "sweep_add_cells"
    name: SweepName
    cells: list[SweepCellSpec] = Field(min_length=1, max_length=SWEEP_CELLS_PER_CALL)


class SweepTrialStart(_Command):
    """A new trial of cell ``fingerprint``, running in root session ``session``."""

    MUTATING: ClassVar[bool] = True
    type: Literal["sweep_trial_start"] = "sweep_trial_start"
    name: SweepName
    fingerprint: Token
    session: Token


class SweepTrialFinish(_Command):
    """How trial ``trial`` ended; the daemon adds its tree's tokens and cost."""

    MUTATING: ClassVar[bool] = True
    type: Literal["sweep_trial_finish"] = "sweep_trial_finish"
    trial: Token
    state: Literal["scored", "errored"]
    score: float | None = Field(default=None, ge=0, le=1)
    answer: str | None = Field(default=None, max_length=MAX_ANSWER_CHARS)
    stop_reason: Token
    error_class: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    truncated: bool = False
    wall_s: float = Field(ge=0)


class SweepStatus(_Command):
    """The sweep's row and its cells (all of them, or the page from ``offset``); with
    ``trials``, every trial of the page's cells too (a shard's export)."""

    type: Literal["sweep_status"] = "sweep_status"
    name: SweepName
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=SWEEP_CELLS_PER_CALL, ge=1, le=SWEEP_CELLS_PER_CALL)
    trials: bool = False


class SweepList(_Command):
    """Every sweep, newest first, with its counts, cost and ETA."""

    type: Literal["sweep_list"] = "sweep_list"
    limit: int = Field(default=SWEEP_CELLS_PER_CALL, ge=1, le=SWEEP_CELLS_PER_CALL)


class SweepCancel(_Command):
    """No trial of the sweep starts from now on; its running trials' sessions are aborted."""

    MUTATING: ClassVar[bool] = True
    type: Literal["sweep_cancel"] = "sweep_cancel"
    name: SweepName


class SweepClose(_Command):
    """The runner is done: the sweep's final state (kept ``cancelled`` if it was)."""

    MUTATING: ClassVar[bool] = True
    type: Literal["sweep_close"] = "sweep_close"
    name: SweepName
    state: Literal["done", "incomplete", "budget"]


class Shutdown(_Command):
    MUTATING: ClassVar[bool] = True
    type: Literal["shutdown"] = "shutdown"
    force: bool = False


# One list of commands; the client-side union adds the handshake to it.
_Commands = (
    Ping
    | ListSessions
    | GetSession
    | CreateSession
    | Prompt
    | Abort
    | Attach
    | Detach
    | SendMessage
    | GetUsage
    | ExportSession
    | Tree
    | Branch
    | Fork
    | Clone
    | ImportSession
    | Compact
    | SetModel
    | SetSessionName
    | Refine
    | RefineRollback
    | HarnessLog
    | HarnessList
    | HarnessEdit
    | HarnessAccept
    | HarnessReject
    | ScheduleAdd
    | ScheduleList
    | ScheduleCancel
    | Heartbeat
    | Goal
    | SandboxInfo
    | SandboxControl
    | Autonomous
    | WaitQuiet
    | RunCheck
    | RecordEvalResult
    | SweepOpen
    | SweepAddCells
    | SweepTrialStart
    | SweepTrialFinish
    | SweepStatus
    | SweepList
    | SweepCancel
    | SweepClose
    | Shutdown
)
Command = Annotated[_Commands, Field(discriminator="type")]
ClientMessage = Annotated[Hello | _Commands, Field(discriminator="type")]

_COMMAND_CLASSES: tuple[type[_Command], ...] = (
    Ping,
    ListSessions,
    GetSession,
    CreateSession,
    Prompt,
    Abort,
    Attach,
    Detach,
    SendMessage,
    GetUsage,
    ExportSession,
    Tree,
    Branch,
    Fork,
    Clone,
    ImportSession,
    Compact,
    SetModel,
    SetSessionName,
    Refine,
    RefineRollback,
    HarnessLog,
    HarnessList,
    HarnessEdit,
    HarnessAccept,
    HarnessReject,
    ScheduleAdd,
    ScheduleList,
    ScheduleCancel,
    Heartbeat,
    Goal,
    SandboxInfo,
    SandboxControl,
    Autonomous,
    WaitQuiet,
    RunCheck,
    RecordEvalResult,
    SweepOpen,
    SweepAddCells,
    SweepTrialStart,
    SweepTrialFinish,
    SweepStatus,
    SweepList,
    SweepCancel,
    SweepClose,
    Shutdown,
)
COMMAND_TYPES: frozenset[str] = frozenset(
    str(cls.model_fields["type"].default) for cls in _COMMAND_CLASSES
)
MUTATING_COMMAND_TYPES: frozenset[str] = frozenset(
    str(cls.model_fields["type"].default) for cls in _COMMAND_CLASSES if cls.MUTATING
)

# ---------------------------------------------------------------------------------- server → client


# The messages themselves are plain dataclasses (``messages.py``) so that a client reads them
# without pydantic; the daemon validates and serialises them through this union.
ServerMessage = Annotated[AnyServerMessage, Field(discriminator="type")]

# Built once: a TypeAdapter compiles its validator, which is the expensive part.
command_adapter: TypeAdapter[Command] = TypeAdapter(Command)
client_message_adapter: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
server_message_adapter: TypeAdapter[ServerMessage] = TypeAdapter(ServerMessage)


def command_fingerprint(command: BaseModel) -> str:
    """A digest of a command without its id: a repeated id must carry the same command."""
    # A client's environment (keys) never reaches the journal, not even as a digest.
    body = command.model_dump_json(exclude={"command_id", "client_env"})
    return hashlib.sha256(body.encode()).hexdigest()
