"""The Python SDK (docs/sdk.md) against a real daemon started for the test and the scripted
model over HTTP: the documented example as written, and each call of a session's handle."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Client, Session
from orchestrator.api.errors import ApiCommandError
from orchestrator.testing import FakeModelServer
from tests.helpers import stop_daemons, write_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
EXAMPLE_TIMEOUT_S = 120.0
TURN_TIMEOUT_S = 60.0

COMPUTE = """
repeat forever:
    when "6 * 7":
        code: print(6 * 7)
    when "42": text: The answer is 42.
    when "slowly":
        slow 30
        text: too late
    else: text: ok
"""


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(COMPUTE) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/gpt-4o-mini"]\napi_base = "{srv.url}"\n'
            "input_cost_per_mtok = 1.0\noutput_cost_per_mtok = 2.0\n"
        )
        yield srv
        stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def test_the_docs_example_runs(model: FakeModelServer, tmp_path: Path) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.DOTALL)
    ran = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        env=dict(os.environ),
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[:2] == ["cell: 42", "assistant: The answer is 42."]
    tokens = re.fullmatch(r"tokens: (\d+) cost: ([0-9.e-]+)", lines[2])
    assert tokens is not None and int(tokens.group(1)) > 0 and float(tokens.group(2)) > 0


async def test_a_session_is_prompted_followed_aborted_and_counted(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with await Client.connect() as client:
        session = await client.create_session(cwd=tmp_path, model="openai/gpt-4o-mini")
        assert (await client.session(session.id)).id == session.id
        assert await session.prompt("what is 6 * 7?") == "delivered"
        async with asyncio.timeout(TURN_TIMEOUT_S):
            outcome = await session.wait()
        assert (outcome.reason, outcome.final_text) == ("completed", "The answer is 42.")
        usage = await session.usage()
        assert usage["own"]["calls"] == 2 and usage["total"]["cost_usd"] > 0
        # A slow turn, aborted while the model call is in flight.
        await session.prompt("answer slowly")
        async with asyncio.timeout(TURN_TIMEOUT_S):
            while (await session.info())["status"] != "running":
                await asyncio.sleep(0.05)
            assert await session.abort() is True
            outcome = await session.wait()
        assert outcome.reason == "aborted"
        with pytest.raises(ApiCommandError) as missing:
            await client.session("s-nosuchsession")
        assert missing.value.code == "not_found"


async def test_two_sessions_stream_at_once_each_its_own_events_in_order(
    model: FakeModelServer, tmp_path: Path
) -> None:
    async with await Client.connect() as client:
        chosen = {"cwd": tmp_path, "model": "openai/gpt-4o-mini"}
        first = await client.create_session("what is 6 * 7?", **chosen)  # type: ignore[arg-type]
        second = await client.create_session("say ok", **chosen)  # type: ignore[arg-type]
        async with asyncio.timeout(TURN_TIMEOUT_S):
            streams = await asyncio.gather(_collect(first), _collect(second))
        for session, events in zip((first, second), streams, strict=True):
            seqs = [e["seq"] for e in events]
            assert seqs == list(range(1, len(seqs) + 1))  # each once, in order, from the start
            assert events[0]["type"] == "user_message"
            assert events[-1]["type"] == "turn_end"
            stored = (await session.info())["id"]
            assert stored == session.id
        assert "tool_result" in [e["type"] for e in streams[0]]
        assert "tool_result" not in [e["type"] for e in streams[1]]


async def _collect(session: Session) -> list[dict[str, object]]:
    return [event async for event in session.events()]
