"""One case's kernels (ours, then cuBLAS on the same bytes) between cudaProfilerStart/Stop, for
Nsight Compute: the profile evidence in pyblasgemm/kernels/NOTES_SM90.md.

    PYTHONPATH=. ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section LaunchStats --csv --page details python bench/profile_sm90.py tail17024

Cases: tail17024 (f16 17024x256x4096 TN), decode64 (f16 64x4096x4096 TN), x3tf32 (3xTF32 8192^3
NN against cuBLAS SGEMM), tf32 (8192^3 NN against cuBLAS's TF32 mode).
"""
from __future__ import annotations

import sys

CASES = {
    "tail17024": ("f16", "TN", 17024, 256, 4096, "sm90a_hybrid_128x128x64_w2x1_s6_g8"),
    "decode64": ("f16", "TN", 64, 4096, 4096, "sm90a_sliced_64x64x64_w1x1_s12_g8"),
    "x3tf32": ("3xtf32", "NN", 8192, 8192, 8192, "sm90a_sliced_128x128x32_w2x1_s3_g8"),
    "tf32": ("tf32", "NN", 8192, 8192, 8192, "sm90a_sliced_256x128x32_w2x1_s4_c2_g8"),
}


def main(name: str) -> None:
    import cupy as cp
    import numpy as np

    import pyblasgemm
    from pyblasgemm.kernels import KernelProblem
    from pyblasgemm.kernels.launch import bind
    from pyblasgemm.planner.model import parse_config_name

    kind, lay, m, n, k, cfgname = CASES[name]
    ta, tb = lay
    rng = np.random.default_rng(0)
    dt = {"f16": np.float16, "tf32": np.float32, "3xtf32": np.float32}[kind]
    lda, ldb = (k if ta == "T" else m), (k if tb == "N" else n)
    a = cp.asarray(rng.standard_normal(lda * (m if ta == "T" else k), dtype=np.float32).astype(dt))
    b = cp.asarray(rng.standard_normal(ldb * (n if tb == "T" else k), dtype=np.float32).astype(dt))
    c = cp.zeros(m * n, dtype=np.float32 if kind != "f16" else np.float16)
    p = KernelProblem(kind, ta, tb, m, n, k, lda, ldb, m, a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
    bl = bind(p, parse_config_name(cfgname))
    routine = pyblasgemm.hgemm if kind == "f16" else pyblasgemm.sgemm
    compute = {"f16": None, "tf32": "tf32", "3xtf32": "fp32"}[kind]

    def cub():
        routine(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, m, backend="cublas", compute=compute)

    for _ in range(3):
        bl(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
        cub()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    bl(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
    cub()
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()
    print(name, "done")


if __name__ == "__main__":
    main(sys.argv[1])
