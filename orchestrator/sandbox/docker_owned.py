"""The docker containers we own: their labels, listing them, and the orphans of dead owners.

Every container the docker backend starts carries ``LABEL_OWNER`` (the uid) and the labels
below; ``list_owned`` finds them, ``find_orphans`` picks those whose orchestrator process is
gone and whose daemon does not answer (R8), ``remove_containers`` / ``remove_orphans`` remove
them. Used by the backend (``docker.py``, ``docker_adopt.py``), ``prime-agent doctor`` and
``prime-agent shutdown`` (through ``orchestrator.sandbox.docker``, which re-exports them).
Nothing here imports the backend: it sits below every other docker module.

One uid may run several setups, each with its own state directory and daemon (CI next to the
user's own runs). ``LABEL_INSTANCE`` is the instance id of the state directory that started a
container (``orchestrator/instance.py``) and ``LABEL_STATE_DIR`` that directory: whatever
reaps, adopts or force-removes passes ``instance=`` and touches only its own. Another
instance's orphan is removed only when ``abandoned`` (its state directory is gone or holds
another id: no daemon can ever adopt it), or on an explicit ``--all-instances``
(``reapable``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import SandboxError, UserError
from orchestrator.instance import read_instance_id
from orchestrator.procs import pid_alive
from orchestrator.sandbox.images import SESSION_IMAGE, docker_client, image_exists

__all__ = [
    "DAEMON_PROBE_TIMEOUT_S",
    "LABEL_DAEMON",
    "LABEL_HOST_DIR",
    "LABEL_HOST_PID",
    "LABEL_INSTANCE",
    "LABEL_OWNER",
    "LABEL_ROOT",
    "LABEL_SESSION",
    "LABEL_SNAPSHOT_SLOT",
    "LABEL_STATE_DIR",
    "OwnedContainer",
    "abandoned",
    "daemon_answers",
    "docker_errors",
    "docker_usable",
    "find_orphans",
    "list_owned",
    "reapable",
    "remove_containers",
    "remove_orphans",
    "translate_error",
]

LABEL_OWNER = "prime-agent.owner"
LABEL_SESSION = "prime-agent.session"
LABEL_ROOT = "prime-agent.root"
LABEL_INSTANCE = "prime-agent.instance"  # the instance id of the state dir that started it
LABEL_STATE_DIR = "prime-agent.state-dir"  # that state (data) directory
LABEL_HOST_PID = "prime-agent.host-pid"  # the orchestrator process that started it
# The daemon's control socket (daemon-owned containers only): such a container is not an orphan
# while a daemon answers there, even though the process that started it is gone (adopted).
LABEL_DAEMON = "prime-agent.daemon"
LABEL_HOST_DIR = "prime-agent.host-dir"  # the host directory of its sockets (removed with it)
# The host directory of its namespace-snapshot pool slot (pooled containers only;
# orchestrator/sandbox/docker_slots.py): a slot no container names is swept.
LABEL_SNAPSHOT_SLOT = "prime-agent.snapshot-slot"

DAEMON_PROBE_TIMEOUT_S: Final = 1.0  # daemon_answers: how long a connect may take


@dataclass(frozen=True)
class OwnedContainer:
    id: str
    name: str
    status: str  # docker's: created, running, exited, ...
    session_id: str
    root_id: str
    instance: str
    host_pid: int
    daemon: str = ""  # LABEL_DAEMON: the socket of the daemon that owns it
    host_dir: str = ""  # LABEL_HOST_DIR
    snapshot_slot: str = ""  # LABEL_SNAPSHOT_SLOT
    state_dir: str = ""  # LABEL_STATE_DIR ("" on containers of versions before it)


def docker_usable(image: str = SESSION_IMAGE) -> tuple[bool, str]:
    """(True, "") when an engine answers and ``image`` exists; else (False, why)."""
    try:
        client = docker_client()
        if not image_exists(image, client):
            return False, f"the session image {image} is not built (prime-agent images build)"
    except (UserError, SandboxError) as exc:
        return False, str(exc)
    return True, ""


def daemon_answers(socket_path: str) -> bool:
    """A daemon listens on ``socket_path`` (a connect succeeds): it owns its containers (it
    adopted them, or will at its next start), so none of them is an orphan."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DAEMON_PROBE_TIMEOUT_S)
        try:
            sock.connect(socket_path)
        except OSError:
            return False
    return True


def docker_errors() -> Any:
    import docker.errors

    return docker.errors


def translate_error(exc: BaseException, what: str) -> SandboxError:
    text = str(exc).strip().splitlines()
    return SandboxError(f"docker: {what}: {text[0] if text else type(exc).__name__}")


def _owned_from(container: Any) -> OwnedContainer:
    labels = container.labels or {}
    try:
        host_pid = int(labels.get(LABEL_HOST_PID, "0"))
    except ValueError:
        host_pid = 0
    return OwnedContainer(
        id=container.id,
        name=container.name,
        status=container.status,
        session_id=labels.get(LABEL_SESSION, ""),
        root_id=labels.get(LABEL_ROOT, ""),
        instance=labels.get(LABEL_INSTANCE, ""),
        host_pid=host_pid,
        daemon=labels.get(LABEL_DAEMON, ""),
        host_dir=labels.get(LABEL_HOST_DIR, ""),
        snapshot_slot=labels.get(LABEL_SNAPSHOT_SLOT, ""),
        state_dir=labels.get(LABEL_STATE_DIR, ""),
    )


def list_owned(
    client: Any | None = None, *, owner: int | None = None, instance: str | None = None
) -> list[OwnedContainer]:
    """Every container (running or not) with our labels, for ``owner`` (default: this uid)
    and, when given, ``instance`` (default: every instance)."""
    client = client or docker_client()
    owner = os.getuid() if owner is None else owner
    wanted = [f"{LABEL_OWNER}={owner}"]
    if instance is not None:
        wanted.append(f"{LABEL_INSTANCE}={instance}")
    try:
        # The SDK inspects each listed container: one removed in between (another sandbox
        # stopping) is gone, not an error of the listing.
        found = client.containers.list(all=True, filters={"label": wanted}, ignore_removed=True)
    except docker_errors().DockerException as exc:
        raise translate_error(exc, "listing containers") from exc
    return [_owned_from(c) for c in found]


def find_orphans(
    client: Any | None = None,
    *,
    live_sessions: set[str] | None = None,
    instance: str | None = None,
) -> list[OwnedContainer]:
    """Our containers (of ``instance`` when given) that nobody owns any more: the orchestrator
    that started them is gone and no daemon answers on their ``LABEL_DAEMON`` socket (and,
    when ``live_sessions`` is given, their session is not one of them: adoptable)."""
    orphans = []
    for owned in list_owned(client, instance=instance):
        if pid_alive(owned.host_pid):
            continue
        if owned.daemon and daemon_answers(owned.daemon):  # a daemon adopted (or will) it
            continue
        if live_sessions is not None and owned.session_id in live_sessions:
            continue
        orphans.append(owned)
    return orphans


def remove_containers(ids: list[str], client: Any | None = None) -> int:
    """Force-remove containers by id; returns how many were removed."""
    client = client or docker_client()
    errors = docker_errors()
    removed = 0
    for cid in ids:
        try:
            client.containers.get(cid).remove(force=True)
            removed += 1
        except errors.NotFound:
            continue
        except errors.DockerException as exc:
            raise translate_error(exc, f"removing {cid[:12]}") from exc
    return removed


def abandoned(owned: OwnedContainer) -> bool:
    """Its state directory is gone or holds another instance id: no daemon can ever adopt it
    (the rows that name it went with that directory). A container without the label (an older
    version's) is never called abandoned: nothing tells."""
    if not owned.state_dir or not os.path.isabs(owned.state_dir):
        return False
    return read_instance_id(Path(owned.state_dir)) != owned.instance


def reapable(
    orphans: list[OwnedContainer], instance: str, *, all_instances: bool = False
) -> tuple[list[OwnedContainer], list[OwnedContainer]]:
    """(removable, not ours): the orphans of ``instance`` and the abandoned ones of others are
    removable; another instance's orphan whose state directory is still there is left to its
    own daemon (it adopts it at its next start) unless ``all_instances``."""
    mine: list[OwnedContainer] = []
    theirs: list[OwnedContainer] = []
    for owned in orphans:
        removable = all_instances or owned.instance == instance or abandoned(owned)
        (mine if removable else theirs).append(owned)
    return mine, theirs


def remove_orphans(
    client: Any | None = None, *, instance: str | None = None
) -> list[OwnedContainer]:
    """Remove the orphans of ``instance`` (default: every instance's)."""
    client = client or docker_client()
    orphans = find_orphans(client, instance=instance)
    remove_containers([o.id for o in orphans], client)
    return orphans
