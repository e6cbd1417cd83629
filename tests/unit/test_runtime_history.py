"""The kernel's ``history`` and ``compact`` objects without NATS: argument checks before any
request, the exact wire args, result decoding, and the host's rendering of events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.runtime import LAZY_HELPERS, RUNTIME_NAMES
from orchestrator.runtime.errors import InternalHostError, InvalidArgument
from orchestrator.runtime.history import Compact, History, HistoryEntry
from orchestrator.store.history_entries import HISTORY_TEXT_MAX_CHARS, entry_of
from orchestrator.store.queries import EventRecord
from tests.unit.test_runtime_api import RecordingClient

ENTRY = {"seq": 7, "id": "e7", "type": "user_message", "role": "user", "text": "hi", "at": "t"}


async def test_history_calls_send_exact_args_and_decode_entries() -> None:
    client = RecordingClient(
        {
            "history.search": {"entries": [ENTRY], "total": 3},
            "history.get": {"entries": [ENTRY], "more": True},
            "history.tail": {"entries": [ENTRY]},
        }
    )
    history = History(client)
    found = await history.search("needle", limit=5)
    assert found == [HistoryEntry(7, "e7", "user_message", "user", "hi", "t")]
    assert found.total == 3 and str(found[0]) == "#7 [user] hi"
    page = await history.get(1, 50)
    assert page.more is True
    await history.tail()
    assert [(t, a) for t, a, _ in client.requests] == [
        ("history.search", {"text": "needle", "limit": 5}),
        ("history.get", {"from_seq": 1, "to_seq": 50}),
        ("history.tail", {"n": 20}),
    ]


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda h: h.search(""), InvalidArgument),
        (lambda h: h.search("x", limit=0), InvalidArgument),
        (lambda h: h.search("x", bogus=1), TypeError),
        (lambda h: h.get(5, 4), InvalidArgument),
        (lambda h: h.get(0, 4), InvalidArgument),
        (lambda h: h.tail("3"), TypeError),
    ],
)
def test_history_arguments_are_checked_before_any_request(call: Any, exc: type) -> None:
    client = RecordingClient()
    with pytest.raises(exc):
        call(History(client))
    assert client.requests == []


async def test_a_reply_without_seq_is_an_internal_error() -> None:
    bad = {"entries": [{k: v for k, v in ENTRY.items() if k != "seq"}]}
    with pytest.raises(InternalHostError):
        await History(RecordingClient({"history.tail": bad})).tail(1)


async def test_compact_run_and_status() -> None:
    client = RecordingClient(
        {
            "compact.run": {"scheduled": True, "note": "soon"},
            "compact.status": {
                "tokens": 1200,
                "context_window": 8000,
                "threshold": 4000,
                "percent": 15.0,
                "scheduled": True,
                "last": None,
            },
        }
    )
    compact = Compact(client)
    asked = await compact.run(" keep the plan ")
    assert asked.scheduled and asked.note == "soon"
    status = await compact.status()
    assert (status.tokens, status.context_window, status.threshold) == (1200, 8000, 4000)
    assert client.requests[0][1] == {"instructions": "keep the plan"}
    with pytest.raises(TypeError):
        compact.run(what="x")
    with pytest.raises(InvalidArgument):
        compact.run("y" * 5000)


def test_the_names_are_runtime_names_pushed_lazily() -> None:
    for name in ("history", "compact"):
        assert name in RUNTIME_NAMES and name in LAZY_HELPERS


def _event(type_: str, payload: dict[str, Any]) -> EventRecord:
    return EventRecord("s-x", 3, "e3", None, type_, datetime(2025, 1, 1, tzinfo=UTC), payload)  # type: ignore[arg-type]


def test_host_rendering_of_events() -> None:
    call = {"id": "c", "name": "ipython", "arguments": '{"code": "print(1)"}'}
    asst = entry_of(_event("assistant_message", {"text": "ok", "tool_calls": [call]}))
    assert asst["role"] == "assistant" and asst["text"] == "ok\n[ipython]\nprint(1)"
    agent = entry_of(
        _event("user_message", {"text": "hi", "source": "agent", "sender_label": "parent"})
    )
    assert agent["text"] == "[message from parent]\nhi"
    summary = entry_of(_event("compaction", {"summary": "## Goal"}))
    assert summary["role"] == "summary" and summary["text"] == "## Goal"
    long_text = "a" * HISTORY_TEXT_MAX_CHARS + "NEEDLE" + "b" * HISTORY_TEXT_MAX_CHARS
    hit = entry_of(_event("tool_result", {"text": long_text}), "needle")
    assert hit["truncated"] is True and "NEEDLE" in hit["text"]
    assert len(hit["text"]) <= HISTORY_TEXT_MAX_CHARS + 2


def test_variable_sizes_are_measured_not_pickled() -> None:
    from orchestrator.runtime.namespace import MEASURE_MAX_OBJECTS, measure

    mib = 2**20
    size, exact = measure(bytearray(20 * mib), 16 * mib)
    assert size >= 20 * mib and exact
    nested = [[b"x" * 1000] * 10 for _ in range(3000)]  # shared items are counted once
    assert measure(nested, 10**9)[1] is True
    over, exact = measure(["y" * 1000 + str(i) for i in range(50_000)], mib)
    assert over > mib and exact is False  # stopped once past the cap: a lower bound
    many = list(range(MEASURE_MAX_OBJECTS * 2))
    assert measure(many, 10**12)[1] is False  # the walk is bounded too

    class Holder:
        def __init__(self) -> None:
            self.payload = bytearray(mib)

    assert measure(Holder(), 10**9)[0] >= mib
