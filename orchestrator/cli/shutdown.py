"""``prime-agent shutdown [--force]``: stop everything this setup's prime-agent runs.

The daemon (if one answers) is asked to stop, which ends its sessions, sandboxes and servers;
then sandbox containers whose orchestrator is gone are removed. With ``--force`` running turns
are aborted instead of refused, and every container of this state directory's instance is
removed, including those of a print-mode run still in progress.

Only this instance's containers (``LABEL_INSTANCE``, ``orchestrator/instance.py``): another
setup of the same user (its own ``XDG_DATA_HOME`` and daemon) keeps its containers, even with
``--force``; an orphan of a state directory that is gone is removed (``docker_owned.reapable``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import daemon as daemon_cli
from orchestrator.cli.common import guarded

__all__ = ["shutdown"]


def shutdown(
    force: Annotated[
        bool,
        typer.Option("--force", help="Abort running turns; remove every container of this setup."),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    daemon_cli.stop(force=force)
    from orchestrator.errors import PrimeAgentError
    from orchestrator.instance import read_instance_id
    from orchestrator.paths import Paths
    from orchestrator.sandbox.docker import find_orphans, list_owned, reapable, remove_containers
    from orchestrator.sandbox.images import docker_client

    try:
        client = docker_client()
    except PrimeAgentError as exc:
        typer.echo(f"containers: none to check ({exc})")
        return
    # None: this state dir never started a container (the first one creates the id).
    instance = read_instance_id(Paths.from_env().data_dir)

    def targets() -> list[str]:
        removable, _theirs = reapable(find_orphans(client), instance or "")
        ids = [c.id for c in removable]
        if force and instance is not None:
            ids += [c.id for c in list_owned(client, instance=instance) if c.id not in ids]
        return ids

    found = guarded(targets, debug=debug)
    removed = guarded(lambda: remove_containers(found, client), debug=debug)
    typer.echo(f"containers: removed {removed}")
