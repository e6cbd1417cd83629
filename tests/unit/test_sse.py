"""orchestrator/models/sse.py: the ``data:`` payloads of an SSE body, however it is cut."""

from __future__ import annotations

from typing import Final

import pytest

from orchestrator.models.sse import SseData

BODY: Final = (
    b": keep-alive\n"
    b"event: message\n"
    b'data: {"a": 1}\r\n'
    b"\n"
    b"data:  spaced  \n"
    b"id: 7\n"
    b"data: [DONE]\n\n"
    b"data: tail"
)
PAYLOADS: Final = ['{"a": 1}', "spaced", "[DONE]", "tail"]


def _all(pieces: list[bytes]) -> list[str]:
    sse = SseData()
    out = [data for piece in pieces for data in sse.feed(piece)]
    return out + sse.end()


@pytest.mark.parametrize("size", [1, 2, 5, 17, len(BODY)])
def test_payloads_are_the_same_however_the_body_is_cut(size: int) -> None:
    pieces = [BODY[i : i + size] for i in range(0, len(BODY), size)]
    assert _all(pieces) == PAYLOADS


def test_a_line_counts_once_its_end_arrived() -> None:
    sse = SseData()
    assert sse.feed(b"data: one\ndata: tw") == ["one"]
    assert sse.feed(b"o") == []
    assert sse.feed(b"\n") == ["two"]
    assert sse.end() == []


def test_an_invalid_byte_is_replaced_not_fatal() -> None:
    assert _all([b"data: caf\xe9\n"]) == ["caf\ufffd"]
