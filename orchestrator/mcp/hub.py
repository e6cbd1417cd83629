"""Every MCP server an orchestrator runs: the config's, shared, and each family's own.

``[mcp.servers]`` servers are shared by every session; a run's own servers (``--mcp-config``,
an ACP client's ``session/new``) belong to its family, keyed by the root session id, and shadow
a shared server of the same name. Servers start at first use (a running loop is needed) and
stop with ``detach`` (the family is gone) or ``close`` (the orchestrator stops).

The MCP SDK (``server.py``) takes about a second to import: it is imported only when there is
a server to run, so an orchestrator without any pays nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Final

from orchestrator.mcp_config import McpServerConfig, McpServers

if TYPE_CHECKING:
    from orchestrator.mcp.server import McpServer

__all__ = ["LOG_SUFFIX", "START_WAIT_S", "McpHub"]

# How long a prompt build waits for servers still starting before it lists what is up.
START_WAIT_S: Final = 15.0
LOG_SUFFIX: Final = ".log"


class McpHub:
    """``log_dir``: where each stdio server's stderr goes (``NAME.log``, a family's own
    ``ROOT-NAME.log``); None: this process's stderr."""

    def __init__(self, servers: McpServers, log_dir: Path | None = None) -> None:
        self._log_dir = log_dir
        self._configs = dict(servers)
        self._shared: dict[str, McpServer] | None = None  # made at first use
        self._owned: dict[str, dict[str, McpServer]] = {}
        self._closed = False

    def attach(self, owner: str, servers: McpServers, cwd: str | None = None) -> None:
        """Give ``owner``'s family these servers (started now; the same config is kept). A
        stdio server without its own ``cwd`` runs in ``cwd`` (the root session's directory, as
        a coding agent runs a project's servers)."""
        if self._closed or not servers:
            return
        mine = self._owned.setdefault(owner, {})
        for name, given in servers.items():
            config = given
            if cwd is not None and given.command is not None and given.cwd is None:
                config = given.model_copy(update={"cwd": cwd})
            known = mine.get(name)
            if known is not None and known.config == config:
                continue
            mine[name] = _server(name, config, self._log(f"{owner}-{name}"))
            mine[name].start()

    def _log(self, stem: str) -> Path | None:
        return self._log_dir / f"{stem}{LOG_SUFFIX}" if self._log_dir is not None else None

    async def detach(self, owner: str) -> None:
        """Stop ``owner``'s own servers (its family is gone)."""
        mine = self._owned.pop(owner, {})
        await asyncio.gather(*(server.stop() for server in mine.values()))

    def servers(self, owner: str) -> dict[str, McpServer]:
        """What ``owner``'s family sees: the shared servers, its own over them; by name."""
        if self._shared is None:
            self._shared = {
                name: _server(name, config, self._log(name))
                for name, config in self._configs.items()
            }
        if not self._closed:
            for server in self._shared.values():
                server.start()
        return {**self._shared, **self._owned.get(owner, {})}

    async def wait_started(self, owner: str, timeout_s: float = START_WAIT_S) -> None:
        servers = self.servers(owner).values()
        await asyncio.gather(*(server.wait_started(timeout_s) for server in servers))

    async def close(self) -> None:
        self._closed = True
        owned = [server for mine in self._owned.values() for server in mine.values()]
        self._owned.clear()
        shared = list((self._shared or {}).values())
        await asyncio.gather(*(server.stop() for server in (*shared, *owned)))


def _server(name: str, config: McpServerConfig, log_file: Path | None) -> McpServer:
    from orchestrator.mcp.server import McpServer

    return McpServer(name, config, log_file)
