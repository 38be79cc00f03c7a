"""``pyblasgemm.explain(a, b, **kw)``: the plan :func:`pyblasgemm.matmul` would use for these
arrays, found the way matmul finds it (its dtype rules, the row-major to column-major view with
m and n swapped, its batch merging), without running the product."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:     # types only (pyblasgemm._typing)
    from ._typing import Backend, Compute

__all__ = ["explain"]


def explain(a: Any, b: Any, *, dtype: Any = None, compute: Compute | None = None,
            backend: Backend | None = None, limit: int = 12) -> str:
    """Describe what ``pyblasgemm.matmul(a, b, dtype=..., compute=..., backend=...)`` would do:
    the route, the column-major problem the planner sees and its plan's explanation
    (:meth:`Plan.explain`, ``limit`` candidates). Nothing is computed or launched; a plan made
    here is memoized like matmul's own.

    A row-major user no longer swaps m and n for :func:`pyblasgemm.plan`: the arrays say it.

    Example::

        >>> import numpy as np, pyblasgemm
        >>> a, b = np.ones((64, 32), np.float32), np.ones((32, 16), np.float32)
        >>> print(pyblasgemm.explain(a, b))                       # doctest: +ELLIPSIS
        matmul: a (64, 32) float32 @ b (32, 16) float32 -> (64, 16) float32
        route: NumPy's matmul directly (the host fast path: no plan)
        >>> print(pyblasgemm.explain(a, b, backend="host"))       # doctest: +ELLIPSIS
        matmul: a (64, 32) float32 @ b (32, 16) float32 -> (64, 16) float32
        route: planned (column-major: C^T = B^T A^T, so m=16 n=64)
        problem: ...
        plan: backend 'host'...
    """
    import importlib

    mm = importlib.import_module("pyblasgemm.matmul")     # the module (the package's name is the function)
    from ._types import ROW_BY_DTYPE, get_default_compute, resolve_compute
    from ._strided import _fast_desc
    from .desc import check_backend
    from .planner.core import plan_for
    from .planner.problem import make_desc

    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"explain: limit={limit!r} must be an int >= 0")
    xp_name = mm._exact_array(a)
    if xp_name is None or mm._exact_array(b) != xp_name:
        raise TypeError(f"explain: a and b must both be NumPy or both CuPy arrays (got "
                        f"{type(a).__name__} and {type(b).__name__})")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"explain: a.ndim={a.ndim}, b.ndim={b.ndim}: matmul needs >= 1")
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(f"explain: a.shape={a.shape} and b.shape={b.shape}: inner dimensions "
                         f"{k} and {k2} differ")
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"explain: batch dimensions of a.shape={a.shape} and b.shape={b.shape} "
                         f"do not broadcast") from None
    if dtype is None:
        dtypes = mm._loop_dtypes(xp_name, a.dtype, b.dtype)
    else:
        row, dtypes = mm._with_dtype(xp_name, a, b, dtype) or (None, None)
    shape = batch + (m, n)
    head = (f"matmul: a {a.shape} {a.dtype} @ b {b.shape} {b.dtype} -> {shape} "
            f"{dtypes[1] if dtypes else '?'}")
    if dtypes is None:
        return head + f"\nroute: {xp_name}.matmul (no pyblasgemm type row for these dtypes)"
    forced = check_backend("explain", backend)
    if (xp_name == "numpy" and dtype is None and compute is None and forced is None
            and a.dtype == b.dtype and a.dtype.num in mm._HOST_DIRECT
            and (a.dtype.char != "f" or get_default_compute() == "fp32")):
        # matmul's first branch: no planner at all
        return head + "\nroute: NumPy's matmul directly (the host fast path: no plan)"
    row = row if dtype is not None and row is not None else ROW_BY_DTYPE[dtypes[0]]
    mode = resolve_compute(row, compute, "explain")
    if 0 in shape or k == 0:
        return head + "\nroute: empty or k = 0 (no GEMM runs)"
    xp = np if xp_name == "numpy" else __import__("cupy")
    # views of the casts matmul makes; a tiny stand-in for C (only its layout matters)
    ac = a2.astype(dtypes[0], copy=False)
    bc = b2.astype(dtypes[0], copy=False)
    c = np.lib.stride_tricks.as_strided(xp.empty(1, row.c_dtype), shape,
                                        _c_strides(shape, row.c_dtype.itemsize)) \
        if xp is np else xp.empty(shape, row.c_dtype)
    nb = len(batch)
    one, zero = (1, 0) if row.prefix == "i" else (1.0, 0.0)
    note = ""
    if nb:
        strides = [mm._batch_strides(x, nb) for x in (ac, bc, c)]
        p, step_dim = mm._split_point(batch, strides)
        inner = int(np.prod(batch[p:]))
        steps = tuple(s[step_dim] for s in strides) if step_dim is not None else (0, 0, 0)
        if p:
            note = f" (one of {int(np.prod(batch[:p]))} strided batches, looped)"
        ac, bc, c = (mm._origin(x, nb, (0,) * p) for x in (ac, bc, c))
    else:
        inner, steps = 1, (0, 0, 0)
    fast = None
    if min(steps) >= 0:
        fast = _fast_desc("matmul", row, mode, "N", "N", ac, bc, c, one, zero, inner, steps,
                          m, n, k, fresh_c=True)
    if fast is not None:
        desc, _, _, swapped = fast
        how = ("column-major: C^T = B^T A^T, so m=%d n=%d" % (desc.m, desc.n) if swapped
               else "column-major as given")
    else:
        # strides no BLAS flag describes: matmul copies to tight storage first
        desc = make_desc(n, m, k, row.ab_dtype.name, compute=mode, batch=inner,
                         xp=xp_name)
        how = "operands copied to tight storage first; C^T = B^T A^T"
    plan = plan_for(desc, forced)
    return f"{head}\nroute: planned ({how}){note}\n{plan.explain(limit)}"


def _c_strides(shape, itemsize):
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))
