"""Defaults, limits and the user's config file.

Every number SPEC.md names is a constant here (or in the module that owns the concept) and a
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
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError

__all__ = [
    "CELL_TIMEOUT_CEILING_S",
    "CELL_TIMEOUT_DEFAULT_S",
    "DEFAULT_CONTEXT_WINDOW",
    "EMBEDDED_CONTEXT_TOKENS",
    "EMBEDDED_MODEL_NAME",
    "INTERRUPT_GRACE_S",
    "MODEL_MAX_RETRIES",
    "MODEL_STREAM_IDLE_TIMEOUT_S",
    "OUTPUT_STREAM_CAP_CHARS",
    "PROCESS_STOP_GRACE_S",
    "RETRY_BASE_DELAY_S",
    "RETRY_MAX_DELAY_S",
    "WARM_POOL_SIZE",
    "EmbeddedSettings",
    "ModelConfig",
    "Settings",
    "load_settings",
]

# --- REPL (SPEC.md §2) ---------------------------------------------------------------------
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

EMBEDDED_MODEL_NAME = "local/qwen2.5-coder-0.5b"
EMBEDDED_CONTEXT_TOKENS = 8192

# --- subagents and messages (SPEC.md §3) ------------------------------------------------------
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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    variant: Literal["0.5b", "1.5b"] = "0.5b"


class Settings(_Strict):
    default_model: str | None = None
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    cell_timeout_s: float = Field(default=CELL_TIMEOUT_DEFAULT_S, gt=0)
    cell_timeout_ceiling_s: float = Field(default=CELL_TIMEOUT_CEILING_S, gt=0)
    interrupt_grace_s: float = Field(default=INTERRUPT_GRACE_S, gt=0)
    output_cap_chars: int = Field(default=OUTPUT_STREAM_CAP_CHARS, ge=256)
    model_max_retries: int = Field(default=MODEL_MAX_RETRIES, ge=0)
    retry_base_delay_s: float = Field(default=RETRY_BASE_DELAY_S, ge=0)
    retry_max_delay_s: float = Field(default=RETRY_MAX_DELAY_S, ge=0)
    model_stream_idle_timeout_s: float = Field(default=MODEL_STREAM_IDLE_TIMEOUT_S, gt=0)
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
