"""What the lean ``-p`` client reads of config.toml, with ``tomllib`` alone (no pydantic).

A run through a running daemon needs three values from the file: the default model and what the
file declares for a model (its key variable and endpoint), to send this shell's values of the
right variables with the session; and how long to wait for the session's tree to go quiet. The
daemon reads and validates the whole file itself (again for every new session,
``daemon/config_watch.py``) and answers a bad one with the same one-line error, so the client
does not load the settings models for these three values (docs/cli.md, "Start-up cost").

When the file does not parse, or a value read here is not plainly of the kind the settings
accept, the full loader (``settings.load_settings``) reads the file instead. It either accepts
it or raises the one-line ``ConfigError`` as before.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from orchestrator.api.wire import WAIT_QUIET_DEFAULT_S

if TYPE_CHECKING:
    from orchestrator.settings import Settings

__all__ = ["ClientConfig", "DeclaredModel", "load_client_config", "read_config_toml"]

_DEFAULT_MODEL_KEY: Final = "default_model"
_MODELS_KEY: Final = "models"
_WAIT_KEY: Final = "family_wait_timeout_s"


@dataclass(frozen=True)
class DeclaredModel:
    """A ``[models."…"]`` entry as far as the client needs it (``model_names.DeclaredEndpoint``)."""

    api_key_env: str | None = None
    api_base: str | None = None


@dataclass(frozen=True)
class ClientConfig:
    """The file's values the client needs; each default is the settings' default
    (``WAIT_QUIET_DEFAULT_S`` is ``FAMILY_WAIT_TIMEOUT_S``, a test keeps them equal)."""

    default_model: str | None = None
    models: Mapping[str, DeclaredModel] = field(default_factory=dict)
    family_wait_timeout_s: float = WAIT_QUIET_DEFAULT_S

    @classmethod
    def from_settings(cls, settings: Settings) -> ClientConfig:
        return cls(
            default_model=settings.default_model,
            models={
                name: DeclaredModel(api_key_env=cfg.api_key_env, api_base=cfg.api_base)
                for name, cfg in settings.models.items()
            },
            family_wait_timeout_s=settings.family_wait_timeout_s,
        )


def read_config_toml(path: Path) -> dict[str, Any] | None:
    """The file's TOML as data: empty when there is no file, None when it cannot be read or is
    not TOML (the settings loader then says what is wrong)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def _optional_str(table: Mapping[str, Any], key: str) -> tuple[bool, str | None]:
    """(whether ``table[key]`` is absent or a string, that string)."""
    value = table.get(key)
    return value is None or isinstance(value, str), value if isinstance(value, str) else None


def _peek(raw: Mapping[str, Any]) -> ClientConfig | None:
    """The three values when each is plainly valid (absent, or a string where a string goes);
    None when the full loader must judge."""
    plain, default_model = _optional_str(raw, _DEFAULT_MODEL_KEY)
    if not plain or _WAIT_KEY in raw:
        return None
    tables = raw.get(_MODELS_KEY, {})
    if not isinstance(tables, dict):
        return None
    models: dict[str, DeclaredModel] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            return None
        key_plain, key_env = _optional_str(table, "api_key_env")
        base_plain, api_base = _optional_str(table, "api_base")
        if not (key_plain and base_plain):
            return None
        models[name] = DeclaredModel(api_key_env=key_env, api_base=api_base)
    return ClientConfig(default_model=default_model, models=models)


def load_client_config(path: Path) -> ClientConfig:
    """What the client needs of config.toml at ``path``: read with ``tomllib`` when that is
    certain, else through ``load_settings`` (``ConfigError`` for a bad file)."""
    raw = read_config_toml(path)
    peeked = None if raw is None else _peek(raw)
    if peeked is not None:
        return peeked
    from orchestrator.settings import load_settings

    return ClientConfig.from_settings(load_settings(path))
