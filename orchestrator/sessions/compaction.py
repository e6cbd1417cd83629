"""Compaction and model switches of a live session, for the control API and the kernel.

The work itself is the loop's (``orchestrator/agent/compaction.py``); this module decides
*when*: a session in a turn gets a request for its next step boundary, an idle one is
compacted at once (its loop lock keeps a new turn from starting meanwhile).
docs/compaction.md describes both paths.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from orchestrator.agent.compaction import CompactionFailed, NothingToCompact
from orchestrator.models.registry import ResolvedModel, stored_model
from orchestrator.sandbox.base import Sandbox
from orchestrator.sessions.live import LiveSession
from orchestrator.store.db import Store

__all__ = ["SCHEDULED_NOTE", "change_model", "compact_session", "running_sandbox"]

SCHEDULED_NOTE: Final = (
    "the session is in a turn: it compacts at its next step boundary (after the running cell), "
    "then carries on"
)


def running_sandbox(live: LiveSession) -> Sandbox | None:
    """The session's sandbox if one is up; compaction never starts one."""
    task = live.sandbox_task
    if task is None or not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


async def compact_session(
    live: LiveSession,
    instructions: str | None,
    *,
    reason: Literal["manual", "requested"] = "manual",
) -> dict[str, Any]:
    """``/compact``: schedule it (a turn runs) or do it now (idle). The answer says which:
    ``{compacted, scheduled, reason?, message, tokens_before?, tokens_after?, event_id?}``;
    ``reason`` is a ``FailReason`` when nothing was compacted."""
    loop = live.loop
    if loop is None:
        return {"compacted": False, "scheduled": False, "reason": "not_loaded", "message": ""}
    if loop.busy:
        loop.compactor.request(reason, instructions)
        return {"compacted": False, "scheduled": True, "message": SCHEDULED_NOTE}
    try:
        outcome = await loop.compact_now(instructions)
    except NothingToCompact as exc:
        return {"compacted": False, "scheduled": False, "reason": exc.reason, "message": str(exc)}
    except CompactionFailed as exc:
        return {"compacted": False, "scheduled": False, "reason": exc.reason, "message": str(exc)}
    payload = outcome.payload
    return {
        "compacted": True,
        "scheduled": False,
        "message": f"compacted: {payload.tokens_before} -> {payload.tokens_after} tokens",
        "tokens_before": payload.tokens_before,
        "tokens_after": payload.tokens_after,
        "event_id": outcome.event_id,
    }


async def change_model(store: Store, live: LiveSession, model: ResolvedModel) -> None:
    """Switch the session to ``model`` from its next model call on: a ``model_change`` event
    on its path (context assembly applies it from there, naming the endpoint too) and the
    session row's model and stored spec (what a reload resolves). Between turns only
    (``ValueError`` while a turn runs)."""
    loop = live.loop
    if loop is None or loop.busy:
        raise ValueError(f"session {live.id} is not loaded or is in a turn")
    await loop.switch_model(model)
    live.model = model
    live.record = await store.update_session(
        live.id, model=model.selector, model_spec=stored_model(model)
    )
