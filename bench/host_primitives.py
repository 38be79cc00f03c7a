"""Host cost of the primitives a GPU call is made of (µs per call, median of rounds).

A measuring aid for the call path (issue: host cost below torch.matmul's): what an attribute
read, an allocation, a dict lookup, a raw launch and a raw cuBLAS call cost on this host, next to
torch.matmul and the library's public forms, so that a budget can be written before optimizing.
"""
import ctypes
import cProfile
import io
import json
import pstats
import sys

import cupy as cp
import numpy as np
import torch

import pyblasgemm
from pyblasgemm.benchmarks.suite import provenance


sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from timing import host_us_per_call  # noqa: E402


def per_call_us(fn, calls=3000, rounds=7):
    return host_us_per_call(fn, calls, rounds, warmup=300)


def main(out_path):
    n = 64
    np.random.seed(0)                 # the operands: NumPy's global generator, in order
    a = cp.asarray(np.random.rand(n, n).astype(np.float16))
    b = cp.asarray(np.random.rand(n, n).astype(np.float16))
    c = cp.empty((n, n), np.float16)
    ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
    tc = torch.empty((n, n), dtype=torch.float16, device="cuda")
    i8a = torch.randint(-5, 5, (n, n), dtype=torch.int8, device="cuda")
    from cupy_backends.cuda.api import driver, runtime
    from cupy_backends.cuda.libs import cublas
    from cupy.cuda import device
    k = cp.RawKernel(r'extern "C" __global__ void nop(float* x) {}', "nop")
    k(( 1,), (32,), (c,))
    fptr = k.kernel.ptr
    cell = ctypes.c_uint64(c.data.ptr)
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(cell))
    argp = ctypes.addressof(argv)
    sptr = cp.cuda.get_current_stream().ptr
    h = device.get_cublas_handle()
    al = np.array([1, 0], np.float32)
    pal, pbe = al.ctypes.data, al.ctypes.data + 4
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    libpath = [l.split()[-1] for l in open("/proc/self/maps") if "libcublas.so" in l and "Lt" not in l]
    lib = ctypes.CDLL(libpath[0]) if libpath else None
    d = {}
    a1, b1, c1 = a.ravel(), b.ravel(), c.ravel()
    a8 = cp.asarray(np.random.rand(8, n, n).astype(np.float16)); b8 = a8.copy()
    ta8, tb8 = torch.as_tensor(a8, device="cuda"), torch.as_tensor(b8, device="cuda")
    if lib:
        lib.cublasGemmEx.restype = ctypes.c_int
        lib.cublasGemmEx.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        gargs = (ctypes.c_void_p(h), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(n), ctypes.c_int(n), ctypes.c_int(n))
        pal_c, pbe_c = ctypes.c_void_p(pal), ctypes.c_void_p(pbe)
    stages = {
        "torch.matmul": lambda: torch.matmul(ta, tb),
        "torch.matmul(out=)": lambda: torch.matmul(ta, tb, out=tc),
        "torch._int_mm": lambda: torch._int_mm(i8a, i8a),
        "cupy.matmul": lambda: cp.matmul(a, b),
        "pyblasgemm.matmul": lambda: pyblasgemm.matmul(a, b),
        "pyblasgemm.matmul(out=)": lambda: pyblasgemm.matmul(a, b, out=c),
        "pyblasgemm.matmul tensorcore": lambda: pyblasgemm.matmul(a, b, backend="tensorcore"),
        "pyblasgemm.hgemm": lambda: pyblasgemm.hgemm("N", "N", n, n, n, 1.0, a1, n, b1, n, 0.0, c1, n),
        "pyblasgemm.gemm": lambda: pyblasgemm.gemm("N", "N", a, b),
        "pyblasgemm.matmul batched 8": lambda: pyblasgemm.matmul(a8, b8),
        "torch.matmul batched 8": lambda: torch.matmul(ta8, tb8),
        "ctypes cublasGemmEx": (lambda: lib.cublasGemmEx(*gargs[:6], pal_c, pa, 2, n, pb, 2, n, pbe_c, pc, 2, n, 68, -1)) if lib else (lambda: None),
        "runtime.streamIsCapturing": lambda: runtime.streamIsCapturing(sptr),
        "raw launchKernel": lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, sptr, argp, 0),
        "raw cublas.gemmEx": lambda: cublas.gemmEx(h, 0, 0, n, n, n, pal, pa, 2, n, pb, 2, n, pbe, pc, 2, n, 68, -1),
        "cublas.setStream": lambda: cublas.setStream(h, sptr),
        "cublas.setPointerMode": lambda: cublas.setPointerMode(h, 0),
        "ctypes cublasSetStream_v2": (lambda: lib.cublasSetStream_v2(ctypes.c_void_p(h), ctypes.c_void_p(sptr))) if lib else (lambda: None),
        "get_cublas_handle": lambda: device.get_cublas_handle(),
        "cupy.empty": lambda: cp.empty((n, n), np.float16),
        "cupy.ndarray": lambda: cp.ndarray((n, n), np.float16),
        "get_current_stream().ptr": lambda: cp.cuda.get_current_stream().ptr,
        "runtime.getDevice": lambda: runtime.getDevice(),
        "a.shape": lambda: a.shape, "a.strides": lambda: a.strides, "a.dtype": lambda: a.dtype,
        "a.data.ptr": lambda: a.data.ptr, "a.data.device_id": lambda: a.data.device_id,
        "a.ndim": lambda: a.ndim,
        "key tuple + dict.get": lambda: d.get((type(a), a.dtype, b.dtype, a.shape, b.shape, a.strides, b.strides)),
        "ctypes cell .value=": lambda: setattr(cell, "value", pa),
        "empty lambda": lambda: None,
        "torch.cuda.current_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "torch tensor data_ptr": lambda: ta.data_ptr(),
    }
    res = {}
    for name, fn in stages.items():
        calls = 3000 if " " in name or "(" in name else 20000
        res[name] = per_call_us(fn, calls=calls)
        print(f"{res[name]:8.3f}  {name}", flush=True)
    prof = {}
    for name in ("pyblasgemm.matmul", "pyblasgemm.matmul(out=)", "pyblasgemm.hgemm"):
        pr = cProfile.Profile()
        fn = stages[name]
        pr.enable()
        for _ in range(2000):
            fn()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        prof[name] = s.getvalue()
        print(s.getvalue()[:4000])
    json.dump({**provenance("NumPy's global RNG seeded 0"),
               "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               "host_us": res, "profiles": prof}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
