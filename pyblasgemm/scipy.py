"""``scipy.linalg.blas``'s GEMM signatures, so that SciPy code ports by changing the import.

``sgemm(alpha, a, b, beta=0.0, c=None, trans_a=0, trans_b=0, overwrite_c=0)`` and its ``d``,
``c``, ``z`` siblings behave as SciPy's: ``a`` and ``b`` are converted to the routine's type
(any 2-D array-like, any memory order), ``trans_*`` is 0 (``op(x) = x``), 1 (``xᵀ``) or 2 (``xᴴ``),
``c`` (shape m x n) is read only when ``beta != 0``, and the result is a new Fortran-ordered
array unless ``overwrite_c`` is true and ``c`` is already a Fortran-ordered array of the
routine's type, which is then updated in place and returned. Without ``c`` the result is
``alpha * op(a) @ op(b)`` (SciPy ignores ``beta`` then, and so does this).

Beyond SciPy: the same calls on CuPy arrays (on the GPU, where the planner picks our kernels or
cuBLAS), keyword-only ``backend=`` and ``compute=`` as in :func:`pyblasgemm.sgemm`, and the
types SciPy lacks: ``hgemm`` (float16), ``bgemm`` (bfloat16) and ``igemm`` (int8 operands, an
int32 result).

Example
-------
>>> import numpy as np
>>> from pyblasgemm import scipy as blas              # for: from scipy.linalg import blas
>>> a = np.array([[1., 2.], [3., 4.]])
>>> blas.sgemm(1.0, a, a, trans_b=1)
array([[ 5., 11.],
       [11., 25.]], dtype=float32)
>>> c = np.ones((2, 2), dtype=np.float32, order="F")
>>> blas.sgemm(2.0, a, a, beta=1.0, c=c, overwrite_c=1) is c
True
"""
from __future__ import annotations

import numpy as np

from . import _arrays
from ._types import TYPE_ROWS
from .gemm import gemm as _gemm

__all__ = ["sgemm", "dgemm", "cgemm", "zgemm", "hgemm", "bgemm", "igemm"]

#: trans_* values SciPy takes: 0 'N', 1 'T', 2 'C' (cuBLAS's operation values too)
_TRANS = {0: "N", 1: "T", 2: "C"}


def _trans(routine: str, name: str, value) -> str:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or int(value) not in _TRANS:
        raise ValueError(f"{routine}: {name}={value!r} must be 0 (op(x) = x), 1 (transpose) or "
                         f"2 (conjugate transpose)")
    return _TRANS[int(value)]


def _matrix(routine: str, name: str, x, xp, dtype):
    x = xp.asarray(x, dtype=dtype)
    if x.ndim != 2:
        raise ValueError(f"{routine}: {name} must be 2-D (got {x.ndim}-D, shape {x.shape})")
    return x


def _make(prefix: str):
    row = TYPE_ROWS[prefix]
    routine = prefix + "gemm"

    def xgemm(alpha, a, b, beta=0.0, c=None, trans_a=0, trans_b=0, overwrite_c=0, *,
              backend=None, compute=None):
        ta, tb = _trans(routine, "trans_a", trans_a), _trans(routine, "trans_b", trans_b)
        xp = _arrays.xp_of("cupy" if _arrays.is_cupy_array(a) else "numpy")
        a = _matrix(routine, "a", a, xp, row.ab_dtype)
        b = _matrix(routine, "b", b, xp, row.ab_dtype)
        m, k = a.shape if ta == "N" else a.shape[::-1]
        kb, n = b.shape if tb == "N" else b.shape[::-1]
        if kb != k:
            raise ValueError(f"{routine}: op(a) is {m} x {k} but op(b) is {kb} x {n}: their inner "
                             f"dimensions differ (trans_a={trans_a}, trans_b={trans_b})")
        if c is None:
            out, beta = xp.zeros((m, n), dtype=row.c_dtype, order="F"), 0
        else:
            in_place = (bool(overwrite_c) and isinstance(c, type(a)) and c.dtype == row.c_dtype
                        and c.flags.f_contiguous)
            out = c if in_place else xp.array(c, dtype=row.c_dtype, order="F", copy=True)
            if out.shape != (m, n):
                raise ValueError(f"{routine}: c has shape {out.shape}, the product is {m} x {n}")
        _gemm(ta, tb, a, b, out=out, alpha=alpha, beta=beta, backend=backend, compute=compute)
        return out

    xgemm.__name__ = xgemm.__qualname__ = routine
    kind = row.ab_dtype.name + (f" ({row.c_dtype.name} result)" if row.c_dtype != row.ab_dtype else "")
    xgemm.__doc__ = (f"c = {routine}(alpha, a, b, beta=0.0, c=None, trans_a=0, trans_b=0, "
                     f"overwrite_c=0): ``scipy.linalg.blas``'s GEMM signature for {kind} "
                     f"(see :mod:`pyblasgemm.scipy`).")
    return xgemm


sgemm = _make("s")
dgemm = _make("d")
cgemm = _make("c")
zgemm = _make("z")
hgemm = _make("h")
bgemm = _make("b")
igemm = _make("i")
