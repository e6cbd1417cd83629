"""The cuda image as the GPU suites use it (docs/images.md, docs/sweeps.md): ``nvcc`` builds
every gpu-kernel gate; without a device the checker stops at its first CUDA call with the CUDA
error; with PyTorch in the image the nanogpt baseline and checker run (on the CPU here, at a
toy size and a loose target).

Only where the cuda image is already built and current: building it downloads gigabytes (the
Debian toolkit; PyTorch's CUDA wheels), which the tests never do (``prime-agent images build
cuda [--torch torch]`` does). Marked ``slow``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.sandbox.images import (
    SOURCE_HASH_LABEL,
    TORCH_LABEL,
    docker_client,
    image_exists,
    image_label,
    image_tag,
    source_hash,
)
from orchestrator.sweeps.scoring import TIMED_RESULT_FILE
from orchestrator.sweeps.suites import generate
from orchestrator.sweeps.suites.nanogpt_files import check_script

pytestmark = pytest.mark.slow

TAG = image_tag("cuda")
RUN_TIMEOUT_S = 600
# No network, no GPU; MAX_STEPS: the nanogpt baseline's steps (a toy run on the CPU).
DOCKER_RUN = ("docker", "run", "--rm", "--network", "none", "-e", "MAX_STEPS=20")


def _skip_unless_built() -> None:
    try:
        client = docker_client()
    except UserError as exc:
        pytest.skip(str(exc))
    if not image_exists(TAG, client):
        pytest.skip(f"{TAG} is not built (prime-agent images build cuda; gigabytes)")
    if image_label(TAG, SOURCE_HASH_LABEL, client) != source_hash("cuda"):
        pytest.skip(f"{TAG} is stale (prime-agent images build cuda)")


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o777 if path.is_dir() else 0o666)  # the sandbox user writes here


def _run(workdir: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DOCKER_RUN, "-v", f"{workdir}:/w", "-w", "/w", TAG, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def test_nvcc_builds_every_kernel_gate_and_the_checker_needs_a_device(tmp_path: Path) -> None:
    _skip_unless_built()
    work = tmp_path / "work"  # tmp_path holds the test's XDG directories too
    tasks = generate("gpu-kernel", 6, None, seed=1)
    for task in tasks:
        _files(work / str(task.params["op"]), {**task.files, "gate.sh": task.gates[0]})
    ran = _run(
        work,
        "nvcc --version | tail -n 1; for d in */; do (cd $d && bash gate.sh > out 2>&1; "
        'echo "$d $? $(tail -n 1 out)"); done',
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("Build cuda_11.8")
    # Built (the hash matched, nvcc compiled and linked): the checker ran and, with no GPU
    # given to the container, stopped at its first CUDA call.
    assert len(lines) == 1 + len(tasks), ran.stdout
    for line in lines[1:]:
        _, code, last = line.split(" ", 2)
        assert code == "2" and "cudaMalloc" in last, line


def test_the_nanogpt_baseline_and_checker_run_where_the_image_has_pytorch(
    tmp_path: Path,
) -> None:
    _skip_unless_built()
    if not image_label(TAG, TORCH_LABEL):
        pytest.skip(f"{TAG} was built without PyTorch (prime-agent images build cuda --torch)")
    (task,) = generate("nanogpt", 1, None, seed=1)
    loose = check_script(10.0, 120.0, 500.0, TIMED_RESULT_FILE)
    work = tmp_path / "work"
    _files(work, {**task.files, "check_loose.py": loose})
    ran = _run(work, "python -W ignore check_loose.py")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "check: validation loss" in ran.stdout
    assert (work / TIMED_RESULT_FILE).exists()
