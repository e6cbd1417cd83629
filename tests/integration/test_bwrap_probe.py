"""``sandbox/bwrap_probe.py`` against the real bubblewrap: usable here, and each "why not" from a
real failure — no bwrap on PATH, a kernel that refuses the user namespace (reproduced by
running the probe inside a sandbox made with ``--disable-userns``), and, as root, a bwrap the
sandbox's unprivileged user cannot execute (the probe runs it as that user, as the backend
does)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox.bwrap_probe import (
    BWRAP_PROGRAM,
    NOT_INSTALLED,
    PROBE_TIMEOUT_S,
    bwrap_usable,
    probe_bwrap,
)
from orchestrator.sandbox.docker_user import SANDBOX_UID
from tests.helpers import need

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only")

SOURCE_ROOT = Path(__file__).resolve().parents[2]
# Inside the outer sandbox, the probe as a fresh interpreter runs it.
PROBE_SCRIPT = (
    "from orchestrator.sandbox.bwrap_probe import bwrap_usable; "
    "ok, why = bwrap_usable(); print(ok); print(why)"
)
OUTER_TIMEOUT_S = PROBE_TIMEOUT_S * 3


def bwrap_path() -> str:
    path = shutil.which(BWRAP_PROGRAM)
    if path is None:
        need("bwrap", NOT_INSTALLED)
    return path


def test_bwrap_runs_the_trivial_sandbox_here() -> None:
    bwrap_path()
    assert bwrap_usable() == (True, "")
    assert bwrap_usable() is bwrap_usable()  # cached: one probe per process


def test_without_bwrap_the_reason_says_what_to_install() -> None:
    assert probe_bwrap(None) == (False, NOT_INSTALLED)
    assert "apt-get install bubblewrap" in NOT_INSTALLED


def test_a_refused_user_namespace_is_reported_with_the_kernels_words_and_the_sysctls() -> None:
    bwrap = bwrap_path()
    # An outer sandbox whose processes may create no user namespace: the probe's bwrap inside
    # gets the kernel's refusal, as on a host with unprivileged user namespaces turned off.
    # Inside it runs as uid 1000, so the probe does not drop privileges itself.
    outer = [
        bwrap,
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--chdir",
        str(SOURCE_ROOT),
        "--",
        sys.executable,
        "-c",
        PROBE_SCRIPT,
    ]
    proc = subprocess.run(
        outer, capture_output=True, text=True, timeout=OUTER_TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, proc.stderr
    ok, why = proc.stdout.splitlines()
    assert ok == "False"
    assert why.startswith("the kernel refuses bwrap a user namespace (")
    assert "Creating new namespace failed" in why  # bwrap's own message, quoted
    assert "sysctl kernel.unprivileged_userns_clone" in why


@pytest.mark.skipif(os.geteuid() != 0, reason="the probe drops privileges only as root")
def test_as_root_the_probe_runs_bwrap_as_the_sandbox_user(tmp_path: Path) -> None:
    bwrap = bwrap_path()
    # A copy of bwrap only root may execute: root could run it, the sandbox's user cannot.
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    copy = private / BWRAP_PROGRAM
    shutil.copy2(bwrap, copy)
    copy.chmod(stat.S_IRWXU)
    assert probe_bwrap(bwrap) == (True, "")
    usable, why = probe_bwrap(str(copy))
    assert not usable and why == "bwrap cannot be run (Permission denied)", why
