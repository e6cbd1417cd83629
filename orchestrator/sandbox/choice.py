"""Which sandbox backend a session gets: ``auto``, ``docker``, ``bwrap``, ``local`` or
``kubernetes`` (docs/docker.md, "Backend selection"; docs/kubernetes.md, "Choosing it").

One rule for print mode (``sessions/runner.make_backend``), the daemon (``daemon/backends.py``)
and import (``cli/import_.py``):

- ``auto``: docker when an engine answers and the session image exists, else bwrap when it runs
  a trivial sandbox here (``sandbox/bwrap_probe.py``), else a ``UserError`` of one line naming
  both fixes and ``--backend local``. ``auto`` never falls back to the unsandboxed backend.
- ``docker`` / ``bwrap``: that backend, or a ``UserError`` saying why it is not usable.
- ``local``: only when asked for, and ALWAYS with ``LOCAL_WARNING``: whoever starts such a
  session is told, on every path (print mode, the daemon's create-session and import replies,
  the TUI), that it is not isolated.
- ``kubernetes``: only when asked for (``--backend kubernetes``, ``$PRIME_AGENT_BACKEND``):
  that backend when the cluster of ``[kubernetes]`` answers (``sandbox/k8s_status.py``), else a
  ``UserError`` saying why and what to do. ``auto`` never picks it: a kubeconfig on a laptop
  does not mean its sessions belong in that cluster.

Each status callable answers ``(usable, why not)`` and is only called when its backend is a
candidate, so choosing docker never probes bwrap and ``local`` probes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from orchestrator.errors import UserError

__all__ = [
    "BACKEND_CHOICES",
    "KUBERNETES_FIX",
    "LOCAL_WARNING",
    "NO_SANDBOX_FIXES",
    "BackendChoice",
    "BackendName",
    "BackendRequest",
    "choose_backend",
]

BACKEND_CHOICES: Final = ("auto", "docker", "bwrap", "local", "kubernetes")
BackendRequest = Literal["auto", "docker", "bwrap", "local", "kubernetes"]
BackendName = Literal["docker", "bwrap", "local", "kubernetes"]
Status = Callable[[], tuple[bool, str]]

LOCAL_WARNING: Final = (
    "the local backend does not isolate the session: its code runs as you, with your files, "
    "network and credentials (--backend docker or bwrap sandboxes it)"
)
DOCKER_FIX: Final = "start Docker and build the session image (make images)"
BWRAP_FIX: Final = "install bubblewrap (make install does it as root)"
KUBERNETES_FIX: Final = (
    "point $KUBECONFIG (or [kubernetes] context in config.toml) at a cluster whose API server "
    "answers, or run the daemon in the cluster (docs/kubernetes.md)"
)
# What to do when auto finds neither (its refusal and doctor's report end with it).
NO_SANDBOX_FIXES: Final = (
    f"{DOCKER_FIX}, or {BWRAP_FIX}; --backend local runs the session unsandboxed"
)


@dataclass(frozen=True)
class BackendChoice:
    name: BackendName
    warning: str = ""  # one line, without a "prime-agent: warning: " prefix


def choose_backend(
    requested: str,
    docker_status: Status,
    bwrap_status: Status,
    *,
    kubernetes_status: Status,
) -> BackendChoice:
    """Apply the rule above. Raises ``UserError`` (one line)."""
    if requested not in BACKEND_CHOICES:
        raise UserError(f"unknown backend {requested!r}; use {', '.join(BACKEND_CHOICES)}")
    if requested == "local":
        return BackendChoice("local", LOCAL_WARNING)
    if requested == "kubernetes":
        usable, why = kubernetes_status()
        if not usable:
            raise UserError(f"the kubernetes backend is not usable: {why}; {KUBERNETES_FIX}")
        return BackendChoice("kubernetes")
    if requested == "bwrap":
        usable, why = bwrap_status()
        if not usable:
            raise UserError(f"the bwrap backend is not usable: {why}")
        return BackendChoice("bwrap")
    docker_ok, docker_why = docker_status()
    if docker_ok:
        return BackendChoice("docker")
    if requested == "docker":
        raise UserError(f"the docker backend is not usable: {docker_why}")
    bwrap_ok, bwrap_why = bwrap_status()
    if bwrap_ok:
        return BackendChoice("bwrap")
    raise UserError(
        f"no sandbox backend is usable here: docker ({docker_why}), bwrap ({bwrap_why}); "
        f"{NO_SANDBOX_FIXES}"
    )
