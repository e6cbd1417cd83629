# ruff: noqa: E501  (scripts below are data: long code lines are the model's cells)
"""Subagents and family messaging (issue 3): real nats-server with per-session users, real
kernels, litellm over real HTTP to one scripted model that serves every session (guards pick
the step from the last message, so interleaved sessions stay deterministic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.sessions.manager import FamilyTimeout
from orchestrator.sessions.runner import RunOptions, RunResult, run_session
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store
from orchestrator.testing import FakeModelServer

FAST = Settings(retry_base_delay_s=0.01, model_max_retries=1, cell_timeout_s=60.0)


async def _run(
    script: str, task: str, settings: Settings = FAST
) -> tuple[RunResult, dict[str, SessionRecord], dict[str, list[tuple[str, dict[str, Any]]]], Any]:
    paths = Paths.from_env()
    with FakeModelServer(script) as srv:
        model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
        result = await run_session(
            RunOptions(task=task, cwd=Path.cwd(), backend="local"), model, settings, paths
        )
        requests = list(srv.requests)
    store = await Store.open(paths.database_file, read_only=True)
    try:
        sessions = {s.name or s.id: s for s in await store.list_sessions()}
        events = {
            name: [(e.type, e.payload) for e in await store.events(s.id)]
            for name, s in sessions.items()
        }
        usage = {u.session_id: u for u in await store.usage_summary()}
    finally:
        await store.close()
    return result, sessions, events, (requests, usage)


def _tool_texts(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [str(p["text"]) for t, p in events if t == "tool_result"]


THREE_CHILDREN = """
repeat forever:
    when "spawn three":
        code: hs = [await rlm(f"child {c}", name=c) for c in "abc"]; print("spawned", [h.name for h in hs])
    when "spawned":
        text: waiting for children
    when "[task from parent]":
        code:
            me = (await agent_message.list_agents()).self.name
            r = await agent_message.send(f"reply-from-{me}")
            print("sent", r.status)
    when "sent":
        text: done
    when "[message from child":
        text: noted
        usage in=10 out=5
"""


async def test_three_children_reply_and_the_root_waits_for_all() -> None:
    result, sessions, events, (requests, usage) = await _run(THREE_CHILDREN, "spawn three")
    assert result.outcome.reason == "completed" and result.outcome.final_text == "noted"
    root = sessions["spawn three"]
    children = [s for s in sessions.values() if s.parent_id == root.id]
    assert sorted(c.name or "" for c in children) == ["a", "b", "c"]
    assert all(c.depth == 1 and c.rlm_child_id and c.root_id == root.id for c in children)
    # Every reply entered the root's context before its final answer.
    root_msgs = [p["text"] for t, p in events["spawn three"] if t == "user_message"]
    for c in "abc":
        assert sum(f"reply-from-{c}" in m for m in root_msgs) == 1
    last_root_request = [r for r in requests if r["messages"][1]["content"] == "spawn three"][-1]
    seen = " ".join(str(m.get("content")) for m in last_root_request["messages"])
    assert all(f"reply-from-{c}" in seen for c in "abc")
    # Usage rolls up: the tree's rows are exactly the root's own plus each child's.
    tree = [root.id, *(c.id for c in children)]
    assert sum(usage[s].calls for s in tree) == len(requests)


PERMISSIONS = """
repeat forever:
    when "[subagent":
        text: seen
    when "[task from parent]":
        code:
            import asyncio, os, nats
            errors = []
            async def on_error(e):
                errors.append(str(e))
            root = (await agent_message.list_agents()).parent.session_id
            env = os.environ
            nc = await nats.connect(env["PRIME_AGENT_NATS_URL"], user=env["PRIME_AGENT_NATS_USER"], password=env["PRIME_AGENT_NATS_PASSWORD"], inbox_prefix=env["PRIME_AGENT_INBOX_PREFIX"], error_cb=on_error, allow_reconnect=False)
            await nc.publish(f"pa.host.{root}", b"{}")
            await nc.subscribe(f"_INBOX.{root}.>")
            await nc.subscribe("pa.>")
            for _ in range(100):
                if len(errors) >= 3:
                    break
                await asyncio.sleep(0.05)
            print("violations", len([e for e in errors if "permissions violation" in e]))
            await nc.close()
    when "violations":
        text: probed
    when "probe":
        code: h = await rlm("probe the bus", name="prober"); print("spawned")
    when "spawned":
        text: waiting
"""


async def test_child_credentials_cannot_reach_other_sessions() -> None:
    _, _sessions, events, _ = await _run(PERMISSIONS, "probe")
    out = _tool_texts(events["prober"])
    assert out == ["violations 3"], out


SIBLINGS_AND_DEPTH = """
repeat forever:
    when "leaf spawned":
        code: r = await agent_message.send("hello sibling", receiver_role="sibling", receiver_name="sib"); print("sib", r.status)
    when "family":
        code:
            mid = await rlm("be the middle", name="mid")
            sib = await rlm("be the sibling", name="sib")
            print("spawned")
    when "spawned":
        text: waiting
    when "be the middle":
        code: leaf = await rlm("be the leaf", name="leaf"); print("leaf spawned")
    when "sib ":
        text: mid done
    when "be the leaf":
        code:
            out = []
            for role, name in (("sibling", "family"), ("child", "family"), ("sibling", "sib")):
                try:
                    await agent_message.send("hi", receiver_role=role, receiver_name=name)
                    out.append("sent")
                except Exception as e:
                    out.append(type(e).__name__)
            try:
                await rlm.host_request("agent_message.send", {"message": "x", "receiver_role": "parent", "sender": "s-000000000000"})
                out.append("sent")
            except Exception as e:
                out.append(type(e).__name__)
            print("leaf", out)
    when "leaf [":
        text: leaf done
    when "be the sibling":
        text: sibling ready
    when "[message from sibling mid]":
        text: got it from mid
    else:
        text: ok
"""


async def test_siblings_talk_and_grandchildren_cannot_reach_the_grandparent() -> None:
    settings = FAST.with_overrides(max_depth=2)
    _, sessions, events, _ = await _run(SIBLINGS_AND_DEPTH, "family", settings)
    assert _tool_texts(events["leaf"]) == [
        "leaf ['NotFamily', 'NotFamily', 'NotFamily', 'InvalidArgument']"
    ]
    sib_msgs = [p for t, p in events["sib"] if t == "user_message" and p["source"] == "agent"]
    assert [m["text"] for m in sib_msgs] == ["hello sibling"]
    # The sender is who the credentials say, whatever a payload might claim.
    assert sib_msgs[0]["sender"] == sessions["mid"].id
    assert sessions["leaf"].depth == 2 and sessions["leaf"].parent_id == sessions["mid"].id


LIMITS = """
repeat forever:
    when "limits":
        code:
            ok, codes = 0, set()
            for i in range(1000):
                try:
                    await rlm("idle task", name=f"w{i}")
                    ok += 1
                except Exception as e:
                    codes.add(e.code)
            print("spawned", ok, sorted(codes))
    when "spawned":
        code:
            gone = await rlm.delete_subagent("w0")
            try:
                await rlm("greedy task", budget=10**9)
            except Exception as e:
                print("budget", type(e).__name__, gone.status)
    when "budget ":
        code: b = await rlm("spend task", name="spender", budget=100); print("spender started")
    when "spender started":
        text: waiting
    when "idle task":
        code:
            try:
                await rlm("grandchild")
            except Exception as e:
                print("depth", type(e).__name__)
    when "depth ":
        text: idle done
    when "spend task":
        code: print("spending")
        usage in=80 out=40
    when "spending":
        code: print("spending")
        usage in=80 out=40
    else:
        text: ok
"""


async def test_depth_quota_and_budget_are_enforced_by_the_host() -> None:
    settings = FAST.with_overrides(max_live_children=4, session_token_budget=1_000_000)
    _, sessions, events, (_, usage) = await _run(LIMITS, "limits", settings)
    root_out = _tool_texts(events["limits"])
    assert root_out[0] == "spawned 4 ['quota_exceeded']"
    assert root_out[1] == "budget BudgetExceeded deleted"
    assert sessions["w0"].status == "deleted"
    for i in range(1, 4):
        assert _tool_texts(events[f"w{i}"]) == ["depth DepthLimitExceeded"]
    spender = sessions["spender"]
    # 120 tokens per call against a budget of 100: exactly one call, then a typed stop.
    assert usage[spender.id].calls == 1
    assert any(t == "error" and p["kind"] == "budget" for t, p in events["spender"])
    notices = [p["text"] for t, p in events["limits"] if t == "notice"]
    assert any("spender" in n and "budget_exceeded" in n for n in notices)


WAKE = """
repeat forever:
    when "finished without messaging you":
        code: r = await agent_message.send("second job", receiver_role="child", receiver_name="worker"); print("sent", r.status)
    when "wake":
        code: h = await rlm("first job", name="worker"); print("spawned")
    when "spawned":
        text: waiting
    when "first job":
        text: first job finished
    when "sent delivered":
        text: asked again
    when "second job":
        code: await agent_message.send("second done"); print("replied")
    when "replied":
        text: worker idle
    when "second done":
        text: all done
    else:
        text: ok
"""


async def test_a_message_wakes_a_finished_child_and_lifecycle_notices_arrive() -> None:
    result, _sessions, events, _ = await _run(WAKE, "wake")
    assert result.outcome.final_text == "all done"
    worker = [p["text"] for t, p in events["worker"] if t == "user_message"]
    assert worker[0] == "first job" and worker[1] == "second job"
    statuses = [p for t, p in events["wake"] if t == "notice"]
    assert any("finished without messaging you" in n["text"] for n in statuses)


QUERY = """
repeat forever:
    when "ask":
        code:
            a = await rlm.query("capital of France?")
            b = await rlm.query_batched(["one", "two", "three"])
            print("answers", a, b)
    when "answers":
        text: answered
    when "capital of France?":
        text: Paris
        usage in=7 out=1
    when "one": text: 1
    when "two": text: 2
    when "three": text: 3
"""


async def test_rlm_query_is_accounted_to_the_caller() -> None:
    _, sessions, events, (_, usage) = await _run(QUERY, "ask")
    assert _tool_texts(events["ask"]) == ["answers Paris ['1', '2', '3']"]
    root = sessions["ask"]
    assert len(sessions) == 1  # no session, no sandbox for a query
    assert usage[root.id].calls == 2 + 4  # two turns + one query + three batched


async def test_print_mode_gives_up_waiting_with_a_typed_reason() -> None:
    script = """
    repeat forever:
        when "stall":
            code: await rlm("sleep long", name="sleeper"); print("spawned")
        when "spawned":
            text: waiting
        when "sleep long":
            code: import time; time.sleep(30)
    """
    settings = FAST.with_overrides(family_wait_timeout_s=3.0)
    with pytest.raises(FamilyTimeout, match="sleeper"):
        await _run(script, "stall", settings)


REGISTRY = """
repeat forever:
    when "[task from parent]":
        text: child idle
    when "[subagent":
        text: noted
    when "children [":
        text: done
    when "spawned":
        code: import os; os.kill(os.getpid(), 9)
    when "registry":
        code: await rlm("stay", name="kept"); print("spawned")
    else:
        code: print("children", [c.name for c in await rlm.list_subagents()])
"""


async def test_child_registry_survives_a_kernel_restart() -> None:
    _, _sessions, events, _ = await _run(REGISTRY, "registry")
    results = [p for t, p in events["registry"] if t == "tool_result"]
    assert results[1]["kernel_restarted"] and results[1]["status"] == "kernel_died"
    assert results[2]["text"] == "children ['kept']"
