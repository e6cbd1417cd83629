"""The choices of the run command's options, shared by typer (``cli/run.py``) and the lean
pre-dispatch (``cli/entry.py``); only the standard library, so the pre-dispatch stays cheap."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PLAIN_MODES", "Backend", "Mode", "Workspace"]


class Mode(StrEnum):
    text = "text"
    json = "json"
    acp = "acp"  # an Agent Client Protocol agent on stdio (cli/acp_mode.py)
    rpc = "rpc"  # Prime Agent's JSONL RPC protocol on stdio (cli/rpc_mode.py)


# The modes the lean pre-dispatch runs itself (the others go to typer).
PLAIN_MODES = frozenset({Mode.text.value, Mode.json.value})


class Backend(StrEnum):
    """``--backend``: orchestrator/sandbox/choice.py's BACKEND_CHOICES (a test keeps them equal)."""

    auto = "auto"  # docker when usable, else bwrap, else refused
    docker = "docker"
    bwrap = "bwrap"
    local = "local"  # only when asked for: NOT isolated (a warning says so)
    kubernetes = "kubernetes"  # only when asked for: a pod per session (docs/kubernetes.md)


class Workspace(StrEnum):
    """How the project directory reaches the sandbox (docs/docker.md, "Workspace modes")."""

    rw = "rw"
    ro = "ro"  # read-only (the local backend cannot enforce it and says so)
    copy = "copy"  # a private copy, synced back into the project when the sandbox stops
