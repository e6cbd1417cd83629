"""A session's own settings (issue 18): what a run (an eval config) chose over the daemon's
config, validated at the protocol boundary, stored with the session (migration 0009) and
applied to that session only (orchestrator/sessions/run_settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import CreateSession, SessionSettings
from orchestrator.cli.eval_run import session_settings
from orchestrator.control.eval_config import load_eval_config
from orchestrator.daemon.run_choices import memory_bytes, model_settings, stored_run_settings
from orchestrator.ids import new_session_id
from orchestrator.session_specs import StoredCompaction, StoredRunSettings
from orchestrator.sessions.run_settings import settings_for
from orchestrator.settings import MIB, ModelConfig, Settings
from orchestrator.store.db import SessionRecord, Store

CHOSEN = StoredRunSettings(
    compaction=StoredCompaction(enabled=False, reserve_tokens=1000),
    model_max_retries=5,
    retry_base_delay_s=0.5,
    max_depth=0,
)


def test_chosen_settings_apply_over_the_base_and_leave_it_alone() -> None:
    base = Settings(model_max_retries=1, max_depth=3)
    mine = settings_for(base, CHOSEN)
    assert mine.model_max_retries == 5 and mine.retry_base_delay_s == 0.5
    assert mine.max_depth == 0
    assert mine.compaction.enabled is False and mine.compaction.reserve_tokens == 1000
    # what the run left out keeps the base's
    assert mine.compaction.keep_recent_tokens == base.compaction.keep_recent_tokens
    assert base.model_max_retries == 1 and base.max_depth == 3 and base.compaction.enabled


def test_nothing_chosen_is_the_base_itself() -> None:
    base = Settings()
    assert settings_for(base, None) is base
    assert settings_for(base, StoredRunSettings()) is base
    assert StoredRunSettings(compaction=StoredCompaction()).empty


def test_session_settings_are_validated_at_the_protocol_boundary() -> None:
    ok = {"type": "create_session", "command_id": "1", "cwd": "/w"}
    good = CreateSession.model_validate({**ok, "settings": {"model_max_retries": 2}})
    assert good.settings == SessionSettings(model_max_retries=2)
    for bad in (
        {"model_max_retries": -1},
        {"memory_mib": 1},
        {"cpus": 0},
        {"session_token_budget": 0},
        {"model": {"api_key_env": "sk-not-a-name"}},
        {"model": {"tool_protocol": "xml"}},
        {"compaction": {"keep_recent_tokens": 0}},
        {"unknown": 1},
    ):
        with pytest.raises(ValidationError):
            CreateSession.model_validate({**ok, "settings": bad})


def test_run_choices_split_into_model_sandbox_and_stored_settings() -> None:
    chosen = SessionSettings(
        model={"context_window": 4096, "api_key_env": "MY_KEY", "input_cost_per_mtok": 1.0},
        memory_mib=1024,
        cpus=0.5,
        model_max_retries=4,
        compaction={"enabled": False},
    )
    base = Settings(models={"openai/x": ModelConfig(api_base="http://h/v1")})
    mine = model_settings(base, "openai/x", chosen)
    entry = mine.models["openai/x"]
    assert (entry.context_window, entry.api_key_env, entry.api_base) == (
        4096,
        "MY_KEY",
        "http://h/v1",
    )
    assert base.models["openai/x"] == ModelConfig(api_base="http://h/v1")  # the daemon's stay
    assert memory_bytes(chosen) == 1024 * MIB
    stored = stored_run_settings(chosen)
    assert stored is not None and stored.model_max_retries == 4
    assert stored.compaction == StoredCompaction(enabled=False)
    assert stored_run_settings(SessionSettings(memory_mib=1024)) is None
    with pytest.raises(ApiCommandError):
        model_settings(Settings(), None, chosen)  # which model? none named, no default


def test_an_eval_config_becomes_session_settings(tmp_path: Path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(
        "task: t\nmodel: {name: openai/x, api_base: 'http://h/v1', api_key_env: K, "
        "context_window: 100}\nsandbox: {memory_mib: 512, image: rust}\n"
        "retry: {max_retries: 3}\nlimits: {session_token_budget: 9, max_depth: 0}\n"
        "compaction: {enabled: false}\n"
    )
    chosen = session_settings(load_eval_config(path))
    assert chosen == {
        "model": {"api_key_env": "K", "context_window": 100},
        "memory_mib": 512,
        "compaction": {"enabled": False},
        "model_max_retries": 3,
        "session_token_budget": 9,
        "max_depth": 0,
    }
    SessionSettings.model_validate(chosen)  # what the protocol takes
    bare = tmp_path / "b.yaml"
    bare.write_text("task: t\nmodel: {name: openai/x}\n")
    assert session_settings(load_eval_config(bare)) is None


async def test_run_settings_are_stored_with_the_session(tmp_path: Path) -> None:
    db = tmp_path / "state" / "prime-agent.duckdb"
    sid = new_session_id()
    async with await Store.open(db) as store:
        record = SessionRecord(
            id=sid, root_id=sid, cwd="/w", model="openai/x", backend="local", run_settings=CHOSEN
        )
        await store.create_session(record)
    async with await Store.open(db, read_only=True) as store:
        again = await store.get_session(sid)
    assert again is not None and again.run_settings == CHOSEN and again.spec_problem is None


def test_the_protocols_copies_of_the_lower_rules_are_equal() -> None:
    """api/protocol.py keeps its own copies so clients load neither settings nor specs."""
    from orchestrator import session_specs, settings
    from orchestrator.api import protocol, wire

    assert protocol.KEY_ENV_NAME_PATTERN == session_specs.ENV_NAME_PATTERN
    assert protocol.SANDBOX_MEMORY_MIN_MIB == settings.SANDBOX_MEMORY_MIN_MIB
    # A sweep's provider limits travel in sweep_open as the config's [providers.KEY] table.
    ours = protocol.SweepProviderLimits.model_json_schema()["properties"]
    theirs = settings.ProviderLimitsConfig.model_json_schema()["properties"]
    assert ours == theirs
    # The lean -p client sends it when config.toml sets no family_wait_timeout_s.
    assert wire.WAIT_QUIET_DEFAULT_S == settings.FAMILY_WAIT_TIMEOUT_S
    assert protocol.MAX_PROMPT_CHARS == session_specs.MAX_PROMPT_CHARS
    assert protocol.MAX_SKILL_PATHS == session_specs.MAX_SKILL_PATHS
    assert protocol.MAX_SKILL_PATH_CHARS == session_specs.MAX_SKILL_PATH_CHARS


def test_the_flags_choices_are_stored_and_the_system_prompts_stay_with_the_root() -> None:
    from orchestrator.sessions.prompting import run_prompts

    chosen = SessionSettings(max_turn_steps=3, system_prompt="S.", append_system_prompt="A.")
    stored = stored_run_settings(chosen)
    assert stored is not None and not stored.empty
    assert settings_for(Settings(), stored).max_turn_steps == 3
    root = SessionRecord(
        id=new_session_id(), root_id="r", parent_id=None, name=None, depth=0, cwd="/",
        model="openai/x", backend="local", status="idle", run_settings=stored,
    )  # fmt: skip
    assert run_prompts(root) == ("S.", "A.")
    child = SessionRecord(
        id=new_session_id(), root_id="r", parent_id="r", name=None, depth=1, cwd="/",
        model="openai/x", backend="local", status="idle", run_settings=stored,
    )  # fmt: skip
    assert run_prompts(child) == (None, None)  # a subagent keeps its own prompt


def test_a_lower_case_key_variable_a_config_accepts_the_protocol_accepts() -> None:
    """An eval config may name its key ``my_key``; the client sends it in ``client_env``."""
    sent = CreateSession(
        command_id="c-1",
        cwd="/tmp",
        client_env={"my_key": "secret"},
        settings={"model": {"api_key_env": "my_key"}},
    )
    assert sent.client_env == {"my_key": "secret"}
    with pytest.raises(ValidationError):
        CreateSession(command_id="c-2", cwd="/tmp", client_env={"9BAD": "x"})
