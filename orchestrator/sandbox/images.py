"""Build the session images offline: wheels gathered on the host, ``docker build`` without pulls.

Layout (docs/images.md):

- ``images/base-offline.sh``: debootstrap bookworm (python3 + python3-venv) into
  ``images/.build/rootfs`` and ``docker import`` it as ``BASE_OFFLINE_TAG``: a base image made
  without any registry.
- ``images/.build/wheels``: ipykernel, jupyter-kernel-gateway, nats-py and their dependencies,
  pinned to the versions installed here (``pip download``; cached by a stamp of the pins), plus
  a wheel of this project built with ``--no-deps``. This directory is the build context.
- ``images/{session,rust,cuda}/Dockerfile``: the images. ``session`` takes ``BASE`` (any Python
  3.11 Debian-like image), ``rust`` builds on ``session``, ``cuda`` is built only where its base
  image already exists locally.

Every image carries the label ``SOURCE_HASH_LABEL``: a hash of the files that run inside it
(gateway_main, relay, proctree, runtime, the Dockerfile). ``ensure_session_image`` rebuilds when
it differs, so tests never run against a stale image.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import SandboxError, UserError

__all__ = [
    "BASE_OFFLINE_TAG",
    "CUDA_BASE_DEFAULT",
    "IMAGE_REQUIREMENTS",
    "SESSION_IMAGE",
    "SOURCE_HASH_LABEL",
    "BuildResult",
    "ImageKind",
    "build_base_offline",
    "build_image",
    "docker_client",
    "ensure_session_image",
    "gather_wheels",
    "image_exists",
    "image_label",
    "image_tag",
    "source_hash",
]

log = logging.getLogger(__name__)

ImageKind = Literal["session", "rust", "cuda"]

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = REPO_ROOT / "images"
BUILD_DIR = IMAGES_DIR / ".build"
WHEELS_DIR = BUILD_DIR / "wheels"
BASE_OFFLINE_SCRIPT = IMAGES_DIR / "base-offline.sh"

BASE_OFFLINE_TAG = "prime-agent/base-offline:bookworm"
SESSION_IMAGE = "prime-agent/session:latest"
IMAGE_TAGS: dict[str, str] = {
    "session": SESSION_IMAGE,
    "rust": "prime-agent/session-rust:latest",
    "cuda": "prime-agent/session-cuda:latest",
}
CUDA_BASE_DEFAULT = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
SOURCE_HASH_LABEL = "prime-agent.source-hash"
# What the image installs from PyPI wheels (pinned to this host's versions).
IMAGE_REQUIREMENTS = ("ipykernel", "jupyter-kernel-gateway", "nats-py")
IMAGE_PYTHON = (3, 11)  # Debian bookworm's python3: the wheels must be cp311
# Its exact version: some current wheels (soupsieve) need >= 3.11.5, so resolve for this one.
IMAGE_PYTHON_VERSION = "3.11.2"
# Pinned to this host's versions (what the tests ran with); the rest of the dependency tree is
# resolved for IMAGE_PYTHON_VERSION.
PINNED_DISTRIBUTIONS = (
    *IMAGE_REQUIREMENTS,
    "jupyter-server",
    "jupyter-client",
    "tornado",
    "pyzmq",
    "ipython",
    "traitlets",
)
PROJECT_DIST = "prime-agent"
DOCKER_PING_TIMEOUT_S = 5
BUILD_TIMEOUT_S = 1800
# Files whose content ends up running inside the image.
_HASHED_SOURCES = (
    "orchestrator/sandbox/gateway_main.py",
    "orchestrator/sandbox/relay.py",
    "orchestrator/sandbox/proctree.py",
    "orchestrator/runtime",
    "images/session/Dockerfile",
)


@dataclass(frozen=True)
class BuildResult:
    kind: str
    tag: str
    built: bool  # False: skipped (message says why) or already current
    message: str
    seconds: float = 0.0


def docker_client() -> Any:
    """A docker SDK client that answered a ping; ``UserError`` (one line) otherwise."""
    try:
        import docker
        import docker.errors
    except ImportError as exc:  # pragma: no cover - a dependency
        raise UserError("the docker Python SDK is not installed (pip install docker)") from exc
    try:
        client = docker.from_env(timeout=DOCKER_PING_TIMEOUT_S)
        client.ping()
    except docker.errors.DockerException as exc:
        raise UserError(f"Docker is not reachable: {_first_line(exc)}") from exc
    return client


def image_tag(kind: str) -> str:
    return IMAGE_TAGS[kind]


def image_exists(tag: str, client: Any | None = None) -> bool:
    import docker.errors

    client = client or docker_client()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.DockerException as exc:
        raise SandboxError(f"docker image lookup of {tag} failed: {_first_line(exc)}") from exc
    return True


def image_label(tag: str, label: str, client: Any | None = None) -> str | None:
    import docker.errors

    client = client or docker_client()
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.DockerException:
        return None
    value = labels.get(label)
    return str(value) if value is not None else None


def source_hash() -> str:
    """Hash of everything that runs inside the session image (see ``_HASHED_SOURCES``)."""
    digest = hashlib.sha256()
    for rel in _HASHED_SOURCES:
        path = REPO_ROOT / rel
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digest.update(str(file.relative_to(REPO_ROOT)).encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _check_checkout() -> None:
    if not (IMAGES_DIR / "session" / "Dockerfile").is_file():
        raise UserError(f"images/ not found at {IMAGES_DIR}: build images from a source checkout")


def _run(argv: list[str], what: str, *, timeout_s: float = BUILD_TIMEOUT_S) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as exc:
        raise UserError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{what} took longer than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise SandboxError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))


def _pins() -> list[str]:
    """``name==version`` of the main distributions installed here (constraints)."""
    pins: list[str] = []
    for name in PINNED_DISTRIBUTIONS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return pins


def _pip_target_options() -> list[str]:
    options = ["--python-version", IMAGE_PYTHON_VERSION]
    if sys.version_info[:2] == IMAGE_PYTHON:
        return options
    # A host on another Python still gathers cp311 wheels for the image.
    arch = platform.machine()
    version = "".join(str(part) for part in IMAGE_PYTHON)
    options += ["--implementation", "cp", "--abi", f"cp{version}"]
    for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28"):
        options += ["--platform", f"{tag}_{arch}"]
    return options


def gather_wheels(
    wheels_dir: Path = WHEELS_DIR, *, progress: Callable[[str], None] | None = None
) -> Path:
    """Fill ``wheels_dir`` with the image's wheels; the project wheel is rebuilt every time."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    pins = _pins()
    stamp_key = hashlib.sha256("\n".join([*IMAGE_REQUIREMENTS, *pins]).encode()).hexdigest()
    stamp = wheels_dir / f".deps-{stamp_key[:16]}"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    if not stamp.exists():
        if progress:
            progress("downloading wheels (pinned to this environment)")
        constraints = wheels_dir.parent / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        _run(
            [
                *pip,
                "download",
                "--only-binary=:all:",
                "-d",
                str(wheels_dir),
                "-c",
                str(constraints),
                *_pip_target_options(),
                *IMAGE_REQUIREMENTS,
            ],
            "pip download (image wheels)",
        )
        for old in wheels_dir.glob(".deps-*"):
            old.unlink()
        stamp.touch()
    for old in wheels_dir.glob("prime_agent-*.whl"):
        old.unlink()
    if progress:
        progress("building the prime-agent wheel (--no-deps)")
    _run(
        [*pip, "wheel", "--no-deps", "-w", str(wheels_dir), str(REPO_ROOT)],
        "pip wheel (prime-agent)",
    )
    return wheels_dir


def build_base_offline(tag: str = BASE_OFFLINE_TAG) -> BuildResult:
    """debootstrap + docker import (``images/base-offline.sh``); the rootfs is cached."""
    _check_checkout()
    started = time.monotonic()
    _run(["bash", str(BASE_OFFLINE_SCRIPT), tag], "base-offline")
    return BuildResult("base-offline", tag, True, "built", time.monotonic() - started)


def _docker_build(dockerfile: Path, tag: str, build_args: dict[str, str], what: str) -> None:
    if shutil.which("docker") is None:
        raise UserError("the docker CLI is not installed (needed to build images)")
    argv = ["docker", "build", "-q", "-f", str(dockerfile), "-t", tag]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    argv += ["--label", f"{SOURCE_HASH_LABEL}={source_hash()}", str(WHEELS_DIR)]
    _run(argv, what)


def build_image(
    kind: ImageKind,
    *,
    base: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build one image. ``base``: the session image's BASE (default: the offline base, built
    first when missing) or the CUDA base for ``cuda``."""
    _check_checkout()
    client = docker_client()
    tag = image_tag(kind)
    started = time.monotonic()
    if kind == "cuda":
        cuda_base = base or CUDA_BASE_DEFAULT
        if not image_exists(cuda_base, client):
            return BuildResult(kind, tag, False, f"skipped: CUDA base {cuda_base} is not local")
        gather_wheels(progress=progress)
        _docker_build(IMAGES_DIR / "cuda" / "Dockerfile", tag, {"BASE": cuda_base}, "cuda build")
        return BuildResult(kind, tag, True, "built", time.monotonic() - started)
    if kind == "rust":
        if not image_exists(SESSION_IMAGE, client):
            build_image("session", base=base, progress=progress)
        if progress:
            progress("docker build rust (apt: rustc, cargo)")
        _docker_build(IMAGES_DIR / "rust" / "Dockerfile", tag, {}, "rust build")
        return BuildResult(kind, tag, True, "built", time.monotonic() - started)
    session_base = base or BASE_OFFLINE_TAG
    if not image_exists(session_base, client):
        if session_base != BASE_OFFLINE_TAG:
            raise UserError(f"base image {session_base} is not present locally")
        if progress:
            progress("building the offline base (debootstrap, about a minute)")
        build_base_offline()
    gather_wheels(progress=progress)
    if progress:
        progress(f"docker build {tag} (BASE={session_base})")
    _docker_build(
        IMAGES_DIR / "session" / "Dockerfile", tag, {"BASE": session_base}, "session build"
    )
    return BuildResult(kind, tag, True, "built", time.monotonic() - started)


def ensure_session_image(progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build the session image when it is missing or older than the sources it contains."""
    client = docker_client()
    if image_exists(SESSION_IMAGE, client):
        current = image_label(SESSION_IMAGE, SOURCE_HASH_LABEL, client)
        if current == source_hash():
            return BuildResult("session", SESSION_IMAGE, False, "up to date")
    return build_image("session", progress=progress)


def main() -> int:
    """``python -m orchestrator.sandbox.images``: make sure the session image is current (what
    ``make test`` runs first). Without a usable Docker it says so and succeeds: the docker tests
    skip themselves then."""
    try:
        result = ensure_session_image(progress=lambda line: print(f"images: {line}", flush=True))
    except UserError as exc:
        print(f"images: skipped: {exc}")
        return 0
    except SandboxError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    print(
        f"images: {result.tag}: {result.message}"
        + (f" in {result.seconds:.0f} s" if result.built else "")
    )
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
