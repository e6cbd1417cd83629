"""Arguments of host requests (kernel → orchestrator), validated at the boundary.

Every host-request handler parses its ``args`` into a pydantic model derived from
``RequestArgs``: unknown fields are refused (so a kernel cannot even *claim* something the
handler ignores) and values are strict (a version ``"3"`` or a paused ``"yes"`` is a caller's
bug, not something to coerce). A refusal is one ``invalid_argument`` line naming the request
and each bad field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.bus.router import HostRequestError

__all__ = ["RequestArgs", "parse_args"]

_Args = TypeVar("_Args", bound=BaseModel)


class RequestArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def parse_args(model: type[_Args], where: str, args: dict[str, Any]) -> _Args:
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'args'}: {error['msg']}"
            for error in exc.errors()
        )
        raise HostRequestError("invalid_argument", f"{where}: {problems}") from None
