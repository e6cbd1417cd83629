"""``mcp``: the MCP servers the orchestrator runs for this session, as modules (in the kernel).

The servers run on the host, never in the sandbox: their secrets stay there (docs/mcp.md).
This module knows only what the host tells it (``mcp.list``) and sends every call as a host
request; it imports no MCP library.

- ``mcp`` lists the servers (``print(mcp)``; ``list(mcp)`` gives their names).
- ``mcp.NAME`` is a module-like object: each tool is an attribute, an ``async`` function whose
  keyword parameters come from the tool's JSON schema and whose docstring is the tool's
  description. ``help(mcp.NAME)`` shows them all.
- ``await mcp.NAME.TOOL(**args)`` returns the structured result when the tool gives one, else
  the text, else the content blocks (dicts). An error result raises ``McpToolError``; a server
  that is down raises ``McpUnavailable`` (``retry_after``: when it is tried again); no answer
  within the timeout raises ``McpTimeout``.
- ``await mcp.NAME.call(tool, arguments=None, timeout=None)``: any tool by its own name.
- ``await mcp.NAME.read(uri)``: a resource's contents (text, or dicts for binary parts);
  ``mcp.NAME.resources`` lists them.
- ``await mcp.NAME.prompt(name, **arguments)``: a prompt's messages; ``mcp.NAME.prompts``.
- ``await mcp.refresh()``: read the catalog again (a restarted server may offer new tools).

A call waits ``MCP_CALL_TIMEOUT_S`` unless given ``timeout``; the cell's own timeout stops it
sooner, and then the kernel tells the host to cancel the call (``mcp.cancel``).

Wire shapes (``args`` -> ``result``):

- ``mcp.list``: ``{}`` -> ``{servers: [{name, state, transport, restarts, last_error?,
  retry_in_s?, tools: [{name, description, input_schema, output_schema?}], resources: [{uri,
  name, description, mime_type?}], prompts: [{name, description, arguments: [{name,
  description, required}]}]}]}``
- ``mcp.call_tool``: ``{server, tool, arguments, call_id, timeout}`` -> ``{is_error, structured,
  content: [block]}``; a block is ``{type: "text", text}``, ``{type: "image" | "audio",
  mime_type, data}``, ``{type: "resource", uri, mime_type, text | blob}`` or another dict
- ``mcp.read_resource``: ``{server, uri, call_id, timeout}`` -> ``{contents: [{uri, mime_type,
  text | blob}]}``
- ``mcp.get_prompt``: ``{server, prompt, arguments, call_id, timeout}`` -> ``{description,
  messages: [{role, content: block}]}``
- ``mcp.cancel``: ``{call_id}`` -> ``{cancelled}``
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import keyword
import re
import threading
import types
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Final

from orchestrator.runtime.arguments import check_timeout
from orchestrator.runtime.errors import (
    HostError,
    InternalHostError,
    InvalidArgument,
    McpTimeout,
    McpToolError,
    McpUnavailable,
    NotFound,
)
from orchestrator.runtime.host import HostBound, HostClient
from orchestrator.runtime.wire import MCP_CALL_TIMEOUT_MAX_S, MCP_CALL_TIMEOUT_S

__all__ = ["Mcp", "McpServerModule", "mcp"]

LIST_TIMEOUT_S: Final = 30.0
CANCEL_TIMEOUT_S: Final = 5.0
# The kernel waits this much past the call's own timeout: the host's answer (``McpTimeout``)
# says more than the kernel's ``HostTimeout`` would.
REPLY_SLACK_S: Final = 5.0
# Attributes of a server module that are not tools (a tool of that name is reached by .call).
RESERVED: Final = frozenset(
    {"call", "read", "prompt", "tools", "resources", "prompts", "name", "state"}
)
_NOT_IDENTIFIER = re.compile(r"\W")
_JSON_TYPES: Final = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}
_pending_cancels: set[asyncio.Task[Any]] = set()


def _python_name(name: str) -> str:
    out = _NOT_IDENTIFIER.sub("_", name)
    if not out or out[0].isdigit() or keyword.iskeyword(out):
        out = "_" + out
    return out


def _type_name(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "Any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_JSON_TYPES.get(str(k), str(k)) for k in kind)
    if isinstance(kind, str):
        return _JSON_TYPES.get(kind, kind)
    options = schema.get("anyOf")
    if isinstance(options, list):
        return " | ".join(_type_name(option) for option in options)
    return "Any"


def _result_of(reply: Any, output_schema: Any) -> Any:
    """Structured content first (unwrapped from FastMCP's ``{"result": x}`` for a tool whose
    output schema has that one property), else the text, else the blocks."""
    if not isinstance(reply, dict):
        raise InternalHostError("the orchestrator sent an MCP result that is not an object")
    structured = reply.get("structured")
    if structured is not None:
        props = output_schema.get("properties") if isinstance(output_schema, dict) else None
        if isinstance(props, dict) and set(props) == {"result"} and isinstance(structured, dict):
            return structured.get("result")
        return structured
    blocks = reply.get("content")
    if not isinstance(blocks, list):
        return None
    if all(isinstance(b, dict) and b.get("type") == "text" for b in blocks):
        return "\n".join(str(b.get("text", "")) for b in blocks)
    return blocks


class _ToolSpec:
    """One tool's schema: the signature, the docstring and the argument check."""

    def __init__(self, server: str, spec: Mapping[str, Any]) -> None:
        self.server = server
        self.tool = str(spec.get("name", ""))
        schema = spec.get("input_schema")
        self.schema: dict[str, Any] = schema if isinstance(schema, dict) else {}
        self.output_schema = spec.get("output_schema")
        props = self.schema.get("properties")
        self.props: dict[str, Any] = props if isinstance(props, dict) else {}
        required = self.schema.get("required")
        self.required = [str(r) for r in required] if isinstance(required, list) else []
        self.python_name = _python_name(self.tool)
        self.description = inspect.cleandoc(str(spec.get("description") or ""))

    def signature(self) -> inspect.Signature:
        params: list[inspect.Parameter] = []
        names_ok = all(
            isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n) for n in self.props
        )
        if names_ok:
            ordered = [n for n in self.required if n in self.props]
            ordered += [n for n in self.props if n not in ordered]
            for name in ordered:
                prop = self.props[name]
                default = (
                    inspect.Parameter.empty
                    if name in self.required
                    else (prop.get("default") if isinstance(prop, dict) else None)
                )
                params.append(
                    inspect.Parameter(
                        name,
                        inspect.Parameter.KEYWORD_ONLY,
                        default=default,
                        annotation=_annotation(prop),
                    )
                )
        if not names_ok or self.open:
            params.append(inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD))
        return inspect.Signature(params)

    @property
    def open(self) -> bool:
        """Whether arguments the schema does not name are allowed."""
        return self.schema.get("additionalProperties") is True or "properties" not in self.schema

    def doc(self) -> str:
        lines = [self.description or "(no description)"]
        if self.props:
            lines += ["", "Arguments:"]
            for name, prop in self.props.items():
                about = prop.get("description", "") if isinstance(prop, dict) else ""
                need = "required" if name in self.required else "optional"
                tail = f": {about}" if about else ""
                lines.append(f"  {name} ({_type_name(prop)}, {need}){tail}")
        return "\n".join(lines)

    def check(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        where = f"mcp.{self.server}.{self.python_name}"
        unknown = [k for k in kwargs if k not in self.props]
        if unknown and not self.open:
            allowed = ", ".join(self.props) or "none"
            raise TypeError(
                f"{where}() got unknown arguments {', '.join(unknown)}; allowed: {allowed}"
            )
        missing = [name for name in self.required if name not in kwargs]
        if missing:
            raise TypeError(f"{where}() is missing required arguments: {', '.join(missing)}")
        return kwargs


def _annotation(schema: Any) -> Any:
    kinds = {"string": str, "integer": int, "number": float, "boolean": bool}
    kinds |= {"array": list, "object": dict, "null": type(None)}
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kinds.get(kind, Any) if isinstance(kind, str) else Any


def _tool_function(server: McpServerModule, spec: _ToolSpec) -> Callable[..., Any]:
    """A plain function (so ``help`` lists it) returning the call's coroutine: the
    arguments are checked when it is called, before anything is awaited or sent."""

    def tool(**kwargs: Any) -> Coroutine[Any, Any, Any]:
        arguments = spec.check(kwargs)
        return server._call_tool(spec.tool, arguments, None, spec.output_schema)

    tool.__name__ = spec.python_name
    tool.__qualname__ = f"mcp.{server.name}.{spec.python_name}"
    tool.__doc__ = spec.doc()
    tool.__module__ = server.__name__
    tool.__signature__ = spec.signature()  # type: ignore[attr-defined]
    return tool


class McpServerModule(types.ModuleType):
    """One MCP server: its tools as attributes (``await mcp.NAME.TOOL(**args)``)."""

    def __init__(self, owner: Mcp, entry: Mapping[str, Any]) -> None:
        self.name = str(entry.get("name", ""))
        super().__init__(f"mcp.{self.name}")
        self._owner = owner
        self._missed: set[str] = set()
        self.state = str(entry.get("state", ""))
        self.tools: dict[str, Any] = {}
        tool_lines: list[str] = []
        exported: list[str] = []
        for raw in entry.get("tools") or []:
            if not isinstance(raw, dict):
                continue
            spec = _ToolSpec(self.name, raw)
            self.tools[spec.tool] = raw
            if spec.python_name not in RESERVED:
                setattr(self, spec.python_name, _tool_function(self, spec))
                exported.append(spec.python_name)
            first = (spec.description or "(no description)").splitlines()[0]
            tool_lines.append(f"  {spec.python_name}{spec.signature()}: {first}")
        self.__all__ = exported
        self.resources: list[dict[str, Any]] = [
            r for r in entry.get("resources") or [] if isinstance(r, dict)
        ]
        self.prompts: list[dict[str, Any]] = [
            p for p in entry.get("prompts") or [] if isinstance(p, dict)
        ]
        self.__doc__ = self._doc(entry, tool_lines)

    def _doc(self, entry: Mapping[str, Any], tool_lines: list[str]) -> str:
        lines = [
            f"MCP server {self.name} ({entry.get('transport', '?')}, {self.state}), run by the "
            "orchestrator on the host. Call a tool with `await mcp.NAME.TOOL(**args)`.",
        ]
        if entry.get("last_error"):
            lines.append(f"Last error: {entry['last_error']}")
        lines += ["", "Tools:", *(tool_lines or ["  (none)"])]
        if self.resources:
            lines += ["", "Resources (await mcp.NAME.read(uri)):"]
            lines += [
                f"  {r.get('uri')}: {r.get('description') or r.get('name')}" for r in self.resources
            ]
        if self.prompts:
            lines += ["", "Prompts (await mcp.NAME.prompt(name, **arguments)):"]
            for p in self.prompts:
                names = ", ".join(str(a.get("name")) for a in p.get("arguments") or [])
                lines.append(f"  {p.get('name')}({names}): {p.get('description', '')}")
        return "\n".join(lines)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        # Not in the catalog this module was made from: the server may have added the tool
        # since (a list_changed notification); read the catalog again, once per name (tools
        # such as IPython probe attributes that no server has).
        if name in self._missed:
            fresh = None
        else:
            self._missed.add(name)
            fresh = self._owner._reload().get(self.name)
        if fresh is not None and name in vars(fresh):
            return vars(fresh)[name]
        known = fresh.tools if fresh is not None else self.tools
        names = ", ".join(sorted(_python_name(t) for t in known)) or "none"
        raise AttributeError(f"MCP server {self.name} has no tool {name!r} (tools: {names})")

    def __repr__(self) -> str:
        tools = len(self.tools)
        return f"<MCP server {self.name}: {self.state}, {tools} tools; help(mcp.{self.name})>"

    # -- calls -----------------------------------------------------------------------------

    def call(
        self, tool: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Call ``tool`` by its own name with ``arguments`` (a dict)."""
        if not isinstance(tool, str) or not tool:
            raise InvalidArgument("mcp call: tool must be a non-empty string")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise TypeError("mcp call: arguments must be a dict")
        wait = check_timeout(f"mcp.{self.name}.call", timeout)
        spec = self.tools.get(tool, {})
        return self._call_tool(tool, dict(arguments or {}), wait, spec.get("output_schema"))

    async def _call_tool(
        self, tool: str, arguments: dict[str, Any], timeout: float | None, output_schema: Any
    ) -> Any:
        reply = await self._owner._request(
            "mcp.call_tool", {"server": self.name, "tool": tool, "arguments": arguments}, timeout
        )
        return _result_of(reply, output_schema)

    async def read(self, uri: str, *, timeout: float | None = None) -> Any:
        """A resource's contents: the text when it is all text, else the parts as dicts."""
        if not isinstance(uri, str) or not uri:
            raise InvalidArgument("mcp read: uri must be a non-empty string")
        wait = check_timeout(f"mcp.{self.name}.read", timeout)
        reply = await self._owner._request(
            "mcp.read_resource", {"server": self.name, "uri": uri}, wait
        )
        contents = reply.get("contents") if isinstance(reply, dict) else None
        if not isinstance(contents, list):
            raise InternalHostError("the orchestrator sent a resource without contents")
        if all(isinstance(c, dict) and "text" in c for c in contents):
            return "\n".join(str(c["text"]) for c in contents)
        return contents

    async def prompt(self, name: str, *, timeout: float | None = None, **arguments: str) -> Any:
        """A prompt's messages: ``[{role, content}]``, ``content`` a block dict."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument("mcp prompt: name must be a non-empty string")
        if not all(isinstance(v, str) for v in arguments.values()):
            raise TypeError("mcp prompt: prompt arguments must be strings")
        wait = check_timeout(f"mcp.{self.name}.prompt", timeout)
        reply = await self._owner._request(
            "mcp.get_prompt", {"server": self.name, "prompt": name, "arguments": arguments}, wait
        )
        messages = reply.get("messages") if isinstance(reply, dict) else None
        if not isinstance(messages, list):
            raise InternalHostError("the orchestrator sent a prompt without messages")
        return messages


class Mcp(HostBound):
    """The MCP servers of this session: ``print(mcp)`` lists them, ``mcp.NAME`` is one,
    ``help(mcp.NAME)`` shows its tools, ``await mcp.NAME.TOOL(**args)`` calls one.

    Its errors, to catch: ``mcp.ToolError`` (the tool reported an error), ``mcp.Unavailable``
    (the server is down; ``retry_after``), ``mcp.Timeout`` (no answer in time)."""

    ToolError = McpToolError
    Unavailable = McpUnavailable
    Timeout = McpTimeout

    def __init__(self, client: HostClient | None = None) -> None:
        super().__init__(client)
        self._entries: list[dict[str, Any]] | None = None
        self._modules: dict[str, McpServerModule] = {}

    # -- the catalog ------------------------------------------------------------------------

    def _load(self, result: Any) -> None:
        servers = result.get("servers") if isinstance(result, dict) else None
        if not isinstance(servers, list):
            raise InternalHostError("the orchestrator sent an MCP catalog without servers")
        self._entries = [s for s in servers if isinstance(s, dict)]
        self._modules = {str(s.get("name")): McpServerModule(self, s) for s in self._entries}

    def _reload(self) -> dict[str, McpServerModule]:
        self._entries = None
        return self._catalog()

    async def refresh(self) -> Mcp:
        """Read the servers and their tools again from the host."""
        self._load(await self._client().request("mcp.list", {}, timeout=LIST_TIMEOUT_S))
        return self

    def _catalog(self) -> dict[str, McpServerModule]:
        """The catalog, read once (synchronously: attribute access cannot await; the request
        runs on a thread's own loop, as a cell's event loop is busy running the cell)."""
        if self._entries is None:
            box: dict[str, Any] = {}

            def fetch() -> None:
                try:
                    box["result"] = asyncio.run(
                        self._client().request("mcp.list", {}, timeout=LIST_TIMEOUT_S)
                    )
                except BaseException as exc:
                    box["error"] = exc

            thread = threading.Thread(target=fetch, name="mcp-catalog", daemon=True)
            thread.start()
            thread.join()
            if "error" in box:
                raise box["error"]
            self._load(box["result"])
        return self._modules

    def __getattr__(self, name: str) -> McpServerModule:
        if name.startswith("_"):
            raise AttributeError(name)
        found = self._catalog().get(name)
        if found is None:
            found = self._reload().get(name)  # a server of the family added since
        if found is None:
            names = ", ".join(sorted(self._modules)) or "none"
            raise AttributeError(f"no MCP server {name!r} in this session (servers: {names})")
        return found

    def __getitem__(self, name: str) -> McpServerModule:
        return self.__getattr__(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._catalog()))

    def __len__(self) -> int:
        return len(self._catalog())

    def __dir__(self) -> list[str]:
        try:
            names = list(self._catalog())
        except HostError:
            names = []
        return sorted({*names, "refresh"})

    def __repr__(self) -> str:
        try:
            modules = self._catalog()
        except HostError as exc:
            return f"<mcp: the servers cannot be listed: {exc}>"
        if not modules:
            return "<mcp: no MCP servers in this session>"
        lines = ["MCP servers (await mcp.NAME.TOOL(**args); help(mcp.NAME) for details):"]
        for module in modules.values():
            tools = ", ".join(_python_name(t) for t in module.tools) or "no tools"
            lines.append(f"  mcp.{module.name} [{module.state}]: {tools}")
        return "\n".join(lines)

    # -- requests ---------------------------------------------------------------------------

    async def _request(self, request_type: str, args: dict[str, Any], timeout: float | None) -> Any:
        wait = min(timeout if timeout is not None else MCP_CALL_TIMEOUT_S, MCP_CALL_TIMEOUT_MAX_S)
        call_id = uuid.uuid4().hex
        client = self._client()
        try:
            return await client.request(
                request_type,
                {**args, "call_id": call_id, "timeout": wait},
                timeout=wait + REPLY_SLACK_S,
            )
        except (asyncio.CancelledError, KeyboardInterrupt):
            # The cell was interrupted (its timeout, or the user): the host stops the call.
            _cancel_later(client, call_id)
            raise
        except McpUnavailable:
            self._entries = None  # a restarted server may offer other tools: read them again
            raise
        except NotFound:
            self._entries = None
            raise


def _cancel_later(client: HostClient, call_id: str) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(_cancel(client, call_id))
    _pending_cancels.add(task)
    task.add_done_callback(_pending_cancels.discard)


async def _cancel(client: HostClient, call_id: str) -> None:
    with contextlib.suppress(HostError):  # the host bounds the call by its timeout anyway
        await client.request("mcp.cancel", {"call_id": call_id}, timeout=CANCEL_TIMEOUT_S)


mcp = Mcp()
