"""MCP servers handed over by a run (docs/mcp.md): ``--mcp-config FILE`` in Claude Code's shape,
in process and through the daemon, and an ACP client's ``session/new`` ``mcpServers`` (stdio
and HTTP). Real ``prime-agent`` processes, a real daemon, FastMCP servers written for the test
(``tests/fixtures/mcp/server.py``), the scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Final

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import EnvVariable, HttpMcpServer, McpServerStdio, SseMcpServer

from tests.e2e.test_acp import _Recorder
from tests.helpers import cli, model_behind_a_daemon
from tests.integration.test_mcp import SERVER, http_server

SECRET: Final = "handed-over-secret"
TURN_TIMEOUT_S: Final = 120.0
CLI_TIMEOUT_S: Final = 120.0

FILE_SCRIPT: Final = """
code:
    import os
    print(await mcp.handed_tools.add(a=1, b=2), await mcp.handed_tools.env_value(name="S"))
    print("kernel", os.environ.get("S"))
    print("cwd", await mcp.handed_tools.cwd() == os.getcwd())
---
text: done
"""


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "handed-tools": {
                        "type": "stdio",
                        "command": sys.executable,
                        "args": [str(SERVER), "stdio"],
                        "env": {"S": SECRET},
                    }
                }
            }
        )
    )
    return path


@pytest.mark.parametrize("where", ["in process", "through the daemon"])
def test_mcp_config_gives_the_run_its_servers(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with model_behind_a_daemon(monkeypatch, FILE_SCRIPT) as srv:
        flags = ["--model", "openai/fake", "--api-base", srv.url, "--backend", "local"]
        flags += ["--mcp-config", str(config_file(tmp_path))]
        if where == "in process":
            flags.append("--no-daemon")
        project = tmp_path / "project"
        project.mkdir()
        run = cli(["-p", "go", *flags], timeout=CLI_TIMEOUT_S, cwd=project)
        requests = list(srv.requests)
    assert run.returncode == 0, run.stderr
    tool = next(m for m in requests[1]["messages"] if m["role"] == "tool")
    # the server runs in the run's directory, as the session does
    assert tool["content"].splitlines() == [f"3 {SECRET}", "kernel None", "cwd True"]
    assert "- mcp.handed_tools" in requests[0]["messages"][0]["content"]


def test_a_bad_mcp_config_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mcpServers": {"x": {"command": "a", "url": "http://h/"}}}))
    run = cli(["-p", "go", "--model", "openai/fake", "--mcp-config", str(bad)])
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"prime-agent: error: --mcp-config {bad}: server x: give either command (a stdio "
        "server) or url (an HTTP server)"
    ]


ACP_SCRIPT: Final = """
repeat forever:
    when "use them":
        code:
            print(await mcp.client_tools.add(a=2, b=2), await mcp.client_web.greet(name="Acp"))
            print(await mcp.client_tools.env_value(name="S"))
    when "hello Acp":
        text: used
"""


async def test_acp_session_new_mcp_servers_are_honoured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorder = _Recorder()
    with model_behind_a_daemon(monkeypatch, ACP_SCRIPT) as srv, http_server() as url:
        args = ["-m", "orchestrator", "--mode", "acp", "--model", "openai/fake"]
        args += ["--api-base", srv.url, "--backend", "local"]
        async with spawn_agent_process(
            lambda _agent: recorder, sys.executable, *args, env=dict(os.environ), cwd=tmp_path
        ) as (conn, _process):
            hello = await conn.initialize(protocol_version=PROTOCOL_VERSION)
            capabilities = hello.agent_capabilities.mcp_capabilities
            assert capabilities.http is True and capabilities.sse is False
            with pytest.raises(RequestError):
                await conn.new_session(
                    cwd=str(tmp_path),
                    mcp_servers=[SseMcpServer(type="sse", name="old", url=url, headers=[])],
                )
            servers: list[Any] = [
                McpServerStdio(
                    name="client-tools",
                    command=sys.executable,
                    args=[str(SERVER), "stdio"],
                    env=[EnvVariable(name="S", value=SECRET)],
                ),
                HttpMcpServer(type="http", name="client-web", url=url, headers=[]),
            ]
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=servers)
            async with asyncio.timeout(TURN_TIMEOUT_S):
                answer = await conn.prompt(
                    session_id=session.session_id, prompt=[text_block("use them")]
                )
        assert answer.stop_reason == "end_turn"
    done = next(u for u in recorder.updates if u["sessionUpdate"] == "tool_call_update")
    assert done["status"] == "completed"
    assert done["content"][-1]["content"]["text"].strip().splitlines() == [
        "4 hello Acp!",
        SECRET,
    ]
