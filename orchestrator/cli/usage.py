"""``prime-agent usage``: tokens and cost per session.

Through the daemon (started on first use) like ``agents``; with autostart off and no daemon,
read from the database directly. Same output either way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, Any

import typer

from orchestrator.api.protocol import USAGE_ROWS_LIMIT_MAX
from orchestrator.cli.common import guarded
from orchestrator.paths import Paths

__all__ = ["paged_rows", "totals_text", "usage"]

# What a usage row carries besides the store's UsageSummary (the daemon adds them).
_ROW_EXTRAS = ("status", "name")


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
        from orchestrator.cli.agents import fetch_forest, print_forest

        forest = guarded(lambda: fetch_forest(tree), debug=debug)
        print_forest(forest, as_json=as_json)
        return
    rows = guarded(lambda: _rows(session), debug=debug)
    if rows is None:
        typer.echo("no sessions yet")
        return
    _print_rows(rows, as_json)


def totals_text(totals: dict[str, Any]) -> str:
    """``270 tokens in 2 calls, unknown (2 calls)`` from a ``Totals.as_dict``."""
    from orchestrator.sessions.accounting import Totals

    names = Totals.__dataclass_fields__
    t = Totals(**{k: v for k, v in totals.items() if k in names})
    return f"{t.tokens} tokens in {t.calls} calls, {t.cost_text()}"


def _rows(selector: str | None) -> list[dict[str, Any]] | None:
    """Usage rows (UsageSummary fields plus status and name); None: no database yet."""
    from orchestrator.cli.connect import DaemonLink, ensure_daemon

    if ensure_daemon():

        async def ask() -> list[dict[str, Any]]:
            async with DaemonLink() as link:
                return await paged_rows(link.call, selector)

        return asyncio.run(ask())
    return asyncio.run(_read_rows(selector))


async def paged_rows(
    call: Callable[..., Awaitable[Any]], selector: str | None, page: int = USAGE_ROWS_LIMIT_MAX
) -> list[dict[str, Any]]:
    """Every usage row from the daemon, a page per request: a store with thousands of sessions
    has more rows than one answer line holds."""
    rows: list[dict[str, Any]] = []
    fields: dict[str, Any] = {"rows": True, "rows_limit": page}
    if selector:
        fields["session"] = selector
    while True:
        answer = await call("get_usage", rows_offset=len(rows), **fields)
        got = list(answer.get("rows") or [])
        rows += got
        if not got or len(rows) >= int(answer.get("rows_total") or 0):
            return rows


async def _read_rows(selector: str | None) -> list[dict[str, Any]] | None:
    from orchestrator.store.db import Store

    paths = Paths.from_env()
    if not paths.database_file.exists():
        return None
    store = await Store.open(paths.database_file, read_only=True)
    try:
        ids: list[str] | None = None
        if selector:
            found = await store.find_session(selector)
            if found is None:
                from orchestrator.errors import UserError

                raise UserError(f"no session matches {selector!r}")
            ids = [found.id]
        summaries = await store.usage_summary(ids)
        sessions = {s.id: s for s in await store.list_sessions()}
    finally:
        await store.close()
    rows = []
    for summary in summaries:
        known = sessions.get(summary.session_id)
        row = asdict(summary)
        row["status"] = known.status if known is not None else ""
        row["name"] = known.name if known is not None else None
        rows.append(row)
    return rows


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    from orchestrator.store.queries import UsageSummary, format_cost

    if as_json:
        for row in rows:
            plain = {k: v for k, v in row.items() if k not in _ROW_EXTRAS}
            typer.echo(json.dumps(plain, default=str))
        return
    header = f"{'session':<16} {'status':<10} {'calls':>5} {'input':>9} {'output':>8} "
    header += f"{'cache r/w':>13} {'cost':>22}  model / name"
    typer.echo(header)
    names = UsageSummary.__dataclass_fields__
    for row in rows:
        summary = UsageSummary(**{k: v for k, v in row.items() if k in names})
        models = ", ".join(row.get("models") or [])
        typer.echo(
            f"{summary.session_id:<16} {row.get('status') or ''!s:<10} {summary.calls:>5} "
            f"{summary.input:>9} {summary.output:>8} "
            f"{f'{summary.cache_read}/{summary.cache_write}':>13} "
            f"{format_cost(summary):>22}  "
            f"{models} / {str(row.get('name') or '')[:40]}"
            + (f" · {summary.imported_calls} imported calls" if summary.imported_calls else "")
        )
