"""A session's sandbox policy: chosen when it is created, stored with it, applied at every start.

``policy_for`` takes the policy a new root session gets from the backend it runs on (whose
defaults are the config's ``[sandbox]`` and, for docker, ``--network``); a child copies its
parent's. ``apply_policy`` puts a stored policy into the ``SandboxSpec`` of each sandbox the
session starts, so a daemon restarted with another ``[sandbox]`` (or another image, limits or
network) still gives the session what it was created with (docs/daemon.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from orchestrator.errors import UserError
from orchestrator.sandbox.base import ResourceLimits, SandboxBackend, SandboxSpec
from orchestrator.sandbox.mounts import ExtraMount
from orchestrator.session_specs import StoredMount, StoredSandboxPolicy
from orchestrator.settings import Settings

__all__ = ["SandboxChoice", "apply_policy", "chosen_policy", "policy_for"]


@dataclasses.dataclass(frozen=True)
class SandboxChoice:
    """What one run asks of its root session's sandbox (``-p --image rust --network``, an eval
    config's ``sandbox``); each ``None`` is the backend's default. It becomes part of the
    stored policy, so the choice travels with the session through every later start, wake
    and daemon."""

    image: str | None = None
    workspace: Literal["rw", "ro", "copy"] | None = None
    network: bool | None = None
    # Limits (an eval config's sandbox.memory_mib and cpus; docker enforces them).
    memory_bytes: int | None = None
    cpus: float | None = None
    # Host directories at more paths inside (a Harbor task's /app, /tests, /logs).
    mounts: tuple[StoredMount, ...] | None = None

    def fields(self) -> dict[str, object]:
        chosen = {
            "mounts": self.mounts,
            "image": self.image,
            "workspace": self.workspace,
            "network": self.network,
            "memory_bytes": self.memory_bytes,
            "cpus": self.cpus,
        }
        return {k: v for k, v in chosen.items() if v is not None}


def policy_for(backend: SandboxBackend, settings: Settings) -> StoredSandboxPolicy:
    """The policy ``backend`` gives a session that asks for nothing: its own defaults where it
    has them (a docker backend built with other limits than the config's), else the config's."""
    sandbox = settings.sandbox
    image = getattr(backend, "image", None)
    workspace = getattr(backend, "workspace_mode", None)
    memory = getattr(backend, "memory_bytes", None)
    cpus = getattr(backend, "cpus", None)
    pids = getattr(backend, "pids_limit", None)
    network = getattr(backend, "network", None)
    return StoredSandboxPolicy(
        backend=backend.name,
        image=image if isinstance(image, str) else sandbox.image,
        workspace=workspace if workspace in ("rw", "ro", "copy") else sandbox.workspace,
        network=network if isinstance(network, bool) else False,
        memory_bytes=memory if isinstance(memory, int) else sandbox.memory_bytes,
        cpus=float(cpus) if isinstance(cpus, int | float) else sandbox.cpus,
        pids=pids if isinstance(pids, int) else sandbox.pids_limit,
    )


def chosen_policy(policy: StoredSandboxPolicy, choice: SandboxChoice | None) -> StoredSandboxPolicy:
    """``policy`` with ``choice`` applied, validated like a stored one (a bad image name is a
    one-line ``UserError`` here, not a failed sandbox start later)."""
    fields = choice.fields() if choice is not None else {}
    if not fields:
        return policy
    try:
        return StoredSandboxPolicy.model_validate({**policy.model_dump(), **fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "sandbox"
        raise UserError(f"sandbox {where}: {error['msg']}") from None


def apply_policy(spec: SandboxSpec, policy: StoredSandboxPolicy) -> SandboxSpec:
    """``spec`` asking for exactly ``policy`` (nothing left to the backend's defaults)."""
    return dataclasses.replace(
        spec,
        image=policy.image,
        workspace=policy.workspace,
        network=policy.network,
        limits=ResourceLimits(memory_bytes=policy.memory_bytes, cpus=policy.cpus, pids=policy.pids),
        mounts=tuple(ExtraMount(Path(m.source), m.target, m.read_only) for m in policy.mounts),
    )
