"""Sandbox starts take turns: many sessions created at once start at most ``start_slots``
real local sandboxes at a time (orchestrator/sessions/supervisor.py), and every one of them
still starts and runs its cell."""

from __future__ import annotations

import asyncio

from orchestrator.sandbox.base import Sandbox, SandboxSpec
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.supervisor import START_SLOTS_MIN
from tests.integration.test_snapshots import harness, new_session

SESSIONS = 4
SLOTS = 2
SCRIPT = """
repeat forever:
    when "go":
        code: print("ran")
    when re "^ran$":
        text: done
"""


class CountingBackend(LocalBackend):
    """A real local backend that records how many of its starts overlap."""

    def __init__(self) -> None:
        super().__init__(pool_size=0)
        self.running = 0
        self.peak = 0
        self.starts = 0

    async def create(self, spec: SandboxSpec) -> Sandbox:
        self.running += 1
        self.starts += 1
        self.peak = max(self.peak, self.running)
        try:
            return await super().create(spec)
        finally:
            self.running -= 1


async def test_many_sessions_start_their_sandboxes_a_few_at_a_time() -> None:
    backend = CountingBackend()
    async with harness(SCRIPT, backend=backend) as h:
        h.orch.sandboxes.start_slots = SLOTS
        sessions = [await new_session(h) for _ in range(SESSIONS)]  # each starts at once
        tasks = [live.sandbox_task for live in sessions]
        assert all(task is not None for task in tasks)
        await asyncio.gather(*(task for task in tasks if task is not None))
        assert backend.starts == SESSIONS
        assert backend.peak == SLOTS  # without the slots all four overlap
        assert backend.running == 0
        for live in sessions:
            await h.prompt(live, "go")
            results = await h.tool_results(live)
            assert [(r["status"], r["text"]) for r in results] == [("ok", "ran")]


def test_the_default_allows_at_least_two_at_once() -> None:
    from orchestrator.sessions.supervisor import START_SLOTS

    assert START_SLOTS >= START_SLOTS_MIN
