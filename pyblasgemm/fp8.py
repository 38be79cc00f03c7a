"""FP8 products with scales: ``(scale_a ⊙ a) @ (scale_b ⊙ b)`` for float8 operands.

The operands are ``float8_e4m3fn`` or ``float8_e5m2`` (ml_dtypes' types, PyTorch's
``torch.float8_e4m3fn`` / ``torch.float8_e5m2``), and each comes with float32 scales in one of
the layouts the FP8 libraries use (cuBLASLt 13, ``torch._scaled_mm``, DeepGEMM):

=============  ===========================  ===========================================
layout         ``scale_a`` (a is m x k)     ``scale_b`` (b is k x n)
=============  ===========================  ===========================================
tensor         one value: shape () or (1,)  one value: shape () or (1,)
rows / cols    (m,): one per row of a       (n,): one per column of b
blocks         (m, ceil(k/128)): 1 x 128    (ceil(k/128), ceil(n/128)): 128 x 128
=============  ===========================  ===========================================

so that ``c[i, j] = sum_k scale_a(i, k) · a[i, k] · scale_b(k, j) · b[k, j]``, then ``+ bias``
and the activation, in the output type (float32 by default; float16 or bfloat16 by ``dtype=``).

The host computes it from **exact block sums**: every value of both types is an integer times a
power of two (e4m3: units of 2^-9, at most 448; e5m2: units of 2^-16, at most 57344), so each
128-term sum of products is an exact int64 sum (e5m2 operands are split into 16-bit halves
first: their products would pass 2^63), and only the scaling and the sum over blocks round, in
float64 (2^-53 relative, far below any output type's rounding).

GPU arrays (CuPy; CUDA tensors and JAX GPU arrays through the array door) take the flow of every
other product: described (:func:`pyblasgemm.desc.describe_fp8`), planned
(:func:`pyblasgemm.planner.plan_for`: cuBLASLt's FP8 GEMM or our kernels) and run
(:func:`pyblasgemm.execute.execute_fp8`). Our kernels are the float8
kinds of our mma.sync and Hopper kernels (sm_89+; :mod:`pyblasgemm.kernels.fp8`): float32 accumulation of
the raw products, the per-tensor or per-row / per-column scales read on the device in the
fused store (block scales: each 128-wide K block promoted into the accumulator scaled, in the
mainloop, as DeepGEMM does), then alpha, beta·out, bias and the activation in this module's
order.

>>> import numpy as np, ml_dtypes, pyblasgemm
>>> a = np.array([[1.5, -2.0], [0.25, 448.0]], dtype=ml_dtypes.float8_e4m3fn)
>>> b = np.array([[2.0, 1.0], [0.5, -0.125]], dtype=ml_dtypes.float8_e4m3fn)
>>> pyblasgemm.matmul(a, b, scale_a=np.float32(0.5), scale_b=np.array([1, 2], np.float32))
array([[  1.  ,   1.75],
       [112.25, -55.75]], dtype=float32)
"""
from __future__ import annotations

import sys
import threading
from typing import NamedTuple

import numpy as np

from . import _arrays, arrays, calls, streams
from ._types import dtype_text
from .desc import alignment, check_epilogue, describe_fp8
from .epilogue import note_route
from .epilogue_pass import run_unfused
from .execute import execute_fp8
from .kernels import fp8 as gpu
from .planner import plan_for

__all__ = ["FP8_TYPES", "BLOCK", "BACKENDS", "is_fp8", "check_scales", "scaled_product", "scaled_matmul",
           "Fp8Call", "replay", "record", "forget_last", "last_call", "torch_fp8_dtypes"]

#: the output types of a float8 product (``dtype=``; float32 by default)
OUT_DTYPES = ("float32", "float16", "bfloat16")

#: the K (and N) extent one block scale covers: DeepGEMM's and cuBLASLt's 1 x 128 and
#: 128 x 128 blocks
BLOCK = 128


class Fp8Type(NamedTuple):
    name: str
    unit_exponent: int      # every value is an integer times 2^unit_exponent (the subnormal step)
    max_units: int          # the largest |value| in those units


def _fp8_types() -> dict:
    import ml_dtypes

    return {np.dtype(ml_dtypes.float8_e4m3fn): Fp8Type("float8_e4m3fn", -9, 448 << 9),
            np.dtype(ml_dtypes.float8_e5m2): Fp8Type("float8_e5m2", -16, 57344 << 16)}


#: operand dtype -> its integer form (one row per type)
FP8_TYPES = _fp8_types()


def is_fp8(dtype) -> bool:
    """Whether ``dtype`` is one of the float8 operand types.

    >>> import ml_dtypes
    >>> is_fp8(ml_dtypes.float8_e5m2), is_fp8(np.float16)
    (True, False)
    """
    try:
        return np.dtype(dtype) in FP8_TYPES
    except TypeError:
        return False


def check_scales(routine: str, scale_a, scale_b, m: int, n: int, k: int, names=None) -> tuple:
    """``(layout of scale_a, layout of scale_b)`` ('tensor', 'rows' / 'cols', 'blocks'), or a
    TypeError / ValueError naming the argument, its shape and the layouts it may have (the
    module docstring's table), before any work. Both scales are required, float32.

    >>> check_scales("matmul", np.ones(3, np.float32), np.ones((2, 1), np.float32), 3, 100, 200)
    ('rows', 'blocks')
    >>> check_scales("matmul", np.ones(4, np.float32), np.float32(1), 3, 100, 200)
    Traceback (most recent call last):
        ...
    ValueError: matmul: scale_a has shape (4,); for a of 3 x 200 it must be () or (1,) (one scale), (3,) (one per row) or (3, 2) (one per 1 x 128 block)
    """
    names = {"scale_a": "scale_a", "scale_b": "scale_b", **(names or {})}
    if scale_a is None or scale_b is None:
        raise ValueError(f"{routine}: a float8 product needs both {names['scale_a']} and "
                         f"{names['scale_b']} (pass 1.0 for an unscaled operand); got only "
                         f"{names['scale_a'] if scale_b is None else names['scale_b']}")
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    layouts = []
    for key, x, shapes, operand in (
            ("scale_a", scale_a, {(): "tensor", (1,): "tensor", (m,): "rows", (m, kb): "blocks"},
             f"a of {m} x {k}"),
            ("scale_b", scale_b, {(): "tensor", (1,): "tensor", (n,): "cols", (kb, nb): "blocks"},
             f"b of {k} x {n}")):
        dtype = getattr(x, "dtype", None)
        if dtype is None or np.dtype(dtype) != np.float32:
            raise TypeError(f"{routine}: {names[key]} must be a float32 array or scalar, got "
                            f"{dtype_text(dtype) if dtype is not None else type(x).__name__}")
        shape = tuple(x.shape)
        if shape not in shapes:
            per = ((f"({m},) (one per row) or ({m}, {kb}) (one per 1 x {BLOCK} block)") if key == "scale_a"
                   else f"({n},) (one per column) or ({kb}, {nb}) (one per {BLOCK} x {BLOCK} block)")
            raise ValueError(f"{routine}: {names[key]} has shape {shape}; for {operand} it must be () "
                             f"or (1,) (one scale), {per}")
        layouts.append(shapes[shape])
    return tuple(layouts)


def _units(x: np.ndarray) -> np.ndarray:
    """The fp8 values as exact int64 multiples of their type's unit (NaN refused by the caller)."""
    t = FP8_TYPES[x.dtype]
    return np.ldexp(x.astype(np.float64), -t.unit_exponent).astype(np.int64)


def _halves(u: np.ndarray) -> tuple:
    """``(hi, lo)`` with ``u = hi · 2^16 + lo``, ``0 <= lo < 2^16``: int64 parts whose products
    stay below 2^32."""
    lo = u & 0xFFFF
    return (u - lo) >> 16, lo


def _block_sums(ua: np.ndarray, ub: np.ndarray, wide: bool) -> np.ndarray:
    """float64 (m, n) of ``ua @ ub`` for one K block, from exact int64 sums (halves when
    ``wide``: products that would pass 2^63)."""
    if not wide:
        return np.matmul(ua, ub).astype(np.float64)
    (ah, al), (bh, bl) = _halves(ua), _halves(ub)
    hh, mid, ll = ah @ bh, ah @ bl + al @ bh, al @ bl
    return hh.astype(np.float64) * 2.0**32 + mid.astype(np.float64) * 2.0**16 + ll.astype(np.float64)


def scaled_product(a: np.ndarray, b: np.ndarray, scale_a, scale_b) -> np.ndarray:
    """The float64 (m, n) array ``sum_k scale_a(i, k) a[i, k] scale_b(k, j) b[k, j]`` for float8
    NumPy ``a`` (m, k) and ``b`` (k, n) and scales checked by :func:`check_scales`. NaN in an
    operand gives NaN where it takes part (as the product of the dequantized values would).

    >>> import ml_dtypes
    >>> a = np.full((1, 256), 57344, ml_dtypes.float8_e5m2)       # products past 2^63 units
    >>> b = np.full((256, 1), 57344, ml_dtypes.float8_e5m2)
    >>> float(scaled_product(a, b, np.float32(1), np.float32(1))[0, 0]) == 256 * 57344.0**2
    True
    """
    m, k = a.shape
    n = b.shape[1]
    bad_a, bad_b = ~np.isfinite(a.astype(np.float32)), ~np.isfinite(b.astype(np.float32))
    if bad_a.any() or bad_b.any():
        # NaN (e4m3fn has no Inf): computed on the dequantized float64 values, which carry it
        return _dequantized(a, scale_a, True, k) @ _dequantized(b, scale_b, False, k)
    ua, ub = _units(a), _units(b)
    ta, tb = FP8_TYPES[a.dtype], FP8_TYPES[b.dtype]
    wide = ta.max_units * tb.max_units * BLOCK >= 2**62
    unit = 2.0 ** (ta.unit_exponent + tb.unit_exponent)
    sa = np.asarray(scale_a, np.float64)
    sb = np.asarray(scale_b, np.float64)
    blocked = sa.ndim == 2 or sb.ndim == 2
    c = np.zeros((m, n), np.float64)
    for blk, k0 in enumerate(range(0, k, BLOCK)):
        s = _block_sums(ua[:, k0:k0 + BLOCK], ub[k0:k0 + BLOCK], wide) * unit
        if blocked:
            row = sa[:, blk:blk + 1] if sa.ndim == 2 else _column(sa, m)
            col = np.repeat(sb[blk], BLOCK)[:n] if sb.ndim == 2 else _row(sb, n)
            s = row * s * col
        c += s
    if not blocked:
        c = _column(sa, m) * c * _row(sb, n)
    return c


def _column(s: np.ndarray, m: int) -> np.ndarray:
    """scale_a of the 'tensor' or 'rows' layout as an (m or 1, 1) column."""
    return s.reshape(1, 1) if s.size == 1 else s.reshape(m, 1)


def _row(s: np.ndarray, n: int) -> np.ndarray:
    """scale_b of the 'tensor' or 'cols' layout as a (1, n or 1) row."""
    return s.reshape(1, 1) if s.size == 1 else s.reshape(1, n)


def _dequantized(x: np.ndarray, scale, is_a: bool, k: int) -> np.ndarray:
    """float64 ``scale ⊙ x`` (the scales spread over the elements they cover)."""
    s = np.asarray(scale, np.float64)
    v = x.astype(np.float64)
    if s.ndim == 2:
        if is_a:        # (m, ceil(k/128)): each covers 128 columns of a row
            return v * np.repeat(s, BLOCK, axis=1)[:, :k]
        full = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)
        return v * full[:k, :v.shape[1]]
    if s.size == 1:
        return v * s.reshape(())
    return v * (s.reshape(-1, 1) if is_a else s.reshape(1, -1))


def _out_dtype(routine: str, dtype) -> np.dtype:
    """``dtype=`` as a NumPy dtype; a PyTorch or JAX dtype of an output type by its name
    (``torch.bfloat16``, as ``torch._scaled_mm``'s ``out_dtype`` takes it).

    >>> _out_dtype("matmul", "bfloat16"), _out_dtype("matmul", np.float16)
    (dtype(bfloat16), dtype('float16'))
    """
    try:
        return np.dtype(arrays.numpy_dtype(dtype))
    except TypeError:
        raise TypeError(f"{routine}: dtype={dtype!r} is not a dtype; a float8 product is "
                        f"{', '.join(OUT_DTYPES)}") from None


#: ``backend=`` of a float8 product: where each value runs it (the others are refused, naming
#: these): 'auto' (None) is the host for NumPy arrays and, for GPU arrays, cuBLASLt where it
#: takes the case, else our kernels (pyblasgemm.planner.fp8.choose_route)
BACKENDS = {"auto": "the host for NumPy arrays, cuBLASLt or our kernels for CuPy arrays / CUDA tensors",
            "host": "NumPy arrays", "tensorcore": "CuPy arrays / CUDA tensors (sm_89+)",
            "cublas": "CuPy arrays / CUDA tensors on cuBLASLt's FP8 GEMM (sm_89+)"}


def scaled_matmul(routine: str, a, b, out, dtype, bias, activation, preactivation_out, scale_a,
                  scale_b, backend=None, names=None, alpha=1.0, beta=0.0, stream=None, invariant=False):
    """The float8 route of :func:`pyblasgemm.matmul` / :func:`pyblasgemm.gemm` with scales:
    ``out = act(alpha·scaled_product + beta·out + bias)`` for 2-D float8 ``a`` (m x k) and
    ``b`` (k x n) (op() already applied; ``beta`` reads ``out`` only when it is not 0), every
    argument checked before any work. NumPy arrays: the host computes it exactly
    (:func:`scaled_product`). CuPy arrays (CUDA tensors and JAX GPU arrays arrive as CuPy views
    through the array door): our mma.sync kernel's float8 kinds on sm_89+, the scales read on
    the device (:mod:`pyblasgemm.kernels.fp8`: per-tensor and per-row / per-column scales in
    the fused store, block scales in the mainloop's per-128-k promotion), or cuBLASLt's FP8 GEMM
    where it takes the case (:func:`pyblasgemm.planner.fp8.choose_route`). ``backend``: None /
    'auto', 'host' (NumPy arrays), 'tensorcore' (GPU arrays, our kernels) or 'cublas' (GPU
    arrays, cuBLASLt). ``stream``: the GPU route's stream (a raw handle or a stream object;
    None: CuPy's current stream). ``invariant`` (resolved: a bool): the host's product is
    batch-invariant (each element its own exact block sums); GPU arrays refuse it, before any
    work (their route and tile are chosen per shape).

    >>> import ml_dtypes
    >>> a = np.full((2, 3), 2, ml_dtypes.float8_e4m3fn); b = np.ones((3, 2), ml_dtypes.float8_e5m2)
    >>> scaled_matmul("gemm", a, b, None, np.float16, None, "relu", None, np.float32(0.5),
    ...               np.float32(-1), alpha=2.0)
    array([[0., 0.],
           [0., 0.]], dtype=float16)
    >>> scaled_matmul("gemm", a, b, None, None, None, None, None, np.float32(1), np.float32(1),
    ...               backend="cublas")
    Traceback (most recent call last):
        ...
    ValueError: gemm: backend='cublas' runs float8 products on CuPy arrays / CUDA tensors on cuBLASLt's FP8 GEMM (sm_89+), but the operands are NumPy arrays
    """
    r = routine
    for name, x in (("a", a), ("b", b)):
        if not is_fp8(x.dtype) or x.ndim != 2:
            raise TypeError(f"{r}: a float8 product takes 2-D float8_e4m3fn / float8_e5m2 a and b "
                            f"(either type each); {name} is {x.ndim}-D {dtype_text(x.dtype)}")
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"{r}: a is {m} x {k} but b is {k2} x {n}; the inner dimensions must agree")
    want = _out_dtype(r, dtype) if dtype is not None else (out.dtype if out is not None else np.dtype(np.float32))
    if want.name not in OUT_DTYPES:
        raise TypeError(f"{r}: a float8 product is {', '.join(OUT_DTYPES)}, not {dtype_text(want)}")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != want):
        raise ValueError(f"{r}: out has shape {tuple(out.shape)} and dtype {dtype_text(out.dtype)}; "
                         f"the result is ({m}, {n}) {want.name}")
    xp_name = _arrays.array_module_name(a)
    if _arrays.array_module_name(b) != xp_name:
        raise TypeError(f"{r}: a and b must be arrays of one kind, got {type(a).__name__} and "
                        f"{type(b).__name__}")
    if out is not None and _arrays.array_module_name(out) != xp_name:
        raise TypeError(f"{r}: out must be an array of the operands' kind ({xp_name}), not "
                        f"{type(out).__name__}")
    epi = check_epilogue(r, (m, n), (m, n), want, xp_name, bias, activation, preactivation_out,
                         None, None, np.float32, names)
    layouts = check_scales(r, scale_a, scale_b, m, n, k, names)
    for key, x in (("scale_a", scale_a), ("scale_b", scale_b)):
        if _arrays.array_module_name(x) not in (xp_name, None) or (
                xp_name == "numpy" and not isinstance(x, (np.ndarray, np.generic))):
            raise TypeError(f"{r}: {key} must be an array of the operands' kind ({xp_name})")
    if backend not in (None, *BACKENDS):
        raise ValueError(f"{r}: backend={backend!r} does not run float8 products; use "
                         + ", ".join(f"{w!r} ({where})" for w, where in BACKENDS.items()))
    if backend not in (None, "auto") and (backend == "host") != (xp_name == "numpy"):
        raise ValueError(f"{r}: backend={backend!r} runs float8 products on {BACKENDS[backend]}, but "
                         f"the operands are {'NumPy' if xp_name == 'numpy' else 'CuPy'} arrays")
    if xp_name != "numpy":
        if invariant:
            raise NotImplementedError(
                f"{r}: invariant=True is not available for float8 products on the GPU (cuBLASLt or our "
                f"kernels are chosen per shape); use NumPy arrays (the host's products are exact and "
                f"invariant) or invariant=False")
        return _on_gpu(r, a, b, out, want, epi, layouts, bias, preactivation_out, scale_a, scale_b,
                       alpha, beta, stream, backend)
    result = out if out is not None else np.empty((m, n), want)
    t = scaled_product(a, b, scale_a, scale_b)
    if alpha != 1:
        t = t * float(alpha)
    if beta != 0 and out is not None:
        t = t + float(beta) * out.astype(np.float64)
    return run_unfused(epi, "numpy", t, None, None, None, bias, None, None, preactivation_out, result)


def _on_gpu(r, a, b, out, want, epi, layouts, bias, pre, scale_a, scale_b, alpha, beta, stream, backend=None):
    """The GPU route, the degenerate shapes answered here: the arrays arranged for the kernels
    (:func:`pyblasgemm.kernels.fp8.arrange`), the product described
    (:func:`pyblasgemm.desc.describe_fp8`), planned (:func:`pyblasgemm.planner.plan_for`, memoized)
    and run (:func:`pyblasgemm.execute.execute_fp8`). A product that ran as one launch on the
    caller's memory (operands, result, scales and bias read and written in place) is left for
    :func:`record`."""
    _last.call = None
    gpu.check_device(r)
    xp = _arrays.xp_of("cupy")
    m, k = a.shape
    n = b.shape[1]
    sptr = streams.handle(stream)
    with streams.on(sptr):
        result = out if out is not None else xp.empty((m, n), want)
        if m == 0 or n == 0:
            return result
        if k == 0:      # an empty sum: act(beta·out + bias), the pass on the device
            t = xp.zeros((m, n), np.float32)
            if beta != 0 and out is not None:
                t += np.float32(beta) * out.astype(np.float32)
            return run_unfused(epi, "cupy", t, None, None, None, bias, None, None, pre, result)
        beta = beta if out is not None else 0.0
        held = gpu.arrange(xp, a, b, result, pre, beta)
        c, p = held.c, held.pre
        vbias = None if bias is None else xp.ascontiguousarray(bias.reshape(-1)).astype(result.dtype, copy=False)
        desc = describe_fp8(r, a.dtype, b.dtype, held.la, held.lb, held.target, m, n, k, held.ldc, layouts,
                            result.dtype, None if epi.activation is None else epi.activation.name, epi.bias_axis,
                            p is not None, "cupy", _arrays.current_device(),
                            (held.a.data.ptr, held.b.data.ptr, c.data.ptr), alpha, beta,
                            bias_align=0 if vbias is None else alignment(vbias.data.ptr),
                            pre_align=0 if p is None else alignment(p.data.ptr))
        route, launch = execute_fp8(desc, plan_for(desc, backend or "auto"), held.a, held.b, c, vbias, p, scale_a,
                                    scale_b, streams.current() if sptr is None else sptr)
        if c is not result:
            result[...] = c
        if p is not pre:
            pre[...] = p
    note_route(route)
    if launch is not None and held.a is a and held.b is b and c is result and p is pre and gpu.in_place(bias, vbias):
        spans = (calls.span_bytes(a), calls.span_bytes(b), calls.span_bytes(result))
        if None not in spans:
            _last.call = Fp8Call(launch, desc.swap, route, *spans, False, None, None, None, desc.device)
    return result


# ------------------------------------------------------------------------------------------
# The repeated call: its recorded launch on new pointers (pyblasgemm.calls)
# ------------------------------------------------------------------------------------------

#: the float8 product this thread ran last as one launch on the caller's memory (or None)
_last = threading.local()


class Fp8Call(NamedTuple):
    """A float8 product recorded under its call signature (:func:`record`): the launch and what
    the key cannot prove. The key (:func:`pyblasgemm.calls.key` of a, b, out and the extras
    scale_a, scale_b, bias) holds every fact the full path decided by: dtypes, shapes (so the
    scale layouts), strides (so the operand layouts, the result's orientation and whether a
    scale or the bias was copied), devices, alignment classes, and the words (``dtype=``,
    ``activation=``, ``backend=``, the kernel family rule)."""

    launch: object          # the bound launch (execute.execute_fp8's, in the kernel's order)
    swap: bool              # run as c^T = b^T a^T: b and scale_b are the kernel's first
    route: object           # what last_route() says (the first call's)
    a_bytes: int            # bytes each array spans (an out= that meets a or b: the full path)
    b_bytes: int
    c_bytes: int
    torch: bool             # the caller's arrays are torch tensors (else CuPy arrays)
    shape: tuple | None     # a fresh result's shape, strides (torch) and dtype; None with out=
    strides: tuple | None
    dtype: object
    device: int = 0         # the device the launch is bound on (the current one when it ran)


def last_call():
    """The :class:`Fp8Call` of this thread's last GPU float8 product that ran (or replayed) as
    one launch on the caller's memory, or None (it copied an operand, a scale or the bias, or
    computed into a temporary: then no replay may stand for it)."""
    return getattr(_last, "call", None)


def forget_last() -> None:
    """Forget this thread's last one-launch product (before a converting call, so that a call
    that ran otherwise never records the launch of the call before it)."""
    _last.call = None


def record(key, out, result) -> None:
    """Store this thread's last one-launch float8 product (:func:`_on_gpu` or :func:`replay`
    left it) under
    ``key`` (:func:`replay`'s second answer), for a result ``result`` in the caller's framework
    (a CuPy array or a torch tensor: its shape, strides and dtype are what a replay allocates)
    or into the given ``out``. Nothing for a key of None, a call that copied or used a
    temporary, a torch result that is not contiguous; nothing under
    ``PYBLASGEMM_NO_PLAN_CACHE=1`` (:func:`pyblasgemm.calls.put`)."""
    ran = getattr(_last, "call", None)
    if key is None or ran is None:
        return
    on_torch = type(result) is not calls.cupy_type()
    if out is not None:
        ran = ran._replace(torch=on_torch, shape=None, strides=None, dtype=None)
    elif on_torch:
        if not result.is_contiguous():
            return
        ran = ran._replace(torch=True, shape=tuple(result.shape), strides=result.stride(), dtype=result.dtype)
    else:
        if not result.flags.c_contiguous:
            return
        ran = ran._replace(torch=False, shape=result.shape, strides=None, dtype=result.dtype)
    calls.put(key, ran, refers_to=ran.launch)


_TORCH_FP8: list = []


def torch_fp8_dtypes() -> frozenset:
    """PyTorch's float8 operand dtypes (``torch.float8_e4m3fn``, ``torch.float8_e5m2``), once
    PyTorch is imported (empty before: never imports it).

    >>> torch_fp8_dtypes() == frozenset() or len(torch_fp8_dtypes()) == 2
    True
    """
    if not _TORCH_FP8:
        torch = sys.modules.get("torch")
        if torch is None:
            return frozenset()
        _TORCH_FP8.append(frozenset(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2")))
    return _TORCH_FP8[0]


#: ``torch.empty_strided``, once a tensor call replayed (PyTorch is imported by then)
_torch_empty: list = []


def replay(words: tuple, a, b, out, bias, scale_a, scale_b, stream, alpha=1.0, beta=0.0):
    """``(result, key)``: a repeated float8 product ``act(alpha·(scale_a ⊙ a) @ (scale_b ⊙ b) +
    beta·out + bias)`` on CuPy arrays or CUDA tensors run as its recorded launch on these
    pointers (the scales' and the bias' too: a scale rewritten on the device, or another scale
    array of the same layout, is read as it is now) on the caller's stream (PyTorch's current
    stream for tensors, CuPy's for CuPy arrays; ``stream=`` when given), into a result allocated
    by the caller's framework (``torch.empty_strided``: PyTorch's caching allocator) or ``out``.
    ``result`` None: no record, or what the key cannot prove fails (a fresh result's 16-byte
    alignment, an ``out`` that meets a or b); the caller then takes the full path and records
    under ``key`` (None: arrays :func:`pyblasgemm.calls.key` does not key, e.g. a NumPy
    scale). ``words``: the form's part of the key (its name, keywords as given, the kernel
    family rule). ``alpha`` / ``beta``: the form's values, checked by the caller (matmul's
    fixed 1 and 0; beta reaches the launch only with ``out``).

    One key build (:func:`pyblasgemm.calls.key`, every form's, with the scales and the bias as
    its extra arrays), every pointer read once (by the key builder), one dict lookup
    (:func:`pyblasgemm.calls.peek`), the result the only allocation, the launch called
    positionally (``launch(pm, pn, pc, alpha, beta, stream, bias, pre, scale_m, scale_n)``,
    b's pointers first when the product ran as c^T = b^T a^T).

    >>> import numpy as np
    >>> a = np.ones((2, 3), np.float32)                 # NumPy arrays: never recorded (the host route)
    >>> replay(("doc",), a, a.T, None, None, a[:, 0], a[0], None)[0] is None
    True
    """
    sig = calls.key(words, a, b, out, (scale_a, scale_b, bias))
    if sig is None:
        return None, None
    k, pa, pb, pc, psa, psb, pbias = sig
    hit = calls.peek(k)
    if hit is None:
        return None, k
    if hit.torch:
        if hit.device != calls._current_device():
            return None, k  # bound on another device (a CuPy key holds the current device itself)
        dev = k[calls.TORCH_DEVICE]     # (a's ordinal, as the key read it)
        if out is None:
            if not _torch_empty:
                _torch_empty.append(sys.modules["torch"].empty_strided)
            c = _torch_empty[0](hit.shape, hit.strides, dtype=hit.dtype, device=dev)
            pc = c.data_ptr()
        else:
            c = out
        sptr = arrays.torch_raw_stream(dev) if stream is None else streams.handle(stream)
    else:
        if out is None:
            # the ndarray constructor: C-ordered from CuPy's pool, as the full path's xp.empty
            c = type(a)(hit.shape, hit.dtype)
            pc = c.data.ptr
        else:
            c = out
        sptr = streams.current() if stream is None else streams.handle(stream)
        _last.call = hit    # a replayed product counts as run (the torch door records it too)
    if out is None:
        if pc & 15:
            return None, k  # the full path: a temporary (the kernel stores whole 16-byte rows)
        beta = 0.0
    elif calls.overlaps(hit, pa, pb, pc):
        return None, k      # out meets a or b: the full path computes via a temporary
    if hit.swap:
        hit.launch(pb, pa, pc, alpha, beta, sptr, pbias, 0, psb, psa)
    else:
        hit.launch(pa, pb, pc, alpha, beta, sptr, pbias, 0, psa, psb)
    note_route(hit.route)
    return c, k
