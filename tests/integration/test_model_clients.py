"""The two model transports behave the same (docs/models.md, "Two transports").

Every case runs one ``ModelClient.complete`` through the lean OpenAI-compatible client
(``model_client = "auto"``, the default for ``openai/NAME --api-base``) and through litellm
(``model_client = "litellm"``) against the same scripted model over real HTTP, and compares
what a session would record: the reply, the usage and its cost, the retries (attempt and delay),
the typed error and its ``error_class``, the number of HTTP attempts, and the request body the
server received.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any, Final

import pytest

from orchestrator.agent.prompts import IPYTHON_TOOL
from orchestrator.errors import ModelError
from orchestrator.models.client import ContextOverflow, ModelClient, RetryInfo
from orchestrator.models.litellm_stream import LitellmStream
from orchestrator.models.openai_stream import OpenAIStream
from orchestrator.models.registry import resolve_model
from orchestrator.settings import Settings
from orchestrator.testing import FakeModelServer
from orchestrator.testing.fake_model import TEXT_DELTA_CHARS
from tests.fake_clock import FakeClock

CLIENTS: Final = ("auto", "litellm")
RETRIES: Final = 2
IDLE_TIMEOUT_S: Final = 1.5
STALL_S: Final = 30  # longer than the idle timeout; closing the server ends it
PRICE_MAP_RACERS: Final = 8
PRICE_MAP_RACE_WAIT_S: Final = 0.5  # how long the first reader waits for a second one
# A model litellm's bundled map prices, so the cost comes from the map on both paths.
PRICED_MODEL: Final = "openai/gpt-4o-mini"
MESSAGES: Final = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "go"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "ipython", "arguments": '{"code": "x = 1"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]


def _settings(client: str) -> Settings:
    return Settings(
        model_client=client,  # type: ignore[arg-type]
        model_max_retries=RETRIES,
        retry_base_delay_s=0.01,
        model_stream_idle_timeout_s=IDLE_TIMEOUT_S,
    )


@dataclass
class Seen:
    """What one logical call produced, in the terms a session records."""

    result: dict[str, Any]
    retries: list[tuple[int, float]]
    requests: list[dict[str, Any]]


async def _call(
    script: str, client: str, model: str = "openai/fake", temperature: float | None = None
) -> Seen:
    settings = _settings(client)
    retries: list[RetryInfo] = []

    async def on_retry(info: RetryInfo) -> None:
        retries.append(info)

    with FakeModelServer(script) as srv:
        resolved = resolve_model(model, settings, api_base=srv.url, env={})
        mc = ModelClient(resolved, settings)
        expected = OpenAIStream if client == "auto" else LitellmStream
        assert isinstance(mc.transport, expected)
        try:
            reply = await mc.complete(
                MESSAGES, tools=[IPYTHON_TOOL], temperature=temperature, on_retry=on_retry
            )
        except ModelError as exc:
            result: dict[str, Any] = {
                "error": type(exc).__name__,
                "error_class": exc.error_class,
                "overflow": isinstance(exc, ContextOverflow),
            }
        else:
            usage = reply.usage.model_dump()
            assert usage.pop("latency_ms") > 0
            result = {
                "text": reply.text,
                "thinking": reply.thinking,
                "calls": [(c.id, c.name, c.arguments) for c in reply.tool_calls],
                "finish": reply.finish_reason,
                "usage": usage,
            }
        requests = list(srv.requests)
    return Seen(result, [(r.attempt, round(r.delay_s, 3)) for r in retries], requests)


CASES: Final = {
    "text": "text: hello there\nusage in=120 out=30",
    "tool call": "code: print(6 * 7)",
    "thinking": "think: First the product, then say it.\ntext: 42\nusage in=50 out=20",
    "cached tokens": "text: cached\nusage in=1000 out=10 cache_read=400",
    "429 then text": "429 retry-after=0.2\n---\ntext: fine",
    "429 too long": "429 retry-after=3600",
    "500 always": "repeat forever:\n    500",
    "503 then text": "503\n---\ntext: back",
    "cut then text": "text: partial words here\ncut 2\n---\ntext: whole",
    "stall": f"repeat forever:\n    slow {STALL_S}",
    "garbage": "repeat forever:\n    garbage",
    "overflow": "overflow",
    "401": "401",
    "404": "404",
    "400": "400 bad request shape",
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_both_clients_record_the_same(case: str) -> None:
    lean = await _call(CASES[case], "auto")
    lite = await _call(CASES[case], "litellm")
    assert lean.result == lite.result
    assert lean.retries == lite.retries
    assert len(lean.requests) == len(lite.requests)


async def test_the_expected_outcomes() -> None:
    """Pinned, so that "the same" is not the same mistake in both."""
    ok = await _call(CASES["text"], "auto")
    assert ok.result["text"] == "hello there" and ok.result["finish"] == "stop"
    assert ok.result["usage"]["input"] == 120 and ok.result["usage"]["output"] == 30
    assert (await _call(CASES["429 then text"], "auto")).retries == [(1, 0.2)]
    failed = await _call(CASES["500 always"], "auto")
    assert failed.result["error_class"] == "server_error" and len(failed.requests) == RETRIES + 1
    for case, error_class in {
        "stall": "timeout",
        "garbage": "bad_response",
        "429 too long": "rate_limited",
        "overflow": "context_overflow",
        "400": "bad_request",
    }.items():
        assert (await _call(CASES[case], "auto")).result["error_class"] == error_class, case
    assert (await _call(CASES["401"], "auto")).result["error"] == "MissingCredentials"
    assert (await _call(CASES["404"], "auto")).result["error"] == "ModelNotFound"
    thought = await _call(CASES["thinking"], "auto")
    assert thought.result["thinking"] == "First the product, then say it."
    assert thought.result["text"] == "42"
    call = await _call(CASES["tool call"], "auto")
    assert call.result["calls"][0][1] == "ipython"
    assert json.loads(call.result["calls"][0][2]) == {"code": "print(6 * 7)"}


async def test_cost_comes_from_the_same_price_map() -> None:
    script = "text: priced\nusage in=1000 out=100 cache_read=200"
    lean = await _call(script, "auto", model=PRICED_MODEL)
    lite = await _call(script, "litellm", model=PRICED_MODEL)
    cost = lean.result["usage"]["cost_usd"]
    assert cost is not None and cost > 0
    assert lean.result == lite.result


async def test_the_request_body_is_the_same() -> None:
    lean = await _call("text: a", "auto", temperature=0.25)
    lite = await _call("text: a", "litellm", temperature=0.25)
    sent, expected = lean.requests[0], lite.requests[0]
    assert sent == expected
    assert sent["model"] == "fake" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("client", CLIENTS)
async def test_an_endpoint_that_is_not_there_is_unreachable(client: str) -> None:
    settings = _settings(client)
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    mc = ModelClient(resolve_model("openai/fake", settings, api_base=url, env={}), settings)
    retries: list[RetryInfo] = []

    async def on_retry(info: RetryInfo) -> None:
        retries.append(info)

    with pytest.raises(ModelError) as caught:
        await mc.complete(MESSAGES, on_retry=on_retry)
    assert caught.value.error_class == "unreachable"
    assert len(retries) == RETRIES
    assert "check --api-base" in str(caught.value)


async def test_litellm_runs_no_success_logging_after_a_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """litellm's success handlers rebuild the response, price it and walk the whole history
    after every streamed call, in a task it starts; we register no logger, so they must not run
    (models/lite.py). The tasks litellm starts during the call are awaited before checking."""
    from orchestrator.models.lite import load_litellm

    load_litellm()
    from litellm.litellm_core_utils import litellm_logging

    ran: list[str] = []
    for name in ("success_handler", "async_success_handler"):
        original = getattr(litellm_logging.Logging, name)

        def spy(self: Any, *args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
            ran.append(_name)
            return _f(self, *args, **kw)

        monkeypatch.setattr(litellm_logging.Logging, name, spy)
    started: list[asyncio.Task[Any]] = []
    create_task = asyncio.create_task

    def recording(coro: Any, **kw: Any) -> asyncio.Task[Any]:
        task = create_task(coro, **kw)
        started.append(task)
        return task

    monkeypatch.setattr(asyncio, "create_task", recording)
    seen = await _call("text: logged?", "litellm")
    await asyncio.gather(*started, return_exceptions=True)
    assert seen.result["text"] == "logged?"
    assert ran == []


async def test_a_streamed_reply_arms_the_same_timers_whatever_its_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lean client's per-piece cost holds no timer: a call on a kept connection arms two
    (the wait for the reply's head, and the stream's one idle timer), for 5 deltas as for 400.
    A timeout per line or per piece would arm one each (docs/benchmarks.md, "Where a step's
    host CPU goes")."""
    settings = _settings("auto")
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    short, long = "text: " + "w" * 5 * TEXT_DELTA_CHARS, "text: " + "w" * 400 * TEXT_DELTA_CHARS
    with FakeModelServer(f"text: warm\n---\n{short}\n---\n{long}") as srv:
        stream = OpenAIStream(
            resolve_model("openai/fake", settings, api_base=srv.url, env={}), settings
        )
        await stream.attempt(MESSAGES, None, None, None)  # opens the kept connection
        monkeypatch.setattr(loop, "call_at", counting)
        counts = []
        for _ in range(2):
            armed.clear()
            reply = await stream.attempt(MESSAGES, None, None, None)
            assert reply.finish_reason == "stop"
            counts.append(len(armed))
    assert counts == [2, 2]


@pytest.mark.parametrize("client", CLIENTS)
async def test_the_price_map_is_read_off_the_event_loop(
    client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call's cost reads litellm's price map (tens of ms): on a thread, never on the
    loop that a daemon's sessions share (docs/benchmarks.md, "Where a step's host CPU goes")."""
    from orchestrator.models import cost, price_map

    readers: list[int] = []
    find = price_map.price_map_path

    def recording() -> Any:
        readers.append(threading.get_ident())
        return find()

    for cached in (price_map._read_table, price_map.model_entry, cost._mapped_prices):
        cached.cache_clear()
    monkeypatch.setattr(price_map, "price_map_path", recording)
    seen = await _call("text: priced", client, model=PRICED_MODEL)
    assert seen.result["usage"]["cost_usd"] is not None
    assert len(readers) == 1 and readers[0] != threading.get_ident()


def test_sessions_starting_together_read_the_price_map_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many sessions' first calls look prices up on threads at once: one of them reads the
    ~1 MB file, the others wait for its table (without the lock each read it: 20 sessions
    spent ~0.6 s of CPU). The first reader holds on until a second one arrives or
    ``PRICE_MAP_RACE_WAIT_S`` passes, so an unguarded read shows up as a second reader."""
    from orchestrator.models import price_map

    readers: list[int] = []
    second = threading.Event()
    find = price_map.price_map_path

    def slow_reader() -> Any:
        readers.append(threading.get_ident())
        if len(readers) > 1:
            second.set()
        else:
            second.wait(PRICE_MAP_RACE_WAIT_S)
        return find()

    price_map._read_table.cache_clear()
    monkeypatch.setattr(price_map, "price_map_path", slow_reader)
    try:
        threads = [threading.Thread(target=price_map._table) for _ in range(PRICE_MAP_RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(readers) == 1
        assert price_map._table(), "the shared table is the real map"
    finally:
        price_map._read_table.cache_clear()


def test_a_preloaded_price_map_is_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon reads the map on a thread at start: a session's first lookup then reads
    nothing (the read would sit between its first reply and its next step)."""
    from orchestrator.models import price_map

    reads: list[int] = []
    find = price_map.price_map_path

    def counted() -> Any:
        reads.append(1)
        return find()

    price_map._read_table.cache_clear()
    price_map.model_entry.cache_clear()
    monkeypatch.setattr(price_map, "price_map_path", counted)
    try:
        price_map.preload_in_background().join()
        assert reads == [1]
        assert price_map.model_entry("gpt-4o-mini") is not None
        assert reads == [1]
    finally:
        price_map._read_table.cache_clear()
        price_map.model_entry.cache_clear()


@pytest.mark.parametrize("client", CLIENTS)
async def test_one_sessions_retry_after_holds_every_sessions_calls_to_that_endpoint(
    client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions share an account's quota: a 429 with Retry-After that one session's call got
    holds the next call of every session to the same endpoint (models/provider_gate.py)."""
    from orchestrator.models import provider_gate

    clock = FakeClock()
    monkeypatch.setattr(
        provider_gate, "_process_gates", provider_gate.ProviderGates(clock, clock.sleep)
    )
    settings = Settings(model_client=client, model_max_retries=0)  # type: ignore[arg-type]
    async with FakeModelServer("429 retry-after=30\n---\ntext: second") as srv:
        first = ModelClient(
            resolve_model("openai/fake", settings, api_base=srv.url, env={}), settings
        )
        other = ModelClient(
            resolve_model("openai/fake", settings, api_base=srv.url, env={}), settings
        )
        with pytest.raises(ModelError):
            await first.complete(MESSAGES)
        assert clock.now == 0.0 and len(srv.requests) == 1
        reply = await other.complete(MESSAGES)
        assert reply.text == "second"
        assert clock.now == pytest.approx(30.0)  # it waited before asking
        assert len(srv.requests) == 2
