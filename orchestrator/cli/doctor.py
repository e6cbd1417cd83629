"""``prime-agent doctor [--fix]``: the control socket, the daemon's NATS server, the database's
integrity and orphaned sandboxes (docker containers, local gateways); ``--fix`` removes what
nothing owns (``orchestrator/daemon/doctor.py`` says what and why). One line per finding; exit
1 when a problem remains."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import EXIT_ERROR, guarded

if TYPE_CHECKING:
    from orchestrator.daemon.doctor import Finding

__all__ = ["doctor"]


def doctor(
    fix: Annotated[bool, typer.Option("--fix", help="Remove the orphans found.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    problems = guarded(lambda: _doctor(fix), debug=debug)
    if problems:
        raise SystemExit(EXIT_ERROR)


def _doctor(fix: bool) -> int:
    from orchestrator.cli.daemon import daemon_info
    from orchestrator.daemon import doctor as checks
    from orchestrator.paths import Paths

    paths = Paths.from_env()
    daemon = daemon_info()
    findings = [
        checks.check_socket(paths, daemon, fix=fix),
        checks.check_nats(paths, daemon),
        *asyncio.run(checks.check_database(paths, daemon)),
        *checks.check_local_sandboxes(paths, daemon, fix=fix),
        *_docker_findings(fix),
    ]
    for finding in findings:
        typer.echo(finding.line())
    return sum(1 for f in findings if f.problem and not f.fixed)


def _docker_findings(fix: bool) -> list[Finding]:
    from orchestrator.daemon.doctor import Finding
    from orchestrator.sandbox.docker import docker_usable, find_orphans, remove_containers

    usable, why = docker_usable()
    if not usable:
        return [Finding("docker", f"not used ({why})")]
    orphans = find_orphans()
    findings = [Finding("docker", f"{len(orphans)} orphaned container(s)", problem=bool(orphans))]
    for o in orphans:
        findings.append(
            Finding("docker", f"  {o.id[:12]} {o.name} session={o.session_id} status={o.status}")
        )
    if orphans and fix:
        removed = remove_containers([o.id for o in orphans])
        findings.append(Finding("docker", f"removed {removed}"))
        findings[0].fixed = True
    return findings
