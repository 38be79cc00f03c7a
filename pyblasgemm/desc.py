"""Validate and describe: every argument check lives here, once, and ends in a ``GemmDesc``.

A ``GemmDesc`` is the whole problem in the column-major BLAS convention that every backend
speaks: ``C = alpha * op(A) @ op(B) + beta * C`` with ``op(A)`` m x k, ``op(B)`` k x n, leading
dimensions in elements, and an optional strided batch. The array forms (``gemm``, ``matmul``)
translate their views into this same description (row-major data becomes the transposed
column-major problem), so backends never see NumPy's or CuPy's strides.
"""
from __future__ import annotations

import math
import operator

import numpy as np
from numbers import Complex, Integral, Real
from typing import NamedTuple

from . import _arrays
from ._types import TYPE_ROWS, TypeRow, bfloat16, dtype_text, resolve_compute
from .epilogue import Epilogue, EpilogueSpec, check_activation
from .kinds import FP8_KINDS
from ._types import resolve_compute as _resolve


def _default_compute(row):
    return _resolve(row, None, row.routine)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

#: accepted values of ``backend=``; 'auto' lets the planner choose (the backends package
#: re-exports it: it is a fact about the argument, checked here)
BACKEND_NAMES = ("auto", "tensorcore", "cublas", "host")
#: other words for a backend, one row per alias (resolved by check_backend): 'pyblasgemm' is
#: how other libraries name "this package's own kernels" (our 'tensorcore')
BACKEND_ALIASES = {"pyblasgemm": "tensorcore"}
# cuBLAS and our kernels take 32-bit sizes and leading dimensions.
MAX_DIM = INT32_MAX


class BlasArgumentError(ValueError):
    """A bad argument to a BLAS-form routine, reported like reference BLAS's ``xerbla``.

    The message names the routine, the 1-based parameter position, the parameter's name and
    value, and the bound it broke, e.g. ``hgemm: parameter 8 (lda=3) must be >= max(1, m) = 5``.
    """

    def __init__(self, routine: str, position: int, name: str, value, requirement: str):
        self.routine, self.position, self.name, self.value = routine, position, name, value
        text = repr(value)
        if len(text) > 60:       # a 400-digit int: its ends and its length say enough
            text = f"{text[:24]}...{text[-8:]} ({len(text)} characters)"
        shown = f"{name}={text}" if value is not None else name
        super().__init__(f"{routine}: parameter {position} ({shown}) {requirement}")


class GemmDesc(NamedTuple):
    """One GEMM problem, validated, in the column-major BLAS convention (immutable, hashable).

    A NamedTuple rather than a frozen dataclass: it is built on every call, and tuple
    construction costs a fraction of a microsecond against several for a frozen dataclass.
    """

    routine: str        # name used in messages ('hgemm', 'gemm', 'matmul')
    prefix: str         # type row: 's', 'd', 'h', 'b', 'i', 'c', 'z'
    compute: str        # resolved compute mode ('fp32', 'tf32', '3xtf32', 'fp16', 'int32', 'fp64')
    transa: str         # 'N', 'T' or 'C' ('C' only for complex types)
    transb: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    batch: int          # number of problems in a strided batch (1 for plain GEMM)
    stride_a: int       # elements between consecutive batch entries (0 = broadcast)
    stride_b: int
    stride_c: int
    xp: str             # 'numpy' or 'cupy'
    device: int         # CUDA device ordinal, -1 on the host
    align: int          # largest power of two (<= 16) dividing every pointer, ld and stride, in bytes
    ptr_align: int      # the same over the pointers alone (a packed copy's leading dimension is ours)
    #: what happens before the store (bias, activation, pre-activation, int8 dequantization):
    #: an :class:`~pyblasgemm.epilogue.EpilogueSpec`, or None for the plain product
    epilogue: object
    #: a grouped problem (many products in one call): a :class:`GroupSpec`, or None
    group: object
    #: batch-invariant along this dimension ('m' or 'n'; '' for an ordinary problem): every
    #: element's bits are the same for any size of it and any batch (planner/invariant.py)
    invariant: str
    #: a float8 product's block scales, applied in the mainloop as each 128-wide K block is
    #: promoted: ``(mode of the described m side, of the n side)``, each one of
    #: kernels.jit.BLOCK_MODE's names ('tensor', 'vector', 'a_blocks': the call's a per 1 x 128
    #: block, 'b_blocks': b per 128 x 128); '' without block scales (they narrow the configs, as
    #: ``invariant`` does; the store's scales are the epilogue's: EpilogueSpec.scales)
    block_scales: object
    #: the call's result is row-major and described as its transpose, c^T = b^T a^T (A is the
    #: call's b): recorded by the float8 description (describe_fp8), whose route names the
    #: call's own operands, orders and bias axis; False for the other forms' descriptions
    swap: bool
    alpha: object       # scalars last: ``key`` drops them, plans do not depend on their values
    beta: object

    @property
    def row(self) -> TypeRow:
        return TYPE_ROWS[self.prefix]

    @property
    def key(self) -> tuple:
        """Everything a plan depends on (all fields but alpha and beta)."""
        return self[:-2]

    @property
    def product(self) -> "GemmDesc":
        """The same problem without its epilogue and group: the GEMM the routes share."""
        return self if self.epilogue is None and self.group is None else self._replace(
            epilogue=None, group=None)

    @property
    def is_noop(self) -> bool:
        """Reference-BLAS quick return: nothing to compute and C keeps its values."""
        return (self.m == 0 or self.n == 0 or self.batch == 0
                or ((self.alpha == 0 or self.k == 0) and self.beta == 1))

    @property
    def scales_only(self) -> bool:
        """alpha == 0 or k == 0: C = beta * C, and A and B are not read."""
        return self.alpha == 0 or self.k == 0

    @property
    def flops(self) -> int:
        """Useful floating-point (or integer) operations: 2·m·n·k per problem (8· for complex)."""
        per_mac = 8 if self.row.is_complex else 2
        return per_mac * self.m * self.n * self.k * self.batch

    def a_shape(self) -> tuple:
        """(rows, cols) of A as stored (column-major)."""
        return (self.m, self.k) if self.transa == "N" else (self.k, self.m)

    def b_shape(self) -> tuple:
        """(rows, cols) of B as stored (column-major)."""
        return (self.k, self.n) if self.transb == "N" else (self.n, self.k)


def describe(routine: str, row: TypeRow, compute: str, transa: str, transb: str, m: int, n: int,
             k: int, lda: int, ldb: int, ldc: int, batch: int, stride_a: int, stride_b: int,
             stride_c: int, xp: str, device: int, pointers: tuple, alpha, beta, *,
             epilogue=None, group=None, invariant="", block_scales="", swap=False, out_dtype=None) -> GemmDesc:
    """The one constructor of a :class:`GemmDesc` from checked values: every form (BLAS, gemm,
    matmul, grouped_matmul, the planner's ``make_desc``) ends here. ``pointers``: (a, b, c)
    addresses, or ``(align,)`` for a description without arrays (the planner's); the alignment
    folds in the leading dimensions and batch strides (in elements; converted to bytes here).
    ``epilogue``: an :class:`~pyblasgemm.epilogue.EpilogueSpec`; ``group``: a :class:`GroupSpec`;
    ``invariant``: the dimension a batch-invariant problem's rows run along ('m' for a
    column-major form, 'n' for a row-major one), '' for an ordinary problem. ``block_scales``,
    ``swap``: a float8 product's (:func:`describe_fp8`); ``out_dtype``: C's type where it is not
    the row's (a float8 product's float16 / bfloat16 result; its ldc is in those elements).

    Example
    -------
    >>> from pyblasgemm._types import TYPE_ROWS
    >>> d = describe("doc", TYPE_ROWS["h"], "fp32", "N", "N", 4, 4, 4, 4, 4, 4, 1, 0, 0, 0,
    ...              "numpy", -1, (0x1000, 0x2000, 0x3008), 1.0, 0.0)
    >>> d.align                                  # C's pointer is 8-byte aligned
    8
    """
    isz = row.ab_dtype.itemsize
    csz = row.c_dtype.itemsize if out_dtype is None else np.dtype(out_dtype).itemsize
    values = (lda * isz, ldb * isz, ldc * csz, stride_a * isz, stride_b * isz, stride_c * csz)
    ptr_align = alignment(*pointers)
    return GemmDesc(routine, row.prefix, compute, transa, transb, m, n, k, lda, ldb, ldc, batch,
                    stride_a, stride_b, stride_c, xp, device, alignment(ptr_align, *values),
                    ptr_align, epilogue, group, invariant, block_scales, swap, alpha, beta)


#: pyblasgemm.fp8.check_scales' layout of each operand's scale -> the mode of the described side
#: it scales: 'tensor' (one value) or 'vector' (one per row / column), in the store
#: (EpilogueSpec.scales) or, with block scales on either side, in the mainloop
#: (GemmDesc.block_scales, kernels.jit.BLOCK_MODE's names: 'a_blocks' 1 x 128, 'b_blocks' 128 x 128)
FP8_SCALE_MODES = {"a": {"tensor": "tensor", "rows": "vector", "blocks": "a_blocks"},
                   "b": {"tensor": "tensor", "cols": "vector", "blocks": "b_blocks"}}
#: result order -> the call's bias axis -> the described C's ('m': one value per row of the described C)
FP8_BIAS_SIDES = {"row": {"cols": "m", "rows": "n", None: None}, "col": {"cols": "n", "rows": "m", None: None}}
#: a float8 product's result types (float32 accumulation, stored in one of these)
FP8_OUT_TYPES = ("float32", "float16", "bfloat16")


def describe_fp8(routine: str, a_dtype, b_dtype, a_layout: tuple, b_layout: tuple, target: str, m: int, n: int,
                 k: int, ldc: int, layouts: tuple, out_dtype, activation: str | None, bias_axis: str | None,
                 preactivation: bool, xp: str, device: int, pointers: tuple, alpha, beta, *,
                 bias_align: int = 16, pre_align: int = 16) -> GemmDesc:
    """The description of a float8 product ``(scale_a ⊙ a) @ (scale_b ⊙ b)``: a (m x k) and b
    (k x n) held as ``a_layout`` / ``b_layout`` (``('row' | 'col', ld)``: ``x[i, j]`` at
    ``i*ld + j`` or ``i + j*ld``), the result stored ``target`` ('row': C-ordered, ``ldc``
    apart; 'col': F-ordered), ``layouts`` what :func:`pyblasgemm.fp8.check_scales` returned.
    In the column-major terms of every description: a row-major result is described as
    ``c^T = b^T a^T`` (``swap``: m is the call's n, A is b, its scales and the bias axis swap
    sides), as the GPU route computes it. The store's scales are ``EpilogueSpec.scales``, block
    scales ``GemmDesc.block_scales``; the output type is the epilogue's ``dequantize``.
    ``pointers``: the (a, b, c) addresses, or ``(align,)``; ``bias_align`` / ``pre_align``:
    the bias' and pre-activation's pointer alignment. The leading dimensions are the call's (the
    kernel's floor, ld >= the rows it stores, is the launch's: kernels.fp8.kernel_lds).

    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e5m2", ("row", 4096), ("col", 4096), "row", 16, 4096,
    ...                  4096, 4096, ("rows", "tensor"), "bfloat16", None, "cols", False, "cupy", 0, (256,), 1.0, 0.0)
    >>> d.prefix, d.transa, d.transb, (d.m, d.n, d.k), d.swap, d.epilogue.scales, d.epilogue.bias
    ('e5m2_e4m3', 'T', 'N', (4096, 16, 4096), True, ('tensor', 'vector'), 'm')
    >>> describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 256), ("col", 256), "col", 16, 48, 256, 16,
    ...              ("blocks", "blocks"), "float32", None, None, False, "cupy", 0, (256,), 1.0, 0.0).block_scales
    ('a_blocks', 'b_blocks')
    """
    names = tuple(d if isinstance(d, str) else np.dtype(d).name for d in (a_dtype, b_dtype))
    if names not in FP8_KINDS:
        raise TypeError(f"{routine}: a float8 product's operands are float8_e4m3fn or float8_e5m2 each; "
                        f"got {names[0]} @ {names[1]}")
    if target not in FP8_BIAS_SIDES:
        raise ValueError(f"{routine}: target={target!r} must be 'row' (C-ordered) or 'col' (F-ordered)")
    for name, held in (("a_layout", a_layout), ("b_layout", b_layout)):
        if held[0] not in ("row", "col"):
            raise ValueError(f"{routine}: {name}={held!r} must be ('row' | 'col', leading dimension)")
    for side, word in zip("ab", layouts):
        if word not in FP8_SCALE_MODES[side]:
            raise ValueError(f"{routine}: the scale_{side} layout {word!r} must be one of "
                             f"{', '.join(map(repr, FP8_SCALE_MODES[side]))} (fp8.check_scales')")
    out_name = out_dtype if isinstance(out_dtype, str) else np.dtype(out_dtype).name
    if out_name not in FP8_OUT_TYPES:
        raise TypeError(f"{routine}: a float8 product's result is {', '.join(FP8_OUT_TYPES)}; got {out_name}")
    if bias_axis not in FP8_BIAS_SIDES[target]:
        raise ValueError(f"{routine}: bias_axis={bias_axis!r} must be 'cols', 'rows' or None")
    swap = target == "row"
    (la, lda), (lb, ldb) = a_layout, b_layout
    if swap:        # c^T (n x m, column-major) = b^T a^T: the described A is b (K-major when b is column-major)
        kind, km, kn = FP8_KINDS[names[::-1]], n, m
        ta, lda, tb, ldb = ("T" if lb == "col" else "N"), ldb, ("N" if la == "row" else "T"), lda
    else:           # c (m x n, column-major) = a b
        kind, km, kn = FP8_KINDS[names], m, n
        ta, tb = ("T" if la == "row" else "N"), ("N" if lb == "col" else "T")
    modes = (FP8_SCALE_MODES["a"][layouts[0]], FP8_SCALE_MODES["b"][layouts[1]])
    modes = modes[::-1] if swap else modes              # (the described m side's, the n side's)
    blocked = "blocks" in layouts       # then every side is promoted per 128-wide K block; the store scales nothing
    axis = FP8_BIAS_SIDES[target][bias_axis]
    epilogue = EpilogueSpec(activation, axis, bias_align if axis else 0, bool(preactivation),
                            pre_align if preactivation else 0, out_name, scales=() if blocked else modes)
    return describe(routine, TYPE_ROWS[kind], "fp32", ta, tb, km, kn, k, lda, ldb, ldc, 1, 0, 0, 0, xp, device,
                    pointers, alpha, beta, epilogue=epilogue, block_scales=modes if blocked else "", swap=swap,
                    out_dtype=bfloat16 if out_name == "bfloat16" else np.dtype(out_name))


class GroupSpec(NamedTuple):
    """A grouped problem (``GemmDesc.group``): many independent products of one type in one
    call, each in the description's column-major terms (``outᵀ = op(B)ᵀ op(A)ᵀ`` for the
    row-major user arrays: a problem's m is the user's n). The description's own m, n, k are
    the largest problem's; ``batch`` is the number of problems.

    >>> GroupSpec("experts", ((64, 3, 32), (64, 0, 32)), 16, 16, "").live
    1
    """

    form: str               # 'list' (a list of problems) or 'experts' (rows of a split by offsets)
    sizes: tuple            # (m, n, k) of each problem, in order
    ab_align: int           # alignment of every operand pointer and leading dimension (bytes, <= 16)
    c_align: int            # the same over the outputs
    blocker: str            # why the arrays keep the group off our one-launch kernel ('': none)
    device_sizes: bool = False  # the expert form with its sizes on the GPU (the sizes are nominal)

    @property
    def live(self) -> int:
        """Problems with something to compute (m and n > 0)."""
        return sum(1 for m, n, _ in self.sizes if m and n)


def matrix_span(rows: int, cols: int, ld: int) -> int:
    """Elements a column-major rows x cols matrix with leading dimension ld reaches, first to last."""
    return 0 if rows == 0 or cols == 0 else ld * (cols - 1) + rows


def alignment(*values: int) -> int:
    """Largest power of two <= 16 dividing every value (byte addresses, byte strides)."""
    acc = 16
    for v in values:
        acc |= v
    return acc & -acc   # the lowest set bit of the OR is the smallest power dividing them all


# ---------------------------------------------------------------------------------------------
# Scalar and flag checks, shared by every form
# ---------------------------------------------------------------------------------------------

def check_trans(routine: str, position: int, name: str, value, row: TypeRow) -> str:
    """'N' / 'T' / 'C' in any case; 'C' means 'T' for real types."""
    flag = value.upper() if isinstance(value, str) else None
    if flag not in ("N", "T", "C"):
        raise BlasArgumentError(routine, position, name, value, "must be one of 'N', 'T', 'C'")
    if flag == "C" and not row.is_complex:
        return "T"
    return flag


def check_dim(routine: str, position: int, name: str, value) -> int:
    if type(value) is int and 0 <= value <= MAX_DIM:   # the common case, without the index dance
        return value
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{routine}: parameter {position} ({name}={value!r}) must be an integer, "
                        f"not {type(value).__name__}") from None
    if v < 0:
        raise BlasArgumentError(routine, position, name, v, "must be >= 0")
    if v > MAX_DIM:
        raise BlasArgumentError(routine, position, name, v, f"must be <= {MAX_DIM}")
    return v


#: cupy.cublas.gemm's flags beside reference BLAS's: 'H' for the conjugate transpose, and the
#: cublasOperation_t values 0 (N), 1 (T), 2 (C)
_GEMM_FLAGS = {"N": "N", "T": "T", "C": "C", "H": "C", 0: "N", 1: "T", 2: "C"}


def check_gemm_flag(routine: str, position: int, name: str, value, row: TypeRow) -> str:
    """A flag of the pythonic ``gemm``: 'N' / 'T' / 'C' / 'H' in any case, or CuPy's integer
    operations 0 / 1 / 2 (``CUBLAS_OP_N/T/C``); 'C' and 'H' mean 'T' for real types.

    Example
    -------
    >>> from pyblasgemm._types import TYPE_ROWS
    >>> check_gemm_flag("gemm", 1, "transa", "h", TYPE_ROWS["z"]), check_gemm_flag("gemm", 1, "transa", 2, TYPE_ROWS["s"])
    ('C', 'T')
    """
    key = value.upper() if isinstance(value, str) else value if type(value) is int else None
    flag = _GEMM_FLAGS.get(key)
    if flag is None:
        raise BlasArgumentError(routine, position, name, value,
                                "must be one of 'N', 'T', 'C', 'H' or 0, 1, 2")
    return "T" if flag == "C" and not row.is_complex else flag


def _scalar_value(value):
    """A 0-d NumPy or CuPy array as its Python scalar (cupy.cublas.gemm accepts them); anything
    else unchanged. A CuPy scalar is copied to the host here, once per call."""
    if getattr(value, "shape", None) == () and _arrays.array_module_name(value) is not None:
        return value.item()
    return value


#: the largest finite alpha / beta per real or complex type row (its scalar type's maximum)
_SCALAR_LIMITS = {p: float(np.finfo(r.scalar_dtype).max) for p, r in TYPE_ROWS.items()
                  if r.scalar_dtype.kind in "fc"}


def check_scalar(routine: str, position: int, name: str, value, row: TypeRow):
    """alpha / beta as a Python number of the routine's kind, representable in its scalar
    type (``row.scalar_dtype``: float32 for the single-precision and 16-bit routines, as
    cuBLAS's scale type). Infinity and NaN given as such are kept (IEEE values, as in BLAS);
    a finite value that would overflow is a :class:`BlasArgumentError`.

    Example
    -------
    >>> from pyblasgemm._types import TYPE_ROWS
    >>> check_scalar("sgemm", 6, "alpha", 10**39, TYPE_ROWS["s"])
    Traceback (most recent call last):
        ...
    pyblasgemm.desc.BlasArgumentError: sgemm: parameter 6 (alpha=1000000000000000000000000000000000000000) is outside the float32 range of sgemm's scalars (|alpha| <= 3.4028234663852886e+38)
    """
    kind = row.scalar_kind
    t = type(value)
    if kind == "real" and (t is float or t is int):   # the common case, before the ABC checks
        try:
            v = float(value) + 0.0          # + 0.0 turns -0.0 into +0.0 (see the end)
        except OverflowError:
            v = math.inf                    # named below
        if abs(v) <= _SCALAR_LIMITS[row.prefix]:
            return v
    value = _scalar_value(value)
    if kind == "int":
        if isinstance(value, Integral) and not isinstance(value, bool):
            v = int(value)
            if not INT32_MIN <= v <= INT32_MAX:
                raise BlasArgumentError(routine, position, name, v,
                                        f"must be in the int32 range [{INT32_MIN}, {INT32_MAX}]")
            return v
        raise TypeError(f"{routine}: parameter {position} ({name}={value!r}) must be an integer "
                        f"(int32 scalars for int8 GEMM), not {type(value).__name__}")
    if kind == "real" and not isinstance(value, Real):
        raise TypeError(f"{routine}: parameter {position} ({name}={value!r}) must be a real "
                        f"number for {row.ab_dtype.name} data, not {type(value).__name__}")
    if kind == "complex" and not isinstance(value, Complex):
        raise TypeError(f"{routine}: parameter {position} ({name}={value!r}) must be a number, "
                        f"not {type(value).__name__}")
    limit = _SCALAR_LIMITS[row.prefix]
    try:
        v = float(value) if kind == "real" else complex(value)
    except (OverflowError, ValueError, TypeError) as exc:
        # a Python int beyond a double, or a number type that cannot be converted
        raise BlasArgumentError(routine, position, name, value,
                                f"cannot be converted to {row.scalar_dtype.name} ({exc})") from None
    for part in ((v,) if kind == "real" else (v.real, v.imag)):
        if math.isfinite(part) and abs(part) > limit:
            raise BlasArgumentError(routine, position, name, value,
                                    f"is outside the {row.scalar_dtype.name} range of "
                                    f"{row.routine}'s scalars (|{name}| <= {limit!r})")
    if v == 0:
        # -0.0 equals 0 in Python, but cuBLAS reads C unless beta's bits are zero (measured:
        # dgemm with beta = -0.0 turned NaN in C into NaN): every zero is +0 from here on
        v = 0.0 if kind == "real" else 0j
    return v


def check_backend(routine: str, backend) -> str | None:
    if backend is None:
        return None
    if isinstance(backend, str):
        word = backend.lower()
        if word in BACKEND_NAMES:
            return word
        if word in BACKEND_ALIASES:
            return BACKEND_ALIASES[word]
    raise ValueError(f"{routine}: backend={backend!r} must be one of "
                     f"{', '.join(repr(b) for b in BACKEND_NAMES)}")


def check_backend_place(routine: str, backend: str | None, xp: str, name: str = "backend") -> None:
    """A forced backend runs where the arrays are: 'host' on NumPy arrays, the GPU backends on
    CuPy arrays. Checked for every call, the degenerate ones (k = 0, alpha = 0) included.
    ``name``: what forced it, for the message (``'PYBLASGEMM_BACKEND'`` when the environment
    did: the user who set it passed no ``backend=``).

    >>> check_backend_place("gemm", "cublas", "numpy", name="PYBLASGEMM_BACKEND")
    Traceback (most recent call last):
        ...
    ValueError: gemm: PYBLASGEMM_BACKEND='cublas' runs on CuPy arrays, but the arrays are NumPy arrays
    """
    if backend is None or backend == "auto":
        return
    on_host = xp == "numpy"
    if on_host != (backend == "host"):
        wanted = "NumPy" if backend == "host" else "CuPy"
        got = "NumPy" if on_host else "CuPy"
        raise ValueError(f"{routine}: {name}={backend!r} runs on {wanted} arrays, "
                         f"but the arrays are {got} arrays")


def check_same_place(routine: str, named_arrays) -> tuple:
    """All arrays NumPy, or all CuPy on one device. Returns (xp name, device)."""
    first_name, first = named_arrays[0]
    xp, dev = _arrays.array_module_name(first), _arrays.device_id(first)
    for name, arr in named_arrays[1:]:
        other = _arrays.array_module_name(arr)
        if other != xp:
            raise TypeError(f"{routine}: {first_name} is a {xp} array but {name} is a {other} "
                            f"array; pass all arrays from one library (NumPy or CuPy)")
        if _arrays.device_id(arr) != dev:
            raise TypeError(f"{routine}: {first_name} is on GPU {dev} but {name} is on GPU "
                            f"{_arrays.device_id(arr)}; all arrays must be on one device")
    return xp, dev


def ranges_overlap(x0: int, x_bytes: int, y0: int, y_bytes: int) -> bool:
    """Whether [x0, x0 + x_bytes) and [y0, y0 + y_bytes) intersect (empty ranges never do)."""
    return x_bytes > 0 and y_bytes > 0 and x0 < y0 + y_bytes and y0 < x0 + x_bytes


# ---------------------------------------------------------------------------------------------
# The raw BLAS form
# ---------------------------------------------------------------------------------------------

# 1-based parameter positions of xgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
_POS = dict(transa=1, transb=2, m=3, n=4, k=5, alpha=6, a=7, lda=8, b=9, ldb=10, beta=11, c=12,
            ldc=13)


def _check_buffer(routine, name, x, row_dtype, rows, cols, ld, ld_name, writable=False):
    pos = _POS[name]
    if _arrays.array_module_name(x) is None:
        raise TypeError(f"{routine}: parameter {pos} ({name}) must be a NumPy or CuPy array, "
                        f"not {type(x).__name__}")
    if x.dtype != row_dtype:
        raise TypeError(f"{routine}: parameter {pos} ({name}) has dtype {dtype_text(x.dtype)}; "
                        f"expected {row_dtype.name}")
    layout_ok = ((x.ndim == 1 and (x.size <= 1 or x.strides[0] == x.dtype.itemsize))
                 or (x.ndim == 2 and x.flags.f_contiguous))
    if not layout_ok:
        raise ValueError(
            f"{routine}: parameter {pos} ({name}) must be a contiguous 1-D buffer or an "
            f"F-contiguous (column-major) 2-D array holding the matrix from its first element; "
            f"got a {x.ndim}-D array with shape {x.shape} and strides {x.strides}")
    if writable and not _arrays.is_writeable(x):
        raise ValueError(f"{routine}: parameter {pos} ({name}) is read-only but is written")
    need = matrix_span(rows, cols, ld)
    if x.size < need:
        raise BlasArgumentError(
            routine, pos, name, None,
            f"holds {x.size} elements, but a {rows} x {cols} column-major matrix with "
            f"{ld_name}={ld} needs {ld_name}*({cols}-1)+{rows} = {need}")
    return need


# Flags as the fast path accepts them, per scalar kind ('C' is 'T' for real data)
_REAL_FLAGS = {"N": "N", "n": "N", "T": "T", "t": "T", "C": "T", "c": "T"}
_COMPLEX_FLAGS = {"N": "N", "n": "N", "T": "T", "t": "T", "C": "C", "c": "C"}
_FAST_SCALARS = {"real": (float, int), "complex": (complex, float, int), "int": (int,)}


def describe_blas(row: TypeRow, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                  compute, backend):
    """Check the arguments of ``<prefix>gemm`` in reference-BLAS order and describe the problem.

    Returns ``(GemmDesc, backend)``. Raises before any work; nothing is written to ``c`` on
    error. A call whose arguments are all plainly valid (Python ints and floats, contiguous
    buffers of the right dtype, no overlap) is described without the per-argument checks,
    which cost more than the GEMM itself for small problems; anything else, and every error,
    goes through :func:`describe_blas_checked`, the one place the rules and messages live.
    """
    flags = _COMPLEX_FLAGS if row.is_complex else _REAL_FLAGS
    ta, tb = flags.get(transa), flags.get(transb)
    kinds = _FAST_SCALARS[row.scalar_kind]
    t = type(a)
    if (ta is None or tb is None or compute is not None or backend is not None
            or type(m) is not int or type(n) is not int or type(k) is not int
            or type(lda) is not int or type(ldb) is not int or type(ldc) is not int
            or type(alpha) not in kinds or type(beta) not in kinds
            or type(b) is not t or type(c) is not t or t not in _arrays.ARRAY_TYPES):
        return describe_blas_checked(row, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                                     c, ldc, compute, backend)
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    span_a = 0 if a_rows == 0 or a_cols == 0 else lda * (a_cols - 1) + a_rows
    span_b = 0 if b_rows == 0 or b_cols == 0 else ldb * (b_cols - 1) + b_rows
    span_c = 0 if m == 0 or n == 0 else ldc * (n - 1) + m
    isz, csz = row.ab_dtype.itemsize, row.c_dtype.itemsize
    if not (0 <= m <= MAX_DIM and 0 <= n <= MAX_DIM and 0 <= k <= MAX_DIM
            and max(1, a_rows) <= lda <= MAX_DIM and max(1, b_rows) <= ldb <= MAX_DIM
            and max(1, m) <= ldc <= MAX_DIM
            and a.dtype == row.ab_dtype and b.dtype == row.ab_dtype and c.dtype == row.c_dtype
            and a.ndim == 1 and b.ndim == 1 and c.ndim == 1
            and a.strides[0] == isz and b.strides[0] == isz and c.strides[0] == csz
            and a.size >= span_a and b.size >= span_b and c.size >= span_c
            and (t is not np.ndarray or c.flags.writeable)):
        return describe_blas_checked(row, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                                     c, ldc, compute, backend)
    if t is np.ndarray:
        pa, pb, pc = (x.__array_interface__["data"][0] for x in (a, b, c))
        dev = dev_b = dev_c = -1
    else:
        mem_a, mem_b, mem_c = a.data, b.data, c.data
        pa, pb, pc = mem_a.ptr, mem_b.ptr, mem_c.ptr
        dev, dev_b, dev_c = mem_a.device_id, mem_b.device_id, mem_c.device_id
    bytes_c = span_c * csz
    if (dev_b != dev or dev_c != dev
            or (span_a and bytes_c and pc < pa + span_a * isz and pa < pc + bytes_c)
            or (span_b and bytes_c and pc < pb + span_b * isz and pb < pc + bytes_c)
            or (row.scalar_kind == "int" and not (INT32_MIN <= alpha <= INT32_MAX
                                                   and INT32_MIN <= beta <= INT32_MAX))):
        return describe_blas_checked(row, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                                     c, ldc, compute, backend)
    if row.scalar_kind != "int":
        convert = float if row.scalar_kind == "real" else complex
        try:
            sa, sb = convert(alpha), convert(beta)
        except OverflowError:      # an int beyond a double: the checked path names it
            sa = sb = math.inf
        limit = _SCALAR_LIMITS[row.prefix]
        if not (abs(sa) <= limit and abs(sb) <= limit):   # also NaN / inf: rare, checked
            return describe_blas_checked(row, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                         beta, c, ldc, compute, backend)
        # -0.0 becomes +0.0 (see check_scalar: cuBLAS reads C for beta = -0.0)
        alpha, beta = (sa if sa != 0 else sa * 0 + 0), (sb if sb != 0 else sb * 0 + 0)
    return describe(row.routine, row, _default_compute(row), ta, tb, m, n, k, lda, ldb, ldc, 1,
                    0, 0, 0, _arrays.ARRAY_TYPES[t], dev, (pa, pb, pc), alpha, beta), None


def describe_blas_checked(row: TypeRow, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta,
                          c, ldc, compute, backend):
    """Every rule of the BLAS form, checked in reference-BLAS parameter order, with messages."""
    r = row.routine
    ta = check_trans(r, 1, "transa", transa, row)
    tb = check_trans(r, 2, "transb", transb, row)
    m = check_dim(r, 3, "m", m)
    n = check_dim(r, 4, "n", n)
    k = check_dim(r, 5, "k", k)
    alpha = check_scalar(r, 6, "alpha", alpha, row)
    nrowa = m if ta == "N" else k
    nrowb = k if tb == "N" else n
    lda = check_dim(r, 8, "lda", lda)
    if lda < max(1, nrowa):
        raise BlasArgumentError(r, 8, "lda", lda, f"must be >= max(1, {'m' if ta == 'N' else 'k'})"
                                                  f" = {max(1, nrowa)}")
    ldb = check_dim(r, 10, "ldb", ldb)
    if ldb < max(1, nrowb):
        raise BlasArgumentError(r, 10, "ldb", ldb, f"must be >= max(1, {'k' if tb == 'N' else 'n'})"
                                                   f" = {max(1, nrowb)}")
    beta = check_scalar(r, 11, "beta", beta, row)
    ldc = check_dim(r, 13, "ldc", ldc)
    if ldc < max(1, m):
        raise BlasArgumentError(r, 13, "ldc", ldc, f"must be >= max(1, m) = {max(1, m)}")
    compute = resolve_compute(row, compute, r)
    backend = check_backend(r, backend)

    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    span_a = _check_buffer(r, "a", a, row.ab_dtype, a_rows, a_cols, lda, "lda")
    span_b = _check_buffer(r, "b", b, row.ab_dtype, b_rows, b_cols, ldb, "ldb")
    span_c = _check_buffer(r, "c", c, row.c_dtype, m, n, ldc, "ldc", writable=True)
    xp, dev = check_same_place(r, [("a", a), ("b", b), ("c", c)])
    pa, pb, pc = _arrays.data_ptr(a), _arrays.data_ptr(b), _arrays.data_ptr(c)
    isz, csz = row.ab_dtype.itemsize, row.c_dtype.itemsize
    for name, p, span in (("a", pa, span_a), ("b", pb, span_b)):
        if ranges_overlap(pc, span_c * csz, p, span * isz):
            raise ValueError(f"{r}: c overlaps {name} in memory; C must not alias A or B "
                             f"(pass a separate output buffer)")
    return describe(r, row, compute, ta, tb, m, n, k, lda, ldb, ldc, 1, 0, 0, 0, xp, dev,
                    (pa, pb, pc), alpha, beta), backend


# ---------------------------------------------------------------------------------------------
# The array forms' result type and epilogue keywords (matmul, gemm, Matmul, grouped, fused_mlp, fp8)

def numpy_result(routine: str, a_dtype, b_dtype, dtype=None, out=None) -> tuple:
    """``(loop dtype, result dtype)`` of ``numpy.matmul(a, b, dtype=dtype, out=out)`` for
    operands of these dtypes, by NumPy's own rule (asked on empty stand-ins: no work); where
    NumPy refuses ``dtype=`` or ``out``, a TypeError naming it, with NumPy's reason (a float
    product is not cast to an integer or bool type). ``dtype=bfloat16`` has no NumPy loop at
    all (ml_dtypes' bfloat16 products are float32): it is taken as an ``out`` of that type is,
    NumPy's product cast to it (refused from complex operands).

    >>> import numpy as np
    >>> numpy_result("matmul", np.dtype(np.int16), np.dtype(np.int16), dtype=np.int64)
    (dtype('int64'), dtype('int64'))
    >>> numpy_result("matmul", np.dtype(np.float32), np.dtype(np.float32), dtype=np.uint8)
    Traceback (most recent call last):
        ...
    TypeError: matmul: dtype=uint8 is refused for float32 @ float32, as numpy.matmul refuses it (Cannot cast ufunc 'matmul' input 0 from dtype('float32') to dtype('uint8') with casting rule 'same_kind')
    """
    cell_a, cell_b = np.empty((1, 0), a_dtype), np.empty((0, 1), b_dtype)
    loop = np.matmul(cell_a, cell_b).dtype     # (dtypes NumPy cannot multiply raise here)
    if dtype is None and out is None:
        return loop, loop
    try:
        want = np.dtype(dtype) if dtype is not None else out.dtype
    except TypeError as exc:
        raise TypeError(f"{routine}: dtype={dtype!r} is not a dtype ({exc})") from None
    try:
        if dtype is not None and want.name != "bfloat16":
            return np.matmul(cell_a, cell_b, dtype=want).dtype, want
        np.matmul(cell_a, cell_b, out=np.empty((1, 1), want))
        return loop, want
    except TypeError as exc:        # numpy's UFuncTypeError (a TypeError): casting refused
        what = f"dtype={want.name} is" if dtype is not None else f"out has dtype {want.name},"
        raise TypeError(f"{routine}: {what} refused for {np.dtype(a_dtype).name} @ "
                        f"{np.dtype(b_dtype).name}, as numpy.matmul refuses it ({exc})") from None


def _check_vector(routine, name, x, xp_name, length, what):
    if _arrays.array_module_name(x) != xp_name:
        raise TypeError(f"{routine}: {name} must be a {'NumPy' if xp_name == 'numpy' else 'CuPy'} "
                        f"array like the operands, not {type(x).__name__}")
    if x.shape not in ((length,), ()):
        raise ValueError(f"{routine}: {name} must have shape ({length},) ({what}) or be a scalar, "
                         f"got shape {x.shape}")


def check_epilogue(routine: str, out_shape: tuple, mn: tuple, out_dtype, xp_name: str, bias, activation,
          preactivation_out, scale_a, scale_b, operand_dtype, names=None) -> Epilogue:
    """The Epilogue of a call, or a ValueError / TypeError naming the argument, its value and
    the rule, raised before any work. ``out_shape``: the result's shape; ``mn``: (m, n) of
    the product (1 for a vector operand's missing side, as matmul promotes it). ``names``:
    how the caller's user named the arguments where that is not ``bias``, ``scale_a``...
    (``{'bias': 'b1'}`` for :func:`pyblasgemm.fused_mlp`, ``'bias[2]'`` for a group).

    >>> import numpy as np
    >>> check_epilogue("fused_mlp", (2, 4), (2, 4), np.float32, "numpy", np.ones(3, np.float32), None,
    ...       None, None, None, np.float32, names={"bias": "b1"})
    Traceback (most recent call last):
        ...
    ValueError: fused_mlp: b1 has shape (3,); it must be (4,) or (1, 4) (one value per column of the (2, 4) output) or (2, 1) (one per row)
    """
    names = {"bias": "bias", "preactivation_out": "preactivation_out", "scale_a": "scale_a",
             "scale_b": "scale_b", **(names or {})}
    act = check_activation(routine, activation)
    m, n = mn
    bias_axis = None
    if bias is not None:
        name = names["bias"]
        if _arrays.array_module_name(bias) != xp_name:
            raise TypeError(f"{routine}: {name} must be a {'NumPy' if xp_name == 'numpy' else 'CuPy'} "
                            f"array like the operands, not {type(bias).__name__}")
        # the output's dtype, or the operands' (bfloat16 @ bfloat16 is float32 in NumPy, and
        # a bfloat16 bias is what a bfloat16 layer has), or float32 for a dequantized product
        allowed = {np.dtype(out_dtype)}
        allowed.add(np.dtype(np.float32) if np.dtype(operand_dtype) == np.int8 else np.dtype(operand_dtype))
        if bias.dtype not in allowed:
            raise TypeError(f"{routine}: {name} has dtype {dtype_text(bias.dtype)}; it must have the "
                            f"output's dtype or the operands' "
                            f"({' or '.join(sorted(d.name for d in allowed))})")
        if bias.shape in ((n,), (1, n)):
            bias_axis = "cols"
        elif bias.shape == (m, 1):
            bias_axis = "rows"
        else:
            raise ValueError(f"{routine}: {name} has shape {bias.shape}; it must be ({n},) or (1, {n}) "
                             f"(one value per column of the {out_shape} output) or ({m}, 1) (one "
                             f"per row)")
    if preactivation_out is not None:
        name = names["preactivation_out"]
        if _arrays.array_module_name(preactivation_out) != xp_name:
            raise TypeError(f"{routine}: {name} must be an array of the operands' kind")
        if preactivation_out.shape != tuple(out_shape) or preactivation_out.dtype != out_dtype:
            raise ValueError(f"{routine}: {name} has shape {preactivation_out.shape} and "
                             f"dtype {dtype_text(preactivation_out.dtype)}; it must have the "
                             f"output's, {tuple(out_shape)} and {np.dtype(out_dtype).name}")
        if not _arrays.is_writeable(preactivation_out):
            raise ValueError(f"{routine}: {name} is read-only")
    dequant = scale_a is not None or scale_b is not None
    if dequant:
        if np.dtype(operand_dtype) != np.int8:
            raise TypeError(f"{routine}: {names['scale_a']} / {names['scale_b']} dequantize int8 "
                            f"products; the operands are {np.dtype(operand_dtype).name}")
        if scale_a is None or scale_b is None:
            raise ValueError(f"{routine}: dequantizing needs both {names['scale_a']} (per row of "
                             f"op(a)) and {names['scale_b']} (per column of op(b)); got only "
                             f"{names['scale_a'] if scale_b is None else names['scale_b']}")
        for key, x, length, what in (("scale_a", scale_a, m, "one per row of op(a)"),
                                     ("scale_b", scale_b, n, "one per column of op(b)")):
            _check_vector(routine, names[key], x, xp_name, length, what)
            if x.dtype != np.float32:
                raise TypeError(f"{routine}: {names[key]} must be float32, got {dtype_text(x.dtype)}")
        if np.dtype(out_dtype).char not in ("e", "f") and np.dtype(out_dtype).name != "bfloat16":
            raise TypeError(f"{routine}: a dequantized int8 product is float16, bfloat16 or float32, "
                            f"not {np.dtype(out_dtype).name}")
    elif np.dtype(operand_dtype) == np.int8 and (bias is not None or act is not None):
        raise TypeError(f"{routine}: {names['bias']} and activation on int8 operands need "
                        f"dequantization ({names['scale_a']}= and {names['scale_b']}=): the int32 "
                        f"product has no float scale")
    if act is not None and np.dtype(out_dtype).kind == "c":
        raise TypeError(f"{routine}: activation={act.name!r} is for real outputs, not "
                        f"{np.dtype(out_dtype).name}")
    return Epilogue(bias_axis, act, preactivation_out is not None, dequant)
