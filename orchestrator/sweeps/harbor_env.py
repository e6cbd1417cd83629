"""A Harbor task's environment as a sandbox image, and its trial's directories.

The image (``prepare_environment``), built once per environment and reused while it is
unchanged:

1. the task's own ``environment/Dockerfile``, built as it is — offline, so only where every
   image it starts ``FROM`` is already local (a registry base that is not here makes the task's
   cells unable to run, said in one line: ``EnvironmentUnavailable``); or the prebuilt
   ``[environment] docker_image`` when that is local;
2. our runtime on top (``RUNTIME_LAYER``): the session image's ``/opt/prime-agent`` (the
   gateway, ipykernel, the in-kernel runtime, pytest), the mount points, ``PATH``. The runtime's
   venv needs the base's ``/usr/bin/python3`` to be a Python 3.11, as the session image's is
   (Debian bookworm); a base without one fails the build's check with that said.

The tag is ``prime-agent/harbor-<task>:<hash>`` where the hash covers the environment's files,
the prebuilt image's id and the session image's id, so a changed Dockerfile or a rebuilt
runtime makes a new image and an unchanged one is reused as it is.

A trial's directories (``TrialDirs``), under the cell's own directory: ``workdir`` is the
session's workspace, filled with what the image has in its ``WORKDIR`` and shown there too
(``/app`` for Terminal-Bench tasks), ``tests`` is shown read-only at ``/tests`` and is empty
until the verifier runs, ``logs`` is ``/logs`` (the verifier's reward lands in
``logs/verifier``).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import UserError
from orchestrator.sandbox.docker_user import SANDBOX_UID
from orchestrator.sandbox.images import SESSION_IMAGE, SOURCE_HASH_LABEL, docker_client
from orchestrator.sweeps.suites.harbor import TEST_SCRIPT, HarborSpec, directory_hash

__all__ = [
    "HARBOR_IMAGE_PREFIX",
    "LOGS_TARGET",
    "TESTS_TARGET",
    "VERIFIER_COMMAND",
    "Environment",
    "EnvironmentUnavailable",
    "TrialDirs",
    "base_images",
    "prepare_environment",
    "read_reward",
]

HARBOR_IMAGE_PREFIX: Final = "prime-agent/harbor-"
TESTS_TARGET: Final = "/tests"
LOGS_TARGET: Final = "/logs"
VERIFIER_COMMAND: Final = f"bash {TESTS_TARGET}/{TEST_SCRIPT}"
REWARD_TEXT: Final = "reward.txt"
REWARD_JSON: Final = "reward.json"
_TAG_HASH_CHARS: Final = 12
_TAG_NAME_MAX: Final = 80
_NO_RUNTIME_PYTHON: Final = "no Python 3.11 at /usr/bin/python3 for the sandbox runtime"
# Our runtime on top of the task's image; {env} is that image.
RUNTIME_LAYER: Final = """\
FROM {env}
USER root
COPY --from={session} /opt/prime-agent /opt/prime-agent
RUN /opt/prime-agent/bin/python -c "import ipykernel, kernel_gateway" \\
 || (echo "{no_python}" >&2; exit 1)
RUN mkdir -p /run/prime-agent {tests} {logs}/verifier {logs}/agent \\
 && chmod 1777 /run/prime-agent
ENV PATH=/opt/prime-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8 \\
    PYTHONDONTWRITEBYTECODE=1
"""
_FROM_RE: Final = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE)
_ARG_RE: Final = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", re.IGNORECASE)
_VAR_RE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class EnvironmentUnavailable(UserError):
    """A task's environment cannot be made here (its cells cannot run); one line why."""


@dataclass(frozen=True)
class Environment:
    image: str  # the tag the session's sandbox runs
    workdir: str  # the image's WORKDIR ("" or "/" when it has none)

    @property
    def shows_workdir(self) -> bool:
        return self.workdir not in ("", "/")


def base_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile starts ``FROM`` that must exist before it builds: not its own
    earlier stages, not ``scratch``; ``ARG`` defaults declared before a ``FROM`` filled in."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    bases: list[str] = []
    for line in dockerfile.splitlines():
        if (arg := _ARG_RE.match(line)) is not None and not stages and not bases:
            args[arg.group(1)] = arg.group(2) or ""
            continue
        found = _FROM_RE.match(line)
        if found is None:
            continue
        image = _VAR_RE.sub(lambda m: args.get(m.group(1) or m.group(2), ""), found.group(1))
        if image.lower() != "scratch" and image not in stages and image not in bases:
            bases.append(image)
        if found.group(2):
            stages.add(found.group(2))
    return bases


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    return (slug or "task")[:_TAG_NAME_MAX]


def _image_id(client: Any, tag: str) -> str | None:
    import docker.errors

    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.DockerException as exc:
        raise EnvironmentUnavailable(f"docker image lookup of {tag} failed: {exc}") from None


def _build(argv: list[str], what: str, timeout_s: float, stdin: str | None = None) -> None:
    try:
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        raise EnvironmentUnavailable("the docker CLI is not installed") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentUnavailable(f"{what} took longer than {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()
        if _NO_RUNTIME_PYTHON in output:
            raise EnvironmentUnavailable(f"{what}: {_NO_RUNTIME_PYTHON}")
        tail = " | ".join(output.splitlines()[-4:])
        raise EnvironmentUnavailable(f"{what} failed (exit {proc.returncode}): {tail}")


def prepare_environment(spec: HarborSpec) -> Environment:
    """The sandbox image for ``spec``'s task, built when missing (blocking: call it in a
    thread); ``EnvironmentUnavailable`` when it cannot be made here."""
    client = docker_client()
    session_id = _image_id(client, SESSION_IMAGE)
    if session_id is None:
        raise EnvironmentUnavailable(
            f"the session image {SESSION_IMAGE} is missing: run prime-agent images build session"
        )
    name = _slug(Path(spec.directory).name)
    if spec.docker_image is not None:
        env_image = spec.docker_image
        env_id = _image_id(client, env_image)
        if env_id is None:
            raise EnvironmentUnavailable(
                f"its image {env_image} is not here (no registry is used): load or build it first"
            )
        key = f"image:{env_id}"
    else:
        dockerfile = (spec.environment / "Dockerfile").read_text(encoding="utf-8")
        for base in base_images(dockerfile):
            if _image_id(client, base) is None:
                raise EnvironmentUnavailable(
                    f"its base image {base} is not here (no registry is used): "
                    "docker load or build it first"
                )
        key = f"build:{directory_hash(spec.environment)}"
        env_image = ""
    digest = hashlib.sha256(f"{key}\0{session_id}".encode()).hexdigest()[:_TAG_HASH_CHARS]
    tag = f"{HARBOR_IMAGE_PREFIX}{name}:{digest}"
    if _image_id(client, tag) is None:
        if not env_image:
            env_image = f"{HARBOR_IMAGE_PREFIX}{name}-env:{digest}"
            _build(
                ["docker", "build", "-q", "--force-rm", "-t", env_image, str(spec.environment)],
                f"building {name}'s environment",
                spec.build_timeout_s,
            )
        layer = RUNTIME_LAYER.format(
            env=env_image,
            session=SESSION_IMAGE,
            no_python=_NO_RUNTIME_PYTHON,
            tests=TESTS_TARGET,
            logs=LOGS_TARGET,
        )
        label = f"{SOURCE_HASH_LABEL}={digest}"
        with tempfile.TemporaryDirectory(prefix="prime-agent-harbor-") as context:
            argv = ["docker", "build", "-q", "--force-rm", "-t", tag, "--label", label]
            _build(
                [*argv, "-f", "-", context],
                f"adding the sandbox runtime to {name}'s environment",
                spec.build_timeout_s,
                stdin=layer,
            )
    config = client.images.get(tag).attrs.get("Config") or {}
    return Environment(image=tag, workdir=str(config.get("WorkingDir") or ""))


@dataclass(frozen=True)
class TrialDirs:
    """A Harbor trial's directories under its cell's directory ``root``."""

    root: Path

    @property
    def workdir(self) -> Path:
        return self.root / "workdir"

    @property
    def tests(self) -> Path:
        return self.root / "tests"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def create(self, environment: Environment) -> None:
        """Made afresh: the image's WORKDIR copied into ``workdir``, ``tests`` empty, the log
        directories ready; handed to the sandbox's user when we are root (it never runs as
        root, docker_user.py), as these are ours, not the user's."""
        if self.root.exists():
            shutil.rmtree(self.root)
        for directory in (self.workdir, self.tests, self.logs / "verifier", self.logs / "agent"):
            directory.mkdir(parents=True)
        if environment.shows_workdir:
            _copy_out(environment.image, environment.workdir, self.workdir)
        if os.getuid() == 0:
            for directory in (self.root, self.workdir, self.logs):
                for path in [directory, *directory.rglob("*")]:
                    os.lchown(path, SANDBOX_UID, SANDBOX_UID)

    def install_tests(self, spec: HarborSpec) -> None:
        """The verifier's files, shown at /tests (read-only) once the agent is done."""
        shutil.copytree(spec.tests, self.tests, dirs_exist_ok=True)

    def mounts(self, environment: Environment) -> list[dict[str, Any]]:
        """``create_session``'s extra mounts (sandbox/mounts.py)."""
        found: list[dict[str, Any]] = []
        if environment.shows_workdir:
            found.append({"source": str(self.workdir), "target": environment.workdir})
        found.append({"source": str(self.tests), "target": TESTS_TARGET, "read_only": True})
        found.append({"source": str(self.logs), "target": LOGS_TARGET})
        return found


def _copy_out(image: str, workdir: str, dest: Path) -> None:
    """What ``image`` holds at ``workdir``, into ``dest`` (ownership and modes made safe)."""
    client = docker_client()
    container = client.containers.create(image, command=["true"], network_disabled=True)
    try:
        stream, _ = container.get_archive(workdir)
        data = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=data) as archive:
        members = []
        for member in archive.getmembers():
            parts = member.name.split("/", 1)  # the archive's top entry is the directory itself
            if len(parts) < 2 or not parts[1]:
                continue
            member.name = parts[1]
            members.append(member)
        archive.extractall(dest, members=members, filter="data")


def read_reward(logs: Path) -> float | None:
    """The verifier's reward: ``verifier/reward.txt`` (a number) or ``verifier/reward.json``
    (``{"reward": x}``, or its only number); None when it wrote neither or nothing readable."""
    text_file = logs / "verifier" / REWARD_TEXT
    json_file = logs / "verifier" / REWARD_JSON
    value: Any = None
    try:
        if text_file.is_file():
            value = float(text_file.read_text(encoding="utf-8").strip())
        elif json_file.is_file():
            data = json.loads(json_file.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                numbers = [v for v in data.values() if isinstance(v, int | float)]
                value = data.get("reward", numbers[0] if len(numbers) == 1 else None)
            else:
                value = data
    except (OSError, ValueError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
