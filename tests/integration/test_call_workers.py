"""Model-call workers (orchestrator/models/call_workers.py, call_worker.py): real worker
processes against the scripted model over real HTTP.

A reply read by a worker is the reply read in the loop (text, tool calls, finish, usage and
cost, the streamed text); a worker killed with -9 mid-stream costs one retried attempt and a
new worker takes its place; a cancelled call leaves the worker serving; the pool's size
follows the machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, Final

import pytest

from orchestrator.models.call_workers import CallWorkers, auto_worker_count
from orchestrator.models.client import ModelClient
from orchestrator.models.openai_stream import OpenAIStream
from orchestrator.models.registry import resolve_model
from orchestrator.models.reply import AttemptFailed, ModelReply, RetryInfo
from orchestrator.procs import pid_alive
from orchestrator.settings import Settings
from orchestrator.testing import FakeModelServer
from tests.helpers import call_worker_pids, wait_until, write_config
from tests.integration.test_r1_daemon import _connect_ready, _start_daemon

RETRIES: Final = 2
IDLE_TIMEOUT_S: Final = 10.0
WAIT_S: Final = 30.0
# Slow enough that the kill lands while the stream is still coming.
SLOW_CHUNK_S: Final = 0.05
MESSAGES: Final = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "go"},
]
TOOLS: Final = [
    {
        "type": "function",
        "function": {
            "name": "ipython",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]
REPLY_SCRIPT: Final = (
    "think: Six sevens are forty-two; check it in code.\n"
    "text: Let me compute that for you, step by step.\ncode: print(6 * 7)\nusage in=120 out=30"
)
SLOW_SCRIPT: Final = f"repeat forever:\n    chunk-delay {SLOW_CHUNK_S}\n    text: {'word ' * 40}"


def _settings() -> Settings:
    return Settings(
        model_max_retries=RETRIES,
        retry_base_delay_s=0.01,
        model_stream_idle_timeout_s=IDLE_TIMEOUT_S,
    )


def _client(srv: FakeModelServer, pool: CallWorkers | None) -> ModelClient:
    settings = _settings()
    model = resolve_model("openai/gpt-4o-mini", settings, api_base=srv.url, env={})
    client = ModelClient(model, settings)
    assert isinstance(client.transport, OpenAIStream)
    if pool is not None:
        client.transport = OpenAIStream(model, settings, pool.exchanger())
    return client


def _seen(reply: ModelReply, deltas: list[tuple[str, str]]) -> dict[str, Any]:
    usage = reply.usage.model_dump()
    usage.pop("latency_ms")
    return {
        "text": reply.text,
        "thinking": reply.thinking,
        "calls": [(c.name, c.arguments) for c in reply.tool_calls],
        "finish": reply.finish_reason,
        "usage": usage,
        "streamed": "".join(text for kind, text in deltas if kind == "text"),
        "thought": "".join(text for kind, text in deltas if kind == "thinking"),
        # the kinds in the order they came, each run once: thinking before text
        "order": [kind for i, (kind, _) in enumerate(deltas) if i == 0 or deltas[i - 1][0] != kind],
    }


async def test_a_reply_read_by_a_worker_is_the_reply_read_in_the_loop() -> None:
    pool = CallWorkers(1)
    try:
        seen = []
        for workers in (None, pool):
            with FakeModelServer(REPLY_SCRIPT) as srv:
                deltas: list[tuple[str, str]] = []
                reply = await _client(srv, workers).complete(
                    MESSAGES,
                    tools=TOOLS,
                    on_delta=lambda text, kind, into=deltas: into.append((kind, text)),
                )
                seen.append(_seen(reply, deltas))
        in_loop, in_worker = seen
        assert in_worker == in_loop
        assert in_worker["usage"]["cost_usd"] is not None  # priced from the map, in the daemon
        assert in_worker["streamed"] == in_worker["text"] != ""
        assert (
            in_worker["thought"]
            == in_worker["thinking"]
            == ("Six sevens are forty-two; check it in code.")
        )
        assert in_worker["order"] == ["thinking", "text"]
        assert len(pool.pids()) == 1
    finally:
        await pool.close()


async def test_a_worker_killed_mid_stream_costs_one_retried_attempt() -> None:
    """kill -9 of the worker while it reads a stream: the attempt fails as a dropped
    connection, the client retries it (a retry the session records), a new worker runs it,
    and the call ends with the whole reply."""
    pool = CallWorkers(1)
    try:
        await pool.start()
        (first_pid,) = pool.pids()
        retries: list[RetryInfo] = []
        streaming = asyncio.Event()

        async def on_retry(info: RetryInfo) -> None:
            retries.append(info)

        def on_delta(_text: str, _kind: str) -> None:
            streaming.set()

        with FakeModelServer(SLOW_SCRIPT) as srv:
            call = asyncio.create_task(
                _client(srv, pool).complete(MESSAGES, on_delta=on_delta, on_retry=on_retry)
            )
            await asyncio.wait_for(streaming.wait(), WAIT_S)
            os.kill(first_pid, signal.SIGKILL)
            reply = await asyncio.wait_for(call, WAIT_S)
        assert reply.text.strip() == ("word " * 40).strip()
        assert [r.attempt for r in retries] == [1]
        assert f"model-call worker (pid {first_pid}) died" in retries[0].reason
        assert pool.restarts == 1
        assert not pid_alive(first_pid)
        assert pool.pids() and pool.pids() != [first_pid]
    finally:
        await pool.close()


async def test_a_cancelled_call_leaves_the_worker_serving() -> None:
    pool = CallWorkers(1)
    try:
        streaming = asyncio.Event()
        with FakeModelServer(SLOW_SCRIPT) as srv:
            client = _client(srv, pool)
            call = asyncio.create_task(
                client.complete(MESSAGES, on_delta=lambda _t, _k: streaming.set())
            )
            await asyncio.wait_for(streaming.wait(), WAIT_S)
            (pid,) = pool.pids()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            reply = await asyncio.wait_for(client.complete(MESSAGES), WAIT_S)
        assert reply.text.strip() == ("word " * 40).strip()
        assert pool.pids() == [pid] and pool.restarts == 0
    finally:
        await pool.close()
    assert not pid_alive(pid)


async def test_a_call_to_a_worker_that_just_died_fails_at_once() -> None:
    """The pool checks a worker is alive before it hands it an attempt; one that dies right
    after that check must fail the attempt as a dropped connection, not leave it waiting for
    an answer nobody will send."""
    from orchestrator.models.openai_stream import StreamRequest

    pool = CallWorkers(1)
    try:
        await pool.start()
        (worker,) = [w for w in pool._slots if w is not None]
        os.kill(worker.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(asyncio.shield(worker._reader), WAIT_S)
        request = StreamRequest("http://127.0.0.1:9/chat/completions", {}, b"{}", IDLE_TIMEOUT_S)
        with pytest.raises(AttemptFailed, match=r"model-call worker .* died") as failed:
            await asyncio.wait_for(worker.exchange(request, None), WAIT_S)
        assert failed.value.kind == "connection"
    finally:
        await pool.close()


async def test_workers_start_by_demand() -> None:
    """A slot's worker starts when a client is first pinned to it, not with the pool: one
    session costs one worker process."""
    pool = CallWorkers(2)
    try:
        assert pool.pids() == []
        pool.exchanger()
        await asyncio.wait_for(asyncio.gather(*pool._warming), WAIT_S)
        assert len(pool.pids()) == 1
        pool.exchanger()
        await asyncio.wait_for(asyncio.gather(*pool._warming), WAIT_S)
        assert len(pool.pids()) == 2
        pool.exchanger()  # back to the first slot: nothing new starts
        assert not pool._warming and len(pool.pids()) == 2
    finally:
        await pool.close()


def test_the_pool_follows_the_machine() -> None:
    """None on a small machine (workers there only add process switches: docs/benchmarks.md),
    else one per core the daemon's own loop does not need, at most AUTO_WORKERS_MAX."""
    assert [auto_worker_count(c) for c in (1, 2, 3, 4, 5, 16)] == [0, 0, 0, 3, 4, 4]
    with pytest.raises(ValueError):
        CallWorkers(0)


# --- through a daemon ----------------------------------------------------------------------------

SESSION_SCRIPT: Final = f"""repeat forever:
    when "ran":
        text: done
    else:
        chunk-delay {SLOW_CHUNK_S}
        text: {"word " * 40}
        code: print("ran")
"""
DAEMON_WAIT_S: Final = 120.0


async def _prompt_and_kill_the_worker(
    proc: Any, srv: FakeModelServer
) -> tuple[list[dict[str, Any]], int]:
    client = await _connect_ready(proc)
    try:
        assert call_worker_pids(proc.pid) == []  # by demand: no session, no worker
        sid = (await client.call("create_session", cwd=os.getcwd(), model="openai/fake"))["session"]
        # The session's client pins a slot, whose worker starts then, before the first call.
        assert wait_until(lambda: len(call_worker_pids(proc.pid)) == 1, timeout=DAEMON_WAIT_S)
        (worker,) = call_worker_pids(proc.pid)
        await client.call("prompt", session=sid, text="go")
        assert wait_until(lambda: len(srv.requests) >= 1, timeout=DAEMON_WAIT_S)
        os.kill(worker, signal.SIGKILL)  # mid-stream: the reply takes ~2 s to arrive
        async with asyncio.timeout(DAEMON_WAIT_S):
            while True:
                events = (await client.call("get_session", session=sid, recent=50))["events"]
                if any(
                    e["type"] == "assistant_message" and e["payload"].get("text") == "done"
                    for e in events
                ):
                    break
                await asyncio.sleep(0.1)
        (replacement,) = call_worker_pids(proc.pid)
        assert replacement != worker
        await client.call("shutdown", force=True)
        return list(events), replacement
    finally:
        await client.close()


@pytest.mark.timeout(300)
def test_a_daemon_session_goes_on_when_its_model_worker_is_killed() -> None:
    """Issue 18: a worker killed with -9 mid-step is replaced and the session continues: the
    attempt it was reading is recorded as a retry and made again, the step runs, the turn ends
    with the answer, and the daemon never noticed more than a dropped connection."""
    with FakeModelServer(SESSION_SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 2\n[daemon]\nmodel_workers = 1\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        )
        proc = _start_daemon()
        try:
            events, replacement = asyncio.run(_prompt_and_kill_the_worker(proc, srv))
            assert proc.wait(timeout=DAEMON_WAIT_S) == 0
            # The daemon stops its workers with it (R8).
            assert wait_until(lambda: not pid_alive(replacement), timeout=DAEMON_WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=DAEMON_WAIT_S)
    kinds = [e["type"] for e in events]
    (retry,) = [e for e in events if e["type"] == "retry"]
    assert "model-call worker" in retry["payload"]["reason"]
    assert kinds.count("tool_result") == 1 and kinds[-1] in ("turn_end", "assistant_message")
    assert len(srv.requests) == 3  # the killed attempt, its retry, and the answer
