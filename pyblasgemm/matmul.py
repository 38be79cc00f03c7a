"""``numpy.matmul`` semantics, accelerated: 1-D promotion, batch broadcasting, ``out=``.

Whatever we do not accelerate (other dtypes, mixed kinds, subclasses, shape errors, casting
into an ``out`` of another dtype) is handed to ``numpy.matmul`` / ``cupy.matmul`` unchanged, so
results, dtypes and exceptions are always theirs. Batches become strided-batched calls without
copies: batch dimensions are merged wherever the strides of a, b and out allow it, and only
the dimensions that cannot be merged are looped over in Python.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:     # types only: importing pyblasgemm imports none of these
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

    from ._typing import Activation, Backend, Compute, GemmTrans, NDArray

import itertools
import math
import sys
import threading

import numpy as np

from typing import NamedTuple

from . import _arrays, arrays, calls, streams
from ._strided import FusedRun, dequant_gemm, epilogue_gemm, row_for, strided_gemm
from .backends import host as host_backend
from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES, acc_dtype, get_default_compute, resolve_compute
from ._layout import may_overlap
from .desc import check_backend, check_epilogue, numpy_result
from .epilogue import check_activation, note_route
from .epilogue_pass import run_unfused
from . import fp8
from .fp8 import FP8_TYPES, is_fp8, scaled_matmul
from .kernels import fp8 as fp8_kernels
from .planner import overrides as _overrides
from .planner.overrides import check_forced_backend, current_settings, resolve_invariant

_ROUTINE = "matmul"
#: cupy.ndarray / torch.Tensor once seen (the signature fast paths compare types by identity)
_CUPY = [None]
_TORCH = [None]
_JAX = [None]        # JAX's concrete array type, once JAX is imported (the replay's type test)
#: the signature lookup of the CuPy replay: the plan cache's one dict lookup (PlanCache.peek),
#: not calls.get's two frames, second hash (move_to_end) and hit count; with invariant=None
#: keyed without calls.flag's call: 0.33 µs less a call (2-core dev host, bench/replay_host.py,
#: medians of 4 processes); a hot signature ages as if unused (see calls.peek)
_PEEK = calls.cache.peek
_RECORDED = calls.recorded


def _exact_array(x):
    """'numpy' / 'cupy' for a plain ndarray (no subclass), else None."""
    if type(x) is np.ndarray:
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and type(x) is cupy.ndarray:
        return "cupy"
    return None


def _loop_dtypes(xp_name, da, db):
    """(compute dtype, result dtype) for an accelerated pair, else None (delegate).

    The result dtype is the array library's own: NumPy's matmul loop as NumPy resolves it
    (ml_dtypes' bfloat16 matmul returns float32 there, so bfloat16 NumPy products are formed
    from float32 copies: bf16 x bf16 products are exact in float32, sums in float32), CuPy's
    type promotion for CuPy arrays. Mixed kinds (int with float, real with complex) delegate.
    """
    if da.kind != db.kind or da not in ROW_BY_DTYPE or db not in ROW_BY_DTYPE:
        return None
    if xp_name == "cupy":
        result = np.result_type(da, db)
        return result, result
    try:
        ia, ib, result = np.matmul.resolve_dtypes((da, db, None))
    except (TypeError, ValueError):
        return None
    if ia != ib or ia not in ROW_BY_DTYPE:
        return None
    if ROW_BY_DTYPE[ia].c_dtype == result or ia == result:    # ia == result: int8 -> int8
        return ia, result
    if result == np.float32 and ia.itemsize < 4:
        return result, result
    return None


_FAST_2D: dict = {}


def _fast_2d_entry(a, b):
    """(xp, row, 1, 0) when a 2-D @ 2-D product of these types needs no promotion or
    conversion, else False (memoized per (array type, dtype, dtype))."""
    xp_name = _exact_array(a)
    if xp_name is None or a.dtype != b.dtype:
        return False
    dtypes = _loop_dtypes(xp_name, a.dtype, b.dtype)
    if dtypes is None or dtypes[0] != a.dtype or ROW_BY_DTYPE[a.dtype].c_dtype != dtypes[1]:
        return False
    row = ROW_BY_DTYPE[a.dtype]
    one, zero = (1, 0) if row.prefix == "i" else (1.0, 0.0)
    return _arrays.xp_of(xp_name), row, one, zero


def _same_device(a, b) -> bool:
    """Both on the current device (always true for NumPy arrays)."""
    if type(a) is np.ndarray:
        return True
    dev = a.data.device_id
    return dev == b.data.device_id and dev == _arrays.current_device()


#: numpy.matmul's keywords we do not act on, with their default values: a call that gives one
#: of them another value is numpy's / cupy's (they handle it, and raise for what is wrong)
_NUMPY_DEFAULTS = {"casting": "same_kind", "order": "K", "subok": True, "axes": None,
                   "axis": None, "signature": None}


def _delegate(a, b, out, dtype=None, numpy_kwargs=None, stream=None):
    kw = dict(numpy_kwargs or {})
    if dtype is not None:
        kw["dtype"] = dtype
    if out is not None:
        kw["out"] = out
    if _exact_array(a) == "cupy" or _exact_array(b) == "cupy" or _arrays.is_cupy_array(out):
        import cupy
        with streams.on(stream):
            return cupy.matmul(a, b, **kw)
    return np.matmul(a, b, **kw)


def _delegate_unless_invariant(invariant: bool, a, b, out, dtype=None, numpy_kwargs=None, stream=None):
    """:func:`_delegate`, refused for a batch-invariant call whose product NumPy or CuPy would
    compute in floating point (their GEMMs promise no invariance); integer and bool products
    are exact, hence invariant, and go."""
    if invariant:
        kinds = {np.dtype(x.dtype).kind for x in (a, b) if hasattr(x, "dtype")}
        if dtype is not None:
            kinds.add(np.dtype(dtype).kind)
        if kinds - set("iub") or not kinds:
            raise NotImplementedError(
                f"matmul: invariant=True runs on pyblasgemm's own products, and this call "
                f"({' @ '.join(type(x).__name__ + ' ' + str(getattr(x, 'dtype', '')) for x in (a, b))}"
                f"{', dtype=' + str(dtype) if dtype is not None else ''}"
                f"{', ' + ', '.join(numpy_kwargs) if numpy_kwargs else ''}) would go to numpy.matmul / "
                f"cupy.matmul, whose floating-point sums depend on the shape; pass operands of one "
                f"of pyblasgemm's types, on one device, without numpy.matmul's other keywords")
    return _delegate(a, b, out, dtype, numpy_kwargs, stream)


def _with_dtype(xp_name, a, b, dtype):
    """(row or None, (compute dtype, result dtype)) for ``dtype=``; None: delegate.

    NumPy's ``dtype=`` casts the operands to ``dtype`` and multiplies in it. float16 or
    bfloat16 operands with ``dtype=float32`` are the mixed-precision rows (shgemm / sbgemm):
    16-bit products are exact in float32, so the kernels' float32 accumulation of the 16-bit
    data is that computation, without the copies. A ``dtype`` equal to the product's own is a
    no-op; anything else goes to NumPy / CuPy."""
    try:
        want = np.dtype(dtype)
    except TypeError:
        return None
    if a.dtype == b.dtype and (a.dtype, want) in ROW_BY_DTYPES and a.dtype != want:
        return ROW_BY_DTYPES[(a.dtype, want)], (a.dtype, want)
    dtypes = _loop_dtypes(xp_name, a.dtype, b.dtype)
    if dtypes is not None and dtypes == (want, want):
        return ROW_BY_DTYPE[want], dtypes
    return None


# NumPy in gives NumPy out, CuPy CuPy, PyTorch PyTorch, JAX JAX (pyblasgemm._typing)
@overload
def matmul(a: NDArray, b: NDArray, out: NDArray | None = None, *,
        dtype: Any = None, compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None, **numpy_kwargs: Any) -> NDArray: ...


@overload
def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
        dtype: Any = None, compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None, **numpy_kwargs: Any) -> torch.Tensor: ...


@overload
def matmul(a: jax.Array, b: jax.Array, out: jax.Array | None = None, *,
        dtype: Any = None, compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None, **numpy_kwargs: Any) -> jax.Array: ...


@overload
def matmul(a: cupy.ndarray, b: cupy.ndarray, out: cupy.ndarray | None = None, *,
        dtype: Any = None, compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None, **numpy_kwargs: Any) -> cupy.ndarray: ...


@overload
def matmul(a: Any, b: Any, out: Any | None = None, *,
        dtype: Any = None, compute: Compute | None = None, backend: Backend | None = None,
        autotune: bool | None = None, stream: Any = None, bias: Any = None,
        activation: Activation | None = None, preactivation_out: Any = None, scale_a: Any = None,
        scale_b: Any = None, invariant: bool | None = None, **numpy_kwargs: Any) -> Any: ...


def matmul(a, b, out=None, *, dtype=None, compute=None, backend=None, autotune=None,
           stream=None, bias=None, activation=None, preactivation_out=None, scale_a=None,
           scale_b=None, invariant=None, **numpy_kwargs):
    """Matrix product with exactly ``numpy.matmul``'s semantics, on NumPy or CuPy arrays.

    1-D operands are promoted (a vector on the left is a row, on the right a column) and the
    added dimension removed from the result; batch dimensions of both operands broadcast;
    ``out=`` may be any writable array of the result's shape and dtype (non-contiguous too).
    CuPy in, CuPy out; NumPy in, NumPy out. float16, bfloat16, float32, float64, complex64,
    complex128 and int8 (int8 result, wrapping like NumPy's) run through pyblasgemm; every other
    dtype or combination is passed to ``numpy.matmul`` / ``cupy.matmul``.

    PyTorch tensors, JAX arrays and objects with ``__cuda_array_interface__`` or DLPack are
    taken too (:mod:`pyblasgemm.arrays`): computed on views of their memory (CUDA tensors on
    the GPU, CPU tensors and JAX CPU arrays on the host), the result in the caller's framework
    and an ``out=`` tensor written in place; a tensor that requires grad takes the
    differentiable route of :mod:`pyblasgemm.torch`.

    Parameters
    ----------
    a, b : array_like, or a framework's arrays (see above)
    out : array, optional
    dtype : dtype, optional
        As ``numpy.matmul``'s: compute and return in this type. float16 / bfloat16 operands
        with ``dtype=float32`` run as :func:`shgemm` / :func:`sbgemm` (no float32 copies of
        the operands); other requests NumPy or CuPy serve.
    compute : str, optional
        Accumulation mode, as for the BLAS form (e.g. ``'tf32'`` for float32).
    backend : {'auto', 'tensorcore', 'cublas', 'host'}, optional
    autotune : bool, optional
        Time the planner's best candidates once per problem (see :func:`pyblasgemm.tune`).
    stream : optional
        Where the GPU work is enqueued: a CuPy or PyTorch stream, an object with
        ``__cuda_stream__``, or a raw ``cudaStream_t`` int (see :mod:`pyblasgemm.streams`).
        Default: the current stream of the arrays' framework. NumPy arrays run on the host,
        where it changes nothing.
    bias, activation, preactivation_out, scale_a, scale_b : optional
        An epilogue: ``activation(a @ b + bias)``, the value before the activation into
        ``preactivation_out``, int8 products dequantized by ``scale_a`` (per row of ``a``)
        and ``scale_b`` (per column of ``b``) to ``dtype`` (float32 by default); see
        :mod:`pyblasgemm.epilogue`.
    invariant : bool, optional
        Batch-invariant: each row of the result has the same bits whatever other rows are
        computed with it (any M, any batch, any stream, any run); see
        :mod:`pyblasgemm.planner.invariant`. None: the ``PYBLASGEMM_INVARIANT`` setting
        (default False).
    casting, order, subok, axes, axis, signature
        ``numpy.matmul``'s other keywords. At their default values they change nothing; a
        call with any other value (``casting='unsafe'`` into a bool ``out``, ``axes=``...) is
        computed by ``numpy.matmul`` / ``cupy.matmul`` with them, and what they reject (an
        unknown keyword included) raises their error.

    Returns
    -------
    array, or a NumPy scalar for two 1-D NumPy operands (as ``numpy.matmul``)

    Examples
    --------
    >>> import numpy as np, pyblasgemm
    >>> a = np.arange(12, dtype=np.float32).reshape(2, 2, 3)      # a batch of two 2 x 3
    >>> b = np.ones(3, dtype=np.float32)                           # a vector
    >>> pyblasgemm.matmul(a, b)
    array([[ 3., 12.],
           [21., 30.]], dtype=float32)
    >>> pyblasgemm.matmul(b, b)
    np.float32(3.0)
    >>> h = np.full((1, 4), 200, dtype=np.float16)      # 4 * 200² overflows float16
    >>> pyblasgemm.matmul(h, h.T, dtype=np.float32)
    array([[160000.]], dtype=float32)
    >>> pyblasgemm.matmul(a, b[:, None], axes=[(-2, -1), (-2, -1), (-1, -2)])   # numpy's
    array([[[ 3., 12.]],
    <BLANKLINE>
           [[21., 30.]]], dtype=float32)
    """
    if not (bias is None and activation is None and preactivation_out is None and scale_a is None
            and scale_b is None):
        if numpy_kwargs:
            raise TypeError(f"matmul: an epilogue does not combine with numpy.matmul's "
                            f"{', '.join(numpy_kwargs)}")
        return _with_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias,
                              activation, preactivation_out, scale_a, scale_b, invariant)
    t = type(a)
    if (t is np.ndarray and type(b) is t and out is None and dtype is None and compute is None
            and backend is None and autotune is None and invariant is None and not numpy_kwargs):
        # two NumPy operands, no keywords: the host backend's arithmetic as one NumPy call
        # (float32/float64/complex/int8: numpy.matmul itself, bit for bit) at NumPy's cost
        # (4x4: ~1.3 µs, against ~50 µs through describe and plan; each check here is ~0.05 µs
        # of a budget the host tests hold to 2x NumPy's call)
        da, db = a.dtype, b.dtype
        direct = _HOST_DIRECT.get(da.num)
        if direct is not None and (db is da or db.num == da.num) and (
                da.num != _FLOAT32_NUM or get_default_compute() == "fp32"):
            s = _overrides._settings or current_settings()     # (the read settings: no call)
            if s.host_direct:
                return direct(a, b)
    if (t is _CUPY[0] and autotune is None and not numpy_kwargs
            and (dtype is None or isinstance(dtype, _DTYPE_WORDS))):
        # a repeated CuPy call: its signature maps straight to the launch that ran it
        sig = calls.key((_ROUTINE, compute, backend, dtype,
                         invariant if invariant is None else calls.flag(invariant)), a, b, out)
        if sig is not None:
            k, pa, pb, pc = sig
            try:
                call = _PEEK(k)
            except TypeError:       # an unhashable word (calls.flag's stand-in): the full path
                call = None
            if call is not None:
                _RECORDED.call = call       # a replay counts as recorded (arrays.torch_record)
                if out is None:
                    # the ndarray constructor itself (t is cupy.ndarray here): 3.7 µs against
                    # cupy.empty's 4.5 µs on the H100 host (host_primitives_h100_2026-11-24.json);
                    # the same C-ordered pool allocation
                    c = t(call.shape, call.dtype)
                    pc = c.data.ptr
                    if pc & call.c_mask:
                        call = None
                elif calls.overlaps(call, pa, pb, pc):
                    call = None
                else:
                    c = out
                if call is not None:
                    sptr = streams.current() if stream is None else streams.handle(stream)
                    call.run(pa, pb, pc, call.one, call.zero, sptr)
                    return c
    elif t is _TORCH[0] and autotune is None and dtype is None and not numpy_kwargs:
        # a repeated PyTorch call: the tensors' own attributes make the key (calls.key)
        c = arrays.torch_replay((_ROUTINE, compute, backend, None, calls.flag(invariant)), a, b, out,
                                stream)
        if c is not None:
            return c
    elif t is _JAX[0] and stream is None and autotune is None and dtype is None and not numpy_kwargs \
            and out is None and invariant is None:
        # JAX GPU arrays: an XLA operation (pyblasgemm.jax), its launch on XLA's stream
        c = arrays.jax_matmul(_ROUTINE, a, b, None, None, compute, backend, {})
        if c is not None:
            return c
    elif _CUPY[0] is None and calls.cupy_type() is not None:
        _CUPY[0] = calls.cupy_type()
    if ((type(a) not in _arrays.ARRAY_TYPES or type(b) not in _arrays.ARRAY_TYPES
         or (out is not None and type(out) not in _arrays.ARRAY_TYPES))
            and arrays.is_foreign(a, b, out)):
        # PyTorch / JAX / CUDA-array-interface arrays: run on views, answer in their type
        if _TORCH[0] is None:
            _TORCH[0] = arrays.torch_type()
        if _JAX[0] is None:
            _JAX[0] = arrays.jax_type()
        if _JAX[0] is not None and "jax" in (arrays.framework(a), arrays.framework(b)):
            c = arrays.jax_matmul(_ROUTINE, a, b, None, None, compute, backend,
                                  dict(out=out, dtype=dtype, autotune=autotune, stream=stream,
                                       invariant=invariant, numpy_kwargs=numpy_kwargs))
            if c is not None:
                return c
        if arrays.needs_grad(a, b):
            # a tensor that needs a gradient: the differentiable product (pyblasgemm.torch), not
            # a silent detach
            arrays.check_differentiable(_ROUTINE, out=out, dtype=dtype, compute=compute,
                                        backend=backend, autotune=autotune, stream=stream,
                                        invariant=invariant, **numpy_kwargs)
            return arrays.differentiable("matmul")(a, b)
        conv = arrays.convert(_ROUTINE, [("a", a), ("b", b), ("out", out)], writes=("out",))
        na, nb, nout = conv.arrays
        calls.forget_last()
        with conv.allocating():
            result = matmul(na, nb, nout, dtype=dtype, compute=compute, backend=backend,
                            autotune=autotune, stream=conv.stream if stream is None else stream,
                            invariant=invariant, **numpy_kwargs)
        back = out if out is not None else conv.back(result, framework_type=dtype is None)
        if (conv.kind == "torch" and conv.gpu and dtype is None and autotune is None and not numpy_kwargs
                and _plain_word(compute) and _plain_word(backend)):
            arrays.torch_record((_ROUTINE, compute, backend, None, calls.flag(invariant)), a, b, out,
                                back)
        return back
    return _core(a, b, out, dtype, compute, backend, autotune, stream, numpy_kwargs, invariant)


def _core(a, b, out, dtype, compute, backend, autotune, stream, numpy_kwargs, invariant=None):
    """The hall of :func:`matmul` for NumPy and CuPy arrays (after the signature fast paths and
    the door for other frameworks): numpy.matmul's rules, described, planned and run."""
    stream = streams.handle(stream)
    given_compute, given_backend, given_invariant = compute, backend, invariant
    invariant = resolve_invariant(_ROUTINE, invariant)
    if (out is None and dtype is None and compute is None and backend is None and autotune is None
            and not numpy_kwargs and type(a) is type(b)
            and type(a) in _arrays.ARRAY_TYPES and a.ndim == 2 and b.ndim == 2):
        fast = _FAST_2D.get((type(a), a.dtype, b.dtype))
        if fast is None:
            fast = _FAST_2D[(type(a), a.dtype, b.dtype)] = _fast_2d_entry(a, b)
        if fast and a.shape[1] == b.shape[0] and _same_device(a, b):
            # the common call, 2-D @ 2-D into a new array: no broadcasting, promotion or out=
            xp, row, one, zero = fast
            c = xp.empty((a.shape[0], b.shape[1]), dtype=row.c_dtype)
            ran = strided_gemm(_ROUTINE, row, resolve_compute(row, None, _ROUTINE), None, "N",
                               "N", a, b, c, one, zero, fresh_c=True, stream=stream,
                               invariant=invariant)
            if ran is not None and xp is not np:
                calls.record(_signature(a, b, None, invariant=given_invariant), ran[0], ran[1], a,
                             b, c, True, one, zero)
            return c
    if isinstance(out, tuple) and len(out) == 1:
        out = out[0]
    numpy_kwargs = {k: v for k, v in numpy_kwargs.items()
                    if k not in _NUMPY_DEFAULTS or not _is_default(v, _NUMPY_DEFAULTS[k])}
    if numpy_kwargs:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, numpy_kwargs, stream=stream)
    xp_name = _exact_array(a)
    if xp_name is None or _exact_array(b) != xp_name or a.ndim == 0 or b.ndim == 0:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    if xp_name == "cupy" and a.device.id != b.device.id:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    row = None
    if dtype is None:
        dtypes = _loop_dtypes(xp_name, a.dtype, b.dtype)
    else:
        row, dtypes = _with_dtype(xp_name, a, b, dtype) or (None, None)
    if dtypes is None:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    result_dtype = dtypes[1]
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    shape = batch + (m, n)
    final_shape = shape[:-2] + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    if out is not None:
        if (_exact_array(out) != xp_name or out.shape != final_shape or out.dtype != result_dtype
                or not _arrays.is_writeable(out)
                or (xp_name == "cupy" and out.device.id != a.device.id)):
            return _delegate_unless_invariant(invariant, a, b, out, dtype, stream=stream)
    operand_dtype = dtypes[0]
    row = row or ROW_BY_DTYPE[operand_dtype]
    compute = resolve_compute(row, compute, _ROUTINE)
    backend = check_backend(_ROUTINE, backend)
    xp = _arrays.xp_of(xp_name)
    if xp_name == "numpy" and row.prefix == "i" and result_dtype != row.c_dtype:
        return _host_int8(a, b, a2, b2, out, shape, final_shape, backend)

    with streams.on(stream if xp_name == "cupy" else None):   # CuPy work of this call (casts, copies) on the same stream
        a2 = a2.astype(operand_dtype, copy=False)
        b2 = b2.astype(operand_dtype, copy=False)
        if (out is None or row.c_dtype != result_dtype or may_overlap(out, a)
                or may_overlap(out, b)):
            # A fresh C-ordered result: no out, an out that overlaps the inputs (NumPy's answer is
            # then computed as if from copies), or int8 / bfloat16-to-float32, formed in the row's
            # output type and converted once (int8: wrapping equals NumPy's int8 accumulation).
            full, in_place = xp.empty(shape, dtype=row.c_dtype), False
        else:
            full, in_place = _with_core_dims(out, a.ndim, b.ndim), True
        ran = _batched(row, compute, backend, a2, b2, full, autotune, stream, invariant)
        if (ran is not None and xp_name == "cupy" and a2 is a and b2 is b
                and full.dtype == result_dtype and autotune is None
                and (dtype is None or isinstance(dtype, _DTYPE_WORDS))
                and _plain_word(given_compute) and _plain_word(given_backend)):
            # one launch on the caller's own arrays: the next call with this signature goes straight
            # to it (calls.py)
            one, zero = (1, 0) if row.prefix == "i" else (1.0, 0.0)
            calls.record(_signature(a, b, out if in_place else None, given_compute,
                                    given_backend, dtype, given_invariant), ran[0], ran[1], a, b, full,
                         not in_place, one, zero)
        if out is not None:
            if not in_place:
                out[...] = full.reshape(final_shape).astype(out.dtype, copy=False)
            return out
        result = full.reshape(final_shape).astype(result_dtype, copy=False)
        if xp_name == "numpy" and result.ndim == 0:
            return result[()]
        return result


_HOST_DIRECT = host_backend.DIRECT
#: float32 (the NumPy fast path serves it only under the 'fp32' default compute)
_FLOAT32_NUM = np.dtype(np.float32).num


def _host_int8(a, b, a2, b2, out, shape, final_shape, backend):
    """An int8 result of int8 NumPy operands: the host's int8 route writes it directly (no
    int32 array the size of the result beside it: NumPy's own call needs only the int8 one;
    a 2^31 x 1 column ran out of memory through the int32 route)."""
    check_forced_backend(_ROUTINE, backend, "numpy")
    if out is not None and not (may_overlap(out, a) or may_overlap(out, b)):
        host_backend.int8_matmul(a2, b2, _with_core_dims(out, a.ndim, b.ndim))
        return out
    full = np.empty(shape, np.int8)     # (an out sharing memory with a or b: as if from copies)
    host_backend.int8_matmul(a2, b2, full)
    result = full.reshape(final_shape)
    if out is not None:
        out[...] = result
        return out
    return result[()] if result.ndim == 0 else result

#: ``dtype=`` values a signature key holds as given (hashable, and equal only when they name
#: the same dtype: ``numpy.int32``, ``numpy.dtype('int32')``, ``'int32'``)
_DTYPE_WORDS = (type, np.dtype, str)


def _signature(a, b, out, compute=None, backend=None, dtype=None, invariant=None):
    """The call-signature key of matmul(a, b, out, compute=, backend=, dtype=, invariant=) as
    given (:func:`pyblasgemm.calls.key`; None for arrays it does not key)."""
    sig = calls.key((_ROUTINE, compute, backend, dtype, calls.flag(invariant)), a, b, out)
    return None if sig is None else sig[0]


def _plain_word(value) -> bool:
    """None or a str: a keyword value a signature key can hold as given."""
    return value is None or type(value) is str


def _get_device() -> int:
    return _arrays.current_device()


def _is_default(value, default) -> bool:
    """``value is default`` for None and True; equality for the strings (an array compared
    with a string must not reach NumPy's elementwise ==)."""
    if default is None or default is True:
        return value is default
    return isinstance(value, str) and value == default


def _with_core_dims(out, a_ndim, b_ndim):
    """A view of out with the dimensions that 1-D promotion removed put back (size 1)."""
    if a_ndim == 1 and b_ndim == 1:
        return out[None, None]
    if a_ndim == 1:
        return out[..., None, :]
    if b_ndim == 1:
        return out[..., None]
    return out


def _batch_strides(x, nb):
    """Byte strides of x's batch dims aligned right to nb broadcast dims; 0 where broadcast."""
    dims, strides = x.shape[:-2], x.strides[:-2]
    return (0,) * (nb - len(dims)) + tuple(0 if d == 1 else s for d, s in zip(dims, strides))


def _origin(x, nb, outer_idx):
    """The 2-D matrix of x at the start of the batch group ``outer_idx`` (broadcast-aware)."""
    pad = nb - (x.ndim - 2)
    if x.ndim == 2:
        return x
    idx = tuple(0 if (d == 1 or g >= len(outer_idx)) else outer_idx[g]
                for g, d in ((j + pad, d) for j, d in enumerate(x.shape[:-2])))
    return x[idx]


def _batched(row, compute, backend, a, b, c, autotune=None, stream=None, invariant=False):
    """c[...] = a @ b over the broadcast batch dims: merged strided batches, a loop outside.
    Returns strided_gemm's ``(launch, swapped)`` when it all ran as one launch, else None."""
    batch = c.shape[:-2]
    if 0 in batch:
        return None     # an empty batch: nothing to compute (and no matrix to index)
    nb = len(batch)
    strides = [_batch_strides(x, nb) for x in (a, b, c)]
    p, step_dim = _split_point(batch, strides)
    inner = math.prod(batch[p:])
    steps = tuple(s[step_dim] for s in strides) if step_dim is not None else (0, 0, 0)
    one, zero = (1, 0) if row.prefix == "i" else (1.0, 0.0)
    ran = None
    for idx in itertools.product(*(range(d) for d in batch[:p])):
        ran = strided_gemm(_ROUTINE, row, compute, backend, "N", "N", _origin(a, nb, idx),
                           _origin(b, nb, idx), _origin(c, nb, idx), one, zero, inner, steps,
                           autotune=autotune, stream=stream, invariant=invariant)
    return ran if p == 0 else None


def _split_point(batch, strides_list):
    """(p, step_dim): batch dims [p:] of every array collapse into one constant stride, that of
    dim ``step_dim`` (the innermost dim of size > 1; None when all are 1). Dims [:p] are looped.
    """
    p, step_dim, outer = len(batch), None, None
    for i in range(len(batch) - 1, -1, -1):
        if batch[i] != 1:
            if outer is not None and any(s[i] != s[outer] * batch[outer] for s in strides_list):
                break
            outer = i
            step_dim = i if step_dim is None else step_dim
        p = i
    return p, step_dim


# ---------------------------------------------------------------------------------------------
# matmul with an epilogue (pyblasgemm.epilogue): checked here; a 2-D call on CuPy arrays is
# described with its EpilogueSpec and run by the plan's route; every other call (NumPy, batches
# that broadcast, vectors, integer or mixed types) is the unfused route: the product through
# the hall's core (_core: matmul() is not entered again), then one pass


class _Replay(NamedTuple):
    """A matmul call with an epilogue that ran fused, as its call signature replays it."""

    run: object         # the FusedRun (pyblasgemm._strided)
    shape: tuple
    dtype: object


def _epilogue_signature(a, b, dtype, compute, backend, bias, activation, invariant=None):
    """The key of a repeated ``matmul(a, b, bias=, activation=, dtype=, compute=, backend=,
    invariant=)``
    with CuPy arrays, a fresh result and no pre-activation, or None (not such a call): the
    :func:`pyblasgemm.calls.key` of the operands, with the bias (its own alignment class)."""
    nd = _CUPY[0]
    if nd is None or type(a) is not nd or (bias is not None and type(bias) is not nd) \
            or not (activation is None or type(activation) is str) \
            or not (dtype is None or isinstance(dtype, _DTYPE_WORDS)) \
            or not (compute is None or type(compute) is str) or not (backend is None or type(backend) is str) \
            or not (invariant is None or type(invariant) is bool):
        return None
    sig = calls.key((_ROUTINE, "epilogue", dtype, compute, backend, activation, invariant), a, b, None,
                    (bias,))
    return None if sig is None else sig[0]


def _fp8_words(dtype, compute, backend, activation, invariant, operand_dtype_type):
    """The form's part of a float8 product's key (:func:`pyblasgemm.calls.key`'s ``words``), or
    None for a keyword value a key cannot hold as given (the full path then names it): the
    keywords as given (``dtype=`` a NumPy dtype word or the operands' framework's dtype, such as
    ``torch.bfloat16``), the route setting (:data:`pyblasgemm.kernels.fp8.ROUTE`), and the kernel family rule (:data:`pyblasgemm.kernels.fp8.FAMILY`: the
    same call runs the Hopper kernel or mma.sync by it). (The checks written out, not
    :func:`_plain_word` / :func:`pyblasgemm.calls.flag` called: 0.33 against 0.50 µs on the
    2-core dev host, bench/fp8_host_profile.py.)"""
    if not ((activation is None or type(activation) is str) and (compute is None or type(compute) is str)
            and (backend is None or type(backend) is str)
            and (dtype is None or isinstance(dtype, _DTYPE_WORDS) or type(dtype) is operand_dtype_type)):
        return None
    if not (invariant is None or invariant is True or invariant is False):
        invariant = calls.flag(invariant)
    return (_ROUTINE, "float8", dtype, compute, backend, activation, invariant, fp8_kernels.FAMILY,
            fp8_kernels.ROUTE)


def epilogue_named(a, b, out, bias, pre, scale_a, scale_b):
    """The arrays of a call with an epilogue, named as the forms name them."""
    return [("a", a), ("b", b), ("out", out), ("bias", bias), ("preactivation_out", pre),
            ("scale_a", scale_a), ("scale_b", scale_b)]


def _with_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias, activation,
                   preactivation_out, scale_a, scale_b, invariant=None):
    """:func:`matmul` with an epilogue (see :mod:`pyblasgemm.epilogue`)."""
    if type(a) is _TORCH[0] and _TORCH[0] is not None:
        # tensors: their own replay and door (the CuPy key and the foreign-array scan below
        # would only say so, ~1 µs of a ~20 µs call)
        if out is None and preactivation_out is None and scale_a is None and scale_b is None \
                and autotune is None:
            # a repeated fused call on CUDA tensors: its recorded launch on their pointers, the
            # result from torch's allocator (a miss: the converting path, ~200 µs a call on an
            # H200 at 64³ fp16, runs and records it). Written out here, in no function of its
            # own: a frame is ~0.15 µs of a ~17 µs call on an H100 host, where this call's bar
            # is 1.1x the same call on CuPy arrays (bench/results/torch_callpath_h100_*.json)
            sig = _torch_epilogue_key(a, b, dtype, compute, backend, bias, activation, invariant)
            hit = None if sig is None else calls.get(sig[0])
            if hit is not None and hit.device == _arrays.current_device():     # (a frame less)
                k, pa, pb, pbias = sig
                dev = k[calls.TORCH_DEVICE]
                # the operands' own dtype and device (as arrays.torch_replay): no keyword parsed
                c = a.new_empty_strided(hit.shape, hit.strides) if hit.dtype is a.dtype else \
                    sys.modules["torch"].empty_strided(hit.shape, hit.strides, dtype=hit.dtype, device=dev)
                pc = c.data_ptr()
                if not pc & 15:
                    run = hit.run
                    if run.swap:
                        pa, pb = pb, pa
                    run.launch(pa, pb, pc, run.alpha, run.beta,
                               arrays.torch_raw_stream(dev) if stream is None else streams.handle(stream),
                               bias=pbias)
                    note_route(run.route)
                    return c
        return _foreign_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias,
                                 activation, preactivation_out, scale_a, scale_b, invariant)
    key = fp8_key = None
    if out is None and preactivation_out is None and scale_a is None and scale_b is None and autotune is None:
        # a repeated fused call goes straight to its launch (16 x 11008 x 4096 on an H100:
        # the full path's checks, description and plan lookups are most of a ~40 µs call)
        if _CUPY[0] is None:
            _CUPY[0] = calls.cupy_type()
        key = _epilogue_signature(a, b, dtype, compute, backend, bias, activation, invariant)
        replay = None if key is None else calls.get(key)
        if replay is not None:
            c = _CUPY[0](replay.shape, replay.dtype)
            pc = c.data.ptr
            if not pc & 15:
                sptr = streams.current() if stream is None else streams.handle(stream)
                run = replay.run
                if bias is not None and run.widen is not None:
                    with streams.on(sptr):              # (freed after the launch: same stream)
                        bias = bias.astype(run.widen)
                pa, pb = a.data.ptr, b.data.ptr
                if run.swap:
                    pa, pb = pb, pa
                run.launch(pa, pb, pc, run.alpha, run.beta, sptr, bias=0 if bias is None else bias.data.ptr)
                note_route(run.route)
                return c
    elif scale_a is not None and preactivation_out is None and autotune is None:
        # a repeated float8 product: its launch on the new pointers (~100 µs a call through
        # the checks, the device queries and the plan below; H100, decode shapes,
        # bench/results/fp8_h100_2026-11-28_ea86fdf.json)
        if _CUPY[0] is None:
            _CUPY[0] = calls.cupy_type()
        if type(a) is _CUPY[0] and a.dtype in FP8_TYPES:
            words = _fp8_words(dtype, compute, backend, activation, invariant, type(a.dtype))
            if words is not None:
                c, fp8_key = fp8.replay(words, a, b, out, bias, scale_a, scale_b, stream)
                if c is not None:
                    return c
    r = _ROUTINE
    if arrays.is_foreign(a, b, out, bias, preactivation_out, scale_a, scale_b):
        # (after the CuPy replay: its key refuses every other type)
        return _foreign_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias,
                                 activation, preactivation_out, scale_a, scale_b, invariant)
    xp_name = _arrays.array_module_name(a)
    if xp_name is None or _arrays.array_module_name(b) != xp_name:
        raise TypeError(f"{r}: an epilogue needs a and b to be NumPy arrays or CuPy arrays "
                        f"(both of one kind), got {type(a).__name__} and {type(b).__name__}")
    if is_fp8(a.dtype) or is_fp8(b.dtype):
        result = scaled_matmul(r, a, b, out, dtype, bias, activation, preactivation_out, scale_a,
                               scale_b, check_backend(r, backend), stream=stream,
                               invariant=resolve_invariant(r, invariant))
        fp8.record(fp8_key, out, result)        # (one launch on these arrays: replayed next time)
        return result
    shape = _matmul_shape(a, b)
    dequant = scale_a is not None or scale_b is not None
    # NumPy's result type (bfloat16 @ bfloat16 is float32 with ml_dtypes), and NumPy's rule
    # for dtype= and out: what numpy.matmul refuses (a float product into uint8 or bool) is
    # refused here too, before any work
    loop, out_dtype = numpy_result(r, a.dtype, b.dtype, dtype, out if dtype is None else None)
    if dequant and dtype is None and out is None:
        out_dtype = np.dtype(np.float32)
    if out is not None and (out.shape != shape or out.dtype != out_dtype):
        raise ValueError(f"{r}: out has shape {out.shape} and dtype {out.dtype.name}; the result "
                         f"is {shape} {np.dtype(out_dtype).name}")
    if out is not None and not _arrays.is_writeable(out):
        raise ValueError(f"{r}: out is read-only")
    mn = (a.shape[-2] if a.ndim > 1 else 1, b.shape[-1] if b.ndim > 1 else 1)
    epi = check_epilogue(r, shape, mn, out_dtype, xp_name, bias, activation, preactivation_out,
                         scale_a, scale_b, a.dtype)
    backend = check_backend(r, backend)
    resolved = resolve_invariant(r, invariant)
    sptr = streams.handle(stream)
    kw = dict(compute=compute, backend=backend, autotune=autotune, stream=sptr, numpy_kwargs={},
              invariant=resolved)
    xp = _arrays.xp_of(xp_name)
    result = out if out is not None else xp.empty(shape, out_dtype)

    # the epilogue sees (..., m, n): views with matmul's dropped vector axes put back
    def full(x):
        return None if x is None else _with_core_dims(x, a.ndim, b.ndim)

    ran = None
    if dequant:
        if xp_name == "cupy" and a.ndim == 2 and b.ndim == 2:
            ran = dequant_gemm(a, b, "N", "N", result, 1.0, 0.0, epi, bias, preactivation_out, scale_a,
                               scale_b, out is None, backend, autotune, sptr, resolved)
        if not isinstance(ran, FusedRun):
            with streams.on(sptr if xp_name == "cupy" else None):  # the pass on the product's stream
                t = _core(a, b, None, np.int32, **kw)
                run_unfused(epi, xp_name, full(xp.asarray(t)), 1.0, None, None, bias, scale_a,
                            scale_b, full(preactivation_out), full(result), ran)
        return result if result.shape else result[()]
    if xp_name == "cupy" and a.ndim == 2 and b.ndim == 2:
        ran = epilogue_gemm(r, row_for(a.dtype, out_dtype), compute, "N", "N", a, b, result, 1.0, 0.0,
                            epi, bias, preactivation_out, out is None, backend, autotune, sptr,
                            resolved)
        if isinstance(ran, FusedRun):
            if key is not None and result.flags.c_contiguous and not result.data.ptr & 15:
                calls.put(key, _Replay(ran, result.shape, result.dtype), refers_to=ran.launch)
            _last_fused.run = ran           # (the torch door records it under the tensors' key)
            return result
    with streams.on(sptr if xp_name == "cupy" else None):          # the pass on the product's stream
        _unfused(a, b, kw, xp, loop, out_dtype, epi, bias, full, preactivation_out, result, ran)
    return result if result.shape else result[()]


def _unfused(a, b, kw, xp, loop, out_dtype, epi, bias, full, preactivation_out, result, ran):
    """The product in the accumulation type through the hall's core, then the one pass."""
    if a.dtype.kind in "iub":
        # integer or bool operands: NumPy's own product, the operands cast to its loop type
        # and multiplied in it, wrapping as it wraps (cupy.matmul's dtype=int64 casts the
        # int32 product instead); an integer result is summed and activated exactly, then
        # cast (epilogue_pass.apply)
        t = xp.asarray(_core(a.astype(loop, copy=False), b.astype(loop, copy=False), None, None, **kw))
        if out_dtype.kind not in "iub":
            t = t.astype(acc_dtype(out_dtype), copy=False)
    else:
        acc = acc_dtype(out_dtype)
        t = _core(a, b, None, acc if a.dtype.itemsize == 2 else None, **kw)
        t = xp.asarray(t, dtype=acc)
    run_unfused(epi, "numpy" if xp is np else "cupy", full(t), None, None, None, bias, None, None,
                full(preactivation_out), full(result), ran)


def _matmul_shape(a, b) -> tuple:
    """numpy.matmul's result shape; for shapes it refuses, its own error (raised by NumPy on
    zero-stride stand-ins: no memory, no work)."""
    sa = a.shape if a.ndim > 1 else (1,) + a.shape
    sb = b.shape if b.ndim > 1 else b.shape + (1,)
    try:
        if a.ndim == 0 or b.ndim == 0 or sa[-1] != sb[-2]:
            raise ValueError
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        cell = np.zeros((), np.int8)
        np.matmul(np.broadcast_to(cell, a.shape), np.broadcast_to(cell, b.shape))
        raise      # (not reached: NumPy raised above)
    return batch + ((sa[-2],) if a.ndim > 1 else ()) + ((sb[-1],) if b.ndim > 1 else ())


# Foreign arrays (PyTorch tensors, JAX arrays, CUDA-array-interface and DLPack objects): the
# call runs on their NumPy / CuPy views (pyblasgemm.arrays) and answers in their framework


def _framework_dtype(conv, dtype, out, dequant: bool):
    """``dtype=`` for a call on the views: bfloat16 for bfloat16 @ bfloat16 from PyTorch or JAX
    (their rule; NumPy's, which the views would follow, is float32), so that ``bias``,
    ``preactivation_out`` and the result are bfloat16 as the caller's framework makes them;
    otherwise ``dtype`` as given."""
    if dtype is None and out is None and not dequant and conv.kind in ("torch", "jax"):
        na, nb = conv.arrays[:2]
        if getattr(na, "dtype", None) is not None and na.dtype.name == "bfloat16" \
                and getattr(nb, "dtype", None) == na.dtype:
            return na.dtype
    return dtype


class _LastFused(threading.local):
    run = None


#: the fused call a CuPy-view call just ran (read by the torch door to record it too)
_last_fused = _LastFused()


class _TorchReplay(NamedTuple):
    """A fused call recorded for torch tensors: the run and the result tensor's layout."""

    run: object             # the FusedRun
    shape: tuple
    strides: tuple
    dtype: object           # the torch dtype
    device: int             # CuPy's current device when it ran (the launch is bound on it)


def _torch_epilogue_key(a, b, dtype, compute, backend, bias, activation, invariant=None):
    """``(key, pa, pb, pbias)`` of a repeatable fused call on CUDA tensors, or None: the
    :func:`pyblasgemm.calls.key` of the tensors with the bias (its own alignment class). The
    current device, on which the launch is bound, is not in the key but in the record
    (:class:`_TorchReplay`'s ``device``), checked by the replay: the key of a CPU tensor is None
    before any device is asked for, with no ``get_device()`` read of its own (~0.1 µs)."""
    if not (activation is None or type(activation) is str) or not (
            dtype is None or isinstance(dtype, _DTYPE_WORDS)) or not (
            compute is None or type(compute) is str) or not (backend is None or type(backend) is str) \
            or not (invariant is None or type(invariant) is bool):
        return None
    if _TORCH[0] is None:
        _TORCH[0] = arrays.torch_type()
    if type(a) is not _TORCH[0] or (bias is not None and type(bias) is not _TORCH[0]):
        return None
    sig = calls.key((_ROUTINE, "epilogue", dtype, compute, backend, activation, invariant), a, b, None,
                    (bias,))
    # (key, pa, pb, and the bias' pointer as the key read it: no C, so no pc)
    return None if sig is None else (sig[0], sig[1], sig[2], sig[4])


def _foreign_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias, activation, pre,
                      scale_a, scale_b, invariant=None):
    sig = fp8_key = None
    if scale_a is not None and pre is None and autotune is None:
        # a repeated float8 product on CUDA tensors: its launch on their pointers, the result
        # from torch's allocator (the converting path below: ~300 µs a call on an H100,
        # decode shapes, bench/results/fp8_h100_2026-11-28_ea86fdf.json)
        if _TORCH[0] is None:
            _TORCH[0] = arrays.torch_type()
        if type(a) is _TORCH[0] and a.dtype in fp8.torch_fp8_dtypes():
            # (a CPU tensor gives no key: it runs on the host, no device asked for; the key
            # holds the current device, where the launch is bound)
            words = _fp8_words(dtype, compute, backend, activation, invariant, type(a.dtype))
            if words is not None:
                c, fp8_key = fp8.replay(words, a, b, out, bias, scale_a, scale_b, stream)
                if c is not None:
                    return c
    elif out is None and pre is None and scale_a is None and scale_b is None and autotune is None:
        # (a repeated fused call on CUDA tensors replayed in _with_epilogue: this is a first
        # call, recorded below under this key)
        sig = _torch_epilogue_key(a, b, dtype, compute, backend, bias, activation, invariant)
    if "jax" in (arrays.framework(a), arrays.framework(b)):
        c = arrays.jax_matmul("matmul", a, b, bias, activation, compute, backend,
                              dict(out=out, dtype=dtype, autotune=autotune, stream=stream,
                                   preactivation_out=pre, scale_a=scale_a, scale_b=scale_b,
                                   invariant=invariant))
        if c is not None:
            return c
    if arrays.needs_grad(a, b, out, bias, pre, scale_a, scale_b):
        return _differentiable_linear(a, b, out, dtype, compute, backend, autotune, stream, bias,
                                      activation, pre, scale_a, scale_b, invariant)
    conv = arrays.convert("matmul", epilogue_named(a, b, out, bias, pre, scale_a, scale_b),
                          writes=("out", "preactivation_out"))
    na, nb, nout, nbias, npre, nsa, nsb = conv.arrays
    dtype = _framework_dtype(conv, dtype, out, scale_a is not None or scale_b is not None)
    _last_fused.run = None
    fp8.forget_last()
    with conv.allocating():
        result = _with_epilogue(na, nb, nout, dtype, compute, backend, autotune,
                                conv.stream if stream is None else stream, nbias, activation, npre,
                                nsa, nsb, invariant)
    back = out if out is not None else conv.back(result, framework_type=False)
    if fp8_key is not None:
        fp8.record(fp8_key, out, back)          # the views' one launch, under the tensors' key
    ran, _last_fused.run = _last_fused.run, None
    if sig is not None and ran is not None and ran.widen is None and back.is_contiguous():
        calls.put(sig[0], _TorchReplay(ran, tuple(back.shape), back.stride(), back.dtype, _get_device()),
                  refers_to=ran.launch)
    return back


def _differentiable_linear(x, w, out, dtype, compute, backend, autotune, stream, bias, activation,
                           pre, scale_a, scale_b, invariant=None):
    """``matmul(x, w, bias=, activation=)`` with a tensor that requires grad: exactly
    ``pyblasgemm.torch.linear(x, w.T, bias, activation)`` when it is that call (``w`` 2-D,
    ``bias`` of shape (n,) or None, no other keyword), else a TypeError saying what is
    differentiable (never a silent detach)."""
    r = "matmul"
    check_activation(r, activation)
    torch = sys.modules["torch"]        # (a tensor requires grad: PyTorch is imported)

    given = dict(out=out, dtype=dtype, compute=compute, backend=backend, autotune=autotune,
                 stream=stream, preactivation_out=pre, scale_a=scale_a, scale_b=scale_b,
                 invariant=invariant)
    extra = [f"{k}=" for k, v in given.items() if v is not None]
    tensors = all(isinstance(v, torch.Tensor) for v in (x, w) + ((bias,) if bias is not None else ()))
    shaped = tensors and x.dim() >= 1 and w.dim() == 2 and (
        bias is None or tuple(bias.shape) == (w.shape[1],))
    if extra or not shaped:
        what = (", ".join(extra) if extra else
                "operands that are not all tensors" if not tensors else
                f"a of shape {tuple(x.shape)}, b of shape {tuple(w.shape)}"
                + ("" if bias is None else f" and bias of shape {tuple(bias.shape)}"))
        raise TypeError(f"{r}: an epilogue with {what} on tensors that require grad: the "
                        f"differentiable epilogue is pyblasgemm.torch.linear's, "
                        f"activation(x @ w + bias) for tensors x (..., k), w (k, n) and bias (n,) "
                        f"or None, with no out=, preactivation_out=, scale_a=, scale_b=, dtype=, "
                        f"compute=, backend=, autotune=, stream= or invariant=; detach the tensors, or call "
                        f"under torch.no_grad()")
    # nn.Linear's weight is (n, k): w.T, a view the gradient flows through
    return arrays.differentiable("linear")(x, w.T, bias, activation)
