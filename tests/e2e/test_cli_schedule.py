"""Schedules and heartbeats as a user runs them (issue 8 bullet 3): a real daemon (started by
the CLI) with its scheduler, a real kernel, the scripted model, a real DuckDB file.

- ``schedule add … "in 1s" …`` wakes the inactive session and delivers the prompt once;
  ``schedule list`` / ``cancel``;
- a tick claimed by a daemon killed with ``kill -9`` before delivering it is marked interrupted
  at the next start and never delivered;
- ``heartbeat`` sets, shows and stops the session's heartbeat; bad specs are one line.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from collections.abc import Iterator
from typing import Any, Final

import pytest

from orchestrator.paths import Paths
from orchestrator.store import schedules as schedule_store
from orchestrator.store.db import Store
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, kill_9, stop_daemons, wait_until, write_config

SCRIPT: Final = """
repeat forever:
    when "check the build": text: build checked
    when "first task": text: first done
    else: text: ok
"""
DELIVERY_TIMEOUT_S: Final = 60.0


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        )
        yield srv
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])


def _observed(selector: str) -> list[dict[str, Any]]:
    proc = cli(["observe", selector, "--json", "--last", "50"])
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout)["events"])


def _said(selector: str, text: str) -> bool:
    return any(
        e["type"] == "assistant_message" and e["payload"].get("text") == text
        for e in _observed(selector)
    )


def test_a_schedule_wakes_its_session_and_delivers_once(model: FakeModelServer) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    added = cli(["schedule", "add", "first task", "in 1s", "check the build", "--label", "ci"])
    assert added.returncode == 0, added.stderr
    schedule_id = added.stdout.split()[0]
    assert wait_until(lambda: _said("first task", "build checked"), timeout=DELIVERY_TIMEOUT_S)
    events = _observed("first task")
    ticks = [e["payload"] for e in events if e["type"] == "schedule_tick"]
    assert [(t["schedule_id"], t["status"], t["label"]) for t in ticks] == [
        (schedule_id, "delivered", "ci")
    ]
    prompts = [e["payload"] for e in events if e["type"] == "user_message"]
    assert prompts[-1]["text"].endswith("check the build") and prompts[-1]["source"] == "user"
    listed = cli(["schedule", "list", "first task", "--all", "--json"])
    [row] = json.loads(listed.stdout)
    assert (row["status"], row["run_count"]) == ("completed", 1)
    again = cli(["schedule", "add", "first task", "every 5s", "too often"])
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "10" in again.stderr
    repeating = cli(["schedule", "add", "first task", "every 1h", "hourly"])
    assert repeating.returncode == 0, repeating.stderr
    gone = cli(["schedule", "cancel", repeating.stdout.split()[0]])
    assert gone.returncode == 0 and "cancelled" in gone.stdout, gone.stdout
    assert cli(["schedule", "list", "first task"]).stdout.strip() == "no schedules"


def test_a_tick_claimed_before_kill_9_is_interrupted_not_replayed(
    model: FakeModelServer,
) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    added = cli(["schedule", "add", "first task", "every 1h", "check the build"])
    assert added.returncode == 0, added.stderr
    schedule_id = added.stdout.split()[0]
    [pid] = daemon_pids()
    kill_9(pid, DELIVERY_TIMEOUT_S)

    async def claim_as_the_dead_daemon_did() -> str:
        # The state kill -9 leaves between claiming a due tick and delivering it.
        async with await Store.open(Paths.from_env().database_file) as store:
            later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
            dispatch = await store.transaction(
                lambda con: schedule_store.claim_due(con, schedule_id, later)
            )
            assert dispatch is not None
            return dispatch.id

    dispatch_id = asyncio.run(claim_as_the_dead_daemon_did())
    listed = cli(["schedule", "list", "first task", "--json"])  # starts a new daemon
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["status"] == "active" and row["run_count"] == 1
    events = _observed("first task")
    ticks = [e["payload"] for e in events if e["type"] == "schedule_tick"]
    assert [(t["dispatch_id"], t["status"]) for t in ticks] == [(dispatch_id, "interrupted")]
    assert not any("check the build" in str(e["payload"].get("text")) for e in events)


def test_heartbeat_set_show_and_stop(model: FakeModelServer) -> None:
    first = cli(["-p", "first task", "--model", "openai/fake"])
    assert first.returncode == 0, first.stderr
    made = cli(["heartbeat", "first task", "every", "10m", "check the build"])
    assert made.returncode == 0, made.stderr
    shown = cli(["heartbeat", "first task", "status"])
    assert "every 10m" in shown.stdout and "check the build" in shown.stdout, shown.stdout
    bad = cli(["heartbeat", "first task", "every", "5s", "too often"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    stopped = cli(["heartbeat", "first task", "stop"])
    assert stopped.returncode == 0, stopped.stderr
    assert cli(["schedule", "list", "first task"]).stdout.strip() == "no schedules"


def _live(selector: str) -> bool:
    proc = cli(["observe", selector, "--json", "--last", "1"])
    assert proc.returncode == 0, proc.stderr
    return bool(json.loads(proc.stdout)["session"]["live"])


def test_an_active_heartbeat_keeps_its_session_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle unload (1 s here) unloads a quiet session, but not one with an active heartbeat."""
    monkeypatch.setenv("PRIME_AGENT_DAEMON_AUTOSTART", "1")
    with FakeModelServer(SCRIPT) as srv:
        write_config(
            "model_max_retries = 0\nidle_unload_seconds = 1.0\n"
            f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
        )
        for task in ("first task", "other task"):
            assert cli(["-p", task, "--model", "openai/fake"]).returncode == 0
        pinned = cli(["heartbeat", "first task", "every", "1h", "check the build"])
        assert pinned.returncode == 0, pinned.stderr
        for task in ("first task", "other task"):  # both loaded by a message
            assert cli(["send", task, "hello"]).returncode == 0
        assert wait_until(lambda: not _live("other task"), timeout=DELIVERY_TIMEOUT_S)
        assert _live("first task")
        assert cli(["heartbeat", "first task", "stop"]).returncode == 0
        assert wait_until(lambda: not _live("first task"), timeout=DELIVERY_TIMEOUT_S)
    stop_daemons(os.environ["XDG_RUNTIME_DIR"])
