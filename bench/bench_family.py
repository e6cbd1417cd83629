# ruff: noqa: E501  (the script below is data: long lines are the model's cells)
"""Issue 3 figures: rlm() admission latency, 100 children from one cell, host request round
trip over NATS, and message delivery latency (send -> the recipient's context is committed).

Runs in-process through ``run_session`` against the scripted model; the children only reply
with text, so no child starts a sandbox and the numbers are the orchestrator's own.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import private_xdg, row

CHILDREN = 100
QUICK_CHILDREN = 30
RTT_CALLS = 200
MESSAGES = 20
# Children answer after this long, so their turns wait on the model (as real ones do) instead of
# competing for the CPU while the parent is still spawning.
CHILD_REPLY_DELAY_S = 4
ADMISSION_REFERENCE_S = 0.220
ADMISSION_TARGET_S = 0.020

SCRIPT = """
repeat forever:
    when "[task from parent]":
        text: ok
        slow {child_delay}
    when "[subagent":
        text: noted
    when "[message from parent]":
        text: got
    when "bench":
        code:
            import asyncio, json, time
            spawn = []
            for i in range({children}):
                t = time.perf_counter(); await rlm("t", name=f"c{{i}}"); spawn.append(time.perf_counter() - t)
            rtt = []
            for _ in range({rtt}):
                t = time.perf_counter(); await agent_message.list_agents(); rtt.append(time.perf_counter() - t)
            for _ in range(600):  # wait (bounded) until every child is idle again
                if all(c.status != "running" for c in await rlm.list_subagents()):
                    break
                await asyncio.sleep(0.05)
            sent = []
            for i in range({messages}):
                t = time.perf_counter()
                r = await agent_message.send(f"ping {{i}}", receiver_role="child", receiver_name=f"c{{i}}", mode="follow_up")
                sent.append([r.id, r.at, time.perf_counter() - t])
            print(json.dumps({{"spawn": spawn, "rtt": rtt, "sent": sent}}))
    when "spawn":
        text: done
"""


async def _bench(children: int) -> dict[str, Any]:
    from orchestrator.models.registry import resolve_model
    from orchestrator.paths import Paths
    from orchestrator.sessions.runner import RunOptions, run_session
    from orchestrator.settings import Settings
    from orchestrator.store.db import Store
    from orchestrator.testing import FakeModelServer

    settings = Settings(max_live_children=children + 10, retry_base_delay_s=0.01)
    script = SCRIPT.format(
        children=children, rtt=RTT_CALLS, messages=MESSAGES, child_delay=CHILD_REPLY_DELAY_S
    )
    paths = Paths.from_env()
    with FakeModelServer(script) as srv:
        model = resolve_model("openai/fake", settings, api_base=srv.url, env={})
        started = asyncio.get_running_loop().time()
        result = await run_session(
            RunOptions(task="bench", cwd=Path.cwd(), backend="local"), model, settings, paths
        )
        total = asyncio.get_running_loop().time() - started
    store = await Store.open(paths.database_file, read_only=True)
    try:
        root_events = await store.events(result.session_id)
        text = next(e.payload["text"] for e in root_events if e.type == "tool_result")
        try:
            data = json.loads(text)
        except ValueError:
            raise RuntimeError(f"the bench cell failed: {text[-600:]}") from None
        entered: dict[str, datetime] = {}
        for s in await store.list_sessions():
            for e in await store.events(s.id):
                mid = e.payload.get("message_id") if e.type == "user_message" else None
                if mid:
                    entered[str(mid)] = e.ts
    finally:
        await store.close()
    delivery = [
        (entered[mid] - datetime.fromisoformat(at)).total_seconds()
        for mid, at, _ in data["sent"]
        if mid in entered
    ]
    return {"data": data, "delivery": delivery, "total": total}


def run(quick: bool = False) -> dict[str, Any]:
    children = QUICK_CHILDREN if quick else CHILDREN
    with tempfile.TemporaryDirectory() as tmp, private_xdg(Path(tmp)) as xdg:
        import os

        saved = {k: os.environ.get(k) for k in xdg}
        os.environ.update(xdg)
        try:
            out = asyncio.run(_bench(children))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    data = out["data"]
    return {
        "rows": [
            row(
                "rlm() admission, per child",
                "s",
                data["spawn"],
                reference=ADMISSION_REFERENCE_S,
                target=ADMISSION_TARGET_S,
            ),
            row(f"{children} children spawned in one cell (total)", "s", [sum(data["spawn"])]),
            row("host request round trip (list_agents)", "s", data["rtt"]),
            row("agent_message.send round trip", "s", [s[2] for s in data["sent"]]),
            row("message delivery (send -> recipient context)", "s", out["delivery"]),
        ],
        "notes": [
            "children reply with text only (no sandbox), after a scripted model delay so their "
            "turns wait on I/O while the parent spawns; messages go to idle children; delivery "
            "= receipt time -> the recipient's committed user_message event",
        ],
    }
