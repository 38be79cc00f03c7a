"""Where the host time of a tiny call goes: cProfile of many 64³ calls (hgemm, matmul)."""
import cProfile
import pstats
import sys

import cupy as cp
import numpy as np

import pyblasgemm

a = cp.asarray(np.random.rand(64 * 64).astype(np.float16))
b = cp.asarray(np.random.rand(64 * 64).astype(np.float16))
c = cp.empty(64 * 64, dtype=np.float16)
a2, b2 = a.reshape(64, 64), b.reshape(64, 64)
for _ in range(100):
    pyblasgemm.hgemm("N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0, c, 64)
    pyblasgemm.matmul(a2, b2)
cp.cuda.Device().synchronize()
for name, stmt in [("hgemm", 'pyblasgemm.hgemm("N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0, c, 64)'),
                   ("matmul", "pyblasgemm.matmul(a2, b2)")]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        eval(stmt)
    prof.disable()
    cp.cuda.Device().synchronize()
    print(f"===== {name} =====")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
