"""What an MCP server is, as configured (docs/mcp.md): pydantic only, shared by every layer.

A server is either a child process spoken to over stdio (``command``, ``args``, ``env``) or a
streamable-HTTP endpoint (``url``, ``headers``). Servers come from ``[mcp.servers.NAME]`` in
config.toml, from ``--mcp-config FILE`` in Claude Code's JSON shape (``{"mcpServers":
{...}}``) and from an ACP client's ``session/new``. The orchestrator runs them on the host
(``orchestrator/mcp/``); their env and headers never reach a sandbox.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigError

__all__ = [
    "MCP_SERVERS_MAX",
    "McpServerConfig",
    "McpServers",
    "load_mcp_config_file",
    "named_servers",
    "named_servers_field",
    "parse_mcp_servers",
    "python_name",
]

# A server's name is the attribute the kernel reads it by (``mcp.NAME``): a Python name.
NAME_MAX_CHARS: Final = 64
MCP_SERVERS_MAX: Final = 32
MCP_CONFIG_FILE_MAX_BYTES: Final = 1024 * 1024
CLAUDE_SERVERS_KEY: Final = "mcpServers"
HTTP_TRANSPORTS: Final = frozenset({"http", "streamable-http", "streamable_http"})


class McpServerConfig(BaseModel):
    """One server: stdio (``command``) or streamable HTTP (``url``), never both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Claude Code writes "stdio" or "http"; "sse" (the old transport) is refused below.
    type: str | None = None
    command: str | None = Field(default=None, min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.type is not None and self.type not in HTTP_TRANSPORTS | {"stdio"}:
            raise ValueError(
                f"transport {self.type!r} is not supported: use stdio (command) or http (url)"
            )
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (an HTTP server)")
        if self.command is not None and (self.headers or self.type in HTTP_TRANSPORTS):
            raise ValueError("a stdio server (command) takes args and env, not headers")
        if self.url is not None and (self.args or self.env or self.cwd or self.type == "stdio"):
            raise ValueError("an HTTP server (url) takes headers, not args, env or cwd")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """Where it runs, without its env or headers (they may hold secrets)."""
        if self.command is not None:
            return " ".join([self.command, *self.args])
        return str(self.url)


McpServers = dict[str, McpServerConfig]


def python_name(name: str) -> str:
    """The name the kernel reads a server by (``mcp.NAME``): ``my-server`` is ``my_server``."""
    out = re.sub(r"\W", "_", name.strip(), flags=re.ASCII)[:NAME_MAX_CHARS]
    return "_" + out if not out or out[0].isdigit() else out


def named_servers(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``raw`` by Python names; two names that become one are refused."""
    if len(raw) > MCP_SERVERS_MAX:
        raise ConfigError(f"{where}: at most {MCP_SERVERS_MAX} MCP servers")
    out: dict[str, Any] = {}
    for name, body in raw.items():
        key = python_name(str(name))
        if key in out:
            raise ConfigError(f"{where}: two MCP servers are both named {key!r} in the kernel")
        out[key] = body
    return out


def named_servers_field(value: object, where: str) -> object:
    """``named_servers`` for a pydantic ``mode="before"`` validator: a refusal as the
    ``ValueError`` pydantic reports (config.toml's section and the protocol's settings)."""
    if not isinstance(value, dict):
        return value
    try:
        return named_servers(value, where)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def parse_mcp_servers(raw: Any, where: str) -> McpServers:
    """``{name: {command..} | {url..}}`` as checked configs by Python names (``my-server`` is
    ``mcp.my_server``), or one ``ConfigError`` line."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected an object of servers by name")
    out: McpServers = {}
    for name, body in named_servers(raw, where).items():
        try:
            out[name] = McpServerConfig.model_validate(body)
        except ValidationError as exc:
            error = exc.errors()[0]
            loc = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            detail = f"{loc}: {message}" if loc else message
            raise ConfigError(f"{where}: server {name}: {detail}") from None
    return out


def load_mcp_config_file(path: Path) -> McpServers:
    """A ``--mcp-config`` file in Claude Code's shape: ``{"mcpServers": {NAME: {...}}}``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--mcp-config: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MCP_CONFIG_FILE_MAX_BYTES:
        raise ConfigError(f"--mcp-config: {path} is larger than {MCP_CONFIG_FILE_MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"--mcp-config: {path} is not JSON ({exc})") from None
    if not isinstance(doc, dict) or CLAUDE_SERVERS_KEY not in doc:
        raise ConfigError(f'--mcp-config: {path} needs the shape {{"mcpServers": {{...}}}}')
    return parse_mcp_servers(doc[CLAUDE_SERVERS_KEY], f"--mcp-config {path}")
