"""Host backend: NumPy / SciPy BLAS on NumPy arrays.

Precision follows the GPU modes so that host results are a faithful stand-in:
  * float16 / bfloat16 (and shgemm / sbgemm, float32 C): operands widened to float32, float32
    BLAS, one rounding at the end (``compute='fp16'`` also accumulates in float32 here: more
    accurate, documented);
  * float32 'fp32': float32 BLAS; 'tf32': operands rounded to tf32 first (round to nearest,
    ties away, as ``cvt.rna.tf32.f32``); '3xtf32': the three-product tf32 split;
  * 'int8-ozaki' (float64, float32, complex): :mod:`pyblasgemm.ozaki`'s steps, the GPU's bits
    (float32: alpha and beta applied in float64, C rounded once);
  * int8: exact float32 BLAS products of blocks of at most 1024 terms (|sum| <= 2^24), summed
    in int32 arithmetic that wraps like the GPU's adder (the exact sum modulo 2^32); the blocks
    bound the route's temporaries (a few MiB, less for a small result), so its peak memory
    stays within NumPy's for the same product (:func:`int8_product`);
  * float64 / complex: NumPy's matmul (BLAS) directly;
  * ``invariant=True`` (``desc.invariant``): every element one dot product of its row and
    column (:func:`invariant_matmul`), so no element's bits depend on m, n or the batch.

Floating-point exceptions (a float16 result past 65504, inf - inf) are reported as NumPy's
matmul reports them for the same product, under the caller's ``np.errstate`` (by default a
RuntimeWarning "overflow encountered in matmul", at the caller's line; underflow ignored), not
as warnings from the library's inner casts.
"""
from __future__ import annotations

import contextvars
import os
import sys
import threading
import warnings

import numpy as np

from .. import _arrays
from ..constraints import backend_supports
from ..desc import GemmDesc
from ..kinds import OZAKI, base_compute, ozaki_bits, ozaki_scaling

NAME = "host"


def supports(desc: GemmDesc):
    """(ok, reason): :func:`pyblasgemm.constraints.backend_supports` for the host."""
    return backend_supports(NAME, desc)


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


def product(desc: GemmDesc, opa: np.ndarray, opb: np.ndarray, matmul=np.matmul) -> np.ndarray:
    """op(A) @ op(B) in the accumulation precision of ``desc.compute``; ``matmul`` forms each
    floating-point product (:func:`invariant_matmul` for a batch-invariant problem)."""
    if desc.row.ab_dtype.itemsize == 2:      # float16 / bfloat16 operands, any output type
        return matmul(opa.astype(np.float32), opb.astype(np.float32))
    if desc.prefix == "i":
        out = np.empty(opa.shape[:-1] + opb.shape[-1:], np.int32)
        int8_product(opa, opb, out)
        return out.astype(np.int64)     # wrapped to int32 like the GPU's adder
    base = base_compute(desc.compute)
    if base == OZAKI:
        return _ozaki_product(desc, opa, opb)
    if desc.row.is_complex and base in ("tf32", "3xtf32"):
        # the GPU's composition: one real product of the stacked parts, then C2's halves
        a2 = np.concatenate([opa.real, opa.imag], axis=-1)
        b2 = np.concatenate([np.concatenate([opb.real, opb.imag], axis=-1),
                             np.concatenate([-opb.imag, opb.real], axis=-1)], axis=-2)
        c2 = product(desc._replace(prefix="s"), a2, b2, matmul)
        n = opb.shape[-1]
        return (c2[..., :n] + 1j * c2[..., n:]).astype(np.complex64)
    if desc.compute == "tf32":
        return matmul(round_to_tf32(opa), round_to_tf32(opb))
    if desc.compute == "3xtf32":
        big_a, big_b = round_to_tf32(opa), round_to_tf32(opb)
        small_a, small_b = round_to_tf32(opa - big_a), round_to_tf32(opb - big_b)
        # small terms first: they are tiny, summing them before the big product loses less
        return (matmul(big_a, small_b) + matmul(small_a, big_b)) + matmul(big_a, big_b)
    return matmul(opa, opb)


#: terms of one float32 block product of the int8 route: |x·y| <= 2^14 for int8 x, y, so any
#: partial sum of 1024 of them is an integer of magnitude <= 2^24, exact in float32 (whatever
#: the BLAS's order and FMA use)
INT8_K_BLOCK = 1024
#: elements of each 4-byte temporary of the int8 route (a block of op(a), of op(b), a partial
#: product, a sum): at most 2^20 (4 MiB) ...
INT8_BLOCK_ELEMS = 1 << 20
#: ... and at most 1/32 of the bytes NumPy's own call allocates (:func:`_numpy_bytes`: the four
#: temporaries then add at most half of it), but never below 2^18 (1 MiB): smaller blocks cost
#: more than they save (a small sgemm is ~1 ms of OpenBLAS thread start-up on a loaded host:
#: 256 blocks made an int8 1024^3 product 16 s on 2 busy cores)
INT8_MIN_BLOCK_ELEMS = 1 << 18


def _stored(x) -> int:
    """Elements a view holds in memory (a broadcast dimension, stride 0, counts once)."""
    count = 1
    for dim, stride in zip(x.shape, x.strides):
        if stride != 0:
            count *= dim
    return count


def _numpy_bytes(opa, opb, dest) -> int:
    """What ``numpy.matmul`` allocates for this product: the result, and for an int32 result
    (``dtype=numpy.int32``) the operands' int32 copies too."""
    if dest.itemsize == 1:
        return dest.nbytes
    return dest.nbytes + 4 * (_stored(opa) + _stored(opb))


def int8_product(opa, opb, dest, alpha=1, beta=0) -> None:
    """``dest[...] = alpha·(opa @ opb) + beta·dest`` for int8 ``opa`` (batch, m, k) and ``opb``
    (batch, k, n) (views of any strides; a zero batch stride broadcasts), wrapped to
    ``dest``'s integer type: the exact sum modulo 2^32, then modulo ``dest``'s size (int32:
    the GPU's wrapping adder; int8: NumPy's int8 matmul, which wraps every step: the same
    bits, wrapping being a ring homomorphism). ``alpha`` and ``beta``: int32-range ints.

    Blocks of ``k`` (:data:`INT8_K_BLOCK`), rows and columns go through float32 BLAS exactly;
    the partial products are summed in int32. Only blocks are ever widened: the float64 copies
    of whole operands this replaced needed 8x op(a) (a 2^31 x 1 int8 column ran out of memory
    where ``numpy.matmul`` needs its 2 GiB result).

    >>> import numpy as np
    >>> a = np.full((1, 1, 3000), 127, np.int8)
    >>> out = np.empty((1, 1, 1), np.int32)
    >>> int8_product(a, a.transpose(0, 2, 1), out)
    >>> int(out[0, 0, 0]) == 3000 * 127 * 127
    True
    """
    batch, m, k = opa.shape
    n = opb.shape[-1]
    if dest.size == 0:
        return
    direct = alpha == 1 and beta == 0 and dest.dtype == np.int32 and k > 0
    budget = min(INT8_BLOCK_ELEMS, max(INT8_MIN_BLOCK_ELEMS, _numpy_bytes(opa, opb, dest) // 32))
    kb = max(1, min(k, INT8_K_BLOCK))
    nb = min(n, max(1, budget // kb))
    mb = min(m, max(1, budget // max(kb, nb)))
    bb = min(batch, max(1, budget // max(mb * kb, kb * nb, mb * nb)))
    for b0 in range(0, batch, bb):
        bs = slice(b0, b0 + bb)
        for i0 in range(0, m, mb):
            rows = slice(i0, i0 + mb)
            for j0 in range(0, n, nb):
                cols = slice(j0, j0 + nb)
                target = dest[bs, rows, cols]
                # the sum lands in dest itself when nothing else is to be done with it
                acc = target if direct else np.zeros(target.shape, np.int32)
                for p0 in range(0, k, kb):
                    inner = slice(p0, p0 + kb)
                    part = np.matmul(opa[bs, rows, inner].astype(np.float32),
                                     opb[bs, inner, cols].astype(np.float32))
                    if p0 == 0:
                        acc[...] = part      # exact integers: the cast is exact
                    else:                    # int32 addition: wraps as the GPU's adder
                        np.add(acc, part, out=acc, dtype=np.int32, casting="unsafe")
                    del part                 # (freed before the next block's are made)
                if not direct:
                    if alpha != 1:
                        np.multiply(acc, np.int32(alpha), out=acc)
                    if beta != 0:
                        old = target.astype(np.int32)
                        np.multiply(old, np.int32(beta), out=old)
                        np.add(acc, old, out=acc)
                        del old
                    target[...] = acc        # int32 -> dest's type wraps (unsafe cast)
                del acc, target


def int8_matmul(a, b, dest) -> None:
    """``dest[...] = a @ b`` for int8 NumPy arrays with ``numpy.matmul``'s batch broadcasting
    (``a`` (..., m, k), ``b`` (..., k, n), ``dest`` (..., m, n) of any integer type), by
    :func:`int8_product`: the exact sum wrapped to ``dest``'s type (for an int8 ``dest``,
    ``numpy.matmul``'s own bits, with no temporaries the size of the result)."""
    batch = dest.shape[:-2]
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    if not batch:
        a, b, dest = a[None], b[None], dest[None]
    for idx in np.ndindex(*dest.shape[:-3]):    # the batch dims past the first, looped
        int8_product(a[idx], b[idx], dest[idx])


def _ozaki_product(desc: GemmDesc, opa, opb):
    """The Ozaki scheme II per batch entry (pyblasgemm.ozaki), its dial and scaling from the mode. float32
    and complex64 come back as float64 / complex128, not yet rounded: alpha and beta are
    applied to them there and C rounded once (the GPU's reconstruction does the same)."""
    from ..ozaki import emulated

    bits, scaling = ozaki_bits(desc.compute), ozaki_scaling(desc.compute)
    wide = np.result_type(desc.row.c_dtype, np.float64)
    out = np.empty(opa.shape[:-1] + opb.shape[-1:], wide)
    for i in range(out.shape[0]):
        out[i], _ = emulated(np.ascontiguousarray(opa[i]), np.ascontiguousarray(opb[i]), bits=bits,
                             scaling=scaling)
    return out


def invariant_matmul(opa, opb):
    """``opa @ opb`` for (..., m, k) and (..., k, n) arrays with every element one dot product
    of its row and column, each copied to its own 64-byte aligned, contiguous line first, and
    computed by the same routine with the same k: its bits depend on those two vectors alone,
    never on m, n, the batch, the operands' strides or where the element lies. (A BLAS GEMM
    does not promise that: OpenBLAS 0.3.31's sgemm on this project's host gives rows 16-25 of
    a 32-row block other bits than rows 0-15 for the same data, its register tiles and thread
    shares being cut by position; and its sdot sums a strided vector in another order than a
    contiguous one.) ``numpy.vecdot`` (NumPy 2) runs BLAS's dot on each pair; NumPy 1 stacks
    1 x k by k x 1 products, which its matmul also runs as dots. 7-15 GFLOP/s on a 2-core host
    against ~100 for the GEMM: the price of the promise.

    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((1, 300, 77)), rng.standard_normal((1, 77, 5))
    >>> whole = invariant_matmul(a, b)
    >>> alone = np.concatenate([invariant_matmul(a[:, i:i + 1], b) for i in range(300)], axis=1)
    >>> bool((whole == alone).all()), whole.shape, bool(np.allclose(whole, a @ b))
    (True, (1, 300, 5), True)
    """
    rows = _aligned_lines(opa)[..., :, None, :]                        # (..., m, 1, k)
    cols = _aligned_lines(opb.swapaxes(-1, -2))[..., None, :, :]       # (..., 1, n, k)
    if _VECDOT is not None:
        # vecdot conjugates its first argument: hand it the conjugate of the rows
        return _VECDOT(rows.conj() if rows.dtype.kind == "c" else rows, cols)
    return np.matmul(rows[..., None, :], cols[..., :, None])[..., 0, 0]


#: bytes each line of :func:`_aligned_lines` starts on (a cache line; the widest SIMD load)
LINE_ALIGN = 64


def _aligned_lines(x):
    """``x`` (..., lines, k) copied so that every line is contiguous and starts on a
    LINE_ALIGN-byte boundary (a dot kernel that peels to alignment, or steps through a strided
    vector, must see every line the same way)."""
    *outer, lines, k = x.shape
    isz = x.dtype.itemsize
    step = -(-max(k, 1) * isz // LINE_ALIGN) * LINE_ALIGN // isz      # elements per line
    count = int(np.prod(outer, dtype=np.int64)) * lines * step
    raw = np.empty(count * isz + LINE_ALIGN, np.uint8)
    start = -raw.ctypes.data % LINE_ALIGN
    buf = raw[start:start + count * isz].view(x.dtype).reshape(*outer, lines, step)
    buf[..., :k] = x
    return buf[..., :k]


_VECDOT = getattr(np, "vecdot", None)


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


def _matmul_raising_per_call(opa, opb, out) -> None:
    """``numpy.matmul(opa, opb, out)`` with every floating-point exception raised (a
    FloatingPointError) instead of reported: the caller (the BLAS form's repeated call, which
    reads nothing of ``out``) then redoes the product under :func:`_collecting`, which reports
    each exception once, in NumPy's words, at the user's line, as the caller's error state
    asks."""
    with np.errstate(all="raise"):
        np.matmul(opa, opb, out)


#: per thread: the bound ``run`` of a context in which NumPy raises every floating-point
#: exception (NumPy 2 keeps its error state in a context variable, so a context made once with
#: ``np.seterr(all="raise")`` carries it; a Context cannot be entered by two threads at once)
_raising = threading.local()


def _raising_run():
    run = getattr(_raising, "run", None)
    if run is None:
        context = contextvars.copy_context()
        context.run(np.seterr, all="raise")
        run = _raising.run = context.run
    return run


def _matmul_raising_in_context(opa, opb, out) -> None:
    try:
        run = _raising.run
    except AttributeError:
        run = _raising_run()
    try:
        run(np.matmul, opa, opb, out)
    except RuntimeError:        # this thread's context entered already (a call from a signal
        _matmul_raising_per_call(opa, opb, out)             # handler inside ours): a fresh state


def _numpy_keeps_its_error_state_in_a_context() -> bool:
    """NumPy 2's documented behaviour, checked once: a context's np.seterr stays in it."""
    if np.lib.NumpyVersion(np.__version__) < "2.0.0":
        return False
    before = np.geterr()
    inside = _raising_run()(np.geterr)
    return inside == dict.fromkeys(before, "raise") and np.geterr() == before


_matmul_raising_in_context.__doc__ = _matmul_raising_per_call.__doc__
#: :func:`_matmul_raising_per_call`, on NumPy 2 run in this thread's raising context instead:
#: ~0.2 µs for the error state against ~1-2 µs to enter a new ``np.errstate`` (and ~1 µs for
#: its decorator form) at 4x4 on the 2-core dev host, NumPy 2.4
matmul_raising = (_matmul_raising_in_context if _numpy_keeps_its_error_state_in_a_context()
                  else _matmul_raising_per_call)

#: per thread: ``(run, raised)``, the bound ``run`` of a context in which NumPy hands every
#: floating-point exception to ``raised.append`` (NumPy 2 keeps the error state and its 'call'
#: function in a context variable), or False where it cannot be made (NumPy 1)
_collector = threading.local()


def _collecting_run():
    made = getattr(_collector, "made", None)
    if made is None:
        made = False
        if matmul_raising is _matmul_raising_in_context:        # NumPy 2's context state
            raised: list[tuple[str, int]] = []

            def collect(kind, flag):
                raised.append((kind, flag))

            context = contextvars.copy_context()
            context.run(np.seterr, all="call")
            context.run(np.seterrcall, collect)
            if context.run(np.geterrcall) is collect and np.geterrcall() is not collect:
                made = (context.run, raised)
        _collector.made = made
    return made


def run_views(desc: GemmDesc, opa, opb, cv, alpha, beta) -> None:
    """:func:`compute_views`, its floating-point exceptions reported as :func:`run` reports
    them (once each, in numpy.matmul's words, at the user's line): :func:`run_collected`.

    >>> from pyblasgemm._types import TYPE_ROWS
    >>> from pyblasgemm.desc import describe
    >>> d = describe("doc", TYPE_ROWS["d"], "fp64", "N", "N", 1, 1, 2, 1, 2, 1, 1, 0, 0, 0,
    ...              "numpy", -1, (16, 16, 16), 2.0, 0.0)
    >>> c = np.zeros((1, 1, 1))
    >>> run_views(d, np.ones((1, 1, 2)), np.ones((1, 2, 1)), c, 2.0, 0.0); c
    array([[[4.]]])
    >>> with np.errstate(over="raise"):                 # the caller's state decides
    ...     run_views(d, np.full((1, 1, 2), 1e308), np.ones((1, 2, 1)), c, 2.0, 0.0)
    Traceback (most recent call last):
        ...
    FloatingPointError: overflow encountered in matmul
    """
    run_collected(compute_views, desc, opa, opb, cv, alpha, beta)


def run_collected(compute, *args) -> None:
    """``compute(*args)`` with its floating-point exceptions reported as :func:`run` reports
    them (once each, in numpy.matmul's words, at the user's line), collected in this thread's
    collecting context: ~0.05 µs at 4x4 against ~1.8 µs to enter an ``np.errstate`` (2-core
    dev host, NumPy 2.4). NumPy 1, and a call from inside ours (a signal handler's: the
    context is entered already), enter one."""
    made = getattr(_collector, "made", None)
    if made is None:
        made = _collecting_run()
    if made:
        run, raised = made
        _collector.made = False             # entered (a call from inside: an np.errstate)
        try:
            run(compute, *args)
        except BaseException:
            raised.clear()                  # (what it collected goes with it, as from run)
            raise
        finally:
            _collector.made = made
        if raised:
            found = raised[:]
            raised.clear()
            _report_as_numpy(found)
        return
    raised_here: list[tuple[str, int]] = []
    with _collecting(raised_here):
        compute(*args)
    _report_as_numpy(raised_here)


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
    compute_views(desc, opa, opb, cv, desc.alpha, desc.beta)


#: (type prefix, compute) whose product is one ``numpy.matmul`` in the operands' own type:
#: with alpha 1 and beta 0 it goes straight into C's view (no temporary; the BLAS form's
#: repeated call does the same, so both give numpy.matmul's bits for that view)
MATMUL_PRODUCTS = frozenset({("s", "fp32"), ("d", "fp64"), ("c", "fp32"), ("z", "fp64")})


_multiply, _add = np.multiply, np.add


def scale_into(product, x, y, cv, alpha, beta):
    """``cv = alpha·product(x, y) + beta·cv`` for a product in C's own type: the product
    scaled in its own layout (in place), C's in C's, one copy between the two layouts, then
    the sum in C's (a ufunc over two layouts costs ~0.8 µs more at 4x4 than the copy; 2-core
    dev host). ``alpha`` / ``beta``: C's type's scalars or 0-d arrays, or None for 1 / 0 (C
    then unread: its NaN and Inf never propagate). The steps of :func:`compute_views` and of
    the BLAS form's repeated call (:func:`run_scaled`), so both give the same bits. Returns
    None, or where the sum raised (a raising error state: :func:`run_scaled`'s; C written)
    its inputs, ``(product, scaled C)``, to be redone (:func:`_sum_into`).

    >>> c = np.array([[10.0, np.nan]])
    >>> scale_into(np.multiply, np.array([[1.0, 2.0]]), np.ones((1, 2)), c, np.float64(3.0), None); c
    array([[3., 6.]])
    """
    acc = product(x, y)
    if alpha is not None:
        _multiply(acc, alpha, acc)
    if beta is None:
        cv[...] = acc
        return None
    scaled_c = _multiply(cv, beta)
    cv[...] = acc
    try:
        _add(cv, scaled_c, cv)
    except FloatingPointError:
        return acc, scaled_c
    return None


def _sum_into(cv, acc, scaled_c) -> None:
    """:func:`scale_into`'s last steps, ``cv = acc + scaled_c``, redone."""
    cv[...] = acc
    _add(cv, scaled_c, cv)


def run_scaled(product, x, y, cv, alpha, beta) -> None:
    """:func:`scale_into` run in this thread's raising context: ~0.5 µs less than
    :func:`run_collected`'s frames at 4x4 (2-core dev host). A floating-point exception is
    then reported as :func:`run` reports it: the steps are redone in the collecting context,
    all of them where C is not written yet, else the last (the sum, whose inputs are kept).
    NumPy 1 (no raising context) and a call from inside ours run them collected."""
    run = getattr(_raising, "run", None)
    if run is None and matmul_raising is _matmul_raising_in_context:
        run = _raising_run()
    if run is not None:
        try:
            redo = run(scale_into, product, x, y, cv, alpha, beta)
        except (FloatingPointError, RuntimeError):      # (RuntimeError: the context entered)
            pass
        else:
            if redo is not None:
                run_collected(_sum_into, cv, *redo)
            return
    run_collected(scale_into, product, x, y, cv, alpha, beta)


def compute_views(desc: GemmDesc, opa, opb, cv, alpha, beta) -> None:
    """``cv = alpha·opa @ opb + beta·cv`` on views already made (the repeated NumPy calls of
    the BLAS form and of :mod:`pyblasgemm.scipy` make them themselves, through
    :func:`run_views`: pyblasgemm.blas)."""
    if desc.prefix == "i":
        # in blocks, into C (int32, wrapping): every partial sum exact, so the bits are the
        # exact sum's whatever the shape (batch-invariant as it is)
        int8_product(opa, opb, cv, alpha, beta)
        return
    if desc.invariant:
        acc = product(desc, opa, opb, invariant_matmul)
    elif (desc.prefix, desc.compute) in MATMUL_PRODUCTS:
        # the product in C's own type (product()'s numpy.matmul): the general steps below,
        # operation for operation in their order (scale_into; two temporaries fewer: ~3 µs
        # less with alpha and beta, 2-core dev host)
        if alpha == 1 and beta == 0:
            np.matmul(opa, opb, out=cv)
            return
        scalar = cv.dtype.type
        scale_into(np.matmul, opa, opb, cv, None if alpha == 1 else scalar(alpha),
                   None if beta == 0 else scalar(beta))
        return
    else:
        acc = product(desc, opa, opb)
    out = acc * acc.dtype.type(alpha) if alpha != 1 else acc
    if beta != 0:  # beta == 0: C is not read, so NaN/Inf in it never propagate
        out = out + cv.astype(acc.dtype) * acc.dtype.type(beta)
    cv[...] = out.astype(cv.dtype, copy=False)
