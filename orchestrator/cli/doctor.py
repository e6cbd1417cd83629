"""``prime-agent doctor [--fix]``: which sandbox backends work here (docker, bwrap, local; what
``--backend auto`` picks; whether the cluster of ``[kubernetes]`` answers), the control
socket, the daemon's NATS server, the database's integrity and orphaned sandboxes (docker
containers, local gateways, pods of print-mode runs that are gone); ``--fix`` removes what
nothing owns
(``orchestrator/daemon/doctor.py`` says what and why). One line per finding; exit 1 when a
problem remains.

Docker containers are this state directory's instance's to remove (``orchestrator/instance.py``);
another instance's orphan (another setup of this user, its own ``XDG_DATA_HOME``) is listed but
kept for its own daemon to adopt, unless its state directory is gone (nobody can adopt it) or
``--all-instances`` is given."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import EXIT_ERROR, guarded

if TYPE_CHECKING:
    from orchestrator.daemon.doctor import Finding
    from orchestrator.paths import Paths
    from orchestrator.settings import Settings

__all__ = ["doctor"]


def doctor(
    fix: Annotated[bool, typer.Option("--fix", help="Remove the orphans found.")] = False,
    all_instances: Annotated[
        bool,
        typer.Option(
            "--all-instances",
            help="With --fix: also remove orphaned containers of this user's other setups.",
        ),
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
) -> None:
    problems = guarded(lambda: _doctor(fix, all_instances), debug=debug)
    if problems:
        raise SystemExit(EXIT_ERROR)


def _doctor(fix: bool, all_instances: bool) -> int:
    from orchestrator.cli.autostart import daemon_info
    from orchestrator.daemon import doctor as checks
    from orchestrator.paths import Paths
    from orchestrator.sandbox.k8s_status import kubernetes_usable

    paths = Paths.from_env()
    daemon = daemon_info()
    settings = _settings(paths)
    # Asked at most once (a cluster that does not answer costs its timeout each time).
    cluster_status = functools.cache(lambda: kubernetes_usable(settings.kubernetes))
    findings = [
        *_backend_findings(settings, cluster_status),
        checks.check_socket(paths, daemon, fix=fix),
        checks.check_nats(paths, daemon),
        *asyncio.run(checks.check_database(paths, daemon)),
        *checks.check_local_sandboxes(paths, daemon, fix=fix),
        *checks.check_bwrap_sandboxes(paths, daemon, fix=fix),
        *_docker_findings(fix, all_instances),
        *_kubernetes_findings(paths, settings, cluster_status, fix),
    ]
    for finding in findings:
        typer.echo(finding.line())
    return sum(1 for f in findings if f.problem and not f.fixed)


def _backend_findings(
    settings: Settings, cluster_status: Callable[[], tuple[bool, str]]
) -> list[Finding]:
    from orchestrator.daemon.doctor import check_backends
    from orchestrator.sandbox.bwrap_probe import bwrap_usable
    from orchestrator.sandbox.docker import docker_usable
    from orchestrator.sandbox.images import resolve_image

    image = resolve_image(settings.sandbox.image)
    return check_backends(
        lambda: docker_usable(image),
        bwrap_usable,
        image=image,
        kubernetes_status=cluster_status,
        namespace=settings.kubernetes.namespace,
    )


def _settings(paths: Paths) -> Settings:
    from orchestrator.errors import ConfigError
    from orchestrator.settings import Settings, load_settings

    try:
        return load_settings(paths.config_file)
    except ConfigError:  # the defaults then; the config's error shows where it is used
        return Settings()


def _kubernetes_findings(
    paths: Paths,
    settings: Settings,
    cluster_status: Callable[[], tuple[bool, str]],
    fix: bool,
) -> list[Finding]:
    """Pods of print-mode runs that are gone (``sandbox/k8s_orphans.py``), when the cluster of
    ``[kubernetes]`` answers (the backend findings say why when it does not)."""
    from orchestrator.daemon.doctor import Finding
    from orchestrator.instance import read_instance_id
    from orchestrator.sandbox.k8s_api import K8sApi, api_client
    from orchestrator.sandbox.k8s_orphans import run_pods
    from orchestrator.sandbox.pod_sync import outputs_path, remove_outputs_home

    cluster = settings.kubernetes
    instance = read_instance_id(paths.data_dir)
    if instance is None or not cluster_status()[0]:
        return []
    api = K8sApi(api_client(cluster), cluster.namespace)
    pods = run_pods(api, instance)
    orphans = [pod for pod in pods if pod.orphaned]
    findings = [
        Finding("kubernetes", f"{len(orphans)} orphaned pod(s)", problem=bool(orphans)),
        *(
            Finding("kubernetes", f"  {p.name} session={p.session_id} (run pid {p.pid} is gone)")
            for p in orphans
        ),
    ]
    if orphans and fix:
        for pod in orphans:
            api.delete(pod.name)
            remove_outputs_home(outputs_path(pod.name))
        findings.append(Finding("kubernetes", f"removed {len(orphans)}"))
        findings[0].fixed = True
    elsewhere = [pod for pod in pods if not pod.here]
    if elsewhere:
        findings.append(
            Finding(
                "kubernetes",
                f"{len(elsewhere)} pod(s) of print-mode runs on other hosts, kept (doctor on "
                "their host judges them): " + ", ".join(pod.name for pod in elsewhere),
            )
        )
    return findings


def _docker_findings(fix: bool, all_instances: bool) -> list[Finding]:
    from orchestrator.daemon.doctor import Finding
    from orchestrator.instance import read_instance_id
    from orchestrator.paths import Paths
    from orchestrator.sandbox.docker import (
        abandoned,
        docker_usable,
        find_orphans,
        reapable,
        remove_containers,
    )

    usable, why = docker_usable()
    if not usable:
        return [Finding("docker", f"not used ({why})")]
    # Read, never created here: a state dir without one never started a container.
    instance = read_instance_id(Paths.from_env().data_dir) or ""
    mine, theirs = reapable(find_orphans(), instance, all_instances=all_instances)
    findings = [Finding("docker", f"{len(mine)} orphaned container(s)", problem=bool(mine))]
    for o in mine:
        gone = " (its state dir is gone)" if abandoned(o) else ""
        findings.append(
            Finding(
                "docker",
                f"  {o.id[:12]} {o.name} session={o.session_id} status={o.status}{gone}",
            )
        )
    if mine and fix:
        removed = remove_containers([o.id for o in mine])
        findings.append(Finding("docker", f"removed {removed}"))
        findings[0].fixed = True
    if theirs:
        findings.append(
            Finding(
                "docker",
                f"{len(theirs)} orphaned container(s) of other prime-agent setups, kept for "
                "their own daemon (--fix --all-instances removes them):",
            )
        )
        for o in theirs:
            where = o.state_dir or "unknown state dir"
            findings.append(
                Finding("docker", f"  {o.id[:12]} {o.name} session={o.session_id} ({where})")
            )
    return findings
