"""Grouped float8 products with scales: :func:`pyblasgemm.grouped_matmul` on
``float8_e4m3fn`` / ``float8_e5m2`` operands, in its three forms.

Every argument of every group is checked before any work. Each group's result is
:func:`pyblasgemm.fp8.scaled_matmul`'s product (exact block sums on the host; on the GPU float32
sums of the raw products, the scales applied in the fused store). The scales follow the
float8 layouts (:mod:`pyblasgemm.fp8`) per group, and in the expert and masked forms they are
one array for all groups, as ``torch._scaled_grouped_mm`` takes them:

==============  ========================================  ========================================
form            ``scale_a``                               ``scale_b``
==============  ========================================  ========================================
list            per problem: () / (1,) or (m_g,)          per problem: () / (1,) or (n_g,)
                (or its 1 x 128 blocks)                   (or its 128 x 128 blocks)
experts         () / (1,) or (M,): one per token          () / (1,), (groups,): one per expert,
                                                          or (groups, n): one per expert column
masked          () / (1,) or (groups, max_m)              as the expert form
==============  ========================================  ========================================

On CuPy arrays (and CUDA tensors through the array door) the expert form and the masked layout
run as one launch of the grouped kernel's float8 kinds where the plan makes it one (the int8
kind's operand path, the dequantizing store; a scale given once or per group is broadcast into a
vector on the device): sizes on the GPU are read there, so such a call is CUDA-graph safe with
changing sizes. Elsewhere (the list form, the host backend, a layout off the kernel, the
planner's loop, ``invariant=True``) the groups run as separate products and GPU sizes are read
back first.

>>> import numpy as np, ml_dtypes, pyblasgemm
>>> a = np.array([[1, 2], [3, 4], [0.5, -1]], ml_dtypes.float8_e4m3fn)     # 1 token, then 2
>>> b = np.stack([np.eye(2), 2 * np.eye(2)]).astype(ml_dtypes.float8_e4m3fn)
>>> pyblasgemm.grouped_matmul(a, b, offsets=[1, 3], scale_a=np.float32(0.5),
...                           scale_b=np.array([1, 4], np.float32))
array([[ 0.5,  1. ],
       [12. , 16. ],
       [ 2. , -4. ]], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from . import _arrays
from .desc import check_epilogue
from .fp8 import OUT_DTYPES, check_scales, is_fp8, scaled_matmul
from .fp8 import _out_dtype as fp8_out_dtype

__all__ = ["is_fp8_call", "check_stacked", "vector_scales", "grouped_fp8"]

_R = "grouped_matmul"


def is_fp8_call(a, b) -> bool:
    """Whether a grouped call's operands (arrays, or the list form's lists) are float8."""
    firsts = [x[0] if isinstance(x, (list, tuple)) and x else x for x in (a, b)]
    return any(is_fp8(getattr(x, "dtype", None)) for x in firsts)


def _out_dtype(dtype, out) -> np.dtype:
    """The result type: ``dtype``, else ``out``'s, else float32; one of :data:`OUT_DTYPES`."""
    want = np.dtype(np.float32)
    if dtype is not None:
        want = fp8_out_dtype(_R, dtype)
    elif out is not None and not isinstance(out, (list, tuple)):
        want = np.dtype(out.dtype)
    if want.name not in OUT_DTYPES:
        raise TypeError(f"{_R}: a float8 product is {', '.join(OUT_DTYPES)}, not {want.name}")
    return want


def _check_pair(x, y, at: str, xp_name: str | None) -> str:
    """float8 operands of one array kind (or the error naming them); their kind's name."""
    for name, v in ((f"a{at}", x), (f"b{at}", y)):
        if not is_fp8(getattr(v, "dtype", None)):
            raise TypeError(f"{_R}: float8 groups take float8_e4m3fn / float8_e5m2 operands (either "
                            f"type each); {name} is {getattr(v, 'dtype', type(v).__name__)}")
    kind = _arrays.array_module_name(x)
    if kind is None or _arrays.array_module_name(y) != kind or (xp_name is not None and kind != xp_name):
        raise TypeError(f"{_R}: a{at} and b{at} must be NumPy arrays or CuPy arrays, all of one kind")
    return kind


def _check_target(target, shape, want, xp_name, name) -> None:
    if _arrays.array_module_name(target) != xp_name:
        raise TypeError(f"{_R}: {name} must be a {xp_name} array, not {type(target).__name__}")
    if tuple(target.shape) != shape or target.dtype != want:
        raise ValueError(f"{_R}: {name} has shape {tuple(target.shape)} and dtype {target.dtype.name}; "
                         f"the result is {shape} {want.name}")
    if not _arrays.is_writeable(target):
        raise ValueError(f"{_R}: {name} is read-only")


def _expert_scale_b(scale_b, groups: int, n: int):
    """The expert and masked forms' ``scale_b`` as a function of the group (a 0-d view, a
    row, or the one scale), checked: () / (1,), (groups,) or (groups, n) float32."""
    shape = tuple(getattr(scale_b, "shape", (None,)))
    if shape in ((), (1,)):
        return lambda g: scale_b
    if shape in ((groups,), (groups, n)):
        return lambda g: scale_b[g]
    raise ValueError(f"{_R}: scale_b has shape {shape}; with float8 groups it must be () or (1,) (one "
                     f"scale), ({groups},) (one per group) or ({groups}, {n}) (one per group and column)")


def check_stacked(a, b, masked: bool, out, want, bias, scale_a, scale_b):
    """The whole-call checks of the expert form (``masked`` False: ``a`` (M, k)) or the masked
    layout (``a`` (groups, max_m, k)), ``b`` (groups, k, n), the result type ``want``:
    ``(out, per_token, scale_b_of)`` (``out`` allocated when None; ``per_token``: ``scale_a``
    has one value per row; ``scale_b_of(g)``: group g's scale_b), or the error naming the
    argument. Every group's slices of arrays that pass are valid scales and vectors."""
    xp_name = _check_pair(a, b, "", None)
    groups, n = b.shape[0], b.shape[2]
    lead = (groups, a.shape[1]) if masked else (a.shape[0],)
    shape = lead + (n,)
    if out is None:
        out = _arrays.xp_of(xp_name).empty(shape, want)
    _check_target(out, shape, want, xp_name, "out")
    sa_shape = tuple(getattr(scale_a, "shape", (None,)))
    if sa_shape not in ((), (1,), lead):
        raise ValueError(f"{_R}: scale_a has shape {sa_shape}; with float8 groups it must be () or (1,) "
                         f"(one scale) or {lead} (one per {'row of each block' if masked else 'token'})")
    scale_b_of = _expert_scale_b(scale_b, groups, n)
    if bias is not None and tuple(getattr(bias, "shape", (None,))) != (groups, n):
        raise ValueError(f"{_R}: bias has shape {tuple(getattr(bias, 'shape', (None,)))}; the "
                         f"{'masked layout' if masked else 'expert form'} needs {(groups, n)}")
    return out, sa_shape == lead, scale_b_of


def vector_scales(a, b, masked: bool, scale_a, scale_b):
    """``(scale_a, scale_b)`` in the grouped kernel's layout: one float32 per row of ``a``
    (``(M,)``, or ``(groups, max_m)`` masked) and one per group and column (``(groups, n)``),
    contiguous; a scale given once or per group is broadcast into a new array on the device (no
    value read on the host)."""
    xp = _arrays.xp_of(_arrays.array_module_name(a))
    groups, n = b.shape[0], b.shape[2]
    lead = tuple(a.shape[:2]) if masked else (a.shape[0],)
    sa = scale_a if tuple(scale_a.shape) == lead else xp.broadcast_to(scale_a.reshape(()), lead).copy()
    by_group = tuple(scale_b.shape) == (groups,)
    sb = scale_b if tuple(scale_b.shape) == (groups, n) else xp.broadcast_to(
        scale_b.reshape((groups, 1) if by_group else ()), (groups, n)).copy()
    return xp.ascontiguousarray(sa), xp.ascontiguousarray(sb)


def grouped_fp8(a, b, ends=None, counts=None, out=None, dtype=None, bias=None, activation=None,
                scale_a=None, scale_b=None, backend=None, stream=None, invariant=False):
    """:func:`pyblasgemm.grouped_matmul` for float8 operands (see the module docstring): the
    list form (``ends`` and ``counts`` None), the expert form (``ends``: the host end offsets)
    or the masked layout (``counts``: the host valid row counts). Every group's arguments are
    checked before the first product runs; the result (a list, or the form's array)."""
    if invariant and _arrays.array_module_name(a[0] if isinstance(a, (list, tuple)) and a else a) != "numpy":
        # (the host's float8 product is exact block sums, each element on its own: invariant)
        raise NotImplementedError(f"{_R}: invariant=True is not available for float8 groups on the GPU "
                                  f"(their kernels are chosen per shape); use NumPy arrays (exact) or "
                                  f"invariant=False")
    if scale_a is None or scale_b is None:
        raise ValueError(f"{_R}: float8 groups need both scale_a and scale_b (pass 1.0 for an unscaled "
                         f"operand); got only {'scale_a' if scale_b is None else 'scale_b'}"
                         if scale_a is not None or scale_b is not None else
                         f"{_R}: float8 groups need scale_a and scale_b (pass 1.0 for an unscaled operand)")
    want = _out_dtype(dtype, out)
    jobs = []          # (x, y, target, bias, scale_a, scale_b, names) per group with rows
    if ends is None and counts is None:
        xp_name = None
        results = []
        for g, (x, y) in enumerate(zip(a, b)):
            at = f"[{g}]"
            xp_name = _check_pair(x, y, at, xp_name)
            if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0]:
                raise ValueError(f"{_R}: problem {g}: a is {x.shape} and b is {y.shape}")
            shape = (x.shape[0], y.shape[1])
            target = out[g] if out is not None else _arrays.xp_of(xp_name).empty(shape, want)
            if out is not None:
                _check_target(target, shape, want, xp_name, f"out{at}")
            names = {"bias": f"bias{at}", "scale_a": f"scale_a{at}", "scale_b": f"scale_b{at}"}
            sa, sb, bg = scale_a[g], scale_b[g], None if bias is None else bias[g]
            check_scales(_R, sa, sb, shape[0], shape[1], x.shape[1], names)
            check_epilogue(_R, shape, shape, want, xp_name, bg, activation, None, None, None, np.float32, names)
            results.append(target)
            jobs.append((x, y, target, bg, sa, sb, names))
        _run(jobs, activation, backend, stream)
        return results
    out, per_token, scale_b_of = check_stacked(a, b, counts is not None, out, want, bias, scale_a, scale_b)
    groups, n, k = b.shape[0], b.shape[2], b.shape[1]
    masked = counts is not None
    xp_name = _arrays.array_module_name(a)
    start = 0
    for g in range(groups):
        if masked:
            rows = counts[g]
            x, target, sa = a[g, :rows], out[g, :rows], scale_a[g, :rows] if per_token else scale_a
        else:
            rows = ends[g] - start
            x, target = a[start:ends[g]], out[start:ends[g]]
            sa = scale_a[start:ends[g]] if per_token else scale_a
            start = ends[g]
        at = f" (group {g})"
        names = {"bias": "bias", "scale_a": "scale_a", "scale_b": "scale_b" + at}
        bg, sb = None if bias is None else bias[g], scale_b_of(g)
        check_scales(_R, sa, sb, rows, n, k, names)
        check_epilogue(_R, (rows, n), (rows, n), want, xp_name, bg, activation, None, None, None,
                       np.float32, names)
        if rows:
            jobs.append((x, b[g], target, bg, sa, sb, names))
    _run(jobs, activation, backend, stream)
    return out


def _run(jobs, activation, backend, stream) -> None:
    """Each checked group's product into its target, in order."""
    for x, y, target, bg, sa, sb, names in jobs:
        scaled_matmul(_R, x, y, target, None, bg, activation, None, sa, sb, backend, names, stream=stream)
