from __future__ import annotations

from orchestrator.sessions.budget import BudgetTree


def test_spending_counts_against_every_ancestor() -> None:
    t = BudgetTree()
    t.add("root", None, 1000)
    t.add("child", "root", None)
    t.spend("child", 600)
    assert t.subtree_spent("root") == 600
    assert t.exhausted("child") is None
    t.spend("child", 400)
    assert t.exhausted("child") is not None and "ancestor" in (t.exhausted("child") or "")
    assert t.exhausted("root") is not None


def test_reservations_cannot_be_promised_twice() -> None:
    t = BudgetTree()
    t.add("root", None, 1000)
    assert t.can_reserve("root", 700) is None
    t.add("a", "root", 700)
    assert t.can_reserve("root", 400) is not None  # only 300 left
    assert t.can_reserve("root", 300) is None
    t.add("b", "root", 300)
    assert t.available("root") == 0
    # The child spends inside its reservation: the parent's free budget does not shrink twice.
    t.spend("a", 200)
    assert t.available("root") == 0
    assert t.available("a") == 500


def test_child_budget_bounds_the_child_even_under_an_unlimited_parent() -> None:
    t = BudgetTree()
    t.add("root", None, None)
    t.add("c", "root", 50)
    assert t.available("root") is None
    t.spend("c", 50)
    assert t.exhausted("c") is not None
    assert t.exhausted("root") is None


def test_unbudgeted_tree_is_unlimited() -> None:
    t = BudgetTree()
    t.add("r", None, None)
    t.add("c", "r", None)
    t.spend("c", 10**9)
    assert t.exhausted("c") is None and t.available("c") is None
