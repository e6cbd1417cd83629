"""Sandbox policy against a real Docker Engine: workspace modes, limits, images (docs/docker.md).

- workspace ``ro``: a cell reads the project but cannot write it; ``copy``: the project stays
  untouched while the sandbox runs and gets the sandbox's changes when it stops;
- limits from a session's spec and from Settings reach the container (``docker inspect``);
- the rust image runs cargo (slow: builds the image when missing or stale, ~2 min);
- a cuda build without its base is skipped with one line; with a (fake, local) base it builds
  and a session can run on it by tag (slow: ~40 s).

The local backend's copy and ro behaviour is checked here too (no Docker needed).
Skipped (the docker parts) when no engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.sandbox.base import ResourceLimits, SandboxSpec, WorkspaceMode
from tests.helpers import container_stopped, need, wait_until
from tests.integration.test_sandbox_conformance import SANDBOX_UID, docker_ready, workspace

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(600),
]

GRACE_S = 1.0
KILL_SETTLE_S = 30.0  # a killed container is reported stopped within this bound
MIB = 1024**2
SPEC_MEMORY = 320 * MIB
SPEC_CPUS = 0.5
SPEC_PIDS = 99
SETTINGS_MEMORY_MIB = 288
SETTINGS_PIDS = 77
NANO = 1_000_000_000
FAKE_CUDA_BASE = "prime-agent/test-fake-cuda-base:1"
FAKE_CUDA_IMAGE = "prime-agent/test-session-cuda:fake"
CUDA_DIR = "cuda-12.4"
RUST_CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def docker_image() -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(docker_image: None) -> AsyncIterator[Any]:
    from orchestrator.sandbox.docker import DockerBackend, list_owned

    b = DockerBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    yield b
    await b.close()
    assert not [c for c in list_owned() if c.session_id.startswith("pol-")]


def _project(tmp: Path, name: str) -> Path:
    root = workspace(tmp / f"{name}-project")
    (root / "data.txt").write_text("original\n")
    (root / "src").mkdir()
    (root / "src" / "lib.py").write_text("x = 1\n")
    if os.getuid() == 0:  # the container runs as the project's owner: give it all of it
        for path in root.rglob("*"):
            os.chown(path, SANDBOX_UID, SANDBOX_UID)
    return root


def _spec(tmp: Path, name: str, **policy: Any) -> SandboxSpec:
    return SandboxSpec(
        session_id=f"pol-{name}",
        cwd=_project(tmp, name),
        artifacts_dir=tmp / f"{name}-artifacts",
        **policy,
    )


def _attrs(backend: Any, sandbox: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = backend.docker.containers.get(sandbox.container_id).attrs
    return attrs


# --- workspace modes (docker) ---------------------------------------------------------------------


async def test_workspace_ro_reads_but_cannot_write(backend: Any, tmp_path: Path) -> None:
    mode: WorkspaceMode = "ro"
    spec = _spec(tmp_path, "ro", workspace=mode)
    sb = await backend.create(spec)
    try:
        code = (
            "import os\n"
            f"print(os.getcwd() == {str(spec.cwd)!r}, open('data.txt').read().strip())\n"
            "try:\n"
            "    open('new.txt', 'w').write('x')\n"
            "    print('wrote')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
            "try:\n"
            "    open('data.txt', 'a').write('x')\n"
            "    print('appended')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        r = await sb.execute(code, timeout_s=60, cell_id="ro")
        assert r.status == "ok", r
        assert r.stdout.splitlines() == ["True original", "refused 30", "refused 30"]  # EROFS
        mounts = {m["Destination"]: m for m in _attrs(backend, sb)["Mounts"]}
        assert mounts[str(spec.cwd)]["RW"] is False
    finally:
        await sb.stop()
    assert not (spec.cwd / "new.txt").exists()
    assert (spec.cwd / "data.txt").read_text() == "original\n"


async def test_workspace_copy_syncs_back_at_stop(backend: Any, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "copy", workspace="copy")
    sb = await backend.create(spec)
    try:
        code = (
            "import os, pathlib\n"
            "print(os.getcwd())\n"
            "pathlib.Path('data.txt').write_text('changed by the agent\\n')\n"
            "pathlib.Path('out').mkdir()\n"
            "pathlib.Path('out/result.txt').write_text('42\\n')\n"
            "os.remove('src/lib.py')\n"
        )
        r = await sb.execute(code, timeout_s=60, cell_id="copy")
        assert r.status == "ok", r
        assert r.stdout.strip() == str(spec.cwd)  # the copy sits at the project's own path
        # While the sandbox runs, the project is untouched.
        assert (spec.cwd / "data.txt").read_text() == "original\n"
        assert not (spec.cwd / "out").exists() and (spec.cwd / "src" / "lib.py").exists()
        mounts = {m["Destination"]: m for m in _attrs(backend, sb)["Mounts"]}
        assert mounts[str(spec.cwd)]["Source"] != str(spec.cwd)
        assert mounts[str(spec.cwd)]["RW"] is True
    finally:
        await sb.stop()
    assert (spec.cwd / "data.txt").read_text() == "changed by the agent\n"
    assert (spec.cwd / "out" / "result.txt").read_text() == "42\n"
    assert not (spec.cwd / "src" / "lib.py").exists()
    # The files keep the project owner's ids (the container ran as the project's owner).
    assert (spec.cwd / "out" / "result.txt").stat().st_uid == spec.cwd.stat().st_uid
    report = json.loads((spec.artifacts_dir / "workspace-sync.json").read_text())
    assert report["conflicts"] == [] and "out/result.txt" in report["written"]
    assert not (spec.artifacts_dir / "workspace-copy").exists()


async def test_workspace_copy_survives_a_replaced_container(backend: Any, tmp_path: Path) -> None:
    """A lost container is replaced with the same copy mounted: earlier writes are kept."""
    spec = _spec(tmp_path, "copy-kill", workspace="copy")
    sb = await backend.create(spec)
    try:
        r = await sb.execute("open('before.txt', 'w').write('kept')", timeout_s=60, cell_id="a")
        assert r.status == "ok", r
        killed = sb.container_id
        await asyncio.to_thread(backend.docker.containers.get(killed).kill)
        assert await asyncio.to_thread(
            wait_until, lambda: container_stopped(backend.docker, killed), timeout=KILL_SETTLE_S
        )
        r = await sb.execute("open('before.txt').read()", timeout_s=60, cell_id="b")
        assert r.status == "ok" and r.result == "'kept'" and r.kernel_restarted, r
    finally:
        await sb.stop()
    assert (spec.cwd / "before.txt").read_text() == "kept"


# --- limits ---------------------------------------------------------------------------------------


async def test_spec_limits_reach_the_container(backend: Any, tmp_path: Path) -> None:
    limits = ResourceLimits(memory_bytes=SPEC_MEMORY, cpus=SPEC_CPUS, pids=SPEC_PIDS)
    sb = await backend.create(_spec(tmp_path, "limits", limits=limits))
    try:
        host = _attrs(backend, sb)["HostConfig"]
        assert host["Memory"] == SPEC_MEMORY
        assert host["MemorySwap"] == SPEC_MEMORY  # swap off
        assert host["NanoCpus"] == int(SPEC_CPUS * NANO)
        assert host["PidsLimit"] == SPEC_PIDS
        # ...and the kernel's cgroup enforces it (v1 or v2 path).
        code = (
            "import pathlib\n"
            "v1 = '/sys/fs/cgroup/memory/memory.limit_in_bytes'\n"
            "for p in ('/sys/fs/cgroup/memory.max', v1):\n"
            "    if pathlib.Path(p).exists():\n"
            "        print(pathlib.Path(p).read_text().strip())\n"
        )
        r = await sb.execute(code, timeout_s=60, cell_id="cg")
        assert r.status == "ok" and r.stdout.split() == [str(SPEC_MEMORY)], r
    finally:
        await sb.stop()


async def test_settings_limits_reach_the_container(docker_image: None, tmp_path: Path) -> None:
    from orchestrator.sandbox.docker import DockerBackend
    from orchestrator.settings import SandboxSettings, Settings

    settings = Settings(
        sandbox=SandboxSettings(memory_mib=SETTINGS_MEMORY_MIB, pids_limit=SETTINGS_PIDS),
        warm_pool_size=0,
    )
    b = DockerBackend.from_settings(settings)
    try:
        sb = await b.create(_spec(tmp_path, "settings"))
        host = _attrs(b, sb)["HostConfig"]
        assert host["Memory"] == SETTINGS_MEMORY_MIB * MIB
        assert host["PidsLimit"] == SETTINGS_PIDS
        # A session's own limits win over the settings' (one field; the rest stays).
        sb2 = await b.create(
            _spec(tmp_path, "settings-spec", limits=ResourceLimits(memory_bytes=SPEC_MEMORY))
        )
        host2 = _attrs(b, sb2)["HostConfig"]
        assert (host2["Memory"], host2["PidsLimit"]) == (SPEC_MEMORY, SETTINGS_PIDS)
    finally:
        await b.close()


# --- images ---------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_rust_image_runs_cargo(backend: Any, tmp_path: Path) -> None:
    from orchestrator.sandbox.images import ensure_image

    built = await asyncio.to_thread(ensure_image, "rust")  # ~2 min when missing or stale
    assert built.tag == "prime-agent/session-rust:latest"
    sb = await backend.create(_spec(tmp_path, "rust", image="rust"))
    try:
        code = (
            "import subprocess\n"
            "v = subprocess.run(['cargo', '--version'], capture_output=True, text=True)\n"
            "print(v.returncode, v.stdout.split()[0])\n"
            "subprocess.run(['cargo', 'new', '--vcs', 'none', '--quiet', 'hello'], check=True)\n"
            "b = subprocess.run(['cargo', 'run', '--quiet'], cwd='hello', capture_output=True,\n"
            "                   text=True)\n"
            "print(b.returncode, b.stdout.strip(), b.stderr[-300:])\n"
        )
        r = await sb.execute(code, timeout_s=RUST_CELL_TIMEOUT_S, cell_id="cargo")
        assert r.status == "ok", r
        lines = r.stdout.splitlines()
        assert lines[0] == "0 cargo", r.stdout
        assert lines[1].startswith("0 Hello, world!"), r.stdout
    finally:
        await sb.stop()
    assert (tmp_path / "rust-project" / "hello" / "target").is_dir()


async def test_cuda_build_without_its_base_is_skipped(docker_image: None) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    result = CliRunner().invoke(
        app, ["images", "build", "cuda", "--base", "prime-agent/test-no-such-cuda:0", "--no-pull"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "skipped" in lines[0] and "test-no-such-cuda" in lines[0]


@pytest.fixture
def fake_cuda_base(docker_image: None, tmp_path: Path) -> Iterator[str]:
    """A tiny local image shaped like nvidia/cuda: /usr/local/cuda-X.Y, and /usr/local/cuda
    linked through /etc/alternatives (which a COPY --from does not bring along)."""
    import subprocess

    ctx = tmp_path / "fake-cuda"
    ctx.mkdir()
    version = b'{"cuda": {"version": "12.4.1"}}\n'
    with tarfile.open(ctx / "rootfs.tar", "w") as tar:  # ADD unpacks it, links and all
        for name in ("usr", "usr/local", f"usr/local/{CUDA_DIR}", f"usr/local/{CUDA_DIR}/bin"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        info = tarfile.TarInfo(f"usr/local/{CUDA_DIR}/version.json")
        info.size, info.mode = len(version), 0o644
        tar.addfile(info, io.BytesIO(version))
        info = tarfile.TarInfo("usr/local/cuda")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/alternatives/cuda"
        tar.addfile(info)
    (ctx / "Dockerfile").write_text("FROM scratch\nADD rootfs.tar /\n")
    subprocess.run(["docker", "build", "-q", "-t", FAKE_CUDA_BASE, str(ctx)], check=True)
    yield FAKE_CUDA_BASE
    for tag in (FAKE_CUDA_IMAGE, FAKE_CUDA_BASE):
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.mark.slow  # ~40 s: a docker build on fuse-overlayfs
async def test_cuda_image_builds_on_a_local_base(
    backend: Any, fake_cuda_base: str, tmp_path: Path
) -> None:
    from orchestrator.sandbox.images import build_image

    result = await asyncio.to_thread(
        build_image, "cuda", base=fake_cuda_base, pull=False, tag=FAKE_CUDA_IMAGE
    )
    assert result.built, result
    sb = await backend.create(_spec(tmp_path, "cuda", image=FAKE_CUDA_IMAGE))  # a custom tag
    try:
        code = (
            "import os, json\n"
            "print(json.load(open('/usr/local/cuda/version.json'))['cuda']['version'])\n"
            "print(os.path.realpath('/usr/local/cuda'))\n"
        )
        r = await sb.execute(code, timeout_s=60, cell_id="cuda")
        assert r.status == "ok", r
        assert r.stdout.split() == ["12.4.1", f"/usr/local/{CUDA_DIR}"]
        assert _attrs(backend, sb)["Config"]["Image"] == FAKE_CUDA_IMAGE
    finally:
        await sb.stop()


async def test_missing_image_is_one_clear_error(backend: Any, tmp_path: Path) -> None:
    from orchestrator.errors import SandboxStartError

    with pytest.raises(SandboxStartError, match="is missing"):
        await backend.create(_spec(tmp_path, "noimage", image="prime-agent/test-absent:0"))


# --- the local backend ----------------------------------------------------------------------------


async def test_local_copy_mode_runs_in_a_copy_and_syncs_back(tmp_path: Path) -> None:
    from orchestrator.sandbox.local import LocalBackend

    b = LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S, workspace_mode="copy")
    spec = _spec(tmp_path, "local-copy")
    try:
        sb = await b.create(spec)
        r = await sb.execute(
            "import os; open('made.txt', 'w').write('agent'); print(os.getcwd())",
            timeout_s=60,
            cell_id="a",
        )
        assert r.status == "ok", r
        # A plain process cannot see the copy at the project's path: it runs in the copy's.
        assert r.stdout.strip() == str(spec.artifacts_dir / "workspace-copy")
        assert not (spec.cwd / "made.txt").exists()
        await sb.stop()
        assert (spec.cwd / "made.txt").read_text() == "agent"
    finally:
        await b.close()


async def test_local_ro_mode_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.sandbox.local import LocalBackend
    from orchestrator.sandbox.workspace import LOCAL_RO_WARNING

    b = LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    try:
        with caplog.at_level(logging.WARNING, logger="orchestrator.sandbox.workspace"):
            for name in ("local-ro-1", "local-ro-2"):
                sb = await b.create(_spec(tmp_path, name, workspace="ro"))
                with contextlib.suppress(Exception):
                    await sb.stop()
        assert [r.getMessage() for r in caplog.records].count(LOCAL_RO_WARNING) == 1
    finally:
        await b.close()


# --- GPUs (the cuda image) ------------------------------------------------------------------------


async def test_gpu_requests_follow_the_setting() -> None:
    from pydantic import ValidationError

    from orchestrator.sandbox.docker_run import GPU_COUNT_ALL, gpu_requests
    from orchestrator.settings import SandboxSettings

    assert gpu_requests("") == []
    (every,) = gpu_requests("all")
    assert every["Count"] == GPU_COUNT_ALL and every["Capabilities"] == [["gpu"]]
    assert gpu_requests("2")[0]["Count"] == 2
    for bad in ("0", "some", "-1"):
        with pytest.raises(ValidationError):
            SandboxSettings(gpus=bad)


async def test_gpus_without_a_gpu_runtime_fail_to_start_with_one_line(
    docker_image: None, tmp_path: Path
) -> None:
    """Where the engine has no GPU runtime (this machine), asking for GPUs is a clear start
    error, and no container is left behind; with one, the same request gives the container
    the GPUs (docker's --gpus)."""
    from orchestrator.errors import SandboxStartError
    from orchestrator.sandbox.docker import DockerBackend, list_owned
    from orchestrator.settings import SandboxSettings, Settings

    if "nvidia" in json.dumps(DockerBackend.from_settings(Settings()).docker.info()):
        pytest.skip("this engine has a GPU runtime: the start would succeed")
    settings = Settings(sandbox=SandboxSettings(gpus="all"), warm_pool_size=0)
    b = DockerBackend.from_settings(settings)
    try:
        with pytest.raises(SandboxStartError) as failed:
            await b.create(_spec(tmp_path, "gpus"))
        assert "\n" not in str(failed.value) and "gpu" in str(failed.value).lower()
        assert not [c for c in list_owned() if c.session_id == "pol-gpus"]
    finally:
        await b.close()
