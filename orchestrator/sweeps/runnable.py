"""Which cells this machine cannot run, and why: asked once per sweep run, before any trial.

A task says what it needs (``Task.requires``: ``gpu``) and which sandbox image it runs in
(``Task.image``). ``Machine`` answers each need once (a GPU: ``sandbox/gpu.py``; an image: is
it in the local engine; on the kubernetes backend, whose pods the cluster runs from its
registry, an image is assumed there and a GPU is there when the pods ask for one) and
``cannot_run`` maps a task to the first unmet need as one line (``needs a GPU: no NVIDIA
container runtime in this Docker Engine``), or None. The runner marks
those cells ``unrunnable`` with the reason and reports them grouped (``report_lines``); they
stay unscored, and the next ``sweep run`` asks again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from orchestrator.errors import PrimeAgentError

if TYPE_CHECKING:
    from orchestrator.settings import Settings
    from orchestrator.sweeps.grid import Cell
    from orchestrator.sweeps.tasks import Task

__all__ = ["Machine", "cannot_run", "report_lines", "unrunnable"]

NON_DOCKER: Final = ("bwrap", "local")
# Its pods' images and GPUs are the cluster's: nothing on this machine tells (docs/kubernetes.md).
CLUSTER_BACKEND: Final = "kubernetes"


@dataclass
class Machine:
    """What this machine can give a trial, each asked at most once. ``gpu`` and ``image_here``
    can be replaced (tests, or a caller that already knows)."""

    settings: Settings
    backend: str | None = None  # the sweep's backend (None / auto: the daemon's choice)
    gpu: Callable[[], str | None] | None = None
    image_here: Callable[[str], str | None] | None = None
    torch_in: Callable[[str], str | None] | None = None
    _gpu: list[str | None] = field(default_factory=list)
    _images: dict[str, str | None] = field(default_factory=dict)
    _torch: dict[str, str | None] = field(default_factory=dict)

    def gpu_reason(self) -> str | None:
        if not self._gpu:
            if self.gpu is not None:
                self._gpu.append(self.gpu())
            else:
                from orchestrator.sandbox.gpu import gpu_unavailable_reason

                self._gpu.append(gpu_unavailable_reason(self.settings, backend=self.backend))
        return self._gpu[0]

    def image_reason(self, image: str) -> str | None:
        if image not in self._images:
            check = self.image_here or self._image_in_engine
            self._images[image] = check(image)
        return self._images[image]

    def torch_reason(self, image: str) -> str | None:
        if self.backend == CLUSTER_BACKEND:
            return None  # the image is the cluster's registry's: its labels are not read here
        if image not in self._torch:
            check = self.torch_in or _torch_label
            self._torch[image] = check(image)
        return self._torch[image]

    def _image_in_engine(self, image: str) -> str | None:
        from orchestrator.sandbox.images import image_exists, image_hint, resolve_image

        if self.backend in NON_DOCKER:
            return f"the backend is {self.backend}: images need docker"
        if self.backend == CLUSTER_BACKEND:
            return None  # the cluster pulls it; one it cannot is a pod's start error, one line
        try:
            tag = resolve_image(image)
            if image_exists(tag):
                return None
        except PrimeAgentError as exc:
            return str(exc)
        return f"{tag} is not here ({image_hint(tag)})"


def _torch_label(image: str) -> str | None:
    """Whether ``image`` was built with PyTorch (its ``TORCH_LABEL``, set by the cuda build)."""
    from orchestrator.sandbox.images import TORCH_LABEL, image_label, resolve_image

    try:
        if image_label(resolve_image(image), TORCH_LABEL):
            return None
    except PrimeAgentError as exc:
        return str(exc)
    return f"{image} was built without it (prime-agent images build cuda --torch)"


def cannot_run(task: Task, machine: Machine) -> str | None:
    """Why ``machine`` cannot run ``task``'s trials, as one line; None when it can."""
    if "gpu" in task.requires:
        why = machine.gpu_reason()
        if why:
            return f"needs a GPU: {why}"
    if task.image is not None:
        why = machine.image_reason(task.image)
        if why:
            return f"needs the image {task.image}: {why}"
    if "torch" in task.requires:
        why = machine.torch_reason(task.image or machine.settings.sandbox.image)
        if why:
            return f"needs PyTorch: {why}"
    return None


def unrunnable(cells: Sequence[Cell], reason: Callable[[Task], str | None]) -> dict[str, str]:
    """Fingerprint → reason for each cell that cannot run (each task asked once)."""
    by_task: dict[str, str | None] = {}
    found: dict[str, str] = {}
    for cell in cells:
        key = cell.task.content_hash
        if key not in by_task:
            by_task[key] = reason(cell.task)
        why = by_task[key]
        if why:
            found[cell.fingerprint] = why
    return found


def report_lines(name: str, cells: Sequence[Cell], reasons: dict[str, str]) -> list[str]:
    """One line per reason: how many cells, and the first of their tasks (by id)."""
    by_reason: dict[str, list[Cell]] = {}
    for cell in cells:
        why = reasons.get(cell.fingerprint)
        if why:
            by_reason.setdefault(why, []).append(cell)
    lines = []
    for why, held in by_reason.items():
        tasks = sorted({c.task.id for c in held})
        more = f" (and {len(tasks) - 1} more task(s))" if len(tasks) > 1 else ""
        lines.append(f"sweep {name}: {len(held)} cell(s) cannot run here: {tasks[0]}{more}: {why}")
    return lines
