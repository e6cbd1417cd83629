"""Decoding the host's replies in the kernel (stdlib only).

A reply the orchestrator sent in a shape the helper does not expect is its fault, not the
caller's: each of these raises ``InternalHostError`` naming the request (``where``) and the key.
Shared by every in-kernel helper that makes host requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.runtime.errors import InternalHostError

__all__ = ["as_items", "as_object", "field_opt_str", "field_str"]


def field_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise InternalHostError(f"the orchestrator's reply to {where} has no {key!r}")
    return value


def field_opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def as_object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InternalHostError(f"the orchestrator's reply to {where} is not an object")
    return value


def as_items(value: object, key: str, where: str) -> list[Mapping[str, Any]]:
    """The list under ``key`` (or the result itself when it is a list), each an object."""
    items = value.get(key) if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise InternalHostError(f"the orchestrator's reply to {where} has no {key!r} list")
    return [as_object(item, where) for item in items]
