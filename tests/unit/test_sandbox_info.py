"""The parts of ``sandbox_info`` that need no sandbox: the CPU meter, docker's times and the
process-tree measures from /proc (of real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from orchestrator.daemon.sandbox_commands import CpuMeter
from orchestrator.sandbox import proctree
from orchestrator.sandbox.docker_info import docker_time

MIB = 1024 * 1024
# A child that holds this much memory shows in its parent's tree RSS.
CHILD_MEMORY_BYTES = 64 * MIB
PROCESS_AGE_SLACK_S = 5.0


def test_cpu_meter_percent_since_the_previous_sample() -> None:
    now = [100.0]
    meter = CpuMeter(max_entries=2, clock=lambda: now[0])
    assert meter.sample("local:1", 5.0) is None  # the first sample has nothing to compare
    now[0] += 2.0
    assert meter.sample("local:1", 6.0) == 50.0  # 1 CPU second in 2 s
    now[0] += 1.0
    assert meter.sample("local:1", 8.0) == 200.0  # two CPUs busy
    now[0] += 1.0
    assert meter.sample("local:1", 1.0) is None  # went backwards: another sandbox
    assert meter.sample("local:1", None) is None and len(meter) == 0  # unknown: forgotten
    for key in ("a", "b", "c"):
        meter.sample(key, 1.0)
    assert len(meter) == 2  # bounded: the least recently sampled went
    now[0] += 1.0
    assert meter.sample("a", 2.0) is None and meter.sample("c", 2.0) == 100.0
    meter.forget("c")
    assert meter.sample("c", 3.0) is None


def test_docker_time() -> None:
    assert docker_time("2024-05-01T10:00:00.123456789Z") == datetime(
        2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC
    )
    assert docker_time("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert docker_time("0001-01-01T00:00:00Z") is None  # docker's "never started"
    assert docker_time("") is None and docker_time(None) is None and docker_time("junk") is None


def test_tree_usage_counts_descendants() -> None:
    code = f"b = bytearray({CHILD_MEMORY_BYTES}); import sys; sys.stdout.write('ok\\n'); "
    code += "sys.stdout.flush(); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ok\n"
        own = proctree.tree_usage(child.pid)
        whole = proctree.tree_usage(os.getpid())
        assert own is not None and whole is not None
        assert own.rss_bytes >= CHILD_MEMORY_BYTES
        assert whole.rss_bytes >= own.rss_bytes + CHILD_MEMORY_BYTES // 2
        assert whole.cpu_seconds > 0
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert proctree.tree_usage(child.pid) is None


def test_started_at_is_the_process_start() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        info = proctree.read_proc(child.pid)
        assert info is not None
        started = proctree.started_at(info)
        assert started is not None
        assert abs(started - datetime.now(UTC)) < timedelta(seconds=PROCESS_AGE_SLACK_S)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
