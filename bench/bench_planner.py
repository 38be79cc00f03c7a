"""How good are the planner's choices? Planner vs every forced candidate vs cuBLAS, on the GPU.

    python bench/bench_planner.py bench/results/planner_h100_$(date +%F).json [--budget 330]
                                  [--dtypes f16,bf16,i8,3xtf32] [--quick]

For each problem of the public shape suite (squares 1024-8192, 3072^3, 5000^3, 256x256x65536,
512x512x32768, {16,64,128} x {4096,14336} x 4096, 4096x4096x128, 1000^3, 4095x4097x1023), in
float16, bfloat16, int8 and float32 with 3xTF32, all "TN" (both operands K-contiguous, the
arrangement every backend runs natively), this times in one process on the same buffers:

* the planner's choice (``plan_for(desc)`` with the device's spec: cuBLAS or our kernels);
* forced candidates of our kernels. Subsample (all of them would take hours to compile and
  run): the model's 4 best, the model's best of every decomposition, and the kernels'
  ``default_config``; each is a real ``Plan`` run through the tensorcore backend;
* cuBLAS through its backend (for 3xTF32: not available, SGEMM is reported as the yardstick).

Timing: every implementation runs through ``backend.run(desc, a, b, c, plan)``, the layer
``execute`` calls: CUDA events around ``reps`` back-to-back calls after warm-up (so small
problems include the host overhead a user sees per call), median of 3 samples, in ``ROUNDS``
rounds that each time every implementation once (candidates, cuBLAS and the planner's choice
in a freshly shuffled order); each implementation's time is its median over the rounds, so
that clock drift and outliers do not decide which of several near-equal candidates is "best". Kernels are compiled up front in parallel (``jit.warm``) so compilation is never
timed. Problems are skipped (and listed) once ``--budget`` seconds have passed.

Summary: the fraction of problems where the planner is within 5% of the best implementation
measured (forced candidates and cuBLAS), the planner's ratio to cuBLAS, and the model's
prediction error, per dtype; everything per problem in the JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SHAPES = ([(s, s, s) for s in (1024, 2048, 4096, 8192)]
          + [(3072, 3072, 3072), (5000, 5000, 5000), (256, 256, 65536), (512, 512, 32768)]
          + [(m, n, 4096) for m in (16, 64, 128) for n in (4096, 14336)]
          + [(4096, 4096, 128), (1000, 1000, 1000), (4095, 4097, 1023)])
DTYPES = ("f16", "bf16", "i8", "3xtf32")


def pick_candidates(forced_plan, desc):
    """The subsample of our candidates to time (see the module docstring)."""
    from pyblasgemm.kernels import default_config
    from pyblasgemm.planner.core import Candidate, kernel_problem_for
    from pyblasgemm.planner import model as M

    scored = sorted((c for c in forced_plan.candidates
                     if c.backend == "tensorcore" and c.score is not None), key=lambda c: c.time)
    picked = scored[:4]
    for d in ("sliced", "splitk_serial", "splitk_parallel", "streamk", "hybrid"):
        best = next((c for c in scored if c.config.decomposition == d), None)
        if best is not None and best not in picked:
            picked.append(best)
    prob = kernel_problem_for(desc)
    dflt = default_config(prob, forced_plan.arch.sm_count)
    if M.check(dflt, prob, forced_plan.arch)[0] and all(c.config != dflt for c in picked):
        picked.append(Candidate("tensorcore", dflt,
                                M.score_ours(dflt, prob, forced_plan.arch, M.load_calibration())))
    return picked


def operands(cp, desc, rng):
    row = desc.row
    ar, ac = desc.a_shape()
    br, bc = desc.b_shape()

    def make(n, dtype):
        if np.dtype(dtype) == np.int8:
            return cp.asarray(rng.integers(-128, 128, n).astype(np.int8))
        return cp.asarray(rng.uniform(-1, 1, n).astype(dtype))

    return (make(desc.lda * ac, row.ab_dtype), make(desc.ldb * bc, row.ab_dtype),
            cp.empty(desc.ldc * desc.n, dtype=row.c_dtype))


#: timing rounds per problem (each times every implementation once, shuffled)
ROUNDS = 3
#: the operands' and the round order's seeds
SEEDS = "operands: numpy default_rng(0); round order: random.Random(0)"


def timer(cp, fn, predicted_s):
    """Median GPU seconds per call over 3 samples, enough back-to-back calls for ~2 ms each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from timing import event_median_s

    reps = int(min(20, max(1, 2e-3 / max(predicted_s, 1e-6))))
    return event_median_s(fn, inner=reps, samples=3, warmup=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON output path")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds (default 330)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--quick", action="store_true", help="4096^3 and 3072^3 only")
    args = ap.parse_args(argv)

    import cupy as cp

    import pyblasgemm
    from pyblasgemm.backends import get_backend
    from pyblasgemm.benchmarks.suite import provenance
    from pyblasgemm.kinds import ROUTES
    from pyblasgemm.kernels import jit
    from pyblasgemm.planner import Plan, make_desc, plan_for
    from pyblasgemm.planner.arch import arch_for_device, device_identity

    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    shuffle = random.Random(0)
    dev = cp.cuda.Device()
    arch = arch_for_device(dev.id)
    shapes = [(4096, 4096, 4096), (3072, 3072, 3072)] if args.quick else SHAPES
    dtypes = args.dtypes.split(",")
    problems = [(dt, s) for dt in dtypes for s in shapes]

    # plan everything first, then compile every instantiation in parallel
    planned = []
    specs = set()
    for dt, (m, n, k) in problems:
        desc = make_desc(m, n, k, dt, transa="T", transb="N", device=dev.id)
        auto = plan_for(desc)
        forced = plan_for(desc, "tensorcore")
        cands = pick_candidates(forced, desc)
        route = ROUTES[(desc.prefix, desc.compute)]
        kind, acc = route.kernel_kind, route.accumulator
        for c in cands + ([auto] if auto.backend == "tensorcore" else []):
            specs.add((c.config, kind, "T", "N", acc, True))
        planned.append((dt, desc, auto, cands))
    # one spec per binary: split counts and stream-k vs hybrid share a kernel
    unique = {}
    for spec in specs:
        cfg = spec[0]
        unique.setdefault((jit.kernel_name(cfg, *spec[1:]), cfg.decomposition == "splitk_parallel"), spec)
    print(f"{arch.short()}\ncompiling {len(unique)} kernel instantiations ...", flush=True)
    t0 = time.perf_counter()
    jit.warm(sorted(unique.values(), key=repr))
    compile_s = time.perf_counter() - t0
    print(f"compiled in {compile_s:.0f} s", flush=True)

    ident = device_identity(dev.id)
    out = {"schema": "pyblasgemm-bench-planner/1", **provenance(SEEDS),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           **ident, "sm_count": arch.sm_count, "cupy": cp.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "pyblasgemm": pyblasgemm.__version__,
           "layout": "TN (column-major; both operands K-contiguous)",
           "method": f"backend.run per call, CUDA events around back-to-back calls after 2 warm-ups, "
                     f"median of 3 samples; {ROUNDS} rounds, each timing every implementation (candidates, "
                     f"cuBLAS, the plan) once in a shuffled order, median over the rounds; kernels "
                     f"compiled beforehand",
           "subsample": "model's 4 best + model's best per decomposition + kernels' default_config",
           "compile_s": compile_s, "results": [], "skipped": []}
    cublas = get_backend("cublas")
    ours = get_backend("tensorcore")
    # the budget covers compilation too, but timing always gets at least two minutes
    deadline = t_start + max(args.budget, compile_s + 120)
    for dt, desc, auto, cands in planned:
        if time.perf_counter() > deadline:
            out["skipped"].append([dt, desc.m, desc.n, desc.k])
            continue
        a, b, c = operands(cp, desc, rng)
        entries = [("tensorcore", cand.config, cand.time) for cand in cands]
        theirs_desc = desc._replace(compute="fp32") if desc.compute == "3xtf32" else desc
        entries += [("cublas", None, None), ("plan", None, None)]
        row = {"dtype": dt, "m": desc.m, "n": desc.n, "k": desc.k,
               "plan": {"backend": auto.backend, "config": getattr(auto.config, "name", None),
                        "decomposition": auto.decomposition, "predicted_s": auto.predicted_s,
                        "source": auto.source}, "candidates": []}
        be = get_backend(auto.backend)
        samples = [[] for _ in entries]
        errors = {}
        for _ in range(ROUNDS):
            order = list(range(len(entries)))
            shuffle.shuffle(order)
            for i in order:
                backend, cfg, predicted = entries[i]
                if i in errors:
                    continue
                try:
                    if backend == "cublas":
                        t = timer(cp, lambda: cublas.run(theirs_desc, a, b, c), 1e-4)
                    elif backend == "plan":      # the planner's choice, through the same layer
                        t = timer(cp, lambda: be.run(desc, a, b, c, auto), auto.predicted_s or 1e-4)
                    else:
                        p = Plan("tensorcore", "forced by bench_planner", cfg, cfg.decomposition)
                        t = timer(cp, lambda: ours.run(desc, a, b, c, p), predicted)
                    samples[i].append(t)
                except Exception as exc:  # a failing candidate is reported, not fatal
                    errors[i] = f"{type(exc).__name__}: {str(exc)[:200]}"
        for i, (backend, cfg, predicted) in enumerate(entries):
            t = statistics.median(samples[i]) if samples[i] else None
            if backend == "cublas":
                if t is not None:
                    row["cublas_s"] = t
                row["cublas_note"] = "SGEMM (fp32): cuBLAS has no 3xTF32" if desc.compute == "3xtf32" else ""
            elif backend == "plan":
                row["plan_s"] = t
            elif i in errors:
                row["candidates"].append({"config": cfg.name, "error": errors[i]})
            else:
                row["candidates"].append({"config": cfg.name, "predicted_s": predicted, "measured_s": t})
        options = [x["measured_s"] for x in row["candidates"] if "measured_s" in x]
        if desc.compute != "3xtf32" and "cublas_s" in row:
            options.append(row["cublas_s"])
        row["best_s"] = min(options) if options else None
        if row["plan_s"] is None:         # the planner's choice failed: recorded, not scored
            row["plan_error"] = errors.get(len(entries) - 1)
            out["results"].append(row)
            continue
        row["plan_over_best"] = row["plan_s"] / row["best_s"] if row["best_s"] else None
        row["cublas_over_plan"] = row["cublas_s"] / row["plan_s"] if row.get("cublas_s") else None
        row["model_error"] = (auto.predicted_s / row["plan_s"]) if auto.predicted_s else None
        out["results"].append(row)
        print(f"{dt:7} {desc.m:5}x{desc.n:5}x{desc.k:5}  plan {auto.backend:10} "
              f"{row['plan']['config'] or '':42} {row['plan_s'] * 1e6:9.1f} us  best "
              f"{row['best_s'] * 1e6:9.1f} us  plan/best {row['plan_over_best']:.3f}  "
              f"cuBLAS/plan {row['cublas_over_plan'] or float('nan'):.2f}", flush=True)
        del a, b, c
        cp.get_default_memory_pool().free_all_blocks()

    summ = {}
    for dt in dtypes:
        rows = [r for r in out["results"] if r["dtype"] == dt and r["plan_over_best"]]
        if not rows:
            continue
        summ[dt] = {
            "problems": len(rows),
            "within_5pct": sum(r["plan_over_best"] <= 1.05 for r in rows) / len(rows),
            "geomean_cublas_over_plan": math.exp(statistics.mean(
                math.log(r["cublas_over_plan"]) for r in rows if r["cublas_over_plan"])),
            "median_model_error": statistics.median(r["model_error"] for r in rows if r["model_error"]),
        }
    rows = [r for r in out["results"] if r["plan_over_best"]]
    out["summary"] = {"per_dtype": summ,
                      "within_5pct_all": (sum(r["plan_over_best"] <= 1.05 for r in rows) / len(rows)
                                          if rows else None),
                      "target": "planner within 5% of the best measured on >= 90% of problems",
                      "wall_s": time.perf_counter() - t_start}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["summary"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
