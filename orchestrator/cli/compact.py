"""``prime-agent compact ID|NAME [INSTRUCTIONS]``: ``/compact`` from the shell, through the daemon.

An idle (or unloaded) session is compacted before the command returns and the line says how
many tokens it went from and to; a session in a turn compacts at its next step boundary and
the line says it is scheduled. A compaction that fails (the summary call failed, or the
summary did not make the context smaller) exits 1 with the reason; one with nothing to
summarise exits 0 and says so. docs/compaction.md.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from orchestrator.cli.common import EXIT_ERROR, EXIT_OK, guarded
from orchestrator.cli.connect import DaemonLink, require_daemon

__all__ = ["compact", "describe"]

NOTHING_TO_DO = "nothing_to_compact"


def compact(
    session: Annotated[str, typer.Argument(help="Session id, unique id prefix or name.")],
    instructions: Annotated[
        str | None, typer.Argument(help="What the summary must keep or focus on.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    def run() -> dict[str, Any]:
        require_daemon("compact")
        return asyncio.run(_compact(session, instructions))

    result = guarded(run, debug=debug)
    line, code = describe(result)
    typer.echo(line)
    raise SystemExit(code)


async def _compact(selector: str, instructions: str | None) -> dict[str, Any]:
    async with DaemonLink() as link:
        fields: dict[str, Any] = {"session": selector}
        if instructions:
            fields["instructions"] = instructions
        result: dict[str, Any] = await link.mutate("compact", **fields)
        return result


def describe(result: dict[str, Any]) -> tuple[str, int]:
    """The line printed for a ``compact`` answer, and the exit status."""
    session = result.get("session", "?")
    if result.get("compacted"):
        return (
            f"compacted {session}: {result.get('tokens_before')} -> "
            f"{result.get('tokens_after')} tokens",
            EXIT_OK,
        )
    if result.get("scheduled"):
        return f"scheduled for {session}: {result.get('message')}", EXIT_OK
    reason = result.get("reason")
    line = f"not compacted ({reason}): {result.get('message')}"
    return line, EXIT_OK if reason == NOTHING_TO_DO else EXIT_ERROR
