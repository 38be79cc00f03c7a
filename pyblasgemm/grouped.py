"""Grouped GEMM: many independent products in one call.

Two forms, as mixture-of-experts layers and batched solvers need them:

* **a list of problems** of different sizes: ``grouped_matmul([a0, a1, ...], [b0, b1, ...])``
  returns ``[a0 @ b0, a1 @ b1, ...]``;
* **the mixture-of-experts form**: the tokens of all experts as the rows of one ``a``
  (``(M, k)``, expert after expert), one weight per expert in ``b`` (``(groups, k, n)``) and
  ``offsets``, each expert's end row (int, non-decreasing, the last one ``M``: the convention
  of ``torch._grouped_mm``'s ``offs``); rows ``offsets[g-1]:offsets[g]`` are multiplied by
  ``b[g]``, and an expert may have no rows.

Every problem is :func:`pyblasgemm.gemm`'s product and takes its epilogue keywords (one
``bias`` per group: a list in the list form, a ``(groups, n)`` array in the expert form).
Types: float16 and bfloat16 (16-bit results, as ``torch._grouped_mm``), float32, float64, and
int8 (an int32 result, or dequantized with ``scale_a`` / ``scale_b`` to float).

How it runs today: one planned GEMM per non-empty group, in order, on the arrays' device
(nothing is copied). A single persistent launch walking a device-side problem table is the
next step; the results will not change.

Example
-------
>>> import numpy as np, pyblasgemm
>>> a = np.arange(8, dtype=np.float32).reshape(4, 2)            # 4 tokens: 1 for expert 0, 3 for 1
>>> b = np.stack([np.eye(2, dtype=np.float32), 2 * np.eye(2, dtype=np.float32)])
>>> pyblasgemm.grouped_matmul(a, b, offsets=[1, 4])
array([[ 0.,  1.],
       [ 4.,  6.],
       [ 8., 10.],
       [12., 14.]], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from . import _arrays

__all__ = ["grouped_matmul"]


def _check_offsets(offsets, rows: int, groups: int) -> list[int]:
    """The end offsets as Python ints, or a ValueError naming the first bad one."""
    try:
        ends = [int(v) for v in (offsets.tolist() if hasattr(offsets, "tolist") else offsets)]
    except (TypeError, ValueError):
        raise TypeError(f"grouped_matmul: offsets must be a sequence of ints, got {offsets!r}") from None
    if len(ends) != groups:
        raise ValueError(f"grouped_matmul: offsets has {len(ends)} entries; b holds {groups} groups")
    prev = 0
    for g, end in enumerate(ends):
        if end < prev:
            raise ValueError(f"grouped_matmul: offsets[{g}]={end} is below offsets[{g - 1}]={prev} "
                             f"(end rows must not decrease)" if g else
                             f"grouped_matmul: offsets[0]={end} must be >= 0")
        prev = end
    if groups and ends[-1] != rows:
        raise ValueError(f"grouped_matmul: offsets[-1]={ends[-1]} must equal a's row count {rows}")
    return ends


def _result_dtype(a_dtype, dtype, dequant: bool):
    """gemm's result type for these operands (16-bit stay 16-bit, int8 gives int32), float32
    for a dequantized int8 product, or ``dtype`` when given."""
    from ._types import ROW_BY_DTYPE

    if dtype is not None:
        return np.dtype(dtype)
    if dequant:
        return np.dtype(np.float32)
    row = ROW_BY_DTYPE.get(np.dtype(a_dtype))
    if row is None:
        raise TypeError(f"grouped_matmul: dtype {np.dtype(a_dtype).name} is not supported")
    return row.c_dtype


def grouped_matmul(a, b, *, offsets=None, out=None, dtype=None, bias=None, activation=None,
                   scale_a=None, scale_b=None, compute=None, backend=None, stream=None):
    """The products of many independent problems (see the module docstring for both forms).

    Each product is :func:`pyblasgemm.gemm`'s ``'N', 'N'`` product with its epilogue: the
    result has the operands' type (float16 and bfloat16 stay 16-bit, int8 gives int32), or
    float32 (or ``dtype``) for a dequantized int8 product.

    Parameters
    ----------
    a, b : lists of 2-D arrays, or ``a`` (M, k) and ``b`` (groups, k, n) with ``offsets``
    offsets : sequence of int, optional
        Each group's end row in ``a`` (the expert form).
    out : list of arrays, or an (M, n) array in the expert form, optional
    dtype : the result type of a dequantized int8 product (float16, bfloat16, float32)
    bias, activation, scale_a, scale_b, compute, backend, stream
        As for :func:`pyblasgemm.gemm`, per group: ``bias``, ``scale_a``, ``scale_b`` are
        lists in the list form; in the expert form ``bias`` and ``scale_b`` are
        ``(groups, n)`` arrays and ``scale_a`` an ``(M,)`` array (one scale per token).

    Returns
    -------
    list of arrays (list form) or one (M, n) array (expert form)

    Examples
    --------
    >>> import numpy as np, pyblasgemm
    >>> a = [np.ones((2, 3), np.float32), np.ones((1, 2), np.float32)]
    >>> b = [np.ones((3, 4), np.float32), np.full((2, 1), 2, np.float32)]
    >>> [r.shape for r in pyblasgemm.grouped_matmul(a, b)]
    [(2, 4), (1, 1)]
    >>> pyblasgemm.grouped_matmul(a, b)[1]
    array([[4.]], dtype=float32)
    """
    from .gemm import gemm

    kw = dict(activation=activation, compute=compute, backend=backend, stream=stream)
    dequant = scale_a is not None or scale_b is not None
    if offsets is None:
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
            raise TypeError("grouped_matmul: give a and b as lists of 2-D arrays, or a (M, k) a, a "
                            "(groups, k, n) b and offsets=")
        if len(a) != len(b):
            raise ValueError(f"grouped_matmul: a has {len(a)} problems and b {len(b)}")
        per = {"bias": bias, "scale_a": scale_a, "scale_b": scale_b, "out": out}
        for name, v in per.items():
            if v is not None and (not isinstance(v, (list, tuple)) or len(v) != len(a)):
                raise ValueError(f"grouped_matmul: {name} must be a list with one entry per problem "
                                 f"({len(a)})")
        for g, (x, y) in enumerate(zip(a, b)):
            if getattr(x, "ndim", None) != 2 or getattr(y, "ndim", None) != 2:
                raise ValueError(f"grouped_matmul: problem {g}: a and b must be 2-D arrays")
            if x.shape[1] != y.shape[0]:
                raise ValueError(f"grouped_matmul: problem {g}: a is {x.shape} and b is {y.shape}")
        results = []
        for g, (x, y) in enumerate(zip(a, b)):
            xp = _arrays.xp_of(_arrays.array_module_name(x))
            target = out[g] if out is not None else xp.empty((x.shape[0], y.shape[1]),
                                                              _result_dtype(x.dtype, dtype, dequant))
            results.append(gemm("N", "N", x, y, target, **kw,
                                bias=None if bias is None else bias[g],
                                scale_a=None if scale_a is None else scale_a[g],
                                scale_b=None if scale_b is None else scale_b[g]))
        return results
    xp_name = _arrays.array_module_name(a)
    if xp_name is None or _arrays.array_module_name(b) != xp_name:
        raise TypeError("grouped_matmul: the expert form takes a and b as NumPy arrays or CuPy "
                        "arrays (both of one kind)")
    if a.ndim != 2 or b.ndim != 3 or a.shape[1] != b.shape[1]:
        raise ValueError(f"grouped_matmul: the expert form needs a (M, k) and b (groups, k, n); got "
                         f"{a.shape} and {b.shape}")
    groups, n = b.shape[0], b.shape[2]
    ends = _check_offsets(offsets, a.shape[0], groups)
    for name, v, shape in (("bias", bias, (groups, n)), ("scale_b", scale_b, (groups, n)),
                           ("scale_a", scale_a, (a.shape[0],))):
        if v is not None and v.shape != shape:
            raise ValueError(f"grouped_matmul: {name} has shape {v.shape}; the expert form needs {shape}")
    result_dtype = _result_dtype(a.dtype, dtype, dequant)
    xp = _arrays.xp_of(xp_name)
    if out is None:
        out = xp.empty((a.shape[0], n), result_dtype)
    elif out.shape != (a.shape[0], n) or out.dtype != result_dtype:
        raise ValueError(f"grouped_matmul: out has shape {out.shape} and dtype {out.dtype.name}; the "
                         f"result is {(a.shape[0], n)} {result_dtype.name}")
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            gemm("N", "N", a[start:end], b[g], out[start:end], **kw,
                 bias=None if bias is None else bias[g],
                 scale_a=None if scale_a is None else scale_a[start:end],
                 scale_b=None if scale_b is None else scale_b[g])
        start = end
    return out
