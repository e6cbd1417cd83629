"""``mcp`` in the kernel without NATS (docs/mcp.md): the catalog as modules, signatures and
docstrings from the schema, checks before any request, the exact wire args, result decoding;
the config's parsing; the prompt's lines."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.agent.prompts import mcp_prompt_section
from orchestrator.errors import ConfigError
from orchestrator.mcp_config import McpServerConfig, load_mcp_config_file, parse_mcp_servers
from orchestrator.runtime.errors import HostError, McpUnavailable
from orchestrator.runtime.host import HostClient
from orchestrator.runtime.mcp import Mcp, McpServerModule
from orchestrator.runtime.wire import MCP_CALL_TIMEOUT_S
from orchestrator.settings import load_settings

ADD: Final = {
    "name": "add",
    "description": "Add two integers.\n\nMore words.",
    "input_schema": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first"},
            "b": {"type": "integer", "default": 1},
        },
        "required": ["a"],
    },
    "output_schema": {"type": "object", "properties": {"result": {"type": "integer"}}},
}
ODD: Final = {
    "name": "get-file",
    "description": "A tool whose name and argument are not Python names.",
    "input_schema": {"type": "object", "properties": {"from": {"type": "string"}}},
}
CATALOG: Final = {
    "servers": [
        {
            "name": "calc",
            "state": "ready",
            "transport": "stdio",
            "restarts": 0,
            "tools": [ADD, ODD],
            "resources": [{"uri": "note://a", "name": "a", "description": "A note."}],
            "prompts": [{"name": "review", "description": "Review.", "arguments": []}],
        }
    ]
}


class RecordingClient(HostClient):
    """Records requests; answers from ``replies`` (type -> result or HostError)."""

    def __init__(self, replies: Mapping[str, Any]) -> None:
        super().__init__(environ={})
        self.replies = dict(replies)
        self.requests: list[tuple[str, dict[str, Any], float | None]] = []

    async def request(
        self,
        request_type: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        self.requests.append((request_type, json.loads(json.dumps(dict(args or {}))), timeout))
        reply = self.replies.get(request_type)
        if isinstance(reply, HostError):
            raise reply
        return reply


def make(**replies: Any) -> tuple[Mcp, RecordingClient]:
    client = RecordingClient({"mcp.list": CATALOG, **replies})
    return Mcp(client), client


def test_servers_are_modules_whose_tools_have_the_schemas_signature_and_doc() -> None:
    mcp, client = make()
    calc = mcp.calc
    assert isinstance(calc, McpServerModule) and list(mcp) == ["calc"] and mcp["calc"] is calc
    assert str(inspect.signature(calc.add)) == "(*, a: int, b: int = 1)"
    assert calc.add.__doc__.startswith("Add two integers.")
    assert "a (int, required): the first" in calc.add.__doc__
    # a name that is not a Python name is made one; its odd argument goes through **arguments
    assert str(inspect.signature(calc.get_file)) == "(**arguments)"
    assert "mcp.calc [ready]: add, get_file" in repr(mcp)
    assert "note://a: A note." in (calc.__doc__ or "")
    with pytest.raises(AttributeError, match="no MCP server 'nope' in this session"):
        _ = mcp.nope
    with pytest.raises(AttributeError, match=r"has no tool 'sub' \(tools: add, get_file\)"):
        _ = calc.sub
    lists = [r[0] for r in client.requests].count("mcp.list")
    with pytest.raises(AttributeError):
        _ = calc.sub  # read again once per missing name, not at every probe
    assert [r[0] for r in client.requests].count("mcp.list") == lists


def test_arguments_are_checked_before_anything_is_sent() -> None:
    mcp, client = make()
    with pytest.raises(TypeError, match="missing required arguments: a"):
        mcp.calc.add(b=2)
    with pytest.raises(TypeError, match="unknown arguments c; allowed: a, b"):
        mcp.calc.add(a=1, c=2)
    assert [r[0] for r in client.requests] == ["mcp.list"]


def test_a_call_sends_the_exact_args_and_decodes_the_result() -> None:
    reply = {"is_error": False, "structured": {"result": 5}, "content": []}
    mcp, client = make(**{"mcp.call_tool": reply})
    assert asyncio.run(mcp.calc.add(a=2, b=3)) == 5  # FastMCP's {"result": x} unwrapped
    kind, args, timeout = client.requests[-1]
    assert kind == "mcp.call_tool"
    call_id = args.pop("call_id")
    assert len(call_id) == 32
    assert args == {
        "server": "calc",
        "tool": "add",
        "arguments": {"a": 2, "b": 3},
        "timeout": MCP_CALL_TIMEOUT_S,
    }
    assert timeout is not None and timeout > MCP_CALL_TIMEOUT_S  # the host answers first


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ({"structured": {"x": 1}, "content": []}, {"x": 1}),
        ({"structured": None, "content": [{"type": "text", "text": "a"}] * 2}, "a\na"),
        (
            {"structured": None, "content": [{"type": "image", "mime_type": "p", "data": "A"}]},
            [{"type": "image", "mime_type": "p", "data": "A"}],
        ),
    ],
)
def test_results_are_structured_else_text_else_blocks(reply: Any, expected: Any) -> None:
    mcp, _ = make(**{"mcp.call_tool": {"is_error": False, **reply}})
    assert asyncio.run(mcp.calc.call("get-file", {"from": "x"}, timeout=2)) == expected


def test_resources_and_prompts_and_a_down_server_rereads_the_catalog() -> None:
    mcp, client = make(
        **{
            "mcp.read_resource": {"contents": [{"uri": "note://a", "text": "hi"}]},
            "mcp.get_prompt": {"messages": [{"role": "user", "content": {"text": "r"}}]},
        }
    )
    assert asyncio.run(mcp.calc.read("note://a")) == "hi"
    assert asyncio.run(mcp.calc.prompt("review", code="x"))[0]["role"] == "user"
    assert client.requests[-1][1]["arguments"] == {"code": "x"}
    client.replies["mcp.call_tool"] = McpUnavailable("down", retry_after=0.5)
    with pytest.raises(mcp.Unavailable):
        asyncio.run(mcp.calc.add(a=1))
    _ = mcp.calc  # read again: a restarted server may offer other tools
    assert [r[0] for r in client.requests].count("mcp.list") == 2


def test_config_servers_and_the_claude_code_file(tmp_path: Path) -> None:
    toml = tmp_path / "config.toml"
    toml.write_text(
        '[mcp.servers.search]\ncommand = "uvx"\nargs = ["s"]\nenv = { K = "v" }\n'
        '[mcp.servers.docs]\nurl = "https://mcp.example/mcp"\nheaders = { A = "b" }\n'
    )
    servers = load_settings(toml).mcp.servers
    assert servers["search"].transport == "stdio" and servers["search"].env == {"K": "v"}
    assert servers["docs"].transport == "http" and servers["docs"].headers == {"A": "b"}
    claude = tmp_path / "mcp.json"
    claude.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fs": {"type": "stdio", "command": "npx", "args": ["fs"], "env": {}},
                    "web-2": {"type": "http", "url": "http://127.0.0.1:1/mcp"},
                }
            }
        )
    )
    loaded = load_mcp_config_file(claude)
    assert list(loaded) == ["fs", "web_2"]  # by the names the kernel reads them by
    assert loaded["fs"] == McpServerConfig(type="stdio", command="npx", args=("fs",))
    assert loaded["web_2"].url == "http://127.0.0.1:1/mcp"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"a-b": {"command": "x"}, "a_b": {"command": "y"}}, "both named 'a_b'"),
        ({"a": {"command": "x", "url": "http://h/"}}, "either command"),
        ({"a": {}}, "either command"),
        ({"a": {"type": "sse", "url": "http://h/"}}, "transport 'sse' is not supported"),
        ({"a": {"url": "http://h/", "env": {"K": "v"}}}, "takes headers, not args, env"),
        ({"a": {"command": "x", "headers": {"K": "v"}}}, "takes args and env, not headers"),
    ],
)
def test_a_bad_server_is_one_line_naming_it(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_mcp_servers(raw, "here")
    assert "\n" not in str(caught.value)


def test_a_file_without_mcp_servers_says_the_shape(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{}")
    with pytest.raises(ConfigError, match=re.escape('needs the shape {"mcpServers"')):
        load_mcp_config_file(path)


def test_the_prompt_lists_servers_and_one_line_per_tool() -> None:
    section = mcp_prompt_section(
        [{**CATALOG["servers"][0], "tools": [ADD, {**ODD, "description": "x" * 500}]}]
    )
    lines = section.splitlines()
    assert "- mcp.calc" in lines
    assert "  - add(a, b=…): Add two integers." in lines
    long_line = next(line for line in lines if "get-file" in line)
    assert len(long_line) <= 160 and long_line.endswith("…")
    assert "  - 1 resources: see help(mcp.calc)" in lines
    down = mcp_prompt_section([{"name": "calc", "state": "down", "tools": []}])
    assert "- mcp.calc (down: try again later)" in down.splitlines()
    assert mcp_prompt_section([]) == ""


def test_an_orchestrator_without_servers_does_not_import_the_mcp_sdk() -> None:
    """The SDK takes about a second to import: only a configured server pays for it."""
    code = (
        "import sys, orchestrator.sessions.manager, orchestrator.sessions.family\n"
        "from orchestrator.mcp.hub import McpHub\n"
        "McpHub({}).servers('s')\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
