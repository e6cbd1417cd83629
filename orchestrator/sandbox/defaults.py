"""The defaults a container-like backend takes from config.toml: ``[sandbox]`` (image,
workspace mode, memory, CPUs, PIDs) and the REPL's settings (interrupt grace, output cap).

One reading of them for the backends built ``from_settings`` with a session image: docker's
(``DockerBackend.from_settings``) and kubernetes' (``KubernetesBackend.from_settings``). What
only one backend has (docker's ``[sandbox] gpus``, kubernetes' ``[kubernetes]``) each adds
itself.
"""

from __future__ import annotations

from typing import TypedDict

from orchestrator.sandbox.base import WorkspaceMode
from orchestrator.settings import Settings

__all__ = ["SandboxDefaults", "sandbox_defaults"]


class SandboxDefaults(TypedDict):
    """Keyword arguments both backends' constructors take under these names."""

    image: str
    workspace_mode: WorkspaceMode
    memory_bytes: int
    cpus: float
    pids_limit: int
    interrupt_grace_s: float
    output_cap_chars: int


def sandbox_defaults(settings: Settings) -> SandboxDefaults:
    """``settings``' sandbox policy and REPL settings as a backend's constructor arguments."""
    sandbox = settings.sandbox
    return SandboxDefaults(
        image=sandbox.image,
        workspace_mode=sandbox.workspace,
        memory_bytes=sandbox.memory_bytes,
        cpus=sandbox.cpus,
        pids_limit=sandbox.pids_limit,
        interrupt_grace_s=settings.interrupt_grace_s,
        output_cap_chars=settings.output_cap_chars,
    )
