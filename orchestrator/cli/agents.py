"""``prime-agent agents``: every session tree with status, depth, backend, usage and the
sandbox a loaded session runs in (a pod's name, a container's short id, a gateway's pid).

Through the daemon (started on first use, ``orchestrator/cli/connect.py``), which owns the
database while it runs and knows the live state of loaded sessions; with autostart off and no
daemon, read from the database directly.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import guarded
from orchestrator.paths import Paths

if TYPE_CHECKING:  # the store and its DuckDB import cost a second: only when used
    from orchestrator.sessions.accounting import Totals, UsageNode

__all__ = ["agents", "fetch_forest", "load_forest", "node_from_dict"]

DEFAULT_ROOTS = 20


async def load_forest(root_selector: str | None = None) -> list[UsageNode]:
    """The usage forest read from the database (no daemon may hold it)."""
    from orchestrator.errors import UserError
    from orchestrator.sessions.accounting import build_usage_forest
    from orchestrator.store.db import Store

    paths = Paths.from_env()
    if not paths.database_file.exists():
        return []
    store = await Store.open(paths.database_file, read_only=True)
    try:
        sessions = await store.list_sessions()
        usage = await store.usage_summary()
        wanted: str | None = None
        if root_selector:
            found = await store.find_session(root_selector)
            if found is None:
                raise UserError(f"no session matches {root_selector!r}")
            wanted = found.id
    finally:
        await store.close()
    forest = build_usage_forest(sessions, usage)
    if wanted is None:
        return forest

    def find(nodes: list[UsageNode]) -> UsageNode | None:
        for node in nodes:
            if node.session.id == wanted:
                return node
            hit = find(node.children)
            if hit is not None:
                return hit
        return None

    hit = find(forest)
    return [hit] if hit is not None else []


def fetch_forest(root_selector: str | None = None, limit: int = 0) -> list[dict[str, Any]]:
    """Session trees as ``UsageNode.as_dict`` dicts: from the daemon (started if allowed), else
    from the database. ``limit`` > 0 keeps the newest root trees."""
    from orchestrator.cli.connect import DaemonLink, ensure_daemon

    if ensure_daemon():

        async def ask() -> list[dict[str, Any]]:
            async with DaemonLink() as link:
                fields: dict[str, Any] = {"tree": True}
                if root_selector:
                    fields["session"] = root_selector
                elif limit > 0:
                    fields["limit"] = limit
                answer = await link.call("get_usage", **fields)
            return list(answer.get("usage") or [])

        return asyncio.run(ask())
    forest = asyncio.run(load_forest(root_selector))
    forest = forest[-limit:] if limit > 0 else forest
    return [node.as_dict() for node in forest]


def _totals(data: dict[str, Any]) -> Totals:
    from orchestrator.sessions.accounting import Totals

    names = Totals.__dataclass_fields__
    return Totals(**{k: v for k, v in data.items() if k in names})


def node_from_dict(data: dict[str, Any]) -> UsageNode:
    """A node as ``render_tree`` needs it, from its ``as_dict`` form (the daemon's answer)."""
    from orchestrator.sessions.accounting import UsageNode
    from orchestrator.store.queries import SessionRecord

    sid = str(data["session_id"])
    record = SessionRecord(
        id=sid,
        root_id=sid,
        cwd="",
        model=str(data.get("model") or ""),
        backend=str(data.get("backend") or ""),
        name=data.get("name"),
        depth=int(data.get("depth") or 0),
        status=data.get("status") or "inactive",
        rlm_child_id=data.get("rlm_child_id"),
    )
    return UsageNode(
        record,
        _totals(data.get("own") or {}),
        _totals(data.get("total") or {}),
        [node_from_dict(child) for child in data.get("children") or []],
        sandbox=data.get("sandbox") or None,
    )


def print_forest(forest: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(forest, default=str))
        return
    from orchestrator.sessions.accounting import render_tree

    for line in render_tree([node_from_dict(node) for node in forest]):
        typer.echo(line)


def agents(
    root: Annotated[str | None, typer.Argument(help="Show only this session's tree.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Most recent root sessions.")] = (
        DEFAULT_ROOTS
    ),
    as_json: Annotated[bool, typer.Option("--json", help="The tree as JSON.")] = False,
    debug: Annotated[bool, typer.Option("--debug")] = False,
) -> None:
    forest = guarded(lambda: fetch_forest(root, limit), debug=debug)
    if not forest and not as_json:
        typer.echo("no sessions yet")
        return
    print_forest(forest, as_json=as_json)
