"""A scripted OpenAI-compatible HTTP server: the only fake part of the system under test.

Tests talk to it through litellm (litellm → HTTP on loopback → this server), so everything on
the wire is what a real OpenAI-compatible server sends: ``chat.completion`` JSON, SSE
``chat.completion.chunk`` events over chunked transfer encoding ending in ``data: [DONE]``,
native tool-call deltas, ``usage``, and OpenAI-shaped error bodies with real status codes and
``Retry-After`` headers. Each ``POST /v1/chat/completions`` consumes the next step of a script
(see ``orchestrator.testing.script`` and docs/testing.md)::

    with FakeModelServer('''
        code: print(6 * 7)
        ---
        when "42": text: The answer is 42.
    ''') as srv:
        ...  # point the client at srv.url ("http://127.0.0.1:PORT/v1")
        assert srv.done and len(srv.requests) == 2

It runs a stdlib ``ThreadingHTTPServer`` in a background thread, so async tests can use it
without blocking their event loop (``async with`` works too). As a program
(``python -m orchestrator.testing.fake_model --script FILE``) it prints one JSON line
``{"url": ...}`` when ready and serves until SIGTERM/SIGINT; ``GET /_requests`` then returns
the recorded request bodies and ``POST /_script`` replaces the script. ``GET /_connection``
reports the options of the connection it came on (``tcp_nodelay``: every accepted socket has
TCP_NODELAY set, so a reply never waits on the client's delayed ACK).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, cast

from orchestrator.testing.script import (
    IPYTHON_TOOL_NAME,
    CallPart,
    CodePart,
    HttpFault,
    Script,
    ScriptCursor,
    ScriptError,
    ScriptRuntimeError,
    Step,
    TextPart,
    ThinkPart,
    fenced_json_call,
    fenced_python,
    parse_script,
)

__all__ = [
    "API_PREFIX",
    "ARGUMENT_DELTA_CHARS",
    "CHARS_PER_TOKEN",
    "DEFAULT_MODEL_ID",
    "FAKE_CONTEXT_WINDOW",
    "GARBAGE_BODY",
    "LOOPBACK_HOST",
    "TEXT_DELTA_CHARS",
    "FakeModelServer",
    "main",
]

LOOPBACK_HOST = "127.0.0.1"
API_PREFIX = "/v1"
DEFAULT_MODEL_ID = "fake"
# Streaming splits text into deltas of this many characters and tool arguments into fragments
# of ARGUMENT_DELTA_CHARS, so clients must reassemble them as they would from a real server.
TEXT_DELTA_CHARS = 6
ARGUMENT_DELTA_CHARS = 10
# Rough token estimate when the script gives no `usage`.
CHARS_PER_TOKEN = 4
# The window quoted in the `overflow` error message.
FAKE_CONTEXT_WINDOW = 8192
# Fixed so that replies are byte-for-byte deterministic.
FAKE_CREATED = 1_700_000_000
SYSTEM_FINGERPRINT = "fp_fake"
MAX_BODY_BYTES = 64 * 1024 * 1024
# Idle keep-alive connections are dropped after this; slow steps do not read, so are unaffected.
IDLE_CONNECTION_TIMEOUT_S = 30.0
# How often the accept loop checks for shutdown; bounds how long close() takes.
SHUTDOWN_POLL_S = 0.05
THREAD_JOIN_TIMEOUT_S = 5.0
# How often the program's main thread checks for a stop signal.
MAIN_POLL_S = 0.2
EXIT_OK = 0
EXIT_BAD_SCRIPT = 2
# A `cut` non-stream reply sends this fraction of its promised body, then closes.
CUT_BODY_FRACTION = 0.5
# A `cut` stream without a count sends this fraction of its deltas (at least one).
CUT_STREAM_FRACTION = 0.5
_CHUNKED_END = b"0\r\n\r\n"
_SSE_DONE = b"data: [DONE]\n\n"
# What ``garbage`` answers with status 200: the error page of a proxy in front of the model,
# sent where a completion belongs (as an SSE ``data:`` line to a streaming request).
GARBAGE_BODY = b"<html><body><h1>502 Bad Gateway</h1>upstream sent junk</body></html>"

# status → (OpenAI error "type", "code", default message)
_ERROR_SHAPES: dict[int, tuple[str, str | None, str]] = {
    HTTPStatus.BAD_REQUEST: ("invalid_request_error", None, "Bad request (scripted)."),
    HTTPStatus.UNAUTHORIZED: (
        "invalid_request_error",
        "invalid_api_key",
        "Bad API key (scripted).",
    ),
    HTTPStatus.FORBIDDEN: ("permission_error", None, "Permission denied (scripted)."),
    HTTPStatus.NOT_FOUND: ("invalid_request_error", "model_not_found", "No such model (scripted)."),
    HTTPStatus.TOO_MANY_REQUESTS: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached (scripted).",
    ),
    HTTPStatus.INTERNAL_SERVER_ERROR: ("server_error", None, "The server had an error (scripted)."),
    HTTPStatus.SERVICE_UNAVAILABLE: ("server_error", None, "The engine is overloaded (scripted)."),
}


# --- wire format ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_calls: tuple[_ToolCall, ...]
    finish_reason: str
    usage: dict[str, Any]
    reasoning: str | None = None  # ``think:`` parts, as ``reasoning_content``


def _estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _message_text(message: object) -> str:
    """The text of a chat message's content: a string, or the text parts of a list."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _uses_native_tools(body: dict[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and body.get("tool_choice") != "none"


def _render(step: Step, request_no: int, body: dict[str, Any]) -> _Reply:
    native = _uses_native_tools(body)
    calls: list[_ToolCall] = []
    segments: list[str] = []
    thoughts: list[str] = []
    for part in step.parts:
        if isinstance(part, TextPart):
            segments.append(part.text)
            continue
        if isinstance(part, ThinkPart):
            thoughts.append(part.text)
            continue
        if isinstance(part, CodePart):
            name, arguments = IPYTHON_TOOL_NAME, json.dumps({"code": part.code})
        else:
            assert isinstance(part, CallPart)
            name, arguments = part.name, part.arguments
        if native:
            calls.append(_ToolCall(f"call_fake_{request_no}_{len(calls)}", name, arguments))
        elif isinstance(part, CodePart):
            segments.append(fenced_python(part.code))
        else:
            segments.append(fenced_json_call(name, arguments))
    content: str | None = "\n\n".join(segments)
    reasoning = "\n\n".join(thoughts) or None
    if not segments and calls:
        content = None  # OpenAI sends null content with tool calls and no prose
    finish = step.finish_reason or ("tool_calls" if calls else "stop")
    produced = (content or "") + "".join(c.name + c.arguments for c in calls)
    prompt_text = json.dumps(body.get("messages", [])) + json.dumps(body.get("tools") or [])
    usage = step.usage
    prompt = usage.prompt_tokens if usage and usage.prompt_tokens is not None else None
    completion = usage.completion_tokens if usage and usage.completion_tokens is not None else None
    prompt = _estimate_tokens(prompt_text) if prompt is None else prompt
    completion = _estimate_tokens(produced) if completion is None else completion
    usage_obj: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if usage and usage.cache_read_tokens is not None:
        usage_obj["prompt_tokens_details"] = {"cached_tokens": usage.cache_read_tokens}
    return _Reply(content, tuple(calls), finish, usage_obj, reasoning)


def _completion_json(reply: _Reply, completion_id: str, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": FAKE_CREATED,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
        ],
        "usage": reply.usage,
    }


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _stream_deltas(reply: _Reply) -> list[dict[str, Any]]:
    """The deltas after the role delta: text pieces, then each tool call's name and fragments."""
    deltas: list[dict[str, Any]] = [
        {"reasoning_content": piece} for piece in _pieces(reply.reasoning or "", TEXT_DELTA_CHARS)
    ]
    deltas += [{"content": piece} for piece in _pieces(reply.content or "", TEXT_DELTA_CHARS)]
    for index, call in enumerate(reply.tool_calls):
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
        )
        deltas.extend(
            {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
            for fragment in _pieces(call.arguments, ARGUMENT_DELTA_CHARS)
        )
    return deltas


def _chunk(
    completion_id: str, model: str, delta: dict[str, Any] | None, finish: str | None = None
) -> dict[str, Any]:
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": FAKE_CREATED,
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
    }


def _error_json(status: int, message: str | None, code: str | None = None) -> dict[str, Any]:
    server_side = status >= HTTPStatus.INTERNAL_SERVER_ERROR
    default_type = "server_error" if server_side else "invalid_request_error"
    kind, default_code, default_message = _ERROR_SHAPES.get(
        status, (default_type, None, f"Scripted HTTP {status} from the fake model.")
    )
    return {
        "error": {
            "message": message or default_message,
            "type": kind,
            "param": None,
            "code": code or default_code,
        }
    }


def _overflow_json(prompt_tokens: int) -> dict[str, Any]:
    total = FAKE_CONTEXT_WINDOW + prompt_tokens
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {FAKE_CONTEXT_WINDOW} tokens. However, "
                f"your messages resulted in {total} tokens. Please reduce the length of the "
                "messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _retry_after_header(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else repr(seconds)


# --- the HTTP server ------------------------------------------------------------------------


class _State:
    """Everything the handler threads share; guarded by one lock."""

    def __init__(self, script: Script, model_id: str) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.model_id = model_id
        self.cursor = ScriptCursor(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.completions = 0

    def record(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        with self.lock:
            self.requests.append(body)
            self.headers.append(headers)
            self.completions += 1
            return self.completions


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, socket.socket):
            # Without this, each reply's body waits for the ACK of its headers (Nagle), which
            # the client delays ~40 ms on a kept-alive connection: every model call would
            # cost that much, booked as the client's latency.
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._open_lock:
                self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        if isinstance(request, socket.socket):
            with self._open_lock:
                self._open.discard(request)
        super().shutdown_request(request)

    def drop_open_connections(self) -> None:
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams that can be cut visibly
    server_version = "FakeModel/1.0"
    timeout = IDLE_CONNECTION_TIMEOUT_S

    @property
    def state(self) -> _State:
        return cast(_Server, self.server).state

    def log_message(self, format: str, *args: Any) -> None:
        pass  # stdout belongs to the ready line; tests read srv.requests instead

    # -- plumbing --

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send_error_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "Request body too large.")
            self.close_connection = True
            return None
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline().strip():
                    pass  # trailers
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline()

    def _send_json(self, status: int, obj: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error_json(self, status: int, message: str | None, code: str | None = None) -> None:
        self._send_json(status, _error_json(status, message, code))

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away; nothing to answer

    # -- routes --

    def do_GET(self) -> None:
        self._guard(self._get)

    def do_POST(self) -> None:
        self._guard(self._post)

    def _get(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        state = self.state
        model = {
            "id": state.model_id,
            "object": "model",
            "created": FAKE_CREATED,
            "owned_by": "fake",
        }
        if path in (API_PREFIX + "/models", "/models"):
            self._send_json(HTTPStatus.OK, {"object": "list", "data": [model]})
        elif path in (f"{API_PREFIX}/models/{state.model_id}", f"/models/{state.model_id}"):
            self._send_json(HTTPStatus.OK, model)
        elif path == "/_requests":
            with state.lock:
                recorded = list(state.requests)
            self._send_json(HTTPStatus.OK, recorded)
        elif path == "/_connection":
            # The socket options of the connection this request came on (what a test checks).
            nodelay = self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            self._send_json(HTTPStatus.OK, {"tcp_nodelay": bool(nodelay)})
        elif path == "/_status":
            with state.lock:
                cursor, count = state.cursor, len(state.requests)
            self._send_json(
                HTTPStatus.OK, {"served": cursor.served, "done": cursor.done, "requests": count}
            )
        else:
            self._send_error_json(HTTPStatus.NOT_FOUND, f"Unknown path {path!r}.", "not_found")

    def _post(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        raw = self._read_body()
        if raw is None:
            return
        if path in (API_PREFIX + "/chat/completions", "/chat/completions"):
            self._chat(raw)
        elif path == "/_script":
            try:
                script = parse_script(raw.decode("utf-8"))
            except (ScriptError, UnicodeDecodeError) as exc:
                self._send_error_json(HTTPStatus.BAD_REQUEST, str(exc))
                return
            with self.state.lock:
                self.state.cursor = ScriptCursor(script)
            self._send_json(HTTPStatus.OK, {"ok": True, "steps": len(script)})
        else:
            self._send_error_json(HTTPStatus.NOT_FOUND, f"Unknown path {path!r}.", "not_found")

    def _chat(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            self._send_error_json(HTTPStatus.BAD_REQUEST, "We could not parse the JSON body.")
            return
        if not isinstance(body, dict):
            self._send_error_json(HTTPStatus.BAD_REQUEST, "The body must be a JSON object.")
            return
        state = self.state
        request_no = state.record(body, {k.lower(): v for k, v in self.headers.items()})
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            msg = "'messages' must be a non-empty array."
            self._send_error_json(HTTPStatus.BAD_REQUEST, msg, "invalid_value")
            return
        with state.lock:
            cursor = state.cursor
        try:
            step = cursor.next_step(_message_text(messages[-1]))
        except ScriptRuntimeError as exc:
            self._send_error_json(HTTPStatus.BAD_REQUEST, str(exc), "fake_script")
            return
        if step.delay_s and state.stop.wait(step.delay_s):
            self.close_connection = True  # server closing: drop the request unanswered
            return
        model = body.get("model") if isinstance(body.get("model"), str) else state.model_id
        if step.fault is not None:
            self._fault(step.fault, body)
            return
        reply = _render(step, request_no, body)
        completion_id = f"chatcmpl-fake{request_no}"
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream(step, reply, completion_id, str(model), include_usage)
        else:
            data = json.dumps(_completion_json(reply, completion_id, str(model))).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if step.cut:
                # The promised length never arrives: the client sees a truncated body.
                self.wfile.write(data[: int(len(data) * CUT_BODY_FRACTION)])
                self.close_connection = True
                return
            self.wfile.write(data)

    def _fault(self, fault: HttpFault, body: dict[str, Any]) -> None:
        if fault.garbage:
            self._garbage(stream=body.get("stream") is True)
            return
        if fault.overflow:
            tokens = _estimate_tokens(json.dumps(body.get("messages", [])))
            self._send_json(HTTPStatus.BAD_REQUEST, _overflow_json(tokens))
            return
        headers: dict[str, str] = {}
        if fault.retry_after_s is not None:
            headers["Retry-After"] = _retry_after_header(fault.retry_after_s)
        self._send_json(fault.status, _error_json(fault.status, fault.message), headers)

    def _garbage(self, *, stream: bool) -> None:
        """200 and a body that parses as no completion: JSON mode gets the page itself, a
        stream gets it as its one event (then the stream ends properly)."""
        self.send_response(HTTPStatus.OK)
        if not stream:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(GARBAGE_BODY)))
            self.end_headers()
            self.wfile.write(GARBAGE_BODY)
            return
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._write_chunk(b"data: " + GARBAGE_BODY + b"\n\n")
        self._write_chunk(_SSE_DONE)
        self.wfile.write(_CHUNKED_END)

    def _stream(
        self, step: Step, reply: _Reply, completion_id: str, model: str, include_usage: bool
    ) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deltas = _stream_deltas(reply)
        events = [_chunk(completion_id, model, {"role": "assistant", "content": ""})]
        if step.cut:
            keep = (
                step.cut_after
                if step.cut_after is not None
                else max(1, int(len(deltas) * CUT_STREAM_FRACTION))
            )
            events += [_chunk(completion_id, model, d) for d in deltas[:keep]]
        else:
            events += [_chunk(completion_id, model, d) for d in deltas]
            events.append(_chunk(completion_id, model, {}, reply.finish_reason))
            if include_usage:
                usage_chunk = _chunk(completion_id, model, None)
                usage_chunk["usage"] = reply.usage
                events.append(usage_chunk)
        for i, event in enumerate(events):
            if i and step.chunk_delay_s and self.state.stop.wait(step.chunk_delay_s):
                break
            self._write_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        else:
            if not step.cut:
                self._write_chunk(_SSE_DONE)
                self.wfile.write(_CHUNKED_END)
                return
        # Cut (or closing): end the connection without the terminating chunk, as a server that
        # died mid-stream would, so the client reports an incomplete body.
        self.close_connection = True


class FakeModelServer:
    """The scripted server; ``start()``/``close()`` or use it as a (async) context manager."""

    def __init__(
        self,
        script: str | Script = "",
        *,
        host: str = LOOPBACK_HOST,
        port: int = 0,
        model_id: str = DEFAULT_MODEL_ID,
    ) -> None:
        parsed = parse_script(script) if isinstance(script, str) else script
        self._state = _State(parsed, model_id)
        self._address = (host, port)
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --

    def start(self) -> FakeModelServer:
        if self._httpd is not None:
            return self
        self._httpd = _Server(self._address, self._state)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="fake-model-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._state.stop.set()  # wakes `slow` steps
        httpd.shutdown()
        httpd.drop_open_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(THREAD_JOIN_TIMEOUT_S)

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> FakeModelServer:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    # -- what tests use --

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeModelServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1`` (pass as litellm ``api_base``)."""
        return f"http://{self._address[0]}:{self.port}{API_PREFIX}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every chat-completion request body received, in order (a copy)."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers of each recorded request (lower-cased names), parallel to ``requests``."""
        with self._state.lock:
            return list(self._state.headers)

    @property
    def served(self) -> int:
        """Steps consumed from the current script."""
        with self._state.lock:
            cursor = self._state.cursor
        return cursor.served

    @property
    def done(self) -> bool:
        """True when every step of the current script has been consumed."""
        with self._state.lock:
            cursor = self._state.cursor
        return cursor.done

    def load(self, script: str | Script) -> None:
        """Replace the script; the next request gets its first step. Requests stay recorded."""
        parsed = parse_script(script) if isinstance(script, str) else script
        with self._state.lock:
            self._state.cursor = ScriptCursor(parsed)

    def clear_requests(self) -> None:
        with self._state.lock:
            self._state.requests.clear()
            self._state.headers.clear()


# --- program --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.testing.fake_model",
        description='Serve a scripted OpenAI-compatible model; print {"url": ...} when ready.',
    )
    parser.add_argument("--script", required=True, help="script file, or - for stdin")
    parser.add_argument("--host", default=LOOPBACK_HOST)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--model-id", default=DEFAULT_MODEL_ID)
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.script == "-" else Path(args.script).read_text("utf-8")
        script = parse_script(text)
    except (OSError, ScriptError) as exc:
        print(f"fake model: {exc}", file=sys.stderr)
        return EXIT_BAD_SCRIPT

    from orchestrator.procs import set_parent_death_signal

    set_parent_death_signal()  # never outlive the test run that started us
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = FakeModelServer(script, host=args.host, port=args.port, model_id=args.model_id)
    with server:
        print(json.dumps({"url": server.url}), flush=True)
        while not stop.wait(MAIN_POLL_S):
            pass
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
