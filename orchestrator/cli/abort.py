"""``prime-agent abort ID|NAME``: stop a session's running turn and its subagents' turns.

Through the daemon (it starts it when autostart is on, like ``send``): the ``abort`` command
cascades, children first (``Orchestrator.abort_tree``). The session stays loaded and idle and
takes the next prompt; its descendants whose turn was aborted are ``aborted``. Prints
``aborted N turn(s): ID ...`` or ``nothing to abort (session ID is STATUS)``; exit 0 either way.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from orchestrator.cli.common import guarded
from orchestrator.cli.connect import DaemonLink, require_daemon

__all__ = ["abort", "abort_text"]


def abort(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    def run() -> dict[str, Any]:
        require_daemon("abort")
        return asyncio.run(_abort(session))

    typer.echo(abort_text(guarded(run, debug=debug)))


async def _abort(selector: str) -> dict[str, Any]:
    async with DaemonLink() as link:
        result: dict[str, Any] = await link.mutate("abort", session=selector)
        return result


def abort_text(result: dict[str, Any]) -> str:
    aborted = [str(s) for s in result.get("sessions") or []]
    if not aborted:
        return f"nothing to abort (session {result.get('session')} is {result.get('status')})"
    return f"aborted {len(aborted)} turn(s): {' '.join(aborted)}"
