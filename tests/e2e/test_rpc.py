"""``prime-agent --mode rpc`` driven command by command as a third-party client of Prime
Agent's RPC mode drives it: a real process on stdio, a real daemon, the scripted model over
HTTP (issue 20, docs/rpc.md)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from orchestrator.testing import FakeModelServer
from tests.helpers import model_behind_a_daemon

TURN_TIMEOUT_S = 120.0
SCRIPT = """
repeat forever:
    when "watch it work":
        code:
            import time
            print("first line", flush=True)
            time.sleep(1)
            print("second line")
    when "second line":
        text: done watching
    when "compute":
        code: print(6 * 7)
    when "42":
        think: The cell printed 42.
        text: The answer is 42.
    when "slowly":
        slow 60
        text: too late
    else: text: noted
"""


class _Client:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._next = 0
        self._taken: set[int] = set()  # lines a read returned

    async def send(self, command: dict[str, Any] | bytes) -> None:
        raw = command if isinstance(command, bytes) else json.dumps(command).encode() + b"\n"
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw)
        await self.proc.stdin.drain()

    async def read_until(self, predicate: Any, *, advance: bool = True) -> dict[str, Any]:
        """The first line not read yet that ``predicate`` accepts, from where the last ordinary
        read stopped. ``advance=False`` (a command's response) leaves that place as it is:
        events may be written before the response to the command that caused them, and a
        later read must still find them (skipping them made the framing test wait 120 s for
        an agent_start it had passed over)."""
        assert self.proc.stdout is not None
        index = self._next
        async with asyncio.timeout(TURN_TIMEOUT_S):
            while True:
                while index < len(self.lines):
                    line = self.lines[index]
                    index += 1
                    if index - 1 not in self._taken and predicate(line):
                        self._taken.add(index - 1)
                        if advance:
                            self._next = index
                        return line
                raw = await self.proc.stdout.readline()
                assert raw, "the agent closed stdout"
                self.lines.append(json.loads(raw))

    async def call(self, command: dict[str, Any]) -> dict[str, Any]:
        await self.send(command)
        kind = command["type"]
        return await self.read_until(
            lambda x: x.get("type") == "response" and x["command"] == kind, advance=False
        )


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    with model_behind_a_daemon(monkeypatch, SCRIPT) as srv:
        yield srv


@asynccontextmanager
async def _rpc(model: FakeModelServer, cwd: Path) -> AsyncIterator[_Client]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator", "--mode", "rpc", "--model", "openai/fake",
        "--api-base", model.url,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        cwd=cwd, env=dict(os.environ),
    )  # fmt: skip
    try:
        yield _Client(proc)
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        async with asyncio.timeout(TURN_TIMEOUT_S):
            # Read what it still writes while it winds down: a full pipe would block its exit.
            _, code = await asyncio.gather(proc.stdout.read(), proc.wait())
            assert code == 0


async def test_a_session_driven_command_by_command(model: FakeModelServer, tmp_path: Path) -> None:
    async with _rpc(model, tmp_path) as rpc:
        state = await rpc.call({"type": "get_state"})
        assert state["success"] and state["data"]["isStreaming"] is False
        first_session = state["data"]["sessionId"]
        answer = await rpc.call({"id": "req-1", "type": "prompt", "message": "compute"})
        assert (answer["id"], answer["success"]) == ("req-1", True)
        end = await rpc.read_until(lambda x: x["type"] == "agent_end")
        events = [x["type"] for x in rpc.lines if x["type"] != "response"]
        # The answer streamed as it was written: its thinking block, then its text block.
        updates = [x["assistantMessageEvent"] for x in rpc.lines if x["type"] == "message_update"]
        kinds = [u["type"] for u in updates]
        ends = kinds.index("thinking_end")
        assert kinds[0] == "thinking_start" and set(kinds[1:ends]) == {"thinking_delta"}
        assert kinds[ends + 1] == "text_start" and kinds[-1] == "text_end"
        assert set(kinds[ends + 2 : -1]) == {"text_delta"}
        thought = "".join(u["delta"] for u in updates if u["type"] == "thinking_delta")
        streamed = "".join(u["delta"] for u in updates if u["type"] == "text_delta")
        assert thought == updates[ends]["content"] == "The cell printed 42."
        assert streamed == updates[-1]["content"] == "The answer is 42."
        assert updates[-1]["partial"]["content"] == [
            {"type": "thinking", "thinking": thought},
            {"type": "text", "text": streamed},
        ]
        repeated = ("message_update", "tool_execution_update")
        events = [e for i, e in enumerate(events) if e not in repeated or events[i - 1] != e]
        assert events == [
            "agent_start",
            "turn_start",
            "message_start", "message_end",  # the user's
            "message_start", "message_end",  # the assistant's cell
            "tool_execution_start",
            "tool_execution_update",  # its output as it came
            "message_start", "message_end",  # the tool result
            "tool_execution_end",
            "turn_end",
            "turn_start",
            "message_start", "message_update", "message_end",  # the answer, streamed
            "turn_end",
            "agent_end",
        ]  # fmt: skip
        assert [m["role"] for m in end["messages"]] == [
            "user",
            "assistant",
            "toolResult",
            "assistant",
        ]
        start = next(x for x in rpc.lines if x["type"] == "tool_execution_start")
        assert (start["toolName"], start["args"]) == ("ipython", {"code": "print(6 * 7)"})
        done = next(x for x in rpc.lines if x["type"] == "tool_execution_end")
        assert done["result"]["content"][0]["text"].strip() == "42" and done["isError"] is False
        text = await rpc.call({"type": "get_last_assistant_text"})
        assert text["data"] == {"text": "The answer is 42."}
        messages = (await rpc.call({"type": "get_messages"}))["data"]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "toolResult", "assistant"]
        # The stored reply kept its thinking.
        assert messages[-1]["content"][0] == {"type": "thinking", "thinking": thought}
        stats = (await rpc.call({"type": "get_session_stats"}))["data"]
        assert (stats["assistantMessages"], stats["toolCalls"], stats["toolResults"]) == (2, 1, 1)
        assert stats["tokens"]["total"] > 0
        assert (await rpc.call({"type": "set_session_name", "name": "rpc-work"}))["success"]
        assert (await rpc.call({"type": "get_state"}))["data"]["sessionName"] == "rpc-work"
        unknown = await rpc.call({"type": "frobnicate"})
        assert unknown["success"] is False and "Unknown command" in unknown["error"]
        # clone: a new session with the same messages; new_session: an empty one.
        assert (await rpc.call({"type": "clone"}))["data"] == {"cancelled": False}
        cloned = (await rpc.call({"type": "get_state"}))["data"]
        assert cloned["sessionId"] != first_session and cloned["messageCount"] == 4
        assert (await rpc.call({"type": "new_session"}))["data"] == {"cancelled": False}
        fresh = (await rpc.call({"type": "get_state"}))["data"]
        assert fresh["sessionId"] not in (first_session, cloned["sessionId"])
        assert fresh["messageCount"] == 0


async def test_framing_is_lf_only_and_a_busy_agent_needs_a_streaming_behaviour(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with _rpc(model, tmp_path) as rpc:
        # CRLF accepted; U+2028 raw inside a JSON string is part of the string, not a break.
        raw = '{"type":"prompt","message":"one\u2028two"}\r\n'.encode()
        await rpc.send(raw)
        answer = await rpc.read_until(lambda x: x.get("type") == "response", advance=False)
        assert answer["success"], answer
        user = await rpc.read_until(lambda x: x["type"] == "message_end")
        assert user["message"]["content"][0]["text"] == "one\u2028two"
        await rpc.read_until(lambda x: x["type"] == "agent_end")
        bad = await rpc.call({"type": "prompt"})
        assert bad["success"] is False
        await rpc.send(b"{not json\n")
        parse = await rpc.read_until(lambda x: x.get("type") == "response", advance=False)
        assert parse["success"] is False and "invalid JSON" in parse["error"]
        # While a run goes, a prompt must say how to queue; steer and abort work.
        assert (await rpc.call({"type": "prompt", "message": "answer slowly"}))["success"]
        await rpc.read_until(lambda x: x["type"] == "agent_start")
        busy = await rpc.call({"type": "prompt", "message": "again"})
        assert busy["success"] is False and "streamingBehavior" in busy["error"]
        queued = await rpc.call(
            {"type": "prompt", "message": "later", "streamingBehavior": "followUp"}
        )
        assert queued["success"]
        assert (await rpc.call({"type": "abort"}))["success"]
        await rpc.read_until(lambda x: x["type"] == "agent_end")


async def test_a_running_cells_output_streams_as_tool_execution_update(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with _rpc(model, tmp_path) as rpc:
        await rpc.call({"type": "prompt", "message": "watch it work"})
        await rpc.read_until(lambda x: x["type"] == "agent_end")
    kinds = [x["type"] for x in rpc.lines]
    updates = [x for x in rpc.lines if x["type"] == "tool_execution_update"]
    assert updates, kinds
    start, end = kinds.index("tool_execution_start"), kinds.index("tool_execution_end")
    assert (
        start < kinds.index("tool_execution_update")
        and kinds[::-1].index("tool_execution_update") > len(kinds) - 1 - end
    )
    # The first line was shown while the cell still ran; each update has all output so far.
    texts = [u["partialResult"]["content"][0]["text"] for u in updates]
    assert texts[0] == "first line\n"
    assert all(later.startswith(earlier) for earlier, later in pairwise(texts))
    assert texts[-1] == "first line\nsecond line\n"
