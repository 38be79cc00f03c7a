"""The pythonic GEMM: shapes come from the 2-D arrays, any memory order, no copies of views."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:     # types only: importing pyblasgemm imports none of these
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

    from ._typing import Activation, Backend, Compute, GemmTrans, NDArray

import numpy as np

from . import _arrays, arrays, calls, streams
from .matmul import _plain_word, epilogue_named
from ._strided import FusedRun, dequant_gemm, epilogue_gemm, row_for, strided_gemm
from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES, acc_dtype, dtype_text, resolve_compute
from .desc import (INT32_MAX, _SCALAR_LIMITS, _scalar_value, check_backend, check_epilogue,
                   check_gemm_flag, check_same_place, check_scalar)
from .epilogue_pass import run_unfused
from . import fp8
from .fp8 import FP8_TYPES, is_fp8, scaled_matmul
from .kernels import fp8 as fp8_kernels
from .planner.overrides import resolve_invariant

_ROUTINE = "gemm"


def _supported_names() -> str:
    return ", ".join(d.name for d in ROW_BY_DTYPE)


# NumPy in gives NumPy out, CuPy CuPy, PyTorch PyTorch, JAX JAX (pyblasgemm._typing)
@overload
def gemm(transa: GemmTrans, transb: GemmTrans, a: NDArray, b: NDArray, out: NDArray | None = None,
        alpha: Any = 1, beta: Any = 0, *,
        compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None) -> NDArray: ...


@overload
def gemm(transa: GemmTrans, transb: GemmTrans, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
        alpha: Any = 1, beta: Any = 0, *,
        compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None) -> torch.Tensor: ...


@overload
def gemm(transa: GemmTrans, transb: GemmTrans, a: jax.Array, b: jax.Array, out: jax.Array | None = None,
        alpha: Any = 1, beta: Any = 0, *,
        compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None) -> jax.Array: ...


@overload
def gemm(transa: GemmTrans, transb: GemmTrans, a: cupy.ndarray, b: cupy.ndarray, out: cupy.ndarray | None = None,
        alpha: Any = 1, beta: Any = 0, *,
        compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None) -> cupy.ndarray: ...


@overload
def gemm(transa: GemmTrans, transb: GemmTrans, a: Any, b: Any, out: Any | None = None,
        alpha: Any = 1, beta: Any = 0, *,
        compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None) -> Any: ...


def gemm(transa, transb, a, b, out=None, alpha=1, beta=0, *, compute=None, backend=None,
         autotune=None, stream=None, bias=None, activation=None, preactivation_out=None,
         scale_a=None, scale_b=None, invariant=None):
    """``out = alpha * op(a) @ op(b) + beta * out`` for 2-D NumPy or CuPy arrays.

    The semantics of ``cupy.cublas.gemm``, for every dtype pyblasgemm supports (float16,
    bfloat16, float32, float64, complex64, complex128, and int8 with an int32 result) and on
    NumPy arrays as well. C-ordered, F-ordered and transposed views are used in place: a
    row-major output is computed as ``outᵀ = op(b)ᵀ @ op(a)ᵀ`` rather than copied.

    Parameters
    ----------
    transa, transb : {'N', 'T', 'C', 'H'} or {0, 1, 2}
        ``op(x) = x``, ``xᵀ`` or ``xᴴ`` (any case; 'H' is CuPy's name for 'C', and 0, 1, 2
        are cuBLAS's operation values as ``cupy.cublas.gemm`` takes them; 'C' / 'H' is 'T' for
        real data).
    a, b : numpy.ndarray, cupy.ndarray, or a foreign array
        2-D arrays of one dtype; ``op(a)`` is m x k and ``op(b)`` is k x n. PyTorch tensors,
        JAX arrays and CUDA-array-interface or DLPack objects are run on as views of their
        memory, the result in their framework (a tensor that requires grad is refused: use
        :mod:`pyblasgemm.torch`).
    out : array, optional
        m x n output of the result dtype (int32 for int8 inputs; float16 and bfloat16 inputs
        may also write a float32 ``out``, as :func:`shgemm` / :func:`sbgemm`: float32
        accumulation, one rounding to float32), updated in place; an ``out`` that shares
        memory with ``a`` or ``b`` gets the answer computed from their values before the call
        (as NumPy's ``out=``: into a temporary, then copied). When omitted, a new array is returned and ``beta`` is ignored (as in CuPy); it is F-ordered
        like CuPy's unless ``a`` and ``b`` are both C-ordered (then C-ordered, the faster
        arrangement for the backends).
    alpha, beta : scalars or 0-d arrays
        ``beta == 0`` never reads ``out``. 0-d NumPy or CuPy arrays are accepted as by
        ``cupy.cublas.gemm`` (a CuPy one is read to the host once). A value outside the
        routine's scalar type (float32 for 16- and 32-bit data) is a ``BlasArgumentError``.
    compute, backend, autotune
        As for the BLAS form (:func:`pyblasgemm.sgemm`), aliases included.
    stream : optional
        Where the GPU work is enqueued: a CuPy or PyTorch stream, an object with
        ``__cuda_stream__``, or a raw ``cudaStream_t`` int (see :mod:`pyblasgemm.streams`).
        Default: the current stream of the arrays' framework.
    bias, activation, preactivation_out, scale_a, scale_b
        An epilogue: ``out = activation(alpha·op(a)·op(b) + beta·out + bias)``, the value before
        the activation into ``preactivation_out``, int8 products dequantized by ``scale_a``
        (per row) and ``scale_b`` (per column) to a float ``out``; see
        :mod:`pyblasgemm.epilogue`.
    invariant : bool, optional
        Batch-invariant: each row of ``out`` has the same bits whatever the other rows of
        ``op(a)`` are (any m, stream or run); see :mod:`pyblasgemm.planner.invariant`. None:
        the ``PYBLASGEMM_INVARIANT`` setting.

    Returns
    -------
    out : array

    Examples
    --------
    >>> import numpy as np, pyblasgemm
    >>> a = np.array([[1., 2.], [3., 4.]], dtype=np.float32)       # C-ordered: used as is
    >>> pyblasgemm.gemm('N', 'T', a, a)
    array([[ 5., 11.],
           [11., 25.]], dtype=float32)
    >>> out = np.ones((2, 2), dtype=np.float32)
    >>> pyblasgemm.gemm('T', 'N', a, a, out=out, alpha=1, beta=-1)
    array([[ 9., 13.],
           [13., 19.]], dtype=float32)
    >>> h = np.full((1, 4), 200, dtype=np.float16)                 # 4 * 200² overflows float16
    >>> pyblasgemm.gemm('N', 'T', h, h, out=np.empty((1, 1), dtype=np.float32))
    array([[160000.]], dtype=float32)
    """
    if not (bias is None and activation is None and preactivation_out is None and scale_a is None
            and scale_b is None):
        return _with_epilogue(transa, transb, a, b, out, alpha, beta, compute, backend, autotune,
                              stream, bias, activation, preactivation_out, scale_a, scale_b, invariant)
    # the signature's words (calls.words), as every branch below keys and records them: the
    # flags and keywords as given, the scalars' types (beta's only with out=)
    words = calls.words(_ROUTINE, compute, backend, invariant,
                        (transa, transb, type(alpha), None if out is None else type(beta)))
    t = type(a)
    if t is _CUPY[0] and autotune is None and type(transa) is str and type(transb) is str:
        # a repeated CuPy call: its signature maps straight to the launch that ran it
        sig = calls.key(words, a, b, out)
        call = None if sig is None else calls.get(sig[0])
        if call is not None:
            _, pa, pb, pc = sig
            lim = call.limit
            if out is None:
                if -lim <= alpha <= lim and alpha != 0:
                    c = _empty(call.shape, call.dtype, call.order)
                    pc = c.data.ptr
                    if not pc & call.c_mask:
                        sptr = streams.current() if stream is None else streams.handle(stream)
                        call.run(pa, pb, pc, alpha + call.zero, call.zero, sptr)
                        return c
            elif (not calls.overlaps(call, pa, pb, pc) and -lim <= alpha <= lim
                  and -lim <= beta <= lim and alpha != 0):
                sptr = streams.current() if stream is None else streams.handle(stream)
                call.run(pa, pb, pc, alpha + call.zero, beta + call.zero, sptr)
                return out
    elif (t is _TORCH[0] and autotune is None and type(transa) is str and type(transb) is str):
        # a repeated PyTorch call: the tensors' own attributes make the key (calls.key)
        c = arrays.torch_replay(words, a, b, out, stream, alpha, 0 if out is None else beta)
        if c is not None:
            return c
    elif _CUPY[0] is None and calls.cupy_type() is not None:
        _CUPY[0] = calls.cupy_type()
    if arrays.is_foreign(a, b, out):
        # PyTorch / JAX / CUDA-array-interface arrays: run on views, answer in their type
        if _TORCH[0] is None:
            _TORCH[0] = arrays.torch_type()
        if arrays.needs_grad(a, b):
            raise TypeError(f"{_ROUTINE}: a or b requires grad, and gemm is not differentiable: use "
                            f"pyblasgemm.torch.matmul / linear, or detach the tensors")
        conv = arrays.convert(_ROUTINE, [("a", a), ("b", b), ("out", out)], writes=("out",))
        na, nb, nout = conv.arrays
        calls.forget_last()
        with conv.allocating():
            result = gemm(transa, transb, na, nb, nout, alpha, beta, compute=compute,
                          backend=backend, autotune=autotune,
                          stream=conv.stream if stream is None else stream, invariant=invariant)
        back = out if out is not None else conv.back(result)
        if (conv.kind == "torch" and conv.gpu and autotune is None and type(transa) is str
                and type(transb) is str and _plain_word(compute) and _plain_word(backend)):
            arrays.torch_record(words, a, b, out, back)
        return back
    stream = streams.handle(stream)
    r = _ROUTINE
    given_alpha, given_beta = alpha, beta
    given_compute, given_backend = compute, backend
    xp_name, row = check_operands(r, a, b)
    if out is not None and getattr(out, "dtype", None) is not None and out.dtype != row.c_dtype:
        # a float32 out for 16-bit operands selects the mixed-precision routine (shgemm/sbgemm)
        row = ROW_BY_DTYPES.get((a.dtype, out.dtype), row)
    ta = check_gemm_flag(r, 1, "transa", transa, row)
    tb = check_gemm_flag(r, 2, "transb", transb, row)
    m, n = _product_shape(r, a, b, ta, tb)
    alpha = check_scalar(r, 6, "alpha", alpha, row)
    beta = check_scalar(r, 7, "beta", beta, row)
    compute = resolve_compute(row, compute, r)
    backend = check_backend(r, backend)
    invariant = resolve_invariant(r, invariant)
    xp = _arrays.xp_of(xp_name)
    fresh = out is None
    if fresh:
        # F-ordered as cupy.cublas.gemm's, except for two C-ordered inputs: then a C-ordered
        # output makes the problem Cᵀ = Bᵀ·Aᵀ on the inputs' own layout (cuBLAS's fast "NN"
        # path rather than "TT", measured 15% faster at 4096³ fp16 on an H100)
        order = "C" if a.flags.c_contiguous and b.flags.c_contiguous else "F"
        out = xp.empty((m, n), dtype=row.c_dtype, order=order)
        beta = 0 if row.scalar_kind == "int" else 0.0   # as cupy.cublas.gemm: not read
    else:
        # an out sharing memory with a or b is computed as NumPy computes it: into a temporary,
        # copied into out at the end (strided_gemm sees the overlap; a disjoint out whose
        # bytes interleave with a's is written in place)
        check_out(r, out, a, (m, n), row)
    with streams.on(stream if xp_name == "cupy" else None):
        ran = strided_gemm(r, row, compute, backend, ta, tb, a, b, out, alpha, beta,
                           fresh_c=fresh, autotune=autotune, stream=stream, invariant=invariant)
    if (ran is not None and autotune is None and _plain_word(given_compute)
            and _plain_word(given_backend) and type(transa) is str and type(transb) is str and type(given_alpha) in _PLAIN[row.scalar_kind]
            and type(given_beta) in _PLAIN[row.scalar_kind]):
        # one launch on the caller's own arrays: the next call with this signature goes
        # straight to it (calls.py)
        sig = calls.key(words, a, b, None if fresh else out)
        key = None if sig is None else sig[0]
        zero = 0 if row.scalar_kind == "int" else 0.0
        calls.record(key, ran[0], ran[1], a, b, out, fresh, None, zero, _scalar_limit(row))
    return out


def _product_shape(r, a, b, ta, tb) -> tuple:
    """(m, n) of op(a) @ op(b), or the ValueError naming the inner dimensions that differ."""
    m, ka = a.shape if ta == "N" else a.shape[::-1]
    kb, n = b.shape if tb == "N" else b.shape[::-1]
    if ka != kb:
        raise ValueError(f"{r}: op(a) is {m} x {ka} but op(b) is {kb} x {n}; the inner "
                         f"dimensions {ka} and {kb} must agree")
    return m, n


def check_operands(r, a, b, names=("a", "b")):
    """gemm's checks of the operands, raised before any work: NumPy or CuPy arrays, 2-D, of one
    library and device, of one supported dtype in native byte order. Returns (xp name, type
    row). ``names``: the arguments as the caller's user gave them (``grouped_matmul`` checks
    every problem's ``a[g]``, ``b[g]`` with it before running any).

    >>> import numpy as np
    >>> check_operands("gemm", np.ones((2, 2), ">f4"), np.ones((2, 2), ">f4"))
    Traceback (most recent call last):
        ...
    TypeError: gemm: a has dtype float32 in non-native byte order ('>f4'); pyblasgemm computes in native byte order: pass a.astype(a.dtype.newbyteorder('='))
    """
    for name, x in zip(names, (a, b)):
        if _arrays.array_module_name(x) is None:
            raise TypeError(f"{r}: {name} must be a NumPy or CuPy array, not {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{r}: {name} must be 2-D, got {x.ndim}-D with shape {x.shape}")
    xp_name, _ = check_same_place(r, list(zip(names, (a, b))))
    for name, x in zip(names, (a, b)):
        _check_native(r, name, x)
    if a.dtype != b.dtype:
        raise TypeError(f"{r}: {names[0]} has dtype {a.dtype.name} but {names[1]} has dtype "
                        f"{b.dtype.name}; both must have one dtype")
    row = ROW_BY_DTYPE.get(a.dtype)
    if row is None:
        raise TypeError(f"{r}: dtype {a.dtype.name} is not supported; use one of "
                        f"{_supported_names()}")
    return xp_name, row


def _check_native(r, name, x):
    if not x.dtype.isnative:
        # '>f4' is named float32 too: say which float32, and how to get the one we compute
        raise TypeError(f"{r}: {name} has dtype {dtype_text(x.dtype)}; pyblasgemm computes in "
                        f"native byte order: pass {name}.astype({name}.dtype.newbyteorder('='))")


def check_out(r, out, a, shape, row, name="out"):
    """gemm's checks of ``out`` (without an epilogue): an array beside ``a``, of the result's
    shape and dtype (``row``'s, or float32 for 16-bit operands), native and writable."""
    if _arrays.array_module_name(out) is None:
        raise TypeError(f"{r}: {name} must be a NumPy or CuPy array, not {type(out).__name__}")
    check_same_place(r, [("a", a), (name, out)])
    if out.shape != shape:
        raise ValueError(f"{r}: {name} has shape {out.shape}; expected {shape}")
    if out.dtype != row.c_dtype:
        raise TypeError(f"{r}: {name} has dtype {dtype_text(out.dtype)}; expected "
                        f"{row.c_dtype.name}"
                        + (" or float32" if row.ab_dtype.itemsize == 2 else ""))
    if not _arrays.is_writeable(out):
        raise ValueError(f"{r}: {name} is read-only")


#: the scalar types the signature fast path takes as they are, per scalar kind
_PLAIN = {"real": (float, int), "int": (int,), "complex": ()}
_CUPY = [None]
_TORCH = [None]


def _scalar_limit(row):
    return INT32_MAX if row.scalar_kind == "int" else _SCALAR_LIMITS[row.prefix]


def _empty(shape, dtype, order):
    # the ndarray constructor itself (cupy.empty's own cost is ~0.8 µs more; see matmul._empty)
    return _CUPY[0](shape, dtype, order=order)


# ---------------------------------------------------------------------------------------------
# gemm with an epilogue (pyblasgemm.epilogue): checked here, described with its EpilogueSpec and
# run by the plan's route; the unfused route is the product through the hall, then one pass


def _ordered_result(xp, shape, dtype, like_c: bool):
    return xp.empty(shape, dtype) if like_c else xp.empty(shape[::-1], dtype).T


def _product(row, ta, tb, a, b, c, alpha, beta, compute, backend, autotune, stream, fresh,
             invariant=False):
    """``c = alpha·op(a)·op(b) + beta·c`` through the planned GEMM (the arguments checked by
    the caller; ``row`` the type row writing ``c``'s dtype)."""
    xp_name = _arrays.array_module_name(a)
    with streams.on(stream if xp_name == "cupy" else None):
        strided_gemm(_ROUTINE, row, resolve_compute(row, compute, _ROUTINE), backend, ta, tb, a, b,
                     c, alpha, beta, fresh_c=fresh, autotune=autotune, stream=stream,
                     invariant=invariant)
    return c


#: the largest |alpha| / |beta| of a float8 product (float32 scalars, as check_scalar's real row)
_FP8_SCALAR_LIMIT = _SCALAR_LIMITS[ROW_BY_DTYPE[np.dtype(np.float32)].prefix]


def _fp8_replay(transa, transb, a, b, out, alpha, beta, compute, backend, stream, bias, activation,
                scale_a, scale_b, invariant):
    """``(result, key)`` of a repeated float8 ``gemm`` on CuPy arrays or CUDA tensors
    (:func:`pyblasgemm.fp8.replay`, as :func:`pyblasgemm.matmul` replays its float8 products):
    result None on a miss (key None: not a call a key holds). Keyed on the flags, the
    keywords and the scalars' types as given (``'N'`` / ``'T'`` / ``'C'`` / ``'H'`` / 0-2;
    plain words and float / int scalars only: anything else takes the full path, which
    checks or refuses it); the scalars' values go to the launch, within the float32 range
    (beyond it, NaN or infinity: the full path, which names or keeps them)."""
    ta, tb, fa, fb = type(transa), type(transb), type(alpha), type(beta)
    if not ((ta is str or ta is int) and (tb is str or tb is int) and (fa is float or fa is int)
            and (fb is float or fb is int) and (activation is None or type(activation) is str)
            and (compute is None or type(compute) is str) and (backend is None or type(backend) is str)):
        return None, None
    alpha = float(alpha) + 0.0      # (+ 0.0: -0.0 is +0.0, as check_scalar gives it)
    beta = float(beta) + 0.0
    if not (abs(alpha) <= _FP8_SCALAR_LIMIT and abs(beta) <= _FP8_SCALAR_LIMIT):
        return None, None
    words = calls.words(_ROUTINE, compute, backend, invariant,
                        ("float8", transa, transb, fa, None if out is None else fb, activation, fp8_kernels.FAMILY,
                         fp8_kernels.ROUTE))
    return fp8.replay(words, a, b, out, bias, scale_a, scale_b, stream, alpha, beta)


def _with_epilogue(transa, transb, a, b, out, alpha, beta, compute, backend, autotune, stream, bias,
                   activation, preactivation_out, scale_a, scale_b, invariant=None):
    """:func:`gemm` with an epilogue (see :mod:`pyblasgemm.epilogue`)."""
    r = _ROUTINE
    fp8_key = None
    if scale_a is not None and preactivation_out is None and autotune is None:
        # a repeated float8 product on CuPy arrays: its recorded launch on the new pointers
        if _CUPY[0] is None:
            _CUPY[0] = calls.cupy_type()
        if type(a) is _CUPY[0] and _CUPY[0] is not None and a.dtype in FP8_TYPES:
            c, fp8_key = _fp8_replay(transa, transb, a, b, out, alpha, beta, compute, backend, stream, bias,
                                     activation, scale_a, scale_b, invariant)
            if c is not None:
                return c
    if arrays.is_foreign(a, b, out, bias, preactivation_out, scale_a, scale_b):
        return _foreign_gemm(transa, transb, a, b, out, alpha, beta, compute, backend, autotune,
                             stream, bias, activation, preactivation_out, scale_a, scale_b, invariant)
    if is_fp8(getattr(a, "dtype", None)) or is_fp8(getattr(b, "dtype", None)):
        real = ROW_BY_DTYPE[np.dtype(np.float32)]      # float8 is real: 'C' means 'T'
        ta = check_gemm_flag(r, 1, "transa", transa, real)
        tb = check_gemm_flag(r, 2, "transb", transb, real)
        result = scaled_matmul(r, a if ta == "N" else a.T, b if tb == "N" else b.T, out, None, bias,
                               activation, preactivation_out, scale_a, scale_b, check_backend(r, backend),
                               alpha=check_scalar(r, 6, "alpha", _scalar_value(alpha), real),
                               beta=check_scalar(r, 7, "beta", _scalar_value(beta), real),
                               stream=stream, invariant=resolve_invariant(r, invariant))
        fp8.record(fp8_key, out, result)        # (one launch on these arrays: replayed next time)
        return result
    xp_name, row = check_operands(r, a, b)
    ta = check_gemm_flag(r, 1, "transa", transa, row)
    tb = check_gemm_flag(r, 2, "transb", transb, row)
    m, n = _product_shape(r, a, b, ta, tb)
    dequant = scale_a is not None or scale_b is not None
    if out is not None:
        out_dtype = out.dtype
        if getattr(out, "shape", None) != (m, n):
            raise ValueError(f"{r}: out has shape {getattr(out, 'shape', None)}; op(a) @ op(b) is ({m}, {n})")
        if not _arrays.is_writeable(out):
            raise ValueError(f"{r}: out is read-only")
    else:
        out_dtype = np.dtype(np.float32) if dequant else row.c_dtype
    epi = check_epilogue(r, (m, n), (m, n), out_dtype, xp_name, bias, activation, preactivation_out,
                         scale_a, scale_b, a.dtype)
    # the scalars, compute= and backend= as gemm checks them, before any route runs
    alpha = check_scalar(r, 6, "alpha", _scalar_value(alpha), row)
    beta = check_scalar(r, 7, "beta", _scalar_value(beta), row)
    resolve_compute(row, compute, r)
    backend = check_backend(r, backend)
    invariant = resolve_invariant(r, invariant)
    stream = streams.handle(stream)
    xp = _arrays.xp_of(xp_name)
    read_c = out is not None and beta != 0
    like_c = a.flags.c_contiguous and b.flags.c_contiguous
    result = out if out is not None else _ordered_result(xp, (m, n), out_dtype, like_c)
    zero = 0 if row.scalar_kind == "int" else 0.0
    if dequant:
        ran = dequant_gemm(a, b, ta, tb, result, alpha, beta if read_c else 0, epi, bias,
                           preactivation_out, scale_a, scale_b, out is None, backend, autotune,
                           stream, invariant) if xp_name == "cupy" else None
        if isinstance(ran, FusedRun):
            return result
        with streams.on(stream if xp_name == "cupy" else None):   # the pass on the product's stream
            t = _product(row, ta, tb, a, b, _ordered_result(xp, (m, n), row.c_dtype, like_c), 1, 0,
                         compute, backend, autotune, stream, True, invariant)   # the exact int32 product
            return run_unfused(epi, xp_name, t, alpha, beta if read_c else None,
                               out if read_c else None, bias, scale_a, scale_b, preactivation_out,
                               result, ran)
    ran = None
    if xp_name == "cupy":
        ran = epilogue_gemm(r, row_for(a.dtype, out_dtype), compute, ta, tb, a, b, result, alpha,
                            beta if read_c else zero, epi, bias, preactivation_out, out is None,
                            backend, autotune, stream, invariant)
        if isinstance(ran, FusedRun):
            return result
    acc = acc_dtype(out_dtype)
    acc_row = row_for(a.dtype, acc) or row
    with streams.on(stream if xp_name == "cupy" else None):       # the pass on the product's stream
        t = out.astype(acc) if read_c else _ordered_result(xp, (m, n), acc, like_c)
        _product(acc_row, ta, tb, a, b, t, alpha, beta if read_c else zero, compute, backend,
                 autotune, stream, True, invariant)              # alpha·AB + beta·C in acc
        return run_unfused(epi, xp_name, t, None, None, None, bias, None, None, preactivation_out,
                           result, ran)


def _foreign_gemm(transa, transb, a, b, out, alpha, beta, compute, backend, autotune, stream, bias,
                  activation, pre, scale_a, scale_b, invariant=None):
    fp8_key = None
    if scale_a is not None and pre is None and autotune is None:
        # a repeated float8 product on CUDA tensors: its launch on their pointers, the result
        # from torch's allocator (a CPU tensor gives no key: the host runs it)
        if _TORCH[0] is None:
            _TORCH[0] = arrays.torch_type()
        if type(a) is _TORCH[0] and _TORCH[0] is not None and a.dtype in fp8.torch_fp8_dtypes():
            c, fp8_key = _fp8_replay(transa, transb, a, b, out, alpha, beta, compute, backend, stream, bias,
                                     activation, scale_a, scale_b, invariant)
            if c is not None:
                return c
    if arrays.needs_grad(a, b, out, bias, pre, scale_a, scale_b):
        raise TypeError("gemm: a tensor requires grad, and gemm is not differentiable: "
                        "pyblasgemm.matmul(x, w, bias=, activation=) is (it runs "
                        "pyblasgemm.torch.linear), or detach the tensors / call under "
                        "torch.no_grad()")
    conv = arrays.convert("gemm", epilogue_named(a, b, out, bias, pre, scale_a, scale_b),
                          writes=("out", "preactivation_out"))
    na, nb, nout, nbias, npre, nsa, nsb = conv.arrays
    fp8.forget_last()
    with conv.allocating():
        result = _with_epilogue(transa, transb, na, nb, nout, alpha, beta, compute, backend,
                                autotune, conv.stream if stream is None else stream, nbias,
                                activation, npre, nsa, nsb, invariant)
    # (gemm's result type is the operands' own: bfloat16 stays bfloat16)
    back = out if out is not None else conv.back(result, framework_type=False)
    if fp8_key is not None:
        fp8.record(fp8_key, out, back)          # the views' one launch, under the tensors' key
    return back
