"""Build the session images offline: wheels gathered on the host, ``docker build`` without pulls.

Layout (docs/images.md):

- ``images/base-offline.sh``: debootstrap bookworm (python3 + python3-venv) into
  ``images/.build/rootfs`` and ``docker import`` it as ``BASE_OFFLINE_TAG``: a base image made
  without any registry.
- ``images/.build/wheels``: ipykernel, jupyter-kernel-gateway, nats-py, dill and their dependencies,
  pinned to the versions installed here (``pip download``; cached by a stamp of the pins), plus
  a wheel of this project built with ``--no-deps``. This directory is the build context.
- ``images/{session,rust,cuda}/Dockerfile``: the images. ``session`` takes ``BASE`` (any Python
  3.11 Debian-like image); ``rust`` builds on ``session`` and installs Debian's Rust toolchain
  with apt (the build container reaches the Debian mirror, not a container registry); ``cuda``
  builds on ``session`` one of two ways (``cuda_plan``): with a CUDA base image (``--base``, or
  ``CUDA_BASE_DEFAULT`` when it is here) it copies that image's toolkit (``Dockerfile``; a base
  neither here nor pullable skips the build with a one-line reason), else offline
  (``Dockerfile.offline``): Debian bookworm's non-free ``nvidia-cuda-toolkit`` (CUDA 11.8) with
  apt, plus, with ``torch``, PyTorch and its CUDA user space from PyPI wheels gathered on the
  host (``gather_torch_wheels``).

Every image carries the label ``SOURCE_HASH_LABEL``: a hash of the files that run inside it
(gateway_main, gateway_kernel, gateway_files, file_tar, relay, proctree, runtime, the
Dockerfiles). ``ensure_image``
rebuilds when it differs, so tests never run against a stale image.

Sessions name their image (``Settings.sandbox.image``, ``SandboxSpec.image``) as ``session``,
``rust``, ``cuda`` or any image tag; ``resolve_image`` turns a name into a tag.
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
    "CUDA_OFFLINE",
    "IMAGE_NAMES",
    "IMAGE_REQUIREMENTS",
    "SESSION_IMAGE",
    "SOURCE_HASH_LABEL",
    "TORCH_LABEL",
    "BuildResult",
    "ImageKind",
    "build_base_offline",
    "build_image",
    "cuda_plan",
    "docker_build",
    "docker_client",
    "ensure_base_offline",
    "ensure_image",
    "ensure_session_image",
    "gather_torch_wheels",
    "gather_wheels",
    "hash_sources",
    "image_exists",
    "image_label",
    "image_tag",
    "resolve_image",
    "run_checked",
    "source_hash",
]

log = logging.getLogger(__name__)

ImageKind = Literal["session", "rust", "cuda"]
IMAGE_NAMES: tuple[ImageKind, ...] = ("session", "rust", "cuda")

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
# ``--base offline``: the cuda image from Debian's toolkit, never from a registry image.
CUDA_OFFLINE = "offline"
CUDA_OFFLINE_DOCKERFILE = IMAGES_DIR / "cuda" / "Dockerfile.offline"
# PyTorch for the offline cuda image (``--torch``): its wheels and their CUDA user space
# (nvidia-* wheels, triton) from PyPI, resolved for the image's Python like the session's.
TORCH_REQUIREMENTS = ("torch", "numpy")
TORCH_WHEELS_DIR = BUILD_DIR / "cuda-wheels"
EMPTY_CONTEXT_DIR = BUILD_DIR / "empty-context"
# Set on a cuda image built with PyTorch: the torch version (a sweep task that needs it
# checks this, sweeps/runnable.py).
TORCH_LABEL = "prime-agent.torch"
# Build args naming the session image a variant builds FROM.
SESSION_BUILD_ARG = "SESSION"
BASE_BUILD_ARG = "BASE"
SOURCE_HASH_LABEL = "prime-agent.source-hash"
# What the image installs from PyPI wheels (pinned to this host's versions).
# nkeys (and its pynacl): a kernel signs the nonce of an external operator-mode NATS server.
# pytest: the usual autonomous gate (`--autonomous-gate "python -m pytest -q"`, docs/control.md)
# runs inside the sandbox, and the sandbox has no network to install it.
IMAGE_REQUIREMENTS = ("ipykernel", "jupyter-kernel-gateway", "nats-py", "dill", "nkeys", "pytest")
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
# Pure-Python requirements PyPI has only as sdists: built into wheels on the host first, so the
# binary-only download below finds them locally (--find-links).
SDIST_ONLY = ("nkeys",)
PROJECT_DIST = "prime-agent"
DOCKER_PING_TIMEOUT_S = 5
BUILD_TIMEOUT_S = 1800  # a docker build or pull (a CUDA base is several GB)
# Files whose content ends up running inside the image.
_HASHED_SOURCES = (
    "orchestrator/sandbox/gateway_main.py",
    "orchestrator/sandbox/gateway_kernel.py",
    "orchestrator/sandbox/gateway_files.py",
    "orchestrator/sandbox/file_tar.py",
    "orchestrator/sandbox/relay.py",
    "orchestrator/sandbox/proctree.py",
    "orchestrator/runtime",
    "images/session/Dockerfile",
)


def _variant_sources(kind: str) -> tuple[str, ...]:
    """A variant runs the session image's sources plus its own Dockerfile(s)."""
    if kind == "session":
        return _HASHED_SOURCES
    if kind == "cuda":
        return (*_HASHED_SOURCES, "images/cuda/Dockerfile", "images/cuda/Dockerfile.offline")
    return (*_HASHED_SOURCES, f"images/{kind}/Dockerfile")


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


def resolve_image(name: str) -> str:
    """The tag for an image name (``session``, ``rust``, ``cuda``) or a tag given as is."""
    name = name.strip()
    if not name or any(c.isspace() for c in name):
        raise UserError(f"invalid image name {name!r}: use session, rust, cuda or an image tag")
    return IMAGE_TAGS.get(name, name)


def image_hint(tag: str) -> str:
    """What to run when ``tag`` is missing: the build command for our images."""
    for kind, known in IMAGE_TAGS.items():
        if known == tag:
            return f"run prime-agent images build {kind}"
    return "build or load it first (docker images lists what is there)"


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


def source_hash(kind: str = "session") -> str:
    """Hash of everything that runs inside an image (see ``_HASHED_SOURCES``), and of what it
    installs (``IMAGE_REQUIREMENTS``): a new requirement makes an existing image stale."""
    return hash_sources("\n".join(IMAGE_REQUIREMENTS), _variant_sources(kind))


def hash_sources(seed: str, sources: tuple[str, ...]) -> str:
    """16 hex digits of ``seed`` and the files under ``sources`` (paths in the checkout; a
    folder counts its ``.py`` files), names and contents: an image's source-hash label."""
    digest = hashlib.sha256(seed.encode())
    for rel in sources:
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


def run_checked(argv: list[str], what: str, *, timeout_s: float = BUILD_TIMEOUT_S) -> None:
    """Run a build step; its failure is one ``SandboxError`` ending with the output's tail."""
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
        run_checked(
            [
                *pip,
                "wheel",
                "--no-deps",
                "-w",
                str(wheels_dir),
                "-c",
                str(constraints),
                *SDIST_ONLY,
            ],
            "pip wheel (pure-Python sdists)",
        )
        run_checked(
            [
                *pip,
                "download",
                "--only-binary=:all:",
                "--find-links",
                str(wheels_dir),
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
    run_checked(
        [*pip, "wheel", "--no-deps", "-w", str(wheels_dir), str(REPO_ROOT)],
        "pip wheel (prime-agent)",
    )
    return wheels_dir


def ensure_base_offline(progress: Callable[[str], None] | None = None) -> None:
    """Build the offline base when it is not here."""
    if not image_exists(BASE_OFFLINE_TAG):
        if progress:
            progress("building the offline base (debootstrap, about a minute)")
        build_base_offline()


def build_base_offline(tag: str = BASE_OFFLINE_TAG) -> BuildResult:
    """debootstrap + docker import (``images/base-offline.sh``); the rootfs is cached."""
    _check_checkout()
    started = time.monotonic()
    run_checked(["bash", str(BASE_OFFLINE_SCRIPT), tag], "base-offline")
    return BuildResult("base-offline", tag, True, "built", time.monotonic() - started)


def docker_build(
    kind: str,
    tag: str,
    build_args: dict[str, str],
    what: str,
    context: Path = WHEELS_DIR,
    *,
    dockerfile: Path | None = None,
    labels: dict[str, str] | None = None,
    source_label: str | None = None,
) -> None:
    """``docker build`` of ``images/KIND/Dockerfile`` (or ``dockerfile``) with the image's
    source-hash label (``source_label``, else ``source_hash(kind)``) and ``labels``."""
    if shutil.which("docker") is None:
        raise UserError("the docker CLI is not installed (needed to build images)")
    dockerfile = dockerfile or IMAGES_DIR / kind / "Dockerfile"
    # --force-rm: a failed step leaves no intermediate container behind (legacy builder).
    argv = ["docker", "build", "-q", "--force-rm", "-f", str(dockerfile), "-t", tag]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    hashed = source_label if source_label is not None else source_hash(kind)
    for key, value in {SOURCE_HASH_LABEL: hashed, **(labels or {})}.items():
        argv += ["--label", f"{key}={value}"]
    run_checked([*argv, str(context)], what)


def _pullable(tag: str) -> tuple[bool, str]:
    """Try ``docker pull tag``; (False, the first line of why) when no registry has it."""
    try:
        proc = subprocess.run(
            ["docker", "pull", "-q", tag], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except FileNotFoundError:
        return False, "the docker CLI is not installed"
    except subprocess.TimeoutExpired:
        return False, f"docker pull took longer than {BUILD_TIMEOUT_S} s"
    if proc.returncode == 0:
        return True, ""
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return False, lines[-1] if lines else f"docker pull exited {proc.returncode}"


def gather_torch_wheels(
    wheels_dir: Path = TORCH_WHEELS_DIR,
    *,
    spec: str = "torch",
    progress: Callable[[str], None] | None = None,
) -> str:
    """Fill ``wheels_dir`` with PyTorch (``spec``, e.g. ``torch==2.5.1``), numpy and their
    dependencies (the nvidia-* CUDA wheels, triton: gigabytes) for the image's Python; a stamp
    of ``spec`` skips the download next time. Returns the torch version gathered."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    stamp = wheels_dir / f".torch-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
    if not stamp.exists():
        if progress:
            progress(f"downloading {spec} and its CUDA wheels from PyPI (gigabytes)")
        for old in wheels_dir.glob("*.whl"):
            old.unlink()
        requirements = [spec, *TORCH_REQUIREMENTS[1:]]
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download"]
        run_checked(
            [
                *pip,
                "--only-binary=:all:",
                "-d",
                str(wheels_dir),
                *_pip_target_options(),
                *requirements,
            ],
            "pip download (torch wheels)",
        )
        for old in wheels_dir.glob(".torch-*"):
            old.unlink()
        stamp.touch()
    found = sorted(wheels_dir.glob("torch-*.whl"))
    if not found:
        raise SandboxError(f"no torch wheel in {wheels_dir} after the download")
    return found[-1].name.split("-")[1]


@dataclass(frozen=True)
class CudaPlan:
    """How the cuda image is built: from ``base`` (a CUDA registry image) or offline (None)."""

    base: str | None
    skip: str = ""  # non-empty: not built, and why


def cuda_plan(
    base: str | None,
    *,
    pull: bool,
    exists: Callable[[str], bool],
    pullable: Callable[[str], tuple[bool, str]] | None = None,
) -> CudaPlan:
    """The cuda build for ``--base``: ``offline`` → Debian's toolkit; an image → copy its
    toolkit (pulled when missing and ``pull``; skipped with the reason when that fails); none →
    ``CUDA_BASE_DEFAULT`` when it is here, else offline (no pull is tried)."""
    if base == CUDA_OFFLINE:
        return CudaPlan(None)
    if base is None:
        return CudaPlan(CUDA_BASE_DEFAULT) if exists(CUDA_BASE_DEFAULT) else CudaPlan(None)
    if exists(base):
        return CudaPlan(base)
    if not pull:
        return CudaPlan(base, f"the CUDA base {base} is not here (pulling is off)")
    ok, why = (pullable or _pullable)(base)
    return CudaPlan(base) if ok else CudaPlan(base, f"the CUDA base {base} is not here ({why})")


def _variant_context(kind: str) -> Path:
    """The rust and cuda builds need no files: their folder (holding only the Dockerfile) is
    the context, so the wheels are not sent to the engine again."""
    return IMAGES_DIR / kind


def build_image(
    kind: ImageKind,
    *,
    base: str | None = None,
    pull: bool = True,
    tag: str | None = None,
    torch: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build one image. ``base``: the session image's BASE (default: the offline base, built
    first when missing), or for ``cuda`` what ``cuda_plan`` makes of it (a CUDA base image,
    ``offline``, or None: the default base when it is here, else offline). ``torch``: a pip
    requirement (``torch``, ``torch==2.5.1``) to add PyTorch to an offline cuda image.
    ``tag``: another tag than ``image_tag(kind)`` (rust and cuda; tests use it)."""
    _check_checkout()
    client = docker_client()
    if tag is not None and kind == "session":
        raise UserError("the session image keeps its tag (variants build FROM it)")
    tag = tag or image_tag(kind)
    started = time.monotonic()
    if kind == "cuda":
        return _build_cuda(client, tag, base, pull, torch, progress, started)
    if kind == "rust":
        # A variant builds FROM the session image: make sure that one is current first.
        ensure_image("session", base=base, progress=progress)
        if progress:
            progress(f"docker build {tag} (apt: rustc, cargo)")
        args = {SESSION_BUILD_ARG: SESSION_IMAGE}
        docker_build(kind, tag, args, f"{kind} build", _variant_context(kind))
        return BuildResult(kind, tag, True, "built", time.monotonic() - started)
    session_base = base or BASE_OFFLINE_TAG
    if session_base != BASE_OFFLINE_TAG and not image_exists(session_base, client):
        raise UserError(f"base image {session_base} is not present locally")
    ensure_base_offline(progress)
    gather_wheels(progress=progress)
    if progress:
        progress(f"docker build {tag} (BASE={session_base})")
    docker_build("session", tag, {BASE_BUILD_ARG: session_base}, "session build")
    return BuildResult(kind, tag, True, "built", time.monotonic() - started)


def _build_cuda(
    client: Any,
    tag: str,
    base: str | None,
    pull: bool,
    torch: str | None,
    progress: Callable[[str], None] | None,
    started: float,
) -> BuildResult:
    def pullable(image: str) -> tuple[bool, str]:
        if progress:
            progress(f"docker pull {image}")
        return _pullable(image)

    plan = cuda_plan(
        base, pull=pull, exists=lambda image: image_exists(image, client), pullable=pullable
    )
    if plan.skip:
        return BuildResult("cuda", tag, False, f"skipped: {plan.skip}")
    if plan.base is not None and torch:
        raise UserError(
            "--torch builds on Debian's toolkit: use it without --base (or --base offline)"
        )
    ensure_image("session", progress=progress)
    args = {SESSION_BUILD_ARG: SESSION_IMAGE}
    if plan.base is not None:
        if progress:
            progress(f"docker build {tag} (CUDA from {plan.base})")
        docker_build(
            "cuda", tag, {**args, BASE_BUILD_ARG: plan.base}, "cuda build", _variant_context("cuda")
        )
        return BuildResult(
            "cuda", tag, True, f"built (CUDA from {plan.base})", time.monotonic() - started
        )
    labels: dict[str, str] = {}
    context = EMPTY_CONTEXT_DIR
    if torch:
        labels[TORCH_LABEL] = gather_torch_wheels(spec=torch, progress=progress)
        context = TORCH_WHEELS_DIR
    else:
        context.mkdir(parents=True, exist_ok=True)
    if progress:
        extra = f" and PyTorch {labels[TORCH_LABEL]} from wheels" if torch else ""
        progress(f"docker build {tag} (offline: apt nvidia-cuda-toolkit{extra})")
    docker_build(
        "cuda",
        tag,
        args,
        "cuda build (offline)",
        context,
        dockerfile=CUDA_OFFLINE_DOCKERFILE,
        labels=labels,
    )
    how = "Debian's CUDA toolkit" + (f", PyTorch {labels[TORCH_LABEL]}" if torch else "")
    return BuildResult("cuda", tag, True, f"built offline ({how})", time.monotonic() - started)


def ensure_image(
    kind: ImageKind,
    *,
    base: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build ``kind`` when it is missing or older than the sources it contains (a variant also
    when the session image under it was rebuilt). A skipped cuda build comes back unbuilt."""
    client = docker_client()
    tag = image_tag(kind)
    current = (
        image_exists(tag, client)
        and image_label(tag, SOURCE_HASH_LABEL, client) == source_hash(kind)
        and (kind == "session" or _built_on_current_session(tag, client))
    )
    if current:
        return BuildResult(kind, tag, False, "up to date")
    return build_image(kind, base=base, progress=progress)


def _built_on_current_session(tag: str, client: Any) -> bool:
    """Whether the variant ``tag`` was built FROM the session image as it is now."""
    import docker.errors

    try:
        session_id = client.images.get(SESSION_IMAGE).id
        history = client.images.get(tag).history()
    except docker.errors.DockerException:
        return False
    return any(layer.get("Id") == session_id for layer in history)


def ensure_session_image(progress: Callable[[str], None] | None = None) -> BuildResult:
    """Build the session image when it is missing or older than the sources it contains."""
    return ensure_image("session", progress=progress)


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
