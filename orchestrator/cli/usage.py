"""``prime-agent usage``: tokens and cost per session, read from the store."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from orchestrator.cli.common import guarded
from orchestrator.paths import Paths

__all__ = ["usage"]


def usage(
    session: Annotated[
        str | None, typer.Argument(help="Session id (or unique prefix or name).")
    ] = None,
    tree: Annotated[
        str | None, typer.Option("--tree", help="A session and its subagents: own vs. total.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per session.")] = False,
    debug: Annotated[bool, typer.Option("--debug")] = False,
) -> None:
    if tree is not None:
        from orchestrator.cli.agents import load_forest
        from orchestrator.sessions.accounting import render_tree

        forest = guarded(lambda: asyncio.run(load_forest(tree)), debug=debug)
        if as_json:
            typer.echo(json.dumps([n.as_dict() for n in forest], default=str))
        else:
            for line in render_tree(forest):
                typer.echo(line)
        return
    guarded(lambda: asyncio.run(_usage(session, as_json)), debug=debug)


async def _usage(selector: str | None, as_json: bool) -> None:
    from orchestrator.store.db import Store
    from orchestrator.store.queries import format_cost

    paths = Paths.from_env()
    if not paths.database_file.exists():
        typer.echo("no sessions yet")
        return
    store = await Store.open(paths.database_file, read_only=True)
    try:
        ids: list[str] | None = None
        if selector:
            found = await store.find_session(selector)
            if found is None:
                from orchestrator.errors import UserError

                raise UserError(f"no session matches {selector!r}")
            ids = [found.id]
        rows = await store.usage_summary(ids)
        sessions = {s.id: s for s in await store.list_sessions()}
    finally:
        await store.close()
    if as_json:
        for row in rows:
            typer.echo(json.dumps(_as_dict(row), default=str))
        return
    header = f"{'session':<16} {'status':<10} {'calls':>5} {'input':>9} {'output':>8} "
    header += f"{'cache r/w':>13} {'cost':>22}  model / name"
    typer.echo(header)
    for row in rows:
        s = sessions.get(row.session_id)
        typer.echo(
            f"{row.session_id:<16} {(s.status if s else ''):<10} {row.calls:>5} "
            f"{row.input:>9} {row.output:>8} {f'{row.cache_read}/{row.cache_write}':>13} "
            f"{format_cost(row):>22}  "
            f"{', '.join(row.models)} / {(s.name if s and s.name else '')[:40]}"
        )


def _as_dict(row: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(row)
