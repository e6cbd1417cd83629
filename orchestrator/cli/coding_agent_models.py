"""``--provider NAME --model ID`` as Prime Agent's own clients pass them: resolved against a
Prime Agent ``models.json`` in ``$PRIME_AGENT_CODING_AGENT_DIR`` (default
``~/.prime-agent/agent``), whose providers name an OpenAI-compatible ``baseUrl``
(``"api": "openai-completions"``) and, in ``apiKey``, the environment variable that holds the key
(docs/acp.md). The result is our own model choice: ``openai/ID`` at that endpoint, with the key
variable's name sent as the session's ``api_key_env`` and its value as the client's
environment (never written anywhere).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import UserError

__all__ = ["CODING_AGENT_DIR_ENV", "ProviderModel", "resolve_provider_model"]

CODING_AGENT_DIR_ENV: Final = "PRIME_AGENT_CODING_AGENT_DIR"
DEFAULT_CODING_AGENT_DIR: Final = "~/.prime-agent/agent"
MODELS_FILE: Final = "models.json"
OPENAI_COMPLETIONS: Final = "openai-completions"
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ProviderModel:
    model: str  # our selector: openai/ID
    api_base: str
    api_key_env: str | None
    client_env: dict[str, str]


def resolve_provider_model(provider: str, model_id: str) -> ProviderModel:
    """``provider``'s entry of models.json, for ``model_id``; ``UserError`` in one line."""
    directory = Path(os.environ.get(CODING_AGENT_DIR_ENV) or DEFAULT_CODING_AGENT_DIR)
    path = directory.expanduser() / MODELS_FILE
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"--provider {provider}: no {path} (set {CODING_AGENT_DIR_ENV} to the directory "
            "holding models.json)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: {exc}") from None
    providers = data.get("providers") if isinstance(data, dict) else None
    entry = providers.get(provider) if isinstance(providers, dict) else None
    if not isinstance(entry, dict):
        known = ", ".join(sorted(providers)) if isinstance(providers, dict) else "none"
        raise UserError(f"--provider {provider} is not in {path} (providers: {known})")
    api = entry.get("api", OPENAI_COMPLETIONS)
    if api != OPENAI_COMPLETIONS:
        raise UserError(
            f"--provider {provider}: api {api!r} is not supported; use {OPENAI_COMPLETIONS}"
        )
    base = entry.get("baseUrl")
    if not isinstance(base, str) or not base:
        raise UserError(f"--provider {provider}: no baseUrl in {path}")
    key_env = entry.get("apiKey")
    client_env: dict[str, str] = {}
    if key_env is not None:
        if not isinstance(key_env, str) or not _ENV_NAME.match(key_env):
            raise UserError(
                f"--provider {provider}: apiKey must name an environment variable (got a value "
                "that is not a variable name; keys are never read from files)"
            )
        value = os.environ.get(key_env)
        if not value:
            raise UserError(f"--provider {provider}: {key_env} is not set")
        client_env[key_env] = value
    return ProviderModel(
        model=f"openai/{model_id}",
        api_base=base,
        api_key_env=key_env if isinstance(key_env, str) else None,
        client_env=client_env,
    )
