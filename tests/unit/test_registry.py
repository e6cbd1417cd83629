from __future__ import annotations

import pytest

from orchestrator.errors import MissingCredentials, ModelNotFound
from orchestrator.models.cost import call_cost
from orchestrator.models.registry import DUMMY_API_KEY, resolve_model
from orchestrator.settings import EMBEDDED_MODEL_NAME, EmbeddedSettings, ModelConfig, Settings


def test_default_is_the_embedded_model_with_fenced_protocol() -> None:
    m = resolve_model(None, Settings(), env={})
    assert m.embedded and m.selector == EMBEDDED_MODEL_NAME
    # 1.5B by default (docs/embedded-model.md, "Which embedded variant").
    assert m.name == "qwen2.5-coder-1.5b" and Settings().embedded.variant == "1.5b"
    # The name sessions stored before 1.5B became the default still means the embedded model.
    assert resolve_model("local/qwen2.5-coder-0.5b", Settings(), env={}).embedded
    assert m.tool_protocol == "fenced"
    assert call_cost(m, input=1000, output=1000, cache_read=0, cache_write=0) == 0.0


def test_config_default_model_is_used() -> None:
    s = Settings(default_model="openai/x", models={"openai/x": ModelConfig(api_base="http://h/v1")})
    m = resolve_model(None, s, env={})
    assert (m.selector, m.api_base, m.api_key) == ("openai/x", "http://h/v1", DUMMY_API_KEY)


def test_openai_compatible_with_api_base_needs_no_key() -> None:
    m = resolve_model("openai/fake", Settings(), api_base="http://127.0.0.1:9/v1", env={})
    assert m.api_base == "http://127.0.0.1:9/v1" and m.api_key == DUMMY_API_KEY
    assert m.tool_protocol == "native" and not m.embedded


def test_openai_base_url_env_is_honoured() -> None:
    m = resolve_model("openai/fake", Settings(), env={"OPENAI_BASE_URL": "http://b/v1"})
    assert m.api_base == "http://b/v1"


def test_flag_beats_env_for_api_base() -> None:
    m = resolve_model(
        "openai/fake", Settings(), api_base="http://flag/v1", env={"OPENAI_BASE_URL": "http://e/v1"}
    )
    assert m.api_base == "http://flag/v1"


def test_missing_openai_key_is_a_user_error_naming_the_variable() -> None:
    with pytest.raises(MissingCredentials, match="OPENAI_API_KEY"):
        resolve_model("openai/gpt-4o-mini", Settings(), env={})


def test_anthropic_key_from_env() -> None:
    m = resolve_model("anthropic/claude-x", Settings(), env={"ANTHROPIC_API_KEY": "k"})
    assert m.api_key == "k" and m.provider == "anthropic"
    with pytest.raises(MissingCredentials, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic/claude-x", Settings(), env={})


@pytest.mark.parametrize("sel", ["gpt-4o", "openai/", "nosuchprovider/model"])
def test_unknown_models(sel: str) -> None:
    with pytest.raises(ModelNotFound):
        resolve_model(sel, Settings(), env={})


def test_api_base_without_model_is_refused() -> None:
    with pytest.raises(ModelNotFound, match="--api-base needs --model"):
        resolve_model(None, Settings(), api_base="http://x/v1", env={})


def test_config_key_env_and_prices() -> None:
    cfg = ModelConfig(
        api_base="http://h/v1",
        api_key_env="MY_KEY",
        input_cost_per_mtok=1.0,
        output_cost_per_mtok=2.0,
        tool_protocol="fenced",
    )
    s = Settings(models={"openai/mine": cfg})
    with pytest.raises(MissingCredentials, match="MY_KEY"):
        resolve_model("openai/mine", s, env={})
    m = resolve_model("openai/mine", s, env={"MY_KEY": "secret"})
    assert m.api_key == "secret" and m.tool_protocol == "fenced"
    assert call_cost(m, input=1_000_000, output=500_000, cache_read=0, cache_write=0) == 2.0


def test_unknown_price_is_none_not_zero() -> None:
    m = resolve_model("openai/fake-model-xyz", Settings(), api_base="http://h/v1", env={})
    assert call_cost(m, input=10, output=10, cache_read=0, cache_write=0) is None


def test_known_price_from_litellm_bundled_map() -> None:
    m = resolve_model("openai/gpt-4o-mini", Settings(), env={"OPENAI_API_KEY": "k"})
    cost = call_cost(m, input=1_000_000, output=0, cache_read=0, cache_write=0)
    assert cost is not None and cost > 0


def test_embedded_variant_names_pin_the_variant_and_keep_it_when_stored() -> None:
    from orchestrator.models.registry import resolve_stored, stored_model

    settings = Settings(embedded=EmbeddedSettings(variant="0.5b"))
    large = resolve_model("embedded/1.5b", settings, env={})
    assert large.embedded and large.embedded_variant == "1.5b"
    assert (large.selector, large.tool_protocol, large.api_key_env) == (
        "embedded/1.5b",
        "fenced",
        None,
    )
    configured = resolve_model(None, settings, env={})  # the configured variant, named so
    assert (configured.embedded_variant, configured.name) == (None, "qwen2.5-coder-0.5b")
    again = resolve_stored(stored_model(large), settings, env={})
    assert (again.embedded_variant, again.selector, again.tool_protocol) == (
        "1.5b",
        "embedded/1.5b",
        "fenced",
    )


def test_embedded_tool_protocol_only_when_an_entry_sets_it() -> None:
    native = Settings(models={"embedded/0.5b": ModelConfig(tool_protocol="native")})
    assert resolve_model("embedded/0.5b", native, env={}).tool_protocol == "native"
    # An entry that says nothing of the protocol keeps the small model's fenced default.
    windowed = Settings(models={"embedded/0.5b": ModelConfig(context_window=4096)})
    assert resolve_model("embedded/0.5b", windowed, env={}).tool_protocol == "fenced"
