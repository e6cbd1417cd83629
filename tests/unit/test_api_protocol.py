"""Control protocol models, framing, the outbox and the journal, without a socket."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from orchestrator.api import framing, protocol, wire
from orchestrator.api.framing import LINE_TOO_LONG, FrameError, LineReader, decode_line
from orchestrator.api.journal import CommandJournal
from orchestrator.api.messages import (
    ErrorInfo,
    ErrorMessage,
    Event,
    Response,
    Resync,
    Stream,
    Welcome,
    decode_server_message,
)
from orchestrator.api.outbox import STREAM_FILL_FRACTION, Item, ItemKind, Outbox
from orchestrator.api.protocol import (
    COMMAND_TYPES,
    MUTATING_COMMAND_TYPES,
    CreateSession,
    Hello,
    Ping,
    Prompt,
    client_message_adapter,
    command_adapter,
    command_fingerprint,
    server_message_adapter,
)
from orchestrator.api.wire import PROTOCOL_VERSION

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
VERSION_LINE = re.compile(r"^Protocol version: (\d+)$", re.MULTILINE)
SMALL_CAP = 64

EXAMPLE_COMMANDS: list[dict[str, Any]] = [
    {"type": "ping", "command_id": "1"},
    {"type": "list_sessions", "command_id": "2"},
    {"type": "get_session", "command_id": "3", "session": "s-x"},
    {"type": "create_session", "command_id": "4", "cwd": "/w", "task": "t", "model": "m"},
    {"type": "prompt", "command_id": "5", "session": "s-x", "text": "hi", "mode": "steer"},
    {"type": "abort", "command_id": "6", "session": "s-x"},
    {"type": "attach", "command_id": "7", "session": "s-x", "cursor": 12},
    {"type": "detach", "command_id": "8", "session": "s-x"},
    {"type": "send_message", "command_id": "9", "session": "s-x", "text": "yo"},
    {"type": "get_usage", "command_id": "10", "tree": True},
    {"type": "wait_quiet", "command_id": "12", "session": "s-x", "timeout_s": 5, "release": True},
    {"type": "set_session_name", "command_id": "12d", "session": "s-x", "name": "work"},
    {
        "type": "run_check",
        "command_id": "12c",
        "session": "s-x",
        "command": "bash /tests/test.sh",
        "timeout_s": 60,
    },
    {"type": "export_session", "command_id": "13", "session": "s-x", "path": "/tmp/x.jsonl"},
    {"type": "tree", "command_id": "14", "session": "s-x", "after_seq": 10, "limit": 50},
    {"type": "branch", "command_id": "15", "session": "s-x", "event": "4", "summary": "tried A"},
    {"type": "fork", "command_id": "16", "session": "s-x", "event": "4"},
    {"type": "clone", "command_id": "17", "session": "s-x"},
    {"type": "import_session", "command_id": "18", "path": "/tmp/x.jsonl", "model": "openai/m"},
    {"type": "compact", "command_id": "19", "session": "s-x", "instructions": "keep paths"},
    {"type": "set_model", "command_id": "20", "session": "s-x", "model": "openai/m"},
    {"type": "refine", "command_id": "21", "session": "s-x", "instructions": "less retrying"},
    {"type": "refine_rollback", "command_id": "22", "id": "r-1"},
    {"type": "harness_log", "command_id": "23", "session": "s-x", "limit": 5},
    {"type": "harness_list", "command_id": "24", "kind": "memory"},
    {
        "type": "harness_edit",
        "command_id": "25",
        "action": "create",
        "kind": "memory",
        "scope": "global",
        "title": "t",
        "content": "c",
    },
    {"type": "harness_accept", "command_id": "34", "id": "p-1", "reason": "looks right"},
    {"type": "harness_reject", "command_id": "35", "id": "p-2"},
    {"type": "schedule_add", "command_id": "26", "session": "s-x", "spec": "in 1m", "prompt": "p"},
    {"type": "schedule_list", "command_id": "27", "include_inactive": True},
    {"type": "schedule_cancel", "command_id": "28", "id": "sch-1"},
    {"type": "heartbeat", "command_id": "29", "session": "s-x", "text": "every 10m look"},
    {"type": "goal", "command_id": "30", "session": "s-x", "action": "set", "objective": "o"},
    {"type": "sandbox_info", "command_id": "31", "session": "s-x"},
    {"type": "sandbox_control", "command_id": "32", "session": "s-x", "action": "restart"},
    {
        "type": "autonomous",
        "command_id": "33",
        "session": "s-x",
        "action": "on",
        "gates": ["pytest -q"],
        "max_turns": 3,
        "max_tokens": 1000,
        "timeout_ms": 60_000,
    },
    {
        "type": "record_eval_result",
        "command_id": "13",
        "session": "s-x",
        "config": {"name": "fix-tests", "fingerprint": "ab"},
        "config_path": "/w/fix-tests.yaml",
        "stop_reason": "gate_passed",
        "exit_code": 0,
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:01:00+00:00",
    },
    {
        "type": "sweep_open",
        "command_id": "20",
        "name": "n",
        "spec": {},
        "digest": "d",
        "runner_pid": 7,
    },
    {
        "type": "sweep_add_cells",
        "command_id": "21",
        "name": "n",
        "cells": [
            {
                "fingerprint": "f",
                "suite": "s-niah",
                "task_id": "s-niah/1/0",
                "model": "openai/m",
                "variant": "rlm",
                "seed": 1,
                "context_tokens": 1000,
            }
        ],
    },
    {
        "type": "sweep_trial_start",
        "command_id": "22",
        "name": "n",
        "fingerprint": "f",
        "session": "s-x",
    },
    {
        "type": "sweep_trial_finish",
        "command_id": "23",
        "trial": "t-1",
        "state": "scored",
        "score": 1.0,
        "answer": "42",
        "stop_reason": "completed",
        "truncated": False,
        "wall_s": 1.5,
    },
    {"type": "sweep_status", "command_id": "24", "name": "n", "offset": 0, "limit": 10},
    {"type": "sweep_cancel", "command_id": "25", "name": "n"},
    {"type": "sweep_list", "command_id": "27", "limit": 5},
    {"type": "sweep_close", "command_id": "26", "name": "n", "state": "done"},
    {"type": "shutdown", "command_id": "11", "force": True},
]


def test_docs_page_states_the_protocol_version() -> None:
    found = VERSION_LINE.findall(DOCS_PAGE.read_text())
    assert found == [str(PROTOCOL_VERSION)], "docs/protocol.md must say 'Protocol version: N' once"


def test_docs_page_lists_every_command_and_error_code() -> None:
    text = DOCS_PAGE.read_text()
    for name in sorted(COMMAND_TYPES | wire.ERROR_CODES):
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("body", EXAMPLE_COMMANDS, ids=lambda b: str(b["type"]))
def test_every_command_round_trips(body: dict[str, Any]) -> None:
    command = client_message_adapter.validate_python(body)
    again = command_adapter.validate_json(command.model_dump_json())
    assert again == command
    assert command.type in COMMAND_TYPES


def test_example_commands_cover_the_command_set() -> None:
    assert {b["type"] for b in EXAMPLE_COMMANDS} == COMMAND_TYPES


def test_mutating_set() -> None:
    expected = {"create_session", "prompt", "abort", "send_message", "shutdown"}
    expected |= {"branch", "fork", "clone", "import_session", "compact"}
    expected |= {"set_model", "refine", "refine_rollback", "harness_edit"}
    expected |= {"harness_accept", "harness_reject"}
    expected |= {"schedule_add", "schedule_cancel", "heartbeat", "goal"}
    expected |= {"sandbox_control", "autonomous", "record_eval_result", "run_check"}
    expected |= {"set_session_name"}
    expected |= {"sweep_trial_start", "sweep_trial_finish", "sweep_cancel", "sweep_close"}
    assert expected == MUTATING_COMMAND_TYPES


def test_unknown_type_and_extra_fields_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        command_adapter.validate_python({"type": "frobnicate", "command_id": "1"})
    assert info.value.errors()[0]["type"] == "union_tag_invalid"
    with pytest.raises(ValidationError):
        command_adapter.validate_python({"type": "ping", "command_id": "1", "x": 1})
    with pytest.raises(ValidationError):
        command_adapter.validate_python({"type": "ping"})  # no command id
    with pytest.raises(ValidationError):
        bad_mode = {"type": "prompt", "command_id": "1", "session": "s", "text": "t", "mode": "x"}
        command_adapter.validate_python(bad_mode)


def test_hello_limits() -> None:
    Hello(protocol_version=1, client_id="c", capabilities=["events"])
    with pytest.raises(ValidationError):
        Hello(protocol_version=1, client_id="")
    with pytest.raises(ValidationError):
        Hello(protocol_version=1, client_id="c" * (protocol.MAX_ID_CHARS + 1))
    with pytest.raises(ValidationError):
        Hello(protocol_version=1, client_id="c", capabilities=["x"] * 65)


def test_server_messages_round_trip_and_ignore_additions() -> None:
    messages = [
        Welcome(protocol_version=1, server_version="0.1", capabilities=["events"]),
        Response(command_id="1", ok=True, result={"a": [1, 2]}),
        Response(command_id="2", ok=False, error=ErrorInfo(code="not_found", message="no")),
        Event(session="s", cursor=3, event={"kind": "x"}),
        Resync(session="s", cursor=3, snapshot={"k": 1}),
        Stream(session="s", event={"type": "text_delta", "session_id": "s", "delta": "he"}),
        ErrorMessage(code="parse_error", message="bad"),
    ]
    for message in messages:
        data = json.loads(framing.encode_message(message))
        # The daemon's view (pydantic) and the client's (messages.py, no pydantic) agree.
        assert server_message_adapter.validate_python(data) == message
        assert decode_server_message(data) == message
        # A newer daemon's extra field does not break this client.
        assert server_message_adapter.validate_python({**data, "future": 1}) == message
        assert decode_server_message({**data, "future": 1}) == message


@pytest.mark.parametrize(
    "data",
    [
        {"type": "event", "session": "s", "cursor": "3", "event": {}},  # a string for an int
        {"type": "event", "session": "s", "cursor": True, "event": {}},  # a bool is no int
        {"type": "event", "session": "s", "event": {}},  # no cursor
        {"type": "resync", "session": "s", "snapshot": []},  # not an object
        {"type": "welcome", "protocol_version": 1, "server_version": "v", "capabilities": [1]},
        {"type": "response", "command_id": "1", "ok": True, "error": {"code": "x"}},
        {"type": "response", "command_id": "1", "ok": True, "result": 1, "error": None}
        | {"ok": "yes"},
        {"type": "telegram", "session": "s"},
        {"session": "s"},
    ],
)
def test_the_client_drops_what_the_daemon_would_not_send(data: dict[str, Any]) -> None:
    """The client's decoder takes only the JSON kinds the daemon writes: a string or a bool
    where a number goes is a broken line, even where pydantic's lax mode would convert it."""
    with pytest.raises(ValueError):
        decode_server_message(data)


def test_response_ok_exactly_when_no_error() -> None:
    with pytest.raises(ValueError):
        Response(command_id="1", ok=True, error=ErrorInfo(code="internal", message="x"))
    with pytest.raises(ValueError):
        Response(command_id="1", ok=False)
    with pytest.raises(ValidationError):
        server_message_adapter.validate_python({"type": "response", "command_id": "1", "ok": False})


@pytest.mark.parametrize("cls", [*protocol._COMMAND_CLASSES, protocol.Hello])
def test_none_is_the_default_of_every_optional_command_field(cls: type[BaseModel]) -> None:
    """The client leaves out the fields a caller passes as None (``ControlClient.command``):
    that is sending the default only because None is every optional field's default."""
    for name, info in cls.model_fields.items():
        if type(None) in typing.get_args(info.annotation):
            assert info.default is None, f"{cls.__name__}.{name}"


def test_fingerprint_ignores_only_the_id() -> None:
    a = CreateSession(command_id="1", cwd="/a")
    assert command_fingerprint(a) == command_fingerprint(CreateSession(command_id="2", cwd="/a"))
    assert command_fingerprint(a) != command_fingerprint(CreateSession(command_id="1", cwd="/b"))
    assert command_fingerprint(Prompt(command_id="1", session="s", text="t")) != (
        command_fingerprint(Ping(command_id="1"))
    )


@pytest.mark.parametrize(
    "module",
    [
        "protocol",
        "framing",
        "server",
        "client",
        "errors",
        "outbox",
        "journal",
        "messages",
        "wire",
        "socket_file",
        "__init__",
    ],
)
def test_public_surface(module: str) -> None:
    name = "orchestrator.api" if module == "__init__" else f"orchestrator.api.{module}"
    mod = importlib.import_module(name)
    assert mod.__all__ and all(hasattr(mod, n) for n in mod.__all__)


# ------------------------------------------------------------------------------ framing


def _read_all(data: bytes, chunks: list[int], cap: int) -> list[bytes | framing.Overlong]:
    async def run() -> list[bytes | framing.Overlong]:
        reader = asyncio.StreamReader()
        pos = 0
        for size in chunks:
            reader.feed_data(data[pos : pos + size])
            pos += size
        reader.feed_data(data[pos:])
        reader.feed_eof()
        lines = LineReader(reader, max_line_bytes=cap)
        out: list[bytes | framing.Overlong] = []
        while (line := await lines.read_line()) is not None:
            out.append(line)
            assert lines.statistics()["buffered_bytes"] <= cap + framing.READ_CHUNK_BYTES
        return out

    return asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(
        st.binary(max_size=3 * SMALL_CAP).map(lambda b: b.replace(b"\n", b"")), max_size=8
    ),
    tail=st.binary(max_size=SMALL_CAP).map(lambda b: b.replace(b"\n", b"")),
    chunks=st.lists(st.integers(min_value=0, max_value=2 * SMALL_CAP), max_size=10),
)
def test_line_reader_matches_a_model(lines: list[bytes], tail: bytes, chunks: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines) + tail
    expected: list[bytes | framing.Overlong] = []
    for line in lines:
        if len(line) > SMALL_CAP:
            expected.append(LINE_TOO_LONG)
        else:
            expected.append(line[:-1] if line.endswith(b"\r") else line)
    # An unterminated tail (a peer that died mid-line) is never delivered.
    assert _read_all(data, chunks, SMALL_CAP) == expected


def test_line_reader_discards_a_long_line_in_pieces() -> None:
    data = b"a" * 10_000 + b"\nok\r\n"
    assert _read_all(data, [7] * 2000, SMALL_CAP) == [LINE_TOO_LONG, b"ok"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_decode_line_never_raises_anything_else(data: bytes) -> None:
    try:
        value = decode_line(data)
    except FrameError as exc:
        assert exc.code == wire.E_PARSE_ERROR
    else:
        assert isinstance(value, dict)


def test_decode_line_rejects_non_json_constants_and_deep_nesting() -> None:
    for bad in (b'{"a": NaN}', b'{"a": Infinity}', b"[" * 100_000, b"\xff", b"1"):
        with pytest.raises(FrameError):
            decode_line(bad)


def test_encode_refuses_oversize() -> None:
    with pytest.raises(FrameError) as info:
        framing.encode_message(
            Response(command_id="1", ok=True, result="x" * 100), max_line_bytes=50
        )
    assert info.value.code == wire.E_RESULT_TOO_LARGE


# ------------------------------------------------------------------------------ outbox


def test_outbox_overflow_becomes_resync_then_disconnect() -> None:
    async def run() -> None:
        box = Outbox(max_messages=4, max_bytes=1_000, overflow_limit=2)
        box.put_reply(b"r1")
        for i in range(3):
            assert box.put_event("a", b"e%d" % i)
        assert box.put_event("b", b"x")  # 5th item: overflow 1 → events replaced by markers
        kinds = [(i.kind, i.session) for i in box._items]
        assert kinds == [(ItemKind.REPLY, ""), (ItemKind.RESYNC, "b"), (ItemKind.RESYNC, "a")]
        assert box.dropped_events == 3 and box.resyncs == 2
        assert box.put_event("a", b"y")
        assert not box.put_event("a", b"z")  # overflow 2 before draining: disconnect
        # Draining empty forgives earlier overflows.
        box2 = Outbox(max_messages=2, max_bytes=1_000, overflow_limit=2)
        for _ in range(3):
            for j in range(3):
                assert box2.put_event("s", b"%d" % j)
            while len(box2):
                assert isinstance(await box2.get(), Item)
        box2.close()
        assert await box2.get() is None

    asyncio.run(run())


def test_stream_capability_is_opt_in() -> None:
    assert wire.CAP_STREAM in wire.SERVER_CAPABILITIES
    assert wire.CAP_STREAM not in wire.CLIENT_CAPABILITIES
    assert {"text_delta", "thinking_delta", "tool_start", "compaction_start"} == (
        wire.STREAM_EVENT_TYPES
    )


@pytest.mark.parametrize(
    "body",
    [
        {"type": "sandbox_control", "command_id": "1", "session": "s", "action": "pause"},
        {"type": "sandbox_control", "command_id": "1", "session": "s"},
        {"type": "autonomous", "command_id": "1", "session": "s", "action": "maybe"},
        {"type": "autonomous", "command_id": "1", "session": "s", "max_turns": 0},
        {"type": "autonomous", "command_id": "1", "session": "s", "gates": [""]},
        {"type": "sandbox_info", "command_id": "1", "session": "s", "wake": True},
    ],
)
def test_new_commands_refuse_bad_fields(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        command_adapter.validate_python(body)


def test_outbox_transients_are_dropped_silently_and_first() -> None:
    async def run() -> None:
        limit = 8
        box = Outbox(max_messages=limit, max_bytes=1_000, overflow_limit=1)
        admitted = int(limit * STREAM_FILL_FRACTION)
        queued = [box.put_transient("s", b"d%d" % i) for i in range(limit)]
        # Only the first part of the queue takes transients; the rest is kept for events.
        assert queued == [True] * admitted + [False] * (limit - admitted)
        assert box.dropped_transients == limit - admitted and box.resyncs == 0
        for i in range(limit - admitted):
            assert box.put_event("s", b"e%d" % i)
        # Full: the next event evicts the transients instead of overflowing (with an
        # overflow limit of 1, an overflow would mean a disconnect).
        assert box.put_event("s", b"last")
        assert [i.kind for i in box._items] == [ItemKind.EVENT] * (limit - admitted + 1)
        assert box.dropped_transients == limit and box.resyncs == 0 and box.dropped_events == 0
        # A full queue of events: a transient is dropped, nothing else happens.
        while box.put_event("s", b"more") and len(box) < limit:
            pass
        assert not box.put_transient("s", b"d")
        assert box.resyncs == 0 and all(i.kind is ItemKind.EVENT for i in box._items)
        # A resync drops transients without marking them.
        box2 = Outbox(max_messages=limit, max_bytes=1_000, overflow_limit=2)
        assert box2.put_transient("t", b"d")
        assert box2.put_event("s", None)
        assert [(i.kind, i.session) for i in box2._items] == [(ItemKind.RESYNC, "s")]
        got = await box2.get()
        assert got is not None and got.kind is ItemKind.RESYNC

    asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 300)), max_size=200))
def test_outbox_events_stay_bounded(ops: list[tuple[str, int]]) -> None:
    box = Outbox(max_messages=8, max_bytes=1_000, overflow_limit=1_000)
    for session, size in ops:
        box.put_event(session, b"x" * size)
        events = [i for i in box._items if i.kind is ItemKind.EVENT]
        assert len(events) <= 8 and sum(len(i.data) for i in events) <= 1_000
        assert len(box) <= 8 + 3  # plus at most one marker per session


# ------------------------------------------------------------------------------ journal


def test_journal_ttl_and_size() -> None:
    now = [0.0]

    async def run() -> None:
        journal = CommandJournal(max_entries=3, ttl_s=10.0, clock=lambda: now[0])
        for i in range(5):
            journal.reserve(("c", str(i)), "fp")
        assert len(journal) == 3 and journal.get(("c", "0")) is None
        assert journal.get(("c", "4")) is not None
        now[0] = 11.0
        assert journal.get(("c", "4")) is None and len(journal) == 0

    asyncio.run(run())


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../b"])
def test_a_repl_context_file_stays_inside_the_workspace(path: str) -> None:
    body = {"type": "create_session", "command_id": "c", "cwd": "/w"}
    with pytest.raises(ValidationError, match="inside the workspace"):
        command_adapter.validate_python({**body, "settings": {"repl_context_file": path}})
    ok = command_adapter.validate_python({**body, "settings": {"repl_context_file": "d/c.txt"}})
    assert isinstance(ok, CreateSession) and ok.settings is not None
