"""The orchestrator's own image, ``prime-agent/orchestrator:latest``: what ``k8s/``'s Deployment
runs (the daemon, with its store on a volume). Built offline like the session images
(docs/images.md, "The orchestrator image"): wheels gathered on the host, ``docker build``
without pulls, FROM the same offline base.

- Wheels (``gather_orchestrator_wheels``): this project's wheel, then ``pip download
  --only-binary=:all:`` of everything it depends on, resolved for the base's Python
  (``IMAGE_PYTHON_VERSION``) with each direct dependency pinned to the version installed here
  (what the tests ran with; ``direct_pins``). The transitive rest is resolved for the image's
  Python (some current wheels need a newer 3.11 than Debian's). A stamp keyed by the pins skips
  the download next time; the project wheel is rebuilt every time.
- The image (``images/orchestrator/Dockerfile``) is a venv at ``/opt/prime-agent`` on a clean
  base, uid ``ORCHESTRATOR_UID``, every XDG directory where the Deployment mounts a volume, and
  ``python -m orchestrator.daemon`` as its command. Its label ``SOURCE_HASH_LABEL`` hashes the
  whole ``orchestrator`` package, the Dockerfile and the pins, so ``ensure_orchestrator_image``
  rebuilds it when any of them changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from orchestrator.sandbox.images import (
    BASE_BUILD_ARG,
    BASE_OFFLINE_TAG,
    BUILD_DIR,
    PROJECT_DIST,
    REPO_ROOT,
    SDIST_ONLY,
    SOURCE_HASH_LABEL,
    BuildResult,
    docker_build,
    docker_client,
    ensure_base_offline,
    hash_sources,
    image_exists,
    image_label,
    run_checked,
)

__all__ = [
    "ORCHESTRATOR_IMAGE",
    "ORCHESTRATOR_UID",
    "build_orchestrator_image",
    "direct_pins",
    "ensure_orchestrator_image",
    "gather_orchestrator_wheels",
    "orchestrator_source_hash",
]

ORCHESTRATOR_IMAGE: Final = "prime-agent/orchestrator:latest"
ORCHESTRATOR_UID: Final = 1000  # the Deployment's runAsUser
ORCHESTRATOR_KIND: Final = "orchestrator"
ORCHESTRATOR_WHEELS_DIR: Final = BUILD_DIR / "orchestrator-wheels"
# The build context's two folders (images/orchestrator/Dockerfile copies each in its own step).
PROJECT_SUBDIR: Final = "project"
DEPS_SUBDIR: Final = "deps"
REQUIREMENTS_FILE: Final = "requirements.txt"
# The Debian bookworm base's Python: the wheels must install there.
ORCHESTRATOR_PYTHON_VERSION: Final = "3.11.2"
_SOURCES: Final = ("orchestrator", "images/orchestrator/Dockerfile", "pyproject.toml")
_REQUIREMENT_NAME: Final = re.compile(r"^[A-Za-z0-9._-]+")
_PIP: Final = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")


def direct_pins() -> list[str]:
    """``name==version`` of each of this project's (non-optional) dependencies, as installed
    here."""
    pins: list[str] = []
    for requirement in importlib.metadata.requires(PROJECT_DIST) or []:
        if "extra ==" in requirement:
            continue
        match = _REQUIREMENT_NAME.match(requirement)
        if match is None:
            continue
        name = match.group(0)
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return sorted(pins)


def orchestrator_source_hash() -> str:
    """Hash of what the image contains: the package's sources, its Dockerfile, the pins."""
    return hash_sources("\n".join(direct_pins()), _SOURCES)


def gather_orchestrator_wheels(
    wheels_dir: Path = ORCHESTRATOR_WHEELS_DIR, *, progress: Callable[[str], None] | None = None
) -> Path:
    """Fill ``wheels_dir`` (the build context): ``project/`` holds this project's wheel, rebuilt
    every time; ``deps/`` every wheel it needs and ``requirements.txt`` (the pins), downloaded
    when the pins changed. Two folders, so that the image's layer of dependencies is rebuilt
    only when they change."""
    project_dir, deps_dir = wheels_dir / PROJECT_SUBDIR, wheels_dir / DEPS_SUBDIR
    project_dir.mkdir(parents=True, exist_ok=True)
    deps_dir.mkdir(parents=True, exist_ok=True)
    for old in project_dir.glob("*.whl"):
        old.unlink()
    if progress:
        progress("building the prime-agent wheel")
    run_checked([*_PIP, "wheel", "--no-deps", "-w", str(project_dir), str(REPO_ROOT)], "pip wheel")
    pins = direct_pins()
    pins_key = hashlib.sha256("\n".join(pins).encode()).hexdigest()
    stamp = deps_dir / f".deps-{pins_key[:16]}"
    if stamp.exists():
        return wheels_dir
    if progress:
        progress("downloading the orchestrator's wheels (pinned to this environment)")
    for old in deps_dir.iterdir():  # another pin set's versions must not be installed
        old.unlink()
    requirements = deps_dir / REQUIREMENTS_FILE
    requirements.write_text("\n".join(pins) + "\n")
    run_checked(
        [*_PIP, "wheel", "--no-deps", "-w", str(deps_dir), "-c", str(requirements), *SDIST_ONLY],
        "pip wheel (pure-Python sdists)",
    )
    (project,) = project_dir.glob("prime_agent-*.whl")
    run_checked(
        [
            *_PIP,
            "download",
            "--only-binary=:all:",
            "--python-version",
            ORCHESTRATOR_PYTHON_VERSION,
            "--find-links",
            str(deps_dir),
            "-d",
            str(deps_dir),
            "-c",
            str(requirements),
            str(project),
        ],
        "pip download (orchestrator wheels)",
    )
    stamp.touch()
    return wheels_dir


def build_orchestrator_image(progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build the image (the offline base first when it is missing)."""
    started = time.monotonic()
    ensure_base_offline(progress)
    context = gather_orchestrator_wheels(progress=progress)
    if progress:
        progress(f"docker build {ORCHESTRATOR_IMAGE}")
    docker_build(
        ORCHESTRATOR_KIND,
        ORCHESTRATOR_IMAGE,
        {BASE_BUILD_ARG: BASE_OFFLINE_TAG},
        "orchestrator image build",
        context,
        source_label=orchestrator_source_hash(),
    )
    return BuildResult(
        ORCHESTRATOR_KIND, ORCHESTRATOR_IMAGE, True, "built", time.monotonic() - started
    )


def ensure_orchestrator_image(progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build the image when it is missing or older than what it contains."""
    client = docker_client()
    if (
        image_exists(ORCHESTRATOR_IMAGE, client)
        and image_label(ORCHESTRATOR_IMAGE, SOURCE_HASH_LABEL, client) == orchestrator_source_hash()
    ):
        return BuildResult(ORCHESTRATOR_KIND, ORCHESTRATOR_IMAGE, False, "up to date")
    return build_orchestrator_image(progress)
