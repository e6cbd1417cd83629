"""An ACP client's ``session/new`` ``mcpServers`` as the session's own MCP servers (docs/mcp.md,
docs/acp.md).

ACP sends stdio servers as ``{name, command, args, env: [{name, value}]}`` and HTTP ones as
``{type: "http", name, url, headers: [{name, value}]}``; they become the plain config shape the
daemon validates (``SessionSettings.mcp_servers``) and runs, beside ``--mcp-config``'s (a
client's server of the same name wins). SSE and ACP-transport servers are refused in one line:
the agent does not advertise them (``mcpCapabilities``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import UserError

__all__ = ["ACP_MCP_CAPABILITIES", "acp_mcp_servers", "merged_mcp_servers"]

ACP_MCP_CAPABILITIES = {"http": True, "sse": False}


def _pairs(items: Sequence[Any] | None) -> dict[str, str]:
    return {str(item.name): str(item.value) for item in items or ()}


def acp_mcp_servers(servers: Sequence[Any] | None) -> dict[str, dict[str, Any]]:
    """ACP's server objects (``acp.schema``) as ``{name: {command..} | {url..}}``."""
    out: dict[str, dict[str, Any]] = {}
    for server in servers or ():
        kind = getattr(server, "type", None)
        name = str(server.name)
        if kind == "http":
            out[name] = {"url": str(server.url), "headers": _pairs(server.headers)}
        elif kind is None and getattr(server, "command", None):
            out[name] = {
                "command": str(server.command),
                "args": [str(arg) for arg in server.args or ()],
                "env": _pairs(server.env),
            }
        else:
            raise UserError(
                f"MCP server {name!r}: the {kind or 'unknown'} transport is not supported; "
                "give a stdio or an http server"
            )
    return out


def merged_mcp_servers(
    settings: Mapping[str, Any] | None, client: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """The session's settings with the client's servers over the command line's."""
    if not client:
        return dict(settings) if settings else None
    chosen = dict(settings or {})
    chosen["mcp_servers"] = {**(chosen.get("mcp_servers") or {}), **client}
    return chosen
