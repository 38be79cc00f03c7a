"""The Hopper kernel (wgmma + TMA, sm_90a) against cuBLAS in one process, on the same inputs.

For each problem every candidate config (tile x decomposition x splits) is timed, the best one
reported next to cuBLAS: ``torch.matmul`` (cuBLAS / cuBLASLt) and ``cupy.matmul`` for fp16 and
bf16, ``torch._int_mm`` (cuBLASLt) for int8, SGEMM (``torch.matmul`` / ``cupy.matmul`` on float32,
TF32 off) for 3xTF32, cuBLAS's TF32 mode for tf32 and ``cublasGemmEx`` with a float32 C for the
fp32-output kinds (``f16_out32``, ``bf16_out32``); ``cublasGemmEx`` through pyblasgemm's cuBLAS
backend for every kind. CUDA events around back-to-back calls after warm-up,
median of samples (bench/timing.py). Problems are in BLAS terms (column-major C = op(A) op(B));
the torch/cupy calls compute the same product on the same bytes (row-major views). The sweep
picks our best config; the reported ratio then comes from a head-to-head in which the winner and
every cuBLAS path are timed in alternation (ROUNDS rounds, median), so that clock and power drift
over the sweep does not favour whichever was timed first.

    PYTHONPATH=. python bench/bench_sm90.py --out bench/results/sm90_h100_$(date +%F).json
    PYTHONPATH=. python bench/bench_sm90.py --quick      # four problems, a short table
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
from dataclasses import replace

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import event_median_s  # noqa: E402

from pyblasgemm.benchmarks.suite import provenance  # noqa: E402
from pyblasgemm.kernels import SM90_CONFIGS_BY_TILE, KernelProblem  # noqa: E402
from pyblasgemm.kernels.config import SM90_SMALL_CONFIGS  # noqa: E402
from pyblasgemm.kernels.launch import bind  # noqa: E402
from pyblasgemm.planner.model import parse_config_name  # noqa: E402

try:
    import torch
except Exception:  # pragma: no cover
    torch = None

# (group, kind, layout, m, n, k): the targets
PROBLEMS = [
    ("square", "f16", "TN", 4096, 4096, 4096), ("square", "f16", "TN", 8192, 8192, 8192),
    ("square", "bf16", "TN", 4096, 4096, 4096), ("square", "bf16", "TN", 8192, 8192, 8192),
    ("square", "f16", "NN", 8192, 8192, 8192), ("square", "f16", "NT", 8192, 8192, 8192),
    ("square", "f16", "TT", 8192, 8192, 8192),
    ("int8", "s8", "TN", 8192, 8192, 8192), ("int8", "s8", "TN", 4096, 4096, 4096),
    ("tail", "f16", "TN", 3072, 3072, 3072), ("tail", "f16", "TN", 5000, 5000, 5000),
    ("tail", "f16", "TN", 17024, 256, 4096),
    ("splitk", "f16", "TN", 256, 256, 65536), ("splitk", "f16", "TN", 512, 512, 32768),
    ("fp32", "3xtf32", "NN", 8192, 8192, 8192), ("fp32", "3xtf32", "TN", 4096, 4096, 4096),
    ("fp32", "tf32", "NN", 8192, 8192, 8192),
    ("out32", "f16_out32", "TN", 8192, 8192, 8192), ("out32", "bf16_out32", "NN", 4096, 4096, 4096),
]
ROUNDS = 5  # alternating head-to-head rounds of the winner against each cuBLAS path
QUICK = [PROBLEMS[1], PROBLEMS[7], PROBLEMS[9], PROBLEMS[12]]
DT = {"f16": cp.float16, "bf16": None, "s8": cp.int8}


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def make(kind, layout, m, n, k, rng):
    """Stored operands as row-major CuPy arrays whose memory is the column-major BLAS operand:
    A is (m, k) for 'T' (K contiguous) else (k, m); B is (n, k) for 'N' else (k, n); C (n, m)."""
    ta, tb = layout
    shape_a = (m, k) if ta == "T" else (k, m)
    shape_b = (n, k) if tb == "N" else (k, n)
    if kind == "s8":
        a = cp.asarray(rng.integers(-64, 64, size=shape_a, dtype=np.int8))
        b = cp.asarray(rng.integers(-64, 64, size=shape_b, dtype=np.int8))
        return a, b, cp.zeros((n, m), dtype=cp.int32)
    dt = {"f16": np.float16, "f16_out32": np.float16, "tf32": np.float32, "3xtf32": np.float32}.get(kind) or _bf16()
    a = cp.asarray(rng.standard_normal(shape_a, dtype=np.float32).astype(dt))
    b = cp.asarray(rng.standard_normal(shape_b, dtype=np.float32).astype(dt))
    c_dt = np.float32 if kind in ("tf32", "3xtf32", "f16_out32", "bf16_out32") else dt
    return a, b, cp.zeros((n, m), dtype=c_dt)


def problem(kind, layout, m, n, k, a, b, c):
    ta, tb = layout
    lda = k if ta == "T" else m
    ldb = k if tb == "N" else n
    return KernelProblem(kind, ta, tb, m, n, k, lda, ldb, m, a.data.ptr, b.data.ptr, c.data.ptr,
                         1 if kind == "s8" else 1.0, 0 if kind == "s8" else 0.0)


def candidates(kind, m, n, k, sms):
    out = []
    for base in [*SM90_CONFIGS_BY_TILE[kind].values(), *SM90_SMALL_CONFIGS[kind].values()]:
        bm = base.bm
        tiles = -(-m // bm) * -(-n // base.bn)
        kt = -(-k // base.bk)
        out.append(base)
        if -(-n // base.bn) >= 2 and base.bn == 128:
            out.append(replace(base, cluster=2))
            if tiles >= 4 * sms:  # the L2-reuse raster: 16 tile rows per group instead of 8
                out.append(replace(base, cluster=2, group_m=16))
        if tiles % sms:
            out += [replace(base, decomposition="streamk"), replace(base, decomposition="hybrid")]
        if tiles < sms and kt >= 8:
            for s in sorted({2, 4, 8, 16, -(-sms // tiles)}):
                if 2 <= s <= kt // 2:
                    out.append(replace(base, decomposition="splitk_parallel", splits=s))
    return out


def cublas_fns(kind, layout, m, n, k, a, b):
    """cuBLAS calls on the same bytes: C^T (n x m row-major) = op(B)^T op(A)^T."""
    ta, tb = layout
    # row-major views: A memory is (m, k) if 'T' else (k, m); op(A)^T as a row-major (k, m)
    fns = {}
    if torch is not None:
        ta_t = torch.from_dlpack(a)
        tb_t = torch.from_dlpack(b)
        at = ta_t.t() if ta == "T" else ta_t            # (k, m)
        bt = tb_t if tb == "N" else tb_t.t()            # (n, k)
        if kind == "s8":
            # cuBLASLt int8 wants "TN": (n, k) row-major @ (k, m) column-major
            fns["torch._int_mm"] = lambda: torch._int_mm(bt, at)
        elif kind == "3xtf32":
            torch.backends.cuda.matmul.allow_tf32 = False    # SGEMM: what 3xTF32 replaces
            fns["torch.matmul (SGEMM)"] = lambda: torch.matmul(bt, at)
        elif kind in ("f16", "bf16"):
            fns["torch.matmul"] = lambda: torch.matmul(bt, at)
    if kind in ("f16", "bf16", "3xtf32"):
        ca = a.T if ta == "T" else a
        cb = b if tb == "N" else b.T
        fns["cupy.matmul (SGEMM)" if kind == "3xtf32" else "cupy.matmul"] = lambda: cp.matmul(cb, ca)
    # pyblasgemm's own cuBLAS backend (cublasGemmEx) on the same column-major memory: for int8
    # this is the fastest cuBLAS path, faster than torch._int_mm's cuBLASLt
    import pyblasgemm

    routine = {"f16": pyblasgemm.hgemm, "bf16": pyblasgemm.bgemm, "s8": pyblasgemm.igemm,
               "f16_out32": pyblasgemm.shgemm, "bf16_out32": pyblasgemm.sbgemm, "tf32": pyblasgemm.sgemm,
               "3xtf32": pyblasgemm.sgemm}[kind]
    # cuBLAS's nearest mode: 3xTF32 replaces SGEMM (fp32); tf32 is cuBLAS's TF32 mode
    compute = {"3xtf32": "fp32", "tf32": "tf32"}.get(kind)
    one, zero = (1, 0) if kind == "s8" else (1.0, 0.0)
    lda, ldb = (k if ta == "T" else m), (k if tb == "N" else n)
    c_dt = {"s8": cp.int32, "f16_out32": cp.float32, "bf16_out32": cp.float32}.get(kind, a.dtype)
    c = cp.empty(m * n, dtype=c_dt)
    fa, fb = a.ravel(), b.ravel()
    fns["cublasGemmEx (pyblasgemm backend='cublas')"] = lambda: routine(
        ta, tb, m, n, k, one, fa, lda, fb, ldb, zero, c, m, backend="cublas", compute=compute)
    return fns


def bench_one(kind, layout, m, n, k, rng, sms, samples):
    a, b, c = make(kind, layout, m, n, k, rng)
    p = problem(kind, layout, m, n, k, a, b, c)
    flops = 2.0 * m * n * k
    row = dict(kind=kind, layout=layout, m=m, n=n, k=k, ours={}, cublas={})
    for name, fn in cublas_fns(kind, layout, m, n, k, a, b).items():
        try:
            row["cublas"][name] = event_median_s(fn, inner=5, samples=samples, warmup=3)
        except Exception as exc:  # noqa: BLE001 - record and go on
            row["cublas"][name] = f"error: {exc}"
    alpha, beta = (1, 0) if kind == "s8" else (1.0, 0.0)
    for cfg in candidates(kind, m, n, k, sms):
        ok, why = cfg.validate(p)
        if not ok:
            row["ours"][cfg.name] = f"refused: {why}"
            continue
        bl = bind(p, cfg)
        row["ours"][cfg.name] = event_median_s(lambda: bl(p.a_ptr, p.b_ptr, p.c_ptr, alpha, beta),
                                               inner=5, samples=samples, warmup=3)
    times = {n_: t for n_, t in row["ours"].items() if isinstance(t, float)}
    best = min(times, key=times.get)
    # The head-to-head: the winner and every cuBLAS path timed in alternation (A B C A B C ...),
    # so clock and power drift (a long sweep heats the GPU) falls on all of them alike.
    bl = bind(p, parse_config_name(best))
    fns = dict(cublas_fns(kind, layout, m, n, k, a, b))
    fns = {n_: f for n_, f in fns.items() if isinstance(row["cublas"].get(n_), float)}
    fns["ours"] = lambda: bl(p.a_ptr, p.b_ptr, p.c_ptr, alpha, beta)
    rounds = {n_: [] for n_ in fns}
    for _ in range(ROUNDS):
        for n_, f in fns.items():
            rounds[n_].append(event_median_s(f, inner=5, samples=max(3, samples // 3), warmup=2))
    head = {n_: statistics.median(v) for n_, v in rounds.items()}
    row["head_to_head"] = head
    times[best] = head.pop("ours")
    ref = head
    ref_name = min(ref, key=ref.get) if ref else None
    row.update(best=best, best_s=times[best], best_tflops=flops / times[best] / 1e12,
               cublas_best=ref_name, cublas_s=ref.get(ref_name),
               ratio_vs_cublas=(ref[ref_name] / times[best]) if ref_name else None,
               ratios={n_: t / times[best] for n_, t in ref.items()})
    sliced = [t for n_, t in times.items() if "_sliced_" in n_]
    row["best_over_sliced"] = min(sliced) / times[best] if sliced else None
    cp.cuda.get_current_stream().synchronize()
    return row


def host_overhead_us(calls: int = 3000) -> dict:
    """Host time per call (µs) of a 64x64x64 hgemm through the public API on the Hopper kernel
    (PYBLASGEMM_CONFIG forces it) and on cuBLAS, in this process: the GPU work per call is a few
    µs, so back-to-back calls are host-bound and wall time / calls is the host cost."""
    import time

    import pyblasgemm

    a = cp.asarray(np.random.default_rng(1).standard_normal(64 * 64).astype(np.float16))
    c = cp.empty(64 * 64, dtype=cp.float16)
    out = {}
    for name, backend, config in (("sm90", "tensorcore", "sm90a_sliced_64x128x64_w2x1_s8_g8"),
                                  ("cublas", "cublas", "")):
        os.environ["PYBLASGEMM_CONFIG"] = config
        pyblasgemm.clear_plan_cache()
        call = lambda: pyblasgemm.hgemm("T", "N", 64, 64, 64, 1.0, a, 64, a, 64, 0.0, c, 64,  # noqa: E731
                                        backend=backend)
        for _ in range(200):
            call()
        cp.cuda.Device().synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            cp.cuda.Device().synchronize()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        out[name] = best
    os.environ.pop("PYBLASGEMM_CONFIG", None)
    pyblasgemm.clear_plan_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--only", help="comma-separated substrings of 'kind-layout-mxnxk' to keep")
    args = ap.parse_args(argv)
    # before host_overhead_us sets PYBLASGEMM_CONFIG for its own calls
    record = provenance("numpy default_rng(0), in order; host cost: default_rng(1)")
    rng = np.random.default_rng(0)
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    probs = QUICK if args.quick else PROBLEMS
    if args.only:
        probs = [p for p in probs if any(o in f"{p[1]}-{p[2]}-{p[3]}x{p[4]}x{p[5]}" for o in args.only.split(","))]
    rows = []
    for group, kind, layout, m, n, k in probs:
        r = bench_one(kind, layout, m, n, k, rng, sms, args.samples)
        r["group"] = group
        rows.append(r)
        print(f"{kind:4} {layout} {m}x{n}x{k}: ours {r['best_tflops']:7.1f} T/s ({r['best']}), "
              f"{r['cublas_best']} {2.0 * m * n * k / r['cublas_s'] / 1e12 if r['cublas_s'] else float('nan'):7.1f}"
              f" -> {r['ratio_vs_cublas']:.3f}x best cuBLAS, {r['best_over_sliced']:.2f}x sliced; "
              + ", ".join(f"{k_.split(' ')[0]} {v:.2f}x" for k_, v in r["ratios"].items()), flush=True)
    host = host_overhead_us()
    print(f"host us per 64^3 hgemm call: Hopper kernel {host['sm90']:.1f}, cuBLAS {host['cublas']:.1f}")
    f16 = [r["ratio_vs_cublas"] for r in rows if r["kind"] == "f16" and r["ratio_vs_cublas"]]
    out = dict(**record, device=cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(), sms=sms,
               date=datetime.date.today().isoformat(), cupy=cp.__version__,
               torch=getattr(torch, "__version__", None), rows=rows, host_us=host,
               geomean_f16_vs_cublas=math.exp(sum(math.log(x) for x in f16) / len(f16)) if f16 else None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
