"""The BLAS raw form: ``sgemm``, ``dgemm``, ``hgemm``, ``bgemm``, ``igemm``, ``cgemm``, ``zgemm``,
and the mixed-precision ``shgemm`` / ``sbgemm`` (16-bit A and B, float32 C; OpenBLAS's names).

Reference-BLAS semantics on column-major memory, as a Fortran or cuBLAS caller expects:
``C = alpha * op(A) @ op(B) + beta * C``, ``op(X)`` one of X, Xᵀ ('T'), Xᴴ ('C').

The buffers may be NumPy arrays (the host), CuPy arrays (the GPU), or PyTorch tensors, JAX
arrays and objects with ``__cuda_array_interface__`` or DLPack (run on as views of their
memory, ``c`` written in place); ``stream=`` says where the GPU work is enqueued (default:
the current stream of the arrays' framework). SciPy's signature, ``sgemm(alpha, a, b)``, is
:mod:`pyblasgemm.scipy`'s.
"""
from __future__ import annotations

from math import copysign as _copysign
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ._typing import BlasRoutine

import numpy as np

from ._types import TYPE_ROWS
from . import _layout, arrays, calls, streams
from .backends import host as _host
from .desc import describe_blas
from .execute import execute
from .gemm import _PLAIN, _scalar_limit
from .matmul import _plain_word
from .planner import plan_for
from .planner.composite import CompositeSpec
from .planner.overrides import current_settings, resolve_invariant

_CUPY = [None]
_TORCH = [None]
_ND = np.ndarray
_may_share = _layout.may_share_ndarrays      # (the arrays are exact ndarrays there)
_peek = calls.cache.peek
_recorded = calls.recorded
#: the scalar types whose NumPy calls are remembered (:class:`_HostCall`): the GPU's
#: (gemm._PLAIN) and, on the host, the complex routines' too (a float or int alpha read as
#: complex() reads it, as describe_blas does)
_HOST_SCALARS = dict(_PLAIN, complex=(complex, float, int))
_matmul_raising = _host.matmul_raising
_run_views = _host.run_views


#: a plain view that is the array's own transpose (:attr:`_HostCall.plain`)
_TRANSPOSED = "transposed"


#: a plain view that is a contiguous 1-D buffer reshaped (:attr:`_HostCall.plain`), entered as
#: ``(_COLUMNS, (columns, rows))``: ``x.reshape(columns, rows).T``, the reference-BLAS caller's
#: column-major matrix whose leading dimension is its row count (~0.56 µs against ~0.77 µs for
#: the ndarray header of the same view at 4x4 on the 2-core dev host, loaded; the shape a plain
#: tuple: NumPy reads a tuple subclass ~0.4 µs slower); ``(_ROWS, (rows, columns))``:
#: ``x.reshape(rows, columns)``, its transpose (op(X) = Xᵀ)
_COLUMNS, _ROWS = "columns", "rows"


def _plain_view(x, view):
    """``x`` as its :attr:`_HostCall.plain` entry ``view`` says: itself, its ``.T``, a 1-D
    buffer reshaped (:data:`_COLUMNS`, :data:`_ROWS`), or a view of the (shape, strides)
    given."""
    if view is None:
        return x
    if view is _TRANSPOSED:
        return x.T
    if view[0] is _COLUMNS:
        return x.reshape(view[1]).T
    return x.reshape(view[1]) if view[0] is _ROWS else _ND(view[0], x.dtype, x, 0, view[1])


def _transposed_entry(view):
    """The :attr:`_HostCall.plain` entry whose view is the transpose of ``view``'s."""
    if view is None:
        return _TRANSPOSED
    if view is _TRANSPOSED:
        return None
    if view[0] is _COLUMNS:
        return (_ROWS, view[1])               # x.reshape(s).T transposed: x.reshape(s)
    if view[0] is _ROWS:
        return (_COLUMNS, view[1])
    return (view[0][::-1], view[1][::-1])


def _view_steps(view) -> int:
    """What making ``view``'s view costs a hit, in steps of ~0.1-0.25 µs: the array itself
    none, a .T or a reshape one, a reshape and its .T two, an ndarray header three."""
    if view is None:
        return 0
    if view is _TRANSPOSED or view[0] is _ROWS:
        return 1
    return 2 if view[0] is _COLUMNS else 3


#: numpy.dot without its ``__array_function__`` dispatch (the hits' arrays are exact ndarrays):
#: ~0.35 µs less a call at 4x4 (2-core dev host, NumPy 2.4)
_DOT = getattr(np.dot, "_implementation", np.dot)


#: NumPy's BLAS bound on a dimension and on a stride in elements (INT_MAX - 1: matmul's
#: ``BLAS_MAXSIZE``); past it numpy.matmul runs its own loop
_BLAS_MAXSIZE = 2**31 - 2


def _dot_reports_like_matmul() -> bool:
    """Whether numpy.dot, given an ``out``, checks the floating-point status as numpy.matmul
    does (NumPy 2 reports "overflow encountered in dot"; checked once, in the raising context
    the hit runs it in, on an overflow and an underflow)."""
    if _matmul_raising is not _host._matmul_raising_in_context:
        return False
    run = _host._raising_run()
    out = np.empty((2, 2), np.float32)
    for value in (3e38, 1e-30):
        x = np.full((2, 2), value, np.float32)
        try:
            run(_DOT, x, x, out)
        except FloatingPointError:
            continue
        return False
    return True


def _contiguous(shape, strides, itemsize, c_only=False) -> bool:
    """Whether a 2-D view of (shape, strides) is C-contiguous (or, unless ``c_only``,
    F-contiguous): numpy.dot then runs on it as it is, no copy."""
    rows, cols = shape
    if strides == (cols * itemsize, itemsize):
        return True
    return not c_only and strides == (itemsize, rows * itemsize)


def _plain_product(plain, views: tuple, itemsizes: tuple, m: int, n: int, k: int, lds: tuple):
    """The recipe of a :attr:`_HostCall.plain` product, made once per signature: ``(a, b,
    c) -> bool`` that runs numpy.matmul's product into C's view with every floating-point
    exception raised (False then: the caller runs and reports it), or None where it is not
    plain. ``views``: the 2-D (shape, strides) of op(A), op(B), C, flat; ``itemsizes``: of
    A and B, of C.

    It runs ``matmul(op(A), op(B), C)`` or ``matmul(op(B)ᵀ, op(A)ᵀ, Cᵀ)``. The second is the
    call numpy.matmul itself makes of the first (C's view is F-blasable and not C-blasable
    for m >= 2: "use transpose equivalence", the same ``matmul_matrixmatrix`` arguments, so
    the same cblas call, gemm or syrk, and the same bits), taken only where both reach that
    branch: m, n, k >= 2 (no vector special case) and every view BLAS-able (dimensions and
    leading dimensions within ``BLAS_MAXSIZE``; each view has unit stride on one axis and its
    leading dimension, at least that axis's length, on the other). Where op(B)ᵀ and op(A)ᵀ
    are C- or F-contiguous and Cᵀ C-contiguous (the reference-BLAS caller's 1-D buffers,
    F-ordered 2-D arrays, with no padding) numpy.dot with ``out=`` makes that same call
    (``cblas_matrixproduct``: a C-contiguous side untransposed, an F-contiguous one
    transposed, each leading dimension its row length, alpha 1, beta 0; syrk on one buffer
    with one side transposed, as matmul) at ~0.5 µs less than matmul's ufunc machinery (4x4,
    2-core dev host), where it reports floating-point exceptions as matmul does
    (:func:`_dot_reports_like_matmul`: NumPy 2). Otherwise the orientation whose views cost
    fewer steps (:func:`_view_steps`) is taken."""
    if plain is None:
        return None
    va, vb, vc = plain
    swap = use_dot = False
    if min(m, n, k) >= 2 and max(m, n, k, *lds) <= _BLAS_MAXSIZE:
        ta, tb, tc = (_transposed_entry(v) for v in plain)
        isz, csz = itemsizes
        (a_shape, a_strides, b_shape, b_strides, c_shape, c_strides) = views
        use_dot = (_DOT_OUT[0] and _contiguous(b_shape[::-1], b_strides[::-1], isz)
                   and _contiguous(a_shape[::-1], a_strides[::-1], isz)
                   and _contiguous(c_shape[::-1], c_strides[::-1], csz, c_only=True))
        swap = use_dot or (_view_steps(ta) + _view_steps(tb) + _view_steps(tc)
                           < _view_steps(va) + _view_steps(vb) + _view_steps(vc))
        if swap:
            va, vb, vc = tb, ta, tc             # the first operand is op(B)ᵀ, made of b

    def fallback(x, y, z):
        # host.matmul_raising: NumPy 1's errstate, or NumPy 2 with no raising context made in
        # this thread yet or the context entered (a call from a signal handler inside ours)
        try:
            _matmul_raising(x, y, z)
        except FloatingPointError:
            return False
        return True

    in_context = _matmul_raising is _host._matmul_raising_in_context
    raising = _host._raising               # this thread's raising context, run inline
    fn = _DOT if use_dot else np.matmul
    # per view: 0 the array itself, 1 its .T, 2 a reshape, 3 a reshape's .T, 4 an ndarray
    # header, with its shape and strides (written out below: three _plain_view calls cost
    # ~0.25 µs more; a reshape to two ints ~0.05 µs less than to one tuple)
    (kx, sx, dx), (ky, sy, dy), (kz, sz, dz) = (_view_code(v) for v in (va, vb, vc))
    if in_context and swap and kx == ky == kz == 2:
        (rx, cx), (ry, cy), (rz, cz) = sx, sy, sz

        def product(a, b, c):               # 1-D buffers, 'N', 'N': three reshapes
            x, y, z = b.reshape(rx, cx), a.reshape(ry, cy), c.reshape(rz, cz)
            try:
                raising.run(fn, x, y, z)
            except FloatingPointError:
                return False
            except (AttributeError, RuntimeError):
                return fallback(x, y, z)
            return True
        return product
    if in_context and kx in (2, 3) and ky in (2, 3) and kz in (2, 3):
        (rx, cx), (ry, cy), (rz, cz) = sx, sy, sz
        tx, ty, tz = kx == 3, ky == 3, kz == 3

        def product(a, b, c):               # 1-D buffers, a flag 'T': reshapes, a .T or two
            if swap:
                a, b = b, a
            x, y, z = a.reshape(rx, cx), b.reshape(ry, cy), c.reshape(rz, cz)
            if tx:
                x = x.T
            if ty:
                y = y.T
            if tz:
                z = z.T
            try:
                raising.run(fn, x, y, z)
            except FloatingPointError:
                return False
            except (AttributeError, RuntimeError):
                return fallback(x, y, z)
            return True
        return product
    if in_context and not swap and kx == ky == kz == 0:
        def product(a, b, c):               # the arrays are their views
            try:
                raising.run(fn, a, b, c)
            except FloatingPointError:
                return False
            except (AttributeError, RuntimeError):
                return fallback(a, b, c)
            return True
        return product

    def product(a, b, c):
        if swap:
            a, b = b, a
        x = (a if kx == 0 else a.T if kx == 1 else a.reshape(sx) if kx == 2
             else a.reshape(sx).T if kx == 3 else _ND(sx, a.dtype, a, 0, dx))
        y = (b if ky == 0 else b.T if ky == 1 else b.reshape(sy) if ky == 2
             else b.reshape(sy).T if ky == 3 else _ND(sy, b.dtype, b, 0, dy))
        z = (c if kz == 0 else c.T if kz == 1 else c.reshape(sz) if kz == 2
             else c.reshape(sz).T if kz == 3 else _ND(sz, c.dtype, c, 0, dz))
        if not in_context:
            return fallback(x, y, z)
        try:
            raising.run(fn, x, y, z)
        except FloatingPointError:
            return False
        except (AttributeError, RuntimeError):
            return fallback(x, y, z)
        return True
    return product


def _view_code(view) -> tuple:
    """A :attr:`_HostCall.plain` entry as ``(code, shape, strides)`` (:func:`_plain_view`'s
    cases: 0 the array, 1 its .T, 2 a reshape to shape, 3 that reshape's .T, 4 the ndarray
    of shape and strides)."""
    if view is None:
        return 0, None, None
    if view is _TRANSPOSED:
        return 1, None, None
    if view[0] is _ROWS:
        return 2, view[1], None
    if view[0] is _COLUMNS:
        return 3, view[1], None
    return 4, view[0], view[1]


#: scalars a scaled recipe keeps as read-only 0-d arrays of C's type (a few a signature: the
#: alpha and beta a loop repeats; past them a call's scalar is made as compute_views makes it)
_SCALAR_CELLS = 8


def _scaled_product(plain, views: tuple, itemsizes: tuple, m: int, n: int, k: int,
                    lds: tuple, dtype):
    """The recipe of a :attr:`_HostCall.plain` signature's call with other scalars than
    alpha 1 and beta 0, made once per signature: ``(a, b, c, alpha, beta) -> None`` that
    runs :func:`pyblasgemm.backends.host.compute_views`' steps on the plain 2-D views (its
    product into a C-ordered temporary, scaled: ``host.scale_into``), its floating-point
    exceptions reported as the full path reports them (``host.run_scaled``); None where it
    is not plain. ``alpha`` nonzero and ``beta`` in range, as C's type reads them
    (compute_views' ``scalar(alpha)``); ``views``, ``itemsizes``: as :func:`_plain_product`.

    Where op(A) and op(B) are C- or F-contiguous (and m, n, k >= 2, within BLAS's bounds)
    numpy.dot makes the product: without ``out`` it allocates the C-ordered result
    numpy.matmul does and makes the same cblas call (``cblas_matrixproduct``, as for
    :func:`_plain_product`), ~0.45 µs less (4x4, 2-core dev host). The scalars a signature
    repeats are kept as read-only 0-d arrays of C's type (a ufunc takes a 0-d operand ~0.2 µs
    faster than a scalar, and making the scalar costs ~0.35 µs): the value compute_views'
    ``scalar(alpha)`` gives, keyed for complex types by the sign of each part too (complex(2,
    -0.0) == complex(2, 0.0))."""
    if plain is None:
        return None
    isz = itemsizes[0]
    a_shape, a_strides, b_shape, b_strides = views[:4]
    use_dot = (_DOT_OUT[0] and min(m, n, k) >= 2 and max(m, n, k, *lds) <= _BLAS_MAXSIZE
               and _contiguous(a_shape, a_strides, isz) and _contiguous(b_shape, b_strides, isz))
    product = _DOT if use_dot else np.matmul
    (kx, sx, dx), (ky, sy, dy), (kz, sz, dz) = (_view_code(v) for v in plain)
    scalar = dtype.type
    is_complex = dtype.kind == "c"
    cells: dict = {}
    run_scaled = _host.run_scaled

    def cell(value):
        """``value`` as C's type reads it: a kept 0-d array, or the scalar compute_views makes."""
        key = (value, _copysign(1.0, value.real), _copysign(1.0, value.imag)) if is_complex else value
        held = cells.get(key)
        if held is not None:
            return held
        if len(cells) >= _SCALAR_CELLS:
            return scalar(value)
        held = np.array(scalar(value))          # (what compute_views multiplies by)
        held.flags.writeable = False
        cells[key] = held
        return held

    def scaled(a, b, c, alpha, beta):
        # the views written out as in ``product`` above: a shared helper is three more Python
        # calls a hit, on a recipe held to 10x SciPy's ~0.3 µs call
        x = (a if kx == 0 else a.T if kx == 1 else a.reshape(sx) if kx == 2
             else a.reshape(sx).T if kx == 3 else _ND(sx, a.dtype, a, 0, dx))
        y = (b if ky == 0 else b.T if ky == 1 else b.reshape(sy) if ky == 2
             else b.reshape(sy).T if ky == 3 else _ND(sy, b.dtype, b, 0, dy))
        z = (c if kz == 0 else c.T if kz == 1 else c.reshape(sz) if kz == 2
             else c.reshape(sz).T if kz == 3 else _ND(sz, c.dtype, c, 0, dz))
        if is_complex:
            run_scaled(product, x, y, z, None if alpha == 1 else cell(alpha),
                       None if beta == 0 else cell(beta))
            return
        # a real type's kept cells looked up here (a frame less each)
        held_alpha = None if alpha == 1 else cells.get(alpha)
        held_beta = None if beta == 0 else cells.get(beta)
        run_scaled(product, x, y, z,
                   cell(alpha) if held_alpha is None and alpha != 1 else held_alpha,
                   cell(beta) if held_beta is None and beta != 0 else held_beta)
    return scaled


class _HostCall(NamedTuple):
    """A repeated NumPy call of the BLAS form (the host's :class:`pyblasgemm.calls.Call`; also
    the gemm a repeated call of :mod:`pyblasgemm.scipy` ran): the described problem and
    op(A), op(B), C as shapes and byte strides of views of the buffers, so a hit makes at most
    three ndarray headers instead of describing, planning and ``as_strided``, and computes
    what the full path computes."""

    desc: object
    views: tuple            # (shape, strides) of op(A), op(B) (transposed already for 'T' /
                            # 'C') and C with a batch axis of 1, the full path's views, flat:
                            # (a_shape, a_strides, b_shape, b_strides, c_shape, c_strides)
    conj_a: bool            # 'C' on complex data: op(A) is the view's conjugate
    conj_b: bool
    zero: object            # added to the scalars (int -> float, -0.0 -> +0.0), as describe does
    limit: object           # |alpha|, |beta| bound of the routine's scalar type
    plain: tuple | None     # a host.MATMUL_PRODUCTS row, no conjugate: the product is
                            # numpy.matmul on 2-D views (the same bits as the batch-1 views:
                            # one loop of the same strides; with alpha 1, beta 0 into C's);
                            # per operand its (shape, strides), or None where the array itself
                            # is that view, _TRANSPOSED where its .T is, (_COLUMNS, shape) /
                            # (_ROWS, shape) where a 1-D buffer reshaped is (an ndarray header
                            # made: ~0.43 µs at 4x4, a reshape ~0.21 µs and .T ~0.11 µs, the
                            # array itself nothing)
    product: object         # (a, b, c) -> bool: the plain product with alpha 1 and beta 0
                            # (_plain_product's recipe, made once), or None where not plain
    scaled: object          # (a, b, c, alpha, beta) -> None: the plain signature's call
                            # with other scalars (_scaled_product's recipe), or None

    def plain_product(self, a, b, c) -> bool:
        """With alpha 1 and beta 0, where the product is :attr:`plain`: numpy.matmul straight
        into C's view, C unread. False where it is not plain, or raised a floating-point
        exception: the caller then runs the product (:meth:`run`), reported as host.run
        reports it. (:attr:`product` itself, where a hot path has the entry at hand.)"""
        product = self.product
        return False if product is None else product(a, b, c)

    def run(self, a, b, c, alpha, beta) -> None:
        """``c = alpha·op(a)·op(b) + beta·c`` as the described problem's host run computes it,
        on arrays of the shapes and strides it was described on, with the scalars as the
        description holds them (nonzero ``alpha``, both in range), its floating-point
        exceptions reported as host.run reports them (once each, in numpy.matmul's words, at
        the caller's line): on the :attr:`plain` 2-D views where there are, else on the full
        path's."""
        plain = self.plain
        if plain is not None:
            if alpha != 1 or beta != 0:
                self.scaled(a, b, c, alpha, beta)
                return
            va, vb, vc = plain
            opa, opb, cv = _plain_view(a, va), _plain_view(b, vb), _plain_view(c, vc)
        else:
            a_shape, a_strides, b_shape, b_strides, c_shape, c_strides = self.views
            opa = _ND(a_shape, a.dtype, a, 0, a_strides)
            opb = _ND(b_shape, b.dtype, b, 0, b_strides)
            cv = _ND(c_shape, c.dtype, c, 0, c_strides)
            if self.conj_a:
                opa = opa.conj()
            if self.conj_b:
                opb = opb.conj()
        _run_views(self.desc, opa, opb, cv, alpha, beta)


def _host_call(desc, row, zero, limit, a, b, c):
    """The :class:`_HostCall` of a described one-batch NumPy problem on (a, b, c) (a hit's
    arrays have their shapes and strides: the key holds them)."""
    isz, csz = row.ab_dtype.itemsize, row.c_dtype.itemsize

    def view(trans, rows, cols, ld, itemsize):
        if trans == "N":
            return (1, rows, cols), (0, itemsize, ld * itemsize)
        return (1, cols, rows), (0, ld * itemsize, itemsize)      # the stored matrix, transposed

    def plain_view(x, shape, strides):
        view = shape[1:], strides[1:]
        if (x.shape, x.strides) == view:
            return None
        if (x.shape[::-1], x.strides[::-1]) == view:
            return _TRANSPOSED
        if x.ndim == 1 and x.strides == (x.itemsize,) and x.size == shape[1] * shape[2]:
            # a contiguous buffer of the view's size: reshape makes a view of it
            for entry in ((_COLUMNS, view[0][::-1]), (_ROWS, view[0])):
                made = _plain_view(x, entry)
                if (made.shape, made.strides) == view:
                    return entry
        return view

    a_rows, a_cols = desc.a_shape()
    b_rows, b_cols = desc.b_shape()
    conj_a = desc.transa == "C" and row.is_complex
    conj_b = desc.transb == "C" and row.is_complex
    views = (view(desc.transa, a_rows, a_cols, desc.lda, isz)
             + view(desc.transb, b_rows, b_cols, desc.ldb, isz)
             + view("N", desc.m, desc.n, desc.ldc, csz))
    plain = None
    if ((row.prefix, desc.compute) in _host.MATMUL_PRODUCTS and not conj_a and not conj_b
            and not desc.invariant):          # (numpy.matmul's bits depend on the shape)
        plain = (plain_view(a, *views[0:2]), plain_view(b, *views[2:4]),
                 plain_view(c, *views[4:6]))
    flat = tuple(x[1:] for x in views)                 # the 2-D views, no batch axis
    product = _plain_product(plain, flat, (isz, csz), desc.m, desc.n, desc.k,
                             (desc.lda, desc.ldb, desc.ldc))
    scaled = _scaled_product(plain, flat, (isz, csz), desc.m, desc.n, desc.k,
                             (desc.lda, desc.ldb, desc.ldc), row.c_dtype)
    return _HostCall(desc, views, conj_a, conj_b, zero, limit, plain, product, scaled)


#: [whether numpy.dot may stand for numpy.matmul on a hit] (:func:`_dot_reports_like_matmul`:
#: checked once, at import)
_DOT_OUT = [_dot_reports_like_matmul()]


_DOC = """{title}

``C = alpha * op(A) @ op(B) + beta * C`` on column-major memory ({what}).

Parameters
----------
transa, transb : {{'N', 'T', 'C'}} (any case)
    ``op(X) = X``, ``Xᵀ`` or ``Xᴴ``{conj}.
m, n, k : int
    ``op(A)`` is m x k, ``op(B)`` is k x n, ``C`` is m x n.
alpha, beta : {scalar}
    Scalars. ``beta == 0`` writes C without reading it (NaN or Inf in C do not propagate);
    ``alpha == 0`` or ``k == 0`` leaves A and B unread.
a, b, c : numpy.ndarray, cupy.ndarray, or a foreign array
    Buffers holding the matrices column-major from their first element, as a BLAS pointer
    would: 1-D contiguous arrays or F-contiguous 2-D arrays. A and B are {ab}, C is {c}.
    ``c`` is updated in place and must not overlap ``a`` or ``b``. PyTorch tensors, JAX
    arrays and objects with ``__cuda_array_interface__`` or DLPack are run on as views of
    their memory (a CUDA tensor on the GPU, a CPU tensor on the host), ``c`` written in place
    (so a JAX ``c``, immutable, is refused); the BLAS form is not differentiable (for
    gradients use :mod:`pyblasgemm.torch`).
lda, ldb, ldc : int
    Leading dimensions (elements between columns): ``lda >= max(1, m)`` when transa is 'N'
    (else ``>= max(1, k)``), ``ldb >= max(1, k)`` when transb is 'N' (else ``>= max(1, n)``),
    ``ldc >= max(1, m)``.
compute : str, optional
    Accumulation mode: {computes}; any case. The ecosystem's words are aliases where they
    mean one of these: 'ieee' / 'highest' (the type's IEEE mode), 'tf32x3' and 'high'
    (float32 and complex64: '3xtf32').
    Default: {default}.
backend : {{'auto', 'tensorcore', 'cublas', 'host'}}, optional
    Force a backend ('pyblasgemm' is an alias of 'tensorcore', our kernels); by default
    NumPy arrays run on the host, CuPy arrays on the GPU.
autotune : bool, optional
    ``True``: time the planner's best candidates once for this problem and keep the winner
    (in memory and on disk; see :func:`pyblasgemm.tune`). Default: ``PYBLASGEMM_AUTOTUNE``.
stream : optional
    Where the GPU work is enqueued: a CuPy or PyTorch stream, an object with
    ``__cuda_stream__``, or a raw ``cudaStream_t`` int (see :mod:`pyblasgemm.streams`).
    Default: the current stream of the arrays' framework (PyTorch's for CUDA tensors).
    NumPy arrays and CPU tensors run on the host, where it changes nothing.
invariant : bool, optional
    Batch-invariant: each row of C (each of the m) has the same bits whatever m is and
    whatever the other rows of op(A) hold, on any stream and in any run (see
    :mod:`pyblasgemm.planner.invariant`). Default: ``PYBLASGEMM_INVARIANT`` (False).

Returns
-------
c
    The same array, updated.

Raises
------
BlasArgumentError
    A bad flag, size or leading dimension, or a buffer too small, reported like reference
    BLAS's xerbla: ``{name}: parameter 8 (lda=3) must be >= max(1, m) = 5``.
TypeError
    Wrong dtype, non-array buffers, NumPy mixed with CuPy, or arrays on different GPUs.
ValueError
    A buffer that is not contiguous column-major, or ``c`` overlapping ``a`` or ``b``.

Nothing is written to ``c`` when an error is raised.

Examples
--------
{example}
"""

_EXAMPLES = {
    "s": """>>> import numpy as np, pyblasgemm
>>> a = np.asfortranarray([[1., 2.], [3., 4.]], dtype=np.float32)
>>> b = np.eye(2, dtype=np.float32, order='F')
>>> c = np.zeros((2, 2), dtype=np.float32, order='F')
>>> pyblasgemm.sgemm('N', 'N', 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
array([[1., 2.],
       [3., 4.]], dtype=float32)
>>> import torch                                  # a framework's arrays: c written in place
>>> t = torch.tensor([1., 2., 3., 4.]); tc = torch.zeros(4)
>>> pyblasgemm.sgemm('N', 'N', 2, 2, 2, 1.0, t, 2, t, 2, 0.0, tc, 2) is tc, tc
(True, tensor([ 7., 10., 15., 22.]))""",
    "d": """>>> import numpy as np, pyblasgemm
>>> a = np.arange(6, dtype=np.float64)          # a 3 x 2 matrix, column-major, lda = 3
>>> c = np.full(4, np.nan)                       # beta = 0: the NaN are never read
>>> pyblasgemm.dgemm('T', 'N', 2, 2, 3, 1.0, a, 3, a, 3, 0.0, c, 2)
array([ 5., 14., 14., 50.])""",
    "h": """>>> import numpy as np, pyblasgemm
>>> a = np.ones((4, 3), dtype=np.float16, order='F')
>>> b = np.ones((5, 3), dtype=np.float16, order='F')
>>> c = np.ones((4, 5), dtype=np.float16, order='F')
>>> pyblasgemm.hgemm('N', 'T', 4, 5, 3, 2.0, a, 4, b, 5, 1.0, c, 4)[0]
array([7., 7., 7., 7., 7.], dtype=float16)""",
    "b": """>>> import numpy as np, ml_dtypes, pyblasgemm
>>> bf16 = ml_dtypes.bfloat16
>>> a = np.ones(6, dtype=bf16); b = np.ones(6, dtype=bf16); c = np.zeros(4, dtype=bf16)
>>> pyblasgemm.bgemm('N', 'N', 2, 2, 3, 1.0, a, 2, b, 3, 0.0, c, 2)
array([3, 3, 3, 3], dtype=bfloat16)""",
    "i": """>>> import numpy as np, pyblasgemm
>>> a = np.full(6, 100, dtype=np.int8); b = np.full(6, 100, dtype=np.int8)
>>> c = np.ones(4, dtype=np.int32)
>>> pyblasgemm.igemm('N', 'N', 2, 2, 3, 1, a, 2, b, 3, 5, c, 2)
array([30005, 30005, 30005, 30005], dtype=int32)""",
    "sh": """>>> import numpy as np, pyblasgemm
>>> a = np.full(3, 300, dtype=np.float16)       # 300 * 300 * 3 overflows float16, not float32
>>> c = np.full(1, np.nan, dtype=np.float32)     # beta = 0: the NaN is never read
>>> pyblasgemm.shgemm('T', 'N', 1, 1, 3, 1.0, a, 3, a, 3, 0.0, c, 1)
array([270000.], dtype=float32)""",
    "sb": """>>> import numpy as np, ml_dtypes, pyblasgemm
>>> a = np.array([1, 2, 3, 4], dtype=ml_dtypes.bfloat16)   # 2 x 2, column-major
>>> c = np.ones(4, dtype=np.float32)
>>> pyblasgemm.sbgemm('N', 'N', 2, 2, 2, 0.5, a, 2, a, 2, 1.0, c, 2)
array([ 4.5,  6. ,  8.5, 12. ], dtype=float32)""",
    "c": """>>> import numpy as np, pyblasgemm
>>> a = np.array([1j, 2], dtype=np.complex64)   # a 2 x 1 matrix
>>> c = np.zeros(1, dtype=np.complex64)
>>> pyblasgemm.cgemm('C', 'N', 1, 1, 2, 1, a, 2, a, 2, 0, c, 1)   # aᴴ a = |a|²
array([5.+0.j], dtype=complex64)""",
    "z": """>>> import numpy as np, pyblasgemm
>>> a = np.array([1 + 1j], dtype=np.complex128)
>>> c = np.array([1.0], dtype=np.complex128)
>>> pyblasgemm.zgemm('N', 'T', 1, 1, 1, 1j, a, 1, a, 1, 2, c, 1)   # 1j * (1+1j)**2 + 2
array([0.+0.j])""",
}

_TITLES = {
    "s": "Single-precision GEMM (float32).",
    "d": "Double-precision GEMM (float64).",
    "h": "Half-precision GEMM (float16 in and out, float32 accumulation by default).",
    "b": "bfloat16 GEMM (ml_dtypes.bfloat16 in and out, float32 accumulation).",
    "i": "int8 GEMM: int8 A and B, int32 C, integer alpha and beta, int32 accumulation.",
    "sh": ("Mixed-precision GEMM: float16 A and B, float32 C and scalars, float32 accumulation "
           "(cuBLAS's GemmEx with a 32F C; OpenBLAS's shgemm)."),
    "sb": ("Mixed-precision GEMM: bfloat16 A and B, float32 C and scalars, float32 accumulation "
           "(OpenBLAS's and MKL's sbgemm / gemm_bf16bf16f32)."),
    "c": "Single-precision complex GEMM (complex64).",
    "z": "Double-precision complex GEMM (complex128).",
}


class _Missing:
    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()
_PARAMS = ("transa", "transb", "m", "n", "k", "alpha", "a", "lda", "b", "ldb", "beta", "c", "ldc")
#: the routines pyblasgemm.scipy has with SciPy's signature
_SCIPY_FORMS = ("s", "d", "c", "z", "h", "b", "i")


def _signature():
    import inspect

    P = inspect.Parameter
    return inspect.Signature(
        [P(name, P.POSITIONAL_OR_KEYWORD) for name in _PARAMS]
        + [P(name, P.KEYWORD_ONLY, default=None)
           for name in ("compute", "backend", "autotune", "stream", "invariant")])


_SIGNATURE = _signature()


def _missing_message(routine: str, values: tuple) -> str:
    """What a call short of the 13 BLAS arguments is told (SciPy's ``sgemm(alpha, a, b)``
    lands here: its form is pyblasgemm.scipy's)."""
    missing = [name for name, v in zip(_PARAMS, values) if v is _MISSING]
    return _pointed(routine, f"{routine}() missing {len(missing)} required argument"
                             f"{'s' if len(missing) > 1 else ''}: {', '.join(repr(x) for x in missing)}", "")


def _unexpected_message(routine: str, given: dict) -> str:
    """What a call with keywords the BLAS form does not have is told (SciPy's ``trans_a=``,
    ``trans_b=``, ``overwrite_c=`` land here: their form is pyblasgemm.scipy's). Python's own
    words for the first one, then where the signatures are.

    >>> text = _unexpected_message("sgemm", {"trans_a": 1})
    >>> text.split(";")[0]
    "sgemm() got an unexpected keyword argument 'trans_a'"
    >>> text.endswith("use pyblasgemm.scipy.sgemm")
    True
    """
    return _pointed(routine, f"{routine}() got an unexpected keyword argument {next(iter(given))!r}",
                    ", and the keywords compute=, backend=, autotune=, stream=, invariant=")


def _pointed(routine: str, fault: str, keywords: str) -> str:
    """``fault``, then the BLAS form's signature (with ``keywords``) and, for a routine
    pyblasgemm.scipy has, where SciPy's signature lives."""
    text = (f"{fault}; pyblasgemm.{routine} is the reference-BLAS form (transa, transb, m, n, k, "
            f"alpha, a, lda, b, ldb, beta, c, ldc{keywords})")
    if routine[:-4] in _SCIPY_FORMS:
        text += (f". For SciPy's signature ({routine}(alpha, a, b, beta=0, c=None, trans_a=0, "
                 f"...)) use pyblasgemm.scipy.{routine}")
    return text


def _make(prefix: str):
    row = TYPE_ROWS[prefix]

    # every argument has a default so that a short call (SciPy's ``sgemm(alpha, a, b)``) reaches
    # the body and is told where that signature lives; help() shows the real signature
    def xgemm(transa=_MISSING, transb=_MISSING, m=_MISSING, n=_MISSING, k=_MISSING,
              alpha=_MISSING, a=_MISSING, lda=_MISSING, b=_MISSING, ldb=_MISSING, beta=_MISSING,
              c=_MISSING, ldc=_MISSING, *, compute=None, backend=None, autotune=None, stream=None,
              invariant=None, **unexpected):
        if unexpected:      # (SciPy's trans_a= / overwrite_c=: told where that form lives)
            raise TypeError(_unexpected_message(xgemm.__name__, unexpected))
        # the signature's words, as every branch below keys and records them
        words = calls.words(prefix, compute, backend, invariant,
                            (transa, transb, m, n, k, lda, ldb, ldc, type(alpha), type(beta)))
        t = type(a)
        if (t is _CUPY[0] and autotune is None and type(transa) is str
                and type(transb) is str and type(m) is int and type(n) is int
                and type(k) is int and type(lda) is int and type(ldb) is int
                and type(ldc) is int):
            # a repeated CuPy call: its signature maps straight to the launch that ran it
            sig = calls.key(words, a, b, c)
            if sig is not None:
                sig_key, pa, pb, pc = sig      # (not ``k``: that is the routine's k, read below)
                try:
                    # the cache's one dict lookup, as matmul's replay (calls.get: two frames and
                    # a second hash more)
                    call = _peek(sig_key)
                except TypeError:   # an unhashable word (calls.flag's stand-in): the full path
                    call = None
                if call is not None and not calls.overlaps(call, pa, pb, pc):
                    lim = call.limit
                    if -lim <= alpha <= lim and -lim <= beta <= lim and alpha != 0:
                        _recorded.call = call   # a replay counts as recorded (arrays.torch_record)
                        call.run(pa, pb, pc, alpha + call.zero, beta + call.zero,
                                 streams.current() if stream is None else streams.handle(stream))
                        return c
        elif t is _TORCH[0] and autotune is None and type(transa) is str and type(transb) is str:
            # a repeated PyTorch call: the tensors' own attributes make the key (calls.key)
            if arrays.torch_replay(words, a, b, c, stream, alpha, beta) is not None:
                return c
        elif (t is _ND and autotune is None and stream is None
              and type(transa) is str and type(transb) is str and type(m) is int
              and type(n) is int and type(k) is int and type(lda) is int and type(ldb) is int
              and type(ldc) is int):
            # a repeated NumPy call: the key proves flags, sizes, dtypes and that the buffers
            # hold their spans; pointers (overlap), writability and scalar values it cannot
            try:
                # (a key of None, arrays of another kind beside a: no entry either)
                host_call = _peek(calls.key(words, a, b, c)[0])
            except TypeError:       # an unhashable word (compute=[...]): the full path names it
                host_call = None
            # arrays that own their memory are apart unless one is another (three flags reads
            # cost ~0.3 µs, two numpy.may_share_memory calls ~0.4 µs undispatched on the 2-core
            # dev host)
            if host_call is not None and (c_flags := c.flags).writeable and (
                    (c_flags.owndata and c is not a and c is not b and a.flags.owndata
                     and b.flags.owndata)
                    or (not _may_share(c, a) and not _may_share(c, b))):
                if alpha == 1 and beta == 0:
                    product = host_call.product
                    if product is not None and product(a, b, c):
                        return c
                    recipe = host_call.run          # (reported as the full path reports)
                else:                               # the scaled recipe: a frame less
                    recipe = host_call.scaled or host_call.run
                lim = host_call.limit
                if complex_scalars:
                    # each part in range, as describe_blas_checked reads them; complex() as
                    # describe_blas converts them (a float's imaginary part +0.0, a given
                    # complex kept as it is, -0.0 parts too: alpha and beta nonzero here or
                    # beta 0, which is not read)
                    if (alpha != 0 and -lim <= alpha.real <= lim and -lim <= alpha.imag <= lim
                            and -lim <= beta.real <= lim and -lim <= beta.imag <= lim):
                        recipe(a, b, c, complex(alpha), complex(beta))
                        return c
                elif -lim <= alpha <= lim and -lim <= beta <= lim and alpha != 0:
                    recipe(a, b, c, alpha + host_call.zero, beta + host_call.zero)
                    return c
        elif _CUPY[0] is None and calls.cupy_type() is not None:
            _CUPY[0] = calls.cupy_type()
        if (ldc is _MISSING or c is _MISSING or beta is _MISSING or ldb is _MISSING
                or b is _MISSING or lda is _MISSING or a is _MISSING or alpha is _MISSING
                or k is _MISSING or n is _MISSING or m is _MISSING or transb is _MISSING
                or transa is _MISSING):
            raise TypeError(_missing_message(row.routine, (transa, transb, m, n, k, alpha, a, lda,
                                                           b, ldb, beta, c, ldc)))
        if arrays.is_foreign(a, b, c):
            # PyTorch / JAX / CUDA-array-interface buffers: run on views; c is written in place
            if _TORCH[0] is None:
                _TORCH[0] = arrays.torch_type()
            conv = arrays.convert(row.routine, [("a", a), ("b", b), ("c", c)], writes=("c",),
                                  optional_writes=False)
            na, nb, nc = conv.arrays
            calls.forget_last()
            with conv.allocating():
                xgemm(transa, transb, m, n, k, alpha, na, lda, nb, ldb, beta, nc, ldc,
                      compute=compute, backend=backend, autotune=autotune,
                      stream=conv.stream if stream is None else stream, invariant=invariant)
            if (conv.kind == "torch" and conv.gpu and autotune is None and type(transa) is str
                    and type(transb) is str and _plain_word(compute) and _plain_word(backend)
                    and all(type(v) is int for v in (m, n, k, lda, ldb, ldc))):
                arrays.torch_record(words, a, b, c, c)
            return c
        given_stream = stream
        stream = streams.handle(stream)
        given_compute, given_backend = compute, backend
        desc, backend = describe_blas(row, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                      beta, c, ldc, compute, backend)
        if resolve_invariant(row.routine, invariant):
            desc = desc._replace(invariant="m")     # column-major: the rows of C are m
        launch = execute(desc, a, b, c, backend, autotune, stream)
        if (launch is not None and autotune is None and _plain_word(given_compute)
                and _plain_word(given_backend) and type(transa) is str and type(transb) is str
                and type(alpha) in _PLAIN[row.scalar_kind]
                and type(beta) in _PLAIN[row.scalar_kind]):
            # describe_blas proved this signature valid (int dims: checked there)
            key = calls.key(words, a, b, c)[0]
            # spans of the buffers as BLAS reads them (the whole buffers: conservative)
            calls.record(key, launch, False, a, b, c, False, None, zero, limit)
        elif (launch is None and type(a) is _ND and type(b) is _ND and type(c) is _ND
              and autotune is None and given_stream is None and _plain_word(given_compute)
              and _plain_word(given_backend) and type(transa) is str and type(transb) is str
              and type(alpha) in _HOST_SCALARS[row.scalar_kind]
              and type(beta) in _HOST_SCALARS[row.scalar_kind]
              and desc.batch == 1 and not desc.is_noop and not desc.scales_only
              and current_settings().cache):
            plan = plan_for(desc, backend)        # cached: the plan that just ran
            if plan.backend == "host" and not isinstance(plan.launch, CompositeSpec):
                # describe_blas proved this signature valid; the host ran it on views
                calls.put(calls.key(words, a, b, c)[0], _host_call(desc, row, zero, limit, a, b, c))
        return c

    zero = 0 if row.scalar_kind == "int" else 0.0
    limit = _scalar_limit(row)
    complex_scalars = row.scalar_kind == "complex"

    xgemm.__signature__ = _SIGNATURE
    xgemm.__name__ = xgemm.__qualname__ = row.routine
    xgemm.__module__ = "pyblasgemm"
    xgemm.__doc__ = _DOC.format(
        title=_TITLES[prefix], name=row.routine,
        what=f"{row.ab_dtype.name} A and B, {row.c_dtype.name} C",
        conj=" (conjugate transpose)" if row.is_complex else " ('C' means 'T' for real data)",
        scalar={"real": "float", "complex": "complex", "int": "int (int32 range)"}[row.scalar_kind],
        ab=row.ab_dtype.name, c=row.c_dtype.name,
        computes=", ".join(repr(x) for x in row.computes),
        default=repr(row.computes[0]) + (", or what :func:`pyblasgemm.set_default_compute` (or\n"
                                        "    ``PYBLASGEMM_FP32_COMPUTE``) chose" if prefix == "s" else ""),
        example=_EXAMPLES[prefix])
    return xgemm


# typed by one Protocol: c's type in gives it out (pyblasgemm._typing.BlasRoutine)
sgemm: BlasRoutine = _make("s")
dgemm: BlasRoutine = _make("d")
hgemm: BlasRoutine = _make("h")
bgemm: BlasRoutine = _make("b")
igemm: BlasRoutine = _make("i")
cgemm: BlasRoutine = _make("c")
zgemm: BlasRoutine = _make("z")
shgemm: BlasRoutine = _make("sh")
sbgemm: BlasRoutine = _make("sb")
