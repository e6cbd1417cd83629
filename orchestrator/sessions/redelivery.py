"""Start-up redelivery of durable agent messages (docs/subagents.md, R4).

Every message between agents goes into its recipient's NATS mailbox before it is queued
(``Orchestrator.deliver``) and is acked once the recipient recorded it. A daemon that died in
between finds it there at its next start: ``redeliver_pending`` submits each such message once,
in the order it was sent, and only acks the ones whose commit happened before the crash.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import ValidationError

from orchestrator.sessions.live import Inbound
from orchestrator.sessions.manager import TERMINAL_STATES, Orchestrator
from orchestrator.store.events import UserMessagePayload

__all__ = ["redeliver_pending"]

log = logging.getLogger(__name__)


async def redeliver_pending(orch: Orchestrator) -> int:
    """At start-up: submit every message a mailbox still holds, each once.

    A message already recorded in its recipient's history (the crash came between the commit
    and the ack) is only acked. The rest wake their recipient (loaded from the store) in the
    order they were sent. Returns how many were submitted.
    """
    if orch.bus is None:
        return 0
    submitted = 0
    for session_id in await orch.bus.sessions_with_messages():
        try:
            submitted += await _redeliver(orch, session_id)
        except Exception:  # the messages stay in the mailbox for the next start
            log.exception("could not redeliver the messages of %s", session_id)
    return submitted


async def _redeliver(orch: Orchestrator, session_id: str) -> int:
    bus = orch.bus
    assert bus is not None
    messages = await bus.pending_messages(session_id)
    record = await orch.store.get_session(session_id)
    if record is None or record.status == "deleted":
        await bus.purge_messages(session_id)
        return 0
    ids = [str(m.get("id")) for m in messages]
    # In memory first, then the store: an id leaves `inflight` only after its commit, so one
    # that is in neither place (checked in this order) was never submitted here.
    live = orch.sessions.get(session_id)
    queued = set(live.inflight) if live is not None else set()
    recorded = await orch.store.recorded_message_ids(session_id, ids)
    fresh: list[tuple[UserMessagePayload, Literal["steer", "follow_up"]]] = []
    for message_id, message in zip(ids, messages, strict=True):
        if message_id in queued:
            continue
        if message_id in recorded:
            await bus.ack_message(session_id, message_id)
            continue
        try:
            payload = UserMessagePayload.model_validate(message.get("payload"))
        except ValidationError:
            log.error("dropping malformed mailbox message %s of %s", message_id, session_id)
            await bus.ack_message(session_id, message_id)
            continue
        payload = payload.model_copy(update={"message_id": message_id})
        fresh.append((payload, "steer" if message.get("mode") == "steer" else "follow_up"))
    if not fresh:
        return 0
    if record.status in TERMINAL_STATES:
        log.warning(
            "dropping %d message(s) for %s, which is %s", len(fresh), session_id, record.status
        )
        for payload, _mode in fresh:
            assert payload.message_id is not None
            await bus.ack_message(session_id, payload.message_id)
        return 0
    live = await orch.load_session(record)
    for payload, mode in fresh:
        orch.submit(live, Inbound(payload, mode=mode))
    log.info("redelivered %d message(s) to %s", len(fresh), session_id)
    return len(fresh)
