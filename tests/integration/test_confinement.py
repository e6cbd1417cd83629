"""orchestrator/sandbox/confinement.py against this host's real cgroupfs (no mocks).

Each test confines real child processes (``python -c``) through ``Confinement.preexec`` as
``subprocess`` runs it between fork and exec. Most tests put their groups under a private
``test-<id>`` directory inside this process's own group of each controller (the ``trees``
fixture), so that they never meet another run's groups; ``test_default_trees_...`` uses the
host's trees as the daemon does. With CI=true a host without a usable cgroup FAILS these
tests instead of skipping them.

What has run for real here: cgroup v1 (this machine). cgroup v2 and systemd scopes have not:
see docs/limits.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.procs import pid_alive
from orchestrator.sandbox import cgroupfs
from orchestrator.sandbox.base import ResourceLimits
from orchestrator.sandbox.cgroupfs import Hierarchy
from orchestrator.sandbox.confinement import Confinement, confine, reopen, sweep
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups")

MIB = 1024**2
MEMORY_LIMIT = 64 * MIB
HOG_BYTES = 256 * MIB  # what the memory hog tries to hold (4x the limit)
PIDS_LIMIT = 16
CPUS = 0.5
LIMITS = ResourceLimits(memory_bytes=MEMORY_LIMIT, cpus=CPUS, pids=PIDS_LIMIT)
RLIMIT_MEMORY = 512 * MIB  # RLIMIT_AS must leave room for the interpreter's own mappings
RLIMIT_HOG_BYTES = 1024 * MIB
SANDBOX_UID = 1000
DEADLINE_S = 30.0
CHILD_LIFETIME_S = 30  # children sleep at most this long should a test fail to remove them
# The fork bomb: every process forks up to FANOUT children, DEPTH levels deep, so that even an
# unconfined run ends at 1 + 4 + 16 + 64 + 256 = 341 processes, not a dead host.
BOMB_FANOUT = 4
BOMB_DEPTH = 4

SLEEPER = f"import time; print('up', flush=True); time.sleep({CHILD_LIFETIME_S})"
SPINNER = (
    "import time\n"
    "end = time.process_time() + 0.3\n"
    "while time.process_time() < end: pass\n"
    "print('spun', flush=True)\n"
    f"time.sleep({CHILD_LIFETIME_S})\n"
)
FORK_BOMB = (
    "import os, time\n"
    "depth = 0\n"
    "children = 0\n"
    f"while depth < {BOMB_DEPTH} and children < {BOMB_FANOUT}:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        depth += 1\n"
    "        children = 0\n"
    "    else:\n"
    "        children += 1\n"
    f"time.sleep({CHILD_LIFETIME_S})\n"
)
MEMORY_HOG = (
    "chunks = []\n"
    f"for _ in range({HOG_BYTES // MIB}):\n"
    "    chunks.append(b'\\x01' * (1024 * 1024))\n"
    "print('held', flush=True)\n"
)
RLIMIT_HOG = (
    "try:\n"
    f"    block = b'\\x01' * {RLIMIT_HOG_BYTES}\n"
    "except MemoryError:\n"
    "    raise SystemExit(3)\n"
)
REOPEN_IN_A_NEW_PROCESS = (
    "import json, sys\n"
    "from orchestrator.sandbox.confinement import reopen\n"
    "found = reopen(sys.stdin.read())\n"
    "print(json.dumps(None if found is None else {'kind': found.kind, 'pids': found.pids(),"
    " 'limit': found.usage().memory_limit_bytes}))\n"
)
REOPEN_EXIT_ABSENT = 0


def _usable(found: list[Hierarchy]) -> bool:
    controllers = {c for tree in found for c in tree.controllers}
    return {"memory", "pids"} <= controllers


@pytest.fixture
def host_trees() -> list[Hierarchy]:
    found = cgroupfs.host_hierarchies()
    if not _usable(found):
        message = f"no cgroup with memory and pids controllers here: {found}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture
def trees(host_trees: list[Hierarchy]) -> Iterator[list[Hierarchy]]:
    """The host's v1 trees, each with ``own_dir`` moved into a private ``test-<id>`` group."""
    private = f"test-{uuid.uuid4().hex[:12]}"
    moved = [
        replace(tree, own_dir=tree.own_dir / private) for tree in host_trees if tree.version == 1
    ]
    for tree in moved:
        tree.own_dir.mkdir()
    yield moved
    for tree in moved:
        for directory in sorted(tree.own_dir.rglob("*"), reverse=True):
            if directory.is_dir():
                directory.rmdir()
        tree.own_dir.rmdir()


@pytest.fixture
def confined(trees: list[Hierarchy]) -> Iterator[Confinement]:
    made = confine(f"sbx-{uuid.uuid4().hex[:8]}", LIMITS, uid=SANDBOX_UID, hierarchies=trees)
    try:
        yield made
    finally:
        made.remove()


# Every child starts its own process group; a test's teardown kills those groups after the
# test ran its own checks, so that a broken confinement cannot leave a fork bomb behind.
_started_groups: list[int] = []


@pytest.fixture(autouse=True)
def _backstop() -> Iterator[None]:
    yield
    while _started_groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(_started_groups.pop(), signal.SIGKILL)


def _start(confinement: Confinement, code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=confinement.preexec,
        start_new_session=True,
    )
    _started_groups.append(child.pid)
    return child


def _started(confinement: Confinement, code: str, line: str) -> subprocess.Popen[str]:
    child = _start(confinement, code)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == line
    return child


def _group(confinement: Confinement, controller: str) -> Path:
    (found,) = [g for g in confinement.groups if f"/{controller}/" in str(g)]
    return found


def _ended(child: subprocess.Popen[str]) -> int:
    code = child.wait(timeout=DEADLINE_S)
    if child.stdout is not None:
        child.stdout.close()
    return code


def test_v1_here_sets_every_limit(confined: Confinement) -> None:
    assert confined.kind == "cgroup-v1"
    assert confined.missing == ()
    assert confined.warning == ""
    assert confined.argv_prefix == ()
    memory = _group(confined, "memory")
    assert int((memory / "memory.limit_in_bytes").read_text()) == MEMORY_LIMIT
    assert int((memory / "memory.memsw.limit_in_bytes").read_text()) == MEMORY_LIMIT
    assert int((_group(confined, "pids") / "pids.max").read_text()) == PIDS_LIMIT
    cpu = _group(confined, "cpu")
    quota = int((cpu / "cpu.cfs_quota_us").read_text())
    assert quota / int((cpu / "cpu.cfs_period_us").read_text()) == CPUS


def test_child_joins_and_usage_reports_memory_and_cpu(confined: Confinement) -> None:
    child = _started(confined, SPINNER, "spun")
    try:
        assert confined.pids() == [child.pid]
        own = cgroupfs.parse_proc_cgroup(Path(f"/proc/{child.pid}/cgroup").read_text())
        assert str(_group(confined, "memory")).endswith(own["memory"])
        assert str(_group(confined, "pids")).endswith(own["pids"])
        used = confined.usage()
        assert used.memory_limit_bytes == MEMORY_LIMIT
        assert used.memory_bytes is not None and 0 < used.memory_bytes < MEMORY_LIMIT
        # The child spun 0.3 s of its own cpu time before its line; the group counts it.
        assert used.cpu_seconds is not None and used.cpu_seconds >= 0.3
    finally:
        confined.remove()
    assert _ended(child) == -signal.SIGKILL


def test_fork_bomb_stays_under_pids_max_and_remove_empties_the_group(
    confined: Confinement,
) -> None:
    pids_dir = _group(confined, "pids")
    bomb = _start(confined, FORK_BOMB)
    seen: list[int] = []

    def saturated() -> bool:
        seen.append(int((pids_dir / "pids.current").read_text()))
        return seen[-1] == PIDS_LIMIT

    def refused() -> bool:
        return int((pids_dir / "pids.events").read_text().split()[1]) > 0

    try:
        assert wait_until(saturated, timeout=DEADLINE_S), seen[-5:]
        # The kernel refused forks: the bomb hit the limit, not its own bound. The count
        # rises with the first fork tried after the group filled, which may come a moment
        # after pids.current reads the limit.
        assert wait_until(refused, timeout=DEADLINE_S)
        assert max(seen) <= PIDS_LIMIT
        assert int((pids_dir / "pids.current").read_text()) <= PIDS_LIMIT
        members = confined.pids()
        assert len(members) == PIDS_LIMIT and bomb.pid in members
        # The host is unharmed: this process still forks.
        assert subprocess.run(["true"], check=False).returncode == 0
    finally:
        confined.remove()
    assert _ended(bomb) == -signal.SIGKILL
    assert [pid for pid in members if pid_alive(pid)] == []
    assert confined.pids() == []
    assert [g for g in confined.groups if g.exists()] == []


def test_memory_hog_is_oom_killed_inside_the_group(confined: Confinement) -> None:
    hog = _start(confined, MEMORY_HOG)
    assert hog.stdout is not None
    assert hog.stdout.read() == ""  # killed before it held HOG_BYTES
    assert _ended(hog) == -signal.SIGKILL
    oom = dict(line.split() for line in (_group(confined, "memory") / "memory.oom_control").open())
    assert int(oom["oom_kill"]) >= 1
    assert int((_group(confined, "memory") / "memory.max_usage_in_bytes").read_text()) <= (
        MEMORY_LIMIT
    )


def test_remove_is_idempotent_and_leaves_nothing(trees: list[Hierarchy]) -> None:
    made = confine("sbx-remove", LIMITS, uid=SANDBOX_UID, hierarchies=trees)
    children = [_started(made, SLEEPER, "up") for _ in range(3)]
    assert sorted(made.pids()) == sorted(c.pid for c in children)
    made.remove()
    made.remove()
    assert [_ended(child) for child in children] == [-signal.SIGKILL] * 3
    assert [g for g in made.groups if g.exists()] == []
    assert reopen(made.record()) is None


def test_reopen_in_a_new_process_finds_the_group(confined: Confinement) -> None:
    child = _started(confined, SLEEPER, "up")
    record = confined.record()
    try:
        again = reopen(record)
        assert again is not None and again.kind == confined.kind
        assert again.groups == confined.groups and again.pids() == [child.pid]
        # As a daemon's successor would after a kill -9: another process, the record only.
        found = subprocess.run(
            [sys.executable, "-c", REOPEN_IN_A_NEW_PROCESS],
            input=record,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=True,
        )
        assert found.stdout.strip() == (
            f'{{"kind": "cgroup-v1", "pids": [{child.pid}], "limit": {MEMORY_LIMIT}}}'
        )
        again.remove()
        assert _ended(child) == -signal.SIGKILL
        assert reopen(record) is None
    finally:
        confined.remove()


def test_a_group_name_in_use_is_refused(confined: Confinement, trees: list[Hierarchy]) -> None:
    from orchestrator.errors import SandboxStartError

    child = _started(confined, SLEEPER, "up")
    try:
        with pytest.raises(SandboxStartError, match="still holds processes"):
            confine(confined.name, LIMITS, uid=SANDBOX_UID, hierarchies=trees)
        assert confined.pids() == [child.pid]
    finally:
        confined.remove()
    _ended(child)


def test_a_child_that_cannot_join_its_group_does_not_start(trees: list[Hierarchy]) -> None:
    made = confine("sbx-gone", LIMITS, uid=SANDBOX_UID, hierarchies=trees)
    made.remove()  # the group is gone before the child starts
    with pytest.raises(subprocess.SubprocessError, match="preexec"):
        _start(made, SLEEPER)


def test_sweep_removes_empty_leftovers_only(trees: list[Hierarchy]) -> None:
    live = confine("sbx-live", LIMITS, uid=SANDBOX_UID, hierarchies=trees)
    left = confine("sbx-left", LIMITS, uid=SANDBOX_UID, hierarchies=trees)
    child = _started(live, SLEEPER, "up")
    try:
        assert sweep(trees, min_age_s=3600) == []  # too young: maybe about to be used
        removed = sweep(trees, min_age_s=0)
        assert sorted(removed) == sorted(left.groups)
        assert all(g.is_dir() for g in live.groups) and live.pids() == [child.pid]
    finally:
        live.remove()
        left.remove()
    _ended(child)


def test_default_trees_put_the_group_under_our_own(host_trees: list[Hierarchy]) -> None:
    made = confine(f"sbx-{uuid.uuid4().hex[:8]}", LIMITS, uid=SANDBOX_UID)
    try:
        memory_tree = next(t for t in host_trees if "memory" in t.controllers)
        assert _group(made, "memory").parent == memory_tree.own_dir / "prime-agent"
        child = _started(made, SLEEPER, "up")
        assert made.pids() == [child.pid]
    finally:
        made.remove()
    assert _ended(child) == -signal.SIGKILL
    assert [g for g in made.groups if g.exists()] == []


@pytest.mark.parametrize(
    "hierarchies",
    [
        pytest.param([], id="no-cgroup"),
        pytest.param(
            [Hierarchy(1, Path("/nonexistent"), frozenset({"memory"}), Path("/nonexistent/x"))],
            id="not-writable",
        ),
    ],
)
def test_rlimit_fallback_sets_the_limits_and_warns_once(hierarchies: list[Hierarchy]) -> None:
    limits = ResourceLimits(memory_bytes=RLIMIT_MEMORY, cpus=CPUS, pids=PIDS_LIMIT)
    made = confine("sbx-rlimit", limits, uid=SANDBOX_UID, hierarchies=hierarchies, systemd=False)
    assert made.kind == "rlimit"
    assert made.missing == ("cpus",)
    assert made.groups == () and made.argv_prefix == ()
    assert "\n" not in made.warning
    assert made.warning.startswith("prime-agent: no usable cgroup (")
    assert "memory via RLIMIT_AS only" in made.warning
    assert f"pids via RLIMIT_NPROC (shared by every process of uid {SANDBOX_UID})" in made.warning
    assert made.warning.endswith("no cpu limit")
    if hierarchies:
        assert "cannot create /nonexistent/x/prime-agent/sbx-rlimit" in made.warning
    child = _started(made, SLEEPER, "up")
    try:
        limits_text = Path(f"/proc/{child.pid}/limits").read_text()
    finally:
        child.kill()
        _ended(child)
    rows = {line[:26].strip(): line[26:].split()[:2] for line in limits_text.splitlines()}
    assert rows["Max address space"] == [str(RLIMIT_MEMORY)] * 2
    nproc = int(rows["Max processes"][0])
    # The limit plus the tasks uid 1000 ran when confine counted them.
    assert PIDS_LIMIT <= nproc == int(rows["Max processes"][1])
    # The memory rlimit holds: a 1 GiB allocation fails inside the child.
    hog = _start(made, RLIMIT_HOG)
    assert _ended(hog) == 3
