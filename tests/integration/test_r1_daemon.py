"""R1 through the daemon: acknowledged means committed, for clients of the control socket.

A client attaches to a session the daemon runs; the daemon is SIGKILLed at a random moment
(seeded). Every event the client received was pushed after its commit, so each one must be in
the DuckDB file with the same payload. 8 iterations here; tests/stress runs 200.

Each iteration starts the daemon in the foreground (``python -m orchestrator.daemon``) in the
test's private runtime dir; the next iteration's daemon takes over what the killed one left
(stale socket, NATS server, sandboxes) and the last one is stopped cleanly, so nothing is left.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event
from orchestrator.errors import ApiError
from orchestrator.testing import FakeModelServer
from tests.helpers import pids_alive, wait_until, write_config
from tests.integration.test_r1_durability import stored_events

ITERATIONS = 8
SEED = 20261130
# From the moment the session is created: covers model calls, cells and their commits.
KILL_WINDOW_S = (0.0, 3.0)
DAEMON_READY_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 30.0
READY_POLL_S = 0.1
# Each iteration starts a daemon (imports, NATS, store, warm pool): bounded as a whole.
TEST_TIMEOUT_S = 1200

# Many small steps, so a kill lands between and inside commits.
SCRIPT = """
repeat 3:
    code: print(sum(range(1000)))
    ---
    code: print(sum(range(999)))
---
text: done
"""


def _start_daemon() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.daemon"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
        start_new_session=True,
    )


async def _connect_ready(proc: subprocess.Popen[bytes]) -> ControlClient:
    """A client of ``proc`` once it answers ``ping`` with ready (bounded)."""
    async with asyncio.timeout(DAEMON_READY_TIMEOUT_S):
        while True:
            assert proc.poll() is None, f"the daemon exited with {proc.returncode}"
            try:
                client = await ControlClient.connect()
            except ApiError:
                await asyncio.sleep(READY_POLL_S)
                continue
            if (await client.call("ping"))["ready"]:
                return client
            await client.close()
            await asyncio.sleep(READY_POLL_S)


async def _watch_and_kill(proc: subprocess.Popen[bytes], delay: float) -> list[dict[str, Any]]:
    """Create a session with a task, collect the events pushed to an attached client, and
    SIGKILL the daemon after ``delay`` seconds. Returns the events the client saw."""
    client = await _connect_ready(proc)
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        created = await client.call(
            "create_session", cwd=str(Path.cwd()), task="go", model="openai/fake"
        )
        attached = await client.call("attach", session=created["session"], cursor=0)
        for event in attached["events"]:
            seen[(event["session_id"], event["seq"])] = event

        async def collect() -> None:
            async for message in client.events():
                if isinstance(message, Event):
                    seen.setdefault((message.session, message.cursor), message.event)

        collector = asyncio.create_task(collect())
        await asyncio.sleep(delay)  # the random moment of the crash (not a synchronization)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=EXIT_TIMEOUT_S)
        # The connection ends with the daemon; whatever arrived before is what was "seen".
        async with asyncio.timeout(EXIT_TIMEOUT_S):
            await collector
    finally:
        await client.close()
    return list(seen.values())


def kill_daemon_and_check(rng: random.Random) -> int:
    """One iteration; returns how many events the client had seen."""
    proc = _start_daemon()
    try:
        seen = asyncio.run(_watch_and_kill(proc, rng.uniform(*KILL_WINDOW_S)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)
    stored = stored_events()
    for event in seen:
        assert event["id"] in stored, f"acknowledged event {event['type']} #{event['seq']} lost"
        assert stored[event["id"]]["payload"] == event["payload"]
    return len(seen)


def stop_cleanly() -> None:
    """A last daemon takes over what the killed ones left and stops with all of it (R8)."""
    proc = _start_daemon()

    async def shutdown() -> None:
        client = await _connect_ready(proc)
        try:
            await client.call("shutdown", force=True)
        finally:
            await client.close()

    asyncio.run(shutdown())
    assert proc.wait(timeout=EXIT_TIMEOUT_S * 2) == 0
    assert wait_until(lambda: not pids_alive([proc.pid]), timeout=EXIT_TIMEOUT_S)


def run_iterations(model: FakeModelServer, iterations: int, seed: int) -> int:
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/fake"]\napi_base = "{model.url}"\n'
    )
    rng = random.Random(seed)
    total = 0
    try:
        for _ in range(iterations):
            model.load(SCRIPT)
            total += kill_daemon_and_check(rng)
    finally:
        stop_cleanly()
    return total


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_daemon_sigkill_at_random_moments_loses_no_acknowledged_event() -> None:
    with FakeModelServer(SCRIPT) as model:
        total = run_iterations(model, ITERATIONS, SEED)
    # Some iterations must have been killed after events were pushed, or this proves nothing
    # (seeded: the same moments every run).
    assert total > 0, "no event was ever pushed to the client before a kill"
