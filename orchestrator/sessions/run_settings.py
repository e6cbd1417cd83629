"""A session's own settings: the daemon's config with what the session's run chose.

An evaluation config run through the daemon (``prime-agent run --config``) chooses its
compaction, model-call retries and depth limit; ``create_session`` stores them with the root
session (``StoredRunSettings``, migration 0009) and its children copy them. ``settings_for``
is what every part of a session reads its settings from (its model client, its agent loop,
its sandbox's depth limit, spawn admission), so one run's choices never reach the daemon's
other sessions, and a daemon restarted with another ``config.toml`` still gives the session
what its run chose (docs/daemon.md, "Per-session settings").
"""

from __future__ import annotations

from typing import Any

from orchestrator.session_specs import StoredRunSettings
from orchestrator.settings import Settings

__all__ = ["settings_for"]


def settings_for(base: Settings, chosen: StoredRunSettings | None) -> Settings:
    """``base`` (the daemon's config) with ``chosen`` applied; ``base`` itself when the
    session chose nothing."""
    if chosen is None or chosen.empty:
        return base
    changes: dict[str, Any] = {
        "model_max_retries": chosen.model_max_retries,
        "retry_base_delay_s": chosen.retry_base_delay_s,
        "max_depth": chosen.max_depth,
        "max_turn_steps": chosen.max_turn_steps,
    }
    if chosen.compaction is not None:
        compaction = chosen.compaction.model_dump(exclude_none=True)
        if compaction:
            changes["compaction"] = base.compaction.model_copy(update=compaction)
    return base.with_overrides(**changes)
