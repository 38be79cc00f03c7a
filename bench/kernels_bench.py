"""Benchmark pyblasgemm's kernels against cuBLAS (CuPy / PyTorch) in the same process.

CUDA events around `reps` back-to-back launches after warm-up; median over `trials`.
Writes JSON (device, versions, every measurement and ratio) to --out.

    PYTHONPATH=. python bench/kernels_bench.py --out bench/results/kernels_$(date +%F).json
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import cupy as cp
import numpy as np

from pyblasgemm.kernels import KernelConfig, KernelProblem
from pyblasgemm.kernels.config import SHIPPED_CONFIGS, default_config
from pyblasgemm.kernels.launch import prepare

try:
    import torch
except Exception:  # pragma: no cover
    torch = None


def timeit(fn, reps=10, trials=5, warm=2):
    for _ in range(warm):
        fn()
    cp.cuda.get_current_stream().synchronize()
    ts = []
    for _ in range(trials):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for _ in range(reps):
            fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) / reps * 1e-3)
    return statistics.median(ts)


def operands(kind, m, n, k, ta, tb, rng):
    dt = {"f16": cp.float16, "bf16": cp.float16, "s8": cp.int8, "tf32": cp.float32, "3xtf32": cp.float32}[kind]
    if kind == "s8":
        a = cp.asarray(rng.integers(-128, 128, size=(m * k,), dtype=np.int8))
        b = cp.asarray(rng.integers(-128, 128, size=(k * n,), dtype=np.int8))
    else:
        a = cp.random.standard_normal(m * k, dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal(k * n, dtype=cp.float32).astype(dt)
    cdt = {"s8": cp.int32, "tf32": cp.float32, "3xtf32": cp.float32}.get(kind, dt)
    c = cp.empty(m * n, dtype=cdt)
    lda = k if ta == "T" else m
    ldb = n if tb == "T" else k
    p = KernelProblem(kind=kind, transa=ta, transb=tb, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=m, a_ptr=a.data.ptr,
                      b_ptr=b.data.ptr, c_ptr=c.data.ptr, alpha=1 if kind == "s8" else 1.0,
                      beta=0 if kind == "s8" else 0.0)
    return p, (a, b, c)


def ours(p, cfg=None, **kw):
    launch = prepare(p, cfg, **kw)
    return timeit(launch), launch.config.name


def cublas_time(kind, m, n, k):
    """cuBLAS on row-major (m,k)@(k,n) of the same dtype: cupy.matmul, torch where cupy has no path."""
    if kind in ("f16", "tf32", "3xtf32"):
        dt = cp.float16 if kind == "f16" else cp.float32
        a = cp.random.standard_normal((m, k), dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal((k, n), dtype=cp.float32).astype(dt)
        if kind == "tf32" and torch is not None:
            torch.backends.cuda.matmul.allow_tf32 = True
            ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
            t = timeit(lambda: torch.matmul(ta, tb))
            torch.backends.cuda.matmul.allow_tf32 = False
            return t, "torch.matmul tf32"
        return timeit(lambda: cp.matmul(a, b)), f"cupy.matmul {cp.dtype(dt).name}"
    if kind == "s8" and torch is not None:
        ta = torch.randint(-128, 127, (m, k), dtype=torch.int8, device="cuda")
        tb = torch.randint(-128, 127, (n, k), dtype=torch.int8, device="cuda").t()
        return timeit(lambda: torch._int_mm(ta, tb)), "torch._int_mm (cuBLASLt)"
    return float("nan"), "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = dev.attributes["MultiProcessorCount"]
    res = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": props["name"].decode(),
           "sm_count": sms, "cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
           "driver": cp.cuda.runtime.driverGetVersion(), "nvrtc": list(cp.cuda.nvrtc.getVersion()),
           "torch": getattr(torch, "__version__", None), "python": sys.version.split()[0], "results": []}

    def rec(name, kind, m, n, k, t_ours, cfg_name, t_ref, ref_name, extra=None):
        flops = 2.0 * m * n * k
        r = {"name": name, "kind": kind, "m": m, "n": n, "k": k, "ours_s": t_ours, "config": cfg_name,
             "ours_tflops": flops / t_ours / 1e12, "ref_s": t_ref, "ref": ref_name,
             "ref_tflops": flops / t_ref / 1e12 if t_ref == t_ref else None,
             "ratio_vs_ref": (t_ref / t_ours) if t_ref == t_ref else None}
        r.update(extra or {})
        res["results"].append(r)
        print(f"{name:34s} {kind:6s} {m}x{n}x{k}: ours {r['ours_tflops']:7.1f} T/s [{cfg_name}]  "
              f"{ref_name} {r['ref_tflops'] or float('nan'):7.1f}  ratio {r['ratio_vs_ref'] or float('nan'):.3f}",
              flush=True)

    # 1) fp16 large squares vs cuBLAS; TN (both K-contiguous) and NN, a few tile configs
    f16_cfgs = [None, SHIPPED_CONFIGS["f16"][0], SHIPPED_CONFIGS["f16"][6],
                KernelConfig(bm=128, bn=256, bk=64, warps_m=2, warps_n=4, stages=3),
                KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=3),
                KernelConfig(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=5)]
    for s in ([4096] if args.quick else [4096, 8192]):
        tref, rname = cublas_time("f16", s, s, s)
        best = None
        for lay in ("TN", "NN"):
            p, keep = operands("f16", s, s, s, lay[0], lay[1], rng)
            for cfg in (f16_cfgs if lay == "TN" else [None]):
                ok = cfg is None or cfg.validate(p)[0]
                if not ok:
                    continue
                t, name = ours(p, cfg)
                rec(f"f16 {lay} {s}^3", "f16", s, s, s, t, name, tref, rname)
                best = t if best is None else min(best, t)
            del keep
        res["results"][-1]["best_ours_ratio"] = tref / best
    # 2) split-k vs sliced on 512x512x32768
    m = n = 512
    k = 32768
    p, keep = operands("f16", m, n, k, "T", "N", rng)
    tref, rname = cublas_time("f16", m, n, k)
    t_sl, n_sl = ours(p, SHIPPED_CONFIGS["f16"][0])
    rec("f16 sliced long-K", "f16", m, n, k, t_sl, n_sl, tref, rname)
    for cfg in (None, KernelConfig(decomposition="splitk_parallel", splits=8),
                KernelConfig(decomposition="splitk_serial", splits=4), KernelConfig(decomposition="streamk")):
        t, name = ours(p, cfg)
        rec("f16 split/stream long-K", "f16", m, n, k, t, name, tref, rname, {"speedup_vs_sliced": t_sl / t})
    del keep
    # 3) stream-k vs sliced at 3072^3 with 128x128 tiles
    s = 3072
    p, keep = operands("f16", s, s, s, "T", "N", rng)
    tref, rname = cublas_time("f16", s, s, s)
    t_sl, n_sl = ours(p, SHIPPED_CONFIGS["f16"][0])
    rec("f16 sliced 3072", "f16", s, s, s, t_sl, n_sl, tref, rname)
    for d in ("streamk", "hybrid"):
        t, name = ours(p, KernelConfig(decomposition=d))
        rec(f"f16 {d} 3072", "f16", s, s, s, t, name, tref, rname, {"speedup_vs_sliced": t_sl / t})
    del keep
    # 4) int8 8192^3 (TN)
    s = 4096 if args.quick else 8192
    p, keep = operands("s8", s, s, s, "T", "N", rng)
    tref, rname = cublas_time("s8", s, s, s)
    for cfg in (None, SHIPPED_CONFIGS["s8"][0], KernelConfig(bm=128, bn=256, bk=128, warps_m=2, warps_n=4, stages=3)):
        t, name = ours(p, cfg)
        rec("s8 TN", "s8", s, s, s, t, name, tref, rname)
    del keep
    # 5) 3xTF32 and TF32 vs cuBLAS SGEMM / TF32 at 8192^3
    for kind in ("3xtf32", "tf32"):
        p, keep = operands(kind, s, s, s, "T", "N", rng)
        tref, rname = cublas_time(kind, s, s, s)
        for cfg in (None, SHIPPED_CONFIGS[kind][0], KernelConfig(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3)):
            t, name = ours(p, cfg)
            rec(f"{kind} TN", kind, s, s, s, t, name, tref, rname)
        del keep
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
