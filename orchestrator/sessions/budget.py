"""Token budgets as a tree (docs/spec.md §8).

A session may have a budget of its own (a root's, or one reserved at spawn with
``rlm(..., budget=N)``). Spending counts against the session and every ancestor. A child's
budget is *reserved* out of its parent's remaining budget at spawn, so siblings cannot promise
the same tokens twice; what the child has not spent yet stays reserved.

Spending is checked before every model call, so a session overshoots its budget by at most one
call (R11). Tokens counted: uncached input + cache writes + output; cache reads are excluded
(they are cheap and would make long sessions look expensive), as the reference does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BudgetTree", "billable_tokens"]


def billable_tokens(input: int, output: int, cache_write: int) -> int:
    return input + output + cache_write


@dataclass
class _Node:
    parent: str | None
    budget: int | None
    own_spent: int = 0
    children: set[str] = field(default_factory=set)


class BudgetTree:
    """In-memory view; the store is the record (usage rows, ``sessions.budget_tokens``)."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def add(self, session_id: str, parent: str | None, budget: int | None, spent: int = 0) -> None:
        """A node for ``session_id``; adding it again (a reservation made at admission, then
        the session's creation) keeps the children it already has."""
        old = self._nodes.get(session_id)
        node = _Node(parent=parent, budget=budget, own_spent=spent)
        if old is not None:
            node.children = old.children
        self._nodes[session_id] = node
        if parent is not None and parent in self._nodes:
            self._nodes[parent].children.add(session_id)

    def remove(self, session_id: str) -> None:
        """Drop a node that never ran (a spawn whose creation failed): its reservation ends."""
        node = self._nodes.get(session_id)
        if node is None or node.children:  # a node with children stays: they walk up through it
            return
        del self._nodes[session_id]
        if node.parent is not None and node.parent in self._nodes:
            self._nodes[node.parent].children.discard(session_id)

    def spend(self, session_id: str, tokens: int) -> None:
        node = self._nodes.get(session_id)
        if node is not None:
            node.own_spent += tokens

    def subtree_spent(self, session_id: str) -> int:
        node = self._nodes[session_id]
        return node.own_spent + sum(self.subtree_spent(c) for c in node.children)

    def _outstanding_reservations(self, session_id: str, *, excluding: str | None = None) -> int:
        """Budget reserved by budgeted children and not yet spent."""
        total = 0
        for child in self._nodes[session_id].children:
            cnode = self._nodes[child]
            if child == excluding or cnode.budget is None:
                continue
            total += max(0, cnode.budget - self.subtree_spent(child))
        return total

    def available(self, session_id: str) -> int | None:
        """Tokens this session may still spend or reserve; None = unlimited."""
        best: int | None = None
        current: str | None = session_id
        below: str | None = None
        while current is not None:
            node = self._nodes[current]
            if node.budget is not None:
                # Spending below a budgeted child is covered by that child's reservation.
                left = (
                    node.budget
                    - self.subtree_spent(current)
                    - self._outstanding_reservations(current, excluding=below)
                )
                if below is not None and self._nodes[below].budget is not None:
                    left = min(left, self._nodes[below].budget or 0)
                best = left if best is None else min(best, left)
            below = current
            current = node.parent
        return best

    def exhausted(self, session_id: str) -> str | None:
        """Why ``session_id`` may not make another model call, or None."""
        current: str | None = session_id
        while current is not None:
            node = self._nodes[current]
            if node.budget is not None:
                spent = self.subtree_spent(current)
                if spent >= node.budget:
                    who = "its" if current == session_id else f"ancestor {current}'s"
                    return f"{who} token budget is spent ({spent} of {node.budget} tokens)"
            current = node.parent
        return None

    def can_reserve(self, parent: str, amount: int) -> str | None:
        """None if ``amount`` tokens can be reserved for a new child of ``parent``."""
        left = self.available(parent)
        if left is not None and amount > left:
            return f"a budget of {amount} tokens exceeds what is left ({max(0, left)} tokens)"
        return None
