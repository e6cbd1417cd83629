"""Whether a sandbox can be given a GPU here, and if not, why (one short line).

On this machine a GPU reaches a sandbox one way (docs/images.md, "cuda"): the docker backend passes
``[sandbox] gpus`` as docker's ``--gpus`` (``docker_run.gpu_requests``), and the engine hands the
devices and the driver's libraries over through the NVIDIA container runtime. So a GPU is
available when the backend is docker, the engine answers and has that runtime, and ``[sandbox]
gpus`` (or the caller's own request) names some. The sweep runner asks before it starts a cell
whose task needs a GPU (``sweeps/runnable.py``); nothing here starts a container.

On the kubernetes backend the cluster decides: a session pod asks for ``[kubernetes] gpus`` of
``nvidia.com/gpu``, and a pod no node can give them stays Pending, a start error of one line
(``k8s_pod_state.py``). So the answer there is only whether the pods ask for any.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.settings import Settings

__all__ = [
    "GPU_HOOKS",
    "GPU_RUNTIME",
    "NO_GPU_RUNTIME",
    "POD_GPUS_NOT_SET",
    "docker_info",
    "gpu_unavailable_reason",
    "has_gpu_runtime",
]

GPU_RUNTIME: Final = "nvidia"  # the runtime `docker info` lists where the toolkit registered it
# The NVIDIA container toolkit's binaries: with them on the engine's host, `--gpus` works even
# when no runtime named nvidia is registered (the toolkit's prestart hook does the work).
GPU_HOOKS: Final = ("nvidia-container-runtime-hook", "nvidia-container-cli")
NO_GPU_RUNTIME: Final = "no NVIDIA container runtime in this Docker Engine"
GPUS_NOT_SET: Final = '[sandbox] gpus is not set (gpus = "all" or a count gives sandboxes GPUs)'
POD_GPUS_NOT_SET: Final = "[kubernetes] gpus is 0 (a count gives each session pod nvidia.com/gpu)"


def docker_info() -> Mapping[str, Any]:
    """``docker info`` of the engine as a mapping; ``UserError`` (one line) when it does not
    answer."""
    from orchestrator.sandbox.images import docker_client

    info = docker_client().info()
    return info if isinstance(info, Mapping) else {}


def has_gpu_runtime(
    info: Mapping[str, Any], which: Callable[[str], str | None] = shutil.which
) -> bool:
    """Whether the engine of ``info`` can hand GPUs to a container: a runtime named nvidia is
    registered, or the toolkit's hook is installed here (an engine on this host finds it)."""
    runtimes = info.get("Runtimes") or {}
    if GPU_RUNTIME in runtimes or info.get("DefaultRuntime") == GPU_RUNTIME:
        return True
    return any(which(name) for name in GPU_HOOKS)


def gpu_unavailable_reason(
    settings: Settings,
    *,
    backend: str | None = None,
    gpus: str | None = None,
    info: Callable[[], Mapping[str, Any]] = docker_info,
    which: Callable[[str], str | None] = shutil.which,
) -> str | None:
    """None when a docker sandbox started with these settings gets a GPU; else why not.

    ``backend``: the one the sandbox would use (``auto`` or None: docker when the engine
    answers); ``gpus``: what the caller asks for, else ``settings.sandbox.gpus``."""
    if backend in ("bwrap", "local"):
        return f"the backend is {backend}: GPUs need docker"
    if backend == "kubernetes":  # the pods ask the cluster; this machine's engine says nothing
        return None if settings.kubernetes.gpus > 0 else POD_GPUS_NOT_SET
    try:
        found = info()
    except UserError as exc:
        return str(exc)
    if not has_gpu_runtime(found, which):
        return NO_GPU_RUNTIME
    if not (gpus if gpus is not None else settings.sandbox.gpus):
        return GPUS_NOT_SET
    return None
