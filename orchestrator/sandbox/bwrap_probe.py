"""Can the ``bwrap`` backend run here? ``bwrap_usable()`` answers ``(usable, why not)``.

The probe runs a trivial sandbox the way ``sandbox/bwrap.py`` runs a session's: the user, PID,
IPC, UTS and network namespaces, ``--cap-drop ALL``, ``--die-with-parent``, ``/usr`` bound
read-only (and the host's ``/bin``, ``/lib*`` links or directories), running ``/usr/bin/true``
inside. As root it runs bwrap as the unprivileged ``SANDBOX_UID`` with no supplementary groups,
as the backend does, so a kernel that refuses unprivileged user namespaces is found here and
not at a session's first cell. Installed or not is a fact of the process's lifetime: the answer
is cached per process (``bwrap_usable.cache_clear()`` forgets it).

``why not`` is one short clause for ``choice.py``'s refusal and ``prime-agent doctor``: not
installed (and the package to install), user namespaces refused (the kernel's message and the
sysctls that govern it), or bwrap's own last error line.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

from orchestrator.sandbox.docker_user import ROOT_UID, SANDBOX_UID

__all__ = [
    "BWRAP_PROGRAM",
    "NOT_INSTALLED",
    "PROBE_TIMEOUT_S",
    "bwrap_usable",
    "probe_argv",
    "probe_bwrap",
    "refusal_reason",
]

BWRAP_PROGRAM: Final = "bwrap"
NOT_INSTALLED: Final = "bubblewrap is not installed (apt-get install bubblewrap)"
# A trivial sandbox starts in milliseconds; past this the probe says bwrap hangs.
PROBE_TIMEOUT_S: Final = 10.0
# What the probe runs inside: part of /usr, which the sandbox binds read-only.
PROBE_COMMAND: Final = "/usr/bin/true"
# Top-level host paths the sandbox carries as on the host (merged-/usr links or directories).
SYSTEM_PATHS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Words of bwrap's error when the kernel refuses to create the user namespace (or its uid map).
USERNS_MARKERS: Final = ("namespace", "uid map", "uid_map", "setting up uid", "No permissions")
USERNS_SYSCTLS: Final = (
    "kernel.unprivileged_userns_clone, user.max_user_namespaces, "
    "kernel.apparmor_restrict_unprivileged_userns"
)
BWRAP_ERROR_PREFIX: Final = "bwrap: "  # how bwrap starts its error lines
# A refusal is quoted up to this many characters (the clause stays one short line).
MAX_QUOTED_CHARS: Final = 160


def probe_argv(bwrap: str) -> list[str]:
    """The trivial sandbox: the namespaces and flags of the backend's plan, /usr read-only."""
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name in SYSTEM_PATHS:
        path = Path(name)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            argv += ["--ro-bind", name, name]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "--", PROBE_COMMAND]


def refusal_reason(stderr: str) -> str:
    """The clause for a probe that failed with ``stderr`` (bwrap's own message)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    message = (lines[-1] if lines else "no error message").removeprefix(BWRAP_ERROR_PREFIX)
    message = message[:MAX_QUOTED_CHARS]
    if any(marker.lower() in message.lower() for marker in USERNS_MARKERS):
        return (
            f"the kernel refuses bwrap a user namespace ({message}; check sysctl {USERNS_SYSCTLS})"
        )
    return f"bwrap cannot start a sandbox here ({message})"


def probe_bwrap(bwrap: str | None) -> tuple[bool, str]:
    """Run the trivial sandbox with the ``bwrap`` executable (None: not installed)."""
    if bwrap is None:
        return False, NOT_INSTALLED
    # As root, bwrap runs as the sandbox's unprivileged user, as the backend runs it.
    uid = SANDBOX_UID if os.geteuid() == ROOT_UID else None
    try:
        proc = subprocess.run(
            probe_argv(bwrap),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            cwd="/",  # a directory the unprivileged user can enter
            env={},
            check=False,
            user=uid,
            group=uid,
            extra_groups=None if uid is None else [],
        )
    except subprocess.TimeoutExpired:
        return False, f"bwrap did not finish a trivial sandbox within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return False, f"bwrap cannot be run ({exc.strerror or exc})"
    if proc.returncode != 0:
        return False, refusal_reason(proc.stderr)
    return True, ""


@functools.cache
def bwrap_usable() -> tuple[bool, str]:
    """``(True, "")`` when bwrap on PATH runs the trivial sandbox, else ``(False, why not)``."""
    return probe_bwrap(shutil.which(BWRAP_PROGRAM))
