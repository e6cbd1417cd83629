"""``prime-agent tree|branch|fork|clone``: a session's event tree (docs/tree.md).

- ``tree ID`` prints every event of the session, one per line (seq, type, first line of its
  text), a branch point's children drawn with ``├─``/``└─``; ``*`` marks the active path and
  ``← leaf`` its end. ``--json``: the nodes as one JSON object.
- ``branch ID EVENT [--summary TEXT]`` moves the leaf to EVENT (a seq number from ``tree``, or
  an event id); the next turn continues from there. ``--summary`` records what the abandoned
  path did at the branch point, and the model sees it.
- ``fork ID [EVENT]`` makes a new session holding the path up to EVENT (default: the leaf);
  ``clone ID`` one holding the active path. Both print the new id; it resumes with
  ``prime-agent --resume NEW -p "..."``.

When a daemon runs it owns the database, so these go through it (``ensure_daemon(autostart=
False)``: never started for them); otherwise they open the database themselves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from orchestrator.cli.common import guarded
from orchestrator.errors import UserError
from orchestrator.paths import Paths

if TYPE_CHECKING:
    from orchestrator.cli.connect import DaemonLink
    from orchestrator.store.db import Store
    from orchestrator.store.tree import TreePage

__all__ = ["branch", "clone", "fork", "through_daemon_or_store", "tree"]

T = TypeVar("T")

SessionArg = Annotated[str, typer.Argument(help="Session id (or unique prefix or name).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]


async def through_daemon_or_store(
    via_daemon: Callable[[DaemonLink], Awaitable[T]],
    direct: Callable[[Store], Awaitable[T]],
    *,
    write: bool,
    create: bool = False,
) -> T:
    """Run ``via_daemon`` when a daemon runs (it owns the database), else ``direct`` on the
    database opened here (read-only unless ``write``; created only when ``create``)."""
    from orchestrator.cli.connect import DaemonLink, ensure_daemon

    if await asyncio.to_thread(ensure_daemon, autostart=False):
        async with DaemonLink() as link:
            return await via_daemon(link)
    from orchestrator.store.db import Store

    path = Paths.from_env().database_file
    if not create and not path.exists():
        raise UserError("no sessions yet")
    store = await Store.open(path, read_only=not write)
    try:
        return await direct(store)
    finally:
        await store.close()


def _note(text: str) -> None:
    """A line for a person at a terminal; scripts read stdout only."""
    if sys.stderr.isatty():
        print(f"prime-agent: {text}", file=sys.stderr)


# -- tree ------------------------------------------------------------------------------------


def tree(
    session: SessionArg,
    as_json: Annotated[bool, typer.Option("--json", help="The nodes as one JSON object.")] = False,
    debug: DebugOpt = False,
) -> None:
    page = guarded(lambda: asyncio.run(_tree(session)), debug=debug)
    if as_json:
        typer.echo(json.dumps(page.as_dict(), ensure_ascii=False))
        return
    from orchestrator.store.tree import render_tree

    leaf = f"leaf {page.leaf_seq}" if page.leaf_seq is not None else "no leaf"
    name = page.name or "(unnamed)"
    typer.echo(f"{page.session_id}  {name}  {page.total} events, {leaf}")
    for line in render_tree(page):
        typer.echo(line)


async def _tree(selector: str) -> TreePage:
    from orchestrator.store.tree import TreePage, tree_page

    async def via_daemon(link: DaemonLink) -> TreePage:
        pages: list[TreePage] = []
        target, after = selector, 0
        while True:
            page = TreePage.from_dict(await link.call("tree", session=target, after_seq=after))
            pages.append(page)
            if page.next_after is None:
                break
            target, after = page.session_id, page.next_after
        return replace(pages[-1], nodes=[n for p in pages for n in p.nodes])

    async def direct(store: Store) -> TreePage:
        return await tree_page(store, selector)

    return await through_daemon_or_store(via_daemon, direct, write=False)


# -- branch ----------------------------------------------------------------------------------


def branch(
    session: SessionArg,
    event: Annotated[str, typer.Argument(help="Event seq (from prime-agent tree) or id.")],
    summary: Annotated[
        str | None,
        typer.Option("--summary", help="What the abandoned path did (recorded at EVENT)."),
    ] = None,
    debug: DebugOpt = False,
) -> None:
    result = guarded(lambda: asyncio.run(_branch(session, event, summary)), debug=debug)
    where = f"event {result['leaf_seq']}"
    if result.get("summary_seq") is not None:
        where += f" (the summary, recorded on event {result['target_seq']})"
    typer.echo(f"{result['session_id']}: the leaf is now {where}")
    if result.get("unloaded"):
        _note("it was loaded in the daemon: unloaded, it reloads from the new leaf when prompted")


async def _branch(selector: str, event: str, summary: str | None) -> dict[str, Any]:
    from orchestrator.store import tree as store_tree

    async def via_daemon(link: DaemonLink) -> dict[str, Any]:
        fields: dict[str, Any] = {"session": selector, "event": event}
        if summary is not None:
            fields["summary"] = summary
        answer: dict[str, Any] = await link.mutate("branch", **fields)
        return answer

    async def direct(store: Store) -> dict[str, Any]:
        result = await store_tree.branch(store, selector, event, summary=summary)
        return result.as_dict()

    return await through_daemon_or_store(via_daemon, direct, write=True)


# -- fork and clone --------------------------------------------------------------------------


def fork(
    session: SessionArg,
    event: Annotated[
        str | None, typer.Argument(help="Copy up to this event (seq or id; default: the leaf).")
    ] = None,
    debug: DebugOpt = False,
) -> None:
    made = guarded(lambda: asyncio.run(_copy(session, event, clone=False)), debug=debug)
    typer.echo(made["session"])
    _note(f"forked {session} into {made['session']} ({made.get('name') or 'unnamed'})")


def clone(session: SessionArg, debug: DebugOpt = False) -> None:
    made = guarded(lambda: asyncio.run(_copy(session, None, clone=True)), debug=debug)
    typer.echo(made["session"])
    _note(f"cloned {session} into {made['session']} ({made.get('name') or 'unnamed'})")


async def _copy(selector: str, event: str | None, *, clone: bool) -> dict[str, Any]:
    from orchestrator.store import tree as store_tree

    async def via_daemon(link: DaemonLink) -> dict[str, Any]:
        fields: dict[str, Any] = {"session": selector}
        if event is not None:
            fields["event"] = event
        answer: dict[str, Any] = await link.mutate("clone" if clone else "fork", **fields)
        return answer

    async def direct(store: Store) -> dict[str, Any]:
        if clone:
            made = await store_tree.clone(store, selector)
        else:
            made = await store_tree.fork(store, selector, event)
        return {"session": made.id, "name": made.name, "forked_at": made.forked_at}

    return await through_daemon_or_store(via_daemon, direct, write=True)
