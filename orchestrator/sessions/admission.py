"""Spawn admissions in progress: the slots a parent has promised but not yet created.

``rlm.run`` checks the live-children quota and the names, reserves a slot here (and the
child's budget node in the budget tree), all in one step with no ``await`` in between, and only
then awaits the child's creation. A concurrent admission for the same parent counts the held
slots with the children it finds, so ``asyncio.gather`` of many spawns cannot pass the check
together (issue 15). A slot is released when the child is live (it then counts as a live
session) or when its creation fails or is cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SpawnSlots"]


class SpawnSlots:
    """Per parent: child id -> requested name (None: a default name, unique by its id)."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, str | None]] = {}

    def held(self, parent_id: str) -> Mapping[str, str | None]:
        return self._held.get(parent_id, {})

    def hold(self, parent_id: str, child_id: str, name: str | None) -> None:
        self._held.setdefault(parent_id, {})[child_id] = name

    def release(self, parent_id: str, child_id: str) -> None:
        slots = self._held.get(parent_id)
        if slots is None:
            return
        slots.pop(child_id, None)
        if not slots:
            del self._held[parent_id]
