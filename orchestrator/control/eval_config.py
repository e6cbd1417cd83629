"""Evaluation configs: one YAML file binds a task to a model, policies, gates and limits.

``prime-agent run --config F`` (issue 8, docs/spec.md §7; docs/control.md) runs one config as one
session tree and records how it stopped and what it cost (``orchestrator/store/eval_results``).
A config is the single-run unit a sweep (not built yet: docs/spec.md, "Not built") would
multiply. Its shape::

    name: fix-tests                     # optional; default: the file's stem
    task: |                             # the prompt; or task_file: (relative to this file)
      Make `python -m pytest -q` pass.
    cwd: project                        # relative to this file; default: its directory
    model:
      name: openai/gpt-4o-mini          # provider/name
      api_base: http://127.0.0.1:8000/v1
      api_key_env: MY_KEY               # the name of an env var, never the key itself
      context_window: 32768
      input_cost_per_mtok: 0.15
      output_cost_per_mtok: 0.6
      tool_protocol: native             # or fenced
    backend: local                      # auto | docker | bwrap | local | kubernetes
    sandbox: {image: session, workspace: rw, memory_mib: 2048, cpus: 1.0}
    compaction: {enabled: true, reserve_tokens: 16384, keep_recent_tokens: 20000}
    refine: {enabled: false}
    retry: {max_retries: 3, base_delay_s: 2.0}
    autonomous:                         # present (even empty) = autonomous mode
      gates: ["python -m pytest -q"]
      max_turns: 12
      max_tokens: 80000
      timeout_ms: 1800000
      gate_timeout_s: 300
    goal: {objective: "...", token_budget: 50000}
    limits: {session_token_budget: 200000, max_depth: 1}
    output: results/fix-tests.json      # default: <this dir>/<name>.result.json

Every section but ``task``/``task_file`` and ``model`` is optional; a field left out keeps the
user's ``config.toml`` value (``EvalConfig.settings``), and an autonomous limit left out keeps
the autonomous policy's default (``orchestrator/control/autonomous.py``). Unknown keys, duplicate
keys and bad values are refused with one line naming the file and the field, e.g.
``eval.yaml: autonomous.max_turns: must be >= 1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.control.yaml_file import read_yaml_mapping, validation_line
from orchestrator.errors import ConfigError
from orchestrator.sandbox.choice import BACKEND_CHOICES, BackendRequest
from orchestrator.settings import (
    SANDBOX_MEMORY_MIN_MIB,
    CompactionSettings,
    HarnessSettings,
    ModelConfig,
    SandboxSettings,
    Settings,
)

__all__ = [
    "EVAL_BACKENDS",
    "EVAL_NAME_PATTERN",
    "RESULT_SUFFIX",
    "AutonomousSection",
    "CompactionSection",
    "EvalConfig",
    "GoalSection",
    "LimitsSection",
    "ModelSection",
    "RefineSection",
    "RetrySection",
    "SandboxSection",
    "load_eval_config",
]

EVAL_BACKENDS: Final = BACKEND_CHOICES  # orchestrator/sandbox/choice.py's rule
# A name becomes a session name and a file name (<name>.result.json): no slashes or spaces.
EVAL_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RESULT_SUFFIX: Final = ".result.json"
_MODEL_NAME_PATTERN: Final = r"^[^/\s]+/\S+$"
_ENV_VAR_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Keys of the normalised config that do not change what a run does (fingerprint).
_NOT_FINGERPRINTED: Final = frozenset({"output"})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    """``model``: which model, and what ``config.toml`` would declare about it."""

    name: str = Field(pattern=_MODEL_NAME_PATTERN)
    api_base: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = None
    context_window: int | None = Field(default=None, gt=0)
    input_cost_per_mtok: float | None = Field(default=None, ge=0)
    output_cost_per_mtok: float | None = Field(default=None, ge=0)
    tool_protocol: Literal["native", "fenced"] | None = None

    @field_validator("name", mode="before")
    @classmethod
    def _name_shape(cls, value: object) -> object:
        if isinstance(value, str) and "/" not in value:
            raise ValueError(f"must be provider/name (e.g. openai/gpt-4o-mini), got {value!r}")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(_ENV_VAR_PATTERN, value):
            raise ValueError("must be the name of an environment variable, never the key itself")
        return value

    def overrides(self) -> dict[str, Any]:
        """The ``ModelConfig`` fields this section sets."""
        return self.model_dump(exclude={"name"}, exclude_none=True)

    def session_choice(self) -> dict[str, Any]:
        """What a session's ``settings.model`` carries of it (``ModelChoice``): the overrides
        but the endpoint, which ``create_session`` takes as its own field."""
        return {k: v for k, v in self.overrides().items() if k != "api_base"}


class SandboxSection(_Section):
    image: str | None = Field(default=None, min_length=1, pattern=r"^\S+$")
    workspace: Literal["rw", "ro", "copy"] | None = None
    memory_mib: int | None = Field(default=None, ge=SANDBOX_MEMORY_MIN_MIB)
    cpus: float | None = Field(default=None, gt=0)


class CompactionSection(_Section):
    enabled: bool | None = None
    reserve_tokens: int | None = Field(default=None, ge=0)
    keep_recent_tokens: int | None = Field(default=None, ge=1)


class RefineSection(_Section):
    enabled: bool | None = None  # -> harness.refine_enabled


class RetrySection(_Section):
    max_retries: int | None = Field(default=None, ge=0)  # -> model_max_retries
    base_delay_s: float | None = Field(default=None, ge=0)  # -> retry_base_delay_s


class AutonomousSection(_Section):
    """``autonomous``: its presence turns autonomous mode on. The field names are the CLI's
    ``--autonomous-*`` flags; a limit left out (None) keeps the policy's default."""

    gates: list[str] = Field(default_factory=list)
    max_turns: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_ms: int | None = Field(default=None, ge=1)
    gate_timeout_s: float | None = Field(default=None, gt=0)

    @field_validator("gates")
    @classmethod
    def _gates_not_blank(cls, value: list[str]) -> list[str]:
        for i, command in enumerate(value):
            if not command.strip():
                raise ValueError(f"gate {i} is an empty command")
        return value


class GoalSection(_Section):
    objective: str = Field(min_length=1)
    token_budget: int | None = Field(default=None, gt=0)

    @field_validator("objective")
    @classmethod
    def _objective_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class LimitsSection(_Section):
    session_token_budget: int | None = Field(default=None, gt=0)
    max_depth: int | None = Field(default=None, ge=0)


class EvalConfig(_Section):
    """One evaluation config. Built by ``load_eval_config``, which also remembers the file so
    that ``task_file``, ``cwd`` and ``output`` resolve against its directory."""

    name: str | None = None
    task: str | None = None
    task_file: str | None = Field(default=None, min_length=1)
    cwd: str | None = Field(default=None, min_length=1)
    model: ModelSection
    backend: BackendRequest | None = None
    sandbox: SandboxSection | None = None
    compaction: CompactionSection | None = None
    refine: RefineSection | None = None
    retry: RetrySection | None = None
    autonomous: AutonomousSection | None = None
    goal: GoalSection | None = None
    limits: LimitsSection | None = None
    output: str | None = Field(default=None, min_length=1)

    # Where the config came from (None: built in code, paths resolve against the process cwd)
    # and the text of its task_file, read once when it was loaded.
    _source: Path | None = PrivateAttr(default=None)
    _task_text: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str | None) -> str | None:
        if value is not None and not re.match(EVAL_NAME_PATTERN, value):
            raise ValueError(
                "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _autonomous_present(cls, data: Any) -> Any:
        # ``autonomous:`` with nothing after it is YAML null, but it is *present*: autonomous
        # mode with default limits and no gates, as the file reads to a person.
        if isinstance(data, dict) and "autonomous" in data and data["autonomous"] is None:
            data = {**data, "autonomous": {}}
        return data

    @model_validator(mode="after")
    def _one_task(self) -> EvalConfig:
        if (self.task is None) == (self.task_file is None):
            raise ValueError("task: give exactly one of task (the prompt) or task_file")
        if self.task is not None and not self.task.strip():
            raise ValueError("task: must not be empty")
        return self

    # -- resolved values ---------------------------------------------------------------------

    @property
    def source(self) -> Path | None:
        """The config file (absolute), when loaded from one."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """The directory relative paths in the config resolve against."""
        return self._source.parent if self._source is not None else Path.cwd()

    @property
    def run_name(self) -> str:
        """``name``, else the config file's stem, else ``eval``."""
        if self.name is not None:
            return self.name
        return self._source.stem if self._source is not None else "eval"

    @property
    def prompt(self) -> str:
        """The task text: ``task``, or the contents of ``task_file``."""
        if self.task is not None:
            return self.task
        if self._task_text is None:
            self._task_text = _read_task_file(self, str(self._source or "<config>"))
        return self._task_text

    @property
    def task_path(self) -> Path | None:
        return None if self.task_file is None else self._resolve(self.task_file)

    @property
    def workdir(self) -> Path:
        """The session's working directory (``cwd``, default the config's directory)."""
        return self.base_dir if self.cwd is None else self._resolve(self.cwd)

    @property
    def output_path(self) -> Path:
        """Where the JSON result goes."""
        if self.output is not None:
            return self._resolve(self.output)
        return self.base_dir / f"{self.run_name}{RESULT_SUFFIX}"

    @property
    def autonomous_mode(self) -> bool:
        return self.autonomous is not None

    def _resolve(self, text: str) -> Path:
        path = Path(os.path.expanduser(text))
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    # -- what the run uses ---------------------------------------------------------------------

    def settings(self, base: Settings) -> Settings:
        """``base`` (the user's settings) with this config's overrides applied; every field the
        config leaves out keeps its ``base`` value."""
        changes: dict[str, Any] = {"default_model": self.model.name}
        model_overrides = self.model.overrides()
        if model_overrides:
            # Only when the config says something about the model: an entry in ``models``
            # replaces what litellm knows (window, prices), so an empty one would lose that.
            known = base.models.get(self.model.name, ModelConfig())
            models = dict(base.models)
            models[self.model.name] = _merged(known, model_overrides)
            changes["models"] = models
        if self.sandbox is not None:
            changes["sandbox"] = _merged(base.sandbox, _set_fields(self.sandbox))
        if self.compaction is not None:
            changes["compaction"] = _merged(base.compaction, _set_fields(self.compaction))
        if self.refine is not None and self.refine.enabled is not None:
            changes["harness"] = _merged(base.harness, {"refine_enabled": self.refine.enabled})
        changes.update(self.run_limits())
        return base.with_overrides(**changes)

    def run_limits(self) -> dict[str, Any]:
        """The retry and limits sections as the ``Settings`` fields they set (each None keeps
        the base's): ``settings`` applies them here, the daemon path sends them with the
        session (``cli/eval_run.session_settings``)."""
        chosen: dict[str, Any] = {}
        if self.retry is not None:
            chosen["model_max_retries"] = self.retry.max_retries
            chosen["retry_base_delay_s"] = self.retry.base_delay_s
        if self.limits is not None:
            chosen["session_token_budget"] = self.limits.session_token_budget
            chosen["max_depth"] = self.limits.max_depth
        return chosen

    def normalised(self) -> dict[str, Any]:
        """The config as JSON types: ``task`` holds the prompt text (also when it came from
        ``task_file``), ``cwd`` is relative to the config's directory, ``output`` absolute."""
        data = self.model_dump(mode="json", exclude={"task_file"})
        data["task"] = self.prompt
        workdir = self.workdir
        try:
            data["cwd"] = workdir.relative_to(self.base_dir.resolve()).as_posix() or "."
        except ValueError:
            data["cwd"] = str(workdir)
        data["output"] = str(self.output_path)
        return data

    def fingerprint(self) -> str:
        """sha256 of the normalised config, without ``output``: the same run, the same hash,
        whatever the key order, whether the task was inline or in a file, or where it went."""
        data = {k: v for k, v in self.normalised().items() if k not in _NOT_FINGERPRINTED}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def record(self) -> dict[str, Any]:
        """What a result stores as its config: the normalised config and its fingerprint."""
        return {**self.normalised(), "fingerprint": self.fingerprint()}


def _set_fields(section: BaseModel) -> dict[str, Any]:
    return section.model_dump(exclude_none=True)


def _merged(
    current: ModelConfig | SandboxSettings | CompactionSettings | HarnessSettings,
    overrides: dict[str, Any],
) -> Any:
    """``current`` with ``overrides``, validated by its own model (same limits as config.toml)."""
    return type(current).model_validate({**current.model_dump(), **overrides})


# -- loading -----------------------------------------------------------------------------------


_PATTERN_MESSAGES: Final = {
    r"^\S+$": "must not be empty or contain whitespace",
    _MODEL_NAME_PATTERN: "must be provider/name (e.g. openai/gpt-4o-mini)",
}


def _read_task_file(config: EvalConfig, shown: str) -> str:
    path = config.task_path
    assert path is not None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: task_file: no such file {path}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: task_file: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: task_file: cannot read {path} ({exc.strerror})") from None
    if not text.strip():
        raise ConfigError(f"{shown}: task_file: {path} is empty")
    return text


def load_eval_config(path: Path | str) -> EvalConfig:
    """Read and validate an evaluation config; every problem is one ``ConfigError`` line that
    names the file (as given) and the field."""
    shown = str(path)
    source = Path(path).expanduser().resolve()
    data = read_yaml_mapping(source, shown, empty="at least task and model")
    try:
        config = EvalConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(shown, exc, _PATTERN_MESSAGES)) from None
    config._source = source
    if config.task_file is not None:
        config._task_text = _read_task_file(config, shown)
    workdir = config.workdir
    if not workdir.is_dir():
        raise ConfigError(f"{shown}: cwd: no such directory {workdir}")
    return config
