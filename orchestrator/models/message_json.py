"""Chat messages that carry their own JSON, so a request body costs O(new messages) to encode.

Every model call sends the whole context, and encoding it anew at every step is work that grows
with the history (issue 18 allows none per step): ~0.5 ms of the event loop's CPU per step at
200 KB of context, several times that near a large window (docs/benchmarks.md, "Where a step's
host CPU goes"). The context (agent/context.py) makes each message an ``EncodedMessage`` when
it adds it, so it is encoded once; the lean transport (openai_stream.py) joins the stored
pieces with ``messages_json`` and encodes only plain dicts (the system prompt, a one-off
request such as a compaction's) at each call.

An ``EncodedMessage`` refuses to be changed (its JSON would go stale); the context never edits
a message it added. Code that wants to edit one (litellm's transport might, so it gets copies)
edits a ``dict(message)``. Copies and pickles of an ``EncodedMessage`` are encoded afresh.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NoReturn

__all__ = ["EncodedMessage", "messages_json"]

JSON_ITEM_SEPARATOR = ", "  # json.dumps' default, so the body reads as it always did


class EncodedMessage(dict[str, Any]):
    """A message dict and, in ``json``, its JSON as ``json.dumps`` writes it."""

    __slots__ = ("json",)

    def __init__(self, message: dict[str, Any]) -> None:
        super().__init__(message)
        self.json = json.dumps(message)

    def __reduce__(self) -> tuple[type[EncodedMessage], tuple[dict[str, Any]]]:
        return EncodedMessage, (dict(self),)

    def _refuse(self) -> NoReturn:
        raise TypeError("an EncodedMessage is not changed after it is made: change a dict() of it")

    def __setitem__(self, key: str, value: Any) -> NoReturn:
        self._refuse()

    def __delitem__(self, key: str) -> NoReturn:
        self._refuse()

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse()

    def setdefault(self, *args: Any) -> NoReturn:
        self._refuse()

    def pop(self, *args: Any) -> NoReturn:
        self._refuse()

    def popitem(self) -> NoReturn:
        self._refuse()

    def clear(self) -> NoReturn:
        self._refuse()


def messages_json(messages: Iterable[dict[str, Any]], before: str = "", after: str = "") -> str:
    """The JSON array of ``messages`` (an ``EncodedMessage``'s stored JSON, others encoded now),
    between ``before`` and ``after``: one join, so a large body is copied once here."""
    pieces = [before, "["]
    for m in messages:
        pieces += (m.json if isinstance(m, EncodedMessage) else json.dumps(m), JSON_ITEM_SEPARATOR)
    if pieces[-1] == JSON_ITEM_SEPARATOR:
        pieces.pop()
    pieces += ("]", after)
    return "".join(pieces)
