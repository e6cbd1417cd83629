"""Model selectors as names, without the settings models: the embedded model's names, each
provider's key variable, and which variables of a client's environment a selection reads.

Both the model registry (``models/registry.py``) and the lean ``-p`` client use it. The client
sends its own values of those variables with a new session and must not load pydantic to find
them (docs/cli.md, "Start-up cost"), so nothing here imports more than the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, Protocol

__all__ = [
    "EMBEDDED_ALIASES",
    "EMBEDDED_MODEL_NAME",
    "EMBEDDED_VARIANT_NAMES",
    "KEY_VARS",
    "OPENAI_BASE_URL_ENV",
    "DeclaredEndpoint",
    "client_env_names",
    "names_a_remote_model",
]

# The configured embedded model (``[embedded] variant``, 1.5B by default). Sessions stored before
# 1.5B became the default name it ``local/qwen2.5-coder-0.5b``: an alias of the same.
EMBEDDED_MODEL_NAME: Final = "local/qwen2.5-coder"
_EMBEDDED_FORMER_NAME: Final = "local/qwen2.5-coder-0.5b"
# One embedded variant by name, whatever ``[embedded] variant`` says: a sweep crosses both
# (docs/embedded-model.md, "Naming a variant"). The daemon serves each it is asked for.
EMBEDDED_VARIANT_NAMES: Final[Mapping[str, Literal["0.5b", "1.5b"]]] = {
    "embedded/0.5b": "0.5b",
    "embedded/1.5b": "1.5b",
}
EMBEDDED_ALIASES: Final = frozenset(
    {"local", "embedded", EMBEDDED_MODEL_NAME, _EMBEDDED_FORMER_NAME, *EMBEDDED_VARIANT_NAMES}
)
OPENAI_BASE_URL_ENV: Final = "OPENAI_BASE_URL"
_OPENAI_PROVIDER: Final = "openai"
_PROVIDER_SEPARATOR: Final = "/"

# Providers whose key variable we check without importing litellm.
KEY_VARS: Final[Mapping[str, str]] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "groq": "GROQ_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "xai": "XAI_API_KEY",
}


class DeclaredEndpoint(Protocol):
    """What config.toml's ``[models."…"]`` entry says about reaching a model
    (``settings.ModelConfig``, or the lean client's ``client_config.DeclaredModel``)."""

    @property
    def api_key_env(self) -> str | None: ...

    @property
    def api_base(self) -> str | None: ...


def names_a_remote_model(chosen: str) -> bool:
    """Whether ``chosen`` (stripped) is a ``provider/name`` selector, not the embedded model."""
    return bool(chosen) and chosen not in EMBEDDED_ALIASES and _PROVIDER_SEPARATOR in chosen


def client_env_names(
    selector: str | None,
    default_model: str | None,
    declared: Mapping[str, DeclaredEndpoint],
) -> frozenset[str]:
    """The environment variables resolving ``selector`` (else ``default_model``) may read: its
    key's variable and, for the ``openai`` provider, ``OPENAI_BASE_URL``. A client sends its own
    values of these with a new session, so a daemon started elsewhere calls the endpoint, with
    the key, of the shell the run came from (docs/daemon.md, "Whose environment")."""
    chosen = (selector or default_model or "").strip()
    if not names_a_remote_model(chosen):
        return frozenset()
    provider = chosen.split(_PROVIDER_SEPARATOR, 1)[0]
    cfg = declared.get(chosen)
    names: set[str] = set()
    if cfg is not None and cfg.api_key_env:
        names.add(cfg.api_key_env)
    elif provider in KEY_VARS:
        names.add(KEY_VARS[provider])
    if provider == _OPENAI_PROVIDER and (cfg is None or cfg.api_base is None):
        names.add(OPENAI_BASE_URL_ENV)
    return frozenset(names)
