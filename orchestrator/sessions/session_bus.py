"""What the session manager needs from the message bus (``SessionBus``).

The NATS implementation is ``orchestrator/sessions/bus_link.py``; a ``None`` bus means sessions
without host requests (no ``rlm(...)``, no messages).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SessionBus"]


class SessionBus:
    """What the manager needs from the bus; ``None`` bus = sessions without host requests.

    The mailbox methods keep agent messages durable (R4): a message is put into the
    recipient's mailbox before it is queued in memory, and acked once the recipient has
    recorded it. This base class has no mailbox (messages live in memory only).
    """

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        raise NotImplementedError

    async def forget(self, session_id: str) -> None:
        raise NotImplementedError

    async def put_message(self, session_id: str, message: dict[str, Any]) -> None:
        """Store ``message`` (a JSON object with a string ``id``) durably for the session."""
        return None

    async def ack_message(self, session_id: str, message_id: str) -> None:
        """The message is recorded in the session's history: drop it from the mailbox."""
        return None

    async def pending_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Messages stored and not acked, oldest first."""
        return []

    async def sessions_with_messages(self) -> list[str]:
        """Session ids whose mailbox is not empty."""
        return []

    async def purge_messages(self, session_id: str) -> None:
        """Drop every pending message of the session (it was deleted)."""
        return None
