"""Usage as a tree (docs/spec.md §8): each session's own tokens, cost and time, and its subtree's,
and (``prime-agent agents``) the sandbox a loaded session runs in.

Built from the store's per-session roll-ups and the sessions' parent links, so it is the same
after a restart. Cost stays honest: a known sum plus a count of calls with unknown price.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from orchestrator.store.queries import SessionRecord, UsageSummary

__all__ = ["Totals", "UsageNode", "build_usage_forest", "render_tree"]

COST_DECIMALS = 4
NAME_WIDTH = 28
# Docker's short container id, as ``docker ps`` shows it.
DOCKER_SHORT_ID_CHARS: Final = 12
NO_SANDBOX: Final = "-"


@dataclass
class Totals:
    calls: int = 0
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float = 0.0
    unknown_cost_calls: int = 0
    model_ms: float = 0.0
    wall_s: float = 0.0

    def add(self, other: Totals) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    def cost_text(self) -> str:
        known = f"${self.cost_usd:.{COST_DECIMALS}f}"
        if self.unknown_cost_calls and self.calls == self.unknown_cost_calls:
            return f"unknown ({self.unknown_cost_calls} calls)"
        if self.unknown_cost_calls:
            return f"{known} + unknown ({self.unknown_cost_calls} calls)"
        return known

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__} | {
            "tokens": self.tokens
        }


@dataclass
class UsageNode:
    session: SessionRecord
    own: Totals
    total: Totals
    children: list[UsageNode] = field(default_factory=list)
    # The sandbox up now (a pod's name, a container's id, a gateway's pid): only the daemon
    # knows it, for the sessions it has loaded.
    sandbox: str | None = None

    def as_dict(self) -> dict[str, object]:
        s = self.session
        return {
            "session_id": s.id,
            "name": s.name,
            "rlm_child_id": s.rlm_child_id,
            "status": s.status,
            "depth": s.depth,
            "backend": s.backend,
            "model": s.model,
            "own": self.own.as_dict(),
            "total": self.total.as_dict(),
            "children": [c.as_dict() for c in self.children],
            "sandbox": self.sandbox,
        }


def _own(record: SessionRecord, usage: UsageSummary | None) -> Totals:
    wall = max(0.0, (record.updated_at - record.created_at).total_seconds())
    if usage is None:
        return Totals(wall_s=wall)
    return Totals(
        calls=usage.calls,
        input=usage.input,
        output=usage.output,
        cache_read=usage.cache_read,
        cache_write=usage.cache_write,
        cost_usd=usage.cost_usd or 0.0,
        unknown_cost_calls=usage.unknown_cost_calls,
        model_ms=usage.latency_ms,
        wall_s=wall,
    )


def build_usage_forest(
    sessions: Iterable[SessionRecord], usage: Iterable[UsageSummary]
) -> list[UsageNode]:
    """Root nodes (sessions without a known parent), children in creation order."""
    by_id = {u.session_id: u for u in usage}
    nodes = {s.id: UsageNode(s, _own(s, by_id.get(s.id)), Totals()) for s in sessions}
    roots: list[UsageNode] = []
    for node in sorted(nodes.values(), key=lambda n: n.session.created_at):
        parent = nodes.get(node.session.parent_id or "")
        (parent.children if parent is not None else roots).append(node)

    def roll(node: UsageNode) -> Totals:
        total = Totals()
        total.add(node.own)
        for child in node.children:
            total.add(roll(child))
        # Wall time of a tree is its root's span, not the sum of overlapping children.
        total.wall_s = node.own.wall_s
        node.total = total
        return total

    for root in roots:
        roll(root)
    return roots


def _sandbox_text(node: UsageNode) -> str:
    """The sandbox column: a pod's name, a container's short id, a gateway's pid."""
    name = node.sandbox
    if not name:
        return NO_SANDBOX
    return name[:DOCKER_SHORT_ID_CHARS] if node.session.backend == "docker" else name


def render_tree(roots: list[UsageNode]) -> list[str]:
    header = (
        f"{'session':<{NAME_WIDTH}} {'id':<14} {'status':<10} {'backend':<8} "
        f"{'own tok':>9} {'total tok':>10} {'own cost':>12} {'total cost':>24} {'model s':>8} "
        "sandbox"
    )
    lines = [header]

    def walk(node: UsageNode, prefix: str, last: bool, top: bool) -> None:
        s = node.session
        branch = "" if top else ("└─ " if last else "├─ ")
        label = f"{s.name or s.id}"[: NAME_WIDTH - len(prefix)]
        ident = s.rlm_child_id or s.id
        lines.append(
            f"{(prefix + branch + label):<{NAME_WIDTH}} {ident:<14} "
            f"{s.status:<10} {s.backend:<8} {node.own.tokens:>9} {node.total.tokens:>10} "
            f"{node.own.cost_text():>12} {node.total.cost_text():>24} "
            f"{node.total.model_ms / 1000:>8.1f} {_sandbox_text(node)}"
        )
        child_prefix = prefix + ("" if top else ("   " if last else "│  "))
        for i, child in enumerate(node.children):
            walk(child, child_prefix, i == len(node.children) - 1, False)

    for root in roots:
        walk(root, "", True, True)
    return lines
