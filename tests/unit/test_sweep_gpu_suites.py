"""The GPU suites (issue 19): ``gpu-kernel`` and ``nanogpt`` are generated deterministically,
their checkers accept the reference and reject a wrong answer (the kernel checker built for the
host with a C++ compiler: no GPU needed), a timed score follows the gate's measurement, and a
cell whose task needs what this machine lacks is found, with one line of why, before it runs."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import UserError
from orchestrator.sandbox.gpu import (
    GPUS_NOT_SET,
    NO_GPU_RUNTIME,
    POD_GPUS_NOT_SET,
    gpu_unavailable_reason,
)
from orchestrator.sandbox.images import CUDA_BASE_DEFAULT, CUDA_OFFLINE, cuda_plan
from orchestrator.settings import Settings
from orchestrator.sweeps.grid import expand
from orchestrator.sweeps.runnable import Machine, cannot_run, report_lines, unrunnable
from orchestrator.sweeps.scoring import (
    TIMED_RESULT_FILE,
    TimedResult,
    read_timed_result,
    score,
)
from orchestrator.sweeps.spec import SweepFile
from orchestrator.sweeps.suites import generate, gpu_kernel, nanogpt
from orchestrator.sweeps.suites.gpu_kernel_check import OPS, Op, check_source
from orchestrator.sweeps.suites.haystack import rng_for
from orchestrator.sweeps.suites.nanogpt_files import VOCAB, split_corpus
from orchestrator.sweeps.tasks import Task

CXX = shutil.which("g++") or shutil.which("c++")
HOST_SOLVE = ("-x", "c++", "solve.cpp")
SMALL: tuple[int, int, int] = (48, 40, 24)  # sizes the host build checks in well under a second


# --- generation ---------------------------------------------------------------------------------


def test_gpu_kernel_tasks_are_deterministic_gated_and_need_a_gpu() -> None:
    first = generate("gpu-kernel", 6, None, seed=3)
    assert [t.content_hash for t in first] == [
        t.content_hash for t in generate("gpu-kernel", 6, None, 3)
    ]
    other = generate("gpu-kernel", 6, None, seed=4)
    assert {t.content_hash for t in first}.isdisjoint(t.content_hash for t in other)
    assert sorted(t.params["op"] for t in first) == sorted(op.name for op in OPS)
    assert len(generate("gpu-kernel", 2, None, seed=3)) == 2
    for task in first:
        assert task.requires == ("gpu",) and task.image == "cuda" and task.scoring == "timed"
        assert set(task.files) == {"kernel.cu", "check.cu", "README.md"}
        # The gate pins the checker: its hash is in the command the agent cannot change.
        digest = hashlib.sha256(task.files["check.cu"].encode()).hexdigest()
        (gate,) = task.gates
        assert digest in gate and "nvcc" in gate and gate.endswith("./.check")
        m, n, k = (task.params[key] for key in "mnk")
        assert task.id == f"gpu-kernel/{task.params['op']}-{m}x{n}x{k}"
        assert f"m = {m}, n = {n}, k = {k}" in task.question


def test_nanogpt_tasks_are_deterministic_and_target_the_entropy_plus_a_margin() -> None:
    (task,) = generate("nanogpt", 1, None, seed=1)
    (again,) = generate("nanogpt", 1, None, seed=1)
    assert task.content_hash == again.content_hash
    two = generate("nanogpt", 2, None, seed=1)
    assert two[0].content_hash == task.content_hash != two[1].content_hash
    assert task.requires == ("gpu", "torch") and task.image == "cuda"
    config = json.loads(task.files["speedrun.json"])
    assert config["target_val_loss"] == task.params["target_val_loss"]
    assert math.isclose(
        config["target_val_loss"], config["entropy_per_char"] + nanogpt.MARGIN, abs_tol=2e-3
    )
    (gate,) = task.gates
    for name in ("check_speedrun.py", "data/val.txt"):
        assert hashlib.sha256(task.files[name].encode()).hexdigest() in gate
    assert set("".join(task.files[f] for f in ("data/train.txt", "data/val.txt"))) <= set(VOCAB)


def test_the_nanogpt_language_is_what_its_entropy_counts() -> None:
    train, val, entropy = split_corpus(rng_for("t", 1), 20_000, 5_000)
    forms = [
        r"the [a-z]+ [a-z]+ [a-z]+s [2-9] [a-z]+s\.",
        r"[2-9] [a-z]+ [a-z]+s [a-z]+ the [a-z]+\.",
        r"(\d+)\+(\d+)=(\d+)\.",
        r"([a-z]+) has a ([a-z]+) ([a-z]+), so \1's \3 is \2\.",
    ]
    for line in (train + val).splitlines():
        found = [re.fullmatch(form, line) for form in forms]
        assert any(found), line
        if found[2]:
            a, b, total = (int(g) for g in found[2].groups())
            assert a + b == total
    # Bounded by what a sentence's choices can carry: far from 0 and from log(len(VOCAB)).
    assert 0.2 < entropy < 0.6
    assert split_corpus(rng_for("t", 1), 20_000, 5_000) == (train, val, entropy)


def test_new_task_fields_leave_the_old_fingerprints_alone() -> None:
    task = Task("s", "s/1", "q", "ctx", "7", "contains", {"context_tokens": 8})
    legacy = {
        "suite": "s",
        "id": "s/1",
        "question": "q",
        "context": hashlib.sha256(b"ctx").hexdigest(),
        "expected": "7",
        "scoring": "contains",
        "params": {"context_tokens": 8},
        "files": {},
        "gates": [],
    }
    text = json.dumps(legacy, sort_keys=True, separators=(",", ":"))
    assert task.content_hash == hashlib.sha256(text.encode()).hexdigest()
    needs = Task("s", "s/1", "q", "ctx", "7", "contains", {"context_tokens": 8}, requires=("gpu",))
    assert needs.content_hash != task.content_hash
    imaged = Task("s", "s/1", "q", "ctx", "7", "contains", {"context_tokens": 8}, image="cuda")
    assert len({task.content_hash, needs.content_hash, imaged.content_hash}) == 3


# --- the kernel checker, built for the host ----------------------------------------------------


def _host_solve(op: Op, extra: str = "") -> str:
    """``solve`` as a host function: the op's naive kernel body run once per thread index."""
    return f"""#include <math.h>
#include <stddef.h>
struct dim_ {{ unsigned x; }};
static dim_ blockIdx, blockDim, threadIdx;
static inline float rsqrtf(float v) {{ return 1.f / sqrtf(v); }}
static void body(const float* x, const float* w, float* y, int m, int n, int k) {{
    (void)w; (void)k;{op.naive}
}}
extern "C" void solve(const float* x, const float* w, float* y, int m, int n, int k) {{
    size_t threads = {op.naive_threads};
    blockIdx.x = 0;
    blockDim.x = 1;
    for (size_t t = 0; t < threads; ++t) {{
        threadIdx.x = (unsigned)t;
        body(x, w, y, m, n, k);
    }}
    {extra}
}}
"""


def _check_on_host(tmp_path: Path, op: Op, solve: str) -> tuple[int, str, dict[str, Any] | None]:
    assert CXX is not None
    (tmp_path / "check.cu").write_text(check_source(op, SMALL, 11, TIMED_RESULT_FILE))
    (tmp_path / "solve.cpp").write_text(solve)
    built = subprocess.run(
        [CXX, "-O1", "-DCHECK_ON_HOST", "-x", "c++", "check.cu", *HOST_SOLVE, "-o", "check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    (tmp_path / TIMED_RESULT_FILE).write_text("stale")  # the checker removes what it did not write
    ran = subprocess.run(["./check"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    result = tmp_path / TIMED_RESULT_FILE
    return ran.returncode, ran.stdout, json.loads(result.read_text()) if result.exists() else None


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_the_kernel_checker_accepts_the_reference_and_rejects_a_wrong_kernel(
    tmp_path: Path, op: Op
) -> None:
    code, out, result = _check_on_host(tmp_path, op, _host_solve(op))
    assert code == 0, out
    assert "your solve: correct" in out
    assert result is not None and result["op"] == op.name
    assert result["seconds"] >= 0 and result["reference_s"] > 0

    # One element off by 1: rejected, and nothing is left to score.
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    code, out, result = _check_on_host(wrong, op, _host_solve(op, "y[0] += 1.0f;"))
    assert code == 1 and "your solve: WRONG: element 0" in out and result is None


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_the_starter_kernel_does_not_pass(tmp_path: Path) -> None:
    # The starter writes nothing: y keeps the checker's NaN poison.
    starter = gpu_kernel.STARTER.replace("#include <cuda_runtime.h>\n", "")
    code, out, result = _check_on_host(tmp_path, OPS[0], starter)
    assert code == 1 and "WRONG" in out and result is None


# --- timed scoring ------------------------------------------------------------------------------


def test_a_timed_task_scores_by_the_measured_time_only_when_its_gate_passed(
    tmp_path: Path,
) -> None:
    (task,) = generate("gpu-kernel", 1, None, seed=1)
    assert read_timed_result(tmp_path) is None
    (tmp_path / TIMED_RESULT_FILE).write_text(json.dumps({"seconds": 0.5, "reference_s": 2.0}))
    timed = read_timed_result(tmp_path)
    assert timed == TimedResult(0.5, 2.0)
    assert score(task, "", "gate_passed", timed=timed) == pytest.approx(0.8)
    assert score(task, "", "gate_passed", timed=TimedResult(2.0, 2.0)) == pytest.approx(0.5)
    assert score(task, "", "max_turns", timed=timed) == 0.0
    assert score(task, "", "gate_passed", timed=None) == 0.0
    for bad in ("{", '{"seconds": -1, "reference_s": 1}', '{"seconds": 1, "reference_s": 0}'):
        (tmp_path / TIMED_RESULT_FILE).write_text(bad)
        assert read_timed_result(tmp_path) is None
    (tmp_path / TIMED_RESULT_FILE).write_text('{"seconds": NaN, "reference_s": 1}')
    assert read_timed_result(tmp_path) is None


# --- can this machine run it? -------------------------------------------------------------------


def _settings(gpus: str = "") -> Settings:
    return Settings.model_validate({"sandbox": {"gpus": gpus}})


def _info(runtimes: Mapping[str, Any]) -> Any:
    return lambda: {"Runtimes": runtimes, "DefaultRuntime": "runc"}


def _no_hooks(name: str) -> str | None:
    return None


def test_a_gpu_is_available_only_through_docker_with_the_nvidia_runtime_and_gpus_set() -> None:
    nvidia = _info({"runc": {}, "nvidia": {}})
    plain = _info({"runc": {}})
    assert gpu_unavailable_reason(_settings("all"), info=nvidia, which=_no_hooks) is None
    assert gpu_unavailable_reason(_settings("all"), info=plain, which=_no_hooks) == NO_GPU_RUNTIME
    # The toolkit's hook on this host serves --gpus without a registered runtime.
    hook = gpu_unavailable_reason(_settings("1"), info=plain, which=lambda n: f"/usr/bin/{n}")
    assert hook is None
    assert gpu_unavailable_reason(_settings(), info=nvidia, which=_no_hooks) == GPUS_NOT_SET
    assert gpu_unavailable_reason(_settings(), gpus="all", info=nvidia, which=_no_hooks) is None
    for backend in ("bwrap", "local"):
        why = gpu_unavailable_reason(_settings("all"), backend=backend, info=nvidia)
        assert why == f"the backend is {backend}: GPUs need docker"

    # On kubernetes the pods ask the cluster: only whether they ask for GPUs is known here.
    assert gpu_unavailable_reason(_settings(), backend="kubernetes", info=plain) == (
        POD_GPUS_NOT_SET
    )
    on_cluster = Settings.model_validate({"kubernetes": {"gpus": 1}})
    assert gpu_unavailable_reason(on_cluster, backend="kubernetes", info=plain) is None

    def down() -> Mapping[str, Any]:
        raise UserError("Docker is not reachable: no socket")

    assert (
        gpu_unavailable_reason(_settings("all"), info=down) == "Docker is not reachable: no socket"
    )


def test_the_cells_a_machine_cannot_run_are_found_once_per_task_and_reported_by_reason() -> None:
    spec = SweepFile.model_validate(
        {
            "name": "mixed",
            "suites": [
                {"suite": "gpu-kernel", "tasks": 2},
                {"suite": "nanogpt", "tasks": 1},
                {"suite": "s-niah", "tasks": 1, "context_tokens": [600]},
            ],
            "models": ["openai/a", "openai/b"],
        }
    )
    cells = expand(spec)
    asked: list[str] = []

    def gpu() -> str | None:
        asked.append("gpu")
        return NO_GPU_RUNTIME

    machine = Machine(_settings(), gpu=gpu, image_here=lambda image: None)
    reasons = unrunnable(cells, lambda task: cannot_run(task, machine))
    assert asked == ["gpu"]  # asked once for the whole sweep
    held = [c for c in cells if c.fingerprint in reasons]
    assert {c.task.suite for c in held} == {"gpu-kernel", "nanogpt"} and len(held) == 6
    assert set(reasons.values()) == {f"needs a GPU: {NO_GPU_RUNTIME}"}
    (line,) = report_lines("mixed", cells, reasons)
    first = min(c.task.id for c in held)
    assert line == (
        f"sweep mixed: 6 cell(s) cannot run here: {first} (and 2 more task(s)): "
        f"needs a GPU: {NO_GPU_RUNTIME}"
    )

    # With a GPU: the image comes next, then PyTorch in it.
    no_image = Machine(_settings(), gpu=lambda: None, image_here=lambda i: f"{i} is not here")
    kernel = next(c.task for c in cells if c.task.suite == "gpu-kernel")
    assert cannot_run(kernel, no_image) == "needs the image cuda: cuda is not here"
    no_torch = Machine(
        _settings(), gpu=lambda: None, image_here=lambda i: None, torch_in=lambda i: "built without"
    )
    speedrun = next(c.task for c in cells if c.task.suite == "nanogpt")
    assert cannot_run(kernel, no_torch) is None
    assert cannot_run(speedrun, no_torch) == "needs PyTorch: built without"
    niah = next(c.task for c in cells if c.task.suite == "s-niah")
    assert cannot_run(niah, Machine(_settings(), gpu=gpu)) is None
    # On kubernetes neither the local engine's images nor their labels are asked.
    cluster = Machine(_settings(), backend="kubernetes", gpu=lambda: None)
    assert cannot_run(kernel, cluster) is None and cannot_run(speedrun, cluster) is None


# --- which cuda build ---------------------------------------------------------------------------


def test_the_cuda_build_is_offline_unless_a_cuda_base_is_given_or_here() -> None:
    nothing: set[str] = set()

    def never(image: str) -> tuple[bool, str]:
        raise AssertionError("no pull expected")

    assert cuda_plan(None, pull=True, exists=nothing.__contains__, pullable=never).base is None
    here = {CUDA_BASE_DEFAULT}.__contains__
    assert cuda_plan(None, pull=True, exists=here, pullable=never).base == CUDA_BASE_DEFAULT
    assert cuda_plan(CUDA_OFFLINE, pull=True, exists=here, pullable=never).base is None
    skipped = cuda_plan("x/cuda:1", pull=False, exists=nothing.__contains__, pullable=never)
    assert skipped.skip == "the CUDA base x/cuda:1 is not here (pulling is off)"
    failed = cuda_plan(
        "x/cuda:1", pull=True, exists=nothing.__contains__, pullable=lambda i: (False, "no host")
    )
    assert failed.skip == "the CUDA base x/cuda:1 is not here (no host)"
    pulled = cuda_plan(
        "x/cuda:1", pull=True, exists=nothing.__contains__, pullable=lambda i: (True, "")
    )
    assert pulled.base == "x/cuda:1" and not pulled.skip
