"""Idle unload (docs/spec.md §4) with real kernels and the scripted model, in process.

- A root and its finished child, quiet for ``idle_unload_seconds``: both are snapshotted (the
  debounce is far away: the unload takes its own snapshot), their sandboxes stop, the root
  becomes ``inactive`` and the child stays ``completed``. A new prompt wakes each one: new
  sandbox, ``x`` is back, and the harness note before the prompt lists it.
- An attached client keeps a session loaded; its quiet clock starts when it detaches.
"""

from __future__ import annotations

import time

from orchestrator.runtime.snapshot import read_manifest
from orchestrator.sessions.live import LiveSession
from orchestrator.settings import Settings
from tests.helpers import pids_alive
from tests.integration.test_snapshots import (
    FAST,
    Harness,
    harness,
    local,
    new_session,
    poll,
    request_texts,
)

# Long debounce: the snapshot that revives comes from the unload itself.
IDLE = FAST.with_overrides(idle_unload_seconds=1.0, snapshot_debounce_s=600.0)
NOTE = "[notice] This session got a new sandbox. The REPL namespace was revived"

SCRIPT = """
repeat forever:
    when "define":
        code: x = 42
    when "show x":
        code: print(x)
    when "42":
        text: x is back
    else:
        text: ok
"""


async def _child(h: Harness, parent: LiveSession) -> LiveSession:
    return await h.orch.create_session(
        model=parent.model, cwd=parent.spec.cwd, name="helper", parent=parent
    )


async def test_idle_sessions_unload_and_wake_with_their_namespace() -> None:
    async with harness(SCRIPT, IDLE) as h:
        # No unloading while the test sets up (a loaded machine can take longer than the idle
        # time between a turn's end and the next line); then the real timer takes over.
        idle_s = h.orch.idle.after_s
        await h.orch.idle.close()
        h.orch.idle.after_s = None
        root = await new_session(h)
        child = await _child(h, root)
        root = await h.prompt(root, "define")
        child = await h.prompt(child, "define")
        gateways = [local(s).gateway_pid for s in (root, child)]
        h.orch.idle.after_s = idle_s
        h.orch.idle.start()
        await poll("the idle unload", lambda: not h.orch.sessions)
        # (A loaded machine may also unload one of them on its own before: that is fine.)
        assert h.orch.idle.unloaded >= 2
        rows = {r.id: r.status for r in await h.store.list_sessions()}
        assert rows == {root.id: "inactive", child.id: "completed"}
        await poll("the sandboxes to be gone", lambda: not pids_alive(gateways))
        for session in (root, child):
            manifest = read_manifest(h.orch.sandboxes.snapshot_dir(session.id))
            assert manifest is not None and [e["name"] for e in manifest["saved"]] == ["x"]

        before = len(h.srv.requests)
        woken = await h.prompt(root, "show x")
        assert woken is not root and local(woken).gateway_pid not in gateways
        result = (await h.tool_results(woken))[-1]
        assert result["status"] == "ok" and result["text"] == "42"
        first = request_texts(h.srv.requests[before])
        assert first[-1] == "show x" and first[-2].startswith(NOTE), first[-3:]
        assert "Back: x." in first[-2]

        # The finished child is still addressable: a message wakes it the same way.
        woken_child = await h.prompt(child, "show x")
        assert woken_child.state == "completed"
        assert (await h.tool_results(woken_child))[-1]["text"] == "42"

        # Each change was a checked transition (store/lifecycle.py): the root left memory and
        # came back; the finished child, never inactive, was loaded completed.
        moves = {
            s.id: [(t.old, t.new, t.why) for t in h.orch.transitions if t.session_id == s.id]
            for s in (root, child)
        }
        unloaded = moves[root.id].index(("idle", "inactive", "unload"))
        assert ("inactive", "idle", "load") in moves[root.id][unloaded:]
        assert ("completed", "completed", "load") in moves[child.id]
        assert not any(new == "inactive" for _, new, _ in moves[child.id])


async def test_an_attached_client_keeps_a_session_loaded() -> None:
    hour = 3600.0
    settings = FAST.with_overrides(idle_unload_seconds=hour)  # swept by hand, clock moved
    async with harness(SCRIPT, settings) as h:
        live = await new_session(h, eager=False)
        idle = h.orch.idle
        t0 = time.monotonic()
        idle.attached = lambda session_id: session_id == live.id
        assert await idle.sweep(now=t0) == []
        assert await idle.sweep(now=t0 + 2 * hour) == []  # attached: never unloaded
        idle.attached = lambda _session_id: False
        assert await idle.sweep(now=t0 + 2 * hour + 1) == []  # quiet since the last look
        assert await idle.sweep(now=t0 + 3 * hour + 2) == [live.id]
        assert live.id not in h.orch.sessions
        rows = {r.id: r.status for r in await h.store.list_sessions()}
        assert rows[live.id] == "inactive"
        moves = [(t.old, t.new, t.why) for t in h.orch.transitions if t.session_id == live.id]
        assert moves == [("idle", "inactive", "unload")]  # born idle: not a transition


def test_idle_unload_setting() -> None:
    assert Settings().idle_unload_after_s == 30 * 60.0
    assert Settings(idle_unload_minutes=0).idle_unload_after_s is None
    assert Settings(idle_unload_minutes=5, idle_unload_seconds=1.5).idle_unload_after_s == 1.5
