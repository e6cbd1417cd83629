"""MCP servers as modules in the kernel (docs/mcp.md): real FastMCP servers (stdio and
streamable HTTP, ``tests/fixtures/mcp/server.py``), a real orchestrator with its NATS bus and
host handlers, a real local kernel, the scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from orchestrator.agent.loop import TurnOutcome
from orchestrator.errors import McpError
from orchestrator.mcp.server import PING_INTERVAL_S, McpServer, restart_delay
from orchestrator.mcp_config import McpServerConfig
from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.session_specs import StoredRunSettings
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import Orchestrator
from orchestrator.sessions.runner import make_backend
from orchestrator.settings import McpSettings, ModelConfig, Settings
from orchestrator.store.db import EventRecord, Store
from orchestrator.store.events import UserMessagePayload
from orchestrator.testing import FakeModelServer
from tests.helpers import wait_until

MODEL: Final = "openai/fake"
SERVER: Final = Path(__file__).resolve().parents[1] / "fixtures" / "mcp" / "server.py"
SECRET: Final = "s3cret-only-the-server-knows"
QUIET_TIMEOUT_S: Final = 120.0
HTTP_READY_TIMEOUT_S: Final = 30.0
RESTART_TIMEOUT_S: Final = 30.0
SLOW_CELL_TIMEOUT_S: Final = 4.0
START_TIMEOUT_S: Final = 30.0
CALL_TIMEOUT_S: Final = 30.0
POLL_S: Final = 0.05


def stdio_server(**env: str) -> McpServerConfig:
    return McpServerConfig(command=sys.executable, args=(str(SERVER), "stdio"), env=env)


def settings(servers: dict[str, McpServerConfig], **changes: Any) -> Settings:
    return Settings(
        models={MODEL: ModelConfig()},
        mcp=McpSettings(servers=servers),
        retry_base_delay_s=0.01,
        model_max_retries=0,
        **({"cell_timeout_s": 60.0} | changes),
    )


@contextlib.asynccontextmanager
async def orchestrator(cfg: Settings) -> AsyncIterator[Orchestrator]:
    paths = Paths.from_env()
    bus = NatsSessionBus(paths, nats=cfg.nats)
    store = await Store.open(paths.database_file)
    orch = Orchestrator(
        store=store, backend=make_backend("local", cfg), settings=cfg, paths=paths, bus=bus
    )
    try:
        await bus.start(FamilyService(orch).handlers())
        yield orch
    finally:
        await orch.close()
        await bus.close()
        await store.close()


async def run_turn(orch: Orchestrator, live: LiveSession, text: str) -> TurnOutcome:
    orch.submit(live, Inbound(UserMessagePayload(text=text)))
    await orch.wait_quiet(live.record.root_id, QUIET_TIMEOUT_S)
    assert live.last_outcome is not None
    return live.last_outcome


async def one_turn(orch: Orchestrator, script: str, cfg: Settings) -> tuple[list[EventRecord], str]:
    """One session, one turn of ``script``: its events and its system prompt."""
    with FakeModelServer(script) as srv:
        model = resolve_model(MODEL, cfg, api_base=srv.url, env={})
        live = await orch.create_session(model=model, cwd=Path.cwd(), name="m")
        outcome = await run_turn(orch, live, "go")
        assert outcome.reason == "completed", outcome
        prompt = str(srv.requests[0]["messages"][0]["content"])
    return await orch.store.events(live.id), prompt


def results(events: list[EventRecord]) -> list[str]:
    return [e.payload["text"] for e in events if e.type == "tool_result"]


def mcp_calls(events: list[EventRecord]) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.type == "mcp_call"]


CALLS: Final = """
    code:
        print(repr(mcp))
        print(await mcp.tools.add(a=2, b=3))
        print(await mcp.tools.greet(name="Ada"))
        print(await mcp.tools.stats(values=[1.5, 2.5]))
        print(await mcp.tools.read("note://hello"))
        print((await mcp.tools.prompt("review", code="x = 1"))[0]["content"]["text"])
        import os
        print("kernel sees secret:", os.environ.get("SECRET"))
        print("server sees secret:", await mcp.tools.env_value(name="SECRET"))
    ---
    code:
        import inspect
        print(inspect.signature(mcp.tools.greet))
        print(mcp.tools.greet.__doc__)
        help(mcp.tools)
        try:
            mcp.tools.add(a=1)
        except TypeError as exc:
            print("refused:", exc)
        try:
            await mcp.tools.fail(message="boom")
        except mcp.ToolError as exc:
            print("tool error:", exc.code, exc)
        try:
            await mcp.tools.big(size=2_000_000)
        except mcp.ToolError as exc:
            print("too big:", exc)
    ---
    text: done
"""


async def test_tool_calls_resources_prompts_and_errors_through_a_stdio_server() -> None:
    cfg = settings({"tools": stdio_server(SECRET=SECRET)})
    async with orchestrator(cfg) as orch:
        events, prompt = await one_turn(orch, CALLS, cfg)
    first, second = results(events)
    assert "mcp.tools [ready]: add, greet, stats, fail" in first
    lines = first.splitlines()
    assert lines[2:5] == ["5", "hello Ada!", "{'count': 2, 'total': 4.0}"]
    assert lines[5] == "hello from a resource"
    assert lines[6:8] == ["Please review this code:", "x = 1"]
    assert "kernel sees secret: None" in first  # the server's env stays on the host
    assert f"server sees secret: {SECRET}" in first
    assert "(*, name: str, punctuation: str = '!')" in second
    assert "Greet someone by name." in second
    assert "add(*, a: int, b: int)" in second  # help() lists the tools with their arguments
    assert "refused: mcp.tools.add() is missing required arguments: b" in second
    assert "tool error: mcp_tool_error tools.fail: Error executing tool fail: boom" in second
    assert "too big: tools.big answered 4000092 bytes, more than the 1048576 a reply" in second
    # the prompt lists the server and one line per tool
    assert "# MCP servers" in prompt
    assert "- mcp.tools\n" in prompt and "  - greet(name, punctuation=…): Greet someone" in prompt
    calls = mcp_calls(events)
    assert [(c["kind"], c["name"], c["status"]) for c in calls] == [
        ("tool", "add", "ok"),
        ("tool", "greet", "ok"),
        ("tool", "stats", "ok"),
        ("resource", "note://hello", "ok"),
        ("prompt", "review", "ok"),
        ("tool", "env_value", "ok"),
        ("tool", "fail", "error"),
        ("tool", "big", "error"),
    ]
    assert json.loads(calls[0]["arguments"]) == {"a": 2, "b": 3}
    assert "boom" in calls[-2]["error"]


CRASH: Final = """
    code:
        first = await mcp.tools.pid()
        try:
            await mcp.tools.crash()
        except mcp.Unavailable as exc:
            print("crashed:", exc.code)
        try:
            await mcp.tools.add(a=1, b=1)
        except mcp.Unavailable as exc:
            print("while down:", exc.code, exc.retry_after is not None)
    ---
    code:
        import asyncio
        for _ in range(300):
            try:
                second = await mcp.tools.pid()
                break
            except mcp.Unavailable:
                await asyncio.sleep(0.1)
        print("restarted:", second != first, await mcp.tools.add(a=20, b=22))
    ---
    text: done
"""


async def test_a_crashed_server_is_a_typed_error_then_restarted() -> None:
    cfg = settings({"tools": stdio_server()})
    async with orchestrator(cfg) as orch:
        events, _ = await one_turn(orch, CRASH, cfg)
        status = orch.mcp.servers("")["tools"].status()
    first, second = results(events)
    assert "crashed: mcp_unavailable" in first
    assert "while down: mcp_unavailable True" in first
    assert "restarted: True 42" in second
    assert status.restarts == 1 and status.state == "ready"
    statuses = [c["status"] for c in mcp_calls(events)]
    assert statuses[:3] == ["ok", "unavailable", "unavailable"]
    assert statuses[-2:] == ["ok", "ok"]


SLOW: Final = """
    code:
        import asyncio
        kept = "still here"
        try:
            await asyncio.wait_for(mcp.tools.slow(seconds=120), 1)
        except TimeoutError:
            print("gave up")
    ---
    code:
        try:
            await mcp.tools.slow(seconds=120)
        except mcp.Timeout as exc:
            print("timed out:", exc.code, kept)
    ---
    text: done
"""


async def test_a_slow_call_honours_the_cells_timeout_and_a_cancelled_one_stops() -> None:
    cfg = settings({"tools": stdio_server()}, cell_timeout_s=SLOW_CELL_TIMEOUT_S)
    async with orchestrator(cfg) as orch:
        events, _ = await one_turn(orch, SLOW, cfg)
    first, second = (e.payload for e in events if e.type == "tool_result")
    assert first["text"] == "gave up"
    # the call ended before the cell's timeout: no interrupt, no kernel restart
    assert second["status"] == "ok" and not second["kernel_restarted"]
    assert second["text"] == "timed out: mcp_timeout still here"
    assert second["duration_ms"] < SLOW_CELL_TIMEOUT_S * 1000
    # the first was cancelled by the kernel (its task gave up), the second timed out
    assert sorted(c["status"] for c in mcp_calls(events)) == ["cancelled", "timeout"]


# -- streamable HTTP ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:

        def up() -> bool:
            try:
                httpx.get(url, timeout=1.0)
            except httpx.HTTPError:
                return False
            return True

        assert wait_until(up, timeout=HTTP_READY_TIMEOUT_S), "the HTTP MCP server did not start"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


HTTP_CALLS: Final = """
    code:
        print(await mcp.web.add(a=40, b=2), await mcp.web.greet(name="Bo", punctuation="?"))
    ---
    text: done
"""


async def test_tool_calls_through_a_streamable_http_server() -> None:
    with http_server() as url:
        cfg = settings({"web": McpServerConfig(url=url, headers={"X-Test": "1"})})
        async with orchestrator(cfg) as orch:
            events, _ = await one_turn(orch, HTTP_CALLS, cfg)
    assert results(events) == ["42 hello Bo?"]
    assert [c["status"] for c in mcp_calls(events)] == ["ok", "ok"]


# -- the host side alone: restarts, backoff, a family's own servers ---------------------------


async def test_a_server_that_dies_between_calls_is_found_by_its_ping_and_restarted() -> None:
    server = McpServer("tools", stdio_server())
    server.start()
    try:
        await server.wait_started(START_TIMEOUT_S)
        first = (await server.call_tool("pid", {}, CALL_TIMEOUT_S))["structured"]["result"]
        os.kill(first, signal.SIGKILL)
        # no call in flight: the ping (every PING_INTERVAL_S) finds the server gone
        deadline = time.monotonic() + PING_INTERVAL_S + RESTART_TIMEOUT_S
        while server.restarts < 1 or server.state != "ready":
            assert time.monotonic() < deadline, server.status()
            await asyncio.sleep(POLL_S)
        again = (await server.call_tool("pid", {}, CALL_TIMEOUT_S))["structured"]["result"]
        assert again != first
    finally:
        await server.stop()
    assert server.status().state == "stopped"


async def test_a_server_that_cannot_start_is_retried_with_backoff_and_says_why() -> None:
    broken = McpServerConfig(command=sys.executable, args=("-c", "raise SystemExit('no way')"))
    log = Path(os.environ["XDG_RUNTIME_DIR"]) / "broken.log"
    server = McpServer("broken", broken, log_file=log)
    server.start()
    try:
        await server.wait_started(START_TIMEOUT_S)
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while server.restarts < 2:
            assert time.monotonic() < deadline, server.status()
            await asyncio.sleep(POLL_S)
        with pytest.raises(McpError) as caught:
            await server.call_tool("add", {"a": 1}, CALL_TIMEOUT_S)
    finally:
        await server.stop()
    assert caught.value.code == "mcp_unavailable"
    assert "the MCP server broken is" in str(caught.value) and server.last_error
    assert "no way" in log.read_text()  # its stderr, once per start
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    assert [restart_delay(n) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


BUDGET: Final = """
    code:
        try:
            await mcp.tools.add(a=1, b=1)
        except Exception as exc:
            print(type(exc).__name__, exc.code)
    ---
    text: done
"""


async def test_a_spent_budget_refuses_a_call_and_a_familys_own_servers_stop_with_it() -> None:
    cfg = settings({})
    async with orchestrator(cfg) as orch:
        with FakeModelServer(BUDGET) as srv:
            model = resolve_model(MODEL, cfg, api_base=srv.url, env={})
            own = StoredRunSettings(mcp_servers={"tools": stdio_server()})
            live = await orch.create_session(
                model=model, cwd=Path.cwd(), name="m", budget=1, run_settings=own
            )
            await run_turn(orch, live, "go")  # its first model call spends the 1-token budget
        events = await orch.store.events(live.id)
        server = orch.mcp.servers(live.id)["tools"]
        assert orch.mcp.servers("another-root") == {}  # the family's own, nobody else's
        await orch.unload(live)
        assert server.status().state == "stopped"
        assert orch.mcp.servers(live.id) == {}
    assert results(events) == ["BudgetExceeded budget_exceeded"]
    assert [c["status"] for c in mcp_calls(events)] == ["refused"]


GROW: Final = """
    code:
        print(await mcp.tools.grow(name="fresh"))
    ---
    code:
        print(await mcp.tools.fresh())
    ---
    text: done
    ---
    text: done again
"""


async def test_a_tool_the_server_adds_is_seen_after_its_list_changed_notice() -> None:
    cfg = settings({"tools": stdio_server()})
    async with orchestrator(cfg) as orch:
        with FakeModelServer(GROW) as srv:
            model = resolve_model(MODEL, cfg, api_base=srv.url, env={})
            live = await orch.create_session(model=model, cwd=Path.cwd(), name="m")
            await run_turn(orch, live, "go")
            await run_turn(orch, live, "again")  # a turn's prompt is built at its start
            prompts = [str(r["messages"][0]["content"]) for r in srv.requests]
        events = await orch.store.events(live.id)
    assert results(events) == ["added", "grown"]
    assert "  - fresh(): Added while the server ran." not in prompts[0]
    assert "  - fresh(): Added while the server ran." in prompts[-1]
