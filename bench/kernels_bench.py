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
from dataclasses import replace

import cupy as cp
import numpy as np

sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from timing import event_median_s  # noqa: E402

from pyblasgemm.benchmarks.suite import provenance
from pyblasgemm.kernels import KernelConfig, KernelProblem
from pyblasgemm.kernels.config import SHIPPED_CONFIGS, default_config
from pyblasgemm.kernels.launch import prepare

try:
    import torch
except Exception:  # pragma: no cover
    torch = None


def timeit(fn, reps=10, trials=5, warm=2):
    """Median GPU seconds per call (bench/timing.py)."""
    return event_median_s(fn, inner=reps, samples=trials, warmup=warm)


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
    ap.add_argument("--sections", default="f16,bf16,splitk,streamk,s8,tf32,host",
                    help="comma list of: f16 bf16 splitk streamk s8 tf32 host")
    ap.add_argument("--f16-configs", default="all", help="all | few (default + 3 candidates)")
    ap.add_argument("--profile-one", default=None,
                    help="kind,layout,size,bm,bn,bk,wm,wn,stages: just launch that kernel 3 times (for ncu)")
    args = ap.parse_args()
    if args.profile_one:
        kind, lay, size, bm, bn, bk, wm, wn, st = args.profile_one.split(",")
        size = int(size)
        p, keep = operands(kind, size, size, size, lay[0], lay[1], np.random.default_rng(0))
        launch = prepare(p, KernelConfig(bm=int(bm), bn=int(bn), bk=int(bk), warps_m=int(wm), warps_n=int(wn),
                                         stages=int(st)))
        for _ in range(3):
            launch()
        cp.cuda.Device().synchronize()
        return
    sec = set(args.sections.split(","))
    rng = np.random.default_rng(0)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = dev.attributes["MultiProcessorCount"]
    res = {**provenance(0), "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": props["name"].decode(), "sm_count": sms, "cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
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
        if args.out:  # incremental, so a run cut off at its time limit still leaves its numbers
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)

    K = KernelConfig
    f16_cfgs = [None, SHIPPED_CONFIGS["f16"][0], SHIPPED_CONFIGS["f16"][6],
                K(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=3),
                K(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=5),
                K(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=3),
                K(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=4),
                K(bm=128, bn=256, bk=32, warps_m=2, warps_n=4, stages=3),
                K(bm=128, bn=256, bk=64, warps_m=2, warps_n=4, stages=3),
                K(bm=256, bn=128, bk=32, warps_m=4, warps_n=2, stages=3),
                K(bm=256, bn=128, bk=64, warps_m=4, warps_n=2, stages=3)]
    f16_nn = [None, K(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=3),
              K(bm=128, bn=256, bk=64, warps_m=2, warps_n=4, stages=3)]
    # (tf32 tiles with a 256-wide M/N dimension are invalid: 1 KB smem rows exceed the swizzle)
    tf_cfgs = [None, K(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=3),
               K(bm=128, bn=128, bk=16, warps_m=2, warps_n=2, stages=4),
               K(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=3)]
    # compile everything up front, in parallel
    from pyblasgemm.kernels import jit
    specs = set()
    for c in (f16_cfgs[1:] if "f16" in sec else []):
        specs.add((c, "f16", "T", "N", None, True))
    for c in (f16_nn[1:] if "f16" in sec else []):
        specs.add((c, "f16", "N", "N", None, True))
    for kind in (("3xtf32", "tf32") if "tf32" in sec else ()):
        for c in tf_cfgs[1:]:
            specs.add((c, kind, "T", "N", None, True))
    try:
        jit.warm(sorted(specs, key=str))
    except Exception as e:  # a config that fails to compile is reported where it is used
        print("warm:", e)

    def try_ours(p, cfg):
        try:
            return ours(p, cfg)
        except Exception as e:
            print(f"  {cfg.name if cfg else 'default'}: FAILED {type(e).__name__}: {str(e)[:200]}")
            return None, None

    # 1) fp16 large squares vs cuBLAS; TN (both K-contiguous) and NN, several tile configs
    if args.f16_configs == "few":
        f16_cfgs = f16_cfgs[:2] + f16_cfgs[5:6] + f16_cfgs[8:9]
    for s in ([] if "f16" not in sec else [4096] if args.quick else [4096, 8192]):
        tref, rname = cublas_time("f16", s, s, s)
        best = None
        for lay in ("TN", "NN"):
            p, keep = operands("f16", s, s, s, lay[0], lay[1], rng)
            for cfg in (f16_cfgs if lay == "TN" else f16_nn):
                ok = cfg is None or cfg.validate(p)[0]
                if not ok:
                    continue
                t, name = try_ours(p, cfg)
                if t is None:
                    continue
                rec(f"f16 {lay} {s}^3", "f16", s, s, s, t, name, tref, rname)
                best = t if best is None else min(best, t)
            del keep
        res["results"][-1]["best_ours_ratio"] = tref / best
        print(f"  best f16 {s}^3 ratio vs cuBLAS: {tref / best:.3f}", flush=True)
    # 1b) bf16 4096^3 (cuBLAS bf16 via torch)
    if torch is not None and "bf16" in sec:
        s = 4096
        ta_ = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
        tb_ = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
        tref = timeit(lambda: torch.matmul(ta_, tb_))
        p, keep = operands("bf16", s, s, s, "T", "N", rng)
        for cfg in (None, K(bm=128, bn=128, bk=64, warps_m=2, warps_n=2, stages=3)):
            t, name = try_ours(p, cfg)
            if t is not None:
                rec("bf16 TN 4096^3", "bf16", s, s, s, t, name, tref, "torch.matmul bf16")
        del keep, ta_, tb_
    # 2) split-k vs sliced on 512x512x32768
    if "splitk" in sec:
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
    if "streamk" in sec:
        s = 3072
        p, keep = operands("f16", s, s, s, "T", "N", rng)
        tref, rname = cublas_time("f16", s, s, s)
        t_sl, n_sl = ours(p, SHIPPED_CONFIGS["f16"][0])
        rec("f16 sliced 3072", "f16", s, s, s, t_sl, n_sl, tref, rname)
        for d in ("streamk", "hybrid"):
            # same tile as the sliced baseline, so the comparison is the decomposition alone
            t, name = ours(p, replace(SHIPPED_CONFIGS["f16"][0], decomposition=d))
            rec(f"f16 {d} 3072", "f16", s, s, s, t, name, tref, rname, {"speedup_vs_sliced": t_sl / t})
        del keep
    # 4) int8 8192^3 (TN)
    if "s8" in sec:
        s = 4096 if args.quick else 8192
        p, keep = operands("s8", s, s, s, "T", "N", rng)
        tref, rname = cublas_time("s8", s, s, s)
        for cfg in (None, SHIPPED_CONFIGS["s8"][0], KernelConfig(bm=128, bn=256, bk=128, warps_m=2, warps_n=4, stages=3)):
            t, name = ours(p, cfg)
            rec("s8 TN", "s8", s, s, s, t, name, tref, rname)
        del keep
    # 5) 3xTF32 and TF32 vs cuBLAS SGEMM / TF32 at 8192^3
    s = 4096 if args.quick else 8192
    for kind in (("3xtf32", "tf32") if "tf32" in sec else ()):
        p, keep = operands(kind, s, s, s, "T", "N", rng)
        tref, rname = cublas_time(kind, s, s, s)
        for cfg in tf_cfgs:
            t, name = try_ours(p, cfg)
            if t is not None:
                rec(f"{kind} TN", kind, s, s, s, t, name, tref, rname)
        del keep
    # 6) host time per call: BoundLaunch vs prepare() vs cupy.matmul, 64x64x64 f16
    if "host" in sec:
        import time
        from pyblasgemm.kernels.launch import bind
        p, keep = operands("f16", 64, 64, 64, "N", "N", rng)
        bl = bind(p)
        a_, b_, c_ = p.a_ptr, p.b_ptr, p.c_ptr

        def host_med(fn, reps=3000):
            for _ in range(100):
                fn()
            cp.cuda.Device().synchronize()
            ts = []
            for i in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
                if i % 500 == 499:
                    cp.cuda.Device().synchronize()
            cp.cuda.Device().synchronize()
            return statistics.median(ts) * 1e6

        ca, cb_ = cp.ones((64, 64), cp.float16), cp.ones((64, 64), cp.float16)
        host = {"bound_call_us": host_med(lambda: bl(a_, b_, c_, 1.0, 0.0)),
                "bind_plus_call_us": host_med(lambda: bind(p)(a_, b_, c_, 1.0, 0.0)),
                "prepare_plus_call_us": host_med(lambda: prepare(p)(), reps=500),
                "cupy_matmul_us": host_med(lambda: cp.matmul(ca, cb_), reps=1000)}
        res["host_time_64x64x64_f16"] = host
        print("host us per call (median):", {k: round(v, 2) for k, v in host.items()}, flush=True)
        del keep
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
