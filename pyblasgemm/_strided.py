"""The shared core of the array forms: strided matrices -> one ``GemmDesc`` -> execute.

``gemm`` and ``matmul`` both end here with arrays whose last two dimensions are the logical
operands ``a``, ``b`` (to which ``transa``/``transb`` apply) and the output ``c``, plus a batch
count and the byte strides between batch entries. Row-major output is computed as the
transposed column-major problem Cᵀ = op(B)ᵀ·op(A)ᵀ; operands are used in place whenever one of
their strides is unit, and copied only when no BLAS flag can describe them.

The common case (every stride describable, no overlap) is read straight off shapes and strides
(the fast path: no views are created); the rest goes through 3-D views and copies.
"""
from __future__ import annotations

from . import _arrays, streams
from ._layout import blas_layout, blas_layouts, compose_op, may_overlap
from .desc import check_backend_place, describe
from .execute import execute


def _describe(shape2, strides2, itemsize, user_op, problem_transposed):
    """(blas flag, ld) for a matrix as it lies in memory, or None."""
    for layout, ld in blas_layouts(shape2, strides2, itemsize):
        flag = compose_op(user_op, layout == "T", problem_transposed)
        if flag is not None:
            return flag, ld
    return None


def _extent(ptr, shape2, strides2, itemsize, batch, bstride):
    """[lo, hi) bytes reached by a strided batch of matrices (all strides >= 0 here)."""
    r, c = shape2
    hi = ptr + (r - 1) * strides2[0] + (c - 1) * strides2[1] + (batch - 1) * bstride + itemsize
    return ptr, hi


def strided_gemm(routine, row, compute, backend, transa, transb, a, b, c, alpha, beta,
                 batch=1, strides=(0, 0, 0), fresh_c=False, autotune=None, stream=None):
    """c[i] = alpha * op(a[i]) @ op(b[i]) + beta * c[i], i < batch, entries ``strides`` bytes
    apart from the first element of a, b, c (whose last two dims are the matrices).
    ``fresh_c``: c was just allocated by the caller, so it cannot overlap a or b. ``stream``:
    a raw handle or None (CuPy's current stream).

    Returns ``(launch, swapped)`` when the call ran as one launch on the arrays' own memory
    (``swapped``: as Cᵀ = op(B)ᵀ op(A)ᵀ, i.e. ``launch(b, a, c)``), else None."""
    if backend is not None:     # a forced backend must suit the arrays, empty problems too
        check_backend_place(routine, backend, _arrays.array_module_name(c))
    m, n = c.shape[-2:]
    k = a.shape[-1] if transa == "N" else a.shape[-2]
    if m == 0 or n == 0 or batch == 0:
        return None
    fast = None
    if k != 0 and alpha != 0 and min(strides) >= 0:
        fast = _fast_desc(routine, row, compute, transa, transb, a, b, c, alpha, beta, batch,
                          strides, m, n, k, fresh_c)
    if fast is not None:
        desc, a, b, swapped = fast
        launch = execute(desc, a, b, c, backend, autotune, stream)
        return None if launch is None else (launch, swapped)
    with streams.on(stream):
        _general(routine, row, compute, backend, transa, transb,
                 *(_as_3d(x, batch, s) for x, s in zip((a, b, c), strides)), alpha, beta,
                 autotune, stream)
    return None


def _fast_desc(routine, row, compute, ta, tb, a, b, c, alpha, beta, batch, strides, m, n, k,
               fresh_c=False):
    """(GemmDesc, A, B) read off shapes and strides (A, B swapped for a transposed problem), or
    None when a copy or a temporary is needed."""
    isz, csz = a.dtype.itemsize, c.dtype.itemsize
    sa, sb, sc = strides
    if sa % isz or sb % isz or sc % csz:
        return None
    lc = blas_layout(c.shape[-2:], c.strides[-2:], csz)
    if lc is None:
        return None
    pt = lc[0] == "T"
    da = _describe(a.shape[-2:], a.strides[-2:], isz, ta, pt)
    db = _describe(b.shape[-2:], b.strides[-2:], isz, tb, pt)
    if da is None or db is None:
        return None
    pa, pb, pc = _arrays.data_ptr(a), _arrays.data_ptr(b), _arrays.data_ptr(c)
    if not fresh_c:
        c_lo, c_hi = _extent(pc, c.shape[-2:], c.strides[-2:], csz, batch, sc)
        for p, x, s in ((pa, a, sa), (pb, b, sb)):
            lo, hi = _extent(p, x.shape[-2:], x.strides[-2:], isz, batch, s)
            if lo < c_hi and c_lo < hi:
                return None             # C overlaps an input: compute into a temporary
    if batch > 1:
        rows, cols = (m, n) if not pt else (n, m)
        if 0 < sc < (lc[1] * (cols - 1) + rows) * csz:
            return None             # batch entries of C overlap each other
    (fa, lda), (fb, ldb) = da, db
    sa, sb, sc = sa // isz, sb // isz, sc // csz
    if pt:  # Cᵀ = op(B)ᵀ op(A)ᵀ
        fa, lda, sa, fb, ldb, sb, m, n, pa, pb = fb, ldb, sb, fa, lda, sa, n, m, pb, pa
        a, b = b, a
    desc = describe(routine, row, compute, fa, fb, m, n, k, lda, ldb, lc[1], batch, sa, sb, sc,
                    _arrays.array_module_name(c), _arrays.device_id(c), (pa, pb, pc), alpha,
                    beta)
    return desc, a, b, pt


def _as_3d(x, count, step_bytes):
    """(count, rows, cols) view of x's memory: batch entries step_bytes apart (never a copy)."""
    shape = (count,) + x.shape[-2:]
    strides = (step_bytes,) + x.strides[-2:]
    return _arrays.as_strided_bytes(x, shape, strides)


# ---------------------------------------------------------------------------------------------
# The general path: 3-D views (batch, rows, cols), copies and temporaries where needed
# ---------------------------------------------------------------------------------------------

def _batch_stride(x) -> int | None:
    """Element stride between batch entries, or None if BLAS cannot step by it."""
    if x.shape[0] <= 1:
        return 0
    s = x.strides[0]
    if s < 0 or s % x.dtype.itemsize:
        return None
    return s // x.dtype.itemsize


def _describe_operand(x, user_op, problem_transposed):
    """(blas flag, ld, batch stride) for a 3-D x as it lies in memory, or None."""
    stride = _batch_stride(x)
    if stride is None:
        return None
    found = _describe(x.shape[1:], x.strides[1:], x.dtype.itemsize, user_op, problem_transposed)
    return None if found is None else found + (stride,)


def _operand(xp, x, user_op, problem_transposed):
    """(array, blas flag, ld, batch stride) for an operand, copying only when unavoidable."""
    described = _describe_operand(x, user_op, problem_transposed)
    if described is None:
        # No BLAS description of these strides, or conjugation without transposition: copy,
        # column-major, or row-major where only that makes the flag expressible.
        x_f = xp.ascontiguousarray(x.swapaxes(1, 2)).swapaxes(1, 2)
        described = _describe_operand(x_f, user_op, problem_transposed)
        x = x_f if described is not None else xp.ascontiguousarray(x)
        described = described or _describe_operand(x, user_op, problem_transposed)
    return (x,) + described


def _output_layout(c, inputs):
    """('N'|'T', ld, batch stride) if C can be written in place, else None (use a temporary)."""
    layout = blas_layout(c.shape[1:], c.strides[1:], c.dtype.itemsize)
    stride = _batch_stride(c)
    if layout is None or stride is None or any(may_overlap(c, x) for x in inputs):
        return None
    rows, cols = c.shape[1:] if layout[0] == "N" else c.shape[:0:-1]
    if c.shape[0] > 1 and 0 < stride < layout[1] * (cols - 1) + rows:
        return None  # batch entries of C would overlap each other
    return layout[0], layout[1], stride


def _general(routine, row, compute, backend, transa, transb, a, b, c, alpha, beta,
             autotune=None, stream=None):
    """The same product for 3-D views, with copies/temporaries where strides demand them."""
    xp_name = _arrays.array_module_name(c)
    xp = _arrays.xp_of(xp_name)
    batch, m, n = c.shape
    k = a.shape[2] if transa == "N" else a.shape[1]
    target = c
    out = None if k == 0 or alpha == 0 else _output_layout(c, (a, b))
    if out is None:
        # a fresh column-major temporary, copied into c at the end
        target = xp.empty((batch, n, m), dtype=c.dtype).swapaxes(1, 2)
        if beta != 0:
            target[...] = c
        out = _output_layout(target, ())
    _, ldc, sc = out
    if k == 0 or alpha == 0:
        # A and B are not read: C = beta * C
        # A and B are not read: C = beta * C, answered by execute like every degenerate call
        desc = describe(routine, row, compute, "N", "N", m, n, k, max(1, m), max(1, k), ldc,
                        batch, 0, 0, sc, xp_name, _arrays.device_id(c), (1,), alpha, beta)
        execute(desc, None, None, target, backend, autotune, stream)
    else:
        problem_t = out[0] == "T"
        a, fa, lda, sa = _operand(xp, a, transa, problem_t)
        b, fb, ldb, sb = _operand(xp, b, transb, problem_t)
        if problem_t:  # Cᵀ = op(B)ᵀ op(A)ᵀ
            a, fa, lda, sa, b, fb, ldb, sb, m, n = b, fb, ldb, sb, a, fa, lda, sa, n, m
        desc = describe(routine, row, compute, fa, fb, m, n, k, lda, ldb, ldc, batch, sa, sb,
                        sc, xp_name, _arrays.device_id(c),
                        (_arrays.data_ptr(a), _arrays.data_ptr(b), _arrays.data_ptr(target)),
                        alpha, beta)
        execute(desc, a, b, target, backend, autotune, stream)
    if target is not c:
        c[...] = target
