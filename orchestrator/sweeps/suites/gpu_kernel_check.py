"""The ``gpu-kernel`` suite's checker: ``check.cu``, a CUDA program written into the trial's
workspace and run as its gate (``gpu_kernel.py``).

It fills the inputs from a seeded LCG, computes the reference on the host in double precision,
runs the agent's ``solve`` (``kernel.cu``) and the suite's naive kernel on the device, compares
each with the reference (``|y - ref| <= ATOL + RTOL * |ref|`` for every element; a NaN fails),
times both (``REPS`` launches after ``WARMUP``, CUDA events), and, when the agent's output is
correct, writes ``{"seconds": ..., "reference_s": ...}`` (one launch each) to the timed-result
file the runner scores (``sweeps/scoring.py``). Exit status 0 only when it is correct.

Built with ``-DCHECK_ON_HOST`` by a plain C++ compiler it needs no CUDA: device memory is host
memory, ``solve`` is a host function and the naive kernel is the reference itself, so the
comparison and the report can be tested without a GPU (tests/unit/test_sweep_gpu_suites.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Final

__all__ = ["ATOL", "OPS", "REPS", "RTOL", "WARMUP", "Op", "check_source"]

RTOL: Final = 1e-3
ATOL: Final = 1e-4
WARMUP: Final = 3
REPS: Final = 20


@dataclass(frozen=True)
class Op:
    """One kernel task: what ``solve`` computes, its sizes, the host reference (the body of
    ``reference(x, w, ref, m, n, k)``, writing doubles) and the naive device kernel (the body
    of ``naive(x, w, y, m, n, k)``, one thread per ``naive_threads`` item)."""

    name: str
    task: str  # what solve(x, w, y, m, n, k) must compute, for the prompt
    sizes: tuple[tuple[int, int, int], ...]  # (m, n, k) choices; the seed picks one
    x_len: str  # C expressions in m, n, k
    w_len: str  # "0": no second input
    y_len: str
    reference: str
    naive: str
    naive_threads: str  # how many threads the naive kernel is launched with


OPS: Final[tuple[Op, ...]] = (
    Op(
        name="softmax",
        task="the softmax of each row of x (m rows of n floats) into y (m × n)",
        sizes=((4096, 1024, 0), (8192, 2048, 0), (4096, 4096, 0)),
        x_len="(size_t)m * n",
        w_len="0",
        y_len="(size_t)m * n",
        reference="""
    for (int r = 0; r < m; ++r) {
        const float* row = x + (size_t)r * n;
        double top = row[0], sum = 0.0;
        for (int c = 1; c < n; ++c) top = row[c] > top ? row[c] : top;
        for (int c = 0; c < n; ++c) sum += exp((double)row[c] - top);
        for (int c = 0; c < n; ++c) ref[(size_t)r * n + c] = exp((double)row[c] - top) / sum;
    }""",
        naive="""
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const float* row = x + (size_t)r * n;
    float top = row[0], sum = 0.f;
    for (int c = 1; c < n; ++c) top = fmaxf(top, row[c]);
    for (int c = 0; c < n; ++c) sum += expf(row[c] - top);
    for (int c = 0; c < n; ++c) y[(size_t)r * n + c] = expf(row[c] - top) / sum;""",
        naive_threads="m",
    ),
    Op(
        name="layernorm",
        task="each row of x (m rows of n floats) normalised to mean 0 and variance 1 "
        "(y = (x - mean) / sqrt(var + 1e-5), the population variance) into y (m × n)",
        sizes=((4096, 1024, 0), (8192, 2048, 0), (4096, 4096, 0)),
        x_len="(size_t)m * n",
        w_len="0",
        y_len="(size_t)m * n",
        reference="""
    for (int r = 0; r < m; ++r) {
        const float* row = x + (size_t)r * n;
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < n; ++c) mean += row[c];
        mean /= n;
        for (int c = 0; c < n; ++c) var += ((double)row[c] - mean) * ((double)row[c] - mean);
        var /= n;
        for (int c = 0; c < n; ++c) ref[(size_t)r * n + c] = (row[c] - mean) / sqrt(var + 1e-5);
    }""",
        naive="""
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const float* row = x + (size_t)r * n;
    float mean = 0.f, var = 0.f;
    for (int c = 0; c < n; ++c) mean += row[c];
    mean /= n;
    for (int c = 0; c < n; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= n;
    for (int c = 0; c < n; ++c) y[(size_t)r * n + c] = (row[c] - mean) * rsqrtf(var + 1e-5f);""",
        naive_threads="m",
    ),
    Op(
        name="matmul",
        task="the matrix product y = x · w of x (m × k floats, row-major) and w (k × n, "
        "row-major) into y (m × n, row-major)",
        sizes=((1024, 1024, 1024), (2048, 1024, 512), (1024, 2048, 1024)),
        x_len="(size_t)m * k",
        w_len="(size_t)k * n",
        y_len="(size_t)m * n",
        reference="""
    for (size_t i = 0; i < (size_t)m * n; ++i) ref[i] = 0.0;
    for (int r = 0; r < m; ++r)
        for (int j = 0; j < k; ++j) {
            double a = x[(size_t)r * k + j];
            const float* wrow = w + (size_t)j * n;
            double* out = ref + (size_t)r * n;
            for (int c = 0; c < n; ++c) out[c] += a * wrow[c];
        }""",
        naive="""
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)m * n) return;
    int r = i / n, c = i % n;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += x[(size_t)r * k + j] * w[(size_t)j * n + c];
    y[i] = acc;""",
        naive_threads="(size_t)m * n",
    ),
    Op(
        name="rowsum",
        task="the sum of each row of x (m rows of n floats) into y (m floats)",
        sizes=((8192, 1024, 0), (16384, 4096, 0), (4096, 8192, 0)),
        x_len="(size_t)m * n",
        w_len="0",
        y_len="(size_t)m",
        reference="""
    for (int r = 0; r < m; ++r) {
        double sum = 0.0;
        for (int c = 0; c < n; ++c) sum += x[(size_t)r * n + c];
        ref[r] = sum;
    }""",
        naive="""
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    float sum = 0.f;
    for (int c = 0; c < n; ++c) sum += x[(size_t)r * n + c];
    y[r] = sum;""",
        naive_threads="m",
    ),
    Op(
        name="transpose",
        task="the transpose of x (m × n floats, row-major) into y (n × m, row-major)",
        sizes=((4096, 4096, 0), (8192, 2048, 0), (2048, 8192, 0)),
        x_len="(size_t)m * n",
        w_len="0",
        y_len="(size_t)m * n",
        reference="""
    for (int r = 0; r < m; ++r)
        for (int c = 0; c < n; ++c) ref[(size_t)c * m + r] = x[(size_t)r * n + c];""",
        naive="""
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)m * n) return;
    int r = i % m, c = i / m;
    y[(size_t)c * m + r] = x[(size_t)r * n + c];""",
        naive_threads="(size_t)m * n",
    ),
    Op(
        name="gelu",
        task="GELU with the tanh approximation, y = 0.5 x (1 + tanh(0.7978845608 (x + "
        "0.044715 x^3))), of each of the m × n floats of x into y",
        sizes=((4096, 4096, 0), (8192, 4096, 0), (16384, 2048, 0)),
        x_len="(size_t)m * n",
        w_len="0",
        y_len="(size_t)m * n",
        reference="""
    for (size_t i = 0; i < (size_t)m * n; ++i) {
        double v = x[i];
        ref[i] = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    }""",
        naive="""
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)m * n) return;
    float v = x[i];
    y[i] = 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));""",
        naive_threads="(size_t)m * n",
    ),
)

_CHECK: Final = Template(
    r"""// The gpu-kernel checker (prime-agent: sweeps/suites/gpu_kernel_check.py).
// Do not edit: the gate checks this file's hash. Op: $op; m = $m, n = $n, k = $k.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef CHECK_ON_HOST
#include <chrono>
#else
#include <cuda_runtime.h>
#endif

extern "C" void solve(const float* x, const float* w, float* y, int m, int n, int k);

static const int M = $m, N = $n, K = $k;
static const uint32_t SEED = ${seed}u;
static const double RTOL = $rtol, ATOL = $atol;
static const int WARMUP = $warmup, REPS = $reps;
static const char* RESULT_FILE = "$result_file";

static void reference(const float* x, const float* w, double* ref, int m, int n, int k) {
    (void)w; (void)k;$reference
}

#ifdef CHECK_ON_HOST
typedef std::chrono::steady_clock::time_point stamp;
static void* dev_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
static void dev_free(void* p) { free(p); }
static void to_dev(void* d, const void* h, size_t bytes) { memcpy(d, h, bytes); }
static void to_host(void* h, const void* d, size_t bytes) { memcpy(h, d, bytes); }
static void dev_poison(void* d, size_t bytes) { memset(d, 0xff, bytes); }
static int dev_sync(const char* what) { (void)what; return 0; }
static void naive_solve(const float* x, const float* w, float* y, int m, int n, int k) {
    size_t len = $y_len;
    double* ref = (double*)malloc(len * sizeof(double));
    reference(x, w, ref, m, n, k);
    for (size_t i = 0; i < len; ++i) y[i] = (float)ref[i];
    free(ref);
}
static double time_ms(void (*fn)(const float*, const float*, float*, int, int, int),
                      const float* x, const float* w, float* y) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < REPS; ++i) fn(x, w, y, M, N, K);
    std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    return took.count() / REPS;
}
#else
static void* dev_alloc(size_t bytes) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        fprintf(stderr, "check: cudaMalloc of %zu bytes: %s\n", bytes, cudaGetErrorString(err));
        exit(2);
    }
    return p;
}
static void dev_free(void* p) { cudaFree(p); }
static void to_dev(void* d, const void* h, size_t bytes) {
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
}
static void to_host(void* h, const void* d, size_t bytes) {
    cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
}
static void dev_poison(void* d, size_t bytes) { cudaMemset(d, 0xff, bytes); }
static int dev_sync(const char* what) {
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
        fprintf(stderr, "check: %s: %s\n", what, cudaGetErrorString(err));
        return 1;
    }
    return 0;
}
__global__ void naive_kernel(const float* x, const float* w, float* y, int m, int n, int k) {
    (void)w; (void)k;$naive
}
static void naive_solve(const float* x, const float* w, float* y, int m, int n, int k) {
    size_t threads = $naive_threads;
    unsigned blocks = (unsigned)((threads + 255) / 256);
    naive_kernel<<<blocks, 256>>>(x, w, y, m, n, k);
}
static double time_ms(void (*fn)(const float*, const float*, float*, int, int, int),
                      const float* x, const float* w, float* y) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (int i = 0; i < WARMUP; ++i) fn(x, w, y, M, N, K);
    cudaDeviceSynchronize();
    cudaEventRecord(start);
    for (int i = 0; i < REPS; ++i) fn(x, w, y, M, N, K);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return (double)ms / REPS;
}
#endif

static void fill(float* a, size_t len, uint32_t* state) {
    for (size_t i = 0; i < len; ++i) {
        *state = *state * 1664525u + 1013904223u;
        a[i] = (float)((*state >> 8) / 16777216.0) * 2.f - 1.f;
    }
}

// The largest |y - ref| / (ATOL + RTOL |ref|) over all elements (> 1: wrong; NaN counts as
// wrong); *where: its index.
static double worst(const float* y, const double* ref, size_t len, size_t* where) {
    double top = 0.0;
    *where = 0;
    for (size_t i = 0; i < len; ++i) {
        double err = fabs((double)y[i] - ref[i]) / (ATOL + RTOL * fabs(ref[i]));
        if (err != err) err = INFINITY;
        if (err > top) { top = err; *where = i; }
    }
    return top;
}

static int run(const char* who, void (*fn)(const float*, const float*, float*, int, int, int),
               const float* dx, const float* dw, float* dy, float* y, const double* ref,
               size_t y_len, double* ms) {
    dev_poison(dy, y_len * sizeof(float));
    fn(dx, dw, dy, M, N, K);
    if (dev_sync(who)) return 1;
    to_host(y, dy, y_len * sizeof(float));
    size_t where;
    double err = worst(y, ref, y_len, &where);
    if (!(err <= 1.0)) {
        printf("%s: WRONG: element %zu is %.6g, expected %.6g (tolerance %g + %g |expected|)\n",
               who, where, (double)y[where], ref[where], ATOL, RTOL);
        return 1;
    }
    *ms = time_ms(fn, dx, dw, dy);
    if (dev_sync(who)) return 1;
    printf("%s: correct (worst error %.3f of the tolerance), %.4f ms\n", who, err, *ms);
    return 0;
}

int main(void) {
    int m = M, n = N, k = K;
    size_t x_len = $x_len, w_len = $w_len, y_len = $y_len;
    remove(RESULT_FILE);
    float* x = (float*)malloc(x_len * sizeof(float));
    float* w = (float*)malloc((w_len ? w_len : 1) * sizeof(float));
    float* y = (float*)malloc(y_len * sizeof(float));
    double* ref = (double*)malloc(y_len * sizeof(double));
    uint32_t state = SEED;
    fill(x, x_len, &state);
    fill(w, w_len, &state);
    reference(x, w, ref, m, n, k);
    float* dx = (float*)dev_alloc(x_len * sizeof(float));
    float* dw = w_len ? (float*)dev_alloc(w_len * sizeof(float)) : NULL;
    float* dy = (float*)dev_alloc(y_len * sizeof(float));
    to_dev(dx, x, x_len * sizeof(float));
    if (dw) to_dev(dw, w, w_len * sizeof(float));
    double naive_ms = 0.0, solve_ms = 0.0;
    if (run("naive kernel", naive_solve, dx, dw, dy, y, ref, y_len, &naive_ms)) {
        printf("check: the suite's own kernel failed: the checker is broken here\n");
        return 2;
    }
    if (run("your solve", solve, dx, dw, dy, y, ref, y_len, &solve_ms)) return 1;
    FILE* out = fopen(RESULT_FILE, "w");
    if (!out) { perror(RESULT_FILE); return 2; }
    fprintf(out, "{\"op\": \"$op\", \"seconds\": %.9g, \"reference_s\": %.9g}\n",
            solve_ms / 1000.0, naive_ms / 1000.0);
    fclose(out);
    printf("speed-up over the naive kernel: %.2fx\n", naive_ms / (solve_ms > 0 ? solve_ms : 1e-9));
    dev_free(dx); if (dw) dev_free(dw); dev_free(dy);
    free(x); free(w); free(y); free(ref);
    return 0;
}
"""
)


def check_source(op: Op, size: tuple[int, int, int], seed: int, result_file: str) -> str:
    """``check.cu`` for ``op`` at ``size`` with inputs from ``seed``."""
    m, n, k = size
    return _CHECK.substitute(
        op=op.name,
        m=m,
        n=n,
        k=k,
        seed=seed & 0xFFFFFFFF,
        rtol=repr(RTOL),
        atol=repr(ATOL),
        warmup=WARMUP,
        reps=REPS,
        result_file=result_file,
        reference=op.reference,
        naive=op.naive,
        naive_threads=op.naive_threads,
        x_len=op.x_len,
        w_len=op.w_len,
        y_len=op.y_len,
    )
