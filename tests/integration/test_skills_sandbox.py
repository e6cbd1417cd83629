"""Python-backed skills in real sandboxes (``SandboxSpec.skill_dirs``; docs/harness.md, "Skills").

A skill directory made in tmp_path is found by discovery and handed to a real sandbox: the local
backend's kernel (cold, and a pooled kernel that started before its session) and a Docker
container, where the directory is a read-only mount. ``import fixture_skill`` must work in the
kernel and in the kernel's child processes.

The docker tests need the session image (``make test`` builds it before the tests; these tests
never build it). They skip when no Docker Engine answers and FAIL when one answers but the image
is missing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SandboxStartError
from orchestrator.harness.skills import discover_in
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.docker_run import CONTAINER_SKILLS_DIR
from orchestrator.sandbox.local import LocalBackend
from tests.helpers import need
from tests.integration.test_sandbox_conformance import workspace

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(300),
]

SKILL_NAME = "fixture-skill"
IMPORT_NAME = "fixture_skill"
CELL_TIMEOUT_S = 60
POOL_READY_TIMEOUT_S = 120
GRACE_S = 1.0
EROFS = 30  # errno of a write to a read-only mount
IMPORT_CELL = f"import {IMPORT_NAME}\n{IMPORT_NAME}.run(21)"
# The kernel's child processes see the skill through PYTHONPATH.
CHILD_CELL = (
    "import subprocess, sys\n"
    "print(subprocess.run([sys.executable, '-c', "
    f"'import {IMPORT_NAME}; print({IMPORT_NAME}.run(4))'], "
    "capture_output=True, text=True, check=True).stdout.strip())"
)


def make_fixture_skill(root: Path) -> Path:
    """A Python-backed skill in ``root``; returns its directory as discovery reports it."""
    directory = root / SKILL_NAME
    package = directory / IMPORT_NAME
    package.mkdir(parents=True)
    (directory / "SKILL.md").write_text(
        f"---\nname: {SKILL_NAME}\ndescription: Doubles a number (test fixture).\n---\n"
        f"Call `{IMPORT_NAME}.run(x)`.\n"
    )
    (package / "__init__.py").write_text("def run(x):\n    return x * 2\n")
    found = discover_in([root])
    assert found.warnings == ()
    (skill_dir,) = found.python_dirs()
    return skill_dir


def _spec(tmp: Path, name: str, skill_dirs: tuple[Path, ...]) -> SandboxSpec:
    return SandboxSpec(
        session_id=f"sk-{name}",
        cwd=workspace(tmp / f"{name}-cwd"),
        artifacts_dir=tmp / f"{name}-art",
        skill_dirs=skill_dirs,
    )


async def _run(sandbox: Any, code: str, cell_id: str) -> Any:
    result = await sandbox.execute(code, timeout_s=CELL_TIMEOUT_S, cell_id=cell_id)
    assert result.status == "ok", result
    return result


# --- local --------------------------------------------------------------------------------


async def test_local_kernel_imports_a_python_skill(tmp_path: Path) -> None:
    skill_dir = make_fixture_skill(tmp_path / "skills")
    backend = LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    try:
        sandbox = await backend.create(_spec(tmp_path, "local", (skill_dir,)))
        assert (await _run(sandbox, IMPORT_CELL, "a")).result == "42"
        where = await _run(sandbox, f"{IMPORT_NAME}.__file__", "b")
        assert where.result == repr(str(skill_dir / IMPORT_NAME / "__init__.py"))
        assert (await _run(sandbox, CHILD_CELL, "c")).stdout.strip() == "8"
    finally:
        await backend.close()


async def test_local_pooled_kernel_gets_the_skill_and_keeps_it_after_a_restart(
    tmp_path: Path,
) -> None:
    skill_dir = make_fixture_skill(tmp_path / "skills")
    backend = LocalBackend(pool_size=1, interrupt_grace_s=GRACE_S)
    try:
        assert backend.pool is not None
        await backend.pool.wait_ready(POOL_READY_TIMEOUT_S)
        sandbox = await backend.create(_spec(tmp_path, "pooled", (skill_dir,)))
        assert backend.pool.statistics().hits == 1  # started before the skill was known
        assert (await _run(sandbox, IMPORT_CELL, "a")).result == "42"
        assert (await _run(sandbox, CHILD_CELL, "b")).stdout.strip() == "8"
        # A restarted pooled kernel starts with the pool's env: the setup puts the skill back.
        await sandbox.restart_kernel()
        assert (await _run(sandbox, IMPORT_CELL, "c")).result == "42"
    finally:
        await backend.close()


async def test_local_refuses_a_missing_skill_dir(tmp_path: Path) -> None:
    missing = tmp_path / "skills" / "gone"
    backend = LocalBackend(pool_size=0)
    try:
        with pytest.raises(SandboxStartError) as info:
            await backend.create(_spec(tmp_path, "missing", (missing,)))
        assert str(info.value) == f"skill directory {missing} does not exist"
    finally:
        await backend.close()


# --- docker -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[None]:
    from orchestrator.errors import UserError
    from orchestrator.sandbox.images import SESSION_IMAGE, docker_client, image_exists, image_hint

    try:
        client = docker_client()
    except UserError as exc:
        need("docker", str(exc))
    if not image_exists(SESSION_IMAGE, client):
        pytest.fail(
            f"Docker answers but the session image {SESSION_IMAGE} is missing: "
            f"{image_hint(SESSION_IMAGE)}"
        )
    yield
    from orchestrator.sandbox.docker import list_owned

    assert not [c for c in list_owned(client) if c.session_id.startswith("sk-")]


def _mounts(backend: Any, sandbox: Any) -> dict[str, dict[str, Any]]:
    attrs = backend.docker.containers.get(sandbox.container_id).attrs
    return {m["Destination"]: m for m in attrs["Mounts"]}


async def test_docker_kernel_imports_a_python_skill_from_a_read_only_mount(
    docker_engine: None, tmp_path: Path
) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    skill_dir = make_fixture_skill(tmp_path / "skills")
    # Writable for everyone on the host: only the read-only mount can refuse the writes below.
    skill_dir.chmod(0o777)
    (skill_dir / IMPORT_NAME).chmod(0o777)
    (skill_dir / IMPORT_NAME / "__init__.py").chmod(0o666)
    inside = f"{CONTAINER_SKILLS_DIR}/{SKILL_NAME}"
    backend = DockerBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    try:
        sandbox = await backend.create(_spec(tmp_path, "docker", (skill_dir,)))
        assert (await _run(sandbox, IMPORT_CELL, "a")).result == "42"
        where = await _run(sandbox, f"{IMPORT_NAME}.__file__", "b")
        assert where.result == repr(f"{inside}/{IMPORT_NAME}/__init__.py")
        assert (await _run(sandbox, CHILD_CELL, "c")).stdout.strip() == "8"
        targets = (f"{inside}/new.txt", f"{inside}/{IMPORT_NAME}/__init__.py")
        write = (
            f"for path in {targets!r}:\n"
            "    try:\n"
            "        open(path, 'a').write('changed')\n"
            "        print('written')\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
        )
        assert (await _run(sandbox, write, "d")).stdout.splitlines() == [
            f"refused {EROFS}",
            f"refused {EROFS}",
        ]
        mount = _mounts(backend, sandbox)[inside]
        assert mount["RW"] is False and mount["Source"] == str(skill_dir)
    finally:
        await backend.close()
    assert not (skill_dir / "new.txt").exists()
    assert (skill_dir / IMPORT_NAME / "__init__.py").read_text() == (
        "def run(x):\n    return x * 2\n"
    )


async def test_docker_pool_containers_mount_the_skills_they_were_started_with(
    docker_engine: None, tmp_path: Path
) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    skill_dir = make_fixture_skill(tmp_path / "skills")
    cwd = workspace(tmp_path / "pool-cwd")
    backend = DockerBackend(pool_size=1, interrupt_grace_s=GRACE_S)
    try:
        backend.start_pool(cwd, skill_dirs=(skill_dir,))
        assert backend.pool is not None
        await backend.pool.wait_ready(POOL_READY_TIMEOUT_S)
        plain = SandboxSpec(session_id="sk-plain", cwd=cwd, artifacts_dir=tmp_path / "plain")
        assert not backend._pool_fits(plain)  # a pooled container mounts skills it has not
        spec = SandboxSpec(
            session_id="sk-pool",
            cwd=cwd,
            artifacts_dir=tmp_path / "pool-art",
            skill_dirs=(skill_dir,),
        )
        sandbox = await backend.create(spec)
        assert backend.pool.statistics().hits == 1
        assert (await _run(sandbox, IMPORT_CELL, "a")).result == "42"
    finally:
        await backend.close()


async def test_docker_refuses_a_missing_skill_dir(docker_engine: None, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend

    missing = tmp_path / "skills" / "gone"
    backend = DockerBackend(pool_size=0)
    try:
        with pytest.raises(SandboxStartError) as info:
            await backend.create(_spec(tmp_path, "missing", (missing,)))
        assert str(info.value) == f"skill directory {missing} does not exist"
    finally:
        await backend.close()
    assert not missing.exists()  # nothing made an empty directory in its place
