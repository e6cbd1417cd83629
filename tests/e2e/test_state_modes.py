"""Everything the daemon keeps on disk is the user's alone: files 0600, directories 0700 (R15;
issue 15, item 11). A real daemon (``prime-agent daemon start``), nats-server with its
JetStream store, the DuckDB file and the WAL it creates on the first write after start, a
local sandbox running a cell (the file it writes in the workspace has the user's umask, not
the daemon's); the state an older version left with the default modes (a 0644
``daemon.log``, a 0755 ``nats/`` directory) is made private at start.

Not checked: what a sandbox writes for itself in the session's snapshot directory (its kernel's
files, with the sandbox's own umask: docs/snapshots.md), inside the 0700 ``snapshots/<id>/``.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from orchestrator.api.client import ControlClient
from orchestrator.paths import Paths
from orchestrator.testing import FakeModelServer
from tests.helpers import cli, daemon_pids, wait_until, write_config

TURN_TIMEOUT_S = 120.0  # a bound, not an expectation
POLL_S = 0.1
SNAPSHOTS = "snapshots"  # sessions/snapshots.py's SNAPSHOTS_DIR_NAME
SCRIPT = """
repeat forever:
    when "42": text: the answer is 42
    else: code: open("agent.txt", "w").write("mine"); print(6 * 7)
"""


def _modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (and ``root``) -> its permission bits; a session's snapshot
    directory is listed, its contents (the sandbox's) are not."""
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel = base.relative_to(root)
        if rel.parts[:1] == (SNAPSHOTS,) and len(rel.parts) >= 2:
            dirnames[:] = []
            continue
        for name in [*dirnames, *filenames]:
            path = base / name
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _not_private(modes: dict[str, int], root: Path) -> list[str]:
    bad = []
    for rel, mode in modes.items():
        want = 0o700 if (root / rel).is_dir() else 0o600
        if mode != want:
            bad.append(f"{rel}: {mode:o}")
    return bad


async def _run_a_cell(cwd: Path) -> None:
    client = await ControlClient.connect()
    try:
        created = await client.call(
            "create_session", cwd=str(cwd), task="compute", model="openai/fake", backend="local"
        )
        sid = str(created["session"])

        async def answered() -> bool:
            replay = await client.call("attach", session=sid, cursor=0)
            texts = [
                e["payload"].get("text")
                for e in replay["events"]
                if e["type"] == "assistant_message"
            ]
            status = (await client.call("get_session", session=sid))["session"]["status"]
            return "the answer is 42" in texts and status == "idle"

        async with asyncio.timeout(TURN_TIMEOUT_S):
            while not await answered():
                await asyncio.sleep(POLL_S)
    finally:
        await client.close()


def test_the_daemons_state_is_owner_only_after_a_session(tmp_path: Path) -> None:
    paths = Paths.from_env()
    # What an earlier version left: a readable log and NATS directory.
    paths.runtime_dir.mkdir(parents=True, mode=0o700)
    log = paths.runtime_dir / "daemon.log"
    log.write_text("an older daemon's line\n")
    log.chmod(0o644)
    old_nats = paths.data_dir / "nats"
    old_nats.mkdir(parents=True)
    old_nats.chmod(0o755)

    with FakeModelServer(SCRIPT) as model:
        write_config(f'warm_pool_size = 0\n[models."openai/fake"]\napi_base = "{model.url}"\n')
        started = cli(["daemon", "start"])
        assert started.returncode == 0, started.stderr
        wal = paths.database_file.with_name(paths.database_file.name + ".wal")
        asyncio.run(_run_a_cell(tmp_path))
        # Created after the daemon started: the WAL (first write), the JetStream store.
        assert wal.exists()
        assert (paths.data_dir / "nats" / "daemon" / "jetstream").is_dir()
        assert (paths.runtime_dir / "nats" / "daemon").is_dir()
        while_running = {
            str(root): _not_private(_modes(root), root)
            for root in (paths.data_dir, paths.runtime_dir)
        }
        stopped = cli(["daemon", "stop"])
        assert stopped.returncode == 0, stopped.stderr
        assert wait_until(lambda: not daemon_pids(), timeout=TURN_TIMEOUT_S)

    assert while_running == {str(paths.data_dir): [], str(paths.runtime_dir): []}
    # The agent's file in the workspace is the user's, with the user's umask (not the
    # daemon's private one).
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "agent.txt").stat().st_mode) == 0o666 & ~umask
    modes = _modes(paths.data_dir)
    assert modes[paths.database_file.name] == 0o600
    for root in (paths.data_dir, paths.runtime_dir):
        assert _not_private(_modes(root), root) == []
