"""mma.sync against cuBLAS at fp16 4096^3 and 8192^3 (issue #3's speed target), two ways.

Three of our kernels on the same operands as cuBLAS (``cupy.matmul``):

- ``mma.sync cp.async``: the portable sm_80 kernel (cp.async ring, CTA barriers), 128x256x64;
- ``mma.sync TMA``: the Hopper kernel's TMA ring and producer warp feeding mma.sync consumers
  (``consumer='mma.sync'``, 128x256 CTA tile of 64x64 warp tiles), alone and in 2-CTA clusters;
- ``wgmma``: the Hopper kernel as shipped, for scale.

Two timings of each, because an H100 at fp16 GEMM sits at its power limit and the clock it
runs at depends on how long it has been busy:

- *burst*: CUDA events around back-to-back calls, median of samples (bench/timing.py), every
  implementation timed in alternation over ROUNDS rounds (median per implementation);
- *sustained*: each implementation runs for SECONDS without pause while ``nvidia-smi`` samples
  the SM clock, the power draw and the throttle reasons every 50 ms; reported are TFLOP/s over
  that window and the median clock and power after the first 0.8 s.

    PYTHONPATH=. python bench/bench_mma_sync.py --out bench/results/mma_sync_h100_$(date +%F).json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import event_median_s  # noqa: E402

from pyblasgemm.benchmarks.suite import provenance  # noqa: E402
from pyblasgemm.kernels import SM90_CONFIGS_BY_TILE, KernelConfig, KernelProblem  # noqa: E402
from pyblasgemm.kernels.launch import prepare  # noqa: E402

ROUNDS = 3
SECONDS = 3.0


def implementations(p: KernelProblem):
    """name -> zero-argument callable launching that implementation on ``p``'s operands."""
    wg = SM90_CONFIGS_BY_TILE["f16"][256]
    sync = replace(wg, consumer="mma.sync")
    return {
        "mma.sync cp.async 128x256x64 s3": prepare(p, KernelConfig(bm=128, bn=256, bk=64, warps_m=2, warps_n=4,
                                                                   stages=3)),
        "mma.sync TMA 256x128 s4": prepare(p, sync),
        "mma.sync TMA 256x128 s4 cluster 2": prepare(p, replace(sync, cluster=2)),
        "wgmma 256x128 s4": prepare(p, wg),
    }


def sustained(fn, flops, seconds=SECONDS):
    """(TFLOP/s over `seconds` of back-to-back calls, wall start, wall end)."""
    fn()
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    t0 = time.time()
    e0.record()
    calls = 0
    while time.time() - t0 < seconds:
        for _ in range(4):
            fn()
        calls += 4
        cp.cuda.Device().synchronize()
    e1.record()
    e1.synchronize()
    return flops * calls / (cp.cuda.get_elapsed_time(e0, e1) * 1e-3) / 1e12, t0, time.time()


def smi_samples(path):
    rows = []
    for line in open(path):
        parts = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, float(parts[1].split()[0]), float(parts[2].split()[0]), parts[3]))
        except (ValueError, IndexError):
            continue
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--layouts", default="TN,NN")
    args = ap.parse_args()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    cp.random.seed(0)                 # the operands: CuPy's global generator, in order
    res = {**provenance("CuPy's global RNG seeded 0"),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": props["name"].decode(),
           "sm_count": dev.attributes["MultiProcessorCount"], "cupy": cp.__version__,
           "reference": "cupy.matmul float16 (cuBLAS)", "burst": [], "sustained": []}
    smi_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pyblasgemm_smi.csv")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "50"], stdout=open(smi_path, "w"))
    windows = []
    try:
        for size in map(int, args.sizes.split(",")):
            m = n = k = size
            flops = 2.0 * m * n * k
            a = cp.random.standard_normal(m * k, dtype=cp.float32).astype(cp.float16)
            b = cp.random.standard_normal(k * n, dtype=cp.float32).astype(cp.float16)
            c = cp.empty(m * n, cp.float16)
            for layout in args.layouts.split(","):
                ta, tb = layout
                # the same bytes as cuBLAS's row-major (m,k)@(k,n): our column-major views of them
                p = KernelProblem(kind="f16", transa=ta, transb=tb, m=m, n=n, k=k, lda=k if ta == "T" else m,
                                  ldb=k if tb == "N" else n, ldc=m, a_ptr=a.data.ptr, b_ptr=b.data.ptr,
                                  c_ptr=c.data.ptr, alpha=1.0, beta=0.0)
                a2, b2 = a.reshape(m, k), b.reshape(k, n)
                impls = {"cuBLAS (cupy.matmul)": lambda: cp.matmul(a2, b2)}
                impls.update(implementations(p))
                times = {name: [] for name in impls}
                for _ in range(ROUNDS):
                    for name, fn in impls.items():
                        times[name].append(event_median_s(fn, inner=5, samples=7, warmup=2))
                ref = statistics.median(times["cuBLAS (cupy.matmul)"])
                for name, ts in times.items():
                    t = statistics.median(ts)
                    res["burst"].append({"size": size, "layout": layout, "impl": name, "tflops": flops / t / 1e12,
                                         "ratio_vs_cublas": ref / t})
                for name, fn in impls.items():
                    tf, t0, t1 = sustained(fn, flops)
                    windows.append((size, layout, name, tf, t0, t1))
                    time.sleep(1.0)
            del a, b, c
    finally:
        smi.terminate()
        smi.wait()
    samples = smi_samples(smi_path)
    for size, layout, name, tf, t0, t1 in windows:
        sel = [s for s in samples if t0 + 0.8 <= s[0] <= t1]
        res["sustained"].append({
            "size": size, "layout": layout, "impl": name, "tflops": tf,
            "sm_clock_mhz": statistics.median(s[1] for s in sel) if sel else None,
            "power_w": statistics.median(s[2] for s in sel) if sel else None,
            "throttle_reasons": sorted({s[3] for s in sel}), "samples": len(sel)})
    refs = {(r["size"], r["layout"]): r["tflops"] for r in res["sustained"] if r["impl"].startswith("cuBLAS")}
    for r in res["sustained"]:
        r["ratio_vs_cublas"] = r["tflops"] / refs[(r["size"], r["layout"])]
    print(f"{res['device']}: burst (alternating rounds) and sustained ({SECONDS:.0f} s) fp16 TFLOP/s")
    for r in res["burst"]:
        print(f"burst     {r['size']:5d} {r['layout']} {r['impl']:36s} {r['tflops']:6.0f}  {r['ratio_vs_cublas']:.3f}")
    for r in res["sustained"]:
        print(f"sustained {r['size']:5d} {r['layout']} {r['impl']:36s} {r['tflops']:6.0f}  {r['ratio_vs_cublas']:.3f}"
              f"  {r['sm_clock_mhz']} MHz {r['power_w']} W {r['throttle_reasons']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
