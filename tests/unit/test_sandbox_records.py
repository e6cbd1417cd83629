"""The pieces of sandbox adoption that need no process: the table, the holder.
(The backend rule: tests/unit/test_choice.py.)"""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandbox.base import SandboxRef
from orchestrator.sessions.sandbox_records import AdoptedSandboxes, SandboxRegistry, ref_of, row_of
from orchestrator.store.db import Store
from orchestrator.store.migrate import latest_schema_version

REF = SandboxRef(
    backend="local",
    ref="4242",
    session_id="pool",
    url="http://127.0.0.1:1",
    kernel_id="",
    token="secret-token",
    runtime_dir="/tmp/prime-agent-sbx-x",
)


def test_row_and_ref_round_trip_and_the_token_stays_out_of_repr() -> None:
    row = row_of(REF)
    assert row.state == "starting" and ref_of(row) == REF
    ready = row_of(SandboxRef("docker", "c0ffee", "s-abcdefghijkl", "u", "k-1", "t", "/tmp/d"))
    assert ready.state == "ready"
    assert "secret-token" not in repr(row) and "secret-token" not in repr(REF)


async def test_registry_writes_then_forgets_rows(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "db.duckdb") as store:
        registry = SandboxRegistry(store)
        await registry.sandbox_up(REF)  # a pool sandbox, still starting
        assigned = SandboxRef(**{**REF.__dict__, "session_id": "s-abcdefghijkl", "kernel_id": "k"})
        await registry.sandbox_up(assigned)  # ready, handed to a session: the same row
        (row,) = await store.list_sandboxes()
        assert (row.session_id, row.kernel_id, row.state, row.token) == (
            "s-abcdefghijkl",
            "k",
            "ready",
            "secret-token",
        )
        await registry.sandbox_down(assigned)
        assert await store.list_sandboxes() == []
    assert latest_schema_version() >= 3  # the table comes with migration 0003


class _FakeSandbox:
    def __init__(self, alive: bool):
        self.alive = alive
        self.stopped = False

    async def is_alive(self) -> bool:
        return self.alive

    async def stop(self) -> None:
        self.stopped = True


async def test_adopted_sandboxes_hand_over_only_live_ones() -> None:
    held = AdoptedSandboxes()
    live, dead, orphan = _FakeSandbox(True), _FakeSandbox(False), _FakeSandbox(True)
    held.put("s-live00000000", live)  # type: ignore[arg-type]
    held.put("s-dead00000000", dead)  # type: ignore[arg-type]
    held.put("s-gone00000000", orphan)  # type: ignore[arg-type]
    assert len(held) == 3 and "s-live00000000" in held
    assert await held.take("s-live00000000") is live and not live.stopped
    assert await held.take("s-live00000000") is None  # taken once
    assert await held.take("s-dead00000000") is None and dead.stopped
    await held.discard("s-gone00000000")  # its session was deleted while not loaded
    assert orphan.stopped and len(held) == 0
