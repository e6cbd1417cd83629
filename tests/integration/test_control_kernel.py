# ruff: noqa: E501  (scripts below are data: long lines are the model's cells)
"""``goal`` and ``rlm_heartbeat`` from a real kernel over NATS (issue 8 bullets 2 and 3): the
kernel's calls reach the orchestrator's goals and schedules as the calling session's own."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from orchestrator.control.schedule_service import list_schedules
from orchestrator.testing import FakeModelServer
from tests.integration.test_harness_kernel import fake_model, orchestrator, turn

SCRIPT: Final = """
repeat forever:
    when "set things up":
        code:
            g = await goal.create("ship the release", token_budget=5000)
            hb = await rlm_heartbeat.create("check the CI", interval="15m", label="ci", delivery="follow_up")
            beats = await rlm_heartbeat.list()
            print("GOAL", g.status, g.token_budget, (await goal.get()).objective)
            print("BEATS", [(b.label, b.delivery) for b in beats])
            try:
                await rlm_heartbeat.create("too fast", interval="5s")
            except ValueError as exc:
                print("REFUSED", type(exc).__name__)
    when "GOAL": text: set up
    else: text: ok
"""


async def test_goal_and_heartbeats_from_a_cell(tmp_path: Path) -> None:
    async with orchestrator() as orch:
        with FakeModelServer(SCRIPT) as srv:
            live = await orch.create_session(model=fake_model(srv), cwd=tmp_path, name="root")
            out = await turn(orch, live, "set things up")
            current = await orch.goals.current(live.id)
            rows = await list_schedules(orch.store, session_id=live.id)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["GOAL"] == "active 5000 ship the release"
    assert lines["BEATS"] == "[('ci', 'follow_up')]"
    assert lines["REFUSED"] == "InvalidArgument"
    assert current is not None and current.objective == "ship the release"
    assert [(r.source, r.label, r.prompt) for r in rows] == [
        ("rlm_heartbeat", "ci", "check the CI")
    ]
