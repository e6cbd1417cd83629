"""``prime-agent agents``: every session tree with status, depth, backend and usage."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from orchestrator.cli.common import guarded
from orchestrator.paths import Paths
from orchestrator.sessions.accounting import UsageNode, render_tree

__all__ = ["agents", "load_forest"]

DEFAULT_ROOTS = 20


async def load_forest(root_selector: str | None = None) -> list[UsageNode]:
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


def agents(
    root: Annotated[str | None, typer.Argument(help="Show only this session's tree.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Most recent root sessions.")] = (
        DEFAULT_ROOTS
    ),
    as_json: Annotated[bool, typer.Option("--json", help="The tree as JSON.")] = False,
    debug: Annotated[bool, typer.Option("--debug")] = False,
) -> None:
    forest = guarded(lambda: asyncio.run(load_forest(root)), debug=debug)
    forest = forest[-limit:] if limit > 0 else forest
    if as_json:
        typer.echo(json.dumps([n.as_dict() for n in forest], default=str))
        return
    if not forest:
        typer.echo("no sessions yet")
        return
    for line in render_tree(forest):
        typer.echo(line)
