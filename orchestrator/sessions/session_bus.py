"""What the session manager needs from the message bus (``SessionBus``, a protocol).

The NATS implementation is ``orchestrator/sessions/bus_link.py`` (``NatsSessionBus``); a
``None`` bus means sessions without host requests (no ``rlm(...)``, no messages).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["SessionBus"]


class SessionBus(Protocol):
    """What the manager needs from the bus: per-session credentials and durable mailboxes.

    The mailbox methods keep agent messages durable (R4): a message is put into the
    recipient's mailbox before it is queued in memory, and acked once the recipient has
    recorded it.
    """

    async def credentials_env(self, session_id: str) -> dict[str, str]:
        """The environment a sandbox of ``session_id`` needs to reach the host (its own user)."""
        ...

    async def forget(self, session_id: str) -> None:
        """The session is gone: its bus user and routing go with it."""
        ...

    async def put_message(self, session_id: str, message: dict[str, Any]) -> None:
        """Store ``message`` (a JSON object with a string ``id``) durably for the session."""
        ...

    async def ack_message(self, session_id: str, message_id: str) -> None:
        """The message is recorded in the session's history: drop it from the mailbox."""
        ...

    async def pending_messages(self, session_id: str) -> list[dict[str, Any]]:
        """Messages stored and not acked, oldest first."""
        ...

    async def sessions_with_messages(self) -> list[str]:
        """Session ids whose mailbox is not empty."""
        ...

    async def purge_messages(self, session_id: str) -> None:
        """Drop every pending message of the session (it was deleted)."""
        ...
