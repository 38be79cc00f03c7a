"""Describe a problem without arrays: the ``GemmDesc`` that ``pyblasgemm.plan`` and the CLI plan.

Example::

    >>> from pyblasgemm.planner.problem import make_desc
    >>> d = make_desc(1024, 512, 256, dtype="float16", transa="T")
    >>> (d.prefix, d.compute, d.lda, d.ldc, d.xp)
    ('h', 'fp32', 256, 1024, 'cupy')
"""
from __future__ import annotations

import numpy as np

from .._types import BLAS_ROWS, ROW_BY_DTYPE, TYPE_ROWS, resolve_compute
from ..desc import GemmDesc, check_dim, check_trans, describe
from ..epilogue import EpilogueSpec, check_activation
from ..kinds import ROUTES, base_compute

__all__ = ["make_desc", "DTYPE_ALIASES", "kind_of"]

#: short names accepted for ``dtype`` (besides anything ``numpy.dtype`` understands)
DTYPE_ALIASES = {"f16": "h", "fp16": "h", "half": "h", "float16": "h", "bf16": "b", "bfloat16": "b",
                 "f32": "s", "fp32": "s", "float32": "s", "single": "s", "f64": "d", "fp64": "d",
                 "float64": "d", "double": "d", "i8": "i", "int8": "i", "s8": "i", "c64": "c",
                 "complex64": "c", "c128": "z", "complex128": "z", "tf32": "s", "3xtf32": "s",
                 "f16_out32": "sh", "bf16_out32": "sb"}
for _p in BLAS_ROWS:       # (a float8 pair is described with its scales: desc.describe_fp8)
    DTYPE_ALIASES.setdefault(_p, _p)

_KINDS = {key: r.kernel_kind for key, r in ROUTES.items() if r.kernel_kind is not None}


def kind_of(desc: GemmDesc) -> str | None:
    """Our kernels' kind for ``desc`` ('f16', 'bf16', 's8', 'tf32', '3xtf32', 'f16_out32',
    'bf16_out32') or None."""
    return _KINDS.get((desc.prefix, base_compute(desc.compute)))


def _prefix(dtype) -> str:
    if isinstance(dtype, str) and dtype.lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[dtype.lower()]
    try:
        row = ROW_BY_DTYPE.get(np.dtype(dtype))
    except TypeError:
        row = None
    if row is None:
        raise ValueError(f"dtype={dtype!r} is not a GEMM operand type; use one of float16, "
                         f"bfloat16, float32, float64, int8, complex64, complex128 (or f16, bf16, "
                         f"f32, f64, i8, c64, c128)")
    return row.prefix


def make_desc(m: int, n: int, k: int, dtype="float16", *, compute=None, transa="N", transb="N",
              lda=None, ldb=None, ldc=None, batch: int = 1, stride_a=None, stride_b=None,
              stride_c=None, device: int = 0, align: int = 16, xp: str = "cupy",
              activation=None, bias=None, preactivation: bool = False,
              invariant: bool = False) -> GemmDesc:
    """A validated ``GemmDesc`` for a column-major problem given by sizes only.

    Leading dimensions default to the tight ones, batch strides to packed matrices; ``align``
    is the byte alignment of every pointer (16 for fresh CuPy arrays). ``dtype='tf32'`` or
    ``'3xtf32'`` is float32 with that compute mode. ``activation`` (a name of
    :data:`pyblasgemm.epilogue.ACTIVATIONS`), ``bias`` (``'m'``: one value per row of C,
    ``'n'``: per column) and ``preactivation`` describe an epilogue (its pointers ``align``-byte
    aligned too). ``invariant``: batch-invariant along m, the rows of the column-major C
    (:mod:`pyblasgemm.planner.invariant`).

    >>> make_desc(64, 64, 64, activation="gelu", bias="n").epilogue.describe()
    'bias per column of the described C, gelu'
    """
    prefix = _prefix(dtype)
    row = TYPE_ROWS[prefix]
    if compute is None and isinstance(dtype, str) and dtype.lower() in ("tf32", "3xtf32"):
        compute = dtype.lower()
    r = "plan"
    ta = check_trans(r, 1, "transa", transa, row)
    tb = check_trans(r, 2, "transb", transb, row)
    m, n, k = check_dim(r, 3, "m", m), check_dim(r, 4, "n", n), check_dim(r, 5, "k", k)
    a_rows = m if ta == "N" else k
    b_rows = k if tb == "N" else n
    lda = max(1, a_rows) if lda is None else check_dim(r, 8, "lda", lda)
    ldb = max(1, b_rows) if ldb is None else check_dim(r, 10, "ldb", ldb)
    ldc = max(1, m) if ldc is None else check_dim(r, 13, "ldc", ldc)
    for name, ld, need in (("lda", lda, a_rows), ("ldb", ldb, b_rows), ("ldc", ldc, m)):
        if ld < max(1, need):
            raise ValueError(f"plan: {name}={ld} must be >= {max(1, need)}")
    batch = check_dim(r, 0, "batch", batch)
    a_cols = k if ta == "N" else m
    b_cols = n if tb == "N" else k
    sa = lda * a_cols if stride_a is None else int(stride_a)
    sb = ldb * b_cols if stride_b is None else int(stride_b)
    sc = ldc * n if stride_c is None else int(stride_c)
    if batch == 1:
        sa = sb = sc = 0
    compute = resolve_compute(row, compute, r)
    if align not in (1, 2, 4, 8, 16):
        raise ValueError(f"plan: align={align!r} must be a power of two <= 16 (bytes)")
    one, zero = (1, 0) if row.scalar_kind == "int" else (1.0, 0.0)
    epilogue = None
    if activation is not None or bias is not None or preactivation:
        act = check_activation(r, activation)
        if bias not in (None, "m", "n"):
            raise ValueError(f"plan: bias={bias!r} must be 'm' (one value per row of C), 'n' (per "
                             f"column) or None")
        epilogue = EpilogueSpec(None if act is None else act.name, bias, align if bias else 0,
                                bool(preactivation), align if preactivation else 0)
    # the description's alignment covers the leading dimensions and strides too
    return describe(r, row, compute, ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, xp,
                    device if xp == "cupy" else -1, (align,), one, zero, epilogue=epilogue,
                    invariant="m" if invariant else "")
