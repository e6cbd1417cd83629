from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator.sessions.accounting import build_usage_forest, render_tree
from orchestrator.store.queries import SessionRecord, UsageSummary

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _s(sid: str, parent: str | None, secs: int) -> SessionRecord:
    return SessionRecord(
        id=sid,
        root_id="s-root00000000",
        cwd="/",
        model="m",
        backend="local",
        parent_id=parent,
        name=sid,
        created_at=T0,
        updated_at=T0 + timedelta(seconds=secs),
    )


def _u(sid: str, inp: int, out: int, cost: float | None, unknown: int) -> UsageSummary:
    return UsageSummary(
        session_id=sid,
        root_id="s-root00000000",
        calls=1 + unknown,
        input=inp,
        output=out,
        cache_read=0,
        cache_write=0,
        cost_usd=cost,
        unknown_cost_calls=unknown,
        latency_ms=1000.0,
        models=("m",),
    )


def test_own_and_total_roll_up_the_tree() -> None:
    sessions = [_s("r", None, 60), _s("a", "r", 10), _s("b", "r", 20), _s("g", "a", 5)]
    usage = [_u("r", 100, 10, 0.01, 0), _u("a", 50, 5, 0.02, 0), _u("g", 7, 3, None, 1)]
    (root,) = build_usage_forest(sessions, usage)
    assert [c.session.id for c in root.children] == ["a", "b"]
    assert root.own.input == 100 and root.total.input == 157
    assert root.total.output == 18 and root.total.calls == 1 + 1 + 2
    assert root.total.cost_usd == 0.03 and root.total.unknown_cost_calls == 1
    assert root.total.model_ms == 3000.0
    assert root.total.wall_s == 60.0  # the root's span, not a sum of overlapping children
    a = root.children[0]
    assert a.total.input == 57 and "unknown" in a.total.cost_text()
    assert root.children[1].total.calls == 0 and root.children[1].own.cost_text() == "$0.0000"
    lines = render_tree([root])
    assert len(lines) == 5
    assert lines[3].startswith("│  └─ g") and lines[4].startswith("└─ b")


def test_the_sandbox_column_names_a_pod_a_short_container_id_or_nothing() -> None:
    from dataclasses import replace

    from orchestrator.cli.agents import node_from_dict

    pod = "prime-agent-s-k8s-1a2b3c"
    container = "0123456789abcdef" * 4
    sessions = [
        replace(_s("k", None, 1), backend="kubernetes"),
        replace(_s("d", None, 2), backend="docker"),
        _s("l", None, 3),
    ]
    forest = build_usage_forest(sessions, [])
    forest[0].sandbox, forest[1].sandbox = pod, container
    # The daemon's answer (as_dict) back into nodes, as `prime-agent agents` reads it.
    nodes = [node_from_dict(node.as_dict()) for node in forest]
    assert [n.sandbox for n in nodes] == [pod, container, None]
    header, *rows = render_tree(nodes)
    assert header.split()[-1] == "sandbox"
    assert [row.split()[-1] for row in rows] == [pod, container[:12], "-"]
    assert [row.split()[3] for row in rows] == ["kubernetes", "docker", "local"]
    assert forest[2].as_dict()["sandbox"] is None
