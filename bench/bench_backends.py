"""Our kernels vs cuBLAS through the same API, same inputs, same run (CUDA events, median).

Decides the planner's routing rule (planner._ours_measured_faster) and records it as JSON.
Usage: python bench/bench_backends.py [out.json]
"""
import datetime
import json
import sys

import cupy as cp
import ml_dtypes
import numpy as np

import pyblasgemm
from pyblasgemm.benchmarks.suite import provenance
from bench_foundation import gpu_ms, host_us

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "i8": np.int8, "f32": np.float32}
CASES = [  # (dtype, compute, transa, transb, m, n, k)
    ("i8", None, "T", "N", 4096, 4096, 4096), ("i8", None, "N", "N", 4096, 4096, 4096),
    ("i8", None, "T", "N", 8192, 8192, 8192), ("i8", None, "N", "T", 8192, 8192, 8192),
    ("i8", None, "T", "N", 1024, 1024, 1024), ("i8", None, "T", "N", 1000, 1000, 1001),
    ("f16", None, "N", "N", 4096, 4096, 4096), ("f16", None, "T", "N", 512, 512, 32768),
    ("f16", None, "N", "N", 3072, 3072, 3072), ("bf16", None, "N", "N", 4096, 4096, 4096),
    ("f32", "tf32", "N", "N", 4096, 4096, 4096), ("f32", "3xtf32", "N", "N", 8192, 8192, 8192),
    ("f32", None, "N", "N", 8192, 8192, 8192),
]


def operands(rng, dt, ta, tb, m, n, k):
    def make(rows, cols):
        if dt == "i8":
            x = rng.integers(-128, 128, rows * cols).astype(np.int8)
        else:
            x = rng.uniform(-1, 1, rows * cols).astype(DT[dt])
        return cp.asarray(x)
    a = make(*((m, k) if ta == "N" else (k, m)))
    b = make(*((k, n) if tb == "N" else (n, k)))
    return a, b


def main(path):
    rng = np.random.default_rng(0)
    out = {**provenance(0), "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": datetime.date.today().isoformat(), "cupy": cp.__version__,
           "method": "CUDA events around 10 back-to-back calls, median of 30 samples after 5 warm-ups, same inputs", "cases": []}
    for dt, compute, ta, tb, m, n, k in CASES:
        a, b = operands(rng, dt, ta, tb, m, n, k)
        c = cp.empty(m * n, dtype=np.int32 if dt == "i8" else DT[dt])
        routine = getattr(pyblasgemm, {"i8": "igemm", "f16": "hgemm", "bf16": "bgemm",
                                        "f32": "sgemm"}[dt])
        lda = m if ta == "N" else k
        ldb = k if tb == "N" else n
        one, zero = (1, 0) if dt == "i8" else (1.0, 0.0)
        row = {"dtype": dt, "compute": compute or "default", "trans": ta + tb, "m": m, "n": n,
               "k": k}
        for backend in ("tensorcore", "cublas", "auto"):
            try:
                t = gpu_ms(lambda: routine(ta, tb, m, n, k, one, a, lda, b, ldb, zero, c, m,
                                           compute=compute, backend=backend))
                row[backend + "_ms"] = t
                row[backend + "_tflops"] = 2 * m * n * k / t / 1e9
            except NotImplementedError as exc:
                row[backend + "_ms"] = None
                row[backend + "_error"] = str(exc)[:120]
        if row.get("tensorcore_ms") and row.get("cublas_ms"):
            row["ours_over_cublas"] = row["cublas_ms"] / row["tensorcore_ms"]
        out["cases"].append(row)
        print({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in row.items()
               if not kk.endswith("_error")}, flush=True)
    # host time of a tiny call on each backend
    a = cp.asarray(rng.uniform(-1, 1, 64 * 64).astype(np.float16))
    c = cp.empty(64 * 64, dtype=np.float16)
    tiny = {"case": "host us per 64^3 hgemm"}
    for backend in ("tensorcore", "cublas"):
        tiny[backend] = host_us(lambda: pyblasgemm.hgemm("N", "N", 64, 64, 64, 1.0, a, 64, a, 64,
                                                         0.0, c, 64, backend=backend))
    tiny["cupy_matmul"] = host_us(lambda: cp.matmul(a.reshape(64, 64), a.reshape(64, 64)))
    out["cases"].append(tiny)
    print(tiny)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/backends.json")
