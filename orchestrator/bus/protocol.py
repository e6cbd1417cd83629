"""The host side's validated view of the host-request wire shapes (pydantic, at the boundary).

The contract itself (subjects, environment names, request types, error codes, limits) is written
once in ``orchestrator/runtime/wire.py``, on the stdlib-only side that the kernel can import;
this module adds only the models the router parses requests into and serializes replies from
(``orchestrator/bus/router.py``). A payload with an unknown field is refused (``extra="forbid"``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.runtime.wire import PROTOCOL_VERSION

__all__ = ["HostErrorBody", "HostReply", "HostRequest"]


class HostRequest(BaseModel):
    """``{"v": 1, "type": ..., "args": {...}}``; ``type`` is checked by the router."""

    model_config = ConfigDict(extra="forbid")

    v: Literal[1] = PROTOCOL_VERSION
    type: str
    args: dict[str, Any] = Field(default_factory=dict)


class HostErrorBody(BaseModel):
    """A refusal: ``code`` is one of ``runtime.wire.ERROR_CODES``."""

    model_config = ConfigDict(extra="forbid")

    code: str
    message: str
    retry_after: float | None = None


class HostReply(BaseModel):
    """``ok`` with a ``result``, or not ``ok`` with an ``error``."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    result: Any = None
    error: HostErrorBody | None = None
