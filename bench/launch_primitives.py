"""Host cost of the ways a launch can be issued from Python (µs per call, median of rounds).

Written before changing the launchers (issue 13, B.1): which primitive is the floor on this
host. Candidates for a kernel launch: CuPy's Cython ``driver.launchKernel``, ``cuLaunchKernel``
through ctypes (``CDLL`` releases the GIL around the call, ``PyDLL`` does not) with the
argument cells built once, and cuda.bindings. For the cuBLAS route: the library's LtLaunch
(prototyped ctypes) against the same ``cublasLtMatmul`` unprototyped with pre-built cells, in
CDLL and PyDLL form. For the result: cupy.empty, the ndarray constructor, a pool allocation
alone, torch.empty. All on 64x64 float16 arrays, next to torch.matmul in the same run.

    python bench/launch_primitives.py out.json
"""
import ctypes as ct
import json
import pathlib
import sys

import cupy as cp
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import host_us_per_call  # noqa: E402

import pyblasgemm  # noqa: E402
from pyblasgemm.benchmarks.suite import provenance  # noqa: E402
from pyblasgemm import calls  # noqa: E402


def _lib_path(fragment):
    for line in open("/proc/self/maps"):
        if fragment in line:
            return line.split()[-1]
    return None


def main(out_path):
    n = 64
    np.random.seed(0)                 # the operands: NumPy's global generator, in order
    record = provenance("NumPy's global RNG seeded 0")
    a = cp.asarray(np.random.rand(n, n).astype(np.float16))
    b = cp.asarray(np.random.rand(n, n).astype(np.float16))
    c = cp.empty((n, n), np.float16)
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    tc = torch.empty((n, n), dtype=torch.float16, device="cuda")
    sptr = cp.cuda.get_current_stream().ptr
    k = cp.RawKernel(r'extern "C" __global__ void nop(float* x, float* y, float* z, float s, float t) {}', "nop")
    k((1,), (32,), (c, c, c, np.float32(1), np.float32(0)))
    fptr = k.kernel.ptr
    cells = [ct.c_uint64(c.data.ptr), ct.c_uint64(c.data.ptr), ct.c_uint64(c.data.ptr), ct.c_float(1),
             ct.c_float(0)]
    argv = (ct.c_void_p * len(cells))(*[ct.addressof(x) for x in cells])
    argp = ct.addressof(argv)
    from cupy_backends.cuda.api import driver

    cuda_path = _lib_path("libcuda.so")
    variants = {}
    for kind, loader in (("CDLL", ct.CDLL), ("PyDLL", ct.PyDLL)):
        fn = loader(cuda_path).cuLaunchKernel
        fn.restype = ct.c_int
        fixed = (ct.c_void_p(fptr), ct.c_uint(1), ct.c_uint(1), ct.c_uint(1), ct.c_uint(128), ct.c_uint(1),
                 ct.c_uint(1), ct.c_uint(0))
        s_cell = ct.c_void_p(sptr)
        packed = fixed + (s_cell, argv, None)
        variants[kind] = (fn, packed, s_cell)
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr

    def ctypes_launch(kind):
        fn, packed, s_cell = variants[kind]

        def go():
            cells[0].value = pa
            cells[1].value = pb
            cells[2].value = pc
            s_cell.value = sptr
            return fn(*packed)
        return go

    try:
        from cuda.bindings import driver as cbd
        cfunc = cbd.CUfunction(fptr)
        cstream = cbd.CUstream(sptr)
        bindings = lambda: cbd.cuLaunchKernel(cfunc, 1, 1, 1, 128, 1, 1, 0, cstream, argp, 0)
    except Exception:                        # not installed: the row says so
        bindings = None

    # the cuBLAS route's launch: pyblasgemm's LtLaunch, then the same call unprototyped
    pyblasgemm.matmul(a, b, backend="cublas")
    pyblasgemm.matmul(a, b, backend="cublas")
    key = pyblasgemm.matmul.__globals__["_signature"](a, b, None, None, "cublas")
    lt = calls.cache.get(key).launch
    lt_path = _lib_path("libcublasLt.so")
    lt_variants = {}
    for kind, loader in (("CDLL", ct.CDLL), ("PyDLL", ct.PyDLL)):
        fn = loader(lt_path).cublasLtMatmul
        fn.restype = ct.c_int
        one_zero = np.array([1, 0], np.float32)
        lay = lt._layouts
        pcell = [ct.c_void_p(pa), ct.c_void_p(pb), ct.c_void_p(pc), ct.c_void_p(sptr)]
        args = (lt._handle, lt._desc, ct.c_void_p(one_zero.ctypes.data), pcell[0], lay[0], pcell[1], lay[1],
                ct.c_void_p(one_zero.ctypes.data + 4), pcell[2], lay[2], pcell[2], lay[2], lt._algo, None,
                ct.c_size_t(0), pcell[3])
        lt_variants[kind] = (fn, args, pcell, one_zero)

    def lt_unproto(kind):
        fn, args, pcell, _ = lt_variants[kind]

        def go():
            pcell[0].value = pa
            pcell[1].value = pb
            pcell[2].value = pc
            pcell[3].value = sptr
            return fn(*args)
        return go

    pool = cp.get_default_memory_pool()
    stages = {
        "torch.matmul": lambda: torch.matmul(ta, tb),
        "torch.matmul(out=)": lambda: torch.matmul(ta, tb, out=tc),
        "torch.empty": lambda: torch.empty((n, n), dtype=torch.float16, device="cuda"),
        "cupy launchKernel": lambda: driver.launchKernel(fptr, 1, 1, 1, 128, 1, 1, 0, sptr, argp, 0),
        "ctypes CDLL cuLaunchKernel + 3 cells": ctypes_launch("CDLL"),
        "ctypes PyDLL cuLaunchKernel + 3 cells": ctypes_launch("PyDLL"),
        "cuda.bindings cuLaunchKernel": bindings,
        "LtLaunch (prototyped ctypes)": lambda: lt(pa, pb, pc, 1.0, 0.0, sptr),
        "cublasLtMatmul CDLL unprototyped": lt_unproto("CDLL"),
        "cublasLtMatmul PyDLL unprototyped": lt_unproto("PyDLL"),
        "pyblasgemm.matmul cublas": lambda: pyblasgemm.matmul(a, b, backend="cublas"),
        "pyblasgemm.matmul tensorcore": lambda: pyblasgemm.matmul(a, b, backend="tensorcore"),
        "cupy.empty": lambda: cp.empty((n, n), np.float16),
        "cupy.ndarray": lambda: cp.ndarray((n, n), np.float16),
        "pool.malloc": lambda: pool.malloc(n * n * 2),
        "cupy.ndarray(memptr=pool.malloc)": lambda: cp.ndarray((n, n), np.float16, pool.malloc(n * n * 2)),
    }
    res = {}
    for name, fn in stages.items():
        if fn is None:
            res[name] = None
            continue
        res[name] = host_us_per_call(fn, 3000, 7, warmup=300)
        print(f"{res[name]:8.3f}  {name}", flush=True)
    props = cp.cuda.runtime.getDeviceProperties(0)
    json.dump({"meta": {**record, "device": props["name"].decode(),
                        "driver": cp.cuda.runtime.driverGetVersion(),
                        "cupy": cp.__version__, "torch": torch.__version__,
                        "method": "median of 7 rounds of 3000 back-to-back calls"},
               "host_us": res}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
