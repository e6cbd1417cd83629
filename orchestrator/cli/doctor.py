"""``prime-agent doctor [--fix]``: report (and remove) orphaned sandbox containers."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.common import EXIT_ERROR, guarded

__all__ = ["doctor"]


def doctor(
    fix: Annotated[bool, typer.Option("--fix", help="Remove the orphans found.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    from orchestrator.sandbox.docker import docker_usable, find_orphans, remove_containers

    usable, why = docker_usable()
    if not usable:
        typer.echo(f"docker: not used ({why})")
        return
    orphans = guarded(find_orphans, debug=debug)
    typer.echo(f"docker: {len(orphans)} orphaned container(s)")
    for o in orphans:
        typer.echo(f"  {o.id[:12]} {o.name} session={o.session_id} status={o.status}")
    if orphans and fix:
        removed = guarded(lambda: remove_containers([o.id for o in orphans]), debug=debug)
        typer.echo(f"docker: removed {removed}")
    elif orphans:
        raise SystemExit(EXIT_ERROR)
