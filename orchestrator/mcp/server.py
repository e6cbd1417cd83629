"""One MCP server, kept running by the orchestrator on the host (docs/mcp.md).

A runner task owns the connection: it enters the SDK's transport (a stdio child, or streamable
HTTP) and ``ClientSession`` in one task, as anyio needs, reads what the server offers (tools,
resources, prompts), then watches it with a ping. When the server crashes (its stream closes,
a ping fails, a call finds the connection closed) the runner starts it again after a backoff:
``RESTART_BASE_DELAY_S`` doubling up to ``RESTART_MAX_DELAY_S``, back to the base once a start
has held for ``RESTART_RESET_AFTER_S``. Meanwhile a call is refused at once with
``McpError("mcp_unavailable")`` and its ``retry_after``.

A server that says its tools, resources or prompts changed (a ``list_changed`` notification)
has them read again; the kernel sees them at its next look at the catalog.

The child's environment is the SDK's short safe list plus the server's own ``env``: the
orchestrator's provider keys do not leak into a server that was not given them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, Literal, TextIO, TypeVar

import anyio
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import AnyUrl

from orchestrator.errors import McpError as ServerCallError
from orchestrator.file_modes import PRIVATE_FILE_MODE
from orchestrator.mcp.results import catalog_json, prompt_json, resource_json, tool_json
from orchestrator.mcp_config import McpServerConfig
from orchestrator.paths import ensure_private_dir

__all__ = [
    "PING_INTERVAL_S",
    "RESTART_BASE_DELAY_S",
    "RESTART_MAX_DELAY_S",
    "START_TIMEOUT_S",
    "McpServer",
    "ServerState",
    "ServerStatus",
    "restart_delay",
]

log = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 30.0  # connect, initialize and list what it offers
PING_INTERVAL_S: Final = 5.0  # a crash with no call in flight is seen within this
PING_TIMEOUT_S: Final = 10.0
RESTART_BASE_DELAY_S: Final = 0.5
RESTART_MAX_DELAY_S: Final = 30.0
RESTART_RESET_AFTER_S: Final = 60.0  # a start that held this long resets the backoff
LIST_PAGES_MAX: Final = 20  # pages of tools (or resources, prompts) read from one server
ERROR_TEXT_MAX_CHARS: Final = 2000
STOP_TIMEOUT_S: Final = 10.0

ServerState = Literal["starting", "ready", "down", "stopped"]
_LIST_CHANGED = (
    types.ToolListChangedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
)
_T = TypeVar("_T")


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: ServerState
    transport: str
    restarts: int
    last_error: str | None
    retry_in_s: float | None


class McpServer:
    """One configured server: ``start()`` once, then ``call_tool`` / ``read_resource`` /
    ``get_prompt`` from any task; ``stop()`` ends the runner and the child."""

    def __init__(self, name: str, config: McpServerConfig, log_file: Path | None = None) -> None:
        self.name = name
        self.config = config
        self.log_file = log_file  # a stdio server's stderr (None: this process's stderr)
        self.state: ServerState = "stopped"
        self.restarts = 0  # starts after the first
        self.last_error: str | None = None
        self.catalog: dict[str, Any] = {"tools": [], "resources": [], "prompts": []}
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()  # set while a session is up
        self._settled = asyncio.Event()  # set after each first-or-failed start
        self._broken = asyncio.Event()  # a call saw the connection close
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # set with _broken or _stopping: the watch looks again
        self._stale = False  # the server said its tools (resources, prompts) changed
        self._offers = types.ServerCapabilities()
        self.catalog_changes = 0  # catalogs read again after a list_changed notification
        self._retry_at: float | None = None
        self._runner: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._runner is None:
            self.state = "starting"
            self._runner = asyncio.create_task(self._run(), name=f"mcp-{self.name}")

    async def wait_started(self, timeout_s: float) -> None:
        """Until the first start succeeded or failed (or ``timeout_s`` passed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._settled.wait()

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await asyncio.shield(runner)
            except TimeoutError:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
        self.state = "stopped"

    def status(self) -> ServerStatus:
        retry = None
        if self.state == "down" and self._retry_at is not None:
            retry = max(0.0, self._retry_at - time.monotonic())
        return ServerStatus(
            self.name, self.state, self.config.transport, self.restarts, self.last_error, retry
        )

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        config = self.config
        async with contextlib.AsyncExitStack() as stack:
            if config.command is not None:
                params = StdioServerParameters(
                    command=config.command,
                    args=list(config.args),
                    env={**get_default_environment(), **config.env},
                    cwd=config.cwd,
                )
                errlog = sys.stderr
                if self.log_file is not None:
                    errlog = stack.enter_context(_open_log(self.log_file))
                read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
            else:
                http = await stack.enter_async_context(
                    create_mcp_http_client(headers=dict(config.headers))
                )
                read, write, _ = await stack.enter_async_context(
                    streamable_http_client(str(config.url), http_client=http)
                )
            yield await stack.enter_async_context(
                ClientSession(read, write, message_handler=self._on_message)
            )

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                async with self._connect() as session:
                    async with asyncio.timeout(START_TIMEOUT_S):
                        await self._open(session)
                    self._session = session
                    self.state = "ready"
                    self._retry_at = None
                    self._ready.set()
                    self._settled.set()
                    log.info("mcp server %s is up (%s)", self.name, self.config.describe())
                    await self._watch(session)
            except BaseException as exc:  # anyio groups: ExceptionGroup, BaseExceptionGroup
                task = asyncio.current_task()
                if isinstance(exc, KeyboardInterrupt | SystemExit) or (
                    task is not None and task.cancelling()
                ):
                    raise
                if not self._stopping.is_set() and not self._broken.is_set():
                    self.last_error = _describe(exc)
                    log.warning("mcp server %s failed: %s", self.name, self.last_error)
            finally:
                self._session = None
                self._ready.clear()
                self._broken.clear()
                self._wake.clear()
            if self._stopping.is_set():
                break
            if time.monotonic() - started >= RESTART_RESET_AFTER_S:
                failures = 0
            delay = restart_delay(failures)
            failures += 1
            self.state = "down"
            self._retry_at = time.monotonic() + delay
            self._settled.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            if not self._stopping.is_set():
                self.restarts += 1
                self.state = "starting"

    async def _open(self, session: ClientSession) -> None:
        self._offers = (await session.initialize()).capabilities
        await self._list(session)

    async def _list(self, session: ClientSession) -> None:
        offers = self._offers
        tools = await _pages(session.list_tools, lambda r: r.tools) if offers.tools else []
        resources = (
            await _pages(session.list_resources, lambda r: r.resources) if offers.resources else []
        )
        prompts = await _pages(session.list_prompts, lambda r: r.prompts) if offers.prompts else []
        self.catalog = catalog_json(tools, resources, prompts)

    async def _on_message(self, message: Any) -> None:
        """The server's own messages: a changed list of tools, resources or prompts is read
        again by the watch (not here: this runs in the session's receive loop, which a
        request's answer must pass through)."""
        root = getattr(message, "root", None)
        if isinstance(root, _LIST_CHANGED):
            self._stale = True
            self._wake.set()

    async def _watch(self, session: ClientSession) -> None:
        """Until a stop, a call that saw the connection close, or a failed ping; reads the
        catalog again when the server says it changed."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PING_INTERVAL_S):
                    await self._wake.wait()
            if self._broken.is_set():
                raise ConnectionError("the connection closed during a call")
            if self._stopping.is_set():
                return
            if self._stale:
                self._stale = False
                self._wake.clear()
                async with asyncio.timeout(START_TIMEOUT_S):
                    await self._list(session)
                self.catalog_changes += 1
                continue
            async with asyncio.timeout(PING_TIMEOUT_S):
                await session.send_ping()

    # -- calls --------------------------------------------------------------------------------

    def _live(self) -> ClientSession:
        session = self._session
        if session is None or not self._ready.is_set() or self._broken.is_set():
            retry = self.status().retry_in_s
            why = f": {self.last_error}" if self.last_error else ""
            raise ServerCallError(
                "mcp_unavailable",
                f"the MCP server {self.name} is {self.state}{why}",
                retry_after=retry,
            )
        return session

    def _mark_broken(self, why: str) -> None:
        """A call saw the connection gone: refuse calls now; the runner restarts it."""
        if not self._broken.is_set():
            self._broken.set()
            self._wake.set()
            self.state = "down"
            self.last_error = why
            self._retry_at = time.monotonic() + RESTART_BASE_DELAY_S

    async def _call(self, what: str, timeout_s: float, make: Callable[[], Awaitable[_T]]) -> _T:
        self._live()
        try:
            async with asyncio.timeout(timeout_s):
                return await make()
        except TimeoutError:
            raise ServerCallError(
                "mcp_timeout", f"{self.name}: {what} did not answer within {timeout_s:g} s"
            ) from None
        except McpError as exc:
            if exc.error.code == types.CONNECTION_CLOSED:
                self._mark_broken(f"exited during {what}")
                raise ServerCallError(
                    "mcp_unavailable",
                    f"the MCP server {self.name} exited during {what}; it is being restarted",
                    retry_after=RESTART_BASE_DELAY_S,
                ) from None
            raise ServerCallError(
                "invalid_argument", f"{self.name}: {what}: {exc.error.message}"
            ) from None
        except (OSError, EOFError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            self._mark_broken(f"failed during {what}")
            raise ServerCallError(
                "mcp_unavailable",
                f"the MCP server {self.name} failed during {what}: {_describe(exc)}",
                retry_after=RESTART_BASE_DELAY_S,
            ) from None

    async def call_tool(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        session = self._live()
        result = await self._call(
            f"tool {tool}",
            timeout_s,
            lambda: session.call_tool(
                tool, arguments, read_timeout_seconds=timedelta(seconds=timeout_s)
            ),
        )
        return tool_json(result)

    async def read_resource(self, uri: str, timeout_s: float) -> Any:
        session = self._live()
        result = await self._call(
            f"resource {uri}", timeout_s, lambda: session.read_resource(AnyUrl(uri))
        )
        return resource_json(result)

    async def get_prompt(self, prompt: str, arguments: dict[str, str], timeout_s: float) -> Any:
        session = self._live()
        result = await self._call(
            f"prompt {prompt}", timeout_s, lambda: session.get_prompt(prompt, arguments)
        )
        return prompt_json(result)


async def _pages(
    list_page: Callable[..., Awaitable[Any]], items: Callable[[Any], list[_T]]
) -> list[_T]:
    out: list[_T] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES_MAX):
        page = await list_page(cursor)
        out += items(page)
        cursor = page.nextCursor
        if not cursor:
            break
    return out


def _open_log(path: Path) -> TextIO:
    """``path`` for appending, private to the user (a server may log what it was given)."""
    ensure_private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE_MODE)
    return os.fdopen(fd, "a", encoding="utf-8", errors="replace")


def restart_delay(failures: int) -> float:
    """The wait before the next start after ``failures`` failed starts in a row (0 first)."""
    return float(min(RESTART_MAX_DELAY_S, RESTART_BASE_DELAY_S * 2 ** min(failures, 32)))


def _describe(exc: BaseException) -> str:
    """The innermost useful line of a failure (anyio wraps them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:ERROR_TEXT_MAX_CHARS] if text else type(exc).__name__
