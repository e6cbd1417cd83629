"""Limits through a systemd transient scope, where systemd runs but no cgroup is writable.

The typical case is a laptop with systemd where the daemon runs as the user: its own cgroup
belongs to systemd, but the user's systemd manager makes a scope with limits on request.
``confinement`` puts ``systemd-run [--user] --scope --unit=prime-agent-<name> -p MemoryMax=
-p MemorySwapMax=0 -p TasksMax= -p CPUQuota= --`` in front of the sandbox's command; systemd-run
moves itself into the new scope and execs the command, so the started pid stays the sandbox's.
Usage, pids and kill go through ``systemctl [--user]``.

Not run for real: the machine this was built on has no systemd. Kept small on purpose.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

from orchestrator.sandbox import cgroupfs
from orchestrator.sandbox.base import ResourceLimits
from orchestrator.sandbox.confinement import Confinement, LimitUsage

__all__ = ["available", "confinement", "exists", "kill", "pids", "stop", "usage"]

SYSTEMD_RUN: Final = "systemd-run"
SYSTEMCTL: Final = "systemctl"
SYSTEMD_RUNNING_DIR: Final = Path("/run/systemd/system")
UNIT_PREFIX: Final = "prime-agent-"
SCOPE_SUFFIX: Final = ".scope"
SYSTEMCTL_TIMEOUT_S: Final = 5.0
PERCENT: Final = 100
NS_PER_S: Final = 1_000_000_000
CGROUP2_DEFAULT_MOUNT: Final = Path("/sys/fs/cgroup")


def available() -> bool:
    """systemd is pid 1 and we can reach our manager (the user's unless we are root)."""
    if shutil.which(SYSTEMD_RUN) is None or not SYSTEMD_RUNNING_DIR.is_dir():
        return False
    if os.geteuid() == 0:
        return True
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    return bool(os.environ.get("DBUS_SESSION_BUS_ADDRESS")) or (
        bool(runtime) and (Path(runtime) / "bus").exists()
    )


def confinement(name: str, group_name: str, limits: ResourceLimits) -> Confinement:
    user = os.geteuid() != 0
    unit = f"{UNIT_PREFIX}{group_name}"
    argv = [SYSTEMD_RUN, *(["--user"] if user else []), "--scope", "--quiet", "--collect"]
    argv.append(f"--unit={unit}")
    if limits.memory_bytes is not None:
        argv += ["-p", f"MemoryMax={limits.memory_bytes}", "-p", "MemorySwapMax=0"]
    if limits.pids is not None:
        argv += ["-p", f"TasksMax={limits.pids}"]
    if limits.cpus is not None:
        argv += ["-p", f"CPUQuota={round(limits.cpus * PERCENT)}%"]
    argv.append("--")
    return Confinement(
        name=name,
        kind="systemd-scope",
        argv_prefix=argv,
        scope_unit=unit + SCOPE_SUFFIX,
        scope_user=user,
    )


def _systemctl(*args: str, user: bool) -> str:
    argv = [SYSTEMCTL, *(["--user"] if user else []), *args]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False
        )
        return done.stdout
    return ""


def _show(unit: str, *properties: str, user: bool) -> dict[str, str]:
    args = ["show", unit, *(f"--property={p}" for p in properties)]
    values: dict[str, str] = {}
    for line in _systemctl(*args, user=user).splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    return values


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def usage(unit: str, *, user: bool) -> LimitUsage:
    shown = _show(unit, "MemoryCurrent", "MemoryMax", "CPUUsageNSec", user=user)
    cpu_ns = _int(shown.get("CPUUsageNSec"))
    return LimitUsage(
        memory_bytes=_int(shown.get("MemoryCurrent")),
        memory_limit_bytes=_int(shown.get("MemoryMax")),
        cpu_seconds=None if cpu_ns is None else cpu_ns / NS_PER_S,
    )


def pids(unit: str, *, user: bool) -> list[int]:
    group = _show(unit, "ControlGroup", user=user).get("ControlGroup", "")
    if not group:
        return []
    v2 = next((h for h in cgroupfs.host_hierarchies() if h.version == 2), None)
    mount = v2.mount_point if v2 is not None else CGROUP2_DEFAULT_MOUNT
    return cgroupfs.read_pids(mount / group.lstrip("/") / "cgroup.procs")


def exists(unit: str, *, user: bool) -> bool:
    return _show(unit, "ActiveState", user=user).get("ActiveState") == "active"


def kill(unit: str, *, user: bool) -> None:
    _systemctl("kill", "--signal=SIGKILL", unit, user=user)


def stop(unit: str, *, user: bool) -> None:
    kill(unit, user=user)
    _systemctl("stop", unit, user=user)
