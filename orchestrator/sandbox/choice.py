"""Which sandbox backend a session gets: ``auto``, ``docker`` or ``local`` (docs/docker.md).

One rule for print mode (``sessions/runner.make_backend``) and the daemon
(``daemon/backends.py``): ``auto`` is docker when an engine answers and the session image
exists, else local with a one-line warning that the session is NOT isolated; ``docker`` fails
with a one-line error when docker is not usable; ``local`` is local.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from orchestrator.errors import UserError

__all__ = ["BACKEND_CHOICES", "BackendChoice", "choose_backend"]

BACKEND_CHOICES: Final = ("auto", "docker", "local")


@dataclass(frozen=True)
class BackendChoice:
    name: Literal["docker", "local"]
    warning: str = ""  # one line, without a "prime-agent: warning: " prefix


def choose_backend(requested: str, docker_status: Callable[[], tuple[bool, str]]) -> BackendChoice:
    """Apply the rule above; ``docker_status()`` is ``(usable, why not)`` and is only called
    when docker is asked for (``auto``, ``docker``). Raises ``UserError``."""
    if requested not in BACKEND_CHOICES:
        raise UserError(f"unknown backend {requested!r}; use auto, docker or local")
    if requested == "local":
        return BackendChoice("local")
    usable, why = docker_status()
    if usable:
        return BackendChoice("docker")
    if requested == "docker":
        raise UserError(f"the docker backend is not usable: {why}")
    return BackendChoice("local", f"using the local backend, the session is NOT isolated ({why})")
