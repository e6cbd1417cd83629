"""An MCP server called from a docker sandbox, end to end (docs/mcp.md): a real daemon started
by the CLI owns the server (``[mcp.servers]`` in config.toml, a FastMCP stdio server written
for the test), the session runs in a container, the scripted model writes the cell."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Final

from orchestrator.paths import Paths
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, write_config
from tests.integration.test_sandbox_conformance import docker_ready

SERVER: Final = Path(__file__).resolve().parents[1] / "fixtures" / "mcp" / "server.py"
SECRET: Final = "mcp-secret-kept-on-the-host"
CLI_TIMEOUT_S: Final = 180.0

SCRIPT: Final = """
code:
    import os
    print("sum", await mcp.tools.add(a=19, b=23))
    print("server", await mcp.tools.env_value(name="MCP_TEST_SECRET"))
    print("kernel", os.environ.get("MCP_TEST_SECRET"))
    print("container", os.path.exists("/.dockerenv"))
---
text: done
"""


def _mcp_calls() -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        store = await Store.open(Paths.from_env().database_file, read_only=True)
        try:
            return [
                e.payload
                for rec in await store.list_sessions()
                for e in await store.events(rec.id)
                if e.type == "mcp_call"
            ]
        finally:
            await store.close()

    return asyncio.run(read())


def test_a_docker_sandbox_calls_an_mcp_server_the_daemon_runs() -> None:
    why = docker_ready()
    if why is not None:
        from tests.helpers import need

        need("docker", why)
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
            "[mcp.servers.tools]\n"
            f'command = "{sys.executable}"\n'
            f'args = ["{SERVER}", "stdio"]\n'
            f'env = {{ MCP_TEST_SECRET = "{SECRET}" }}\n'
        )
        started = cli(["daemon", "start"], timeout=CLI_TIMEOUT_S)
        assert started.returncode == 0, started.stderr
        run = cli(
            ["-p", "go", "--backend", "docker", "--model", "openai/fake", "--api-base", srv.url],
            timeout=CLI_TIMEOUT_S,
        )
        stopped = cli(["daemon", "stop"], timeout=CLI_TIMEOUT_S)
        requests = list(srv.requests)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "done\n"
    assert stopped.returncode == 0, stopped.stderr
    tool = next(m for m in requests[1]["messages"] if m["role"] == "tool")
    assert tool["content"].splitlines() == [
        "sum 42",
        f"server {SECRET}",
        "kernel None",  # the server's env never entered the container
        "container True",
    ]
    assert "# MCP servers" in requests[0]["messages"][0]["content"]
    calls = _mcp_calls()
    assert [(c["server"], c["name"], c["status"]) for c in calls] == [
        ("tools", "add", "ok"),
        ("tools", "env_value", "ok"),
    ]
