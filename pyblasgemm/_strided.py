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

import threading
from typing import NamedTuple

import numpy as np

from . import _arrays, streams
from ._layout import blas_layout, blas_layouts, compose_op, may_overlap
from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES, resolve_compute
from .desc import alignment, check_backend_place, describe
from .epilogue import EpilogueSpec
from .execute import execute, execute_epilogue
from .kernels.jit import DEQUANT_OUT
from .planner.overrides import current_settings


#: a batch-invariant product of these forms is always described row-major (Cᵀ = op(B)ᵀ
#: op(A)ᵀ), so the caller's rows are the description's n (GemmDesc.invariant)
_ROWS_ALONG_N = "n"


#: per thread: ``(desc, swapped)`` of the problem :func:`strided_gemm`'s fast branch last ran
#: on the caller's own arrays with no launch to return (the host's work, a composite's), for
#: :mod:`pyblasgemm.scipy` to record what its call ran (:func:`take_unlaunched`)
_unlaunched = threading.local()


def take_unlaunched():
    """``(desc, swapped)`` of the last problem this thread's :func:`strided_gemm` ran on its
    arrays themselves through one description with no launch to return (the host backend's
    work; a composite's too: the caller asks the plan), ``swapped`` when it ran as
    Cᵀ = op(B)ᵀ op(A)ᵀ on (b, a); or None. Forgotten once read (a caller reads it before its
    call to forget an older one, and after).

    >>> import numpy as np
    >>> from pyblasgemm import gemm
    >>> _ = take_unlaunched(); _ = gemm("N", "N", np.ones((2, 3)), np.ones((3, 4)))
    >>> desc, swapped = take_unlaunched()
    >>> (desc.m, desc.n, desc.k), swapped, take_unlaunched()      # C-ordered: Cᵀ = Bᵀ Aᵀ
    ((4, 2, 3), True, None)
    """
    ran = getattr(_unlaunched, "ran", None)
    _unlaunched.ran = None
    return ran


def _row_major_first(layouts: list) -> list:
    """The layouts with ('T', ld) first: where a single row or column has both descriptions,
    a batch-invariant problem takes the one its many-row siblings have (rows along K)."""
    return sorted(layouts, key=lambda lay: lay[0] != "T")


def _describe(shape2, strides2, itemsize, user_op, problem_transposed, invariant=False):
    """(blas flag, ld) for a matrix as it lies in memory, or None."""
    layouts = blas_layouts(shape2, strides2, itemsize)
    for layout, ld in (_row_major_first(layouts) if invariant else layouts):
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
                 batch=1, strides=(0, 0, 0), fresh_c=False, autotune=None, stream=None,
                 invariant=False):
    """c[i] = alpha * op(a[i]) @ op(b[i]) + beta * c[i], i < batch, entries ``strides`` bytes
    apart from the first element of a, b, c (whose last two dims are the matrices).
    ``fresh_c``: c was just allocated by the caller, so it cannot overlap a or b. ``stream``:
    a raw handle or None (CuPy's current stream). ``invariant``: a batch-invariant problem
    (:func:`_invariant_first`: the rows of op(a) tight along K, the row-major description).

    Returns ``(launch, swapped)`` when the call ran as one launch on the arrays' own memory
    (``swapped``: as Cᵀ = op(B)ᵀ op(A)ᵀ, i.e. ``launch(b, a, c)``), else None."""
    if backend is not None:     # a forced backend must suit the arrays, empty problems too
        check_backend_place(routine, backend, _arrays.array_module_name(c))
    m, n = c.shape[-2:]
    k = a.shape[-1] if transa == "N" else a.shape[-2]
    if m == 0 or n == 0 or batch == 0:
        return None
    copied = False
    if invariant:
        a, transa, strides, copied = _invariant_first(a, transa, batch, strides, stream)
    fast = None
    if k != 0 and alpha != 0 and min(strides) >= 0:
        fast = _fast_desc(routine, row, compute, transa, transb, a, b, c, alpha, beta, batch,
                          strides, m, n, k, fresh_c, invariant)
    if fast is not None:
        desc, a, b, swapped = fast
        launch = execute(desc, a, b, c, backend, autotune, stream)
        if launch is None and not copied:
            _unlaunched.ran = (desc, swapped)
        # a launch that ran on a copy of the caller's a is not theirs to replay
        return None if launch is None or copied else (launch, swapped)
    with streams.on(stream):
        _general(routine, row, compute, backend, transa, transb,
                 *(_as_3d(x, batch, s) for x, s in zip((a, b, c), strides)), alpha, beta,
                 autotune, stream, invariant)
    return None


#: the byte alignment a batch-invariant problem's own rows (op(A) and C) are given: the
#: widest any kernel asks for (TMA's 16 bytes), so that their alignment never decides the
#: configuration; what is left to decide it is fixed by the weight (K, N, B's own layout)
INVARIANT_ALIGN = 16


def _canonical_rows(x) -> bool:
    """Whether the matrix ``x`` (rows, cols) lies as a batch-invariant problem's rows must:
    each row's elements adjacent, rows exactly one row apart (the leading dimension is then
    cols whatever the row count: a single row's is too), INVARIANT_ALIGN-byte aligned."""
    isz = x.dtype.itemsize
    rows, cols = x.shape[-2:]
    return ((x.strides[-1] == isz or cols <= 1) and (rows <= 1 or x.strides[-2] == cols * isz)
            and _arrays.data_ptr(x) % INVARIANT_ALIGN == 0)


def _invariant_view(a, transa):
    """``(op(a), 'N')`` where op(a) already lies as a batch-invariant problem's rows must
    (:func:`_canonical_rows`), else ``(None, transa)``: no copy made."""
    op = a if transa == "N" else a.swapaxes(-1, -2)
    if transa != "C" and _canonical_rows(op):
        return op, "N"
    return None, transa


def _invariant_first(a, transa, batch, strides, stream):
    """``(a, 'N', strides, copied)``: the first operand of a batch-invariant problem as op(a) stored
    row-major, tight and aligned (:func:`_canonical_rows`), the one layout every row count
    shares: a single row of an F-ordered matrix is also a row-major one, and a row's address
    and a padded leading dimension change the alignment class; either would change the
    description and with it the planned configuration. A view where op(a) already lies so,
    else a C-ordered copy of every batch entry (conjugated for 'C'); ``strides``' first entry
    follows it. ``copied``: a launch on it is not one on the caller's memory (never recorded
    for a replay on the caller's pointers)."""
    op, flag = _invariant_view(a, transa)
    if op is not None:
        return op, flag, strides, False
    entries = batch if strides[0] else 1            # a broadcast operand: one entry
    whole = _as_3d(a, entries, strides[0])
    whole = whole if transa == "N" else whole.swapaxes(1, 2)
    if transa == "C":
        whole = whole.conj()
    xp = _arrays.xp_of(_arrays.array_module_name(a))
    with streams.on(stream):
        whole = xp.ascontiguousarray(whole)
    return whole[0], "N", ((whole.strides[0] if strides[0] else 0),) + tuple(strides[1:]), True


def _fast_desc(routine, row, compute, ta, tb, a, b, c, alpha, beta, batch, strides, m, n, k,
               fresh_c=False, invariant=False):
    """(GemmDesc, A, B) read off shapes and strides (A, B swapped for a transposed problem), or
    None when a copy or a temporary is needed."""
    isz, csz = a.dtype.itemsize, c.dtype.itemsize
    sa, sb, sc = strides
    if sa % isz or sb % isz or sc % csz:
        return None
    if invariant:
        # the row-major description only (Cᵀ = op(B)ᵀ op(A)ᵀ), on tight aligned rows: any
        # other C is written through a temporary by the general path
        if not _canonical_rows(c):
            return None
        lc = next((lay for lay in blas_layouts(c.shape[-2:], c.strides[-2:], csz) if lay[0] == "T"), None)
    else:
        lc = blas_layout(c.shape[-2:], c.strides[-2:], csz)
    if lc is None:
        return None
    pt = lc[0] == "T"
    da = _describe(a.shape[-2:], a.strides[-2:], isz, ta, pt, invariant)
    db = _describe(b.shape[-2:], b.strides[-2:], isz, tb, pt, invariant)
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
                    beta, invariant=_ROWS_ALONG_N if invariant else "")
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


def _describe_operand(x, user_op, problem_transposed, invariant=False):
    """(blas flag, ld, batch stride) for a 3-D x as it lies in memory, or None."""
    stride = _batch_stride(x)
    if stride is None:
        return None
    found = _describe(x.shape[1:], x.strides[1:], x.dtype.itemsize, user_op, problem_transposed,
                      invariant)
    return None if found is None else found + (stride,)


def _operand(xp, x, user_op, problem_transposed, invariant=False):
    """(array, blas flag, ld, batch stride) for an operand, copying only when unavoidable."""
    described = _describe_operand(x, user_op, problem_transposed, invariant)
    if described is None:
        # No BLAS description of these strides, or conjugation without transposition: copy,
        # column-major, or row-major where only that makes the flag expressible.
        x_f = xp.ascontiguousarray(x.swapaxes(1, 2)).swapaxes(1, 2)
        described = _describe_operand(x_f, user_op, problem_transposed, invariant)
        x = x_f if described is not None else xp.ascontiguousarray(x)
        described = described or _describe_operand(x, user_op, problem_transposed, invariant)
    return (x,) + described


def _output_layout(c, inputs, invariant=False):
    """('N'|'T', ld, batch stride) if C can be written in place, else None (use a temporary).
    ``invariant``: the row-major description only."""
    layouts = blas_layouts(c.shape[1:], c.strides[1:], c.dtype.itemsize)
    if invariant:      # tight aligned rows only (_canonical_rows), described row-major
        layout = next((lay for lay in layouts if lay[0] == "T"), None) if _canonical_rows(c[0]) else None
    else:
        layout = layouts[0] if layouts else None
    stride = _batch_stride(c)
    if layout is None or stride is None or any(may_overlap(c, x) for x in inputs):
        return None
    rows, cols = c.shape[1:] if layout[0] == "N" else c.shape[:0:-1]
    if c.shape[0] > 1 and 0 < stride < layout[1] * (cols - 1) + rows:
        return None  # batch entries of C would overlap each other
    return layout[0], layout[1], stride


def _general(routine, row, compute, backend, transa, transb, a, b, c, alpha, beta,
             autotune=None, stream=None, invariant=False):
    """The same product for 3-D views, with copies/temporaries where strides demand them."""
    xp_name = _arrays.array_module_name(c)
    xp = _arrays.xp_of(xp_name)
    batch, m, n = c.shape
    k = a.shape[2] if transa == "N" else a.shape[1]
    target = c
    out = None if k == 0 or alpha == 0 else _output_layout(c, (a, b), invariant)
    if out is None:
        # a fresh column-major temporary (row-major for an invariant problem), copied into c
        # at the end
        target = (xp.empty((batch, m, n), dtype=c.dtype) if invariant else
                  xp.empty((batch, n, m), dtype=c.dtype).swapaxes(1, 2))
        if beta != 0:
            target[...] = c
        out = _output_layout(target, (), invariant)
    _, ldc, sc = out
    if k == 0 or alpha == 0:
        # A and B are not read: C = beta * C
        # A and B are not read: C = beta * C, answered by execute like every degenerate call
        desc = describe(routine, row, compute, "N", "N", m, n, k, max(1, m), max(1, k), ldc,
                        batch, 0, 0, sc, xp_name, _arrays.device_id(c), (1,), alpha, beta,
                        invariant=_ROWS_ALONG_N if invariant else "")
        execute(desc, None, None, target, backend, autotune, stream)
    else:
        problem_t = out[0] == "T"
        a, fa, lda, sa = _operand(xp, a, transa, problem_t, invariant)
        b, fb, ldb, sb = _operand(xp, b, transb, problem_t, invariant)
        if problem_t:  # Cᵀ = op(B)ᵀ op(A)ᵀ
            a, fa, lda, sa, b, fb, ldb, sb, m, n = b, fb, ldb, sb, a, fa, lda, sa, n, m
        desc = describe(routine, row, compute, fa, fb, m, n, k, lda, ldb, ldc, batch, sa, sb,
                        sc, xp_name, _arrays.device_id(c),
                        (_arrays.data_ptr(a), _arrays.data_ptr(b), _arrays.data_ptr(target)),
                        alpha, beta, invariant=_ROWS_ALONG_N if invariant else "")
        execute(desc, a, b, target, backend, autotune, stream)
    if target is not c:
        c[...] = target


# ---------------------------------------------------------------------------------------------
# Epilogues: one description with its EpilogueSpec, run by the plan's route
# ---------------------------------------------------------------------------------------------

class FusedRun(NamedTuple):
    """An epilogue call that ran fused, as its call signature replays it: ``run(pa, pb, pc,
    pbias, sptr)`` with the operands in the caller's order."""

    launch: object      # the bound launch (execute's; the signature refers to it)
    swap: bool          # operands in the description's order: (b, a)
    alpha: object       # the description's typed scalars
    beta: object
    route: object       # the plan's Route (pyblasgemm.epilogue.last_route reads it)
    widen: object       # the dtype a 16-bit bias is cast to first (float32 results), or None


def row_for(ab_dtype, out_dtype):
    """The type row computing ``out_dtype`` from ``ab_dtype`` operands (shgemm/sbgemm for a
    float32 result of 16-bit operands), or None."""
    row = ROW_BY_DTYPE.get(np.dtype(ab_dtype))
    if row is not None and row.c_dtype == out_dtype:
        return row
    return ROW_BY_DTYPES.get((np.dtype(ab_dtype), np.dtype(out_dtype)))


def _bias_axis(epi, swapped: bool):
    """The user's bias axis ('cols': one per column of the result) in the description's terms."""
    return None if epi.bias_axis is None else ("m" if (epi.bias_axis == "cols") == swapped else "n")


def _ptr(x) -> int:
    return 0 if x is None else _arrays.data_ptr(x)


def _routable(backend, a, b, alpha, beta, m, n, k) -> bool:
    """A 2-D call on the GPU that one planned launch may run: Python scalars, alpha != 0,
    nothing empty, a GPU backend (a forced 'host' is the unfused route's error to raise)."""
    route = backend if backend is not None else current_settings().backend
    return (route in ("auto", "cublas", "tensorcore") and a.ndim == 2 and b.ndim == 2
            and type(alpha) in (int, float) and type(beta) in (int, float) and alpha != 0
            and m > 0 and n > 0 and k > 0)


def epilogue_gemm(routine, row, compute, ta, tb, a, b, c, alpha, beta, epi, bias, pre, fresh_c,
                  backend, autotune, stream, invariant=False):
    """``c = act(alpha·op(a)·op(b) + beta·c + bias)`` (and the pre-activation) on CuPy arrays,
    described as one problem with its epilogue and run by the plan's route
    (:func:`pyblasgemm.execute.execute_epilogue`). Returns the :class:`FusedRun` when a fused
    route ran; else the caller computes the product and the pass, recording the unfused route
    returned (the plan's), or None when the arrays are not one description (other dtypes,
    batches, a copy needed)."""
    m, n = c.shape[-2:]
    k = a.shape[-1] if ta == "N" else a.shape[-2]
    if row is None or not _routable(backend, a, b, alpha, beta, m, n, k) or a.dtype != row.ab_dtype \
            or b.dtype != row.ab_dtype or c.dtype != row.c_dtype:
        return None
    widen = None
    if bias is not None and bias.dtype != c.dtype and bias.dtype.itemsize == 2 and c.dtype == np.float32:
        # a 16-bit bias (the operands' type) for a float32 result: widened exactly, n elements
        # (one small cast beside the fused call instead of the unfused route's passes)
        widen = c.dtype
        with streams.on(stream):
            bias = bias.astype(widen)
    blocker = ""
    if bias is not None and (bias.dtype != c.dtype or not bias.flags.c_contiguous):
        blocker = "the bias is not contiguous in the result's dtype (the fused stores read it so)"
    elif pre is not None and (pre.strides != c.strides or may_overlap(pre, c)):
        blocker = "the pre-activation is not laid out as the result, or shares its memory"
    if invariant:
        a, ta = _invariant_view(a, ta)
        if a is None:       # a fused launch on a copy could not be replayed on the caller's a:
            return None     # the unfused route (its product makes the copy itself)
    fast = _fast_desc(routine, row, resolve_compute(row, compute, routine), ta, tb, a, b, c, alpha,
                      beta, 1, (0, 0, 0), m, n, k, fresh_c, invariant)
    if fast is None:
        return None
    desc, first, second, swapped = fast
    pbias, ppre = _ptr(bias), _ptr(pre)
    spec = EpilogueSpec(None if epi.activation is None else epi.activation.name, _bias_axis(epi, swapped),
                        alignment(pbias) if bias is not None else 0, pre is not None,
                        alignment(ppre) if pre is not None else 0, None, blocker)
    desc = desc._replace(epilogue=spec)
    sptr = streams.current() if stream is None else stream
    launch, route = execute_epilogue(desc, first, second, c, backend, autotune, sptr, pbias, ppre)
    return route if launch is None else FusedRun(launch, swapped, desc.alpha, desc.beta, route, widen)


def _int32_shadow(result):
    """An int32 array object over ``result``'s address with its element strides: what the int8
    product's description is read off (shape, strides, address). Never read or written as
    int32: the dequantizing kernel writes ``result``'s own type at those element offsets."""
    isz = result.dtype.itemsize
    return type(result)(result.shape, np.int32, memptr=result.data,
                        strides=tuple(s // isz * 4 for s in result.strides))


def dequant_gemm(a, b, ta, tb, result, alpha, beta, epi, bias, pre, scale_a, scale_b, fresh_c,
                 backend, autotune, stream, invariant=False):
    """An int8 product dequantized in the store (``result = act(alpha·scale_a·scale_b·(op(a)·
    op(b)) + beta·result + bias)``) as the plan's route runs it: a :class:`FusedRun` when a
    fused route ran; else, as :func:`epilogue_gemm`, the unfused route or None (the caller's:
    the exact int32 product, then the pass)."""
    out_name = result.dtype.name
    m, n = result.shape
    k = a.shape[1] if ta == "N" else a.shape[0]
    if out_name not in DEQUANT_OUT or not _routable(backend, a, b, alpha, beta, m, n, k):
        return None
    if not fresh_c and (may_overlap(result, a) or may_overlap(result, b)):
        return None             # (checked here: the int32 shadow's extent is not the result's)
    row = ROW_BY_DTYPE[np.dtype(np.int8)]
    if invariant:
        a, ta = _invariant_view(a, ta)
        if a is None:
            return None         # (as epilogue_gemm: the unfused route)
    fast = _fast_desc("gemm", row, resolve_compute(row, None, "gemm"), ta, tb, a, b,
                      _int32_shadow(result), 1, 0, 1, (0, 0, 0), m, n, k, True, invariant)
    if fast is None:
        return None
    desc, first, second, swapped = fast
    blocker = ""
    if scale_a.shape != (m,) or scale_b.shape != (n,) or not (scale_a.flags.c_contiguous
                                                             and scale_b.flags.c_contiguous):
        blocker = "the scales are not contiguous vectors of full length (the fused store reads one per row / column)"
    elif bias is not None and (bias.dtype != result.dtype or not bias.flags.c_contiguous):
        blocker = "the bias is not contiguous in the result's dtype"
    elif pre is not None and (pre.strides != result.strides or may_overlap(pre, result)
                              or _arrays.data_ptr(pre) % 16):
        blocker = "the pre-activation is not laid out as the result, 16-byte aligned"
    elif _arrays.data_ptr(result) % 16 or desc.ldc % (16 // result.dtype.itemsize):
        blocker = "the result is not 16-byte aligned in whole 16-byte columns (the store's 16-byte writes)"
    pbias, ppre = _ptr(bias), _ptr(pre)
    spec = EpilogueSpec(None if epi.activation is None else epi.activation.name, _bias_axis(epi, swapped),
                        alignment(pbias) if bias is not None else 0, pre is not None,
                        alignment(ppre) if pre is not None else 0, out_name, blocker)
    desc = desc._replace(epilogue=spec)
    sm, sn = (scale_b, scale_a) if swapped else (scale_a, scale_b)
    sptr = streams.current() if stream is None else stream
    launch, route = execute_epilogue(desc, first, second, result, backend, autotune, sptr, pbias,
                                     ppre, _arrays.data_ptr(sm), _arrays.data_ptr(sn), float(alpha),
                                     float(beta))
    return route if launch is None else FusedRun(launch, swapped, float(alpha), float(beta), route, None)
