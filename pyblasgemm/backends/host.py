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

Floating-point exceptions (a float16 result past 65504, inf - inf) are reported as NumPy's
matmul reports them for the same product, under the caller's ``np.errstate`` (by default a
RuntimeWarning "overflow encountered in matmul", at the caller's line; underflow ignored), not
as warnings from the library's inner casts.
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np

from .. import _arrays
from ..constraints import backend_supports
from ..desc import GemmDesc
from ..kinds import OZAKI, base_compute, ozaki_bits

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
    base = base_compute(desc.compute)
    if base == OZAKI:
        return _ozaki_product(desc, opa, opb)
    if desc.row.is_complex and base in ("tf32", "3xtf32"):
        # the GPU's composition: one real product of the stacked parts, then C2's halves
        a2 = np.concatenate([opa.real, opa.imag], axis=-1)
        b2 = np.concatenate([np.concatenate([opb.real, opb.imag], axis=-1),
                             np.concatenate([-opb.imag, opb.real], axis=-1)], axis=-2)
        c2 = product(desc._replace(prefix="s"), a2, b2)
        n = opb.shape[-1]
        return (c2[..., :n] + 1j * c2[..., n:]).astype(np.complex64)
    if desc.compute == "tf32":
        return np.matmul(round_to_tf32(opa), round_to_tf32(opb))
    if desc.compute == "3xtf32":
        big_a, big_b = round_to_tf32(opa), round_to_tf32(opb)
        small_a, small_b = round_to_tf32(opa - big_a), round_to_tf32(opb - big_b)
        # small terms first: they are tiny, summing them before the big product loses less
        return (np.matmul(big_a, small_b) + np.matmul(small_a, big_b)) + np.matmul(big_a, big_b)
    return np.matmul(opa, opb)


def _ozaki_product(desc: GemmDesc, opa, opb):
    """The Ozaki scheme II per batch entry (pyblasgemm.ozaki), its dial from the mode."""
    from ..ozaki import dgemm_ozaki, zgemm_ozaki

    routine = zgemm_ozaki if desc.row.is_complex else dgemm_ozaki
    bits = ozaki_bits(desc.compute)
    out = np.empty(opa.shape[:-1] + opb.shape[-1:], desc.row.c_dtype)
    for i in range(out.shape[0]):
        out[i], _ = routine(np.ascontiguousarray(opa[i]), np.ascontiguousarray(opb[i]), bits=bits)
    return out


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_stacklevel() -> int:
    """``warnings.warn``'s stacklevel (for a warn call in this function's caller) of the first
    frame outside the package: the line of the user's call, as NumPy's own warnings point."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


#: NumPy's words for a floating-point exception (its 'call' handler's first argument) ->
#: the np.geterr() key that says what the caller wants done about it
_ERR_KEY = {"divide by zero": "divide", "overflow": "over", "underflow": "under",
            "invalid value": "invalid"}


def _report_as_numpy(raised: list[tuple[str, int]]) -> None:
    """Do for each exception what the caller's ``np.errstate`` asks (by default: warn on
    overflow, invalid and divide, ignore underflow), in the words ``numpy.matmul`` uses."""
    if not raised:
        return
    mode = np.geterr()
    for kind, flag in dict.fromkeys(raised):
        how, message = mode.get(_ERR_KEY.get(kind, "invalid"), "warn"), f"{kind} encountered in matmul"
        if how == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=_user_stacklevel())
        elif how == "raise":
            raise FloatingPointError(message)
        elif how == "call":
            np.geterrcall()(kind, flag)
        elif how == "log":
            np.geterrcall().write(f"Warning: {message}\n")
        elif how == "print":
            print(f"Warning: {message}", file=sys.stderr)


def _collecting(raised: list):
    """An error state that records every floating-point exception instead of acting on it."""
    return np.errstate(all="call", call=lambda kind, flag: raised.append((kind, flag)))


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    raised: list[tuple[str, int]] = []
    # the exceptions are collected (not reported where they happen: in a cast, past the
    # product) and reported once each, in NumPy's words, at the user's line
    with _collecting(raised):
        _compute(desc, a, b, c)
    _report_as_numpy(raised)


#: up to this many multiply-adds NumPy's own float16 loop (float32 sum, one rounding: the host
#: backend's arithmetic, in k order) beats widening to float32 BLAS: the loop costs ~4.5 ns a
#: multiply-add after ~1.3 µs, the widened product ~4 µs at any small size (2 casts, sgemm, the
#: error state)
HALF_LOOP_MACS = 512


def _half_matmul(a, b):
    if a.size * (b.shape[-1] if b.ndim > 1 else 1) <= HALF_LOOP_MACS:
        return np.matmul(a, b)
    raised: list[tuple[str, int]] = []
    with _collecting(raised):
        out = np.matmul(a, b, dtype=np.float32).astype(np.float16)
    _report_as_numpy(raised)
    return out


def _direct_table() -> dict:
    import ml_dtypes

    return {np.dtype(np.float32).num: np.matmul,     # float32 BLAS (compute 'fp32' only)
            np.dtype(np.float64).num: np.matmul,
            np.dtype(np.complex64).num: np.matmul,
            np.dtype(np.complex128).num: np.matmul,
            # int8 -> int8: NumPy wraps every step, we wrap the exact sum; both are the exact
            # sum modulo 2^8 (wrapping is a ring homomorphism), so every bit agrees
            np.dtype(np.int8).num: np.matmul,
            # ml_dtypes' bfloat16 matmul returns float32 summed in float32 (as sbgemm does)
            np.dtype(ml_dtypes.bfloat16).num: np.matmul,
            np.dtype(np.float16).num: _half_matmul}


#: dtype number -> ``f(a, b)``: ``matmul`` of two NumPy operands of that dtype as one NumPy
#: call with the host backend's arithmetic (numpy.matmul's broadcasting, result type and
#: errors), for the call layer's no-keyword fast path. Keyed by number: ml_dtypes reuses the
#: characters 'e' and 'E' (int1, uint1)
DIRECT: dict = _direct_table()


def _compute(desc: GemmDesc, a, b, c) -> None:
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
