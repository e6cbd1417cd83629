"""``gpu-kernel``: write a CUDA kernel, gated on correctness against a reference and timed.

Each task is one operation (``gpu_kernel_check.OPS``: softmax, layernorm, matmul, rowsum,
transpose, GELU) at sizes the seed picks. The workspace holds ``kernel.cu`` (a ``solve``
that does nothing yet), ``check.cu`` (the checker: host reference in double precision, the
suite's naive kernel, CUDA-event timing) and a README. The gate (autonomous mode) checks
``check.cu``'s hash — the agent cannot loosen the check —, builds both with ``nvcc`` and runs
the checker in the sandbox; it passes only when ``solve`` is correct for every element.
Scoring ``timed``: ``naive / (naive + solve)`` of one launch each, measured in the same run
(0.5 as fast as the naive kernel, 0.8 four times faster; docs/sweeps.md).

The task runs in the ``cuda`` image (``nvcc``; docs/images.md) and needs a GPU
(``requires=("gpu",)``): on a machine without one the runner reports the cells and does not
start them. ``tasks`` takes the first operations (at most ``len(OPS)``), ``seed`` orders them
and picks each one's size; context lengths do not apply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from orchestrator.sweeps.scoring import TIMED_RESULT_FILE
from orchestrator.sweeps.suites.gpu_kernel_check import OPS, check_source
from orchestrator.sweeps.suites.haystack import rng_for
from orchestrator.sweeps.tasks import Task

__all__ = ["BUILD", "GATE_TIMEOUT_S", "IMAGE", "PROMPT", "SUITE", "gate_command", "generate"]

SUITE: Final = "gpu-kernel"
IMAGE: Final = "cuda"
CHECK_FILE: Final = "check.cu"
KERNEL_FILE: Final = "kernel.cu"
# -arch=native: code for the GPU the sandbox was given (nvcc >= 11.6; Debian's is 11.8).
BUILD: Final = f"nvcc -O3 -arch=native -o .check {CHECK_FILE} {KERNEL_FILE}"
# Building, the host reference (a 1024³ product in double takes seconds) and the timing.
GATE_TIMEOUT_S: Final = 600.0
PROMPT: Final = (
    "Write a fast CUDA kernel. In `{kernel}`, implement `solve(x, w, y, m, n, k)` so that it "
    "computes {task}, with m = {m}, n = {n}, k = {k}. x, w and y are device pointers (w is "
    "NULL when unused); launch your kernel(s) on the default stream. The gate builds and runs "
    "the checker: `{build} && ./.check`. It must report your solve correct (within {rtol} "
    "relative / {atol} absolute of a double-precision reference); then your score grows with "
    "the speed-up over the checker's naive kernel. Do not edit `{check}`."
)
STARTER: Final = """\
// Implement solve() (see README.md). x, w and y are device pointers; w is NULL when the
// operation has one input. Launch your kernel(s) on the default stream.
#include <cuda_runtime.h>

extern "C" void solve(const float* x, const float* w, float* y, int m, int n, int k) {
    (void)x; (void)w; (void)y; (void)m; (void)n; (void)k;
}
"""


def gate_command(check_text: str) -> str:
    """The gate: ``check.cu`` unchanged (its hash is part of the command), then build and run."""
    digest = hashlib.sha256(check_text.encode()).hexdigest()
    return f"printf '%s  {CHECK_FILE}\\n' {digest} | sha256sum -c --quiet - && {BUILD} && ./.check"


def generate(tasks: int, context_tokens: Sequence[int] | None, seed: int) -> list[Task]:
    from orchestrator.sweeps.suites.gpu_kernel_check import ATOL, RTOL

    rng = rng_for(SUITE, seed)
    ops = list(OPS)
    if seed:
        rng.shuffle(ops)
    out: list[Task] = []
    for op in ops[:tasks]:
        size = rng.choice(op.sizes)
        m, n, k = size
        data_seed = rng.randrange(1, 2**32)
        check = check_source(op, size, data_seed, TIMED_RESULT_FILE)
        prompt = PROMPT.format(
            kernel=KERNEL_FILE,
            task=op.task,
            m=m,
            n=n,
            k=k,
            build=BUILD,
            rtol=RTOL,
            atol=ATOL,
            check=CHECK_FILE,
        )
        out.append(
            Task(
                suite=SUITE,
                id=f"{SUITE}/{op.name}-{m}x{n}x{k}",
                question=prompt,
                context="",
                expected=None,
                scoring="timed",
                params={"op": op.name, "m": m, "n": n, "k": k, "gate_timeout_s": GATE_TIMEOUT_S},
                files={KERNEL_FILE: STARTER, CHECK_FILE: check, "README.md": prompt + "\n"},
                gates=(gate_command(check),),
                requires=("gpu",),
                image=IMAGE,
            )
        )
    return out
