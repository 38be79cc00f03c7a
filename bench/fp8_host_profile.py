"""Host cost of a replayed float8 product (issue 36), piece by piece, on a machine without a GPU.

    PYTHONPATH=. python bench/fp8_host_profile.py [--out bench/results/fp8_host_profile_<host>_<date>_<sha>.json]

``pyblasgemm.matmul(a, b, scale_a=, scale_b=, dtype=bfloat16)`` at 64 x 256 x 256 (e4m3, ``b``
column-major, per-tensor scales) replayed from a record, with the launch a no-op of the bound
launch's signature, on:

* CuPy arrays: real ``cupy.ndarray`` objects (a subclass whose constructor hands out unowned
  memory at made-up addresses instead of asking the pool: CuPy's attribute reads as they are,
  its allocation replaced by a constructor of about the same cost);
* tensors: stand-ins with the ``torch.Tensor`` methods the key and the replay call
  (``get_device()``, ``data_ptr()``, ``stride()``, ``shape``, ``dtype``, ``requires_grad``),
  ``torch.empty_strided`` a stand-in of the same signature.

Each piece is timed on its own as well (the key, the lookup, the words, the allocation), so
that a change's gain can be stated before it is measured on the GPU host (bench/fp8.py's host
rows). Best of 7 rounds of 20000 calls (a shared host's noise only adds); the numbers are this host's, not an H100 host's.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import timeit
import types

import ml_dtypes
import numpy as np

from pyblasgemm.benchmarks.suite import provenance

M, N, K = 64, 256, 256
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _cupy_arrays():
    """(ndarray subclass, a, b, scale_a, scale_b) on unowned memory (no GPU needed)."""
    import cupy
    from cupy.cuda.memory import MemoryPointer, UnownedMemory

    nxt = [0x7F00_0000_0000]

    def memptr():
        p, nxt[0] = nxt[0], nxt[0] + (1 << 20)
        return MemoryPointer(UnownedMemory(p, 1 << 20, None, device_id=0), 0)

    class Array(cupy.ndarray):
        def __new__(cls, shape, dtype, memptr_=None, strides=None):
            return super().__new__(cls, shape, dtype, memptr_ if memptr_ is not None else memptr(), strides)

    a = Array((M, K), E4M3)
    b = Array((K, N), E4M3, None, (1, K))
    return Array, a, b, Array((), np.float32), Array((), np.float32)


class FakeTensor:
    """What the key and the replay call on a CUDA ``torch.Tensor``."""

    nxt = [0x7E00_0000_0000]

    def __init__(self, shape, dtype, strides=None):
        self.shape, self.dtype, self.requires_grad = tuple(shape), dtype, False
        self._strides = strides or tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        self._ptr, FakeTensor.nxt[0] = FakeTensor.nxt[0], FakeTensor.nxt[0] + (1 << 20)

    def get_device(self):
        return 0

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def is_contiguous(self):
        return True


def _noop_launch(pm, pn, pc, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
    return None


def _best_us(fn, number=20000, repeat=7) -> float:
    """µs per call, the best of ``repeat`` rounds (a shared dev host's noise only adds)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure() -> dict:
    import torch

    from pyblasgemm import arrays, calls, fp8, streams  # noqa: F401
    from pyblasgemm.plancache import PlanCache

    mm = importlib.import_module("pyblasgemm.matmul")
    out = {}
    Array, a, b, sa, sb = _cupy_arrays()
    calls._cupy_ndarray[:] = [Array]
    _arrays = importlib.import_module("pyblasgemm._arrays")
    _arrays._get_device[:] = [lambda: 0]        # (cudaGetDevice's stand-in: the frames around it kept)
    mm._CUPY[0] = Array
    calls.cache = PlanCache(size=64)
    current = types.SimpleNamespace(ptr=7)
    streams._get_current_stream = lambda: current
    fp8.forget_last()
    words = mm._fp8_words(BF16, None, None, None, None, type(a.dtype))
    miss, key = fp8.replay(words, a, b, None, None, sa, sb, None)
    assert miss is None and key is not None
    spans = (M * K, K * N, M * N * 2)
    route = types.SimpleNamespace(line="ours: float8 (profile)")
    calls.put(key, fp8.Fp8Call(_noop_launch, True, route, *spans, False, (M, N), None, BF16), refers_to=_noop_launch)
    call = lambda: mm.matmul(a, b, scale_a=sa, scale_b=sb, dtype=BF16)         # noqa: E731
    assert type(call()) is Array, "the CuPy call did not replay"
    out["cupy matmul (replayed, no-op launch)"] = _best_us(call)
    out["cupy fp8.replay"] = _best_us(lambda: fp8.replay(words, a, b, None, None, sa, sb, None))
    out["cupy calls.key"] = _best_us(lambda: calls.key(words, a, b, None, (sa, sb, None)))
    out["cupy key + peek"] = _best_us(lambda: calls.peek(calls.key(words, a, b, None, (sa, sb, None))[0]))
    out["cupy key + get"] = _best_us(lambda: calls.get(calls.key(words, a, b, None, (sa, sb, None))[0]))
    out["cupy allocation (stand-in)"] = _best_us(lambda: Array((M, N), BF16))
    out["matmul _fp8_words"] = _best_us(lambda: mm._fp8_words(BF16, None, None, None, None, np.dtype))
    out["no-op launch, keywords"] = _best_us(lambda: _noop_launch(1, 2, 3, 1.0, 0.0, 7, bias=0, pre=0,
                                                                    scale_m=4, scale_n=5))
    out["no-op launch, positional"] = _best_us(lambda: _noop_launch(1, 2, 3, 1.0, 0.0, 7, 0, 0, 4, 5))

    # tensors
    e4 = torch.float8_e4m3fn
    ta, tb = FakeTensor((M, K), e4), FakeTensor((K, N), e4, (1, K))
    tsa, tsb = FakeTensor((), torch.float32), FakeTensor((), torch.float32)
    calls.torch_tensor[:] = [FakeTensor]
    mm._TORCH[0] = FakeTensor
    fp8._TORCH_FP8[:] = [frozenset((e4, torch.float8_e5m2))]
    real_empty = torch.empty_strided
    torch.empty_strided = lambda shape, strides, dtype=None, device=None: FakeTensor(shape, dtype, strides)
    raw = arrays.torch_raw_stream       # (PyTorch's raw-stream accessor: a stand-in, no CUDA)
    arrays.torch_raw_stream = lambda device: 7
    try:
        twords = mm._fp8_words(torch.bfloat16, None, None, None, None, type(ta.dtype))
        miss, tkey = fp8.replay(twords, ta, tb, None, None, tsa, tsb, None)
        assert miss is None and tkey is not None
        calls.put(tkey, fp8.Fp8Call(_noop_launch, True, route, *spans, True, (M, N), (N, 1), torch.bfloat16),
                  refers_to=_noop_launch)
        tcall = lambda: mm.matmul(ta, tb, scale_a=tsa, scale_b=tsb, dtype=torch.bfloat16)   # noqa: E731
        assert type(tcall()) is FakeTensor, "the tensor call did not replay"
        out["tensor matmul (replayed, no-op launch, stand-ins)"] = _best_us(tcall)
        out["tensor fp8.replay"] = _best_us(lambda: fp8.replay(twords, ta, tb, None, None, tsa, tsb, None))
        out["tensor calls.key"] = _best_us(lambda: calls.key(twords, ta, tb, None, (tsa, tsb, None)))
    finally:
        torch.empty_strided = real_empty
        arrays.torch_raw_stream = raw
    return {k: round(v, 3) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    us = measure()
    for name, v in us.items():
        print(f"{name:55s} {v:7.3f} us")
    if args.out:
        import os
        import subprocess

        sha = os.environ.get("GIT_SHA") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                          capture_output=True, text=True).stdout.strip()
        doc = {"schema": "pyblasgemm-fp8-host-profile/1", **provenance(None), "host": platform.processor() or platform.machine(),
               "python": sys.version.split()[0], "git_sha": sha, "shape": [M, N, K], "us": us,
               "method": __doc__}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
