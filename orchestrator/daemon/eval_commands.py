"""``record_eval_result``: the result row of a ``prime-agent run --config`` that ran through
the daemon (docs/control.md). The daemon owns the database, so it writes the row; it sums the
tree's tokens and cost and reads the root's gate results itself, and takes from the client only
what the client alone knows: the config it ran, when it started and finished, how it stopped.
The answer is the row as the JSON file next to the config holds it (the client writes that
file: it is the client's directory, not the daemon's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import JsonObject, RecordEvalResult
from orchestrator.api.wire import E_BUSY, E_INVALID_ARGUMENT
from orchestrator.daemon.command_context import CommandContext
from orchestrator.errors import StoreError
from orchestrator.store.db import SessionRecord
from orchestrator.store.eval_results import build_result, save_result

__all__ = ["record_eval_result"]

GATE_EVENT: Final = "gate_result"


@dataclass(frozen=True)
class _SentConfig:
    """The config record as the client sent it (``RunConfig``)."""

    data: dict[str, Any]

    def record(self) -> dict[str, Any]:
        return dict(self.data)


async def record_eval_result(
    daemon: CommandContext, rec: SessionRecord, command: RecordEvalResult
) -> JsonObject:
    if rec.parent_id is not None:
        raise ApiCommandError(
            E_INVALID_ARGUMENT, f"session {rec.id} is not a root: a result covers a whole tree"
        )
    live = daemon.orch.loaded(rec.id)
    if live is not None and live.state == "running":
        raise ApiCommandError(E_BUSY, f"session {rec.id} is still running")
    if command.finished_at < command.started_at:
        raise ApiCommandError(E_INVALID_ARGUMENT, "finished_at is before started_at")
    store = daemon.store
    gates = [e.payload for e in await store.events(rec.id) if e.type == GATE_EVENT]
    try:
        row = await build_result(
            store,
            config=_SentConfig(command.config),
            config_path=command.config_path,
            root_session_id=rec.id,
            stop_reason=command.stop_reason,
            exit_code=command.exit_code,
            gates=gates,
            started_at=command.started_at,
            finished_at=command.finished_at,
        )
        await save_result(store, row, None)  # the client writes the JSON file
    except (StoreError, ValueError) as exc:
        raise ApiCommandError(E_INVALID_ARGUMENT, str(exc)) from None
    return {"session": rec.id, "result": row.to_wire()}
