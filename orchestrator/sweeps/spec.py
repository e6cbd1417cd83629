"""The sweep file: which suites, models, variants and seeds a sweep crosses, and its budgets
and concurrency (docs/sweeps.md)::

    name: niah-small
    suites: [{suite: s-niah, tasks: 20, context_tokens: [8000, 64000]}]
    models: [openai/gpt-4o-mini, {model: openai/qwen, api_base: "http://127.0.0.1:8000/v1"}]
    variants: [{name: rlm}, {name: vanilla, rlm: false}]
    seeds: [1, 2, 3]
    budgets: {trial_tokens: 200000, sweep_cost_usd: 20}
    concurrency: {trials: 8, sandboxes: 8}

Unknown keys, duplicate keys and bad values are refused with one line naming the file and the
field, as evaluation configs are (``control/yaml_file.py``). A budget this version cannot yet
enforce is not accepted silently: it is an unknown field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.control.eval_config import EVAL_NAME_PATTERN, ModelSection
from orchestrator.control.yaml_file import read_yaml_mapping, validation_line
from orchestrator.errors import ConfigError
from orchestrator.sandbox.choice import BACKEND_CHOICES
from orchestrator.settings import ProviderLimitsConfig
from orchestrator.sweeps.suites import PATH_SUITES, SUITE_NAMES

__all__ = [
    "DEFAULT_CONCURRENCY",
    "MAX_CONTEXT_TOKENS",
    "MAX_SUITE_TASKS",
    "MIN_CONTEXT_TOKENS",
    "Budgets",
    "Concurrency",
    "SuiteEntry",
    "SweepFile",
    "SweepModel",
    "Variant",
    "load_sweep",
]

MIN_CONTEXT_TOKENS: Final = 256
MAX_CONTEXT_TOKENS: Final = 1_048_576
MAX_SUITE_TASKS: Final = 10_000
DEFAULT_CONCURRENCY: Final = 4
MAX_CONCURRENCY: Final = 256
MAX_GRID_CELLS: Final = 100_000
_VARIANT_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"
_PATTERN_MESSAGES: Final = {
    EVAL_NAME_PATTERN: "must be letters, digits, '.', '_' or '-' (at most 64, no spaces)",
    _VARIANT_NAME_PATTERN: "must be letters, digits, '_' or '-' (at most 32)",
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SuiteEntry(_Section):
    """One suite and its size: ``tasks`` per context length of a built-in suite (default
    ``DEFAULT_SUITE_TASKS``); for ``harbor``, ``path`` (a task directory, or a dataset of them;
    relative to the sweep file) and at most ``tasks`` of its tasks (default: all)."""

    suite: str
    tasks: int | None = Field(default=None, ge=1, le=MAX_SUITE_TASKS)
    context_tokens: tuple[int, ...] | None = None
    seed: int = 0  # the generator's: which tasks (the sweep's seeds are the trials')
    path: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _path_where_read(self) -> SuiteEntry:
        if self.suite in PATH_SUITES and self.path is None:
            raise ValueError(f"suite {self.suite} needs a path (a task directory or a dataset)")
        if self.suite not in PATH_SUITES and self.path is not None:
            raise ValueError(f"suite {self.suite} is generated: it takes no path")
        return self

    @field_validator("suite")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in SUITE_NAMES:
            raise ValueError(f"unknown suite {value!r}; built in: {', '.join(SUITE_NAMES)}")
        return value

    @field_validator("context_tokens")
    @classmethod
    def _lengths(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one length")
        for n in value:
            if not MIN_CONTEXT_TOKENS <= n <= MAX_CONTEXT_TOKENS:
                raise ValueError(
                    f"{n}: each length must be {MIN_CONTEXT_TOKENS}..{MAX_CONTEXT_TOKENS} tokens"
                )
        return tuple(dict.fromkeys(value))  # in order, once each


class SweepModel(_Section):
    """A model string, or ``{model, api_base, ...}`` (the fields of an eval config's
    ``model`` section, with ``model`` for its name)."""

    model: str
    api_base: str | None = Field(default=None, min_length=1)
    api_key_env: str | None = None
    context_window: int | None = Field(default=None, gt=0)
    input_cost_per_mtok: float | None = Field(default=None, ge=0)
    output_cost_per_mtok: float | None = Field(default=None, ge=0)
    tool_protocol: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"model": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _as_eval_model(self) -> SweepModel:
        self.section()  # the same rules as an eval config's model (provider/name, env name)
        return self

    def section(self) -> ModelSection:
        fields = self.model_dump(exclude_none=True)
        return ModelSection.model_validate({"name": fields.pop("model"), **fields})

    @property
    def label(self) -> str:
        """How reports and status name it: the model, where when it is not the default, and
        its tool protocol when the entry chose one (one model under both protocols is two
        entries: ``embedded/0.5b+fenced``, ``embedded/0.5b+native``)."""
        label = self.model if self.api_base is None else f"{self.model}@{self.api_base}"
        return label if self.tool_protocol is None else f"{label}+{self.tool_protocol}"


class Variant(_Section):
    """Harness settings a model runs under. ``rlm`` (default): the long context is the REPL
    variable ``context`` and the workspace file ``context.txt``, subagents allowed; ``rlm:
    false`` (vanilla): the context is in the prompt, cut to the model's window (recorded), no
    subagents."""

    name: str = Field(pattern=_VARIANT_NAME_PATTERN)
    rlm: bool = True
    refine: bool = False
    max_depth: int | None = Field(default=None, ge=0)

    def settings(self) -> dict[str, Any]:
        """What a trial's fingerprint takes from the variant (everything that changes a run)."""
        return self.model_dump()


class Budgets(_Section):
    """Per trial: tokens (the session tree's budget), wall time, and the turns of a gated
    task's autonomous run; per sweep: cost and tokens (no new trial starts once spent)."""

    trial_tokens: int | None = Field(default=None, ge=1)
    trial_wall_s: float | None = Field(default=None, gt=0)
    trial_turns: int | None = Field(default=None, ge=1)  # turns of a gated (autonomous) trial
    sweep_cost_usd: float | None = Field(default=None, gt=0)
    sweep_tokens: int | None = Field(default=None, ge=1)

    def per_trial(self) -> dict[str, Any]:
        return {
            "trial_tokens": self.trial_tokens,
            "trial_wall_s": self.trial_wall_s,
            "trial_turns": self.trial_turns,
        }


class Concurrency(_Section):
    """Trials in flight, and sandboxes in flight (each running trial holds one)."""

    trials: int = Field(default=DEFAULT_CONCURRENCY, ge=1, le=MAX_CONCURRENCY)
    sandboxes: int = Field(default=DEFAULT_CONCURRENCY, ge=1, le=MAX_CONCURRENCY)

    @property
    def in_flight(self) -> int:
        return min(self.trials, self.sandboxes)


class SweepFile(_Section):
    name: str = Field(pattern=EVAL_NAME_PATTERN)
    suites: tuple[SuiteEntry, ...] = Field(min_length=1)
    models: tuple[SweepModel, ...] = Field(min_length=1)
    variants: tuple[Variant, ...] = (Variant(name="rlm"),)
    seeds: tuple[int, ...] = Field(default=(1,), min_length=1)
    budgets: Budgets = Budgets()
    concurrency: Concurrency = Concurrency()
    # By endpoint: an api_base, or a provider name (openai, anthropic, ...).
    providers: dict[str, ProviderLimitsConfig] = Field(default_factory=dict)
    backend: str | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str | None) -> str | None:
        if value is not None and value not in BACKEND_CHOICES:
            raise ValueError(f"must be one of {', '.join(BACKEND_CHOICES)}")
        return value

    @model_validator(mode="after")
    def _distinct(self) -> SweepFile:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variants: each name must be used once")
        labels = [m.label for m in self.models]
        if len(set(labels)) != len(labels):
            raise ValueError("models: each model (and endpoint) must be listed once")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: each seed must be listed once")
        return self

    def normalised(self) -> dict[str, Any]:
        """The file as data, defaults filled in: what the database keeps of the sweep."""
        return self.model_dump(mode="json")

    def digest(self) -> str:
        text = json.dumps(self.normalised(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def load_sweep(path: Path | str) -> SweepFile:
    """Read and validate a sweep file: every problem is one ``ConfigError`` line."""
    shown = str(path)
    source = Path(path).expanduser().resolve()
    data = read_yaml_mapping(source, shown, empty="at least name, suites and models")
    _paths_from(source.parent, data)
    try:
        return SweepFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(shown, exc, _PATTERN_MESSAGES)) from None


def _paths_from(directory: Path, data: dict[str, Any]) -> None:
    """A suite's relative ``path`` is relative to the sweep file, wherever it runs from."""
    suites = data.get("suites")
    if not isinstance(suites, list):
        return
    for entry in suites:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            path = Path(entry["path"]).expanduser()
            entry["path"] = str(path if path.is_absolute() else (directory / path).resolve())
