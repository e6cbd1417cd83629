"""The ``pod`` part of a ``sandbox_info`` answer (docs/protocol.md): a session pod on the
kubernetes backend as the daemon sends it and a client reads it.

The daemon builds ``SandboxPod`` from the backend's ``PodDetails`` and sends
``model_dump(mode="json")``; the TUI's inspector reads it back with ``model_validate``, so both
sides agree on one typed shape. The key is optional: an answer for another backend, or from a
daemon older than it, has none. Fields a newer daemon adds are ignored here (``extra``), so an
older client still reads what it knows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["POD_EVENT_COUNT_MIN", "SandboxPod", "SandboxPodEvent"]

POD_EVENT_COUNT_MIN: Final = 1


class _Answer(BaseModel):
    # A client reads what it knows of an answer and ignores what a newer daemon adds.
    model_config = ConfigDict(extra="ignore", frozen=True)


class SandboxPodEvent(_Answer):
    """One core/v1 Event about the pod: ``kind`` Normal or Warning, ``at`` when it last
    happened (null when the event carries no time), ``count`` how often."""

    at: datetime | None = None
    kind: str
    reason: str
    message: str = ""
    count: int = Field(default=POD_EVENT_COUNT_MIN, ge=POD_EVENT_COUNT_MIN)


class SandboxPod(_Answer):
    """Where the pod runs and how it fares. ``cpu_millicores`` (1000 = one CPU) and the
    answer's ``memory_bytes`` come from metrics.k8s.io; without it ``metrics`` says why
    ("no metrics server"). ``events``: the newest few, oldest first."""

    namespace: str
    phase: str
    node: str | None = None
    ip: str | None = None
    restarts: int = Field(default=0, ge=0)
    events: list[SandboxPodEvent] = Field(default_factory=list)
    cpu_millicores: float | None = Field(default=None, ge=0)
    metrics: str = ""
