"""Foundation measurements (issue 2, item 10), in one run against cupy.matmul on the same inputs.

* igemm 4096³ vs cupy.matmul on int8 (CuPy has no tensor-core int8 path);
* fp16 / bf16 / fp32 / tf32 4096³ through pyblasgemm's cuBLAS backend vs cupy.matmul;
* host time of one 64×64×64 hgemm call vs one cupy.matmul call (perf_counter over many calls).

GPU time: CUDA events around each call after warm-up, median of repeats. Writes JSON.
Usage: python bench/bench_foundation.py [out.json]
"""
import datetime
import json
import platform
import sys
import time

import cupy as cp
import numpy as np

import pyblasgemm
from pyblasgemm.benchmarks.suite import provenance
from timing import event_median_s


def gpu_ms(fn, warmup=5, repeats=30, inner=10):
    """Median GPU milliseconds per call (bench/timing.py: events around back-to-back calls)."""
    return event_median_s(fn, inner=inner, samples=repeats, warmup=warmup) * 1e3


def host_us(fn, calls=300, rounds=15):
    for _ in range(50):
        fn()
    cp.cuda.Device().synchronize()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        cp.cuda.Device().synchronize()
    return float(np.median(per_call))


def main(path):
    props = cp.cuda.runtime.getDeviceProperties(0)
    rng = np.random.default_rng(0)
    results = {**provenance(0), "device": props["name"].decode(),
               "date": datetime.date.today().isoformat(),
               "cupy": cp.__version__, "numpy": np.__version__,
               "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
               "driver": cp.cuda.runtime.driverGetVersion(), "python": platform.python_version(),
               "pyblasgemm": pyblasgemm.__version__, "method": "CUDA events around 10 back-to-back calls, median "
               "of 30 samples after 5 warm-ups; host time: perf_counter over 300 calls, median of 15 rounds",
               "cases": []}
    n = 4096
    flops = 2 * n**3
    for name, dtype, kw in [("int8", np.int8, {}), ("fp16", np.float16, {}),
                            ("bf16", "bfloat16", {}), ("fp32", np.float32, {}),
                            ("tf32", np.float32, {"compute": "tf32"})]:
        if name == "int8":
            a = cp.asarray(rng.integers(-128, 128, (n, n)).astype(np.int8))
            b = cp.asarray(rng.integers(-128, 128, (n, n)).astype(np.int8))
        else:
            import ml_dtypes
            dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
            a = cp.asarray(rng.uniform(-1, 1, (n, n)).astype(dt))
            b = cp.asarray(rng.uniform(-1, 1, (n, n)).astype(dt))
        # matmul: the same call, same layout (C-ordered) and same output dtype as cupy.matmul
        t_ours = gpu_ms(lambda: pyblasgemm.matmul(a, b, **kw))
        t_ref = gpu_ms(lambda: cp.matmul(a, b)) if name != "tf32" else None
        case = {"case": f"matmul {name} {n}^3", "pyblasgemm_ms": t_ours,
                "pyblasgemm_tflops": flops / t_ours / 1e9}
        if t_ref:
            case.update(cupy_matmul_ms=t_ref, cupy_matmul_tflops=flops / t_ref / 1e9,
                        speedup_vs_cupy_matmul=t_ref / t_ours)
        results["cases"].append(case)
        print(case, flush=True)
        if name == "int8":
            # the BLAS form in cuBLAS's native int8 arrangement: A and B K-contiguous ('T','N')
            c = cp.empty(n * n, dtype=np.int32)
            a1, b1 = a.ravel(), b.ravel()   # the raw form takes 1-D (or F-ordered) buffers
            t_raw = gpu_ms(lambda: pyblasgemm.igemm("T", "N", n, n, n, 1, a1, n, b1, n, 0, c, n))
            case = {"case": f"igemm TN {n}^3", "pyblasgemm_ms": t_raw,
                    "pyblasgemm_tops": flops / t_raw / 1e9, "cupy_matmul_ms": t_ref,
                    "speedup_vs_cupy_matmul": t_ref / t_raw}
            results["cases"].append(case)
            print(case, flush=True)
    # host overhead of a tiny call
    a = cp.asarray(rng.uniform(-1, 1, 64 * 64).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, 64 * 64).astype(np.float16))
    c = cp.empty(64 * 64, dtype=np.float16)
    a2, b2 = a.reshape(64, 64), b.reshape(64, 64)
    t_h = host_us(lambda: pyblasgemm.hgemm("N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0, c, 64))
    t_hm = host_us(lambda: pyblasgemm.matmul(a2, b2))
    t_c = host_us(lambda: cp.matmul(a2, b2))
    case = {"case": "host time per call, 64^3 fp16", "hgemm_us": t_h, "matmul_us": t_hm,
            "cupy_matmul_us": t_c, "hgemm_over_cupy": t_h / t_c}
    results["cases"].append(case)
    print(case, flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/foundation.json")
