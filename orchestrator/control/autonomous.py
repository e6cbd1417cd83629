"""Autonomous mode: the harness keeps the agent working within limits, and gates decide when
it may finish (docs/spec.md §1 and §7, docs/control.md).

``prime-agent --autonomous`` turns it on for a session with an ``AutonomousPolicy``: gate
commands (``--autonomous-gate CMD``, repeatable) and limits of turns
(``AUTONOMOUS_MAX_TURNS``), tokens (``AUTONOMOUS_MAX_TOKENS``) and wall time
(``AUTONOMOUS_TIMEOUT_MS``). After every turn the post-turn work calls ``Autonomy.after_turn``,
which counts the turn and its tokens and returns a decision:

- ``Continue(text)``: submit ``text`` as a harness ``follow_up`` message;
- ``Stop(reason, detail)``: the run is over; ``reason`` is one of ``STOP_REASONS`` and maps to
  an exit code (``EXIT_CODES``), and an ``autonomous_stop`` event was recorded;
- ``None``: the session is not autonomous (or its run already stopped): nothing to do.

The rules, in order:

1. A turn that ended with a model error (outcome ``error``, ``budget_exceeded``,
   ``compaction_failed``) stops with ``model_error``; an aborted turn with ``aborted``. A
   turn that stopped ``stuck`` (the model repeated one call) runs the gates once: every gate
   passed stops with ``gate_passed`` (the work was done before the loop), anything else with
   ``stuck`` (no continuation: it would only repeat the loop).
2. With gates, they run in order (``run_gate``: in the session's sandbox, with the session's
   workspace as working directory, ``gate_timeout_s`` each) and the first failure ends the
   pass; each run is a ``gate_result`` event. Every gate passed: stop with ``gate_passed``,
   even past a limit (the work is done; refusing it would waste it). A gate failed: stop with
   ``gate_failed`` when a limit is reached, else continue with the failure (command, exit code,
   bounded output, attempt). A gate that failed is not run again while the workspace hashes the
   same as when it failed (``workspace_hash`` over ``target.workspace_dir()``): its
   ``gate_result`` says ``skipped`` and the agent is told to change something first. Without a
   host directory to hash (``workspace_dir()`` None), or when the gate never ran (no sandbox,
   a cell that did not report), it always runs again.
3. Without gates, as in the reference, the agent is never taken at its word: it is continued
   (``policy.continuation_prompt`` or ``CONTINUATION_PROMPT``) until a limit stops it with
   ``turn_limit``, ``token_limit`` or ``time_limit`` (checked in that order). So ``completed``
   is never an autonomous stop reason; it is the exit of a non-autonomous run whose model
   answered, listed here so that every exit has one table.

A turn's tokens are input + output + cache write of its ``usage`` events (the events after the
previous ``turn_end`` up to the last one), leaving out a refinement's planning call, as the
reference counted them; the refiner's and compaction's other calls are the agent's work.
Unlike the reference, every counter and the gate state live in the ``autonomy`` row
(orchestrator/store/autonomy.py), written on every decision, so a restarted daemon continues a
run where it was.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.control.gates import GateRun, run_gate
from orchestrator.control.workspace_hash import bound_gate_output, workspace_hash
from orchestrator.errors import SandboxError
from orchestrator.ids import new_event_id
from orchestrator.sandbox.base import Sandbox
from orchestrator.store.autonomy import (
    AutonomyRow,
    select_autonomy,
    turn_tokens,
    update_autonomy,
    upsert_autonomy,
)
from orchestrator.store.db import Store
from orchestrator.store.events import AutonomousStopPayload, EventType, GateResultPayload
from orchestrator.store.queries import utcnow
from orchestrator.store.sessions_with_rows import SessionsWithRows, distinct_sessions_query

__all__ = [
    "ABORTED_OUTCOMES",
    "AUTONOMOUS_MAX_TOKENS",
    "AUTONOMOUS_MAX_TURNS",
    "AUTONOMOUS_TIMEOUT_MS",
    "CONTINUATION_PROMPT",
    "CONTINUATION_PROMPT_MAX_CHARS",
    "EXIT_CODES",
    "EXIT_GATE_FAILED",
    "EXIT_TIME_LIMIT",
    "EXIT_TOKEN_LIMIT",
    "EXIT_TURN_LIMIT",
    "GATE_COMMAND_MAX_CHARS",
    "GATE_TIMEOUT_MAX_S",
    "GATE_TIMEOUT_S",
    "MAX_GATES",
    "MODEL_ERROR_OUTCOMES",
    "SKIPPED_GATE_OUTPUT",
    "STOP_REASONS",
    "AutonomousPolicy",
    "Autonomy",
    "AutonomyTarget",
    "Continue",
    "Decision",
    "Stop",
    "StopReason",
    "exit_code_for",
]

log = logging.getLogger(__name__)

# Limits (docs/spec.md §7; the reference's defaults).
AUTONOMOUS_MAX_TURNS: Final = 12
AUTONOMOUS_MAX_TOKENS: Final = 80_000
AUTONOMOUS_TIMEOUT_MS: Final = 30 * 60 * 1000
GATE_TIMEOUT_S: Final = 300
# Bounds on what a policy may hold (it arrives from the command line and the control API).
MAX_GATES: Final = 16
GATE_COMMAND_MAX_CHARS: Final = 4096
CONTINUATION_PROMPT_MAX_CHARS: Final = 16_000
GATE_TIMEOUT_MAX_S: Final = 24 * 60 * 60

StopReason = Literal[
    "gate_passed",
    "goal_complete",
    "completed",
    "turn_limit",
    "token_limit",
    "time_limit",
    "gate_failed",
    "model_error",
    "stuck",
    "aborted",
]
STOP_REASONS: Final[tuple[StopReason, ...]] = get_args(StopReason)

# Exit codes (docs/control.md); orchestrator/cli/common.py re-exports these four and owns the
# general ones, whose values are repeated here (a test pins them to cli/common.py's).
EXIT_TURN_LIMIT: Final = 3
EXIT_TOKEN_LIMIT: Final = 4
EXIT_TIME_LIMIT: Final = 5
EXIT_GATE_FAILED: Final = 6
_EXIT_OK: Final = 0  # EXIT_OK
_EXIT_ERROR: Final = 1  # EXIT_ERROR
_EXIT_ABORTED: Final = 130  # EXIT_ABORTED
_EXIT_STUCK: Final = 7  # EXIT_STUCK

EXIT_CODES: Final[Mapping[StopReason, int]] = MappingProxyType(
    {
        "gate_passed": _EXIT_OK,
        "goal_complete": _EXIT_OK,
        "completed": _EXIT_OK,
        "turn_limit": EXIT_TURN_LIMIT,
        "token_limit": EXIT_TOKEN_LIMIT,
        "time_limit": EXIT_TIME_LIMIT,
        "gate_failed": EXIT_GATE_FAILED,
        "model_error": _EXIT_ERROR,
        "stuck": _EXIT_STUCK,
        "aborted": _EXIT_ABORTED,
    }
)

# Turn outcomes (agent/loop.py StopReason) that end an autonomous run.
MODEL_ERROR_OUTCOMES: Final = frozenset({"error", "budget_exceeded", "compaction_failed"})
ABORTED_OUTCOMES: Final = frozenset({"aborted"})
STUCK_OUTCOME: Final = "stuck"  # the model repeated one call (agent/stuck.py)

CONTINUATION_PROMPT: Final = (
    "[autonomous] No human input is available. Keep working on the task on your own: check "
    "your work, fix what is wrong and finish what is missing. Do not ask questions or wait for "
    "a reply; do not end the run yourself. It ends when its turn, token or time limit is reached."
)
SKIPPED_GATE_OUTPUT: Final = "not run again: the workspace has not changed since this gate failed"


def exit_code_for(reason: str) -> int:
    """The exit code of a stop reason; an unknown reason is an error (1)."""
    if reason in STOP_REASONS:
        return EXIT_CODES[reason]
    return _EXIT_ERROR


class AutonomousPolicy(BaseModel):
    """What an autonomous run may do: its gates and limits (stored as the row's ``policy``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    gates: list[str] = Field(default_factory=list, max_length=MAX_GATES)
    max_turns: int = Field(default=AUTONOMOUS_MAX_TURNS, ge=1)
    max_tokens: int = Field(default=AUTONOMOUS_MAX_TOKENS, ge=1)
    timeout_ms: int = Field(default=AUTONOMOUS_TIMEOUT_MS, ge=1)
    gate_timeout_s: float = Field(default=GATE_TIMEOUT_S, gt=0, le=GATE_TIMEOUT_MAX_S)
    continuation_prompt: str | None = Field(default=None, max_length=CONTINUATION_PROMPT_MAX_CHARS)

    @field_validator("gates")
    @classmethod
    def _check_gates(cls, gates: list[str]) -> list[str]:
        for command in gates:
            if not command.strip():
                raise ValueError("a gate command must not be empty")
            if len(command) > GATE_COMMAND_MAX_CHARS:
                raise ValueError(f"a gate command is longer than {GATE_COMMAND_MAX_CHARS} chars")
            if "\0" in command:
                raise ValueError("a gate command must not contain NUL")
        if len(set(gates)) != len(gates):
            raise ValueError("a gate command is given twice")
        return gates

    @field_validator("continuation_prompt")
    @classmethod
    def _check_prompt(cls, prompt: str | None) -> str | None:
        if prompt is not None and not prompt.strip():
            raise ValueError("the continuation prompt must not be empty")
        return prompt


@dataclass(frozen=True)
class Continue:
    """Send ``text`` to the agent (a harness ``follow_up`` message)."""

    text: str


@dataclass(frozen=True)
class Stop:
    """The autonomous run is over (its ``autonomous_stop`` event is recorded)."""

    reason: StopReason
    detail: str = ""
    # ``gate_failed``: the limit that ended the run with a gate still failing (turn_limit,
    # token_limit, time_limit); ACP reports the limit, as Prime Agent does.
    limit: StopReason | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.reason]


Decision = Continue | Stop | None


class AutonomyTarget(Protocol):
    """The live session as the autonomous decision needs it."""

    @property
    def session_id(self) -> str: ...

    @property
    def cwd(self) -> str:
        """The workspace as the kernel sees it (the gates' working directory)."""
        ...

    async def sandbox(self) -> Sandbox:
        """The session's sandbox, started if it has none."""
        ...

    async def record(self, type_: EventType, payload: BaseModel) -> Any:
        """Append an event to the session (and publish it)."""
        ...

    def workspace_dir(self) -> Path | None:
        """The workspace on the host, to hash; None when it cannot be hashed here."""
        ...


@dataclass
class _Pass:
    """One decision in the making."""

    row: AutonomyRow
    policy: AutonomousPolicy
    turns: int
    tokens: int
    gate_state: dict[str, Any]
    results: dict[str, GateResultPayload]


class Autonomy:
    """Autonomous runs of every session of one store: ``enable``, ``after_turn``, ``disable``.

    ``clock`` gives aware UTC datetimes (tests pass a fake one); ``after_turn`` of one session
    is serialized, so two post-turn runs never count the same row twice at once.
    """

    def __init__(self, store: Store, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._store = store
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        # Sessions that ever had a run: every other session's turn ends without a read.
        self._with_runs = SessionsWithRows(store, distinct_sessions_query("autonomy"))

    # -- the row -------------------------------------------------------------------------------

    async def enable(self, session_id: str, policy: AutonomousPolicy) -> AutonomyRow:
        """Start an autonomous run: counters at 0, the clock at now (a previous run's row is
        replaced)."""
        now = self._clock()
        row = AutonomyRow(
            session_id=session_id,
            policy=policy.model_dump(mode="json"),
            enabled=True,
            started_at=now,
            updated_at=now,
        )
        self._with_runs.add(session_id)
        return await self._store.transaction(lambda con: upsert_autonomy(con, row))

    async def get(self, session_id: str) -> AutonomyRow | None:
        if not await self._with_runs.may_have(session_id):
            return None
        return await self._store.read_side(lambda con: select_autonomy(con, session_id))

    async def disable(self, session_id: str) -> AutonomyRow | None:
        """Turn it off (the row stays, for status); ``after_turn`` returns None from now on."""
        return await self._store.transaction(
            lambda con: update_autonomy(con, session_id, enabled=False)
        )

    @staticmethod
    def policy_of(row: AutonomyRow) -> AutonomousPolicy:
        return AutonomousPolicy.model_validate(row.policy)

    # -- the decision --------------------------------------------------------------------------

    async def after_turn(self, target: AutonomyTarget, outcome_reason: str) -> Decision:
        """Count the turn that just ended (its ``turn_end`` is recorded) and decide (module
        docstring). Persists the counters and gate state; on a stop, also the stop and its
        ``autonomous_stop`` event."""
        session_id = target.session_id
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            row = await self.get(session_id)
            if row is None or not row.enabled or row.stopped:
                return None
            spent = await self._store.read(lambda con: turn_tokens(con, session_id))
            run = _Pass(
                row=row,
                policy=self.policy_of(row),
                turns=row.turns_used + 1,
                tokens=row.tokens_used + spent,
                gate_state=copy.deepcopy(row.gate_state),
                results={},
            )
            decision = await self._decide(target, run, outcome_reason)
            await self._persist(target, run, decision)
            return decision

    async def _decide(self, target: AutonomyTarget, run: _Pass, outcome: str) -> Continue | Stop:
        if outcome in MODEL_ERROR_OUTCOMES:
            return Stop("model_error", f"the turn ended with {outcome}")
        if outcome in ABORTED_OUTCOMES:
            return Stop("aborted", "the turn was aborted")
        if outcome == STUCK_OUTCOME:  # continuing would only repeat the loop
            stuck = Stop("stuck", "the model repeated the same call until the turn stopped")
            if not run.policy.gates:
                return stuck
            # The work may be done all the same (a small model that fixed the file and then
            # kept quoting its fix): the gates decide once, and nothing continues the loop.
            checked = await self._gate_pass(target, run)
            return (
                checked if isinstance(checked, Stop) and checked.reason == "gate_passed" else stuck
            )
        if run.policy.gates:
            return await self._gate_pass(target, run)
        limit = self._limit(run)
        if limit is not None:
            return limit
        return Continue(self._continuation(run))

    def _limit(self, run: _Pass) -> Stop | None:
        """The first limit reached (turns, tokens, time), as the stop it causes."""
        policy = run.policy
        if run.turns >= policy.max_turns:
            return Stop("turn_limit", f"{run.turns} of {policy.max_turns} turns used")
        if run.tokens >= policy.max_tokens:
            return Stop("token_limit", f"{run.tokens:,} of {policy.max_tokens:,} tokens used")
        elapsed_ms = self._elapsed_s(run.row) * 1000.0
        if elapsed_ms >= policy.timeout_ms:
            return Stop(
                "time_limit",
                f"{elapsed_ms / 1000.0:.0f} s of {policy.timeout_ms / 1000.0:.0f} s elapsed",
            )
        return None

    def _elapsed_s(self, row: AutonomyRow) -> float:
        return max(0.0, (self._clock() - row.started_at).total_seconds())

    def _continuation(self, run: _Pass) -> str:
        policy = run.policy
        prompt = policy.continuation_prompt or CONTINUATION_PROMPT
        return (
            f"{prompt}\n(autonomous: turn {run.turns} of {policy.max_turns}, "
            f"{run.tokens:,} of {policy.max_tokens:,} tokens used)"
        )

    # -- gates ---------------------------------------------------------------------------------

    async def _gate_pass(self, target: AutonomyTarget, run: _Pass) -> Continue | Stop:
        """Run the gates in order until one fails; then stop or continue (module docstring)."""
        sandbox: Sandbox | None = None
        for command in run.policy.gates:
            entry = dict(run.gate_state.get(command) or {})
            attempt = int(entry.get("attempts", 0)) + 1
            failed_hash = entry.get("failed_hash")
            if isinstance(failed_hash, str):
                current = await self._hash(target)
                if current == failed_hash:
                    entry["attempts"] = attempt
                    run.gate_state[command] = entry
                    skipped = GateResultPayload(
                        command=command,
                        passed=False,
                        output=SKIPPED_GATE_OUTPUT,
                        attempt=attempt,
                        skipped=True,
                        workspace_hash=current,
                    )
                    await self._result(target, run, skipped)
                    return self._after_failure(run, skipped, entry.get("last_exit"))
            if sandbox is None:
                try:
                    sandbox = await target.sandbox()
                except SandboxError as exc:
                    gate = GateRun(None, bound_gate_output(f"no sandbox: {exc}"), False, 0.0)
                    return await self._failed(target, run, command, attempt, gate)
            gate = await run_gate(
                sandbox,
                command,
                cwd=target.cwd,
                timeout_s=run.policy.gate_timeout_s,
                cell_id=f"gate-{new_event_id()}",
            )
            if not gate.passed:
                return await self._failed(target, run, command, attempt, gate)
            # A pass resets the gate: its attempts count again from 1 if it fails later.
            run.gate_state[command] = {"attempts": 0, "last_exit": 0, "failed_hash": None}
            await self._result(target, run, _payload(command, attempt, gate, None))
        count = len(run.policy.gates)
        return Stop("gate_passed", f"{count} gate{'' if count == 1 else 's'} passed")

    async def _failed(
        self, target: AutonomyTarget, run: _Pass, command: str, attempt: int, gate: GateRun
    ) -> Continue | Stop:
        # Hashed after the run: what the gate itself wrote (caches, reports) is part of the
        # state it failed in, and is written the same way by the next run. A gate that never
        # ran (no sandbox, a cell that did not report) failed for reasons other than the
        # workspace, so it is not held back.
        ran = gate.exit_code is not None or gate.timed_out
        digest = await self._hash(target) if ran else None
        run.gate_state[command] = {
            "attempts": attempt,
            "last_exit": gate.exit_code,
            "failed_hash": digest,
        }
        payload = _payload(command, attempt, gate, digest)
        await self._result(target, run, payload)
        return self._after_failure(run, payload, gate.exit_code)

    def _after_failure(
        self, run: _Pass, result: GateResultPayload, last_exit: Any
    ) -> Continue | Stop:
        limit = self._limit(run)
        if limit is not None:
            how = "was not run again" if result.skipped else _how(result)
            detail = f"{limit.detail}; gate `{result.command}` {how}"
            return Stop("gate_failed", detail, limit=limit.reason)
        if result.skipped:
            exited = f"exit {last_exit}" if isinstance(last_exit, int) else "it failed"
            return Continue(
                f"[autonomous] Gate `{result.command}` was not run again (attempt "
                f"{result.attempt}): the workspace has not changed since it failed ({exited}). "
                "Change the files that make it fail first; it runs again when your turn ends "
                "and the workspace differs."
            )
        return Continue(
            f"[autonomous] Gate failed (attempt {result.attempt}): `{result.command}` "
            f"{_how(result)}.\nOutput:\n{result.output}\n\nFix the failure; the gates run again "
            "when your turn ends."
        )

    async def _result(self, target: AutonomyTarget, run: _Pass, payload: GateResultPayload) -> None:
        run.results[payload.command] = payload
        await target.record("gate_result", payload)

    async def _hash(self, target: AutonomyTarget) -> str | None:
        """The workspace's content hash, or None when there is nothing to hash (the gate then
        always runs again)."""
        root = target.workspace_dir()
        if root is None:
            return None
        try:
            return await asyncio.to_thread(workspace_hash, root)
        except Exception:  # a hash we cannot take only costs a re-run
            log.warning("hashing workspace %s failed", root, exc_info=True)
            return None

    # -- persistence ---------------------------------------------------------------------------

    async def _persist(self, target: AutonomyTarget, run: _Pass, decision: Continue | Stop) -> None:
        changes: dict[str, Any] = {
            "turns_used": run.turns,
            "tokens_used": run.tokens,
            "gate_state": run.gate_state,
        }
        if isinstance(decision, Continue):
            changes["continuations_used"] = run.row.continuations_used + 1
        else:
            changes.update(
                stop_reason=decision.reason, stop_detail=decision.detail, stopped_at=self._clock()
            )
        session_id = run.row.session_id
        await self._store.transaction(lambda con: update_autonomy(con, session_id, **changes))
        if isinstance(decision, Stop):
            # Children still working end explicitly before the run does, and the final event
            # says which (a target without children to settle has nothing to say).
            settle = getattr(target, "settle_children", None)
            children: dict[str, str] = await settle() if settle is not None else {}
            await target.record(
                "autonomous_stop",
                AutonomousStopPayload(
                    reason=decision.reason,
                    detail=decision.detail,
                    limit=decision.limit,
                    turns=run.turns,
                    tokens=run.tokens,
                    elapsed_s=round(self._elapsed_s(run.row), 3),
                    gates=_gate_summary(run),
                    children=children,
                ),
            )


def _how(result: GateResultPayload) -> str:
    if result.timed_out:
        return "timed out"
    if result.exit_code is None:
        return "could not run"
    return f"exited with {result.exit_code}"


def _payload(command: str, attempt: int, gate: GateRun, digest: str | None) -> GateResultPayload:
    return GateResultPayload(
        command=command,
        passed=gate.passed,
        exit_code=gate.exit_code,
        output=gate.output,
        duration_ms=round(gate.duration_ms, 3),
        attempt=attempt,
        timed_out=gate.timed_out,
        workspace_hash=digest,
    )


def _gate_summary(run: _Pass) -> list[dict[str, Any]]:
    """Each gate's last word for the ``autonomous_stop`` event: what this pass did with it, or
    ``not_run`` (with its state from earlier passes)."""
    summary: list[dict[str, Any]] = []
    for command in run.policy.gates:
        result = run.results.get(command)
        state = run.gate_state.get(command) or {}
        if result is None:
            summary.append(
                {
                    "command": command,
                    "status": "not_run",
                    "attempts": int(state.get("attempts", 0)),
                    "exit_code": state.get("last_exit"),
                }
            )
            continue
        status = "passed" if result.passed else "skipped" if result.skipped else "failed"
        summary.append(
            {
                "command": command,
                "status": status,
                "attempts": result.attempt,
                "exit_code": result.exit_code,
            }
        )
    return summary
