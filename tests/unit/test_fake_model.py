"""The scripted fake model: the script language, the wire format over real HTTP (httpx), the
same through litellm, and the program mode that prints its URL line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")

import httpx
import litellm
import openai
import pytest

from orchestrator.testing.fake_model import (
    ARGUMENT_DELTA_CHARS,
    FAKE_CONTEXT_WINDOW,
    GARBAGE_BODY,
    TEXT_DELTA_CHARS,
    FakeModelServer,
)
from orchestrator.testing.script import (
    DEFAULT_BAD_TOOL_ARGUMENTS,
    DEFAULT_FILLER_TEXT,
    CallPart,
    CodePart,
    Guarded,
    HttpFault,
    NoBranchMatched,
    Repeat,
    ScriptCursor,
    ScriptError,
    ScriptExhausted,
    Step,
    TextPart,
    ThinkPart,
    Usage,
    parse_script,
)

litellm.suppress_debug_info = True

IPYTHON_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "ipython",
            "description": "Run Python in a persistent IPython kernel.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
USER = [{"role": "user", "content": "What is six times seven?"}]
HTTP_TIMEOUT_S = 10.0
SHORT_CLIENT_TIMEOUT_S = 0.5
SLOW_STEP_S = 30
PROMPT_CLOSE_S = 2.0
SUBPROCESS_READY_TIMEOUT_S = 30.0
SUBPROCESS_STOP_TIMEOUT_S = 10.0
THREADS = 8
STEPS_PER_THREAD = 25
HTTP_THREADS = 4
HTTP_REQUESTS_PER_THREAD = 10


def only_step(text: str) -> Step:
    script = parse_script(text)
    assert len(script.items) == 1
    item = script.items[0]
    assert isinstance(item, Step)
    return item


# --- the script language --------------------------------------------------------------------


def test_public_surface() -> None:
    from orchestrator.testing import fake_model, script

    for module in (fake_model, script):
        assert all(hasattr(module, name) for name in module.__all__)
    assert "FakeModelServer" in fake_model.__all__ and "main" in fake_model.__all__
    assert {"parse_script", "ScriptCursor", "ScriptError"} <= set(script.__all__)


def test_tabs_in_content_are_kept() -> None:
    assert only_step("code: print('a\tb')").parts == (CodePart("print('a\tb')"),)


def test_text_inline_and_block() -> None:
    assert only_step("text: Hello: world").parts == (TextPart("Hello: world"),)
    step = only_step(
        """
        text:
            First line.

            Third line, indented:
              kept relative.
        """
    )
    assert step.parts == (TextPart("First line.\n\nThird line, indented:\n  kept relative."),)


def test_code_block_keeps_blank_lines_comments_and_dashes() -> None:
    step = only_step(
        """
        text: Let me compute that.
        code:
            x = 6 * 7

            # a comment stays code
            print("---")
            print(x)
        """
    )
    code = 'x = 6 * 7\n\n# a comment stays code\nprint("---")\nprint(x)'
    assert step.parts == (TextPart("Let me compute that."), CodePart(code))
    assert step.line == 2


def test_several_tool_calls_call_and_bad_json() -> None:
    step = only_step(
        """
        code: print(1)
        code: print(2)
        call shell: {"cmd": "ls"}
        bad-tool-json
        bad-tool-json: {"code": 'single quotes'}
        """
    )
    assert step.parts == (
        CodePart("print(1)"),
        CodePart("print(2)"),
        CallPart("shell", '{"cmd": "ls"}'),
        CallPart("ipython", DEFAULT_BAD_TOOL_ARGUMENTS),
        CallPart("ipython", "{\"code\": 'single quotes'}"),
    )


def test_raw_fenced_variants() -> None:
    step = only_step(
        """
        raw-fenced python: print(1)
        raw-fenced unclosed:
            print(2)
        raw-fenced json: print("3")
        """
    )
    assert step.parts == (
        TextPart("```python\nprint(1)\n```"),
        TextPart("```python\nprint(2)\n"),
        TextPart('```json\n{"name": "ipython", "arguments": {"code": "print(\\"3\\")"}}\n```'),
    )
    json_block = step.parts[2]
    assert isinstance(json_block, TextPart)
    inner = json.loads(json_block.text.removeprefix("```json\n").removesuffix("\n```"))
    assert inner == {"name": "ipython", "arguments": {"code": 'print("3")'}}


def test_modifiers() -> None:
    step = only_step(
        """
        text: hi
        usage in=100 out=20 cache_read=30
        finish length
        slow 1.5
        chunk-delay 0.01
        cut 2
        """
    )
    assert step.usage == Usage(100, 20, 30)
    assert step.finish_reason == "length"
    assert step.delay_s == pytest.approx(1.5)
    assert step.chunk_delay_s == pytest.approx(0.01)
    assert step.cut and step.cut_after == 2
    assert only_step("text: x\nusage out=3").usage == Usage(None, 3, None)


def test_faults_and_fillers() -> None:
    assert only_step("429").fault == HttpFault(429)
    assert only_step("429 retry-after=2").fault == HttpFault(429, 2.0)
    assert only_step("503 retry-after=0.5 engine overloaded").fault == HttpFault(
        503, 0.5, "engine overloaded"
    )
    assert only_step("500").fault == HttpFault(500)
    assert only_step("overflow").fault == HttpFault(400, overflow=True)
    slow_fault = only_step("slow 3\n500")
    assert slow_fault.fault == HttpFault(500) and slow_fault.delay_s == 3
    empty = only_step("empty")
    assert empty.parts == () and empty.fault is None
    assert only_step("slow 2").parts == (TextPart(DEFAULT_FILLER_TEXT),)
    cut = only_step("cut")
    assert cut.cut and cut.cut_after is None and cut.parts == (TextPart(DEFAULT_FILLER_TEXT),)


def test_guarded_steps() -> None:
    script = parse_script(
        """
        when "42": text: The answer is 42.
        when re "Error|Traceback":
            text: It failed; retrying.
            code: print(6 * 7)
        else:
            when "hello": text: nested
            else: empty
        """
    )
    (item,) = script.items
    assert isinstance(item, Guarded)
    assert [b.needle for b in item.branches] == ["42", "Error|Traceback"]
    assert item.select("x = 42").parts == (TextPart("The answer is 42."),)
    assert item.select("ZeroDivisionError: boom").parts[1] == CodePart("print(6 * 7)")
    assert item.select("hello there").parts == (TextPart("nested"),)
    assert item.select("nothing").parts == ()
    no_else = parse_script('when "a": text: A').items[0]
    assert isinstance(no_else, Guarded)
    with pytest.raises(NoBranchMatched, match="line 1"):
        no_else.select("b")
    escaped = parse_script(r'when "say \"hi\"": text: ok').items[0]
    assert isinstance(escaped, Guarded) and escaped.branches[0].needle == 'say "hi"'


def test_a_regex_branch_repeats_its_groups() -> None:
    script = parse_script(
        r"""
        when re "number is (?P<n>[0-9]+)": text: It is \1, or \g<n>.
        when re "plain": text: no groups \1 here
        """
    )
    (item,) = script.items
    assert isinstance(item, Guarded)
    assert item.select("the number is 42.").parts == (TextPart("It is 42, or 42."),)
    assert item.select("plain").parts == (TextPart("no groups \\1 here"),)


def test_repeat_and_separators_and_comments() -> None:
    script = parse_script(
        """
        # a comment between steps
        text: one
        ----------
        repeat 2:
            code: print(1)
            ---
            text: two
        ---
        repeat: text: forever
        """
    )
    first, rep, forever = script.items
    assert isinstance(first, Step)
    assert isinstance(rep, Repeat) and rep.count == 2 and len(rep.body) == 2
    assert isinstance(forever, Repeat) and forever.count is None
    cursor = ScriptCursor(script)
    texts = [cursor.next_step("").parts[0] for _ in range(8)]
    assert texts[:5] == [
        TextPart("one"),
        CodePart("print(1)"),
        TextPart("two"),
        CodePart("print(1)"),
        TextPart("two"),
    ]
    assert texts[5:] == [TextPart("forever")] * 3
    assert not cursor.done


def test_cursor_exhaustion_and_done() -> None:
    cursor = ScriptCursor(parse_script("text: a\n---\ntext: b"))
    assert not cursor.done
    cursor.next_step("")
    cursor.next_step("")
    assert cursor.done and cursor.served == 2
    with pytest.raises(ScriptExhausted, match="script exhausted after 2 requests"):
        cursor.next_step("")
    empty = ScriptCursor(parse_script("  \n# only a comment\n"))
    with pytest.raises(ScriptExhausted, match="after 0 requests"):
        empty.next_step("")


def test_cursor_is_thread_safe() -> None:
    total = THREADS * STEPS_PER_THREAD
    script = parse_script("\n---\n".join(f"text: {i}" for i in range(total)))
    cursor = ScriptCursor(script)
    seen: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(STEPS_PER_THREAD):
            part = cursor.next_step("").parts[0]
            assert isinstance(part, TextPart)
            with lock:
                seen.append(part.text)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen, key=int) == [str(i) for i in range(total)]
    assert cursor.done


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("text: a\n---\nbogus", 3, "unknown directive `bogus`"),
        ("text: a\n    stray", 1, "both inline content and an indented block"),
        ("text: a\nusage in=1\n    stray", 3, "does not take an indented block"),
        ("  \n    stray\ntext: a", 2, "unexpected indented line"),
        ("code:", 1, "needs content"),
        ("code: x\n    y", 1, "both inline content and an indented block"),
        ("text hello", 1, "needs ':'"),
        ("usage in=1\ntext: a\nusage out=2", 3, "given twice"),
        ("usage in=x\ntext: a", 1, "whole number"),
        ("usage tokens=3\ntext: a", 1, "usage takes"),
        ("finish maybe\ntext: a", 1, "finish reason must be one of"),
        ("slow -1", 1, "non-negative"),
        ("slow soon", 1, "number of seconds"),
        ("999", 1, "status must be"),
        ("429\ntext: a", 1, "fault step"),
        ("empty\ntext: a", 1, "`empty` cannot be combined"),
        ("usage in=1", 1, "the step has no reply"),
        ('text: a\nwhen "x": text: b', 2, "must start its step"),
        ('when "x": text: a\ntext: b', 2, "holds only when/else"),
        ("when x: text: a", 1, 'expected `when "TEXT":`'),
        ('when re "(": text: a', 1, "bad regular expression"),
        ('when "x":', 1, "needs a body"),
        ('when "x": text: a\nelse: text: b\nelse: text: c', 3, "a second `else`"),
        ('when "x":\n    text: a\n    ---\n    text: b', 3, "not allowed inside `when`"),
        ("repeat 2: text: a\ntext: b", 2, "only directive of its step"),
        ("repeat 0: text: a", 1, "at least 1"),
        ("repeat twice: text: a", 1, "whole number"),
        ("repeat forever: text: a\n---\ntext: b", 2, "can never run"),
        ("raw-fenced yaml: x", 1, "raw-fenced python:"),
        ("call 9bad: {}", 1, "call NAME"),
        ("empty now", 1, "takes no arguments"),
        ("!!", 1, "expected a directive"),
    ],
)
def test_parse_errors_name_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ScriptError) as info:
        parse_script(text)
    assert info.value.line == line
    assert fragment in str(info.value)
    assert f"line {line}:" in str(info.value)


# --- the wire format over real HTTP ---------------------------------------------------------


def sse_events(text: str) -> list[Any]:
    """The decoded ``data:`` payloads of an SSE body; ``[DONE]`` stays a string."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# One client for the module: creating one loads the CA bundle (~0.15 s).
HTTP = httpx.Client(timeout=HTTP_TIMEOUT_S)


@pytest.fixture(scope="module", autouse=True)
def close_http_client() -> Iterator[None]:
    yield
    HTTP.close()


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return HTTP.post(url + "/chat/completions", json=body)


def test_http_non_stream_text_and_models() -> None:
    with FakeModelServer("text: Hello there.") as srv:
        assert srv.url == f"http://127.0.0.1:{srv.port}/v1"
        models = HTTP.get(srv.url + "/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "fake"
        reply = post(srv.url, {"model": "m1", "messages": USER})
        assert reply.status_code == 200
        body = reply.json()
        assert body["object"] == "chat.completion" and body["model"] == "m1"
        choice = body["choices"][0]
        assert choice["message"] == {
            "role": "assistant",
            "content": "Hello there.",
            "refusal": None,
        }
        assert choice["finish_reason"] == "stop"
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
        assert srv.requests == [{"model": "m1", "messages": USER}]
        assert srv.request_headers[0]["content-type"] == "application/json"
        assert srv.done and srv.served == 1


def test_accepted_connections_have_tcp_nodelay() -> None:
    """Replies go out without waiting for the client's delayed ACK (Nagle off): the server
    reports the option as read from the very socket it accepted, on a kept-alive connection
    that has already carried a completion."""
    import http.client

    with FakeModelServer("text: hi") as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            body = json.dumps({"model": "m", "messages": USER})
            headers = {"Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            first = conn.getresponse()
            assert first.status == 200 and json.loads(first.read())["object"] == "chat.completion"
            conn.request("GET", "/_connection")
            report = conn.getresponse()
            assert report.status == 200
            assert json.loads(report.read()) == {"tcp_nodelay": True}
        finally:
            conn.close()


def test_http_stream_text_deltas_usage_and_done() -> None:
    text = "A reply long enough to be split into several deltas."
    with FakeModelServer(f"text: {text}\nusage in=7 out=9") as srv:
        body = {"model": "m", "messages": USER, "stream": True}
        reply = post(srv.url, {**body, "stream_options": {"include_usage": True}})
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert reply.headers["transfer-encoding"] == "chunked"
        events = sse_events(reply.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]
        assert "".join(pieces) == text
        assert len([p for p in pieces if p]) > 1
        assert all(len(p) <= TEXT_DELTA_CHARS for p in pieces)
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 7,
            "completion_tokens": 9,
            "total_tokens": 16,
        }
        srv.load(f"text: {text}")
        no_usage = sse_events(post(srv.url, body).text)
        assert all("usage" not in c for c in no_usage[:-1])


def test_http_stream_tool_call_deltas() -> None:
    code = "x = 6 * 7\nprint(x)"
    with FakeModelServer(
        f"text: Computing.\ncode:\n    {code.replace(chr(10), chr(10) + '    ')}\ncode: print(2)"
    ) as srv:
        body = {"model": "m", "messages": USER, "tools": IPYTHON_TOOLS, "stream": True}
        chunks = [c for c in sse_events(post(srv.url, body).text) if c != "[DONE]"]
        calls: dict[int, dict[str, str]] = {}
        for chunk in chunks:
            for delta in chunk["choices"][0]["delta"].get("tool_calls", []):
                slot = calls.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
                if "id" in delta:
                    assert not slot["id"], "id is sent once, in the first delta"
                    slot["id"] = delta["id"]
                    assert delta["type"] == "function"
                slot["name"] += delta["function"].get("name", "")
                fragment = delta["function"].get("arguments", "")
                assert len(fragment) <= ARGUMENT_DELTA_CHARS
                slot["arguments"] += fragment
        assert [calls[i]["name"] for i in (0, 1)] == ["ipython", "ipython"]
        assert json.loads(calls[0]["arguments"]) == {"code": code}
        assert json.loads(calls[1]["arguments"]) == {"code": "print(2)"}
        assert calls[0]["id"] != calls[1]["id"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_http_fenced_protocol_without_tools() -> None:
    script = "text: I will compute it.\ncode: print(6 * 7)\ntext: Done."
    with FakeModelServer(script) as srv:
        message = post(srv.url, {"model": "m", "messages": USER}).json()["choices"][0]
        assert message["message"]["content"] == (
            "I will compute it.\n\n```python\nprint(6 * 7)\n```\n\nDone."
        )
        assert "tool_calls" not in message["message"] and message["finish_reason"] == "stop"
        srv.load(script)
        native = post(srv.url, {"model": "m", "messages": USER, "tools": IPYTHON_TOOLS}).json()
        msg = native["choices"][0]["message"]
        assert msg["content"] == "I will compute it.\n\nDone."
        assert msg["tool_calls"][0]["function"]["arguments"] == '{"code": "print(6 * 7)"}'
        srv.load(script)
        refused = {"messages": USER, "tools": IPYTHON_TOOLS, "tool_choice": "none"}
        assert "```python" in post(srv.url, refused).json()["choices"][0]["message"]["content"]


def test_http_faults() -> None:
    script = "429 retry-after=3\n---\n503\n---\noverflow\n---\n401 bad key here"
    with FakeModelServer(script) as srv:
        limited = post(srv.url, {"messages": USER})
        assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert post(srv.url, {"messages": USER}).status_code == 503
        overflow = post(srv.url, {"messages": USER})
        assert overflow.status_code == 400
        error = overflow.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"maximum context length is {FAKE_CONTEXT_WINDOW} tokens" in error["message"]
        unauthorized = post(srv.url, {"messages": USER})
        assert unauthorized.status_code == 401
        assert unauthorized.json()["error"]["message"] == "bad key here"


def test_http_garbage_body() -> None:
    assert only_step("garbage").fault == HttpFault(200, garbage=True)
    with FakeModelServer("garbage\n---\ngarbage") as srv:
        plain = post(srv.url, {"messages": USER})
        assert plain.status_code == 200 and plain.content == GARBAGE_BODY
        streamed = post(srv.url, {"messages": USER, "stream": True})
        assert streamed.status_code == 200
        assert streamed.text.splitlines()[0] == "data: " + GARBAGE_BODY.decode()
        assert streamed.text.rstrip().endswith("data: [DONE]")


def test_http_cut_stream_and_body() -> None:
    with FakeModelServer("cut 2\n---\ncut") as srv:
        received: list[str] = []
        stream = HTTP.stream(
            "POST", srv.url + "/chat/completions", json={"messages": USER, "stream": True}
        )
        with pytest.raises(httpx.RemoteProtocolError), stream as response:
            received.extend(response.iter_lines())
        data = [line for line in received if line.startswith("data: ")]
        assert len(data) == 3  # the role chunk and two deltas; never [DONE]
        with pytest.raises(httpx.RemoteProtocolError):
            post(srv.url, {"messages": USER})


def test_http_empty_finish_and_usage_defaults() -> None:
    with FakeModelServer("empty\n---\ntext: truncated\nfinish length\nusage cache_read=4") as srv:
        empty = post(srv.url, {"messages": USER}).json()["choices"][0]
        assert empty["message"]["content"] == "" and empty["finish_reason"] == "stop"
        stream = sse_events(post(srv.url, {"messages": USER, "stream": True}).text)
        assert stream[-2]["choices"][0]["finish_reason"] == "length"
        srv.load("text: x\nusage cache_read=4")
        usage = post(srv.url, {"messages": USER}).json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 4}


def test_http_guard_exhaustion_and_bad_requests() -> None:
    with FakeModelServer('when "42": text: yes\n---\nwhen "zzz": text: y') as srv:
        tool_result = [*USER, {"role": "tool", "tool_call_id": "c1", "content": "42\n"}]
        assert (
            post(srv.url, {"messages": tool_result}).json()["choices"][0]["message"]["content"]
            == "yes"
        )
        missed = post(srv.url, {"messages": USER})
        assert missed.status_code == 400 and "no `when` branch" in missed.json()["error"]["message"]
        exhausted = post(srv.url, {"messages": USER})
        assert exhausted.status_code == 400
        assert (
            exhausted.json()["error"]["message"] == "fake model: script exhausted after 2 requests"
        )
        bad = HTTP.post(srv.url + "/chat/completions", content=b"{not json")
        assert bad.status_code == 400
        assert post(srv.url, {"model": "m"}).status_code == 400
        assert HTTP.get(srv.url + "/nowhere").status_code == 404


def test_http_list_content_parts_are_guarded_on() -> None:
    with FakeModelServer('when "seven": text: matched') as srv:
        parts = [{"role": "user", "content": [{"type": "text", "text": "six times seven"}]}]
        reply = post(srv.url, {"messages": parts}).json()
        assert reply["choices"][0]["message"]["content"] == "matched"


def test_http_control_endpoints() -> None:
    with FakeModelServer("text: a") as srv:
        post(srv.url, {"messages": USER})
        base = srv.url.removesuffix("/v1")
        assert HTTP.get(base + "/_requests").json() == [{"messages": USER}]
        status = HTTP.get(base + "/_status").json()
        assert status == {"served": 1, "done": True, "requests": 1}
        loaded = HTTP.post(base + "/_script", content=b"text: b\n---\ntext: c")
        assert loaded.json() == {"ok": True, "steps": 2}
        assert post(srv.url, {"messages": USER}).json()["choices"][0]["message"]["content"] == "b"
        broken = HTTP.post(base + "/_script", content=b"nonsense")
        assert broken.status_code == 400 and "line 1" in broken.json()["error"]["message"]
        srv.clear_requests()
        assert srv.requests == []


def test_slow_step_times_out_client_and_close_is_prompt() -> None:
    srv = FakeModelServer(f"slow {SLOW_STEP_S}\ntext: late").start()
    try:
        with pytest.raises(httpx.ReadTimeout):
            HTTP.post(
                srv.url + "/chat/completions",
                json={"messages": USER},
                timeout=SHORT_CLIENT_TIMEOUT_S,
            )
    finally:
        started = time.monotonic()
        srv.close()
    assert time.monotonic() - started < PROMPT_CLOSE_S


def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    with FakeModelServer("repeat 3: text: again") as srv:
        for _ in range(3):
            reply = HTTP.post(srv.url + "/chat/completions", json={"messages": USER})
            assert reply.json()["choices"][0]["message"]["content"] == "again"
        assert srv.done


def test_concurrent_requests_each_get_one_step() -> None:
    total = HTTP_THREADS * HTTP_REQUESTS_PER_THREAD
    script = "\n---\n".join(f"text: {i}" for i in range(total))
    answers: list[str] = []
    lock = threading.Lock()
    with FakeModelServer(script) as srv:

        def worker() -> None:
            with httpx.Client(timeout=HTTP_TIMEOUT_S, verify=False) as client:
                for _ in range(HTTP_REQUESTS_PER_THREAD):
                    reply = client.post(srv.url + "/chat/completions", json={"messages": USER})
                    with lock:
                        answers.append(reply.json()["choices"][0]["message"]["content"])

        threads = [threading.Thread(target=worker) for _ in range(HTTP_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers, key=int) == [str(i) for i in range(total)]
        assert srv.done and len(srv.requests) == total


def test_replies_are_deterministic() -> None:
    script = "text: same\ncode: print(1)"
    body = {"model": "m", "messages": USER, "tools": IPYTHON_TOOLS, "stream": True}
    replies = []
    for _ in range(2):
        with FakeModelServer(script) as srv:
            replies.append(post(srv.url, body).content)
    assert replies[0] == replies[1]


async def test_async_context_manager_does_not_block_the_loop() -> None:
    async with FakeModelServer("chunk-delay 0.01\ntext: streamed slowly") as srv:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
            reply = await client.post(
                srv.url + "/chat/completions", json={"messages": USER, "stream": True}
            )
        task.cancel()
        assert sse_events(reply.text)[-1] == "[DONE]"
        assert ticks > 1


# --- through litellm ------------------------------------------------------------------------


def llm_kwargs(srv: FakeModelServer, **extra: Any) -> dict[str, Any]:
    return {
        "model": "openai/fake",
        "api_base": srv.url,
        "api_key": "sk-fake",
        "messages": USER,
        "num_retries": 0,
        "max_retries": 0,
        **extra,
    }


async def collect(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]


async def test_litellm_text_non_stream_and_stream() -> None:
    async with FakeModelServer("text: Hello from the script.\n---\ntext: Streamed hello.") as srv:
        reply = await litellm.acompletion(**llm_kwargs(srv))
        assert reply.choices[0].message.content == "Hello from the script."
        assert reply.usage.total_tokens > 0
        stream = await litellm.acompletion(
            **llm_kwargs(srv, stream=True, stream_options={"include_usage": True})
        )
        chunks = await collect(stream)
        assert len(chunks) > 2
        rebuilt = litellm.stream_chunk_builder(chunks)
        assert rebuilt.choices[0].message.content == "Streamed hello."


async def test_litellm_streamed_tool_calls_and_usage() -> None:
    script = """
        text: Let me compute.
        code:
            x = 6 * 7

            print(x)
        code: print("second")
        usage in=120 out=30 cache_read=100
    """
    async with FakeModelServer(script) as srv:
        stream = await litellm.acompletion(
            **llm_kwargs(
                srv, tools=IPYTHON_TOOLS, stream=True, stream_options={"include_usage": True}
            )
        )
        chunks = await collect(stream)
        rebuilt = litellm.stream_chunk_builder(chunks)
        message = rebuilt.choices[0].message
        assert message.content == "Let me compute."
        calls = message.tool_calls
        assert [c.function.name for c in calls] == ["ipython", "ipython"]
        assert json.loads(calls[0].function.arguments) == {"code": "x = 6 * 7\n\nprint(x)"}
        assert json.loads(calls[1].function.arguments) == {"code": 'print("second")'}
        assert calls[0].id == "call_fake_1_0"
        assert rebuilt.choices[0].finish_reason == "tool_calls"
        assert (rebuilt.usage.prompt_tokens, rebuilt.usage.completion_tokens) == (120, 30)
        assert rebuilt.usage.prompt_tokens_details.cached_tokens == 100
        assert srv.requests[0]["tools"][0]["function"]["name"] == "ipython"
        assert srv.requests[0]["stream_options"] == {"include_usage": True}


async def test_litellm_429_exposes_status_and_retry_after() -> None:
    async with FakeModelServer("429 retry-after=7") as srv:
        with pytest.raises(litellm.RateLimitError) as info:
            await litellm.acompletion(**llm_kwargs(srv))
        exc = info.value
        assert exc.status_code == 429
        # Where litellm keeps the provider's response headers (the lead's retry logic reads them).
        assert exc.response.headers["retry-after"] == "7"
        assert exc.litellm_response_headers["retry-after"] == "7"


async def test_litellm_500_and_503() -> None:
    async with FakeModelServer("500\n---\n503 retry-after=1") as srv:
        with pytest.raises(litellm.InternalServerError) as info:
            await litellm.acompletion(**llm_kwargs(srv))
        assert info.value.status_code == 500
        with pytest.raises(litellm.ServiceUnavailableError) as unavailable:
            await litellm.acompletion(**llm_kwargs(srv, stream=True))
        assert unavailable.value.status_code == 503
        assert unavailable.value.response.headers["retry-after"] == "1"


async def test_litellm_cut_stream_raises() -> None:
    async with FakeModelServer("cut") as srv:
        stream = await litellm.acompletion(**llm_kwargs(srv, stream=True))
        with pytest.raises(openai.APIError):
            await collect(stream)


async def test_litellm_bad_tool_json_arrives_as_is() -> None:
    async with FakeModelServer("bad-tool-json\n---\nbad-tool-json") as srv:
        reply = await litellm.acompletion(**llm_kwargs(srv, tools=IPYTHON_TOOLS))
        call = reply.choices[0].message.tool_calls[0]
        assert call.function.arguments == DEFAULT_BAD_TOOL_ARGUMENTS
        stream = await litellm.acompletion(**llm_kwargs(srv, tools=IPYTHON_TOOLS, stream=True))
        rebuilt = litellm.stream_chunk_builder(await collect(stream))
        assert rebuilt.choices[0].message.tool_calls[0].function.arguments == (
            DEFAULT_BAD_TOOL_ARGUMENTS
        )


async def test_litellm_guarded_branches_follow_the_tool_result() -> None:
    script = """
        code: print(6 * 7)
        ---
        when "42": text: The answer is 42.
        when "Error": text: It failed.
        ---
        when "42": text: wrong branch
        else: text: The else branch.
    """
    async with FakeModelServer(script) as srv:
        first = await litellm.acompletion(**llm_kwargs(srv, tools=IPYTHON_TOOLS))
        call = first.choices[0].message.tool_calls[0]
        history = [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "42\n"},
        ]
        second = await litellm.acompletion(**llm_kwargs(srv, messages=history, tools=IPYTHON_TOOLS))
        assert second.choices[0].message.content == "The answer is 42."
        third = await litellm.acompletion(**llm_kwargs(srv))
        assert third.choices[0].message.content == "The else branch."
        assert srv.requests[1]["messages"][-1]["content"] == "42\n"


async def test_litellm_exhaustion_overflow_and_timeout() -> None:
    async with FakeModelServer(f"overflow\n---\nslow {SLOW_STEP_S}\ntext: late") as srv:
        with pytest.raises(litellm.ContextWindowExceededError):
            await litellm.acompletion(**llm_kwargs(srv))
        with pytest.raises(litellm.Timeout):
            await litellm.acompletion(**llm_kwargs(srv, timeout=SHORT_CLIENT_TIMEOUT_S))
        with pytest.raises(litellm.BadRequestError, match="script exhausted after 2 requests"):
            await litellm.acompletion(**llm_kwargs(srv))


async def test_litellm_fenced_protocol_and_raw_fenced_json() -> None:
    script = """
        text: Here is the code.
        code: print(6 * 7)
        ---
        raw-fenced json: print(1)
    """
    async with FakeModelServer(script) as srv:
        reply = await litellm.acompletion(**llm_kwargs(srv))
        assert reply.choices[0].message.content == (
            "Here is the code.\n\n```python\nprint(6 * 7)\n```"
        )
        assert not reply.choices[0].message.tool_calls
        raw = await litellm.acompletion(**llm_kwargs(srv, tools=IPYTHON_TOOLS))
        assert raw.choices[0].message.content.startswith('```json\n{"name": "ipython"')
        assert not raw.choices[0].message.tool_calls


# --- program mode ---------------------------------------------------------------------------


def test_subprocess_prints_url_line_and_serves(tmp_path: Path) -> None:
    script = tmp_path / "script.txt"
    script.write_text("text: from a subprocess\n")
    command = [sys.executable, "-m", "orchestrator.testing.fake_model", "--script", str(script)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        try:
            ready = json.loads(proc.stdout.readline())
            assert list(ready) == ["url"] and ready["url"].startswith("http://127.0.0.1:")
            url = ready["url"]
            reply = post(url, {"messages": USER}).json()
            assert reply["choices"][0]["message"]["content"] == "from a subprocess"
            requests = HTTP.get(url.removesuffix("/v1") + "/_requests")
            assert requests.json() == [{"messages": USER}]
        finally:
            proc.terminate()
        assert proc.wait(SUBPROCESS_STOP_TIMEOUT_S) == 0
        assert proc.stdout.read() == ""  # exactly one line on stdout


def test_subprocess_bad_script_exits_2(tmp_path: Path) -> None:
    script = tmp_path / "bad.txt"
    script.write_text("text: fine\n---\nnonsense here\n")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.testing.fake_model", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_READY_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "line 3" in done.stderr and "unknown directive" in done.stderr


def test_think_is_reasoning_content_ahead_of_the_reply() -> None:
    assert only_step("think: Hmm.\ntext: Yes.").parts == (ThinkPart("Hmm."), TextPart("Yes."))
    with FakeModelServer(
        "think: Weigh it first.\ntext: Yes.\n---\nthink: Again.\ntext: No."
    ) as srv:
        whole = post(srv.url, {"model": "m", "messages": USER}).json()
        message = whole["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("Weigh it first.", "Yes.")
        streamed = sse_events(post(srv.url, {"model": "m", "messages": USER, "stream": True}).text)
        deltas = [
            c["choices"][0]["delta"] for c in streamed if isinstance(c, dict) and c["choices"]
        ]
        thought = "".join(d.get("reasoning_content", "") for d in deltas)
        said = "".join(d.get("content") or "" for d in deltas)
        assert (thought, said) == ("Again.", "No.")
        first_text = next(i for i, d in enumerate(deltas) if d.get("content"))
        assert all("content" not in d or not d["content"] for d in deltas[:first_text])
        assert "reasoning_content" in deltas[first_text - 1]
