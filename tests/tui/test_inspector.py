"""The sandbox inspector against a real daemon and the scripted model: keys in, state out
(tui/inspector.py, docs/tui.md). The sandbox is real: a local kernel gateway (its pid is the
inspector's "name"), or a Docker container when an engine and the session image are there."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.widgets import Static

from orchestrator.settings import SANDBOX_MEMORY_MIB
from tests.helpers import need, pids_alive
from tests.tui.pilot import chat_screen, screen_text, texts, until
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.inspector import InspectorScreen
from tui.transcript_view import CellView

SIZE = (100, 30)
SECRET = 4242
MIB = 1024 * 1024

# Keeps a number in the kernel in the first turn; a later turn reads it back.
KEEP = f"""
repeat forever:
    when "keep a number":
        code:
            kept = {SECRET}
            print("stored")
    when "stored":
        text: Stored.
    when "is it still there":
        code: print(kept + 1)
    when "{SECRET + 1}":
        text: Still there.
    when "NameError":
        text: Lost.
"""

# The first call starts the sandbox (a cell); the second never answers: the turn stays busy.
BUSY = """
code: print("up")
---
slow 120
"""

# One row of the info table on screen: "name   value".
ROW = r"^\s*{key}\s{{2,}}(?P<value>.+?)\s*$"
DURATION = r"\d+(\.\d)?(ms|s)|\d+m \d\ds"


def _box(inspector: InspectorScreen) -> dict[str, Any]:
    return dict(inspector.answer.get("sandbox") or {})


def _pid(inspector: InspectorScreen) -> int:
    name = str(_box(inspector)["name"])
    assert name.startswith("pid "), name
    return int(name.removeprefix("pid "))


def _row(pilot: Any, key: str) -> str:
    """The value shown on the info table's row ``key``."""
    text = screen_text(pilot)
    found = re.search(ROW.format(key=key), text, re.MULTILINE)
    assert found is not None, f"no {key!r} row on screen:\n{text}"
    return found["value"]


def _hint(inspector: InspectorScreen) -> Text:
    content = inspector.query_one("#inspector-hint", Static).content
    assert isinstance(content, Text)
    return content


async def _first_turn(pilot: Any, app: PrimeAgentApp, text: str, reply: str) -> ChatScreen:
    """A new chat: send ``text``, wait for ``reply`` and for the session to be quiet."""
    chat = await chat_screen(pilot, app)
    await pilot.press(*text, "enter")
    await until(pilot, lambda: reply in texts(chat, "assistant"))
    assert chat.session_id is not None
    await app.link.call("wait_quiet", session=chat.session_id)
    await until(pilot, lambda: chat.row.get("status") == "idle")
    return chat


async def _inspector(pilot: Any, app: PrimeAgentApp) -> InspectorScreen:
    await pilot.press("ctrl+s")
    await until(pilot, lambda: isinstance(app.screen, InspectorScreen))
    inspector = app.screen
    assert isinstance(inspector, InspectorScreen)
    await until(pilot, lambda: bool(_box(inspector)))
    return inspector


@pytest.mark.parametrize("model_script", [KEEP], ids=["keep"])
async def test_inspector_shows_the_live_local_sandbox_and_s_stops_it(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await _first_turn(pilot, app, "keep a number", "Stored.")
        sid = chat.session_id
        inspector = await _inspector(pilot, app)
        assert inspector.session_id == sid
        first = _box(inspector)
        gateway = _pid(inspector)
        assert pids_alive([gateway]) == [gateway]
        assert first["backend"] == "local" and first["state"] == "running"
        assert first["cpu_percent"] is None  # nothing to compare with yet
        assert _row(pilot, "session") == f"{sid} (idle)"
        assert _row(pilot, "backend") == "local"
        assert _row(pilot, "name") == f"pid {gateway}"
        assert _row(pilot, "image") == "—"
        assert _row(pilot, "state") == "running"
        assert _row(pilot, "cpu") == "—"
        assert re.fullmatch(DURATION, _row(pilot, "uptime"))

        # The next poll has something to compare with: a percentage, and the memory in use.
        await until(pilot, lambda: _box(inspector).get("cpu_percent") is not None)
        box = _box(inspector)
        assert isinstance(box["cpu_percent"], float) and box["cpu_percent"] >= 0
        assert box["memory_bytes"] > 0 and box["memory_limit_bytes"] is None
        assert box["uptime_s"] >= first["uptime_s"]
        await until(pilot, lambda: re.fullmatch(r"\d+\.\d%", _row(pilot, "cpu")) is not None)
        memory = _row(pilot, "memory")
        assert re.fullmatch(r"\d+\.\d (KiB|MiB|GiB)", memory) and " of " not in memory

        # The log lines region, below the table, holds the gateway's last lines.
        assert "last log lines" in screen_text(pilot)
        logs = inspector.query_one("#logs", Static).content
        assert isinstance(logs, Text)
        assert box["log_tail"] and logs.plain == "\n".join(box["log_tail"])
        assert inspector.query_one("#logs-box").region.height > 0

        # `s`: the session goes inactive and its gateway process goes away.
        await pilot.press("s")
        await until(pilot, lambda: inspector.answer.get("status") == "inactive")
        assert inspector.answer == {"session": sid, "status": "inactive", "sandbox": None}
        await until(pilot, lambda: "stopped: the session is inactive" in screen_text(pilot))
        assert _row(pilot, "session") == f"{sid} (inactive)"
        assert _row(pilot, "sandbox").startswith("none: the session is inactive")
        assert "pid " not in screen_text(pilot)
        got = await app.link.call("get_session", session=sid)
        assert got["session"]["status"] == "inactive"
        await until(pilot, lambda: not pids_alive([gateway]))
        assert app.screen is inspector  # still open, still polling, nothing woke the session
        seen = inspector.answer
        await until(pilot, lambda: inspector.answer is not seen)  # the next poll
        assert inspector.answer == {"session": sid, "status": "inactive", "sandbox": None}

        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat)


@pytest.mark.parametrize("model_script", [KEEP], ids=["keep"])
async def test_r_restarts_the_sandbox_and_the_namespace_survives(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await _first_turn(pilot, app, "keep a number", "Stored.")
        sid = chat.session_id
        inspector = await _inspector(pilot, app)
        gateway = _pid(inspector)

        # `r` on a loaded session: a new gateway; the old one is gone.
        await pilot.press("r")
        await until(pilot, lambda: bool(_box(inspector)) and _pid(inspector) != gateway)
        restarted = _pid(inspector)
        await until(pilot, lambda: "restarted" in screen_text(pilot))
        assert _hint(inspector).plain == "restarted"
        assert _row(pilot, "name") == f"pid {restarted}"
        assert inspector.answer["status"] == "idle"
        await until(pilot, lambda: not pids_alive([gateway]))
        assert pids_alive([restarted]) == [restarted]

        # `r` after `s` wakes the inactive session with yet another gateway.
        await pilot.press("s")
        await until(pilot, lambda: inspector.answer.get("status") == "inactive")
        await until(pilot, lambda: not pids_alive([restarted]))
        await pilot.press("r")
        await until(pilot, lambda: bool(_box(inspector)))
        woken = _pid(inspector)
        assert woken not in (gateway, restarted) and pids_alive([woken]) == [woken]
        got = await app.link.call("get_session", session=sid)
        assert got["session"]["status"] == "idle"

        # The variable set in the first kernel is in the third one.
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is chat)
        await pilot.press(*"is it still there", "enter")
        await until(pilot, lambda: len(texts(chat, "assistant")) == 2)
        assert texts(chat, "assistant") == ["Stored.", "Still there."]
        cells = list(chat.query(CellView))
        assert [c.item.output.strip() for c in cells] == ["stored", str(SECRET + 1)]
        assert "Still there." in screen_text(pilot)
        after = await app.link.call("sandbox_info", session=sid)
        assert after["sandbox"]["name"] == f"pid {woken}"  # the turn used the woken gateway


@pytest.mark.parametrize("model_script", [BUSY], ids=["busy"])
async def test_r_during_a_turn_is_refused_with_one_red_line(daemon: Path, project: Path) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await chat_screen(pilot, app)
        await pilot.press(*"start", "enter")
        await until(pilot, lambda: any(c.item.label == "ok" for c in chat.query(CellView)))
        assert chat.session_id is not None and chat.running
        sid = chat.session_id
        inspector = await _inspector(pilot, app)
        before = _box(inspector)
        gateway = _pid(inspector)
        assert inspector.answer["status"] == "running"

        await pilot.press("r")
        await until(pilot, lambda: _hint(inspector).plain.startswith("restart: "))
        hint = _hint(inspector)
        assert "\n" not in hint.plain and "in a turn" in hint.plain and sid in hint.plain
        assert "red" in str(hint.style)
        # Nothing changed: same gateway, alive, the turn still running.
        seen = inspector.answer
        await until(pilot, lambda: inspector.answer is not seen)  # one more poll
        assert _box(inspector)["ref"] == before["ref"] and _pid(inspector) == gateway
        assert inspector.answer["status"] == "running"
        assert pids_alive([gateway]) == [gateway]
        got = await app.link.call("get_session", session=sid)
        assert got["session"]["status"] == "running"
        assert _hint(inspector).plain == hint.plain  # the line stays until the next action
        await app.link.call("abort", session=sid)
        await until(pilot, lambda: chat.row.get("status") == "idle")


DOCKER = """
code: print(sum(range(10)))
---
text: Done.
"""


@pytest.fixture
def docker_image() -> None:
    from tests.integration.test_sandbox_conformance import docker_ready

    why = docker_ready()
    if why is not None:
        need("docker", why)


@pytest.mark.parametrize("model_script", [DOCKER], ids=["docker"])
async def test_inspector_of_a_docker_session(
    docker_image: None, daemon: Path, project: Path
) -> None:
    from orchestrator.sandbox.docker import list_owned
    from orchestrator.sandbox.images import SESSION_IMAGE
    from tests.integration.test_sandbox_conformance import workspace

    cwd = workspace(project)
    app = PrimeAgentApp(daemon, cwd=cwd)
    async with app.run_test(size=SIZE) as pilot:
        await chat_screen(pilot, app)
        created = await app.link.call(
            "create_session", cwd=str(cwd), task="add them up", backend="docker"
        )
        sid = str(created["session"])
        app.open_chat(sid)
        await until(
            pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.session_id == sid
        )
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        await until(pilot, lambda: "Done." in texts(chat, "assistant"))
        await app.link.call("wait_quiet", session=sid)
        inspector = await _inspector(pilot, app)
        box = _box(inspector)
        (container,) = [c for c in list_owned() if c.session_id == sid]
        assert box["backend"] == "docker" and box["name"] == container.name
        assert box["image"] == SESSION_IMAGE and box["state"] == "running"
        assert _row(pilot, "backend") == "docker"
        assert _row(pilot, "name") == container.name
        assert _row(pilot, "image") == SESSION_IMAGE
        assert _row(pilot, "state") == "running"
        assert re.fullmatch(DURATION, _row(pilot, "uptime"))
        await until(pilot, lambda: _box(inspector).get("cpu_percent") is not None)
        box = _box(inspector)
        assert box["memory_limit_bytes"] == SANDBOX_MEMORY_MIB * MIB  # the default limit
        assert 0 < box["memory_bytes"] < box["memory_limit_bytes"]
        await until(pilot, lambda: re.fullmatch(r"\d+\.\d%", _row(pilot, "cpu")) is not None)
        memory = _row(pilot, "memory")
        assert re.fullmatch(r"\d+\.\d (KiB|MiB|GiB) of 2\.0 GiB", memory), memory


class HeldInfo:
    """The link's ``sandbox_info`` answers held back while ``hold`` is set (a slow engine)."""

    def __init__(self, app: PrimeAgentApp, monkeypatch: pytest.MonkeyPatch):
        self.call = app.link.call
        self.released = asyncio.Event()
        self.waiting = 0
        monkeypatch.setattr(app.link, "call", self._call)

    def hold(self) -> None:
        self.released = asyncio.Event()
        self.waiting = 0

    def release(self) -> None:
        self.released.set()

    async def _call(self, command_type: str, /, **fields: Any) -> Any:
        if command_type == "sandbox_info" and not self.released.is_set():
            self.waiting += 1
            await self.released.wait()
        return await self.call(command_type, **fields)


@pytest.mark.parametrize("model_script", [KEEP], ids=["keep"])
async def test_keys_pressed_while_a_poll_is_in_flight_are_not_lost(
    daemon: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow ``sandbox_info`` (a busy Docker engine) must not swallow `s` or `r`, and Esc
    right after `r` leaves the screen without cancelling the restart."""
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        chat = await _first_turn(pilot, app, "keep a number", "Stored.")
        sid = chat.session_id
        inspector = await _inspector(pilot, app)
        gateway = _pid(inspector)
        info = HeldInfo(app, monkeypatch)
        info.hold()
        await until(pilot, lambda: info.waiting > 0)  # the next poll waits for its answer
        await pilot.press("s")
        assert _hint(inspector).plain == "stop requested…"
        info.release()
        await until(pilot, lambda: inspector.answer.get("status") == "inactive", timeout=30)
        await until(pilot, lambda: not pids_alive([gateway]))

        info.hold()
        await until(pilot, lambda: info.waiting > 0)
        await pilot.press("r", "escape")
        await until(pilot, lambda: app.screen is chat)
        info.release()

        async def restarted() -> bool:
            got = await info.call("sandbox_info", session=sid)
            return got["sandbox"] is not None

        deadline = asyncio.get_running_loop().time() + 30
        while not await restarted():
            assert asyncio.get_running_loop().time() < deadline, "the restart never happened"
            await pilot.pause(0.1)
        assert app.is_running and app.screen is chat
        got = await info.call("get_session", session=sid)
        assert got["session"]["status"] == "idle"
