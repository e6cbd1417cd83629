"""``Orchestrator.unload(stop_later=True)`` (a print-mode release): the sandbox stops after the
answer, and a new load of the session, or ``close``, waits for that stop first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import pytest

from orchestrator.ids import new_session_id
from orchestrator.paths import Paths
from orchestrator.sandbox.local import LocalBackend
from orchestrator.sessions.live import LiveSession
from orchestrator.sessions.manager import Orchestrator, SessionNotLoadable
from orchestrator.settings import Settings
from orchestrator.store.db import SessionRecord, Store

SETTLE_S = 0.1  # long enough for a load that does not wait to have finished


class _SlowSandbox:
    """Stands in for a sandbox whose stop takes until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.stopped = False

    async def stop(self) -> None:
        await self.release.wait()
        self.stopped = True


def _unloading(session_id: str, sandbox: _SlowSandbox) -> LiveSession:
    async def up() -> _SlowSandbox:
        return sandbox

    task = asyncio.get_running_loop().create_task(up())
    return cast(LiveSession, SimpleNamespace(id=session_id, sandbox_task=task))


async def _scenario() -> None:
    paths = Paths.from_env()
    async with await Store.open(paths.database_file) as store:
        orch = Orchestrator(
            store=store, backend=LocalBackend(pool_size=0), settings=Settings(), paths=paths
        )
        sid = new_session_id()
        # Terminal, so the load fails at once after its wait: what it waited for is the point.
        rec = SessionRecord(
            id=sid, root_id=sid, cwd="/", model="m", backend="local", status="aborted"
        )
        await store.create_session(rec)
        first = _SlowSandbox()
        orch._stop_sandbox_later(_unloading(sid, first))
        load = asyncio.ensure_future(orch.load_session_id(sid))
        await asyncio.sleep(SETTLE_S)
        assert not load.done()  # the old sandbox is still stopping
        first.release.set()
        with pytest.raises(SessionNotLoadable):
            await load
        assert first.stopped

        other = _SlowSandbox()
        orch._stop_sandbox_later(_unloading(new_session_id(), other))
        closing = asyncio.ensure_future(orch.close())
        await asyncio.sleep(SETTLE_S)
        assert not closing.done()  # close waits for the stops it has not seen end
        other.release.set()
        await closing
        assert other.stopped


def test_a_load_and_close_wait_for_a_sandbox_stopped_later() -> None:
    asyncio.run(_scenario())
