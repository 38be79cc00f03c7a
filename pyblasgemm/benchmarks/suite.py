"""pyblasgemm's benchmark suite: named shape suites, checked first, then timed against cuBLAS.

    python -m pyblasgemm bench [--suite NAME] [--shapes MxNxK,...] [--dtype fp16,bf16,...]
                               [--out PATH] [--plots DIR] [--list] [--dry-run]

(or ``python bench/suite.py ...``). For every problem and dtype, every implementation runs in
this one process on the same input buffers:

``auto``        pyblasgemm, ``backend`` left to the planner;
``tensorcore``  pyblasgemm forced onto our mma.sync kernels;
``cublas``      pyblasgemm's cuBLAS backend: ``cublasLtMatmul`` (``cublasGemmEx`` where cuBLASLt
                has no algorithm); for 3xtf32 the yardstick is cuBLAS SGEMM, the other way to
                get fp32 accuracy;
``cupy``        ``cupy.matmul`` on views of the same memory (not for int8: CuPy has no
                tensor-core int8 path);
``torch``       ``torch.matmul`` / ``torch._int_mm`` when PyTorch is installed.

Method: each implementation's output is poisoned, computed once and compared with a float64
reference on a sampled 16 x 16 subset of entries (exact for int8) *before* it is timed; an
implementation that fails the check is reported, never timed. Timing: CUDA events around
back-to-back calls after warm-up, the median of several samples; when A, B and C fit in L2
the calls rotate over enough copies of the inputs to exceed it twice; problems whose
estimated run time is under ``SMALL_S`` are timed free of host overhead, queued behind a
kernel that holds the stream until every call is queued, or (``--small graph``) as a CUDA
graph where capture is allowed. The device's ceilings are measured in the same run (device-to-device copy
bandwidth, cuBLAS fp16 at 8192^3) for the roofline plot.

``--device host`` runs the same machinery on NumPy arrays and the host backend (perf_counter
timing): a smoke test of the suite without a GPU, not a benchmark.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import NamedTuple

import numpy as np

from .. import settings as _settings
from .._files import DOCUMENT_BYTES, read_regular, why_not_creatable, why_not_directory
from ..desc import MAX_DIM          # the largest m, n or k: BLAS's 32-bit integers

SCHEMA = "pyblasgemm-bench/1"
#: the source checkout's root when run from one (for ``git describe`` in the results' metadata)
ROOT = pathlib.Path(__file__).resolve().parents[2]


class Problem(NamedTuple):
    """One GEMM shape of a suite: C (m x n) = op(A) (m x k) @ op(B) (k x n)."""

    group: str
    m: int
    n: int
    k: int

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


def _public():
    p = [Problem("square", s, s, s) for s in (1024, 2048, 4096, 8192)]
    p += [Problem("tail-wave", s, s, s) for s in (3072, 5000)]
    p += [Problem("long-K", 256, 256, 65536), Problem("long-K", 512, 512, 32768)]
    p += [Problem("decode", m, n, 4096) for m in (16, 64, 128) for n in (4096, 14336)]
    p += [Problem("small-K", 4096, 4096, 128)]
    p += [Problem("odd", 1000, 1000, 1000), Problem("odd", 4095, 4097, 1023)]
    return tuple(p)


#: named suites (``--suite``); ``public`` is the one the docs and README report
SUITES: dict[str, tuple[Problem, ...]] = {
    "public": _public(),
    "squares": tuple(Problem("square", s, s, s) for s in (1024, 2048, 4096, 8192)),
    "tail": (Problem("tail-wave", 3072, 3072, 3072), Problem("tail-wave", 5000, 5000, 5000)),
    "long-k": (Problem("long-K", 256, 256, 65536), Problem("long-K", 512, 512, 32768)),
    "decode": tuple(Problem("decode", m, n, 4096) for m in (16, 64, 128) for n in (4096, 14336)),
    "quick": (Problem("square", 2048, 2048, 2048), Problem("long-K", 256, 256, 65536),
              Problem("decode", 16, 4096, 4096), Problem("odd", 1000, 1000, 1000)),
    "tiny": (Problem("tiny", 64, 64, 64), Problem("tiny", 17, 33, 65)),
    # sized for NumPy on a busy laptop: every class of the GPU suites, each in a fraction of a
    # second, although NumPy's float16 and int8 matmul run without BLAS (~4.5 ns a multiply-add)
    "host": (Problem("square", 128, 128, 128), Problem("long-K", 16, 16, 4096),
             Problem("decode", 8, 256, 256), Problem("odd", 63, 65, 67),
             Problem("tiny", 17, 33, 65)),
}
#: what ``--quick`` runs on each device
QUICK_SUITE = {"gpu": "quick", "host": "host"}
#: what runs when neither --suite, --quick nor --shapes is given
DEFAULT_SUITE = {"gpu": "public", "host": "host"}


class DType(NamedTuple):
    """A benchmarked type: which BLAS routine with which compute= and default layout."""

    name: str
    routine: str          # pyblasgemm routine
    compute: str | None   # compute= for it (None: the routine's default)
    trans: str            # default transa + transb (column-major BLAS convention)
    u_in: float           # relative rounding of the inputs inside the product (tf32: 2^-11 x2)
    u_acc: float          # unit roundoff of the accumulator
    u_out: float          # unit roundoff of the output type
    est_tflops: float     # rough H100 speed, only to size the timing loops
    cublas_compute: str | None   # compute= of the cuBLAS yardstick (None: the same)


#: 'NN' for the floating types is numpy's row-major A @ B seen column-major; int8 uses 'TN'
#: (A and B both K-contiguous), the only arrangement cuBLAS runs on int8 tensor cores natively.
DTYPES: dict[str, DType] = {
    "fp16": DType("fp16", "hgemm", None, "NN", 0.0, 2.0**-24, 2.0**-11, 600, None),
    "fp16acc": DType("fp16acc", "hgemm", "fp16", "NN", 0.0, 2.0**-11, 2.0**-11, 600, None),
    "bf16": DType("bf16", "bgemm", None, "NN", 0.0, 2.0**-24, 2.0**-8, 600, None),
    "int8": DType("int8", "igemm", None, "TN", 0.0, 0.0, 0.0, 800, None),
    "fp32": DType("fp32", "sgemm", "fp32", "NN", 0.0, 2.0**-24, 2.0**-24, 50, None),
    "tf32": DType("tf32", "sgemm", "tf32", "NN", 2.0**-10, 2.0**-24, 2.0**-24, 300, None),
    "3xtf32": DType("3xtf32", "sgemm", "3xtf32", "NN", 2.0**-21, 2.0**-24, 2.0**-24, 40, "fp32"),
}
DEFAULT_DTYPES = ("fp16", "bf16", "int8", "3xtf32")
GPU_IMPLS = ("auto", "tensorcore", "cublas", "cupy", "torch")
HOST_IMPLS = ("auto", "numpy")
#: estimated GPU seconds under which a problem is timed through a CUDA graph (or, where
#: capture is refused, queued behind a blocking kernel): below it the host's cost would show
SMALL_S = 1e-3
#: the target length of one timing sample, and how many samples the median is over
SAMPLE_S, SAMPLES = 2e-3, 9
#: memory a problem takes per element of A, B and C together, an upper bound used to refuse
#: a problem that cannot fit before anything runs. Host: the typed buffers (<= 4 bytes), the
#: float64 / int64 values they are drawn from (8) and NumPy's widened int8 / bfloat16
#: products (4). GPU: the buffers (<= 4) and CuPy's float32 / int32 draws (4).
BYTES_PER_ELEMENT = {"host": 16, "gpu": 8}


def parse_shapes(text: str) -> tuple[Problem, ...]:
    """``"MxNxK,MxNxK"`` -> problems (group 'user'). Raises ValueError with the bad item."""
    problems = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.lower().replace("*", "x").split("x")
        try:
            m, n, k = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"shape {item!r} must be MxNxK with three positive integers, "
                             f"e.g. 4096x4096x4096") from None
        if min(m, n, k) < 1:
            raise ValueError(f"shape {item!r}: m, n and k must be >= 1")
        if max(m, n, k) > MAX_DIM:
            raise ValueError(f"shape {item!r}: m, n and k must be <= {MAX_DIM} (BLAS's 32-bit "
                             f"integers)")
        problems.append(Problem("user", m, n, k))
    if not problems:
        raise ValueError("--shapes is empty; give MxNxK[,MxNxK...]")
    return tuple(problems)


def parse_dtypes(text: str) -> tuple[str, ...]:
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in DTYPES]
    if bad or not names:
        raise ValueError(f"--dtype {text!r}: choose from {', '.join(DTYPES)}")
    return names


def tolerance(dt: DType, k: int) -> float:
    """Allowed |C - ref| / (|op(A)| @ |op(B)|) per entry: input, output and sqrt(k)-grown
    accumulation rounding with a safety factor (a wrong element is off by O(1))."""
    if dt.name == "int8":
        return 0.0
    return 2 * dt.u_in + 2 * dt.u_out + 8 * math.sqrt(k) * dt.u_acc + 1e-7


def flops(p: Problem) -> int:
    return 2 * p.m * p.n * p.k


def min_bytes(p: Problem, dt: DType) -> int:
    """Bytes that must move at least once: read A and B, write C."""
    ab = {"fp16": 2, "fp16acc": 2, "bf16": 2, "int8": 1}.get(dt.name, 4)
    c = 4 if dt.name == "int8" else ab
    return ab * (p.m * p.k + p.k * p.n) + c * p.m * p.n


# ---------------------------------------------------------------------------------------------
# Environments: the GPU (CuPy, CUDA events) or the host (NumPy, perf_counter)
# ---------------------------------------------------------------------------------------------

class _Env:
    def __init__(self, device: str):
        self.device = device
        if device == "gpu":
            import cupy
            self.xp = cupy
        else:
            self.xp = np
        self.torch = None
        if device == "gpu":
            try:
                import torch
                if torch.cuda.is_available():
                    self.torch = torch
            except Exception:
                pass

    def sync(self):
        """Wait for all work on the device (PyTorch may have run on its own stream)."""
        if self.device == "gpu":
            self.xp.cuda.Device().synchronize()

    def l2_bytes(self) -> int:
        if self.device == "gpu":
            return int(self.xp.cuda.Device().attributes["L2CacheSize"])
        return 32 << 20

    def info(self) -> dict:
        import pyblasgemm
        versions = {"pyblasgemm": pyblasgemm.__version__, "numpy": np.__version__,
                    "python": platform.python_version()}
        try:
            import ml_dtypes
            versions["ml_dtypes"] = ml_dtypes.__version__
        except Exception:
            pass
        out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host": platform.node(), "versions": versions}
        try:   # the commit measured, when run from a git checkout
            import subprocess
            versions["git"] = subprocess.run(
                ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                text=True, timeout=5, check=True).stdout.strip() or None
        except Exception:
            pass
        if self.device == "gpu":
            cp = self.xp
            dev = cp.cuda.Device()
            props = cp.cuda.runtime.getDeviceProperties(dev.id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            out["device"] = {"name": name, "kind": "gpu",
                             "compute_capability": f"{props['major']}.{props['minor']}",
                             "sm_count": props["multiProcessorCount"],
                             "l2_bytes": self.l2_bytes(),
                             "memory_bytes": int(props["totalGlobalMem"])}
            out["driver"] = cp.cuda.runtime.driverGetVersion()
            out["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
            versions["cupy"] = cp.__version__
            from pyblasgemm.backends import cublaslt

            versions["cublas"] = cublaslt.version()      # None when cuBLASLt cannot be loaded
            if self.torch is not None:
                versions["torch"] = self.torch.__version__
        else:
            out["device"] = {"name": f"host CPU ({platform.processor() or platform.machine()})",
                             "kind": "host"}
            out["driver"] = None
            out["cuda_runtime"] = None
        return out


def _views(xp, dt_name, trans, p: Problem, a, b, c):
    """op(A) (m x k), op(B) (k x n) and C (m x n) as array views of the column-major buffers."""
    m, n, k = p.m, p.n, p.k
    opa = a.reshape(k, m).T if trans[0] == "N" else a.reshape(m, k)
    opb = b.reshape(n, k).T if trans[1] == "N" else b.reshape(k, n)
    return opa, opb, c.reshape(n, m).T


class _Case:
    """Buffers and the implementations' callables for one (problem, dtype)."""

    def __init__(self, env: _Env, p: Problem, dt: DType, trans: str, rng, copies: int):
        import ml_dtypes
        self.env, self.p, self.dt, self.trans = env, p, dt, trans
        xp = env.xp
        m, n, k = p.m, p.n, p.k
        ab = {"hgemm": np.float16, "bgemm": ml_dtypes.bfloat16, "igemm": np.int8,
              "sgemm": np.float32}[dt.routine]
        self.c_dtype = np.int32 if dt.routine == "igemm" else ab
        self.ab_dtype = ab

        def make(size):
            if dt.routine == "igemm":
                if env.device == "gpu":
                    return xp.random.randint(-128, 128, size, dtype=np.int32).astype(np.int8)
                return rng.integers(-128, 128, size).astype(np.int8)
            if env.device == "gpu":
                return xp.random.uniform(-1, 1, size, dtype=np.float32).astype(ab)
            return rng.uniform(-1, 1, size).astype(ab)

        self.sets = [(make(m * k), make(k * n), xp.empty(m * n, dtype=self.c_dtype))
                     for _ in range(copies)]

    def impl(self, name):
        """A function of (a, b, c) running implementation ``name``, or a str saying why not."""
        import pyblasgemm
        env, p, dt, trans = self.env, self.p, self.dt, self.trans
        m, n, k = p.m, p.n, p.k
        lda = m if trans[0] == "N" else k
        ldb = k if trans[1] == "N" else n
        one, zero = (1, 0) if dt.routine == "igemm" else (1.0, 0.0)
        routine = getattr(pyblasgemm, dt.routine)
        if name in ("auto", "tensorcore", "cublas"):
            backend = None if name == "auto" else name
            compute = dt.cublas_compute if (name == "cublas" and dt.cublas_compute) else dt.compute
            return lambda a, b, c: routine(trans[0], trans[1], m, n, k, one, a, lda, b, ldb,
                                           zero, c, m, compute=compute, backend=backend)
        if name in ("numpy", "cupy"):
            if name == "cupy" and dt.routine == "igemm":
                return "CuPy has no tensor-core int8 path (cupy.matmul on int8 is not cuBLAS IMMA)"
            if name == "cupy" and dt.compute == "fp16":
                return "cupy.matmul accumulates float16 in float32"
            xp = env.xp

            def call(a, b, c):
                opa, opb, cv = _views(xp, dt.name, trans, p, a, b, c)
                # C = op(A) op(B) written through C's transpose (C-contiguous), as cuBLAS would
                if xp is np and dt.routine == "igemm":   # NumPy's int8 matmul is int8
                    cv.T[...] = np.matmul(opb.T.astype(np.int32), opa.T.astype(np.int32))
                elif xp is np:   # NumPy's bfloat16 matmul returns float32: assign, round once
                    cv.T[...] = np.matmul(opb.T, opa.T)
                else:
                    xp.matmul(opb.T, opa.T, out=cv.T)
            return call
        if name == "torch":
            torch = env.torch
            if torch is None:
                return "PyTorch is not installed"
            if dt.compute == "fp16":
                return "torch.matmul accumulates float16 in float32"

            streams = {}

            def on_stream():   # torch must launch on CuPy's current stream (events, capture)
                ptr = env.xp.cuda.get_current_stream().ptr
                if ptr not in streams:
                    streams[ptr] = torch.cuda.ExternalStream(ptr)
                return torch.cuda.stream(streams[ptr])

            def tview(x):
                return torch.as_tensor(x, device="cuda") if dt.routine != "bgemm" else \
                    torch.as_tensor(x.view(np.int16), device="cuda").view(torch.bfloat16)

            if dt.routine == "igemm":
                def call(a, b, c):
                    opa, opb, cv = _views(env.xp, dt.name, trans, p, a, b, c)
                    with on_stream():
                        torch._int_mm(tview(opb.T), tview(opa.T), out=tview(cv.T))
                return call

            def call(a, b, c):
                opa, opb, cv = _views(env.xp, dt.name, trans, p, a, b, c)
                torch.backends.cuda.matmul.allow_tf32 = dt.compute == "tf32"
                with on_stream():
                    torch.matmul(tview(opb.T), tview(opa.T), out=tview(cv.T))
            return call
        raise ValueError(f"unknown implementation {name!r}")

    def check(self, fn, rng) -> dict:
        """Poison C, run once, compare a sampled 16 x 16 block with float64 (exact for int8)."""
        a, b, c = self.sets[0]
        xp = self.env.xp
        c[...] = -12345 if self.dt.routine == "igemm" else np.nan
        fn(a, b, c)
        self.env.sync()
        p = self.p
        rows = np.sort(rng.choice(p.m, min(p.m, 16), replace=False))
        cols = np.sort(rng.choice(p.n, min(p.n, 16), replace=False))
        opa, opb, cv = _views(xp, self.dt.name, self.trans, p, a, b, c)
        get = (lambda x: x.get()) if self.env.device == "gpu" else np.asarray
        ra = get(xp.ascontiguousarray(opa[xp.asarray(rows)])).astype(np.float64)
        rb = get(xp.ascontiguousarray(opb[:, xp.asarray(cols)])).astype(np.float64)
        got = get(xp.ascontiguousarray(cv[xp.asarray(rows)][:, xp.asarray(cols)]))
        got = got.astype(np.float64)
        want = ra @ rb
        if self.dt.routine == "igemm":
            want = want.astype(np.int64).astype(np.int32).astype(np.float64)  # wraps like int32
        scale = np.abs(ra) @ np.abs(rb)
        err = np.abs(got - want) / np.where(scale > 0, scale, 1.0)
        worst = float(np.nanmax(err)) if np.isfinite(err).all() else float("inf")
        tol = tolerance(self.dt, p.k)
        return {"max_rel_err": worst, "tol": tol, "ok": bool(worst <= tol),
                "sampled": int(rows.size * cols.size)}


def _time_host(env, calls, est):
    """Median seconds per call on the host (perf_counter), method 'perf_counter'.

    ``est`` is a GPU estimate and says nothing of the host (NumPy's float16 matmul runs
    without BLAS, ~10^4x slower than the GPU at 64^3), so the repetitions come from the
    warm-up call's own time."""
    t0 = time.perf_counter()
    for f in calls:
        f()
    once = (time.perf_counter() - t0) / len(calls)
    reps = max(1, min(1000, int(SAMPLE_S / max(once, 1e-7))))
    samples = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        for i in range(reps):
            calls[i % len(calls)]()
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples), "perf_counter"


_BLOCK_SRC = r"""
extern "C" __global__ void block_stream(volatile int* flag, unsigned long long timeout_ns) {
    // Hold the stream until the host has queued every timed call (flag[0] = 1), so the GPU
    // then runs them back to back; give up after timeout_ns and say so in flag[1].
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) { flag[1] = 1; break; }
    }
}
"""
_blocker = None
#: calls queued behind the blocking kernel per sample (the driver's launch queue is ~1000 deep)
QUEUE_REPS = 100


def _block_kernel(cp):
    global _blocker
    if _blocker is None:
        mem = cp.cuda.alloc_pinned_memory(8)
        flag = np.frombuffer(mem, dtype=np.int32, count=2)
        _blocker = (cp.RawKernel(_BLOCK_SRC, "block_stream"), mem, flag)
    return _blocker


def _time_gpu(env, calls, est, small, small_method="queue"):
    """Median seconds per call and the method: ``graph`` (one CUDA graph of the calls),
    ``queue`` (calls queued behind a kernel that holds the stream until all are queued, for
    what cannot be captured: CuPy refuses cuBLAS calls during stream capture) or ``events``.

    Small problems need one of the first two: their host-side cost per call (tens of
    microseconds in Python) is larger than the GPU time, and plain back-to-back calls would
    measure the host. ``small_method='queue'`` (the default) times every implementation the
    same way; ``'graph'`` captures where capture is allowed (our kernels, PyTorch) and queues
    the rest, which favours the captured ones by the launch gaps a graph removes.
    """
    cp = env.xp
    stream = cp.cuda.Stream(non_blocking=True)
    reps = max(len(calls), min(2000, int(math.ceil(SAMPLE_S / max(est, 1e-7)))))
    if small:
        reps = min(reps, QUEUE_REPS)
    reps = -(-reps // len(calls)) * len(calls)
    method, graph = "events", None
    with stream:
        for _ in range(2):          # warm-up: compilation, plans, workspace in the pool
            for f in calls:
                f()
        stream.synchronize()
        if small:
            method = "queue"
        if small and small_method == "graph":
            try:
                stream.begin_capture()
                try:
                    for i in range(reps):
                        calls[i % len(calls)]()
                finally:
                    graph = stream.end_capture()
                graph.launch(stream)
                stream.synchronize()
                method = "graph"
            except Exception:
                graph = None
                stream.synchronize()
        samples = []
        for _ in range(SAMPLES):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            if method == "queue":
                kern, _, flag = _block_kernel(cp)
                flag[:] = 0
                kern((1,), (1,), (np.uint64(flag.ctypes.data), np.uint64(int(0.5e9))))
            start.record(stream)
            if graph is not None:
                graph.launch(stream)
            else:
                for i in range(reps):
                    calls[i % len(calls)]()
            stop.record(stream)
            if method == "queue":
                flag[0] = 1
            stop.synchronize()
            if method == "queue" and flag[1]:
                raise RuntimeError("the host took longer than 0.5 s to queue the timed calls")
            samples.append(cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps)
    return statistics.median(samples), method


def measure_ceilings(env) -> dict:
    """Device-to-device copy bandwidth and cuBLAS fp16 at 8192^3, measured now."""
    if env.device != "gpu":
        return {}
    cp = env.xp
    import pyblasgemm
    out = {}
    n_bytes = 1 << 30
    src, dst = cp.empty(n_bytes, dtype=cp.uint8), cp.empty(n_bytes, dtype=cp.uint8)
    src.fill(1)
    t, _ = _time_gpu(env, [lambda: cp.copyto(dst, src)], 0.7e-3, False)
    out["copy_GBps"] = 2 * n_bytes / t / 1e9
    del src, dst
    s = 8192
    a = cp.random.uniform(-1, 1, s * s, dtype=np.float32).astype(np.float16)
    b = cp.random.uniform(-1, 1, s * s, dtype=np.float32).astype(np.float16)
    c = cp.empty(s * s, dtype=np.float16)
    t, _ = _time_gpu(env, [lambda: pyblasgemm.hgemm("N", "N", s, s, s, 1.0, a, s, b, s, 0.0, c,
                                                    s, backend="cublas")], 1.5e-3, False)
    out["fp16_cublas_tflops"] = 2 * s**3 / t / 1e12
    out["fp16_shape"] = f"{s}x{s}x{s}"
    return out


#: the BLAS routine -> the planner's dtype word
_PLAN_DTYPE = {"hgemm": "f16", "bgemm": "bf16", "igemm": "i8", "sgemm": "f32", "dgemm": "f64",
               "cgemm": "c64", "zgemm": "c128"}


def route_of(p, dt, trans, name, device) -> str | None:
    """The route pyblasgemm's row ``name`` takes ('auto', 'tensorcore', 'cublas'): the plan's
    backend, config and decomposition, as the planner decides it for this column-major call;
    'host' on the host; None for the other libraries' rows (or a plan that fails: the row's
    error says why).

    >>> suite_problem = Problem("square", 256, 256, 256)
    >>> route_of(suite_problem, DTYPES["fp16"], "NN", "numpy", "gpu") is None
    True
    >>> route_of(suite_problem, DTYPES["fp16"], "NN", "auto", "host")
    'host'
    """
    if name not in ("auto", "tensorcore", "cublas"):
        return None
    if device != "gpu":
        return "host"
    import pyblasgemm

    compute = dt.cublas_compute if (name == "cublas" and dt.cublas_compute) else dt.compute
    try:
        plan = pyblasgemm.plan(p.m, p.n, p.k, _PLAN_DTYPE[dt.routine], compute=compute,
                               transa=trans[0], transb=trans[1],
                               backend=None if name == "auto" else name)
    except Exception:            # the call's own error is recorded with the row
        return None
    cfg = getattr(plan.config, "name", None)
    return " ".join(x for x in (plan.backend, cfg, plan.decomposition if cfg else None) if x)


def _nvrtc_version() -> str | None:
    try:
        from pyblasgemm.kernels import nvrtc
        return ".".join(map(str, nvrtc.getVersion()))
    except Exception:            # no cuda-bindings or no NVRTC library: unknown
        return None


def provenance(seed) -> dict:
    """What decides a benchmark's numbers besides the code, for every results JSON (the suite,
    ``bench/heldout.py`` and the scripts beside it): the seed of its operands (an int, the rule
    that derives one per row as text, or None where it draws none), the ``PYBLASGEMM_*``
    variables set and the NVRTC version that compiled the kernels (None without CuPy).

    >>> sorted(provenance(0))
    ['nvrtc', 'seed', 'settings']
    """
    return {"seed": seed,
            "settings": {k: str(v) for k, v in _settings.in_environment()[0].items()},
            "nvrtc": _nvrtc_version()}


def plan(suite: tuple, dtypes: tuple, impls: tuple) -> list:
    """The (problem, dtype, impl) triples a run measures, in order."""
    return [(p, d, i) for p in suite for d in dtypes for i in impls]


def run(problems, dtypes, impls, device="gpu", trans=None, progress=True, seed=0,
        log=print, small_method="queue") -> dict:
    """Run the benchmark and return the results document (see ``validate_results``)."""
    env = _Env(device)
    rng = np.random.default_rng(seed)
    doc = env.info()
    doc.update(schema=SCHEMA, suite=None, method={
        "timer": "CUDA events" if device == "gpu" else "time.perf_counter",
        "statistic": f"median of {SAMPLES} samples of back-to-back calls (~{SAMPLE_S * 1e3:g} ms "
                     f"each) after warm-up",
        "check": "output poisoned, one call, sampled 16x16 entries vs float64 (int8 exact)",
        "rotation": "inputs rotated over copies exceeding 2x L2 when A+B+C fit in L2",
        "small": f"estimated < {SMALL_S * 1e3:g} ms per call: {QUEUE_REPS} calls queued behind "
                 f"a kernel that holds the stream until all are queued ('queue'), or with "
                 f"--small graph a CUDA graph of them where capture is allowed ('graph'; CuPy "
                 f"refuses cuBLAS calls during capture)",
        "cublas_yardstick": "cuBLASLt (cublasLtMatmul; cublasGemmEx where it has no algorithm) "
                            "via pyblasgemm backend='cublas' (3xtf32: SGEMM fp32)"})
    # what decides the numbers besides the code: the seed, the PYBLASGEMM_* settings, NVRTC
    record = provenance(seed)
    doc["seed"], doc["settings"] = record["seed"], record["settings"]
    doc["versions"].setdefault("nvrtc", record["nvrtc"] if device == "gpu" else None)
    log(f"device: {doc['device']['name']}")
    doc["ceilings"] = measure_ceilings(env)
    if doc["ceilings"]:
        log("ceilings: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in doc["ceilings"].items()))
    work = [(p, d) for p in problems for d in dtypes]
    bar = None
    if progress:
        from tqdm import tqdm      # a dependency (pyproject.toml)

        bar = tqdm(total=len(work) * len(impls), unit="run", file=sys.stderr)
    results = []
    l2 = env.l2_bytes()
    for p, dname in work:
        dt = DTYPES[dname]
        tr = trans or dt.trans
        fits = min_bytes(p, dt) * 1.0 < l2
        copies = max(1, min(16, math.ceil(2 * l2 / max(1, min_bytes(p, dt))))) if fits else 1
        case = _Case(env, p, dt, tr, rng, copies)
        est = max(flops(p) / (dt.est_tflops * 1e12), min_bytes(p, dt) / 3e12)
        row_t = {}
        for name in impls:
            rec = {"group": p.group, "problem": p.label, "m": p.m, "n": p.n, "k": p.k,
                   "dtype": dname, "compute": dt.compute or "default", "trans": tr, "impl": name,
                   "flops": flops(p), "min_bytes": min_bytes(p, dt), "rotated_copies": copies,
                   "seconds": None, "tflops": None, "timing": None, "check": None,
                   "error": None}
            if bar is not None:
                bar.set_description(f"{dname} {p.label} {name}")
            fn = case.impl(name)
            rec["route"] = route_of(p, dt, tr, name, device)
            if isinstance(fn, str):
                rec["error"] = fn
            else:
                try:
                    rec["check"] = case.check(fn, rng)
                    if not rec["check"]["ok"]:
                        rec["error"] = (f"wrong result: max relative error "
                                        f"{rec['check']['max_rel_err']:.3g} > tolerance "
                                        f"{rec['check']['tol']:.3g}; not timed")
                    else:
                        calls = [(lambda a=a, b=b, c=c: fn(a, b, c)) for a, b, c in case.sets]
                        if device == "gpu":
                            t, how = _time_gpu(env, calls, est, est < SMALL_S, small_method)
                        else:
                            t, how = _time_host(env, calls, est)
                        rec.update(seconds=t, tflops=flops(p) / t / 1e12, timing=how)
                        row_t[name] = t
                except Exception as exc:  # report and go on: one failure must not end a run
                    rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            results.append(rec)
            if bar is not None:
                bar.update(1)
        base = row_t.get("cublas")
        for rec in results[-len(impls):]:
            if base and rec["seconds"]:
                rec["ratio_to_cublas"] = base / rec["seconds"]
        del case
        if device == "gpu":
            env.xp.get_default_memory_pool().free_all_blocks()
    if bar is not None:
        bar.close()
    doc["results"] = results
    return doc


# ---------------------------------------------------------------------------------------------
# Results schema
# ---------------------------------------------------------------------------------------------

_TOP = {"schema": str, "date": str, "device": dict, "versions": dict, "method": dict,
        "ceilings": dict, "results": list}
_REC = {"group": str, "problem": str, "m": int, "n": int, "k": int, "dtype": str,
        "compute": str, "trans": str, "impl": str, "flops": int, "min_bytes": int,
        "rotated_copies": int}


def validate_results(doc: dict) -> None:
    """Raise ValueError naming the first thing wrong with a results document."""
    if not isinstance(doc, dict):
        raise ValueError("results must be a JSON object")
    for key, typ in _TOP.items():
        if not isinstance(doc.get(key), typ):
            raise ValueError(f"top-level {key!r} missing or not a {typ.__name__}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema {doc['schema']!r} is not {SCHEMA!r}")
    if "name" not in doc["device"]:
        raise ValueError("device.name missing")
    for i, r in enumerate(doc["results"]):
        for key, typ in _REC.items():
            if not isinstance(r.get(key), typ):
                raise ValueError(f"results[{i}].{key} missing or not a {typ.__name__}")
        if r["dtype"] not in DTYPES:
            raise ValueError(f"results[{i}].dtype {r['dtype']!r} unknown")
        timed = r.get("seconds") is not None
        if timed:
            if not (isinstance(r["seconds"], float) and r["seconds"] > 0):
                raise ValueError(f"results[{i}].seconds must be a positive float")
            if not (isinstance(r.get("check"), dict) and r["check"].get("ok") is True):
                raise ValueError(f"results[{i}] is timed but its correctness check did not pass")
        elif not isinstance(r.get("error"), str):
            raise ValueError(f"results[{i}] has neither a time nor an error saying why")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--suite", default=None, choices=sorted(SUITES),
                        help="named shape suite (default: public on a GPU, host on the host; "
                             "none when --shapes is given)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run: the {QUICK_SUITE['gpu']!r} suite on a GPU, the "
                             f"{QUICK_SUITE['host']!r} suite on the host (under a minute)")
    parser.add_argument("--shapes", default=None, metavar="MxNxK,...",
                        help="extra (or, without --suite, the only) problems, e.g. 4096x4096x4096")
    parser.add_argument("--dtype", default=",".join(DEFAULT_DTYPES), metavar="LIST",
                        help=f"comma list from {', '.join(DTYPES)} (default: %(default)s)")
    parser.add_argument("--impls", default=None, metavar="LIST",
                        help=f"comma list (default GPU: {','.join(GPU_IMPLS)}; host: "
                             f"{','.join(HOST_IMPLS)})")
    parser.add_argument("--trans", default=None, choices=["NN", "NT", "TN", "TT"],
                        help="force one layout (default: NN, TN for int8)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="results JSON (default: suite_<device>_<date>.json in "
                             "$PYBLASGEMM_RESULTS_DIR, $XDG_DATA_HOME/pyblasgemm/bench or "
                             "~/.local/share/pyblasgemm/bench)")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also write the PNG plots (bench/plot.py) into DIR")
    parser.add_argument("--small", default="queue", choices=["queue", "graph"],
                        help="how problems under 1 ms are timed free of host overhead: queued "
                             "behind a blocking kernel (all implementations alike) or CUDA "
                             "graphs where capture is allowed (default: %(default)s)")
    parser.add_argument("--device", default="gpu", choices=["gpu", "host"],
                        help="host: NumPy smoke run of the machinery, not a benchmark")
    parser.add_argument("--note", default=None, metavar="TEXT",
                        help="free text stored in the JSON (e.g. the commit, where no git)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument("--table", default=None, metavar="JSON",
                        help="print the headline table of a results file (markdown for the "
                             "README; with --rst for docs/performance.rst) and exit")
    parser.add_argument("--rst", action="store_true", help="--table as an rst list-table")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the problems that would run and exit")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    return parser


def parser(prog="python -m pyblasgemm bench") -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(
        prog=prog, description="pyblasgemm benchmark suite: checked, then timed against cuBLAS"))


def resolve(args) -> tuple:
    """(problems, dtypes, impls) from parsed arguments; ValueError on bad values."""
    if args.quick and args.suite is not None:
        raise ValueError(f"--quick picks its own suite; drop it or --suite {args.suite}")
    problems = ()
    if args.quick:
        problems = SUITES[QUICK_SUITE[args.device]]
    elif args.suite is not None or args.shapes is None:
        problems = SUITES[args.suite or DEFAULT_SUITE[args.device]]
    if args.shapes:
        problems = problems + parse_shapes(args.shapes)
    dtypes = parse_dtypes(args.dtype)
    known = GPU_IMPLS if args.device == "gpu" else HOST_IMPLS
    impls = known if args.impls is None else tuple(s.strip() for s in args.impls.split(",")
                                                   if s.strip())
    bad = [i for i in impls if i not in known]
    if bad or not impls:
        raise ValueError(f"--impls {args.impls!r}: choose from {', '.join(known)} "
                         f"for --device {args.device}")
    return problems, dtypes, impls


def results_dir() -> pathlib.Path:
    """Where a run without ``--out`` writes: ``$PYBLASGEMM_RESULTS_DIR``, else
    ``$XDG_DATA_HOME/pyblasgemm/bench``, else ``~/.local/share/pyblasgemm/bench``. Never the
    source tree: an installed package's folder
    may be read-only, and a checkout's ``bench/results`` holds only the committed measurements.

    >>> from pyblasgemm import settings
    >>> default = results_dir().parts[-3:] == ("share", "pyblasgemm", "bench")
    >>> default or settings.get("PYBLASGEMM_RESULTS_DIR") is not None
    True
    """
    from pyblasgemm import settings

    from pyblasgemm._files import data_home

    return settings.get("PYBLASGEMM_RESULTS_DIR") or data_home() / "bench"


# ---------------------------------------------------------------------------------------------
# The command line's paths and sizes, checked before any work: a run must not end, after
# minutes of measuring, in a file it cannot write (issue #30)
# ---------------------------------------------------------------------------------------------

def check_out(text: str | None) -> str | None:
    """Why the results cannot be written to ``--out text`` (None: a new file in
    :func:`results_dir`), or None when they can. Creates nothing.

    >>> check_out("")
    "--out '' is empty: give a file name, e.g. results.json"
    >>> check_out("/")
    "--out '/' is a directory: give a file in it, e.g. '/results.json'"
    """
    if text is None:
        where = results_dir()
        why = why_not_directory(where)
        return (f"the results directory {str(where)!r} (PYBLASGEMM_RESULTS_DIR, or the default): "
                f"{why}; give --out FILE" if why else None)
    if not text.strip():
        return f"--out {text!r} is empty: give a file name, e.g. results.json"
    if os.path.isdir(text) or text.endswith(("/", os.sep)):
        return (f"--out {text!r} is a directory: give a file in it, e.g. "
                f"{os.path.join(text, 'results.json')!r}")
    if os.path.lexists(text):      # overwritten (or a device, /dev/stdout, written to)
        return None if os.access(text, os.W_OK) else f"--out {text!r}: no permission to write it"
    why = why_not_creatable(text)
    return f"--out {text!r} cannot be created: {why}" if why else None


def check_plots(text: str | None) -> str | None:
    """Why the plots cannot be written into ``--plots text`` (None: no plots), or None.

    >>> check_plots("")
    "--plots '' is empty: give a directory, e.g. plots"
    """
    if text is None:
        return None
    if not text.strip():
        return f"--plots {text!r} is empty: give a directory, e.g. plots"
    why = why_not_directory(text)
    if why:
        return f"--plots {text!r}: {why}"
    try:
        import matplotlib  # noqa: F401  (the plots need it; it is an optional dependency)
    except ImportError:
        return "--plots needs matplotlib, which is not installed (pip install 'pyblasgemm[bench]')"
    return None


def format_bytes(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1.

    >>> format_bytes(512), format_bytes(3 << 29), format_bytes(48 * 10**12)
    ('512 B', '1.5 GiB', '43.7 TiB')
    """
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    i = 0
    while nbytes >= 1024 and i < len(units) - 1:
        nbytes /= 1024
        i += 1
    return f"{nbytes:.3g} {units[i]}"


def total_memory(device: str) -> int | None:
    """Bytes of memory of the host (physical) or of the current GPU; None when unknown."""
    if device == "gpu":
        try:
            import cupy
            return int(cupy.cuda.runtime.memGetInfo()[1])
        except Exception:
            return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):   # no sysconf (Windows) or no such name
        return None


def check_memory(problems, device: str, have: int | None = None) -> str | None:
    """Why the largest of ``problems`` cannot fit in ``device``'s memory (``have`` bytes,
    default :func:`total_memory`), or None. Bound: :data:`BYTES_PER_ELEMENT`.

    >>> check_memory([Problem("user", 1000, 1000, 1000)], "host", have=1 << 30) is None
    True
    >>> print(check_memory([Problem("user", 10**6, 10**6, 10**6)], "host", have=1 << 30))
    problem 1000000x1000000x1000000 needs about 43.7 TiB of host memory (16 bytes per element
    of A, B and C), more than the 1 GiB there is
    """
    if not problems:
        return None
    p = max(problems, key=lambda p: p.m * p.k + p.k * p.n + p.m * p.n)
    need = BYTES_PER_ELEMENT[device] * (p.m * p.k + p.k * p.n + p.m * p.n)
    have = total_memory(device) if have is None else have
    if have is None or need <= have:
        return None
    where = "GPU" if device == "gpu" else "host"
    return (f"problem {p.label} needs about {format_bytes(need)} of {where} memory "
            f"({BYTES_PER_ELEMENT[device]} bytes per element of A, B and C), more than the "
            f"{format_bytes(have)} there is")


def load_results(path: str) -> dict:
    """The results document at ``path`` (``--table``), checked by :func:`validate_results`.
    Raises ValueError naming the file and what is wrong with it: missing, not a regular file,
    over :data:`~pyblasgemm._files.DOCUMENT_BYTES`, not JSON, not of the schema, no results.

    >>> load_results("no/such/file.json")
    Traceback (most recent call last):
        ...
    ValueError: --table 'no/such/file.json': no such file
    """
    if not path.strip():
        raise ValueError(f"--table {path!r} is empty: give a results file")
    try:
        doc = json.loads(read_regular(path, DOCUMENT_BYTES))
    except FileNotFoundError:
        raise ValueError(f"--table {path!r}: no such file") from None
    except OSError as exc:       # a directory, FIFO or device (RefusedFile), too large, ...
        raise ValueError(f"--table {path!r}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"--table {path!r}: not JSON ({str(exc)[:120]})") from None
    try:
        validate_results(doc)
    except ValueError as exc:
        raise ValueError(f"--table {path!r}: not a {SCHEMA} results file ({exc})") from None
    if not doc["results"]:
        raise ValueError(f"--table {path!r}: it holds no results")
    return doc


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.list:
        for name, probs in SUITES.items():
            print(f"{name:8} {len(probs):3} problems: " + ", ".join(p.label for p in probs))
        print("dtypes: " + ", ".join(f"{d.name} ({d.routine}, compute={d.compute or 'default'}, "
                                     f"{d.trans})" for d in DTYPES.values()))
        return 0
    try:
        if args.table is not None:
            doc = load_results(args.table)
            print(rst_table(doc) if args.rst else readme_table(doc))
            return 0
        problems, dtypes, impls = resolve(args)
        for why in (check_out(args.out), check_plots(args.plots)):
            if why:
                raise ValueError(why)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for p in problems:
            print(f"{p.group:10} {p.label:20} {','.join(dtypes)}  [{','.join(impls)}]")
        print(f"{len(problems) * len(dtypes)} cases x {len(impls)} implementations")
        return 0
    if args.device == "gpu":
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device")
        except Exception as exc:
            print(f"error: the GPU benchmark needs CuPy and a CUDA device ({exc}); "
                  f"use --device host for a smoke run", file=sys.stderr)
            return 2
    why = check_memory(problems, args.device)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    doc = run(problems, dtypes, impls, device=args.device, trans=args.trans,
              progress=not args.no_progress, small_method=args.small)
    doc["suite"] = (QUICK_SUITE[args.device] if args.quick else args.suite) or \
        (DEFAULT_SUITE[args.device] if args.shapes is None else "user")
    if args.note:
        doc["note"] = args.note
    validate_results(doc)
    out = args.out
    if out is None:
        dev = "".join(ch if ch.isalnum() else "_" for ch in doc["device"]["name"]).strip("_")
        base = results_dir() / f"suite_{dev.lower()}_{doc['date'][:10]}"
        out, n_run = f"{base}.json", 1
        while pathlib.Path(out).exists():   # never overwrite a measurement (the planner's
            n_run += 1                      # calibration pins its source files by sha256)
            out = f"{base}_run{n_run}.json"
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)   # checked by check_out
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out}")
    _summary(doc)
    if args.plots:
        from . import plot
        for path in plot.make_plots(out, args.plots):
            print(f"wrote {path}")
    return 0


def ratio_summary(doc) -> dict:
    """dtype -> impl -> (geometric mean, min, max) of the speed relative to cuBLAS over the
    problems of a results document, for ``auto`` and ``tensorcore``."""
    out = {}
    for r in doc["results"]:
        if r["impl"] in ("auto", "tensorcore") and _positive(r.get("ratio_to_cublas")):
            out.setdefault(r["dtype"], {}).setdefault(r["impl"], []).append(r["ratio_to_cublas"])
    return {d: {i: (math.exp(sum(map(math.log, v)) / len(v)), min(v), max(v))
                for i, v in per.items()} for d, per in out.items()}


def _positive(x) -> bool:
    """A number > 0 (not a bool): what the tables take from a results file's optional fields."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def _table_rows(doc):
    summ = ratio_summary(doc)
    largest = max((r["m"] * r["n"] * r["k"], r["problem"]) for r in doc["results"])[1]
    speed = {(r["dtype"], r["impl"]): r.get("tflops") for r in doc["results"]
             if r["problem"] == largest and _positive(r.get("tflops"))}
    rows = []
    for d, per in summ.items():
        cells = [f"{g:.2f} ({lo:.2f}–{hi:.2f})" for g, lo, hi in
                 (per.get("auto", (0, 0, 0)), per.get("tensorcore", (0, 0, 0)))]
        unit = "TOP/s" if d == "int8" else "TFLOP/s"
        fast = " / ".join(f"{speed[(d, i)]:.0f}" if speed.get((d, i)) else "–"
                          for i in ("auto", "tensorcore", "cublas"))
        rows.append((d, cells[0], cells[1], f"{fast} {unit}"))
    return largest, rows


def readme_table(doc) -> str:
    """The headline table (markdown, for the README) of a results document: per dtype, the
    geometric mean (range) of the speed relative to cuBLAS, and the largest problem's speeds."""
    largest, rows = _table_rows(doc)
    lines = [f"| type | pyblasgemm `auto` | our kernels (forced) | {largest}: auto / ours / "
             f"cuBLAS |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines)


def rst_table(doc) -> str:
    """The same table as an rst list-table (for docs/performance.rst)."""
    largest, rows = _table_rows(doc)
    out = [".. list-table::", "   :header-rows: 1", "   :widths: 16 28 28 28", "",
           "   * - type", "     - pyblasgemm ``auto``", "     - our kernels (forced)",
           f"     - {largest}: auto / ours / cuBLAS"]
    for r in rows:
        out += [f"   * - {r[0]}"] + [f"     - {c}" for c in r[1:]]
    return "\n".join(out)


#: implementations that are yardsticks (peers), not pyblasgemm
PEERS = ("cublas", "cupy", "torch", "numpy")


def summary_lines(doc) -> list[str]:
    """The run's table: microseconds per call of every implementation measured (errors as
    ``err``), and ``auto``'s speed relative to the fastest peer (> 1: pyblasgemm is faster)."""
    by, impls = {}, []
    for r in doc["results"]:
        by.setdefault((r["dtype"], r["problem"]), {})[r["impl"]] = r
        if r["impl"] not in impls:
            impls.append(r["impl"])
    width = max([18] + [len(prob) for _, prob in by])
    head = f"{'dtype':8} {'problem':{width}} " + " ".join(f"{i:>10}" for i in impls)
    lines = [head + "  auto/best peer", f"{'':8} {'':{width}} " +
             " ".join(f"{'µs':>10}" for _ in impls)]
    failed = []
    for (d, prob), row in by.items():
        cells = []
        for i in impls:
            r = row.get(i)
            if r is None:
                cells.append(f"{'':>10}")
            elif r.get("seconds"):
                cells.append(f"{r['seconds'] * 1e6:10.4g}")
            else:
                cells.append(f"{'err':>10}")
                failed.append(f"{d} {prob} {i}: {r.get('error')}")
        peers = [row[i]["seconds"] for i in PEERS if row.get(i, {}).get("seconds")]
        auto = row.get("auto", {}).get("seconds")
        ratio = f"{min(peers) / auto:15.2f}" if peers and auto else f"{'-':>15}"
        lines.append(f"{d:8} {prob:{width}} " + " ".join(cells) + ratio)
    return lines + [f"  {f}" for f in failed]


def _summary(doc):
    print("\n".join(summary_lines(doc)))


if __name__ == "__main__":
    sys.exit(main())
