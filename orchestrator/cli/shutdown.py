"""``prime-agent shutdown [--force]``: stop everything this user's prime-agent runs.

The daemon (if one answers) is asked to stop, which ends its sessions, sandboxes and servers;
then sandbox containers whose orchestrator is gone are removed. With ``--force`` running turns
are aborted instead of refused, and every container carrying our labels is removed, including
those of a print-mode run still in progress.
"""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import daemon as daemon_cli
from orchestrator.cli.common import guarded

__all__ = ["shutdown"]


def shutdown(
    force: Annotated[
        bool, typer.Option("--force", help="Abort running turns; remove every container of ours.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    daemon_cli.stop(force=force)
    from orchestrator.errors import PrimeAgentError
    from orchestrator.sandbox.docker import find_orphans, list_owned, remove_containers
    from orchestrator.sandbox.images import docker_client

    try:
        client = docker_client()
    except PrimeAgentError as exc:
        typer.echo(f"containers: none to check ({exc})")
        return
    targets = guarded(lambda: (list_owned if force else find_orphans)(client), debug=debug)
    removed = guarded(lambda: remove_containers([c.id for c in targets], client), debug=debug)
    typer.echo(f"containers: removed {removed}")
