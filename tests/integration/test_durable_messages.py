# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""Waking unloaded sessions and durable agent messages (R4), with real processes.

- In process: a message to a child that exists only in the store loads it (model, context from
  the active path, budget), closes its interrupted cell, tells it the REPL is fresh, and its
  answer is built on the old context; mailbox redelivery submits each message once.
- Through the daemon: a message queued behind a child's long cell survives ``kill -9`` of the
  daemon; the restarted daemon reloads the child (its sandbox adopted, the long cell
  interrupted) and the message enters its context exactly once, also after a second crash.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.client import ControlClient
from orchestrator.ids import new_event_id, new_session_id, new_tool_call_id
from orchestrator.models.registry import ResolvedModel, resolve_model
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.bus_link import NatsSessionBus
from orchestrator.sessions.family import FamilyService
from orchestrator.sessions.live import child_id_for
from orchestrator.sessions.manager import INTERRUPTED_CELL_TEXT, RELOADED_NOTICE, Orchestrator
from orchestrator.sessions.redelivery import redeliver_pending
from orchestrator.sessions.sandbox_records import ADOPTED_NOTICE
from orchestrator.settings import Settings
from orchestrator.store.db import EventRecord, SessionRecord, Store
from orchestrator.store.events import (
    AssistantMessagePayload,
    ToolCall,
    UserMessagePayload,
)
from orchestrator.testing import FakeModelServer
from tests.helpers import kill_9, write_config
from tests.integration.test_daemon import _daemon_pids, daemon_cli

FAST = Settings(retry_base_delay_s=0.01, model_max_retries=1, cell_timeout_s=120.0)
# Bounds, not expectations (a loaded machine starts a kernel gateway in seconds).
QUIET_TIMEOUT_S = 90.0
POLL_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
# The child's cell outlasts the test: only the daemon's death ends it.
NAP_S = 600
NAP_MARKER = "napping"  # the child's long cell creates it (in the session cwd) once it runs
SECRET = "PINEAPPLE"


def _user_texts(events: list[EventRecord]) -> list[str]:
    return [str(e.payload["text"]) for e in events if e.type == "user_message"]


async def _family_rows(store: Store, model: str) -> tuple[SessionRecord, SessionRecord]:
    """A root and its child "helper" as an earlier run left them: inactive, not loaded. The
    child's last cell never got its result (its orchestrator died during it)."""
    root_id, child_id = new_session_id(), new_session_id()
    root = SessionRecord(
        id=root_id, root_id=root_id, cwd=str(Path.cwd()), model=model, backend="local",
        name="boss", status="inactive",
    )  # fmt: skip
    child = SessionRecord(
        id=child_id, root_id=root_id, parent_id=root_id, cwd=str(Path.cwd()), model=model,
        backend="local", name="helper", depth=1, status="inactive",
        rlm_child_id=child_id_for(child_id),
    )  # fmt: skip
    await store.create_session(root)
    await store.create_session(child)
    await store.append(root_id, "user_message", UserMessagePayload(text="start"))
    await store.append(
        child_id,
        "user_message",
        UserMessagePayload(text=f"remember the word {SECRET}", source="parent", sender=root_id),
    )
    call = ToolCall(id=new_tool_call_id(), name="ipython", arguments='{"code": "x = 1"}')
    await store.append(
        child_id,
        "assistant_message",
        AssistantMessagePayload(
            text="noting it", tool_calls=[call], stop_reason="tool_calls", provider="openai",
            model="fake",
        ),
    )  # fmt: skip
    return root, child


WAKE_SCRIPT = """
repeat forever:
    when "finished without messaging you":
        text: boss noted
    when "what was the word?":
        text: the word was remembered
"""


async def test_a_message_wakes_an_unloaded_child_with_its_old_context() -> None:
    paths = Paths.from_env()
    with FakeModelServer(WAKE_SCRIPT) as srv:

        async def resolve(selector: str) -> ResolvedModel:
            return resolve_model(selector, FAST, api_base=srv.url, env={})

        async with await Store.open(paths.database_file) as store:
            root_rec, child_rec = await _family_rows(store, "openai/fake")
            orch = Orchestrator(
                store=store,
                backend=LocalBackend(pool_size=0),
                settings=FAST,
                paths=paths,
                resolve=resolve,
            )
            try:
                assert orch.sessions == {}
                root = await orch.load_session(root_rec)
                assert list(orch.sessions) == [root.id]  # the child is not loaded with it
                family = FamilyService(orch)
                listed = await family.message_list_agents(root.id, {})
                assert [c["name"] for c in listed["children"]] == ["helper"]
                assert listed["children"][0]["status"] == "inactive"
                receipt = await family.message_send(
                    root.id,
                    {
                        "message": "what was the word?",
                        "receiver_role": "child",
                        "receiver_name": "helper",
                        "mode": "follow_up",
                    },
                )
                assert receipt["status"] == "delivered" and receipt["target"] == "helper"
                await orch.wait_quiet(root.record.root_id, QUIET_TIMEOUT_S)
            finally:
                await orch.close()
            child_events = await store.events(child_rec.id)
            root_events = await store.events(root_rec.id)
        requests = list(srv.requests)

    # The child's request carried its old context, the closed cell and the fresh-REPL notice.
    child_request = requests[0]["messages"]
    contents = [str(m.get("content")) for m in child_request]
    assert any(SECRET in c for c in contents), contents
    assert INTERRUPTED_CELL_TEXT in contents
    assert RELOADED_NOTICE in contents
    assert contents[-1].endswith("what was the word?")  # the message stays last
    results = [e.payload for e in child_events if e.type == "tool_result"]
    assert [r["status"] for r in results] == ["interrupted"]
    ids = [e.payload.get("message_id") for e in child_events if e.type == "user_message"]
    assert ids.count(receipt["id"]) == 1
    # The child finished without replying: its parent heard, on its own wake-up turn.
    assert any("finished without messaging you" in t for t in _user_texts(root_events))
    assert str(requests[1]["messages"][-1]["content"]).startswith("[subagent helper")
    assert len(requests) == 2


REDELIVER_SCRIPT = """
repeat forever:
    when "second message":
        text: got the second
"""


async def test_redelivery_skips_recorded_messages_and_submits_the_rest_once() -> None:
    """The crash windows of R4 without a crash: one message was recorded but its ack was lost,
    one was only in the mailbox. A fresh orchestrator submits the second only, and both leave
    the mailbox."""
    paths = Paths.from_env()
    with FakeModelServer(REDELIVER_SCRIPT) as srv:

        async def resolve(selector: str) -> ResolvedModel:
            return resolve_model(selector, FAST, api_base=srv.url, env={})

        async with await Store.open(paths.database_file) as store:
            root_rec, child_rec = await _family_rows(store, "openai/fake")
            first, second = "m-" + new_event_id(), "m-" + new_event_id()
            envelopes = []
            for message_id, text in ((first, "first message"), (second, "second message")):
                payload = UserMessagePayload(
                    text=text, source="agent", sender=root_rec.id, sender_label="parent",
                    message_id=message_id,
                )  # fmt: skip
                envelopes.append(
                    {"id": message_id, "mode": "follow_up", "payload": payload.model_dump()}
                )
            # The first entered the child's history before the crash; its ack did not happen.
            await store.append(
                child_rec.id, "user_message", UserMessagePayload(**envelopes[0]["payload"])
            )
            bus = NatsSessionBus(paths)
            orch = Orchestrator(
                store=store,
                backend=LocalBackend(pool_size=0),
                settings=FAST,
                paths=paths,
                bus=bus,
                resolve=resolve,
            )
            try:
                await bus.start(FamilyService(orch).handlers())
                for envelope in envelopes:
                    await bus.put_message(child_rec.id, envelope)
                assert await bus.sessions_with_messages() == [child_rec.id]
                assert await redeliver_pending(orch) == 1
                assert await redeliver_pending(orch) == 0  # queued in memory: not twice
                await orch.wait_quiet(root_rec.id, QUIET_TIMEOUT_S)
                assert await bus.pending_messages(child_rec.id) == []
                # The parent's wake-up notice went through its mailbox too, and was acked.
                assert await bus.pending_messages(root_rec.id) == []
            finally:
                await orch.close()
                await bus.close()
            child_events = await store.events(child_rec.id)
    ids = [e.payload.get("message_id") for e in child_events if e.type == "user_message"]
    assert ids.count(first) == 1 and ids.count(second) == 1
    assert str(srv.requests[0]["messages"][-1]["content"]).endswith("second message")


# ------------------------------------------------------------------- R4 through the daemon

R4_SCRIPT = f"""
repeat forever:
    when "finished without messaging you":
        text: root noted
    when "spawn the napper":
        code:
            h = await rlm("nap for a while", name="napper")
            r = await agent_message.send("wake up and report", receiver_role="child", receiver_name="napper", mode="follow_up")
            print("receipt", r.status, r.id)
    when "receipt":
        text: root waits
    when "nap for a while":
        code: open({NAP_MARKER!r}, "w").close(); import time; time.sleep({NAP_S}); print("napped")
    when "wake up and report":
        text: reporting after restart
"""
# Model calls before the crash: the root's spawn, the child's nap, the root's wait.
REQUESTS_BEFORE_CRASH = 3
# After it: the reloaded child's answer, and the root woken by its notice.
REQUESTS_IN_ALL = 5


@pytest.fixture
def r4_model() -> Any:
    srv = FakeModelServer(R4_SCRIPT).start()
    write_config(
        "retry_base_delay_s = 0.01\nmodel_max_retries = 1\n"
        f'[models."openai/fake"]\napi_base = "{srv.url}"\n'
    )
    yield srv
    srv.close()


def _start_daemon() -> int:
    started = daemon_cli("start")
    assert started.returncode == 0, started.stderr
    (pid,) = _daemon_pids()
    return pid


def _kill_daemon(pid: int) -> None:
    kill_9(pid, STOP_TIMEOUT_S)


async def _poll(what: str, probe: Any) -> Any:
    """``await probe()`` until it returns something truthy, within POLL_TIMEOUT_S."""
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            while True:
                found = await probe()
                if found:
                    return found
                await asyncio.sleep(POLL_INTERVAL_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _events(client: ControlClient, sid: str) -> list[dict[str, Any]]:
    replay = await client.call("attach", session=sid, cursor=0)
    assert not replay["snapshot"]
    return list(replay["events"])


async def _sessions(client: ControlClient) -> dict[str, dict[str, Any]]:
    rows = (await client.call("list_sessions"))["sessions"]
    return {str(r["name"]): r for r in rows}


async def _before_crash(cwd: Path, model: FakeModelServer) -> tuple[str, str, str]:
    client = await ControlClient.connect()
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="spawn the napper", model="openai/fake"
        )
        root = str(created["session"])

        async def receipt() -> str | None:
            for e in await _events(client, root):
                text = str(e["payload"].get("text", ""))
                if e["type"] == "tool_result" and text.startswith("receipt"):
                    return text
            return None

        receipt_text = await _poll("the root's receipt", receipt)
        match = re.match(r"receipt (\w+) (m-\S+)", receipt_text)
        assert match is not None, receipt_text
        assert match.group(1) == "queued"  # the child was busy: queued behind its turn
        child = str((await _sessions(client))["napper"]["id"])

        async def napping() -> bool:
            calls = [e for e in await _events(client, child) if e["type"] == "assistant_message"]
            rows = await _sessions(client)
            return (
                bool(calls)
                and rows["napper"]["status"] == "running"
                and rows["spawn the napper"]["status"] == "idle"
                and len(model.requests) == REQUESTS_BEFORE_CRASH
            )

        await _poll("the child's long cell with the root idle", napping)

        async def in_kernel() -> bool:  # the cell runs (its sandbox is not still starting)
            return (cwd / NAP_MARKER).exists()

        await _poll("the child's long cell in its kernel", in_kernel)
        return root, child, match.group(2)
    finally:
        await client.close()


async def _after_restart(root: str, child: str, message_id: str) -> list[dict[str, Any]]:
    client = await ControlClient.connect()
    try:

        async def root_noted() -> bool:
            return (
                any(
                    e["type"] == "assistant_message" and e["payload"]["text"] == "root noted"
                    for e in await _events(client, root)
                )
                and (await _sessions(client))["spawn the napper"]["status"] == "idle"
            )

        await _poll("the root to hear from the reloaded child", root_noted)
        return await _events(client, child)
    finally:
        await client.close()


def _deliveries(events: list[dict[str, Any]], message_id: str) -> int:
    return sum(
        1
        for e in events
        if e["type"] == "user_message" and e["payload"].get("message_id") == message_id
    )


def test_a_queued_message_survives_a_daemon_crash_and_is_delivered_once(
    r4_model: FakeModelServer, tmp_path: Path
) -> None:
    pid = _start_daemon()
    try:
        root, child, message_id = asyncio.run(_before_crash(tmp_path, r4_model))
        # kill -9: the child's sandbox (mid-cell), NATS and its JetStream mailbox survive; the
        # message was only queued in memory when the daemon died. The restarted daemon adopts
        # the sandbox (interrupting the cell) before it redelivers.
        _kill_daemon(pid)
        pid = _start_daemon()
        events = asyncio.run(_after_restart(root, child, message_id))
        assert _deliveries(events, message_id) == 1
        types = [e["type"] for e in events]
        assert "aborted" in types  # the interrupted turn is marked, not silently resumed
        results = [e["payload"] for e in events if e["type"] == "tool_result"]
        assert [r["status"] for r in results] == ["interrupted"]
        assert len(r4_model.requests) == REQUESTS_IN_ALL
        woken = [
            str(m.get("content")) for m in r4_model.requests[REQUESTS_BEFORE_CRASH]["messages"]
        ]
        assert woken[-1].endswith("wake up and report")
        assert sum("wake up and report" in m for m in woken) == 1
        assert INTERRUPTED_CELL_TEXT in woken and ADOPTED_NOTICE in woken

        # A second crash: nothing is left to redeliver, so nothing is woken or delivered again.
        _kill_daemon(pid)
        pid = _start_daemon()

        async def settled() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
            client = await ControlClient.connect()
            try:
                rows = await _sessions(client)
                return await _events(client, child), rows
            finally:
                await client.close()

        # list_sessions before attach (which wakes): redelivery runs before `ready`, so a
        # redelivered message would have loaded the child already.
        again, rows = asyncio.run(settled())
        assert not rows["napper"]["live"], rows  # "completed": its last turn had ended
        assert _deliveries(again, message_id) == 1
        assert len(r4_model.requests) == REQUESTS_IN_ALL
    finally:
        if _daemon_pids():
            daemon_cli("stop", "--force")
        for leftover in _daemon_pids():
            os.kill(leftover, signal.SIGKILL)
