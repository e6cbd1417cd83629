"""Every slash command against a real daemon, through a real ``ControlClient``: what each
changed in the daemon, and the one line it said (tui/slash.py, docs/tui.md)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api import ControlClient
from orchestrator.testing import FakeModelServer
from tests.slash_host import RecordingHost
from tui.slash import run_slash

# The first turn runs a cell and reports a large context (so /compact has something to
# summarise); every later call (compaction's summary, a goal's turns, the refiner's plan)
# gets a short answer.
SCRIPT = """
text: Let me compute.
code: print(6 * 7)
usage in=120 out=12
---
text: The answer is 42.
usage in=5000 out=10
---
repeat forever:
    text: Done.
    usage in=100 out=10
"""
TASK = "Compute six times seven"
# Appended to the fixture's config: compaction keeps almost nothing verbatim (so /compact has
# something to summarise), and a second model to switch to.
EXTRA_CONFIG = """
[compaction]
keep_recent_tokens = 1

[models."openai/other"]
api_base = "{url}"
"""


@pytest.fixture
def model_script() -> str:
    return SCRIPT


@pytest.fixture
def fake_model(fake_model: FakeModelServer) -> FakeModelServer:
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
    config.write_text(config.read_text() + EXTRA_CONFIG.format(url=fake_model.url))
    return fake_model


class Host(RecordingHost):
    """The chat's side of a slash command: calls go to the daemon; what it opens and says is
    recorded."""

    def __init__(self, client: ControlClient, session_id: str | None):
        super().__init__(session_id)
        self.client = client

    async def call(self, command_type: str, /, **fields: Any) -> Any:
        return await self.client.call(command_type, **fields)

    async def run(self, text: str, *, error: bool = False) -> str:
        """Run one slash command; it must say exactly one line (an error when ``error``)."""
        self.lines.clear()
        await run_slash(text, self)
        assert len(self.lines) == 1, self.lines
        line, was_error = self.lines[0]
        assert was_error is error, line
        return line


@pytest.fixture
async def client(daemon: Path) -> AsyncIterator[ControlClient]:
    async with await ControlClient.connect(daemon) as connected:
        yield connected


@pytest.fixture
async def host(client: ControlClient, project: Path) -> Host:
    """A chat on a session whose first turn has finished."""
    made = await client.call("create_session", cwd=str(project), task=TASK, backend="local")
    await client.call("wait_quiet", session=made["session"])
    return Host(client, made["session"])


async def session_row(client: ControlClient, session_id: str) -> dict[str, Any]:
    answer = await client.call("get_session", session=session_id)
    row: dict[str, Any] = answer["session"]
    return row


async def test_compact(host: Host, client: ControlClient) -> None:
    line = await host.run("/compact keep the numbers")
    assert line.startswith("compacted: ") and line.endswith(" tokens"), line
    events = (await client.call("get_session", session=host.session_id, recent=50))["events"]
    assert "compaction" in [e["type"] for e in events]


async def test_model(host: Host, client: ControlClient) -> None:
    assert host.session_id is not None
    line = await host.run("/model openai/other")
    assert line == "model: openai/fake → openai/other from the next turn"
    assert (await session_row(client, host.session_id))["model"] == "openai/other"
    # A model this daemon cannot use: the daemon's reason, one line; nothing changed.
    line = await host.run("/model openai/gpt-nokey", error=True)
    assert line.startswith("/model: ") and "OPENAI_API_KEY" in line
    assert (await session_row(client, host.session_id))["model"] == "openai/other"


async def test_goal(host: Host, client: ControlClient) -> None:
    assert host.session_id is not None
    assert await host.run("/goal") == "no goal"
    line = await host.run("/goal Ship it --budget 500")
    assert line.startswith("goal active: Ship it (") and line.endswith("/500 tokens)"), line
    await client.call("wait_quiet", session=host.session_id)  # its turns ran out the budget
    line = await host.run("/goal status")
    assert "Ship it" in line and "/500 tokens" in line, line
    line = await host.run("/goal clear")
    assert line.startswith("goal ") and "Ship it" in line
    line = await host.run("/goal resume", error=True)
    assert line.startswith("/goal: ")


async def test_heartbeat(host: Host) -> None:
    assert (await host.run("/heartbeat status")).startswith("no heartbeat")
    line = await host.run("/heartbeat every 10m check the build")
    assert line.startswith("heartbeat set") and "check the build" in line, line
    line = await host.run("/heartbeat status")
    assert "10m" in line and "check the build" in line, line
    assert "paused" in await host.run("/heartbeat pause")
    assert (await host.run("/heartbeat resume")).startswith("heartbeat resumed")
    assert (await host.run("/heartbeat stop")).startswith("heartbeat stopped")
    assert (await host.run("/heartbeat")).startswith("no heartbeat")
    line = await host.run("/heartbeat every soon check", error=True)
    assert line.startswith("/heartbeat: ")


async def test_fork_clone_tree(host: Host, client: ControlClient) -> None:
    source = host.session_id
    assert source is not None
    line = await host.run("/fork")
    (kind, forked), *_ = host.opened
    assert kind == "session" and forked is not None and forked in line
    row = await session_row(client, forked)
    assert row["forked_from"] == source
    await host.run("/fork 2")
    at_two = host.opened[-1][1]
    assert at_two is not None and (await session_row(client, at_two))["forked_at"] is not None
    line = await host.run("/clone")
    cloned = host.opened[-1][1]
    assert cloned is not None and cloned in line
    assert (await session_row(client, cloned))["forked_from"] == source
    line = await host.run("/fork 99999", error=True)
    assert line.startswith("/fork: ")
    assert len(host.opened) == 3  # the failed fork opened nothing
    host.lines.clear()
    await run_slash("/tree", host)
    assert host.opened[-1] == ("tree", None) and host.lines == []


async def test_export(
    host: Host, client: ControlClient, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    line = await host.run("/export")
    written = project / f"{TASK.replace(' ', '-')}.jsonl"
    assert line.endswith(f" bytes to {written}"), line
    rows = [json.loads(text) for text in written.read_text().splitlines()]
    assert rows and rows[0]["type"] == "session"
    line = await host.run("/export copies/x.jsonl", error=True)  # no such directory
    assert line.startswith("/export: ")


async def test_refine(host: Host, client: ControlClient) -> None:
    line = await host.run("/refine be brief")
    assert line.startswith("refinement ") and "planning" in line
    ref_id = line.split()[1]
    log = await client.call("harness_log", session=host.session_id)
    assert ref_id in [r["id"] for r in log["refinements"]]
    line = await host.run("/refine rollback r-nosuch", error=True)
    assert line.startswith("/refine: ")


async def test_harness(client: ControlClient) -> None:
    """No proposals yet; deciding on an unknown one is the daemon's one red line (the accept
    itself: tests/tui/test_slash_harness.py)."""
    host = Host(client, None)
    assert await host.run("/harness") == "no pending harness proposals"
    for action in ("accept", "reject"):
        line = await host.run(f"/harness {action} p-nosuch", error=True)
        assert line.startswith("/harness: no harness proposal 'p-nosuch'"), line


async def test_screens(host: Host) -> None:
    for text in ("/tree", "/agents", "/usage", "/help"):
        await run_slash(text, host)
    assert host.opened == [("tree", None), ("agents", None), ("usage", None), ("help", None)]
    assert host.lines == []


async def test_misuse_and_no_session(client: ControlClient) -> None:
    host = Host(client, None)
    line = await host.run("/compact", error=True)
    assert "needs a session" in line
    line = await host.run("/frobnicate", error=True)
    assert "/help" in line
    assert (await client.call("list_sessions"))["sessions"] == []


async def test_autonomous(host: Host, client: ControlClient) -> None:
    assert await host.run("/autonomous") == "autonomous: off"
    line = await host.run("/autonomous on")
    assert line.startswith("autonomous: on · turns 0/"), line
    assert (await host.run("/autonomous status")).startswith("autonomous: on · turns 0/")
    state = (await client.call("autonomous", session=host.session_id))["autonomous"]
    assert state["mode"] == "on"
    assert (await host.run("/autonomous off")).startswith("autonomous: off · turns 0/")
    state = (await client.call("autonomous", session=host.session_id))["autonomous"]
    assert state["mode"] == "off"
    line = await host.run("/autonomous maybe", error=True)
    assert "usage: /autonomous [on|off|status]" in line
