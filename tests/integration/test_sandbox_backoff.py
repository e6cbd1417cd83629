"""Bounded restart backoff: a sandbox that will not start (a real failing start: the backend's
interpreter is ``/bin/false``) is retried with backoff, then the sandbox is marked failed (the
session stays ``idle``, in memory and in the store) and is tried again only when the session
gets a new prompt."""

from __future__ import annotations

import sys

import pytest

from orchestrator.errors import SandboxStartError
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.supervisor import START_MAX_FAILURES
from tests.integration.test_snapshots import harness, new_session

BACKOFF_S = 0.05
SCRIPT = """
repeat forever:
    when "PLEASE-RUN":
        code: print("hi")
    when "tries again after":
        code: print("hi")
    when "the sandbox is marked failed":
        text: giving up
    when "marked failed":
        code: print('hi')
    when re "^hi$":
        text: done
"""


async def test_repeated_start_failures_back_off_then_fail_until_a_new_prompt() -> None:
    backend = LocalBackend(pool_size=0, python="/bin/false")
    async with harness(SCRIPT, backend=backend) as h:
        h.orch.sandboxes.backoff_base_s = BACKOFF_S
        live = await new_session(h, eager=False)
        await h.prompt(live, "PLEASE-RUN")
        results = await h.tool_results(live)
        assert [r["status"] for r in results] == ["sandbox_error"] * (START_MAX_FAILURES + 1)
        texts = [str(r["text"]) for r in results]
        assert "failed start 1 of 3; the next cell tries again after 0.05 s" in texts[0]
        assert "failed start 2 of 3; the next cell tries again after 0.1 s" in texts[1]
        assert "marked failed" in texts[2]
        assert "the sandbox is marked failed" in texts[3]  # no fourth start was tried
        assert h.orch.sandboxes.is_failed(live.id)
        assert live.state == "idle"  # the sandbox failed, not the session
        rows = {r.id: r.status for r in await h.store.list_sessions()}
        assert rows[live.id] == "idle"

        backend.python = sys.executable  # repaired; only a new prompt tries again
        live = await h.prompt(live, "PLEASE-RUN again")
        last = (await h.tool_results(live))[-1]
        assert last["status"] == "ok" and last["text"] == "hi"
        assert live.state == "idle"
        rows = {r.id: r.status for r in await h.store.list_sessions()}
        assert rows[live.id] == "idle"


async def test_a_sandbox_restart_clears_the_failed_mark_and_starts_a_new_sandbox() -> None:
    backend = LocalBackend(pool_size=0, python="/bin/false")
    async with harness(SCRIPT, backend=backend) as h:
        h.orch.sandboxes.backoff_base_s = BACKOFF_S
        live = await new_session(h, eager=False)
        await h.prompt(live, "PLEASE-RUN")
        assert h.orch.sandboxes.is_failed(live.id)

        with pytest.raises(SandboxStartError, match="failed start 1 of 3"):
            await h.orch.restart_sandbox(live)  # still broken: counted from a clean slate
        assert not h.orch.sandboxes.is_failed(live.id)

        backend.python = sys.executable  # repaired; a restart starts it, no prompt needed
        sandbox = await h.orch.restart_sandbox(live)
        assert await sandbox.is_alive()
        assert h.orch.sandboxes.failure(live.id) is None
        assert h.orch.sessions[live.id] is live and live.state == "idle"
        assert live.sandbox_task is not None and live.sandbox_task.result() is sandbox
