"""A client's bounded outgoing queue: replies always fit, events overflow into a resync.

The daemon must never wait on a slow client, and a client that stops reading must not make the
daemon's memory grow. So ``put_event`` never blocks: when the queue is over its message or byte
bound, every queued event is dropped and replaced by one resync marker per affected session (the
writer turns a marker into a ``resync`` message with a fresh snapshot when the client reads
again, so no stale snapshot sits in memory). If the queue overflows ``overflow_limit`` times
without draining empty in between, the client is hopeless and ``put_event`` says to disconnect
it. Replies (responses, connection errors) are never dropped; instead the connection stops
reading commands while the queue is full (``wait_for_space``), so a client that pipelines
commands without reading answers throttles only itself.

Transient messages (``stream``: text deltas and the like, never stored) are the cheapest to
lose: ``put_transient`` queues one only while the queue is under ``STREAM_FILL_FRACTION`` of
its bounds and otherwise drops it silently (no resync, never a disconnect), and an event that
does not fit first evicts the queued transients before it counts as an overflow.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CLIENT_QUEUE_MAX_BYTES",
    "CLIENT_QUEUE_MAX_MESSAGES",
    "QUEUE_OVERFLOW_LIMIT",
    "STREAM_FILL_FRACTION",
    "Item",
    "ItemKind",
    "Outbox",
]

CLIENT_QUEUE_MAX_MESSAGES: Final = 1024
CLIENT_QUEUE_MAX_BYTES: Final = 8 * 1024 * 1024
# The second overflow before the queue drained disconnects the client.
QUEUE_OVERFLOW_LIMIT: Final = 2
# Transient messages are queued only below this fraction of the bounds: durable events keep the
# rest, so a flood of deltas never pushes a client into a resync.
STREAM_FILL_FRACTION: Final = 0.5
# What a resync marker is counted as (it becomes a message of unknown size only when sent).
_MARKER_BYTES: Final = 64


class ItemKind(enum.Enum):
    REPLY = "reply"  # a response or connection-level error: never dropped
    EVENT = "event"  # droppable: covered by a resync if dropped
    RESYNC = "resync"  # marker: the writer builds the resync message when it sends it
    STREAM = "stream"  # transient: dropped silently, first of all, when space runs short


@dataclass(frozen=True)
class Item:
    kind: ItemKind
    data: bytes = b""
    session: str = ""


class Outbox:
    def __init__(
        self,
        *,
        max_messages: int = CLIENT_QUEUE_MAX_MESSAGES,
        max_bytes: int = CLIENT_QUEUE_MAX_BYTES,
        overflow_limit: int = QUEUE_OVERFLOW_LIMIT,
    ):
        self._items: deque[Item] = deque()
        self._bytes = 0
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._overflow_limit = overflow_limit
        self._overflows = 0
        self._closed = False
        self._ready = asyncio.Event()  # set while there is an item (or the outbox is closed)
        self._space = asyncio.Event()  # set while below the bounds (or closed)
        self._space.set()
        self.dropped_events = 0
        self.dropped_transients = 0
        self.resyncs = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    def _full(self, extra: int = 0) -> bool:
        return len(self._items) >= self._max_messages or self._bytes + extra > self._max_bytes

    def _append(self, item: Item) -> None:
        self._items.append(item)
        self._bytes += len(item.data) or _MARKER_BYTES
        self._ready.set()
        if self._full():
            self._space.clear()

    def put_reply(self, data: bytes) -> None:
        """Queue a reply; replies may exceed the bound (the reader throttles instead)."""
        if not self._closed:
            self._append(Item(ItemKind.REPLY, data))

    def put_transient(self, session: str, data: bytes) -> bool:
        """Queue a transient message without blocking, unless the queue is past
        ``STREAM_FILL_FRACTION`` of its bounds: then it is dropped (and counted), nothing else
        happens. True when it was queued."""
        if self._closed:
            return False
        if (
            len(self._items) >= self._max_messages * STREAM_FILL_FRACTION
            or self._bytes + len(data) > self._max_bytes * STREAM_FILL_FRACTION
        ):
            self.dropped_transients += 1
            return False
        self._append(Item(ItemKind.STREAM, data, session))
        return True

    def put_event(self, session: str, data: bytes | None) -> bool:
        """Queue an event without blocking; ``None`` data means "send a resync instead".

        Returns False when the client overflowed ``overflow_limit`` times and must be
        disconnected.
        """
        if self._closed:
            return True
        if data is not None and self._full(len(data)):
            self._drop_transients()  # the cheapest loss first: maybe the event fits then
        if data is not None and not self._full(len(data)):
            self._append(Item(ItemKind.EVENT, data, session))
            return True
        if data is not None:
            self._overflows += 1
            if self._overflows >= self._overflow_limit:
                return False
        self._replace_events_with_markers(session)
        return True

    def _drop_transients(self) -> None:
        kept = deque(item for item in self._items if item.kind is not ItemKind.STREAM)
        self.dropped_transients += len(self._items) - len(kept)
        self._items = kept
        self._bytes = sum(len(i.data) or _MARKER_BYTES for i in kept)
        if not self._full():
            self._space.set()

    def _replace_events_with_markers(self, session: str) -> None:
        affected: dict[str, None] = {
            session: None
        }  # ordered set: keeps resyncs in first-seen order
        kept: deque[Item] = deque()
        marked: set[str] = set()
        for item in self._items:
            if item.kind is ItemKind.EVENT:
                affected[item.session] = None
                self.dropped_events += 1
            elif item.kind is ItemKind.STREAM:
                self.dropped_transients += 1  # no resync: the durable events are the truth
            else:
                if item.kind is ItemKind.RESYNC:
                    marked.add(item.session)
                kept.append(item)
        self._items = kept
        self._bytes = sum(len(i.data) or _MARKER_BYTES for i in kept)
        for name in affected:
            if name not in marked:
                self.resyncs += 1
                self._append(Item(ItemKind.RESYNC, session=name))
        if not self._full():
            self._space.set()

    async def get(self) -> Item | None:
        """The next item, or None once the outbox is closed."""
        while not self._items:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._bytes -= len(item.data) or _MARKER_BYTES
        if not self._items:
            # Drained: the client keeps up again, so earlier overflows are forgiven.
            self._overflows = 0
            self._ready.clear()
        if not self._full():
            self._space.set()
        return item

    async def wait_for_space(self) -> None:
        await self._space.wait()

    def close(self) -> None:
        """Stop accepting; ``get`` returns None once the queue is empty, at once if cleared."""
        self._closed = True
        self._ready.set()
        self._space.set()

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
