"""Following a session's events through the daemon: replay, live events, gaps, resyncs.

The daemon pushes ``event {session, cursor, event}`` to attached clients and answers ``attach``
with what was missed (docs/daemon.md). ``Follower`` turns that into one ordered stream per
session with nothing twice and nothing missing: it keeps the last cursor applied per session,
drops what it has, and when an event skips ahead (a descendant it had not replayed yet, or a
client that fell behind) it re-attaches from its cursor first. A ``resync`` with a snapshot is
applied like a replay; one without re-attaches.

``attach {family: true}`` routes the events of the session's descendants to this client too,
including children spawned later; the answer lists the descendants that exist already. A new
session (print mode) replays each of them from the start; a resumed one (``--resume``) takes only
their events from now on (``history=False``), since their old history is not this run's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event, Resync, Stream

__all__ = ["Emit", "Follower", "Gap"]

T = TypeVar("T")

Emit = Callable[[dict[str, Any]], None]
# Told when the daemon could only send a snapshot: (session, events not shown).
Gap = Callable[[str, int], None]
# A session the follower has not seen: its events are taken from this cursor on.
_FROM_THE_START: Final = 0


class Follower:
    def __init__(self, client: ControlClient, emit: Emit, *, on_gap: Gap | None = None):
        self.client = client
        self.emit = emit
        self.on_gap = on_gap
        # The last cursor applied per session; None = take every pushed event from now on.
        self.cursors: dict[str, int | None] = {}

    async def attach(
        self, session: str, cursor: int = 0, *, family: bool = False, history: bool = True
    ) -> dict[str, Any]:
        """Attach to ``session`` after ``cursor`` and emit what it replays.

        With ``family``, descendants' events come too; ``history`` says whether the existing
        descendants' earlier events are replayed (a new run) or skipped (a resumed one).
        """
        self.cursors.setdefault(session, cursor)
        fields: dict[str, Any] = {"session": session, "cursor": cursor}
        if family:
            fields["family"] = True
        result: dict[str, Any] = await self.client.call("attach", **fields)
        self._apply(session, result)
        for member in result.get("family") or []:
            if history:
                self.cursors[member] = _FROM_THE_START
                await self._replay(member)
            else:
                self.cursors.setdefault(member, None)
        return result

    async def reattach(self, client: ControlClient, session: str) -> None:
        """Follow ``session``'s family again on a new connection (the daemon restarted): from
        the cursors already applied, so nothing is emitted twice; a descendant not seen yet
        is replayed from the start."""
        self.client = client
        known = self.cursors.get(session) or _FROM_THE_START
        result: dict[str, Any] = await client.call(
            "attach", session=session, cursor=known, family=True
        )
        self._apply(session, result)
        for member in result.get("family") or []:
            if self.cursors.get(member, _FROM_THE_START) is None:
                continue  # a resumed run's old descendant: only its pushed events count
            self.cursors.setdefault(member, _FROM_THE_START)
            await self._replay(member)

    async def follow_until(self, work: Awaitable[T]) -> T:
        """Emit events as they come until ``work`` finishes; then those that came before its
        answer (the daemon sends them first, on the same connection), and return its result."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                getter = asyncio.ensure_future(self.client.next_event())
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()  # nothing was taken: next_event loses nothing when cancelled
                    await asyncio.gather(getter, return_exceptions=True)
                    break
                item = getter.result()
                if item is None:  # the connection ended; the work's own error says why
                    break
                await self.handle(item)
            result = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        while (item := self.client.next_event_nowait()) is not None:
            await self.handle(item)
        return result

    async def handle(self, item: Event | Resync | Stream) -> None:
        if isinstance(item, Stream):
            return  # transient; only a client that asked for the capability gets them
        if isinstance(item, Resync):
            if item.snapshot is not None:
                self._apply(item.session, item.snapshot)
            else:
                await self._replay(item.session)
            return
        session, cursor = item.session, item.cursor
        known = self.cursors.get(session, _FROM_THE_START)
        if known is not None:
            if cursor <= known:
                return  # already applied (a replay and a push overlap)
            if cursor > known + 1:
                await self._replay(session)  # something in between was never seen
                known = self.cursors.get(session)
                if known is not None and cursor <= known:
                    return
        self.cursors[session] = cursor
        self.emit(item.event)

    async def _replay(self, session: str) -> None:
        cursor = self.cursors.get(session) or _FROM_THE_START
        result: dict[str, Any] = await self.client.call("attach", session=session, cursor=cursor)
        self._apply(session, result)

    def _apply(self, session: str, replay: dict[str, Any]) -> None:
        """Emit the events of an attach answer (or snapshot) that are newer than our cursor."""
        known = self.cursors.get(session) or _FROM_THE_START
        events = [e for e in replay.get("events") or [] if isinstance(e, dict)]
        if replay.get("snapshot") and self.on_gap is not None:
            skipped = int(replay.get("missed", 0)) - len(events)
            if skipped > 0:
                self.on_gap(session, skipped)
        for event in events:
            seq = int(event.get("seq", 0))
            if seq > known:
                self.emit(event)
                known = seq
        self.cursors[session] = max(known, int(replay.get("cursor") or 0))
