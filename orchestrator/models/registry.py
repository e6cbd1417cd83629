"""Model selection: from ``--model`` / config / defaults to a callable ``ResolvedModel``.

Rules (docs/models.md):
- no ``--model`` and no ``default_model`` in config -> the embedded local model;
- a selector declared in config uses its endpoint, key variable, window, prices and protocol;
- otherwise ``provider/name`` goes to litellm; ``--api-base`` (or ``OPENAI_BASE_URL`` for the
  ``openai`` provider) points it at any OpenAI-compatible server, for which a key is optional.
Keys are read from the environment here, once, and never logged or passed to a sandbox.

A session stores what its model resolved to (``stored_model``: the endpoint, the *name* of the
key's variable, window, prices) and is woken with ``resolve_stored``, which uses the stored
endpoint and nothing of the waking process's ``OPENAI_BASE_URL`` or config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from orchestrator import model_names
from orchestrator.errors import MissingCredentials, ModelNotFound, UserError
from orchestrator.model_names import (
    EMBEDDED_ALIASES,
    EMBEDDED_MODEL_NAME,
    EMBEDDED_VARIANT_NAMES,
    KEY_VARS,
    OPENAI_BASE_URL_ENV,
    names_a_remote_model,
)
from orchestrator.session_specs import StoredModel, StoredPrices
from orchestrator.settings import MAX_OUTPUT_TOKENS, EmbeddedVariant, ModelConfig, Settings

__all__ = [
    "DUMMY_API_KEY",
    "OPENAI_BASE_URL_ENV",
    "OPENAI_COMPATIBLE_PROVIDERS",
    "Prices",
    "ResolvedModel",
    "client_env_names",
    "litellm_expected",
    "resolve_model",
    "resolve_stored",
    "resolving_needs_litellm",
    "stored_model",
    "switched_model",
]

# OpenAI-compatible local servers (vLLM, llama.cpp, Ollama) accept any key; the client needs one.
DUMMY_API_KEY = "sk-no-key-required"
TOKENS_PER_MTOK = 1_000_000
# A 0.5B model that has not stopped after this many tokens is looping, not thinking.
EMBEDDED_MAX_OUTPUT_TOKENS = 1024
# Providers that talk to a local server and need no key at all.
_KEYLESS = frozenset({"ollama", "ollama_chat", "hosted_vllm", "lm_studio", "llamafile"})
# Providers whose endpoint is the OpenAI chat API itself once an api_base names it: the lean
# client (openai_stream.py) serves them without litellm.
OPENAI_COMPATIBLE_PROVIDERS = frozenset({"openai", "hosted_vllm"})


@dataclass(frozen=True)
class Prices:
    """USD per token."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True)
class ResolvedModel:
    selector: str  # as the user named it, e.g. "openai/gpt-4o-mini"
    provider: str
    name: str
    litellm_model: str
    api_base: str | None
    api_key: str | None = field(repr=False)
    context_window: int | None
    max_output_tokens: int
    tool_protocol: Literal["native", "fenced"]
    prices: Prices | None  # from config; None = ask litellm's bundled map at cost time
    embedded: bool = False
    # The variable ``api_key`` was read from (stored with the session; the key never is).
    api_key_env: str | None = None
    # The embedded variant a name chose (``embedded/1.5b``); None: ``[embedded] variant``.
    embedded_variant: EmbeddedVariant | None = None

    @property
    def speaks_openai(self) -> bool:
        """True when the endpoint is a plain OpenAI-compatible server: the embedded model (once
        its server runs), or an OpenAI-protocol provider pointed at an explicit ``api_base``."""
        if self.api_base is None:
            return False
        return self.embedded or self.provider in OPENAI_COMPATIBLE_PROVIDERS

    def with_endpoint(self, api_base: str, litellm_model: str, api_key: str) -> ResolvedModel:
        """The embedded model learns its endpoint (and per-start key) once its server runs."""
        from dataclasses import replace

        return replace(self, api_base=api_base, litellm_model=litellm_model, api_key=api_key)


def _prices(cfg: ModelConfig) -> Prices | None:
    if cfg.input_cost_per_mtok is None or cfg.output_cost_per_mtok is None:
        return None

    def per_token(v: float | None) -> float | None:
        return None if v is None else v / TOKENS_PER_MTOK

    return Prices(
        input=cfg.input_cost_per_mtok / TOKENS_PER_MTOK,
        output=cfg.output_cost_per_mtok / TOKENS_PER_MTOK,
        cache_read=per_token(cfg.cache_read_cost_per_mtok),
        cache_write=per_token(cfg.cache_write_cost_per_mtok),
    )


def _embedded(
    settings: Settings,
    chosen: str = EMBEDDED_MODEL_NAME,
    *,
    tool_protocol: Literal["native", "fenced"] | None = None,
) -> ResolvedModel:
    """The embedded model: the configured variant, or the one ``chosen`` names
    (``embedded/1.5b``). Fenced unless a ``[models]`` entry for that name (a sweep's, a run's
    ``settings.model``) sets ``tool_protocol`` itself."""
    variant = EMBEDDED_VARIANT_NAMES.get(chosen)
    if tool_protocol is None:
        cfg = settings.models.get(chosen)
        if cfg is not None and "tool_protocol" in cfg.model_fields_set:
            tool_protocol = cfg.tool_protocol
    if variant is None:
        selector, name = EMBEDDED_MODEL_NAME, f"qwen2.5-coder-{settings.embedded.variant}"
    else:
        selector, name = chosen, f"qwen2.5-coder-{variant}"
    return ResolvedModel(
        selector=selector,
        provider="local",
        name=name,
        litellm_model="",  # filled in by with_endpoint() once the server runs
        api_base=None,
        api_key=DUMMY_API_KEY,
        context_window=settings.embedded.context_tokens,
        max_output_tokens=EMBEDDED_MAX_OUTPUT_TOKENS,
        # Small models rarely emit native tool calls well: fenced unless asked otherwise.
        tool_protocol=tool_protocol or "fenced",
        prices=Prices(input=0.0, output=0.0, cache_read=0.0, cache_write=0.0),
        embedded=True,
        embedded_variant=variant,
    )


def _known_provider(provider: str) -> bool:
    if provider in KEY_VARS or provider in _KEYLESS:
        return True
    from orchestrator.models.lite import load_litellm

    return provider in set(load_litellm().provider_list)


def resolving_needs_litellm(selector: str | None, settings: Settings) -> bool:
    """True when ``resolve_model(selector)`` may ask litellm (a provider we do not know by
    name): callers on an event loop import it on a thread first (models/lite.ensure_litellm)."""
    chosen = (selector or settings.default_model or "").strip()
    if not names_a_remote_model(chosen):
        return False
    provider = chosen.split("/", 1)[0]
    return provider not in KEY_VARS and provider not in _KEYLESS


def client_env_names(selector: str | None, settings: Settings) -> frozenset[str]:
    """``model_names.client_env_names`` with the config's default model and declared models."""
    return model_names.client_env_names(selector, settings.default_model, settings.models)


def litellm_expected(settings: Settings, env: Mapping[str, str] | None = None) -> bool:
    """True when the configured default model will be called through litellm (or everything
    is, ``model_client = "litellm"``): worth importing it at start, on a thread."""
    if settings.model_client == "litellm":
        return True
    chosen = (settings.default_model or "").strip()
    if not names_a_remote_model(chosen):
        return False
    env = os.environ if env is None else env
    cfg = settings.models.get(chosen)
    provider = chosen.split("/", 1)[0]
    base = cfg.api_base if cfg is not None else None
    if base is None and provider == "openai":
        base = env.get(OPENAI_BASE_URL_ENV) or None
    return base is None or provider not in OPENAI_COMPATIBLE_PROVIDERS


def resolve_model(
    selector: str | None,
    settings: Settings,
    *,
    api_base: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedModel:
    env = os.environ if env is None else env
    chosen = (selector or settings.default_model or "").strip()
    if not chosen or chosen in EMBEDDED_ALIASES:
        if api_base:
            raise ModelNotFound("--api-base needs --model provider/name (e.g. openai/my-model)")
        return _embedded(settings, chosen)

    cfg = settings.models.get(chosen)
    if "/" not in chosen:
        raise ModelNotFound(
            f"unknown model {chosen!r}: name it as provider/name (e.g. openai/gpt-4o-mini, "
            "anthropic/claude-sonnet-4-5) or declare it in config.toml"
        )
    provider, name = chosen.split("/", 1)
    if not name:
        raise ModelNotFound(f"model {chosen!r} has no name after the provider")
    if cfg is None and not _known_provider(provider):
        raise ModelNotFound(
            f"unknown provider {provider!r} in {chosen!r}: use a litellm provider "
            "(openai, anthropic, openrouter, ollama, ...) or declare the model in config.toml"
        )

    base = api_base or (cfg.api_base if cfg else None)
    if base is None and provider == "openai":
        base = env.get("OPENAI_BASE_URL") or None

    key: str | None = None
    key_env: str | None = None
    if cfg is not None and cfg.api_key_env:
        key_env = cfg.api_key_env
        key = env.get(cfg.api_key_env) or None
        if key is None:
            raise MissingCredentials(
                f"{cfg.api_key_env} is not set (config.toml names it as the key for {chosen})"
            )
    elif provider in KEY_VARS:
        key = env.get(KEY_VARS[provider]) or None
        key_env = KEY_VARS[provider] if key is not None else None
    if key is None:
        if base is not None or provider in _KEYLESS:
            key = DUMMY_API_KEY
        elif provider in KEY_VARS:
            raise MissingCredentials(
                f"{KEY_VARS[provider]} is not set: export it to use {chosen}"
                + (
                    ", or pass --api-base for an OpenAI-compatible server"
                    if provider == "openai"
                    else ""
                )
            )
        else:
            from orchestrator.models.lite import load_litellm

            check = load_litellm().validate_environment(model=chosen)
            missing = check.get("missing_keys") or []
            if missing:
                raise MissingCredentials(f"{', '.join(missing)} not set: export it to use {chosen}")

    return ResolvedModel(
        selector=chosen,
        provider=provider,
        name=name,
        litellm_model=chosen,
        api_base=base,
        api_key=key,
        context_window=cfg.context_window if cfg else None,
        max_output_tokens=cfg.max_output_tokens if cfg else MAX_OUTPUT_TOKENS,
        tool_protocol=cfg.tool_protocol if cfg else "native",
        prices=_prices(cfg) if cfg else None,
        api_key_env=key_env,
    )


def stored_model(model: ResolvedModel) -> StoredModel:
    """What a session keeps of ``model``: everything but the key (its variable's name)."""
    prices = model.prices
    return StoredModel(
        selector=model.selector,
        provider=model.provider,
        name=model.name,
        # The embedded model's endpoint is one daemon start's: found again at load.
        api_base=None if model.embedded else model.api_base,
        api_key_env=None if model.embedded else model.api_key_env,
        context_window=model.context_window,
        max_output_tokens=model.max_output_tokens,
        tool_protocol=model.tool_protocol,
        prices=None
        if prices is None
        else StoredPrices(
            input=prices.input,
            output=prices.output,
            cache_read=prices.cache_read,
            cache_write=prices.cache_write,
        ),
        embedded=model.embedded,
        embedded_variant=model.embedded_variant,
    )


def resolve_stored(
    spec: StoredModel,
    settings: Settings,
    *,
    env: Mapping[str, str] | None = None,
    session: str = "",
) -> ResolvedModel:
    """The model a session stored, usable again: its endpoint, window and prices as stored,
    its key read from the variable it names. Nothing comes from this process's
    ``OPENAI_BASE_URL`` or config: a daemon started elsewhere must not redirect (and hand the
    key to) another endpoint. A variable that is gone is a one-line ``MissingCredentials``."""
    env = os.environ if env is None else env
    if spec.embedded:
        return _embedded(settings, spec.selector, tool_protocol=spec.tool_protocol)
    whose = f"session {session}" if session else "the session"
    key: str | None = None
    if spec.api_key_env is not None:
        key = env.get(spec.api_key_env) or None
        if key is None:
            raise MissingCredentials(
                f"{spec.api_key_env} is not set: {whose} reads the key of {spec.selector} "
                f"({spec.api_base or 'its provider'}) from it; export it, or switch the "
                "session's model (/model, or --resume with --model/--api-base)"
            )
    elif spec.api_base is not None or spec.provider in _KEYLESS:
        key = DUMMY_API_KEY  # created against a server that needed no key: none is sent now
    prices = spec.prices
    return ResolvedModel(
        selector=spec.selector,
        provider=spec.provider,
        name=spec.name,
        litellm_model=spec.selector,
        api_base=spec.api_base,
        api_key=key,
        context_window=spec.context_window,
        max_output_tokens=spec.max_output_tokens,
        tool_protocol=spec.tool_protocol,
        prices=None
        if prices is None
        else Prices(prices.input, prices.output, prices.cache_read, prices.cache_write),
        api_key_env=spec.api_key_env,
    )


def switched_model(
    current: StoredModel | None,
    selector: str | None,
    api_base: str | None,
    settings: Settings,
    *,
    env: Mapping[str, str] | None = None,
) -> ResolvedModel:
    """An explicit switch (``set_model``, ``--resume`` with ``--model``/``--api-base``): the
    named model, else the session's own; the named endpoint, else the session's own when the
    model stays the same (naming only a model resolves it like a new session's)."""
    chosen = (selector or "").strip() or (current.selector if current else "")
    if not chosen:
        raise UserError("name the model to switch to (provider/name)")
    same = current is not None and chosen == current.selector
    base = api_base or (current.api_base if same and current is not None else None)
    return resolve_model(chosen, settings, api_base=base, env=env)
