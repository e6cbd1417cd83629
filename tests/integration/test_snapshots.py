"""Namespace snapshots and revival (R3), in process with real kernels and the scripted model.

- A kernel killed from outside between cells: the gateway restarts it, the next cell runs in the
  revived namespace, and the model is told which names came back and which did not (a
  variable over the per-variable cap, a generator and an open socket are skipped and named).
- A cell that times out and ignores the interrupt: the kernel is restarted and revived.
- A sandbox whose gateway is gone: the next cell gets a new sandbox, revived.
- A sandbox restart (``Orchestrator.restart_sandbox``): a new sandbox, revived, and the same
  session object, context and driver (no load).
- Docker: a removed container is replaced and revived from the mounted snapshot directory; a
  session served from the warm pool snapshots into its own directory (the pooled container's
  slot handed over), which another pooled session cannot see.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models.registry import resolve_model
from orchestrator.paths import Paths
from orchestrator.runtime.snapshot import read_manifest
from orchestrator.sandbox.base import SandboxBackend
from orchestrator.sandbox.local import LocalBackend, LocalSandbox
from orchestrator.sessions.live import Inbound, LiveSession
from orchestrator.sessions.manager import Orchestrator
from orchestrator.sessions.snapshots import SNAPSHOT_VAR_CAP_BYTES, SNAPSHOTS_DIR_NAME, KeptSandbox
from orchestrator.settings import Settings
from orchestrator.store.db import EventRecord, Store
from orchestrator.store.events import UserMessagePayload
from orchestrator.testing import FakeModelServer
from tests.helpers import need, pids_alive
from tests.integration.test_sandbox_conformance import docker_ready, workspace

# Snapshots follow cells closely here, so that the tests wait for them, not for a timer.
FAST = Settings(
    retry_base_delay_s=0.01, model_max_retries=1, cell_timeout_s=60.0, snapshot_debounce_s=0.05
)
# Bounds, not expectations (a loaded machine starts a kernel gateway in seconds).
QUIET_TIMEOUT_S = 90.0
POLL_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
MIB = 1024 * 1024


async def poll(what: str, probe: Callable[[], Any]) -> Any:
    """``probe()`` (awaited when it is a coroutine) until truthy, within POLL_TIMEOUT_S."""
    try:
        async with asyncio.timeout(POLL_TIMEOUT_S):
            while True:
                found = probe()
                if isinstance(found, Awaitable):
                    found = await found
                if found:
                    return found
                await asyncio.sleep(POLL_INTERVAL_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@dataclass
class Harness:
    orch: Orchestrator
    store: Store
    srv: FakeModelServer
    backend: SandboxBackend

    async def prompt(self, live: LiveSession, text: str) -> LiveSession:
        """Submit ``text`` (loading the session when it is not loaded) and wait until quiet."""
        live = await self.orch.load_session_id(live.id)
        self.orch.submit(live, Inbound(UserMessagePayload(text=text)))
        await self.orch.wait_quiet(live.record.root_id, QUIET_TIMEOUT_S)
        return live

    async def tool_results(self, live: LiveSession) -> list[dict[str, Any]]:
        return [e.payload for e in await self.store.events(live.id) if e.type == "tool_result"]

    async def events(self, live: LiveSession) -> list[EventRecord]:
        return await self.store.events(live.id)


@asynccontextmanager
async def harness(
    script: str, settings: Settings = FAST, backend: SandboxBackend | None = None
) -> AsyncIterator[Harness]:
    paths = Paths.from_env()
    backend = backend or LocalBackend(pool_size=0)
    with FakeModelServer(script) as srv:

        async def resolve(selector: str) -> Any:
            return resolve_model(selector, settings, api_base=srv.url, env={})

        async with await Store.open(paths.database_file) as store:
            orch = Orchestrator(
                store=store, backend=backend, settings=settings, paths=paths, resolve=resolve
            )
            try:
                yield Harness(orch, store, srv, backend)
            finally:
                await orch.close()


async def new_session(h: Harness, *, eager: bool = True, cwd: Path | None = None) -> LiveSession:
    model = resolve_model("openai/fake", h.orch.settings, api_base=h.srv.url, env={})
    return await h.orch.create_session(
        model=model, cwd=cwd or Path.cwd(), name="keeper", eager_sandbox=eager
    )


def kept(live: LiveSession) -> KeptSandbox:
    assert live.sandbox_task is not None and live.sandbox_task.done()
    sandbox = live.sandbox_task.result()
    assert isinstance(sandbox, KeptSandbox)
    return sandbox


def local(live: LiveSession) -> LocalSandbox:
    inner = kept(live).inner
    assert isinstance(inner, LocalSandbox)
    return inner


async def snapshot_with(h: Harness, live: LiveSession, *names: str) -> dict[str, Any]:
    """Wait for the debounced snapshot that has ``names`` saved; returns its report."""
    keeper = h.orch.sandboxes.keeper(live.id)

    def saved() -> dict[str, Any] | None:
        report = keeper.last_save
        if report and report.get("ok") and set(names) <= set(report.get("saved", [])):
            return report
        return None

    report: dict[str, Any] = await poll(f"a snapshot with {names}", saved)
    return report


def request_texts(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"]]


KILLED = """
repeat forever:
    when "set up":
        code:
            import math as m
            x = 41
            big = b"b" * (17 * 2**20)
            gen = (i for i in range(3))
            import socket
            sock = socket.socket()
            def f(a):
                return a + x
    when "use them":
        code: print(f(1), m.floor(2.5), 'big' in globals(), 'gen' in globals(), 'sock' in globals())
    when re "^42 2 False False False":
        text: all good
    else:
        text: ok
"""


async def test_a_killed_kernel_is_revived_and_the_model_told_what_came_back() -> None:
    assert 17 * MIB > SNAPSHOT_VAR_CAP_BYTES
    async with harness(KILLED) as h:
        live = await new_session(h)
        await h.prompt(live, "set up")
        report = await snapshot_with(h, live, "x", "f")
        assert report["modules"] == ["m", "socket"]
        skipped = {e["name"]: e["reason"] for e in report["skipped"]}
        assert skipped == {"big": "too_large", "gen": "unpicklable", "sock": "unpicklable"}

        sandbox = local(live)
        old_pid = sandbox.kernel_pid
        assert old_pid is not None
        os.kill(old_pid, signal.SIGKILL)
        # The gateway's restarter notices within its poll period and restarts the kernel.
        await poll("the gateway to restart the kernel", lambda: sandbox.client.unreported_restarts)
        await h.prompt(live, "use them")
        assert sandbox.kernel_pid != old_pid and not pids_alive([old_pid])
        results = await h.tool_results(live)
        last = results[-1]
        assert last["status"] == "ok" and last["kernel_restarted"], last
        text = str(last["text"])
        assert "42 2 False False False" in text
        assert text.startswith(
            "[notice] the kernel died after the previous cell and was restarted."
        )
        assert "namespace is lost" not in text
        assert "The REPL namespace was revived from its last snapshot" in text
        assert "Back: x, f." in text and "Re-imported: m, socket." in text
        assert "big (over the 16 MiB per-variable cap)" in text
        assert "gen (cannot be pickled: TypeError: cannot pickle 'generator' object)" in text
        assert "sock (cannot be pickled: TypeError: cannot pickle 'socket' object)" in text
        # The model received it: the request after the cell carries the notice.
        final = h.srv.requests[-1]
        assert any("Back: x, f." in t for t in request_texts(final))
        assert request_texts(final)[-1].startswith("[notice] the kernel died")


TIMEOUT = """
repeat forever:
    when "prepare":
        code: y = 7
    when "spin":
        code:
            import signal, time
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while True:
                time.sleep(0.05)
    when "timed out":
        code: print(y * 6)
    when re "^(\\\\[notice\\\\].*\\\\n)?42$":
        text: revived
    else:
        text: ok
"""


async def test_a_timed_out_cell_that_restarted_the_kernel_is_revived() -> None:
    settings = FAST.with_overrides(cell_timeout_s=1.0, interrupt_grace_s=1.0)
    async with harness(TIMEOUT, settings) as h:
        live = await new_session(h)
        await h.prompt(live, "prepare")
        await snapshot_with(h, live, "y")
        await h.prompt(live, "spin")
        results = await h.tool_results(live)
        spun, printed = results[-2], results[-1]
        assert spun["status"] == "timeout" and spun["kernel_restarted"]
        assert "the kernel was restarted." in spun["text"]
        assert "Back: y." in spun["text"] and "namespace is lost" not in spun["text"]
        assert printed["status"] == "ok" and printed["text"] == "42"
        assert h.srv.requests[-1]["messages"][-1]["content"] == "42"


LOST = """
repeat forever:
    when "remember":
        code: z = "kept"
    when "again":
        code: print(z)
    when "this sandbox is gone":
        code: print(z)
    when re "^\\\\[notice\\\\] This session got a new sandbox":
        text: back
    else:
        text: ok
"""


async def test_a_lost_sandbox_is_replaced_and_revived() -> None:
    async with harness(LOST) as h:
        live = await new_session(h)
        await h.prompt(live, "remember")
        await snapshot_with(h, live, "z")
        first = local(live)
        os.killpg(first.gateway_pid, signal.SIGKILL)  # the gateway and its kernel
        await poll("the gateway to die", lambda: not pids_alive([first.gateway_pid]))
        await h.prompt(live, "again")
        results = await h.tool_results(live)
        gone, revived = results[-2], results[-1]
        assert gone["status"] == "sandbox_error" and "this sandbox is gone" in gone["text"]
        assert revived["status"] == "ok", revived
        assert revived["text"].startswith("[notice] This session got a new sandbox.")
        assert "Back: z." in revived["text"] and revived["text"].endswith("kept")
        assert local(live) is not first


RESTART = """
repeat forever:
    when "remember":
        code: z = "kept"
    when "after the restart":
        code: print(z)
    when "kept":
        text: back
    else:
        text: ok
"""


async def test_a_sandbox_restart_replaces_only_the_sandbox() -> None:
    """``Orchestrator.restart_sandbox``: a new sandbox, revived; the session object, its
    context, driver and state are the same ones (nothing was unloaded or loaded)."""
    async with harness(RESTART) as h:
        live = await new_session(h)
        await h.prompt(live, "remember")
        await snapshot_with(h, live, "z")
        first = local(live)
        assert live.loop is not None
        driver, loop, context = live.driver, live.loop, live.loop.context
        seen = len(context.messages)

        loads = 0
        load = h.orch.load_session

        async def counted(record: Any) -> LiveSession:
            nonlocal loads
            loads += 1
            return await load(record)

        h.orch.load_session = counted  # type: ignore[method-assign]
        sandbox = await h.orch.restart_sandbox(live)

        assert loads == 0 and h.orch.sessions[live.id] is live
        assert live.driver is driver and driver is not None and not driver.done()
        assert live.loop is loop and loop.context is context and len(context.messages) == seen
        assert live.state == "idle" and live.turns == 1
        assert sandbox is kept(live) and local(live) is not first
        await poll("the old gateway to go", lambda: not pids_alive([first.gateway_pid]))
        rows = {r.id: r.status for r in await h.store.list_sessions()}
        assert rows[live.id] == "idle"

        await h.prompt(live, "after the restart")
        # The revival is read before the input, as after a wake: a harness note.
        users = [e.payload for e in await h.events(live) if e.type == "user_message"]
        note, prompt = users[-2], users[-1]
        assert note["source"] == "harness" and prompt["text"] == "after the restart"
        assert note["text"].startswith("[notice] This session got a new sandbox.")
        assert "Back: z." in note["text"]
        revived = (await h.tool_results(live))[-1]
        assert revived["status"] == "ok" and revived["text"] == "kept", revived
        assert loads == 0 and h.orch.sessions[live.id] is live


DOCKER_LOST = """
repeat forever:
    when "remember":
        code: z = "kept"; import os; print(os.getuid())
    when "again":
        code: print(z)
    when "kept":
        text: back
    else:
        text: ok
"""


@pytest.mark.timeout(600)
async def test_docker_a_removed_container_is_replaced_and_revived(tmp_path: Path) -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)
    from orchestrator.sandbox.docker import DockerBackend, DockerSandbox

    backend = DockerBackend(pool_size=0)
    async with harness(DOCKER_LOST, backend=backend) as h:
        live = await new_session(h, cwd=workspace(tmp_path / "ws"))
        await h.prompt(live, "remember")
        await snapshot_with(h, live, "z")
        sandbox = kept(live).inner
        assert isinstance(sandbox, DockerSandbox)
        first = sandbox.container_id
        await asyncio.to_thread(lambda: backend.docker.containers.get(first).remove(force=True))
        await h.prompt(live, "again")
        last = (await h.tool_results(live))[-1]
        assert last["status"] == "ok" and last["kernel_restarted"], last
        text = str(last["text"])
        assert "a new sandbox container was started." in text and "Back: z." in text
        assert text.endswith("kept") and sandbox.container_id != first


POOLED = """
repeat forever:
    when "alpha":
        code: x = 41; print("set")
    when "bravo":
        code: print(x + 1)
    when "42":
        text: back
    else:
        text: ok
"""
POOL_READY_TIMEOUT_S = 180.0


@pytest.mark.timeout(600)
async def test_docker_a_pooled_container_takes_over_its_session_snapshots(tmp_path: Path) -> None:
    """A session served from the warm pool snapshots into snapshots/<its id>/ (the pooled
    container's slot was handed over), another pooled session cannot see that directory, and
    after the container is removed from outside the replacement revives x."""
    why = docker_ready()
    if why is not None:
        need("docker", why)
    from orchestrator.sandbox.docker import CONTAINER_SNAPSHOT_DIR, DockerBackend, DockerSandbox
    from orchestrator.sandbox.docker_owned import LABEL_SNAPSHOT_SLOT

    backend = DockerBackend(pool_size=1)
    cwd = workspace(tmp_path / "ws")
    root = Paths.from_env().data_dir / SNAPSHOTS_DIR_NAME
    async with harness(POOLED, backend=backend) as h:
        backend.start_pool(cwd, snapshot_root=root)
        assert backend.pool is not None
        await backend.pool.wait_ready(POOL_READY_TIMEOUT_S)
        live = await new_session(h, cwd=cwd)
        await h.prompt(live, "alpha")
        assert backend.pool.statistics().hits == 1  # a pooled container, not a cold start
        sandbox = kept(live).inner
        assert isinstance(sandbox, DockerSandbox)
        first = sandbox.container_id
        labels = (await asyncio.to_thread(backend.docker.containers.get, first)).labels
        assert Path(labels[LABEL_SNAPSHOT_SLOT]).parent == root / ".pool"  # it was a slot
        await snapshot_with(h, live, "x")
        manifest = read_manifest(root / live.id)  # on the host, under the session's id
        assert manifest is not None and [v["name"] for v in manifest["saved"]] == ["x"]

        await backend.pool.wait_ready(POOL_READY_TIMEOUT_S)
        other = await new_session(h, cwd=cwd)
        await poll("the second sandbox", lambda: other.sandbox_task and other.sandbox_task.done())
        assert backend.pool.statistics().hits == 2
        probe = (
            f"import os; print(os.path.exists({str(root / live.id)!r}), "
            f"os.path.exists({str(root)!r}), os.listdir({CONTAINER_SNAPSHOT_DIR!r}))"
        )
        seen = await kept(other).execute(probe, timeout_s=30, cell_id="probe")
        assert seen.stdout.strip() == "False False []", seen

        await asyncio.to_thread(lambda: backend.docker.containers.get(first).remove(force=True))
        await h.prompt(live, "bravo")
        last = (await h.tool_results(live))[-1]
        assert last["status"] == "ok" and last["kernel_restarted"], last
        assert "Back: x." in str(last["text"]) and str(last["text"]).endswith("42"), last
        assert sandbox.container_id != first
        assert read_manifest(root / live.id) is not None
