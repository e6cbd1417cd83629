"""``harbor``: Harbor / Terminal-Bench task directories as sweep tasks (docs/sweeps.md).

A task directory holds ``task.toml`` (timeouts, resources), ``instruction.md`` (the prompt),
``environment/`` (a ``Dockerfile`` and what it copies) and ``tests/`` (``test.sh``, the
verifier, which writes its reward to ``/logs/verifier/reward.txt`` or ``reward.json``). A sweep
names one directory, or a dataset directory whose sub-directories are tasks::

    suites: [{suite: harbor, path: ./tasks}]

A task's ``content_hash`` covers every file of its directory, so editing a test, the
instruction or the Dockerfile makes its cells new. What a trial does with it — the image, the
workspace, the verifier — is ``sweeps/harbor_env.py`` and the sweep runner.

``task.toml`` is read leniently (tasks come from elsewhere, with keys of their own): the keys
used here are checked, any others are kept out of the way.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.errors import ConfigError
from orchestrator.sweeps.tasks import Task

__all__ = [
    "AGENT_TIMEOUT_DEFAULT_S",
    "SUITE",
    "VERIFIER_TIMEOUT_DEFAULT_S",
    "HarborSpec",
    "directory_hash",
    "generate",
    "harbor_spec",
    "load_task_dir",
    "task_dirs",
]

SUITE: Final = "harbor"
TASK_FILE: Final = "task.toml"
INSTRUCTION_FILE: Final = "instruction.md"
ENVIRONMENT_DIR: Final = "environment"
TESTS_DIR: Final = "tests"
TEST_SCRIPT: Final = "test.sh"
# Harbor's own defaults when task.toml leaves them out.
AGENT_TIMEOUT_DEFAULT_S: Final = 600.0
VERIFIER_TIMEOUT_DEFAULT_S: Final = 600.0
BUILD_TIMEOUT_DEFAULT_S: Final = 600.0
# Files larger than this are hashed, never read whole (a task may ship data files).
_HASH_CHUNK_BYTES: Final = 1 << 20
# Directories that are never part of a task's content (caches a run may leave behind).
_SKIPPED_DIRS: Final = frozenset({"__pycache__", ".pytest_cache", ".git"})


@dataclass(frozen=True)
class HarborSpec:
    """What a trial needs of a Harbor task beyond its prompt (``Task.params["harbor"]``)."""

    directory: str  # the task directory, absolute (``Task.source``)
    agent_timeout_s: float
    verifier_timeout_s: float
    build_timeout_s: float
    cpus: float | None
    memory_mb: int | None
    # The prebuilt image task.toml names (``[environment] docker_image``), used when local.
    docker_image: str | None

    @property
    def environment(self) -> Path:
        return Path(self.directory) / ENVIRONMENT_DIR

    @property
    def tests(self) -> Path:
        return Path(self.directory) / TESTS_DIR


def _positive(table: dict[str, Any], key: str, default: float | None, where: str) -> float | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{where}: {key} must be a positive number (got {value!r})")
    if not math.isfinite(float(value)):
        raise ConfigError(f"{where}: {key} must be finite")
    return float(value)


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return table


def directory_hash(directory: Path) -> str:
    """Every file's path and bytes, in a stable order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory)
        if _SKIPPED_DIRS.intersection(relative.parts):
            continue
        digest.update(relative.as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def load_task_dir(directory: Path) -> Task:
    """One task directory as a ``Task``; ``ConfigError`` (one line) when it is not one."""
    directory = directory.resolve()
    where = str(directory)
    toml_path = directory / TASK_FILE
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no {TASK_FILE} (not a Harbor task directory)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{toml_path}: {exc}") from None
    try:
        instruction = (directory / INSTRUCTION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read {INSTRUCTION_FILE}: {exc}") from None
    if not instruction:
        raise ConfigError(f"{where}: {INSTRUCTION_FILE} is empty")
    if not (directory / TESTS_DIR / TEST_SCRIPT).is_file():
        raise ConfigError(f"{where}: no {TESTS_DIR}/{TEST_SCRIPT} (the verifier)")
    environment = _table(data, "environment", where)
    docker_image = environment.get("docker_image")
    if docker_image is not None and not isinstance(docker_image, str):
        raise ConfigError(f"{where}: [environment] docker_image must be a string")
    dockerfile = directory / ENVIRONMENT_DIR / "Dockerfile"
    if docker_image is None and not dockerfile.is_file():
        raise ConfigError(
            f"{where}: no {ENVIRONMENT_DIR}/Dockerfile and no [environment] docker_image "
            "(a docker-compose environment is not supported)"
        )
    memory = _positive(environment, "memory_mb", None, where)
    spec = HarborSpec(
        directory=where,
        agent_timeout_s=_positive(
            _table(data, "agent", where), "timeout_sec", AGENT_TIMEOUT_DEFAULT_S, where
        )
        or AGENT_TIMEOUT_DEFAULT_S,
        verifier_timeout_s=_positive(
            _table(data, "verifier", where), "timeout_sec", VERIFIER_TIMEOUT_DEFAULT_S, where
        )
        or VERIFIER_TIMEOUT_DEFAULT_S,
        build_timeout_s=_positive(environment, "build_timeout_sec", BUILD_TIMEOUT_DEFAULT_S, where)
        or BUILD_TIMEOUT_DEFAULT_S,
        cpus=_positive(environment, "cpus", None, where),
        memory_mb=int(memory) if memory is not None else None,
        docker_image=docker_image,
    )
    return Task(
        suite=SUITE,
        id=f"{SUITE}/{directory.name}",
        question=instruction,
        context="",
        expected=None,
        scoring="verifier",
        params={"harbor": _spec_params(spec), "content": directory_hash(directory)},
        source=where,
    )


def _spec_params(spec: HarborSpec) -> dict[str, Any]:
    """What the task's content hash takes of its spec: everything but where it lies."""
    return {k: v for k, v in spec.__dict__.items() if k != "directory"}


def harbor_spec(task: Task) -> HarborSpec | None:
    """The Harbor side of ``task``; None for a task of another suite."""
    raw = task.params.get("harbor")
    if not isinstance(raw, dict) or task.source is None:
        return None
    return HarborSpec(directory=task.source, **raw)


def task_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a task, else its task sub-directories, by name."""
    if (path / TASK_FILE).is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(f"{path}: no such directory")
    found = sorted(p for p in path.iterdir() if p.is_dir() and (p / TASK_FILE).is_file())
    if not found:
        raise ConfigError(f"{path}: neither a Harbor task nor a directory of tasks ({TASK_FILE})")
    return found


def generate(path: Path, tasks: int | None) -> list[Task]:
    """The tasks under ``path`` (at most ``tasks``, by directory name)."""
    found = task_dirs(path)
    return [load_task_dir(d) for d in (found if tasks is None else found[:tasks])]
