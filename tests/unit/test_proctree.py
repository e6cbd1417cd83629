"""proctree's kill helpers on real processes: what a timed-out cell forked, and a whole tree."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from orchestrator.sandbox import proctree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")

HELPER_TIMEOUT_S = 60
SLEEP_S = 600  # how long the helpers' processes would live if nothing killed them
DEATH_DEADLINE_S = 10
POLL_S = 0.01

# Runs in its own interpreter, so its copies share its command line (`python -c ...`), not
# pytest's. An "old" copy forked before the window, then the window's: a copy, that copy's own
# copy (a grandchild) and a child that execs another program. Prints pids and what was killed.
_FORKER = f"""
import json, os, sys, time
from orchestrator.sandbox import proctree

def copy(then=None):
    pid = os.fork()
    if pid == 0:
        if then is not None:
            then()
        time.sleep({SLEEP_S})
        os._exit(0)
    return pid

old = copy()
old_start = proctree.read_proc(old).start_time
while proctree._uptime_ticks() <= old_start + 2:  # the clock moves past the old copy's start
    time.sleep(0.01)
mark = proctree._uptime_ticks()
r, w = os.pipe()
young = copy(lambda: os.write(w, str(copy()).encode() + b"\\n"))
grandchild = int(os.fdopen(r).readline())
other = os.fork()
if other == 0:
    os.execvp("sleep", ["sleep", "{SLEEP_S}"])
while proctree._cmdline(other) == proctree._cmdline(os.getpid()):  # until the exec happened
    time.sleep(0.01)
window = (proctree._uptime_ticks() - mark + 1) / os.sysconf("SC_CLK_TCK")
killed = proctree.kill_forked_copies(window)
deadline = time.monotonic() + {DEATH_DEADLINE_S}
while (g := proctree.read_proc(grandchild)) is not None and proctree.is_running(g):
    if time.monotonic() > deadline:  # a SIGKILL takes effect when the target next runs
        break
    time.sleep(0.01)
alive = {{n: p for n, p in [("old", old), ("young", young), ("grandchild", grandchild),
    ("other", other)] if proctree.read_proc(p) and proctree.read_proc(p).state != "Z"}}
print(json.dumps({{"killed": killed, "alive": sorted(alive)}}), flush=True)
for pid in (old, other):
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


def test_kill_forked_copies_kills_the_window_s_copies_only() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FORKER],
        capture_output=True,
        text=True,
        timeout=HELPER_TIMEOUT_S,
        check=True,
    )
    report = json.loads(out.stdout)
    # The copy and its own copy die; the copy from before the window and the exec'd program
    # (another command line) are left. The grandchild's parent died first, so it is a zombie of
    # whoever adopted it, or gone: either way not running.
    assert report == {"killed": 2, "alive": ["old", "other"]}


def test_kill_forked_copies_without_copies_kills_nothing() -> None:
    assert proctree.kill_forked_copies(SLEEP_S) == 0


_ESCAPER = f"""
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setsid()  # out of the parent's process group: a group signal misses it
    if os.fork() == 0:
        time.sleep({SLEEP_S})
        os._exit(0)
    print("ready", flush=True)  # both exist now
    time.sleep({SLEEP_S})
    os._exit(0)
sys.stdin.read()
"""


def test_sweep_descendants_reaches_a_process_that_left_the_group() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _ESCAPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "ready\n"
        found = proctree.descendants(parent.pid)
        assert len([p for p in found if p.state != "Z"]) == 2
        assert proctree.sweep_descendants(parent.pid) == 2
        # A SIGKILL takes effect when its target next runs.
        deadline = time.monotonic() + DEATH_DEADLINE_S
        while any(proctree.is_running(p) for p in found) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert not any(proctree.is_running(p) for p in found)
        assert parent.poll() is None  # the root itself is not a descendant
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(HELPER_TIMEOUT_S)
