"""The ``data:`` fields of a server-sent event stream, taken from its bytes as they arrive.

The lean model transport (openai_stream.py) reads one SSE stream per model call. The body
comes in network pieces that may hold several lines or end inside one; this splits each piece
once and keeps the unfinished line for the next, so the cost is per piece, not one async
iteration per line (docs/benchmarks.md, "Where a step's host CPU goes").

Lines end with LF (a CR before it is dropped by the strip); blank separators, ``:`` comments
and other fields (``event:``, ``id:``) are skipped. Each ``data:`` line is one payload, its
value stripped and decoded as UTF-8 (an invalid byte becomes U+FFFD). A last line without its
LF counts once the body has ended (``end``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["SseData"]

DATA_FIELD: Final = b"data:"
LINE_END: Final = b"\n"


def _values(lines: list[bytes]) -> list[str]:
    return [
        line[len(DATA_FIELD) :].strip().decode("utf-8", "replace")
        for line in lines
        if line.startswith(DATA_FIELD)
    ]


class SseData:
    """Feed the body's pieces in order; each call returns the payloads its lines completed."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, piece: bytes) -> list[str]:
        *lines, self._rest = (self._rest + piece).split(LINE_END)
        return _values(lines)

    def end(self) -> list[str]:
        """The body ended: the payload of a last line that had no LF, if any."""
        rest, self._rest = self._rest, b""
        return _values([rest])
