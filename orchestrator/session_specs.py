"""What a session keeps of its model endpoint, sandbox policy (migration 0007) and the
settings its run chose over the daemon's config (migration 0009).

A session's endpoint and sandbox policy belong to the session, not to whichever daemon wakes
it: resume, adoption, wake, idle reload and children use what is stored here, never the
environment of the process that happens to load it (docs/models.md, "A session keeps its
endpoint"). Both are JSON columns of ``sessions`` validated by these models at the store's
boundary. The model spec holds the *name* of the variable that holds the key, never a key.

The store validates the columns with these models and ``models/registry.py`` turns a resolved
model into a ``StoredModel`` and back; both import them from here, one of the basics, because
``store`` and ``models`` are packages of one layer and neither imports the other.

``StoredRunSettings`` holds what an evaluation config (``prime-agent run --config``) set that
is neither the endpoint nor the sandbox: compaction, model-call retries and the depth limit.
A daemon applies them to that session and its family only, over its own ``config.toml``
(``orchestrator/sessions/run_settings.py``); ``None``: the daemon's config, as for ``-p``.

Rows written before 0007 have neither (``None``); ``Orchestrator._load`` resolves such a
session as before (its selector with the loading process's config and environment) once, and
stores the result, so it does not drift again.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.mcp_config import McpServerConfig

__all__ = [
    "MAX_PROMPT_CHARS",
    "MODEL_SPEC_VERSION",
    "RUN_SETTINGS_VERSION",
    "SANDBOX_POLICY_VERSION",
    "StoredCompaction",
    "StoredModel",
    "StoredMount",
    "StoredPrices",
    "StoredRunSettings",
    "StoredSandboxPolicy",
]

MODEL_SPEC_VERSION: Final = 1
SANDBOX_POLICY_VERSION: Final = 1
RUN_SETTINGS_VERSION: Final = 1
# A system prompt a run gives its root (--system-prompt, --append-system-prompt).
MAX_PROMPT_CHARS: Final = 200_000
# Skills a run adds (--skill PATH, repeatable): how many, and how long each absolute path.
MAX_SKILL_PATHS: Final = 64
MAX_SKILL_PATH_CHARS: Final = 4096
# An environment variable's name as stored: what a shell accepts, bounded.
ENV_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class _Spec(BaseModel):
    # Extra fields are refused: a row holding something we do not understand is damaged.
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoredPrices(_Spec):
    """USD per token (``registry.Prices``)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


class StoredModel(_Spec):
    """The model a session talks to, as resolved when it was created (or last switched)."""

    version: Literal[1] = MODEL_SPEC_VERSION
    selector: str = Field(min_length=1)  # e.g. "openai/gpt-4o-mini" (also sessions.model)
    provider: str
    name: str
    # None: the provider's public endpoint (litellm's default), or the embedded model, whose
    # loopback endpoint is per daemon start and found again at load.
    api_base: str | None = None
    # The variable that held the key; None: no key was needed (a local server: the dummy key
    # is sent), or litellm reads the provider's own variable.
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME_PATTERN)
    context_window: int | None = Field(default=None, ge=1)
    max_output_tokens: int = Field(ge=1)
    tool_protocol: Literal["native", "fenced"] = "native"
    prices: StoredPrices | None = None  # None: litellm's bundled map at cost time
    embedded: bool = False
    # The variant an ``embedded/…`` name chose; None: the loading daemon's ``[embedded]``.
    embedded_variant: Literal["0.5b", "1.5b"] | None = None


class StoredMount(_Spec):
    """A host directory shown at one more path inside the sandbox (a Harbor task's ``/app``,
    ``/tests`` and ``/logs``; docs/sweeps.md). Checked by ``sandbox/mounts.py`` when the
    session is created; docker only."""

    source: str = Field(min_length=1)  # an absolute host directory
    target: str = Field(min_length=1)  # an absolute path inside the sandbox
    read_only: bool = False


class StoredSandboxPolicy(_Spec):
    """The sandbox a session asked for: what its next sandbox is started with, whichever
    daemon starts it. ``image`` and the limits apply to docker; the local backend keeps the
    workspace mode and has no network isolation to grant or take away."""

    version: Literal[1] = SANDBOX_POLICY_VERSION
    backend: str = Field(min_length=1)  # also sessions.backend
    image: str = Field(min_length=1, pattern=r"^\S+$")  # "session", "rust", "cuda" or a tag
    workspace: Literal["rw", "ro", "copy"]
    network: bool = False
    memory_bytes: int = Field(ge=1)
    cpus: float = Field(gt=0)
    pids: int = Field(ge=1)
    mounts: tuple[StoredMount, ...] = ()


class StoredCompaction(_Spec):
    """``[compaction]`` fields a run chose; each ``None`` keeps the daemon's."""

    enabled: bool | None = None
    reserve_tokens: int | None = Field(default=None, ge=0)
    keep_recent_tokens: int | None = Field(default=None, ge=1)


class StoredRunSettings(_Spec):
    """The settings a session's run chose over the config of the daemon that runs it (an
    evaluation config's ``compaction``, ``retry`` and ``limits.max_depth``); each ``None``
    keeps the daemon's. Its children share it (one family, one run)."""

    version: Literal[1] = RUN_SETTINGS_VERSION
    compaction: StoredCompaction | None = None
    model_max_retries: int | None = Field(default=None, ge=0)
    retry_base_delay_s: float | None = Field(default=None, ge=0)
    max_depth: int | None = Field(default=None, ge=0)
    # A workspace file the REPL binds to the variable ``context`` at every kernel start (a
    # sweep's rlm variant: the long context; orchestrator/runtime session_setup).
    repl_context_file: str | None = Field(default=None, min_length=1, max_length=255)
    # Model calls per user prompt (``--max-turns``): the family's ``max_turn_steps``.
    max_turn_steps: int | None = Field(default=None, ge=1)
    # The root's system prompt (``--system-prompt``: instead of the built-in base prompt;
    # ``--append-system-prompt``: after it). Its subagents keep their own.
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHARS)
    append_system_prompt: str | None = Field(
        default=None, min_length=1, max_length=MAX_PROMPT_CHARS
    )
    # MCP servers the run brought (``--mcp-config``, an ACP client's ``session/new``): the
    # family's own, run by the orchestrator beside the config's (docs/mcp.md).
    mcp_servers: dict[str, McpServerConfig] | None = None
    # --skill PATH: skill directories (or directories of skills) the family sees after the
    # project's and the user's (absolute host paths; docs/harness.md, "Skills").
    skill_paths: (
        list[Annotated[str, Field(min_length=1, max_length=MAX_SKILL_PATH_CHARS)]] | None
    ) = Field(default=None, max_length=MAX_SKILL_PATHS)

    @property
    def empty(self) -> bool:
        """True when it changes nothing (nothing needs storing)."""
        compaction = self.compaction
        chose_compaction = compaction is not None and bool(compaction.model_dump(exclude_none=True))
        scalars = (
            self.model_max_retries,
            self.retry_base_delay_s,
            self.max_depth,
            self.repl_context_file,
            self.max_turn_steps,
            self.system_prompt,
            self.append_system_prompt,
            self.skill_paths or None,
        )
        chose_mcp = bool(self.mcp_servers)
        return not chose_compaction and not chose_mcp and all(v is None for v in scalars)
