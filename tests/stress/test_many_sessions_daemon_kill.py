"""Many sessions through one daemon, the daemon or its model-call workers SIGKILLed mid-step
(issue 18 item 8; not in CI).

``SESSIONS`` sessions each run a task of ``STEPS`` code steps then an answer, all at once. Once
``KILL_AFTER_FRACTION`` of them have finished a step, the daemon gets SIGKILL while the rest are
mid-step. Then:

- nothing acknowledged is lost: every event an attached client received is in the database,
  with the same payload (R1);
- every session finishes: a new daemon adopts the sandboxes, each interrupted turn continues
  (R2), and every session ends with the answer.

The worker variant runs the daemon with ``MODEL_WORKERS`` model-call workers and kills every
one of them instead, at the same moment: the daemon replaces them, the attempts they were
reading are retried, every session finishes on the same daemon, and every event a client was
sent is in the database after it stops.

The scripted model is one script for every session, so a session's progress is a counter in
its own kernel: a code step prints ``step N``, and the model answers once N reaches ``STEPS``
(N can pass it: a turn continued after the crash runs one more step first). A session that
never answers fails the test with its last events named. ``make test-stress`` runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any, Final

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.api.messages import Event
from orchestrator.testing import FakeModelServer
from tests.helpers import call_worker_pids, pids_alive, wait_until, write_config
from tests.integration.test_r1_daemon import (
    EXIT_TIMEOUT_S,
    _connect_ready,
    _start_daemon,
    stop_cleanly,
)
from tests.integration.test_r1_durability import stored_events

pytestmark = pytest.mark.stress

SESSIONS: Final = 50
STEPS: Final = 5
KILL_AFTER_FRACTION: Final = 0.5
FIRST_STEPS_TIMEOUT_S: Final = 900.0
FINISH_TIMEOUT_S: Final = 1800.0
TEST_TIMEOUT_S: Final = 3 * 3600
LAST_EVENTS_SHOWN: Final = 6
MODEL_WORKERS: Final = 2

COUNTER: Final = "try:\n    n += 1\nexcept NameError:\n    n = 1\nprint(f'step {n}')"


def _script() -> str:
    def code(extra: str) -> str:
        body = "\n".join(" " * 12 + line for line in (COUNTER + extra).splitlines())
        return f"        code:\n{body}"

    # Counts from STEPS up answer; below it, each step's code differs (no stuck-loop stop).
    branches = ['    when re "step ([5-9]|[0-9]{2,})(?![0-9])":\n        text: done']
    for k in range(1, STEPS):
        branches.append(f'    when re "step {k}(?![0-9])":\n' + code(f"\n_after = {k}"))
    return "repeat forever:\n" + "\n".join(branches) + f"\n    else:\n{code('')}\n"


def _answered(event: dict[str, Any]) -> bool:
    return bool(event["type"] == "assistant_message" and event["payload"].get("text") == "done")


class Watcher:
    """Every event pushed to one attached client, by (session, seq)."""

    def __init__(self, client: ControlClient, ids: list[str]) -> None:
        self.client, self.ids = client, ids
        self.seen: dict[tuple[str, int], dict[str, Any]] = {}
        self.stepped: set[str] = set()
        self.answered: set[str] = set()
        self.changed = asyncio.Event()

    def take(self, event: dict[str, Any]) -> None:
        self.seen.setdefault((event["session_id"], event["seq"]), event)
        if event["type"] == "tool_result":
            self.stepped.add(event["session_id"])
        if _answered(event):
            self.answered.add(event["session_id"])
        self.changed.set()

    async def attach(self) -> None:
        for sid in self.ids:
            for event in (await self.client.call("attach", session=sid, cursor=0))["events"]:
                self.take(event)

    async def run(self) -> None:
        async for message in self.client.events():
            if isinstance(message, Event):
                self.take(message.event)

    async def until(self, done: Any, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                self.changed.clear()
                await self.changed.wait()

    def last_events(self, sid: str) -> str:
        mine = sorted((seq, e) for (s, seq), e in self.seen.items() if s == sid)
        return "; ".join(
            f"{e['type']} {json.dumps(e['payload'])[:80]}" for _, e in mine[-LAST_EVENTS_SHOWN:]
        )


async def _start_all_until_half_stepped(
    client: ControlClient,
) -> tuple[list[str], Watcher, asyncio.Task[None]]:
    """``SESSIONS`` sessions prompted at once and watched, once ``KILL_AFTER_FRACTION`` of
    them have finished a step (and not all have answered): the moment of the kill."""
    ids = [
        (await client.call("create_session", cwd=str(Path.cwd()), model="openai/fake"))["session"]
        for _ in range(SESSIONS)
    ]
    watcher = Watcher(client, ids)
    await watcher.attach()
    task = asyncio.create_task(watcher.run())
    await asyncio.gather(*(client.call("prompt", session=sid, text="go") for sid in ids))
    await watcher.until(
        lambda: len(watcher.stepped) >= SESSIONS * KILL_AFTER_FRACTION, FIRST_STEPS_TIMEOUT_S
    )
    assert len(watcher.answered) < SESSIONS, "every session finished before the kill"
    return ids, watcher, task


async def _until_all_answered(watcher: Watcher, ids: list[str]) -> None:
    try:
        await watcher.until(lambda: watcher.answered >= set(ids), FINISH_TIMEOUT_S)
    except TimeoutError:
        stuck = [f"{sid}: {watcher.last_events(sid)}" for sid in ids if sid not in watcher.answered]
        raise AssertionError(
            f"{len(stuck)} sessions never answered:\n" + "\n".join(stuck)
        ) from None


async def _start_all_and_kill(proc: Any) -> tuple[list[str], list[dict[str, Any]]]:
    client = await _connect_ready(proc)
    try:
        ids, watcher, task = await _start_all_until_half_stepped(client)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=EXIT_TIMEOUT_S)
        async with asyncio.timeout(EXIT_TIMEOUT_S):
            await task  # the connection ends with the daemon
    finally:
        await client.close()
    return ids, list(watcher.seen.values())


def _check_acknowledged(seen: list[dict[str, Any]]) -> None:
    stored = stored_events()
    for event in seen:
        assert event["id"] in stored, f"acknowledged {event['type']} #{event['seq']} lost"
        assert stored[event["id"]]["payload"] == event["payload"]


async def _finish(proc: Any, ids: list[str]) -> None:
    client = await _connect_ready(proc)
    try:
        watcher = Watcher(client, ids)
        await watcher.attach()
        task = asyncio.create_task(watcher.run())
        try:
            await _until_all_answered(watcher, ids)
        finally:
            task.cancel()
    finally:
        await client.close()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_many_sessions_survive_a_daemon_sigkill_mid_step() -> None:
    with FakeModelServer(_script()) as model:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/fake"]\napi_base = "{model.url}"\n'
        )
        proc = _start_daemon()
        try:
            ids, seen = asyncio.run(_start_all_and_kill(proc))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_TIMEOUT_S)
        _check_acknowledged(seen)
        second = _start_daemon()
        try:
            asyncio.run(_finish(second, ids))
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(timeout=EXIT_TIMEOUT_S)
            stop_cleanly()


async def _kill_the_workers_and_finish(proc: Any) -> tuple[list[dict[str, Any]], list[int]]:
    client = await _connect_ready(proc)
    try:
        ids, watcher, task = await _start_all_until_half_stepped(client)
        workers = call_worker_pids(proc.pid)  # started by demand: every slot has sessions
        assert len(workers) == MODEL_WORKERS
        try:
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            await _until_all_answered(watcher, ids)
            replaced = call_worker_pids(proc.pid)
            assert len(replaced) == MODEL_WORKERS and not set(replaced) & set(workers)
            assert not pids_alive(workers)
        finally:
            task.cancel()
        await client.call("shutdown", force=True)
    finally:
        await client.close()
    return list(watcher.seen.values()), replaced


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_many_sessions_survive_their_model_workers_sigkilled_mid_step() -> None:
    with FakeModelServer(_script()) as model:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 3\n"
            f"[daemon]\nmodel_workers = {MODEL_WORKERS}\n"
            f'[models."openai/fake"]\napi_base = "{model.url}"\n'
        )
        proc = _start_daemon()
        try:
            seen, replaced = asyncio.run(_kill_the_workers_and_finish(proc))
            assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_TIMEOUT_S)
        _check_acknowledged(seen)
        # The daemon stopped the workers it started in their place (R8).
        assert wait_until(lambda: not pids_alive(replaced), timeout=EXIT_TIMEOUT_S)
