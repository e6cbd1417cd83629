"""Host requests ``mcp.*`` from kernels: MCP servers run on the host (docs/mcp.md).

The caller is the session whose NATS subject the request came on; it sees the config's
servers and its family's own (``McpHub.servers(root id)``). Each tool call, resource read and
prompt read is recorded as an ``mcp_call`` event in the caller's history, whatever its end.
A session whose token budget is spent may not call (``budget_exceeded``); a call runs at most
its own timeout, at most the session's cell-timeout ceiling, and ends ``CELL_MARGIN_S`` before
the running cell's timeout (``McpTimeout`` in the cell; the kernel and its namespace stay). A
call the kernel stops waiting for (a cancelled task) is cancelled here (``mcp.cancel``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from orchestrator.bus.request_args import RequestArgs, parse_args
from orchestrator.bus.router import HostRequestError
from orchestrator.errors import McpError
from orchestrator.mcp.hub import McpHub
from orchestrator.runtime.wire import MAX_REQUEST_BYTES, MCP_CALL_TIMEOUT_MAX_S
from orchestrator.sessions.budget import BudgetTree
from orchestrator.sessions.live import LiveSession
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord
from orchestrator.store.events import McpCallPayload

if TYPE_CHECKING:
    from orchestrator.mcp.server import McpServer

__all__ = ["MCP_EVENT_ARGUMENTS_CHARS", "MCP_RESULT_MAX_BYTES", "McpHost", "McpService"]

MCP_EVENT_ARGUMENTS_CHARS: Final = 2000
ERROR_TEXT_CHARS: Final = 2000
CALL_ID_MAX_CHARS: Final = 64
NAME_MAX_CHARS: Final = 256
URI_MAX_CHARS: Final = 4096
# The largest answer sent to the kernel (JSON): as large as a request may be, well under the
# bus's message limit.
MCP_RESULT_MAX_BYTES: Final = MAX_REQUEST_BYTES
CELL_MARGIN_S: Final = 1.0  # a call ends this long before its cell's timeout
MIN_TIMEOUT_S: Final = 0.1

Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]
Kind = Literal["tool", "resource", "prompt"]
Status = Literal["ok", "error", "unavailable", "timeout", "cancelled", "refused"]

_STATUS_OF_CODE: Final[dict[str, Status]] = {
    "mcp_unavailable": "unavailable",
    "mcp_timeout": "timeout",
    "mcp_tool_error": "error",
}


class McpHost(Protocol):
    """What the handlers need of the orchestrator (``Orchestrator``)."""

    @property
    def sessions(self) -> Mapping[str, LiveSession]: ...

    @property
    def mcp(self) -> McpHub: ...

    @property
    def budgets(self) -> BudgetTree: ...

    def settings_of(self, record: SessionRecord) -> Settings: ...

    async def record(self, live: LiveSession, type_: str, payload: Any) -> Any: ...


class _Call(RequestArgs):
    server: str
    call_id: str
    timeout: float | int


class ToolArgs(_Call):
    tool: str
    arguments: dict[str, Any]


class ResourceArgs(_Call):
    uri: str


class PromptArgs(_Call):
    prompt: str
    arguments: dict[str, str]


class CancelArgs(RequestArgs):
    call_id: str


class ListArgs(RequestArgs):
    pass


def _text_of(result: dict[str, Any]) -> str:
    texts = [str(b.get("text", "")) for b in result.get("content", []) if b.get("type") == "text"]
    return "\n".join(texts)[:ERROR_TEXT_CHARS] or "the tool reported an error"


class McpService:
    """The ``mcp.*`` handlers over an ``McpHost``."""

    def __init__(self, orch: McpHost) -> None:
        self.orch = orch
        self._calls: dict[tuple[str, str], asyncio.Task[Any]] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "mcp.list": self.list,
            "mcp.call_tool": self.call_tool,
            "mcp.read_resource": self.read_resource,
            "mcp.get_prompt": self.get_prompt,
            "mcp.cancel": self.cancel,
        }

    def in_flight(self) -> int:
        """Calls running now, every session together (for tests and diagnostics)."""
        return len(self._calls)

    def _caller(self, session_id: str) -> LiveSession:
        live = self.orch.sessions.get(session_id)
        if live is None or live.state == "deleted":
            raise HostRequestError("not_found", f"session {session_id} is not live here")
        return live

    def _server(self, live: LiveSession, name: str) -> McpServer:
        servers = self.orch.mcp.servers(live.record.root_id)
        found = servers.get(name)
        if found is None:
            names = ", ".join(sorted(servers)) or "none"
            raise HostRequestError(
                "not_found", f"no MCP server {name!r} in this session (servers: {names})"
            )
        return found

    # -- handlers ---------------------------------------------------------------------------

    async def list(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        live = self._caller(caller_id)
        parse_args(ListArgs, "mcp.list", args)
        owner = live.record.root_id
        await self.orch.mcp.wait_started(owner)
        out = []
        for server in self.orch.mcp.servers(owner).values():
            status = server.status()
            out.append(
                {
                    "name": server.name,
                    "state": status.state,
                    "transport": status.transport,
                    "restarts": status.restarts,
                    "last_error": status.last_error,
                    "retry_in_s": status.retry_in_s,
                    **server.catalog,
                }
            )
        return {"servers": out}

    async def call_tool(self, caller_id: str, args: dict[str, Any]) -> Any:
        a = parse_args(ToolArgs, "mcp.call_tool", args)
        live, server = self._target(caller_id, a)
        result = await self._run(
            live,
            a,
            "tool",
            a.tool,
            a.arguments,
            lambda timeout: server.call_tool(a.tool, a.arguments, timeout),
        )
        return result

    async def read_resource(self, caller_id: str, args: dict[str, Any]) -> Any:
        a = parse_args(ResourceArgs, "mcp.read_resource", args)
        live, server = self._target(caller_id, a)
        return await self._run(
            live, a, "resource", a.uri, None, lambda timeout: server.read_resource(a.uri, timeout)
        )

    async def get_prompt(self, caller_id: str, args: dict[str, Any]) -> Any:
        a = parse_args(PromptArgs, "mcp.get_prompt", args)
        live, server = self._target(caller_id, a)
        return await self._run(
            live,
            a,
            "prompt",
            a.prompt,
            a.arguments,
            lambda timeout: server.get_prompt(a.prompt, a.arguments, timeout),
        )

    async def cancel(self, caller_id: str, args: dict[str, Any]) -> dict[str, Any]:
        a = parse_args(CancelArgs, "mcp.cancel", args)
        task = self._calls.get((caller_id, a.call_id))
        if task is None or task.done():
            return {"cancelled": False}
        task.cancel()
        return {"cancelled": True}

    # -- one call ---------------------------------------------------------------------------

    def _target(self, caller_id: str, a: _Call) -> tuple[LiveSession, McpServer]:
        live = self._caller(caller_id)
        if not 0 < len(a.call_id) <= CALL_ID_MAX_CHARS:
            raise HostRequestError("invalid_argument", "call_id must be 1..64 characters")
        if not 0 < a.timeout <= MCP_CALL_TIMEOUT_MAX_S:
            raise HostRequestError(
                "invalid_argument", f"timeout must be in (0, {MCP_CALL_TIMEOUT_MAX_S:g}] seconds"
            )
        return live, self._server(live, a.server)

    def _bound(self, live: LiveSession, asked: float) -> float:
        """The call's timeout: what the kernel asked, at most the cell-timeout ceiling, and
        ending ``CELL_MARGIN_S`` before the running cell's own timeout, so the cell gets
        ``McpTimeout`` instead of an interrupt (which restarts a kernel stuck in an await)."""
        timeout = min(asked, self.orch.settings_of(live.record).cell_timeout_ceiling_s)
        deadline = live.loop.cell_deadline if live.loop is not None else None
        if deadline is not None:
            left = deadline - time.monotonic() - CELL_MARGIN_S
            timeout = min(timeout, max(left, MIN_TIMEOUT_S))
        return timeout

    async def _run(
        self,
        live: LiveSession,
        a: _Call,
        kind: Kind,
        name: str,
        arguments: dict[str, Any] | None,
        make: Callable[[float], Awaitable[Any]],
    ) -> Any:
        if len(name) > (URI_MAX_CHARS if kind == "resource" else NAME_MAX_CHARS):
            raise HostRequestError("invalid_argument", f"the {kind} name is too long")
        shown = _arguments_text(arguments)
        started = time.monotonic()

        async def finish(status: Status, error: str | None = None) -> None:
            payload = McpCallPayload(
                server=a.server,
                kind=kind,
                name=name,
                status=status,
                duration_ms=(time.monotonic() - started) * 1000.0,
                arguments=shown,
                error=error,
            )
            await self.orch.record(live, "mcp_call", payload)

        problem = self.orch.budgets.exhausted(live.id)
        if problem is not None:
            await finish("refused", problem)
            raise HostRequestError("budget_exceeded", problem)
        timeout = self._bound(live, float(a.timeout))
        key = (live.id, a.call_id)
        if key in self._calls:
            raise HostRequestError("invalid_argument", f"call {a.call_id} is already running")
        task = asyncio.ensure_future(make(timeout))
        self._calls[key] = task
        try:
            result = await asyncio.shield(task)
        except McpError as exc:
            await finish(_STATUS_OF_CODE.get(exc.code, "error"), str(exc))
            raise HostRequestError(exc.code, str(exc), exc.retry_after) from None
        except asyncio.CancelledError:
            if not task.cancelled():
                task.cancel()  # the router is closing: the call goes with it
                raise
            await asyncio.shield(finish("cancelled", "the kernel cancelled the call"))
            raise HostRequestError(
                "mcp_timeout", f"{a.server}: the call was cancelled (its cell ended)"
            ) from None
        finally:
            self._calls.pop(key, None)
        if isinstance(result, dict) and result.get("is_error"):
            text = _text_of(result)
            await finish("error", text)
            raise HostRequestError("mcp_tool_error", f"{a.server}.{name}: {text}")
        size = len(json.dumps(result, ensure_ascii=False).encode())
        if size > MCP_RESULT_MAX_BYTES:
            text = (
                f"{a.server}.{name} answered {size} bytes, more than the {MCP_RESULT_MAX_BYTES} "
                "a reply to the kernel carries; ask it for less (a page, a range, a filter)"
            )
            await finish("error", text)
            raise HostRequestError("mcp_tool_error", text)
        await finish("ok")
        return result


def _arguments_text(arguments: dict[str, Any] | None) -> str | None:
    if arguments is None:
        return None
    try:
        text = json.dumps(arguments, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(arguments)
    return text[:MCP_EVENT_ARGUMENTS_CHARS]
