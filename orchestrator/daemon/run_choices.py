"""What a ``create_session`` with ``settings`` (a run's choices over ``config.toml``: an eval
config run through the daemon, docs/control.md) changes, split by where each choice lives.

* the model's window, prices, tool protocol and key variable: the settings the model is
  resolved with, so they end up in the session's stored model spec;
* memory and CPUs: the sandbox choice, so they end up in its stored sandbox policy;
* the token budget: the session's budget;
* compaction, retries, the depth limit: ``StoredRunSettings`` (``run_settings``), which the
  orchestrator applies to that session and its family only (``sessions/run_settings.py``).

Nothing here touches the daemon's own settings: the daemon's other sessions never see them.
"""

from __future__ import annotations

from pydantic import ValidationError

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import SessionSettings
from orchestrator.api.wire import E_INVALID_ARGUMENT
from orchestrator.session_specs import StoredCompaction, StoredRunSettings
from orchestrator.settings import MIB, ModelConfig, Settings

__all__ = ["memory_bytes", "model_settings", "stored_run_settings"]


def model_settings(settings: Settings, selector: str | None, chosen: SessionSettings) -> Settings:
    """``settings`` whose ``[models]`` entry for ``selector`` has the run's model choices (a
    copy: the daemon's stay as they are)."""
    choice = chosen.model
    if choice is None:
        return settings
    changes = choice.model_dump(exclude_none=True)
    if not changes:
        return settings
    name = selector or settings.default_model
    if name is None:
        raise ApiCommandError(E_INVALID_ARGUMENT, "settings.model: name the model it is for")
    known = settings.models.get(name, ModelConfig())
    try:
        # Only what was set: an embedded model tells a chosen tool protocol from the default.
        entry = ModelConfig.model_validate({**known.model_dump(exclude_unset=True), **changes})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ApiCommandError(
            E_INVALID_ARGUMENT, f"settings.model.{where}: {error['msg']}"
        ) from None
    return settings.with_overrides(models={**settings.models, name: entry})


def memory_bytes(chosen: SessionSettings | None) -> int | None:
    if chosen is None or chosen.memory_mib is None:
        return None
    return chosen.memory_mib * MIB


def stored_run_settings(chosen: SessionSettings | None) -> StoredRunSettings | None:
    """What the orchestrator stores with the session and applies to its family; None when the
    run chose none of it."""
    if chosen is None:
        return None
    compaction = None
    if chosen.compaction is not None:
        compaction = StoredCompaction(**chosen.compaction.model_dump())
    stored = StoredRunSettings(
        compaction=compaction,
        model_max_retries=chosen.model_max_retries,
        retry_base_delay_s=chosen.retry_base_delay_s,
        max_depth=chosen.max_depth,
        repl_context_file=chosen.repl_context_file,
        max_turn_steps=chosen.max_turn_steps,
        system_prompt=chosen.system_prompt,
        append_system_prompt=chosen.append_system_prompt,
        mcp_servers=chosen.mcp_servers,
        skill_paths=chosen.skill_paths,
    )
    return None if stored.empty else stored
