"""Host backend: NumPy / SciPy BLAS on NumPy arrays.

Precision follows the GPU modes so that host results are a faithful stand-in:
  * float16 / bfloat16 (and shgemm / sbgemm, float32 C): operands widened to float32, float32
    BLAS, one rounding at the end (``compute='fp16'`` also accumulates in float32 here: more
    accurate, documented);
  * float32 'fp32': float32 BLAS; 'tf32': operands rounded to tf32 first (round to nearest,
    ties away, as ``cvt.rna.tf32.f32``); '3xtf32': the three-product tf32 split;
  * int8: exact products in float64 (|sum| < 2^53 for any k < 2^38), then int32 arithmetic
    that wraps like the GPU's;
  * float64 / complex: NumPy's matmul (BLAS) directly.
"""
from __future__ import annotations

import numpy as np

from .. import _arrays
from ..constraints import backend_supports
from ..desc import GemmDesc

NAME = "host"


def supports(desc: GemmDesc):
    """(ok, reason): :func:`pyblasgemm.constraints.backend_supports` for the host."""
    return backend_supports(NAME, desc)


def choose_config(desc: GemmDesc):
    return None


def op_view(x, trans: str, rows: int, cols: int, ld: int, batch: int, stride: int):
    """op(X) as a (batch, ...) view of column-major storage: X, Xᵀ or Xᴴ."""
    stored = _arrays.strided_view(x, (batch, rows, cols), (stride, 1, ld))
    if trans == "N":
        return stored
    t = stored.swapaxes(-1, -2)
    return t.conj() if trans == "C" else t


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest tf32 value (10 explicit mantissa bits), ties away from zero."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def product(desc: GemmDesc, opa: np.ndarray, opb: np.ndarray) -> np.ndarray:
    """op(A) @ op(B) in the accumulation precision of ``desc.compute``."""
    if desc.row.ab_dtype.itemsize == 2:      # float16 / bfloat16 operands, any output type
        return np.matmul(opa.astype(np.float32), opb.astype(np.float32))
    if desc.prefix == "i":
        exact = np.matmul(opa.astype(np.float64), opb.astype(np.float64)).astype(np.int64)
        return exact.astype(np.int32).astype(np.int64)  # wrap to int32 like the GPU's adder
    if desc.compute == "tf32":
        return np.matmul(round_to_tf32(opa), round_to_tf32(opb))
    if desc.compute == "3xtf32":
        big_a, big_b = round_to_tf32(opa), round_to_tf32(opb)
        small_a, small_b = round_to_tf32(opa - big_a), round_to_tf32(opb - big_b)
        # small terms first: they are tiny, summing them before the big product loses less
        return (np.matmul(big_a, small_b) + np.matmul(small_a, big_b)) + np.matmul(big_a, big_b)
    return np.matmul(opa, opb)


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    a_rows, a_cols = desc.a_shape()
    b_rows, b_cols = desc.b_shape()
    opa = op_view(a, desc.transa, a_rows, a_cols, desc.lda, desc.batch, desc.stride_a)
    opb = op_view(b, desc.transb, b_rows, b_cols, desc.ldb, desc.batch, desc.stride_b)
    cv = _arrays.strided_view(c, (desc.batch, desc.m, desc.n), (desc.stride_c, 1, desc.ldc))
    acc = product(desc, opa, opb)
    if desc.prefix == "i":
        out = acc * desc.alpha
        if desc.beta != 0:
            out += cv.astype(np.int64) * desc.beta
        cv[...] = out.astype(np.int32)  # int64 -> int32 wraps modulo 2^32
        return
    out = acc * acc.dtype.type(desc.alpha) if desc.alpha != 1 else acc
    if desc.beta != 0:  # beta == 0: C is not read, so NaN/Inf in it never propagate
        out = out + cv.astype(acc.dtype) * acc.dtype.type(desc.beta)
    cv[...] = out.astype(cv.dtype, copy=False)
