"""Defaults, limits and the user's config file.

Every number docs/spec.md names is a constant here (or in the module that owns the concept) and a
field of ``Settings`` so that config and tests can change it. Docs quote the constant names.

The config file is ``$XDG_CONFIG_HOME/prime-agent/config.toml``::

    default_model = "openai/my-model"        # optional; else the embedded model

    [models."openai/my-model"]
    api_base = "http://127.0.0.1:8000/v1"
    api_key_env = "MY_KEY"                   # name of an env var, never the key itself
    context_window = 32768
    input_cost_per_mtok = 0.5                # USD per million tokens
    output_cost_per_mtok = 1.5
    tool_protocol = "native"                 # or "fenced"

    [embedded]
    threads = 1

    [sandbox]                                # docs/docker.md
    image = "session"                        # "rust", "cuda" or any image tag
    workspace = "rw"                         # "ro", or "copy" (synced back at stop)
    memory_mib = 2048                        # per container, swap off
    cpus = 1.0
    pids_limit = 256

    [compaction]                             # docs/compaction.md
    reserve_tokens = 16384                   # compact when context > window - reserve
    keep_recent_tokens = 20000               # newest tokens kept verbatim
    drop_large_variables = true              # after it, drop kernel variables > 16 MiB

    [harness]                                # docs/harness.md
    refine_enabled = true                    # /refine allowed in new sessions
    outcome_turns = 10                       # turns before/after a refinement compared
    skills = true                            # list SKILL.md skills in the prompt

    [kubernetes]                             # docs/kubernetes.md (manifests only, so far)
    namespace = "prime-agent"
    image_registry = "registry.example:5000/"   # put before the session image's tag
    runtime_class = "gvisor"                 # optional: gVisor, Kata
    gpus = 0                                 # nvidia.com/gpu per session pod

    [mcp.servers.search]                     # docs/mcp.md: run on the host, never sandboxed
    command = "uvx"                          # a stdio server: command, args, env
    args = ["my-search-server"]
    env = { API_KEY = "..." }

    [mcp.servers.docs]                       # a streamable-HTTP server: url, headers
    url = "https://mcp.example/mcp"
    headers = { Authorization = "Bearer ..." }

    [nats]                                   # optional: an external server (docs/bus.md)
    url = "nats://nats.example:4222"
    account = "A..."                         # the account's public key
    account_signing_seed_file = "/path/to/account-signing.nk"   # 0600; never the seed inline
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import ConfigError
from orchestrator.mcp_config import McpServerConfig, named_servers_field
from orchestrator.model_names import EMBEDDED_MODEL_NAME

__all__ = [
    "CELL_TIMEOUT_CEILING_S",
    "CELL_TIMEOUT_DEFAULT_S",
    "COMPACTION_DROP_VARIABLE_BYTES",
    "COMPACTION_KEEP_RECENT_TOKENS",
    "COMPACTION_RESERVE_TOKENS",
    "DEFAULT_CONTEXT_WINDOW",
    "EMBEDDED_CONTEXT_TOKENS",
    "EMBEDDED_MODEL_NAME",
    "HARNESS_OUTCOME_TURNS",
    "IDLE_UNLOAD_MINUTES",
    "INTERRUPT_GRACE_S",
    "K8S_GATEWAY_PORT",
    "K8S_HOME_MIB",
    "K8S_NAMESPACE",
    "K8S_POOL_SIZE",
    "K8S_TMP_MIB",
    "K8S_WORKSPACE_MIB",
    "MODEL_MAX_RETRIES",
    "MODEL_STREAM_IDLE_TIMEOUT_S",
    "NATS_SESSION_CREDENTIALS_TTL_S",
    "OUTPUT_STREAM_CAP_CHARS",
    "PROCESS_STOP_GRACE_S",
    "RETRY_BASE_DELAY_S",
    "RETRY_MAX_DELAY_S",
    "SANDBOX_CPUS",
    "SANDBOX_IMAGE",
    "SANDBOX_MEMORY_MIB",
    "SANDBOX_PIDS_LIMIT",
    "SANDBOX_WORKSPACE",
    "SNAPSHOT_DEBOUNCE_S",
    "WARM_POOL_SIZE",
    "CompactionSettings",
    "DaemonSettings",
    "EmbeddedSettings",
    "EmbeddedVariant",
    "HarnessSettings",
    "KubernetesSettings",
    "McpSettings",
    "ModelConfig",
    "NatsSettings",
    "ProviderLimitsConfig",
    "SandboxSettings",
    "Settings",
    "load_settings",
]

# --- REPL (docs/spec.md §2) ---------------------------------------------------------------
CELL_TIMEOUT_DEFAULT_S = 600.0  # per-cell timeout when the model does not ask for one
CELL_TIMEOUT_CEILING_S = 3600.0  # the most a model may ask for
INTERRUPT_GRACE_S = 10.0  # after an interrupt, how long a cell may take to stop before restart
OUTPUT_STREAM_CAP_CHARS = 64 * 1024  # per stream, in the tool result the model sees

# --- models ----------------------------------------------------------------------------------
MODEL_MAX_RETRIES = 3  # retries after the first attempt (429, 5xx, timeouts, cut streams)
RETRY_BASE_DELAY_S = 2.0  # exponential backoff base: 2, 4, 8 s
RETRY_MAX_DELAY_S = 60.0  # a Retry-After longer than this fails at once
MODEL_STREAM_IDLE_TIMEOUT_S = 120.0  # no bytes from the provider for this long = timeout
MAX_OUTPUT_TOKENS = 8192  # per model reply
DEFAULT_CONTEXT_WINDOW = 128_000

EMBEDDED_CONTEXT_TOKENS = 8192
EmbeddedVariant = Literal["0.5b", "1.5b"]  # models/embedded.py VARIANTS

# --- subagents and messages (docs/spec.md §3) ----------------------------------------------
MAX_DEPTH = 1  # root is depth 0; children of depth MAX_DEPTH cannot spawn
MAX_LIVE_CHILDREN = 32  # spawn quota per session
MESSAGE_MAX_BYTES = 16 * 1024
MESSAGE_PENDING_MAX = 20  # queued, not yet in the recipient's context
MESSAGE_RATE_PER_S = 3.0  # token bucket per sender -> target (burst of the same size)
RLM_QUERY_CONCURRENCY = 4  # rlm.query_batched in flight per session
RLM_QUERY_BATCH_MAX = 64
FAMILY_WAIT_TIMEOUT_S = 3600.0  # print mode: how long to wait for subagents to go quiet

# --- sandboxes -------------------------------------------------------------------------------
WARM_POOL_SIZE = 1  # started, idle sandboxes kept ready per image
PROCESS_STOP_GRACE_S = 5.0  # SIGTERM -> grace -> SIGKILL of a child process group
SANDBOX_START_TIMEOUT_S = 60.0
# Lifecycle (docs/spec.md §4, docs/snapshots.md): a quiet loaded session is unloaded (inactive)
# after this long; its namespace is snapshotted after cells, debounced by SNAPSHOT_DEBOUNCE_S.
IDLE_UNLOAD_MINUTES = 30.0
# A refinement's measured outcome compares this many turns after it with as many before.
HARNESS_OUTCOME_TURNS = 10
SECONDS_PER_MINUTE = 60.0
SNAPSHOT_DEBOUNCE_S = 2.0
# External NATS server (Settings.nats; docs/bus.md): a session's user JWT expires after this
# (it cannot be revoked earlier).
NATS_SESSION_CREDENTIALS_TTL_S = 24 * 3600.0
# Sandbox policy defaults (Settings.sandbox; docs/docker.md). Memory counts the kernel, the
# gateway and the tmpfs pages the session writes; swap is off.
SANDBOX_IMAGE = "session"  # an image name of orchestrator.sandbox.images, or any tag
SANDBOX_WORKSPACE: Literal["rw", "ro", "copy"] = "rw"
SANDBOX_MEMORY_MIB = 2048
SANDBOX_MEMORY_MIN_MIB = 128  # below this the gateway and kernel alone do not fit
SANDBOX_CPUS = 1.0
SANDBOX_PIDS_LIMIT = 256
SANDBOX_PIDS_MIN = 32  # gateway, kernel and their threads
MIB = 1024**2
# Kubernetes (Settings.kubernetes; docs/kubernetes.md): the namespace of the orchestrator and
# its session pods, the port a pod's gateway listens on, the warm pool, and the size limits of a
# pod's writable directories (/tmp and home in memory, as docker's tmpfs; the workspace on disk).
K8S_NAMESPACE: Final = "prime-agent"
K8S_GATEWAY_PORT: Final = 8888
K8S_POOL_SIZE: Final = 0
K8S_TMP_MIB: Final = 512
K8S_HOME_MIB: Final = 256
K8S_WORKSPACE_MIB: Final = 4096
K8S_PORT_MAX: Final = 65535
# A DNS-1123 label (a namespace, a RuntimeClass name): lower case, digits, '-', at most 63.
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# Compaction (docs/spec.md §5, docs/compaction.md; Settings.compaction): compact when the context
# passes the model's window minus the reserve; keep the newest tokens verbatim; after it, kernel
# variables larger than the drop size may be dropped (and the model is told which).
COMPACTION_RESERVE_TOKENS = 16_384
COMPACTION_KEEP_RECENT_TOKENS = 20_000
COMPACTION_DROP_VARIABLE_BYTES = 16 * MIB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderLimitsConfig(_Strict):
    """``[providers."KEY"]``: what one endpoint (an ``api_base``, or a provider such as
    ``openai``) allows every session of the daemon together (models/provider_gate.py)."""

    connections: int | None = Field(default=None, ge=1)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


class ModelConfig(_Strict):
    """A model the user declared (custom endpoint, window, prices, tool protocol)."""

    api_base: str | None = None
    api_key_env: str | None = None
    context_window: int = Field(default=DEFAULT_CONTEXT_WINDOW, gt=0)
    max_output_tokens: int = Field(default=MAX_OUTPUT_TOKENS, gt=0)
    input_cost_per_mtok: float | None = Field(default=None, ge=0)
    output_cost_per_mtok: float | None = Field(default=None, ge=0)
    cache_read_cost_per_mtok: float | None = Field(default=None, ge=0)
    cache_write_cost_per_mtok: float | None = Field(default=None, ge=0)
    tool_protocol: Literal["native", "fenced"] = "native"


class EmbeddedSettings(_Strict):
    threads: int = Field(default_factory=lambda: max(1, min(2, os.cpu_count() or 1)), ge=1)
    context_tokens: int = Field(default=EMBEDDED_CONTEXT_TOKENS, ge=512)
    # 1.5B: the only variant that solved a real small task (a number in a 2,000-line file);
    # docs/embedded-model.md, "Which embedded variant".
    variant: EmbeddedVariant = "1.5b"


class SandboxSettings(_Strict):
    """``[sandbox]``: the image, workspace mode and limits every session starts with."""

    image: str = Field(default=SANDBOX_IMAGE, min_length=1, pattern=r"^\S+$")
    workspace: Literal["rw", "ro", "copy"] = SANDBOX_WORKSPACE
    memory_mib: int = Field(default=SANDBOX_MEMORY_MIB, ge=SANDBOX_MEMORY_MIN_MIB)
    cpus: float = Field(default=SANDBOX_CPUS, gt=0)
    pids_limit: int = Field(default=SANDBOX_PIDS_LIMIT, ge=SANDBOX_PIDS_MIN)
    # GPUs for docker sandboxes (the cuda image): "" none, "all", or a count ("1", "2"...).
    gpus: str = Field(default="", pattern=r"^(|all|[1-9][0-9]*)$")

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


class CompactionSettings(_Strict):
    """``[compaction]``: when the context is summarised and what the kernel keeps afterwards."""

    enabled: bool = True  # the threshold trigger; overflow, /compact and compact.run always work
    reserve_tokens: int = Field(default=COMPACTION_RESERVE_TOKENS, ge=0)
    keep_recent_tokens: int = Field(default=COMPACTION_KEEP_RECENT_TOKENS, ge=1)
    drop_large_variables: bool = True
    drop_variable_bytes: int = Field(default=COMPACTION_DROP_VARIABLE_BYTES, ge=1)


class HarnessSettings(_Strict):
    """``[harness]``: the Continual Harness and /refine (docs/harness.md)."""

    refine_enabled: bool = True  # new root sessions may refine; children inherit the flag
    outcome_turns: int = Field(default=HARNESS_OUTCOME_TURNS, ge=1)  # measured-outcome window
    skills: bool = True  # discover SKILL.md skills (project and user dirs)


class DaemonSettings(_Strict):
    """``[daemon]``: whether CLI commands that need the daemon start it (docs/cli.md); the
    environment variable ``PRIME_AGENT_DAEMON_AUTOSTART`` (0/1) overrides it. ``model_workers``:
    how many processes read OpenAI-compatible model streams for the daemon's sessions
    (models/call_workers.py); unset, one per core but one from 4 cores up (at most 4), none
    below. They start by demand."""

    autostart: bool = True
    model_workers: int | None = Field(default=None, ge=0)


class KubernetesSettings(_Strict):
    """``[kubernetes]``: where session pods run and how they are built (docs/kubernetes.md).

    ``context``: the kubeconfig context (None: the current one, or in-cluster). ``image_registry``
    is put before the session image's tag (``prime-agent/session:latest``), as the cluster pulls
    it from there. ``runtime_class``: a RuntimeClass for every session pod (gVisor, Kata).
    ``gpus``: ``nvidia.com/gpu`` each session pod asks for. ``pool_size``: ready pods kept warm.
    ``reach``: how the orchestrator reaches a pod's gateway: ``pod-ip`` (in the cluster),
    ``port-forward`` (through the API server, from outside), ``auto`` (pod IP when it runs in
    a pod, else port-forward).
    """

    context: str | None = Field(default=None, min_length=1)
    namespace: str = Field(default=K8S_NAMESPACE, pattern=DNS_LABEL_PATTERN)
    image_registry: str = Field(default="", pattern=r"^(\S+/)?$")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    runtime_class: str | None = Field(default=None, pattern=DNS_LABEL_PATTERN)
    gpus: int = Field(default=0, ge=0)
    pool_size: int = Field(default=K8S_POOL_SIZE, ge=0)
    gateway_port: int = Field(default=K8S_GATEWAY_PORT, ge=1, le=K8S_PORT_MAX)
    tmp_mib: int = Field(default=K8S_TMP_MIB, ge=1)
    home_mib: int = Field(default=K8S_HOME_MIB, ge=1)
    workspace_mib: int = Field(default=K8S_WORKSPACE_MIB, ge=1)
    reach: Literal["pod-ip", "port-forward", "auto"] = "pod-ip"


class NatsSettings(_Strict):
    """``[nats]``: an external NATS server in operator mode instead of the embedded one."""

    url: str | None = None
    account: str | None = None  # public key (A...); omit when the seed is the account's own
    account_signing_seed_file: Path | None = None  # 0600 file holding an SA... seed
    creds_file: Path | None = None  # the orchestrator's own user (.creds); default: minted
    session_credentials_ttl_s: float = Field(default=NATS_SESSION_CREDENTIALS_TTL_S, gt=0)


class McpSettings(_Strict):
    """``[mcp.servers.NAME]``: MCP servers every session gets as ``mcp.NAME`` (docs/mcp.md)."""

    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        """By the names the kernel reads them by (``my-server`` is ``mcp.my_server``)."""
        return named_servers_field(value, "[mcp.servers]")


class Settings(_Strict):
    default_model: str | None = None
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    providers: dict[str, ProviderLimitsConfig] = Field(default_factory=dict)
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    nats: NatsSettings = Field(default_factory=NatsSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    harness: HarnessSettings = Field(default_factory=HarnessSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    cell_timeout_s: float = Field(default=CELL_TIMEOUT_DEFAULT_S, gt=0)
    cell_timeout_ceiling_s: float = Field(default=CELL_TIMEOUT_CEILING_S, gt=0)
    interrupt_grace_s: float = Field(default=INTERRUPT_GRACE_S, gt=0)
    output_cap_chars: int = Field(default=OUTPUT_STREAM_CAP_CHARS, ge=256)
    model_max_retries: int = Field(default=MODEL_MAX_RETRIES, ge=0)
    retry_base_delay_s: float = Field(default=RETRY_BASE_DELAY_S, ge=0)
    retry_max_delay_s: float = Field(default=RETRY_MAX_DELAY_S, ge=0)
    model_stream_idle_timeout_s: float = Field(default=MODEL_STREAM_IDLE_TIMEOUT_S, gt=0)
    # auto: OpenAI-compatible endpoints through the lean client, the rest through litellm;
    # litellm: everything through litellm (docs/models.md, "Two transports").
    model_client: Literal["auto", "litellm"] = "auto"
    warm_pool_size: int = Field(default=WARM_POOL_SIZE, ge=0)
    max_turn_steps: int = Field(default=200, ge=1)  # model calls per user prompt
    max_depth: int = Field(default=MAX_DEPTH, ge=0)
    max_live_children: int = Field(default=MAX_LIVE_CHILDREN, ge=0)
    message_max_bytes: int = Field(default=MESSAGE_MAX_BYTES, ge=1)
    message_pending_max: int = Field(default=MESSAGE_PENDING_MAX, ge=1)
    message_rate_per_s: float = Field(default=MESSAGE_RATE_PER_S, gt=0)
    rlm_query_concurrency: int = Field(default=RLM_QUERY_CONCURRENCY, ge=1)
    family_wait_timeout_s: float = Field(default=FAMILY_WAIT_TIMEOUT_S, gt=0)
    session_token_budget: int | None = Field(default=None, gt=0)  # a root's budget
    idle_unload_minutes: float = Field(default=IDLE_UNLOAD_MINUTES, ge=0)  # 0 = never
    # A turn the daemon's death interrupted continues after the restart (docs/spec.md §4).
    resume_interrupted_turns: bool = True
    idle_unload_seconds: float | None = Field(default=None, gt=0)  # overrides the minutes
    snapshot_debounce_s: float = Field(default=SNAPSHOT_DEBOUNCE_S, ge=0)

    @property
    def idle_unload_after_s(self) -> float | None:
        """Seconds a quiet session stays loaded; None = never unloaded for idleness."""
        if self.idle_unload_seconds is not None:
            return self.idle_unload_seconds
        if self.idle_unload_minutes <= 0:
            return None
        return self.idle_unload_minutes * SECONDS_PER_MINUTE

    def with_overrides(self, **changes: object) -> Settings:
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})


def load_settings(path: Path) -> Settings:
    """Read ``config.toml``; a missing file means defaults, a bad one is a one-line ConfigError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from exc
