"""Host time per call of every public GPU form against PyTorch's, same bytes, same process.

For each form (matmul, matmul(out=), batched matmul, the raw BLAS form, gemm, the stateful
Matmul) x dtype (float16, bfloat16, float32, int8) x size (64³, 256³) x route (auto, our kernels
forced, cuBLAS forced) the loop issues ``calls`` back-to-back calls, synchronizes, and reports
the median over ``rounds`` of the host µs per call; at these sizes the GPU keeps up, so this is
what a caller waits for before its next line runs. The yardstick is torch.matmul (fresh result),
torch.matmul(out=) for the forms that write into given memory, torch._int_mm for int8.
``speedup`` = torch µs / ours (> 1: we are faster); the issue's bar is ours <= 0.8x torch's
(speedup >= 1.25), the stateful form's <= 0.6x torch.matmul's (speedup >= 1.667).

Also: a cProfile of the cached calls, and a breakdown of the 2-D fp16 call into its parts.

    python bench/host_cost.py bench/results/host_cost_h100_2026-11-24.json
"""
import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time

import cupy as cp
import ml_dtypes
import numpy as np
import torch

import pyblasgemm
from pyblasgemm import calls, streams


def per_call_us(fn, calls_=2000, rounds=5, warm=50):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls_):
            fn()
        samples.append((time.perf_counter() - t0) / calls_ * 1e6)
        cp.cuda.Device().synchronize()
    return statistics.median(samples)


DTYPES = {"float16": (np.float16, torch.float16), "bfloat16": (ml_dtypes.bfloat16, torch.bfloat16),
          "float32": (np.float32, torch.float32), "int8": (np.int8, torch.int8)}
ROUTES = {"auto": None, "tensorcore": "tensorcore", "cublas": "cublas"}


def _torch_view(x):
    if x.dtype == ml_dtypes.bfloat16:
        return torch.as_tensor(x.view(np.int16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(x, device="cuda")


def cases(n, dname):
    npd, td = DTYPES[dname]
    rng = np.random.default_rng(n)
    if npd == np.int8:
        mk = lambda *s: cp.asarray(rng.integers(-8, 8, s).astype(np.int8))
    else:
        mk = lambda *s: cp.asarray(rng.uniform(-1, 1, s).astype(npd))
    a, b = mk(n, n), mk(n, n)
    a8, b8 = mk(8, n, n), mk(8, n, n)
    cdt = np.int32 if npd == np.int8 else npd
    c = cp.empty((n, n), cdt)
    ta, tb, ta8, tb8 = (_torch_view(x) for x in (a, b, a8, b8))
    tc = _torch_view(c)
    if npd == np.int8:
        at = cp.ascontiguousarray(a.T)          # torch._int_mm wants B column-major
        tbt = _torch_view(at).T
        ref = {"fresh": lambda: torch._int_mm(ta, tbt), "out": lambda: torch._int_mm(ta, tbt),
               "batched": None}
    else:
        ref = {"fresh": lambda: torch.matmul(ta, tb), "out": lambda: torch.matmul(ta, tb, out=tc),
               "batched": lambda: torch.matmul(ta8, tb8)}
    raw = {"float16": pyblasgemm.hgemm, "bfloat16": pyblasgemm.bgemm, "float32": pyblasgemm.sgemm,
           "int8": pyblasgemm.igemm}[dname]
    one, zero = (1, 0) if npd == np.int8 else (1.0, 0.0)
    a1, b1, c1 = a.ravel(), b.ravel(), c.ravel()
    compute = "tf32" if dname == "float32" else None

    def forms(route):
        kw = dict(backend=route)
        if route == "tensorcore" and compute:
            kw["compute"] = compute
        f = {
            "gemm": (lambda: pyblasgemm.gemm("N", "N", a, b, **kw), "fresh"),
            "raw": (lambda: raw("N", "N", n, n, n, one, a1, n, b1, n, zero, c1, n, **kw), "out"),
        }
        if npd != np.int8:      # matmul of int8 returns int8 (NumPy's rule): not torch's product
            f["matmul"] = (lambda: pyblasgemm.matmul(a, b, **kw), "fresh")
            f["matmul_out"] = (lambda: pyblasgemm.matmul(a, b, out=c, **kw), "out")
            f["matmul_batched8"] = (lambda: pyblasgemm.matmul(a8, b8, **kw), "batched")
            mm = pyblasgemm.Matmul(a, b, out=c, **kw)
            f["stateful"] = (mm.execute, "fresh")
        return f
    return ref, forms


def run_table(sizes, dtypes, calls_, rounds):
    rows = []
    for n in sizes:
        for dname in dtypes:
            ref, forms = cases(n, dname)
            torch_us = {k: (per_call_us(fn, calls_, rounds) if fn else None) for k, fn in ref.items()}
            for route, backend in ROUTES.items():
                for form, (fn, yard) in forms(backend).items():
                    try:
                        us = per_call_us(fn, calls_, rounds)
                        err = None
                    except Exception as exc:     # a route that cannot run the case says why
                        us, err = None, f"{type(exc).__name__}: {exc}"
                    t = torch_us[yard]
                    row = dict(n=n, dtype=dname, form=form, route=route, host_us=us,
                               torch=("torch._int_mm" if dname == "int8" else
                                      "torch.matmul(out=)" if yard == "out" else "torch.matmul"),
                               torch_us=t, speedup=(t / us if us and t else None), error=err)
                    bar = 1 / 0.6 if form == "stateful" else 1.25
                    row["meets_bar"] = None if row["speedup"] is None else row["speedup"] >= bar
                    rows.append(row)
                    print(f"{n:5d} {dname:9s} {route:10s} {form:16s} "
                          f"{us if us else float('nan'):7.2f} us  torch {t or float('nan'):6.2f}"
                          f"  speedup {row['speedup'] or float('nan'):5.2f}"
                          f"{'' if row['meets_bar'] is not False else '  BELOW BAR'}"
                          f"{'  ' + err if err else ''}", flush=True)
    return rows


def breakdown():
    """The cached 2-D float16 call at 64³, part by part (µs)."""
    a = cp.asarray(np.random.rand(64, 64).astype(np.float16))
    b = a.copy()
    c = pyblasgemm.matmul(a, b)
    pyblasgemm.matmul(a, b)
    key = pyblasgemm.matmul.__globals__["_signature"](a, b, None)
    call = calls.cache.get(key)
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    sptr = streams.current()
    parts = {
        "whole call (pyblasgemm.matmul)": lambda: pyblasgemm.matmul(a, b),
        "signature key + plan-cache lookup": lambda: calls.cache.get(
            pyblasgemm.matmul.__globals__["_signature"](a, b, None)),
        "cupy.empty of the result": lambda: cp.empty((64, 64), np.float16),
        "CuPy's current stream handle": streams.current,
        "the launch alone (" + type(call.launch).__name__ + ")":
            lambda: call.launch(pa, pb, pc, 1.0, 0.0, sptr),
        "torch.matmul": (lambda t=torch.as_tensor(a, device="cuda"): torch.matmul(t, t)),
    }
    return {k: per_call_us(fn, 3000, 5) for k, fn in parts.items()}


def profile(fn, n=3000):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
    return s.getvalue()


def main():
    out = sys.argv[1]
    quick = "--quick" in sys.argv
    props = cp.cuda.runtime.getDeviceProperties(0)
    meta = dict(
        device=props["name"].decode(), driver=cp.cuda.runtime.driverGetVersion(),
        cuda_runtime=cp.cuda.runtime.runtimeGetVersion(), cupy=cp.__version__,
        torch=torch.__version__, numpy=np.__version__, python=platform.python_version(),
        pyblasgemm=pyblasgemm.__version__, git_sha=os.environ.get("GIT_SHA", "unknown"),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        cpu=platform.processor() or platform.machine(),
        method=("host µs per call: median of rounds of back-to-back calls, synchronized after "
                "each round; same arrays (torch views of the CuPy memory); same process"))
    rows = run_table((64, 256), ("float16", "bfloat16", "float32", "int8"),
                     1000 if quick else 2000, 5)
    parts = breakdown()
    for k, v in parts.items():
        print(f"{v:7.2f} us  {k}")
    a = cp.asarray(np.random.rand(64, 64).astype(np.float16))
    c = cp.empty((64, 64), np.float16)
    profiles = {"matmul 64³ fp16 (cached signature)": profile(lambda: pyblasgemm.matmul(a, a)),
                "matmul(out=) 64³ fp16": profile(lambda: pyblasgemm.matmul(a, a, out=c))}
    for k, v in profiles.items():
        print(k)
        print(v[:2500])
    ok = [r for r in rows if r["meets_bar"] is not None]
    summary = dict(cases=len(rows), compared=len(ok), meeting_bar=sum(r["meets_bar"] for r in ok),
                   below_bar=[f"{r['n']} {r['dtype']} {r['route']} {r['form']} "
                              f"{r['speedup']:.2f}" for r in ok if not r["meets_bar"]],
                   errors=[f"{r['n']} {r['dtype']} {r['route']} {r['form']}: {r['error']}"
                           for r in rows if r["error"]])
    print(json.dumps(summary, indent=1))
    json.dump(dict(meta=meta, summary=summary, rows=rows, breakdown_us=parts,
                   profiles=profiles), open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
