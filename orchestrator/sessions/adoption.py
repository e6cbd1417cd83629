"""A restarted daemon adopts the sandboxes its predecessor left running (docs/spec.md §4, R2, R8).

Runs once at start-up, after ``Orchestrator.recover_interrupted`` (every cell that was running
has its ``interrupted`` result and every interrupted turn its ``aborted`` event: they are
never re-run) and before mailbox redelivery and ``ready`` (so a redelivered message already
finds its recipient's old kernel).

For each row of the ``sandboxes`` table (``SandboxRegistry`` wrote it):

- its session exists and is not terminal (deleted, aborted, error) → ``backend.adopt``:
  reconnect to the gateway with the recorded URL/socket, token and kernel id; a kernel still
  running the dead daemon's cell is interrupted; the sandbox waits in ``orch.adopted`` until
  the session is loaded, and its next cell runs in the same kernel (variables intact);
- anything else (an idle warm-pool sandbox, an unknown or terminal session, a sandbox that
  was still starting, one that is gone or does not answer, a second one for a session) →
  ``backend.remove`` (local: the gateway's process group; docker: the container) and the row
  goes.

Then each backend removes what carries this daemon's labels but is in no row
(``remove_unknown``: a container created just before the crash, not yet recorded).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Final

from orchestrator.errors import SandboxError, UserError
from orchestrator.ids import validate_session_id
from orchestrator.sandbox.base import Sandbox, SandboxBackend, SandboxRef
from orchestrator.sessions.live import Inbound
from orchestrator.sessions.manager import TERMINAL_STATES, Orchestrator
from orchestrator.sessions.sandbox_records import ref_of
from orchestrator.store.events import UserMessagePayload

__all__ = ["RESUME_TEXT", "AdoptionReport", "adopt_sandboxes", "resume_interrupted_turns"]

log = logging.getLogger(__name__)


@dataclass
class AdoptionReport:
    adopted: list[str] = field(default_factory=list)  # session ids
    removed: list[str] = field(default_factory=list)  # "backend/ref" of recorded sandboxes
    unknown_removed: int = 0  # labelled but unrecorded (docker)


async def adopt_sandboxes(orch: Orchestrator) -> AdoptionReport:
    """Adopt or remove every recorded sandbox; see the module docstring."""
    report = AdoptionReport()
    known: dict[str, set[str]] = {}
    for row in await orch.store.list_sandboxes():
        known.setdefault(row.backend, set()).add(row.ref)
        ref = ref_of(row)
        backend = orch.backends.get(row.backend)
        if backend is None:
            log.warning("sandbox %s/%s: its backend is not available; forgetting it", *_ids(ref))
        else:
            outcome = await _try_adopt(orch, backend, ref)
            if not isinstance(outcome, str):
                orch.adopted.put(ref.session_id, outcome)
                report.adopted.append(ref.session_id)
                continue
            log.info("removing sandbox %s/%s: %s", *_ids(ref), outcome)
            try:
                await backend.remove(ref)
            except Exception:  # the row goes anyway; `doctor` finds a container left behind
                log.exception("removing sandbox %s/%s failed", *_ids(ref))
        await orch.store.delete_sandbox(row.backend, row.ref)
        report.removed.append("/".join(_ids(ref)))
    for name, backend in orch.backends.items():
        try:
            report.unknown_removed += await backend.remove_unknown(known.get(name, set()))
        except SandboxError as exc:
            log.warning("sweeping unknown %s sandboxes failed: %s", name, exc)
    return report


async def _try_adopt(orch: Orchestrator, backend: SandboxBackend, ref: SandboxRef) -> Sandbox | str:
    """The adopted sandbox, or why it is not adopted."""
    try:
        validate_session_id(ref.session_id)
    except UserError:
        return "an idle warm-pool sandbox"
    record = await orch.store.get_session(ref.session_id)
    if record is None:
        return f"session {ref.session_id} is unknown"
    if record.status in TERMINAL_STATES:
        return f"session {ref.session_id} is {record.status}"
    if ref.session_id in orch.adopted:
        return f"session {ref.session_id} has an adopted sandbox already"
    if record.backend != ref.backend:
        return f"session {ref.session_id} uses the {record.backend} backend"
    try:
        spec = await orch.sandbox_spec(record)
        return await backend.adopt(ref, spec)
    except SandboxError as exc:
        return f"session {ref.session_id}: {exc}"


def _ids(ref: SandboxRef) -> tuple[str, str]:
    return ref.backend, ref.ref


# What a turn interrupted by the daemon's death continues with (source "harness"): the
# interrupted step is already marked in the history, so continuing repeats nothing by itself.
RESUME_TEXT: Final = (
    "[harness] The orchestrator restarted while this turn was running. The interrupted step "
    "is marked above: a cell that was running has status `interrupted` and was not re-run, "
    "so its effects are unknown (check before repeating it). Continue the task."
)


async def resume_interrupted_turns(orch: Orchestrator) -> list[str]:
    """Continue the turns ``recover_interrupted`` marked (sessions that were running when the
    daemon died), after adoption and redelivery: a session a redelivered message already woke
    is left to that turn. A model call has no side effect to repeat, and a cell is never
    re-run: the model decides with the ``interrupted`` result in front of it. Returns the
    sessions resumed; one that cannot be loaded is logged and skipped."""
    resumed: list[str] = []
    pending, orch.interrupted_turns = orch.interrupted_turns, []
    if not orch.settings.resume_interrupted_turns:
        return resumed
    for session_id in pending:
        try:
            live = await orch.load_session_id(session_id)
        except UserError as exc:
            log.info("not resuming %s: %s", session_id, exc)
            continue
        if live.state == "running" or live.pending > 0:
            continue
        payload = UserMessagePayload(text=RESUME_TEXT, source="harness")
        orch.submit(live, Inbound(payload))
        resumed.append(session_id)
    return resumed
