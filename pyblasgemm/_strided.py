"""The shared core of the array forms: a strided batch of views -> one ``GemmDesc`` -> execute.

``gemm`` and ``matmul`` both end here with 3-D views ``(batch, rows, cols)``: the logical
operands ``a``, ``b`` (to which ``transa``/``transb`` apply) and the output ``c``. Row-major
output is computed as the transposed column-major problem Cᵀ = op(B)ᵀ·op(A)ᵀ; operands are used
in place whenever one of their strides is unit, and copied only when no BLAS flag can describe
them.
"""
from __future__ import annotations

from . import _arrays
from ._layout import blas_layout, blas_layouts, compose_op, may_overlap
from .desc import GemmDesc, alignment
from .execute import execute


def _batch_stride(x) -> int | None:
    """Element stride between batch entries, or None if BLAS cannot step by it."""
    if x.shape[0] <= 1:
        return 0
    s = x.strides[0]
    if s < 0 or s % x.dtype.itemsize:
        return None
    return s // x.dtype.itemsize


def _describe_operand(x, user_op, problem_transposed):
    """(blas flag, ld, batch stride) for x as it lies in memory, or None."""
    stride = _batch_stride(x)
    if stride is None:
        return None
    for layout, ld in blas_layouts(x.shape[1:], x.strides[1:], x.dtype.itemsize):
        flag = compose_op(user_op, layout == "T", problem_transposed)
        if flag is not None:
            return flag, ld, stride
    return None


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


def strided_gemm(routine, row, compute, backend, transa, transb, a, b, c, alpha, beta):
    """c[i] = alpha * op(a[i]) @ op(b[i]) + beta * c[i] for 3-D views a, b, c (writes c)."""
    xp_name = _arrays.array_module_name(c)
    xp = _arrays.xp_of(xp_name)
    batch, m, n = c.shape
    k = a.shape[2] if transa == "N" else a.shape[1]

    if c.size == 0:
        return
    if k == 0 or alpha == 0:
        # A and B are not read: describe them without looking at their (possibly odd) strides
        desc = GemmDesc(routine, row.prefix, compute, "N", "N", m, n, k, max(1, m), max(1, k),
                        max(1, m), batch, 0, 0, 0, xp_name, _arrays.device_id(c), 1, alpha, beta)
        from .execute import scale_c
        target = xp.empty((batch, n, m), dtype=c.dtype).swapaxes(1, 2)
        if beta != 0:
            target[...] = c
        scale_c(desc._replace(stride_c=m * n), target)
        c[...] = target
        return
    out = _output_layout(c, (a, b))
    target = c
    if out is None:
        # write a fresh column-major temporary, copy into c at the end
        target = xp.empty((batch, n, m), dtype=c.dtype).swapaxes(1, 2)
        if beta != 0:
            target[...] = c
        out = _output_layout(target, ())
    problem_t = out[0] == "T"
    a, fa, lda, sa = _operand(xp, a, transa, problem_t)
    b, fb, ldb, sb = _operand(xp, b, transb, problem_t)
    _, ldc, sc = out
    if problem_t:  # Cᵀ = op(B)ᵀ op(A)ᵀ
        a, fa, lda, sa, b, fb, ldb, sb, m, n = b, fb, ldb, sb, a, fa, lda, sa, n, m
    isz, csz = a.dtype.itemsize, target.dtype.itemsize
    align = alignment(_arrays.data_ptr(a), _arrays.data_ptr(b), _arrays.data_ptr(target),
                      lda * isz, ldb * isz, ldc * csz, sa * isz, sb * isz, sc * csz)
    desc = GemmDesc(routine, row.prefix, compute, fa, fb, m, n, k, lda, ldb, ldc, batch,
                    sa, sb, sc, xp_name, _arrays.device_id(c), align, alpha, beta)
    execute(desc, a, b, target, backend)
    if target is not c:
        c[...] = target
