"""Where the host time of a tiny GPU call goes, stage by stage (perf_counter, median).

Each stage is timed alone over many calls: the raw cuBLAS binding with precomputed arguments,
our describe step, the plan lookup, the backend call, the whole hgemm, and cupy.matmul.
"""
import time

import cupy as cp
import numpy as np

import pyblasgemm
from pyblasgemm import desc as D, planner
from pyblasgemm._types import TYPE_ROWS
from pyblasgemm.backends import cublas as cb


def per_call_us(fn, calls=2000, rounds=9):
    """(host µs per call, device µs per call): equal numbers mean the loop is GPU-bound."""
    for _ in range(200):
        fn()
    cp.cuda.Device().synchronize()
    host, dev = [], []
    for _ in range(rounds):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls * 1e6)
        stop.record()
        stop.synchronize()
        dev.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
    return float(np.median(host)), float(np.median(dev))


row = TYPE_ROWS["h"]
a = cp.asarray(np.random.rand(64 * 64).astype(np.float16))
b = cp.asarray(np.random.rand(64 * 64).astype(np.float16))
c = cp.empty(64 * 64, dtype=np.float16)
a2, b2 = a.reshape(64, 64), b.reshape(64, 64)
desc, _ = D.describe_blas(row, "N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0, c, 64, None, None)
plan = planner.plan_for(desc)
from cupy.cuda import device
from cupy_backends.cuda.libs import cublas
h = device.get_cublas_handle()
al = np.array(1, np.float32); be = np.array(0, np.float32)
pa, pb, pc, pal, pbe = a.data.ptr, b.data.ptr, c.data.ptr, al.ctypes.data, be.ctypes.data
stages = {
    "raw cublas.gemmEx (precomputed args)": lambda: cublas.gemmEx(
        h, 0, 0, 64, 64, 64, pal, pa, 2, 64, pb, 2, 64, pbe, pc, 2, 64, 68, -1),
    "a.data.ptr x3": lambda: (a.data.ptr, b.data.ptr, c.data.ptr),
    "describe_blas": lambda: D.describe_blas(row, "N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0,
                                             c, 64, None, None),
    "plan_for (cached)": lambda: planner.plan_for(desc),
    "cublas backend run": lambda: cb.run(desc, a, b, c, plan),
    "hgemm end to end": lambda: pyblasgemm.hgemm("N", "N", 64, 64, 64, 1.0, a, 64, b, 64, 0.0,
                                                 c, 64),
    "gemm end to end (out=)": lambda: pyblasgemm.gemm("N", "N", a2, b2, out=c.reshape(64, 64)),
    "matmul end to end": lambda: pyblasgemm.matmul(a2, b2),
    "cupy.matmul": lambda: cp.matmul(a2, b2),
    "cupy.empty((64,64))": lambda: cp.empty((64, 64), dtype=np.float16),
}
from pyblasgemm.execute import execute
from pyblasgemm import _arrays
stages.update({
    "execute(desc) only": lambda: execute(desc, a, b, c),
    "a.dtype": lambda: a.dtype, "a.strides": lambda: a.strides, "a.size": lambda: a.size,
    "a.ndim": lambda: a.ndim, "c.flags": lambda: c.flags, "a.data": lambda: a.data,
    "type in ARRAY_TYPES": lambda: type(a) in _arrays.ARRAY_TYPES,
    "is_writeable(c)": lambda: _arrays.is_writeable(c),
    "a.dtype == row.ab_dtype": lambda: a.dtype == row.ab_dtype,
})
print("  host us  device us  stage")
for name, fn in stages.items():
    h_us, d_us = per_call_us(fn, calls=2000 if "a." not in name else 20000)
    print(f"{h_us:8.2f} {d_us:9.2f}   {name}", flush=True)
