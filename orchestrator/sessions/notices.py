"""Subagent notices batched into one parent turn (issue 18, docs/subagents.md "Notices").

A child that finishes without messaging its parent, or stops on an error, leaves the parent a
``notice`` event (shown at once, in every view) and queues the same text as a follow-up
``harness`` message whose ``notice_ids`` name that event. Invariants:

- One turn per batch: when the parent's driver takes a notice from its inbox, every other
  notice queued there goes with it, merged into one ``UserMessagePayload`` (texts in arrival
  order, one blank line apart), so five children finishing while the parent was busy cost it
  one model turn, not five. Other queued input keeps its order.
- Close together counts as one batch: a notice taken while a sibling still runs waits up to
  ``NOTICE_GATHER_S`` for the sibling's notice (the caller waits; ``gather_notices`` merges).
- Recorded once, shown once: the merged message keeps the first delivery's ``message_id`` and
  lists the others in ``merged_message_ids`` (each counts as recorded, so none is redelivered
  after a crash); renderers skip a message with ``notice_ids`` since its notices were shown.
"""

from __future__ import annotations

from typing import Final

from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.store.events import UserMessagePayload

__all__ = [
    "NOTICE_GATHER_S",
    "NOTICE_SEPARATOR",
    "gather_notices",
    "is_notice",
    "notice_message",
]

# How long a notice taken while a sibling subagent still runs waits for more notices before
# its turn starts: children finishing this close together reach the parent as one turn.
NOTICE_GATHER_S: Final = 0.25
NOTICE_SEPARATOR: Final = "\n\n"


def notice_message(text: str, notice_id: str) -> UserMessagePayload:
    """The follow-up that carries one ``notice`` event's text to the model."""
    return UserMessagePayload(text=text, source="harness", notice_ids=[notice_id])


def is_notice(item: Inbound) -> bool:
    return bool(item.payload.notice_ids) and item.mode == "follow_up"


def gather_notices(live: LiveSession, first: Inbound) -> Inbound:
    """``first`` (already taken from ``live.follow``) merged with every notice still queued
    there; those leave the queue, the rest of it keeps its order. ``first`` itself when it is
    not a notice or no other notice waits."""
    if not is_notice(first):
        return first
    rest = [item for item in live.follow if is_notice(item)]
    if not rest:
        return first
    kept = [item for item in live.follow if not is_notice(item)]
    live.follow.clear()
    live.follow.extend(kept)
    batch = [first, *rest]
    ids = [i for item in batch for i in item.payload.notice_ids or ()]
    mailbox = [item.payload.message_id for item in batch if item.payload.message_id is not None]
    merged = UserMessagePayload(
        text=NOTICE_SEPARATOR.join(item.payload.text for item in batch),
        source="harness",
        notice_ids=ids,
        message_id=mailbox[0] if mailbox else None,
        merged_message_ids=mailbox[1:] or None,
    )
    return Inbound(merged, mode="follow_up")
