"""The sweep commands (docs/sweeps.md): the runner (``cli/sweep_runner.py``) decides what runs;
the daemon owns the tables (``store/sweeps.py``) and adds what only it knows — a trial's
tokens and cost summed over its session tree, and whether another runner is still alive.

A sweep has one runner at a time: ``sweep_open`` is refused while the process recorded as its
runner is alive on this host (the runner and the daemon share it), so two ``sweep run`` of one
name never run a cell twice.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, Final

from orchestrator.api.errors import ApiCommandError
from orchestrator.api.protocol import (
    JsonObject,
    SweepAddCells,
    SweepCancel,
    SweepClose,
    SweepList,
    SweepOpen,
    SweepStatus,
    SweepTrialFinish,
    SweepTrialStart,
)
from orchestrator.api.wire import E_BUSY, E_INVALID_ARGUMENT, E_NOT_FOUND
from orchestrator.daemon.command_context import CommandContext
from orchestrator.errors import StoreError
from orchestrator.models.provider_gate import ProviderLimits, provider_gates
from orchestrator.settings import ProviderLimitsConfig
from orchestrator.store import sweeps as tables
from orchestrator.store.eval_results import select_tree_usage
from orchestrator.store.queries import utcnow
from orchestrator.sweeps.spec import DEFAULT_CONCURRENCY

__all__ = ["SweepCommand", "handle_sweep"]

SweepCommand = (
    SweepOpen
    | SweepAddCells
    | SweepTrialStart
    | SweepTrialFinish
    | SweepStatus
    | SweepList
    | SweepCancel
    | SweepClose
)
AbortSession = Callable[[str], Awaitable[Any]]
# What sweep_status and sweep_list answer besides the cells: a sweep's counts by state, cost,
# tokens, and the wall time of its finished cells (for the ETA).
_TOTALS_SQL: Final = """
SELECT state, count(*), coalesce(sum(cost_usd), 0), coalesce(sum(tokens), 0),
       coalesce(sum(wall_s) FILTER (WHERE state IN ('scored', 'errored')), 0)
FROM sweep_cells WHERE sweep = $1 GROUP BY state
"""
_UNFINISHED: Final = ("pending", "running")
_FINISHED: Final = ("scored", "errored")  # an unrunnable cell neither ran nor waits to


def _summary(row: tables.SweepRow, totals: list[Any]) -> JsonObject:
    """A sweep's row with its counts, cost, tokens and an ETA: the unfinished cells times the
    mean wall time of the finished ones, over the trials the sweep runs at once."""
    counts = {str(state): int(n) for state, n, *_ in totals}
    finished = sum(n for state, n in counts.items() if state in _FINISHED)
    left = sum(counts.get(state, 0) for state in _UNFINISHED)
    wall = sum(float(w) for *_, w in totals)
    concurrency = row.spec.get("concurrency") or {}
    in_flight = max(
        1,
        min(
            int(concurrency.get("trials", DEFAULT_CONCURRENCY)),
            int(concurrency.get("sandboxes", DEFAULT_CONCURRENCY)),
        ),
    )
    alive = _alive(row.runner_pid)
    eta = wall / finished * left / in_flight if finished and left and alive else None
    return {
        **row.to_wire(),
        "runner_alive": alive,
        "counts": counts,
        "cells_total": sum(counts.values()),
        "cost_usd": float(sum(cost for _, _, cost, _, _ in totals)),
        "tokens": int(sum(tokens for _, _, _, tokens, _ in totals)),
        "eta_s": eta,
    }


def _alive(pid: int | None) -> bool:
    if pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def handle_sweep(
    daemon: CommandContext, command: SweepCommand, abort: AbortSession
) -> JsonObject:
    try:
        match command:
            case SweepOpen():
                return await _open(daemon, command)
            case SweepAddCells():
                return await _add_cells(daemon, command)
            case SweepTrialStart():
                return await _trial_start(daemon, command)
            case SweepTrialFinish():
                return await _trial_finish(daemon, command)
            case SweepStatus():
                return await _status(daemon, command)
            case SweepList():
                return await _list(daemon, command)
            case SweepCancel():
                return await _cancel(daemon, command, abort)
            case SweepClose():
                row = await daemon.store.transaction(
                    lambda con: tables.close_sweep(con, command.name, command.state, utcnow())
                )
                return {"sweep": row.to_wire()}
    except tables.SweepNotRunning as exc:
        raise ApiCommandError(E_BUSY, str(exc)) from None
    except StoreError as exc:
        code = E_NOT_FOUND if str(exc).startswith("no ") else E_INVALID_ARGUMENT
        raise ApiCommandError(code, str(exc)) from None
    raise AssertionError(f"unhandled sweep command {command.type}")  # pragma: no cover


async def _open(daemon: CommandContext, command: SweepOpen) -> JsonObject:
    now = utcnow()

    def run(con: Any) -> tuple[int, tables.SweepRow]:
        row = tables.select_sweep(con, command.name)
        if row is not None and row.runner_pid != command.runner_pid and _alive(row.runner_pid):
            raise ApiCommandError(
                E_BUSY,
                f"sweep {command.name} is being run by process {row.runner_pid}; "
                f"wait for it, or stop it with prime-agent sweep cancel {command.name}",
            )
        abandoned = tables.open_sweep(
            con,
            name=command.name,
            spec=command.spec,
            digest=command.digest,
            runner_pid=command.runner_pid,
            now=now,
        )
        opened = tables.select_sweep(con, command.name)
        assert opened is not None
        return abandoned, opened

    abandoned, row = await daemon.store.transaction(run)
    gates = provider_gates()
    for key, limits in command.providers.items():
        gates.configure(key, ProviderLimits.of(ProviderLimitsConfig(**limits.model_dump())))
    return {"sweep": row.to_wire(), "abandoned": abandoned}


async def _add_cells(daemon: CommandContext, command: SweepAddCells) -> JsonObject:
    cells = [c.model_dump() for c in command.cells]

    def run(con: Any) -> list[tables.CellRow]:
        if tables.select_sweep(con, command.name) is None:
            raise StoreError(f"no sweep {command.name!r}")
        _, rows = tables.open_cells(con, command.name, cells, utcnow())
        return rows

    rows = await daemon.store.transaction(run)
    return {"cells": [r.to_wire() for r in rows]}


async def _trial_start(daemon: CommandContext, command: SweepTrialStart) -> JsonObject:
    rec = await daemon.store.get_session(command.session)
    if rec is None:
        raise ApiCommandError(E_NOT_FOUND, f"no session {command.session!r}")
    trial = await daemon.store.transaction(
        lambda con: tables.start_trial(
            con,
            sweep=command.name,
            fingerprint=command.fingerprint,
            session_id=rec.id,
            now=utcnow(),
        )
    )
    return {"trial": trial, "session": rec.id}


async def _trial_finish(daemon: CommandContext, command: SweepTrialFinish) -> JsonObject:
    outcome = tables.TrialOutcome(
        state=command.state,
        score=command.score,
        answer=command.answer,
        stop_reason=command.stop_reason,
        error_class=command.error_class,
        error=command.error,
        truncated=command.truncated,
        wall_s=command.wall_s,
    )

    def run(con: Any) -> tables.CellRow:
        session = tables.trial_session(con, command.trial)
        usage = select_tree_usage(con, session)
        return tables.finish_trial(
            con,
            trial_id=command.trial,
            outcome=outcome,
            tokens_input=usage.input,
            tokens_output=usage.output,
            cost_usd=usage.cost_usd,
            cost_known=usage.cost_known,
            now=utcnow(),
        )

    cell = await daemon.store.transaction(run)
    return {"cell": cell.to_wire()}


async def _status(daemon: CommandContext, command: SweepStatus) -> JsonObject:
    def run(
        con: Any,
    ) -> tuple[tables.SweepRow | None, list[tables.CellRow], list[Any], list[JsonObject]]:
        row = tables.select_sweep(con, command.name)
        if row is None:
            return None, [], [], []
        cells = tables.select_cells(con, command.name, offset=command.offset, limit=command.limit)
        trials = (
            tables.select_trials(con, command.name, [c.fingerprint for c in cells])
            if command.trials
            else []
        )
        return row, cells, con.execute(_TOTALS_SQL, [command.name]).fetchall(), trials

    row, cells, totals, trials = await daemon.store.read_side(run)
    if row is None:
        raise ApiCommandError(E_NOT_FOUND, f"no sweep {command.name!r}")
    summary = _summary(row, totals)
    extra: JsonObject = {"trials": trials} if command.trials else {}
    return {
        **extra,
        "sweep": summary,
        "counts": summary["counts"],
        "cells_total": summary["cells_total"],
        "cost_usd": summary["cost_usd"],
        "tokens": summary["tokens"],
        "cells": [c.to_wire() for c in cells],
        "offset": command.offset,
    }


async def _list(daemon: CommandContext, command: SweepList) -> JsonObject:
    def run(con: Any) -> list[tuple[tables.SweepRow, list[Any]]]:
        rows = tables.select_sweeps(con, command.limit)
        return [(row, con.execute(_TOTALS_SQL, [row.name]).fetchall()) for row in rows]

    found = await daemon.store.read_side(run)
    return {"sweeps": [_summary(row, totals) for row, totals in found]}


async def _cancel(daemon: CommandContext, command: SweepCancel, abort: AbortSession) -> JsonObject:
    running = await daemon.store.transaction(
        lambda con: tables.cancel_sweep(con, command.name, utcnow())
    )
    aborted: list[str] = []
    for session in running:
        try:
            await abort(session)
        except ApiCommandError:
            continue  # gone meanwhile: nothing to stop
        aborted.append(session)
    return {"sweep": command.name, "cancelled": True, "aborted": aborted}
