"""Turning strided 2-D views into BLAS operands (trans flag + leading dimension) without copies.

A logical r x c matrix whose rows are unit-stride apart is column-major ('N', ld = column
stride); one whose columns are unit-stride apart is row-major, i.e. the column-major storage of
its transpose ('T', ld = row stride). Anything else (negative, zero or non-unit strides in both
dimensions) has no BLAS description and is copied by the caller.
"""
from __future__ import annotations

import numpy as np

from . import _arrays


def blas_layouts(shape, strides, itemsize) -> list:
    """Every BLAS description, ('N', ld) and/or ('T', ld), of an r x c matrix with byte strides.

    Both exist when a dimension is 1 (a single row or column has no second stride to honour).
    """
    r, c = shape
    s0, s1 = strides
    if s0 % itemsize or s1 % itemsize:
        return []
    s0, s1 = s0 // itemsize, s1 // itemsize
    found = []
    if (s0 == 1 or r <= 1) and (c <= 1 or s1 >= max(1, r)):
        found.append(("N", s1 if c > 1 else max(1, r)))
    if (s1 == 1 or c <= 1) and (r <= 1 or s0 >= max(1, c)):
        found.append(("T", s0 if r > 1 else max(1, c)))
    return found


def blas_layout(shape, strides, itemsize):
    """The preferred BLAS description (column-major first), or None."""
    found = blas_layouts(shape, strides, itemsize)
    return found[0] if found else None


# op as (transpose bit, conjugate bit)
_BITS = {"N": (0, 0), "T": (1, 0), "C": (1, 1)}


def compose_op(user_op: str, stored_transposed: bool, problem_transposed: bool):
    """The BLAS flag applying ``user_op`` to an operand, or None if BLAS cannot say it.

    ``stored_transposed``: the memory holds the operand's transpose (row-major data).
    ``problem_transposed``: we compute Cᵀ = op(B)ᵀ op(A)ᵀ, so the operand is used transposed.
    Conjugation without transposition has no BLAS flag: the caller copies instead.
    """
    t, conj = _BITS[user_op]
    t ^= stored_transposed ^ problem_transposed
    if conj:
        return "C" if t else None
    return "T" if t else "N"


def byte_extent(x):
    """[lo, hi) byte addresses spanned by a strided array (empty arrays span nothing)."""
    lo = hi = _arrays.data_ptr(x)
    if x.size == 0:
        return lo, lo
    for dim, stride in zip(x.shape, x.strides):
        step = stride * (dim - 1)
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + x.dtype.itemsize


#: ``numpy.may_share_memory`` without its ``__array_function__`` dispatch (NumPy's function, as
#: the dispatcher keeps it in ``__wrapped__``), for exact ``numpy.ndarray`` arguments only (a
#: subclass or duck array could override the function): ~0.19 µs against ~0.35 µs a call at 4x4
#: on the 2-core dev host, NumPy 2.4 (the BLAS and SciPy forms' repeated call make two)
may_share_ndarrays = getattr(np.may_share_memory, "__wrapped__", np.may_share_memory)


#: the work bound of NumPy's exact overlap solver (``numpy.shares_memory``'s ``max_work``):
#: strided 2-D and 3-D views are decided in a few steps; past it, overlap is assumed
OVERLAP_MAX_WORK = 10_000


def may_overlap(x, y) -> bool:
    """Whether x and y may share an element: False when their byte extents are disjoint; when
    the extents intersect, NumPy arrays are decided exactly (two column blocks of one matrix
    interleave without sharing a byte: NumPy and CuPy compute such an ``out``, and so do we,
    in place); other arrays, and problems past :data:`OVERLAP_MAX_WORK`, count as overlapping.

    >>> import numpy as np
    >>> buf = np.zeros((4, 4))
    >>> may_overlap(buf[:, :2], buf[:, 2:]), may_overlap(buf[:, :3], buf[:, 2:])
    (False, True)
    """
    if x.size == 0 or y.size == 0:
        return False
    x0, x1 = byte_extent(x)
    y0, y1 = byte_extent(y)
    if not (x0 < y1 and y0 < x1):
        return False
    if type(x) is np.ndarray and type(y) is np.ndarray:
        try:
            return bool(np.shares_memory(x, y, max_work=OVERLAP_MAX_WORK))
        except np.exceptions.TooHardError:
            return True
    return True
