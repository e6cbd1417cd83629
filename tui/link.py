"""The TUI's one connection to the daemon: commands, and events routed to whoever listens.

Screens subscribe per session; the link attaches the session on the first subscription and
detaches after the last. One pump task reads the client's queue and hands each message to the
session's listeners in arrival order (durable ``event``s with their cursor, transient
``stream`` deltas, ``resync``). A listener that raises is logged and skipped: one broken screen
does not stop the others' events.

The TUI imports ``orchestrator.api`` and nothing below it (docs/tui.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.api import CAP_STREAM, CLIENT_CAPABILITIES, ConnectionClosed, ControlClient

__all__ = ["DaemonLink", "Listener", "Pushed"]

log = logging.getLogger(__name__)

PushedKind = Literal["event", "stream", "resync"]


@dataclass(frozen=True)
class Pushed:
    """One message the daemon pushed for a session."""

    kind: PushedKind
    session: str
    event: dict[str, Any]  # the event (durable or transient); {} for a resync
    cursor: int | None = None  # durable events and snapshot resyncs
    after: int | None = None  # stream: the cursor of the newest durable event before it
    snapshot: dict[str, Any] | None = None  # a resync's snapshot, when it carries one


Listener = Callable[[Pushed], None]


class DaemonLink:
    """A connected control client plus per-session listeners (build with ``connect``)."""

    def __init__(self, client: ControlClient):
        self.client = client
        self._listeners: dict[str, list[Listener]] = {}
        self._pump = asyncio.create_task(self._run(), name="tui-event-pump")
        self.lost: Callable[[str], None] | None = None  # told once when the daemon goes away

    @classmethod
    async def connect(cls, socket_path: Path | str | None = None) -> DaemonLink:
        client = await ControlClient.connect(
            socket_path,
            capabilities=(*CLIENT_CAPABILITIES, CAP_STREAM),
        )
        return cls(client)

    async def close(self) -> None:
        """Detach everything and close; sessions keep running in the daemon."""
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        await self.client.close()

    async def call(self, command_type: str, /, **fields: Any) -> Any:
        return await self.client.call(command_type, **fields)

    # ---------------------------------------------------------------------------- listeners

    async def subscribe(
        self, session: str, listener: Listener, cursor: int | None = None
    ) -> dict[str, Any]:
        """Listen to ``session`` and (re-)attach it; returns the attach answer (the replay).

        Events pushed before the answer reach the listener too: it drops what the replay
        already holds by cursor."""
        self._listeners.setdefault(session, []).append(listener)
        try:
            answer: dict[str, Any] = await self.client.call(
                "attach", session=session, cursor=cursor
            )
        except BaseException:
            self.unsubscribe(session, listener)
            raise
        return answer

    def unsubscribe(self, session: str, listener: Listener) -> None:
        listeners = self._listeners.get(session, [])
        if listener in listeners:
            listeners.remove(listener)
        if not listeners and session in self._listeners:
            del self._listeners[session]
            if not self.client.closed:
                task = asyncio.create_task(self._detach(session), name=f"tui-detach-{session}")
                task.add_done_callback(_log_failure)

    async def _detach(self, session: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.client.call("detach", session=session)

    # ---------------------------------------------------------------------------- the pump

    async def _run(self) -> None:
        while (message := await self.client.next_event()) is not None:
            pushed = _pushed(message)
            if pushed is None:
                continue
            for listener in list(self._listeners.get(pushed.session, ())):
                try:
                    listener(pushed)
                except Exception:
                    log.exception("a listener of %s failed", pushed.session)
        if self.lost is not None:
            self.lost("the daemon closed the connection")


def _pushed(message: Any) -> Pushed | None:
    kind = getattr(message, "type", None)
    session = str(getattr(message, "session", ""))
    if kind == "event":
        return Pushed("event", session, dict(message.event), cursor=int(message.cursor))
    if kind == "stream":
        return Pushed("stream", session, dict(message.event), after=message.after)
    if kind == "resync":
        return Pushed("resync", session, {}, cursor=message.cursor, snapshot=message.snapshot)
    return None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("detach failed: %s", task.exception())
