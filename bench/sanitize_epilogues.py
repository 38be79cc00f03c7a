"""A representative set of epilogue calls for compute-sanitizer (issue: fusion):

    compute-sanitizer --tool memcheck python bench/sanitize_epilogues.py

Odd sizes (not multiples of any tile), every route: the unfused pass on our kernels (float16,
bfloat16 -> float32, the erf GELU and SiLU, a bias per row and per column, pre-activation out),
the cuBLASLt-fused relu / tanh GELU, int8 dequantization, the stateful form, grouped experts with
empty groups, and fused_mlp. Prints one line per call and 'ok' at the end.
"""
import cupy as cp
import ml_dtypes
import numpy as np

import pyblasgemm
from pyblasgemm.epilogue import last_route


def main():
    rng = np.random.default_rng(0)

    def arr(shape, dtype):
        return cp.asarray(rng.uniform(-1, 1, shape).astype(dtype))

    m, n, k = 37, 29, 53
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        x, w = arr((m, k), dtype), arr((k, n), dtype)
        out_dtype = np.float32 if dtype is ml_dtypes.bfloat16 else dtype
        for act in ("gelu", "silu", "relu", "gelu_tanh"):
            for bias in (arr((n,), out_dtype), arr((m, 1), out_dtype)):
                pre = cp.empty((m, n), out_dtype)
                pyblasgemm.matmul(x, w, bias=bias, activation=act, preactivation_out=pre)
                print(np.dtype(dtype).name, act, bias.shape, last_route())
    for dtype in (np.float16, np.float32):    # the cuBLASLt-fused forms (ld a multiple of 8)
        x, w, bias = arr((m, k), dtype), arr((k, 40), dtype), arr((40,), dtype)
        pyblasgemm.matmul(x, w, bias=bias, activation="gelu_tanh", preactivation_out=cp.empty((m, 40), dtype))
        print(np.dtype(dtype).name, "gelu_tanh + pre", last_route())
        pyblasgemm.matmul(x, w, bias=bias, activation="relu")
        print(np.dtype(dtype).name, "relu", last_route())
    q = cp.asarray(rng.integers(-128, 128, (m, 64)).astype(np.int8))
    r = cp.asarray(rng.integers(-128, 128, (64, n)).astype(np.int8))
    pyblasgemm.matmul(q, r, scale_a=arr((m,), np.float32), scale_b=arr((n,), np.float32),
                      bias=arr((n,), np.float16), activation="relu", dtype=np.float16)
    print("int8 dequant", last_route())
    mm = pyblasgemm.Matmul(arr((2, m, k), np.float16), arr((k, n), np.float16), bias=arr((n,), np.float16),
                           activation="gelu")
    mm.execute()
    print("stateful", last_route())
    a, b = arr((40, 24), np.float16), arr((3, 24, 10), np.float16)
    pyblasgemm.grouped_matmul(a, b, offsets=[7, 7, 40], bias=arr((3, 10), np.float16), activation="silu")
    print("grouped", last_route())
    pyblasgemm.fused_mlp(arr((9, 16), np.float16), arr((16, 33), np.float16), arr((33, 7), np.float16),
                         arr((33,), np.float16), arr((7,), np.float16))
    print("fused_mlp", last_route())
    cp.cuda.Device().synchronize()
    print("ok")


if __name__ == "__main__":
    main()
