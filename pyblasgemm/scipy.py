"""``scipy.linalg.blas``'s GEMM routines, argument for argument, so that SciPy code ports by
changing the import.

``sgemm(alpha, a, b, beta=0.0, c=None, trans_a=0, trans_b=0, overwrite_c=0)`` and its ``d``,
``c``, ``z`` siblings take every argument SciPy's take, read it as SciPy's f2py wrappers read
it, and answer what SciPy answers: ``alpha·op(a)·op(b) + beta·c`` as a new Fortran-ordered
array of the routine's type, or in ``c`` itself where SciPy updates ``c`` in place. The rules
(the ones SciPy's wrappers follow, checked against SciPy by ``tests/test_scipy_compat.py``):

* ``alpha``, ``beta``: for ``s`` / ``d``, anything ``float()`` reads (so ``'2.5'``, ``b'3'``,
  ``Decimal``, ``Fraction``), the real part of a complex number; for ``c`` / ``z``, Python and
  NumPy numbers, 0-d arrays and NumPy strings (not Python strings); for all, a sequence stands
  for its first item (``[2, 3]`` is 2). Then rounded to the routine's precision (``1e300`` is
  ``inf`` for ``sgemm``). ``beta=None`` is the default, 0.
* ``trans_a``, ``trans_b``: what ``int()`` reads, truncated (``1.9`` is 1, ``'2'`` is 2, ``True``
  is 1), the real part of a complex number, a sequence's first item; ``None`` is 0. Then 0
  (``op(x) = x``), 1 (``xᵀ``) or 2 (``xᴴ``).
* ``overwrite_c``: an integer (what ``operator.index`` takes); nonzero lets ``c`` be written.
* ``a``, ``b``: any array-like NumPy converts to the routine's type (strings of numbers too; a
  complex one for a real routine loses its imaginary part, with NumPy's ComplexWarning). A 1-D
  operand is a column (n x 1; an empty one 1 x 0), a 0-d one 1 x 1, and one with more axes
  loses its length-1 axes, the axes past the first being folded into the columns in Fortran
  order (so ``(1, m, k)`` is m x k).
* ``c``: read the same way for the m x n shape it must have (length-1 axes anywhere, 1-D when n
  is 1, 0-d when m = n = 1), and never for an empty product; the result has ``c``'s own shape.
  Without ``c``, ``c`` is a zero matrix that ``beta`` still scales: a NaN or infinite ``beta``
  gives NaN. ``beta = 0`` never reads ``c``.
* The result is ``c`` itself exactly when ``overwrite_c`` is nonzero and ``c`` is a
  Fortran-contiguous, aligned, native-order array of the routine's type (any shape SciPy reads),
  as SciPy's; otherwise ``c`` is left as it was.
* Refusals have SciPy's exception types and say which argument, by SciPy's name, first
  (``"dgemm: trans_a=3 must be ..."``): ``pyblasgemm.scipy.error`` where SciPy's argument checks fail
  (``trans_*`` out of range, shapes that do not fit), the ``TypeError``, ``ValueError``,
  ``OverflowError`` or ``IndexError`` SciPy's conversions raise otherwise; and they come in
  SciPy's order (``overwrite_c``, ``trans_a``, ``trans_b``, ``alpha``, ``beta``, ``a``, ``b``,
  ``c``).

Where SciPy's answer is not the product, this module differs, on purpose:

* a read-only ``c`` with ``overwrite_c``: SciPy writes into it anyway (its wrapper checks only
  the layout); this returns a new array and leaves ``c`` alone;
* a ``c`` sharing memory with ``a`` or ``b``, with ``overwrite_c``: SciPy hands BLAS aliased
  arguments and returns wrong sums; this computes into a temporary and copies the product into
  ``c``, which it returns as SciPy does;
* ``beta = ±0 + NaN·i``: NaN, as reference BLAS (SciPy's bundled OpenBLAS takes it for 0).

A repeated call on NumPy arrays (the routine, keywords and kinds of argument of an earlier
call, on arrays of its dtypes, shapes and strides: :func:`pyblasgemm.calls.key`) skips the
reading and the checks above and runs again the product its first call ran, with the same
bits and the same refusals: ``sgemm(1.0, a, b)`` at 4x4 costs ~7x SciPy's call, against ~150x
for the first.

Beyond SciPy: the same calls on CuPy arrays (on the GPU, where the planner picks our kernels or
cuBLAS), keyword-only ``backend=`` and ``compute=`` as in :func:`pyblasgemm.sgemm`, and the
types SciPy lacks: ``hgemm`` (float16) and ``bgemm`` (bfloat16), which read every argument as
``sgemm`` does, and ``igemm``: int8 operands, an int32 result. SciPy having no ``igemm``, its
rule is this module's: nothing is wrapped. ``a`` and ``b`` may be any array-like of booleans,
integers or floats whose values are integers in [-128, 127], ``c`` one whose values are
integers in the int32 range, ``alpha`` and ``beta`` integers (what ``operator.index`` takes) in
the int32 range; any other value is refused, named with the bound (a ``ValueError``; a
``TypeError`` for other kinds). The int32 sums themselves wrap modulo 2**32, as cuBLAS's int32
accumulator does.

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
>>> blas.dgemm("0.5", [1, 2], [[3, 4]])              # as SciPy: a 1-D a is a column
array([[1.5, 2. ],
       [3. , 4. ]])
>>> blas.dgemm(1.0, a, a, beta=float("nan"))         # no c: a zero c, which beta scales
array([[nan, nan],
       [nan, nan]])
>>> blas.dgemm(1.0, a, a, trans_a=3)
Traceback (most recent call last):
    ...
pyblasgemm.scipy.error: dgemm: trans_a=3 must be 0 (op(x) = x), 1 (transpose) or 2 (conjugate transpose)
>>> blas.igemm(1, [[300, 1]], [[1], [1]])
Traceback (most recent call last):
    ...
ValueError: igemm: a has the value 300, not an integer in int8's range [-128, 127] (igemm wraps nothing)
"""
from __future__ import annotations

import math
import operator
import struct
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import _arrays, _layout, _strided, calls
from ._layout import may_overlap
from ._types import TYPE_ROWS
from .blas import _host_call
from .desc import INT32_MAX, INT32_MIN, _SCALAR_LIMITS, check_backend
from .gemm import gemm as _gemm
from .planner import plan_for
from .planner.composite import CompositeSpec
from .planner.overrides import current_settings

if TYPE_CHECKING:     # types only
    from ._typing import ScipyRoutine

__all__ = ["sgemm", "dgemm", "cgemm", "zgemm", "hgemm", "bgemm", "igemm"]

#: f2py reads SciPy's integer arguments (trans_*, overwrite_c) into C ints
_C_INT = (-2**31, 2**31 - 1)

#: trans_* values SciPy takes: 0 'N', 1 'T', 2 'C' (cuBLAS's operation values too)
_TRANS = ("N", "T", "C")

#: the scalar types SciPy's wrappers round alpha and beta to with a C cast
_SINGLE = (np.dtype(np.float32), np.dtype(np.complex64))

_ERROR: list = []


def _error_class() -> type:
    """``error``: what SciPy raises as its f2py module's error class. A ValueError, and, where
    SciPy is installed, a subclass of SciPy's class too, so that ``except`` clauses written for
    either catch it. Made on first use: importing ``scipy.linalg`` costs ~0.4 s, which
    ``import pyblasgemm`` should not pay."""
    if not _ERROR:
        bases: tuple = (ValueError,)
        try:
            from scipy.linalg import _fblas
            scipy_error = getattr(_fblas, "__fblas_error", None)   # f2py's name for it
        except Exception:               # no SciPy (or a broken one): a refusal must not fail
            scipy_error = None
        if isinstance(scipy_error, type) and issubclass(scipy_error, Exception):
            bases = (ValueError, scipy_error)
        doc = ("A refusal SciPy raises as its f2py error: trans_* out of range, operand or c "
               "shapes that do not fit. A ValueError (and SciPy's own class, where SciPy is "
               "installed).")
        try:
            cls = type("error", bases, {"__module__": __name__, "__doc__": doc})
        except TypeError:               # a SciPy whose class cannot be combined: ValueError only
            cls = type("error", (ValueError,), {"__module__": __name__, "__doc__": doc})
        _ERROR.append(cls)
    return _ERROR[0]


def __getattr__(name):
    if name == "error":
        return _error_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _like(exc: BaseException, message: str) -> Exception:
    """An exception of ``exc``'s type with our message (SciPy's type, our words)."""
    try:
        return type(exc)(message)
    except Exception:                   # a type that wants other arguments
        return TypeError(message)


# --- scalars, read as f2py reads them (numpy/f2py/cfuncs.py: *_from_pyobj) ---------------

def _is_sequence(x) -> bool:
    # CPython's PySequence_Check: item access, and not a dict
    return not isinstance(x, dict) and hasattr(type(x), "__getitem__")


def _f2py_double(value) -> float:
    """f2py's ``double_from_pyobj``: ``float()``, else a complex number's real part or a
    sequence's first item; raises the innermost failure (its type is what SciPy raises)."""
    try:
        return float(value)
    except Exception:
        if isinstance(value, complex):
            return _f2py_double(value.real)
        if isinstance(value, (str, bytes)) or not _is_sequence(value):
            raise
    return _f2py_double(value[0])


def _f2py_complex(value) -> complex:
    """f2py's ``complex_double_from_pyobj``: complex numbers, NumPy scalars and 0-d arrays (cast
    to complex128), floats and ints, else a sequence's first item (not a string's)."""
    if isinstance(value, complex):
        return complex(value.real, value.imag)
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return complex(np.asarray(value).astype(np.complex128)[()])
    if isinstance(value, float):
        return complex(value, 0.0)
    if isinstance(value, int):
        return complex(float(value), 0.0)         # OverflowError past a double, as SciPy's
    if _is_sequence(value) and not isinstance(value, (str, bytes)):
        return _f2py_complex(value[0])
    raise TypeError(f"{type(value).__name__} is not a number")


def _f2py_int(value) -> int:
    """f2py's ``int_from_pyobj``: ``int()`` (truncating), else a complex number's real part or a
    sequence's first item; then a C int."""
    if not isinstance(value, int):
        try:
            value = int(value)
        except Exception:
            if isinstance(value, complex):
                return _f2py_int(value.real)
            if isinstance(value, (str, bytes)) or not _is_sequence(value):
                raise
            return _f2py_int(value[0])
    v = int(value)
    if not _C_INT[0] <= v <= _C_INT[1]:
        raise OverflowError("Python int too large to convert to C int")
    return v


def _scalar(routine: str, name: str, value, row):
    """alpha / beta by SciPy's rules, rounded to the routine's scalar type (a C cast: past
    float32's range is inf); igemm's by its own (integers in int32 range)."""
    kind = row.scalar_kind
    if kind == "int":
        try:
            v = operator.index(value)
        except TypeError:
            raise TypeError(f"{routine}: {name}={_short(value)} must be an integer (igemm's "
                            f"scalars are int32), not {type(value).__name__}") from None
        if not -2**31 <= v <= 2**31 - 1:
            raise ValueError(f"{routine}: {name}={v} is outside the int32 range "
                             f"[{-2**31}, {2**31 - 1}] of igemm's scalars")
        return v
    if type(value) is float:              # the common case, before the general rules
        v = value
    else:
        try:
            v = _f2py_complex(value) if kind == "complex" else _f2py_double(value)
        except Exception as exc:          # re-raised with SciPy's type, naming the argument
            raise _like(exc, f"{routine}: {name}={_short(value)} can't be converted to "
                             f"{row.scalar_dtype.name} ({exc})") from None
    if row.scalar_dtype in _SINGLE:
        with np.errstate(over="ignore"):
            v = row.scalar_dtype.type(v)
        v = complex(v) if kind == "complex" else float(v)
    return v


def _finite(x) -> bool:
    return math.isfinite(x.real) and math.isfinite(x.imag) if isinstance(x, complex) \
        else math.isfinite(x)


def _trans(routine: str, name: str, value) -> str:
    if value is None:                     # f2py: an optional argument given as None is absent
        return "N"
    try:
        v = _f2py_int(value)
    except Exception as exc:
        raise _like(exc, f"{routine}: {name}={_short(value)} can't be converted to int "
                         f"({exc})") from None
    if not 0 <= v <= 2:
        read = "" if type(value) is int else f" (read as {v})"
        raise _error_class()(f"{routine}: {name}={_short(value)} must be 0 (op(x) = x), 1 "
                             f"(transpose) or 2 (conjugate transpose){read}")
    return _TRANS[v]


def _overwrite(routine: str, value) -> bool:
    # parsed as a C int ("i"): __index__ only, in range
    try:
        v = operator.index(value)
    except TypeError as exc:
        raise TypeError(f"{routine}: overwrite_c={_short(value)} must be an integer "
                        f"({exc})") from None
    if not _C_INT[0] <= v <= _C_INT[1]:
        raise OverflowError(f"{routine}: overwrite_c={v} does not fit a C int "
                            f"[{_C_INT[0]}, {_C_INT[1]}]")
    return v != 0


# --- arrays, shaped as f2py shapes them (numpy/f2py/src/fortranobject.c) ------------------

def _operand_shape(routine: str, name: str, shape: tuple) -> tuple:
    """The matrix f2py reads an operand of this shape as (both dimensions free): 1-D is a
    column (an empty one 1 x 0), 0-d 1 x 1; more axes lose their length-1 axes, those past the
    first being folded into the columns."""
    size = math.prod(shape)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        rows = shape[0] or 1
        return rows, size // rows
    if len(shape) == 2:
        return shape
    long_axes = [d for d in shape if d > 1]
    rows, cols = (long_axes[0] if long_axes else 1), math.prod(long_axes[1:])
    if rows * cols != size:
        raise ValueError(f"{routine}: {name} has shape {shape}, which SciPy's rule cannot read as "
                         f"a matrix (length-1 axes dropped, the axes past the first folded into "
                         f"the columns: an empty array of more than 2 axes has no such matrix)")
    return rows, cols


def _check_c_shape(routine: str, shape: tuple, m: int, n: int) -> None:
    """f2py's reading of c for the m x n it must be (its check_and_fix_dimensions with known
    dimensions, then SciPy's ``shape(c) == (m, n)`` check): length-1 axes may be anywhere, a
    missing trailing axis stands for 1, and a 0 in m x n is taken as 1 (so an empty product
    has no c)."""
    size = math.prod(shape)
    dims = [m, n]
    where = f"{routine}: c has shape {shape}"
    if len(shape) < 2:
        for i, d in enumerate(shape):
            if d > 1 and d != dims[i]:
                raise ValueError(f"{where}: its axis {i} must be {dims[i]} for the {m} x {n} "
                                 f"product")
            dims[i] = dims[i] or 1
        for i in range(len(shape), 2):
            if dims[i] > 1:
                raise ValueError(f"{where}: it has no axis {i}, which must be {dims[i]} for "
                                 f"the {m} x {n} product")
        # the first missing axis takes what is left, a second one is 1
        dims = [1, 1] if len(shape) == 0 else [dims[0], size // dims[0]]
    else:
        long_axes = [d for d in shape if d > 1]
        if len(shape) > 2 and len(long_axes) > 2:
            raise ValueError(f"{where}: {len(long_axes)} axes longer than 1, the product is "
                             f"{m} x {n}")
        given = shape if len(shape) == 2 else long_axes + [1] * (2 - len(long_axes))
        for i, d in enumerate(given):
            if d > 1 and d != dims[i]:
                raise ValueError(f"{where}: its axis {i} must be {dims[i]} for the {m} x {n} "
                                 f"product")
            dims[i] = dims[i] or 1
    if dims[0] * dims[1] != size:
        raise ValueError(f"{where} ({size} elements), the product is {m} x {n}")
    if dims != [m, n]:
        raise _error_class()(f"{where}, the product is {m} x {n}")


def _int_values(routine: str, name: str, x, xp, dtype: np.dtype):
    """igemm's operands (int8) and c (int32): booleans, integers or floats whose values are
    integers in the dtype's range, converted without wrapping; anything else is refused."""
    info = np.iinfo(dtype)
    arr = xp.asarray(x)                   # its own type first: nothing is cast before the check
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{routine}: {name} has dtype {arr.dtype.name}; igemm takes booleans, "
                        f"integers or floats whose values are integers in {dtype.name}'s range "
                        f"[{info.min}, {info.max}]")
    if arr.size and arr.dtype.kind != "b":
        fits = (arr >= info.min) & (arr <= info.max)
        if arr.dtype.kind == "f":
            fits &= arr == xp.floor(arr)                    # NaN fails every comparison
        if not bool(fits.all()):
            bad = arr[~fits].ravel()[0].item()
            raise ValueError(f"{routine}: {name} has the value {bad!r}, not an integer in "
                             f"{dtype.name}'s range [{info.min}, {info.max}] (igemm wraps "
                             f"nothing)")
    return arr.astype(dtype)


def _operand(routine: str, name: str, x, xp, row):
    """a or b as the matrix SciPy's wrapper reads: converted to the operand type (any memory
    order is kept: gemm takes it as it is), then shaped by f2py's rule."""
    if row.prefix == "i":
        arr = _int_values(routine, name, x, xp, row.ab_dtype)
    else:
        try:
            arr = xp.asarray(x, dtype=row.ab_dtype)
        except Exception as exc:          # SciPy's type (NumPy's conversion error), our words
            raise _like(exc, f"{routine}: {name} can't be converted to {row.ab_dtype.name} "
                             f"({exc})") from None
    if arr.ndim != 2:
        arr = arr.reshape(_operand_shape(routine, name, arr.shape), order="F")
    return arr


def _output(routine: str, c, m: int, n: int, xp, row, overwrite: bool, operands):
    """(the array returned, its m x n Fortran view that gemm writes, the array to copy the
    product into afterwards or None) for a given c."""
    shape = getattr(c, "shape", None)
    if isinstance(shape, tuple):          # f2py checks an array's shape before converting it
        _check_c_shape(routine, shape, m, n)
    same_module = _arrays.array_module_name(c) == _arrays.array_module_name(operands[0])
    in_place = (overwrite and same_module and c.dtype == row.c_dtype and c.flags.f_contiguous
                and getattr(c.flags, "aligned", True)
                and _arrays.is_writeable(c))      # SciPy writes a read-only c; we copy it
    if in_place:
        result = c
    elif row.prefix == "i":
        result = _int_values(routine, "c", c, xp, row.c_dtype).copy(order="F")
    else:
        try:
            result = xp.array(c, dtype=row.c_dtype, order="F", copy=True)
        except Exception as exc:
            raise _like(exc, f"{routine}: c can't be converted to {row.c_dtype.name} "
                             f"({exc})") from None
    if not isinstance(shape, tuple):
        _check_c_shape(routine, result.shape, m, n)
    view = xp.asarray(result)             # a NumPy subclass (matrix, masked) as a plain array
    if view.shape != (m, n):
        view = view.reshape((m, n), order="F")       # Fortran-contiguous: a view
    if in_place and any(may_overlap(view, x) for x in operands):
        # c is (part of) a or b: gemm would read what it writes, so the product goes through
        # a temporary (SciPy gives BLAS the aliased arrays, and gets wrong sums)
        return result, xp.array(view, order="F", copy=True), view
    return result, view, None


# --- the repeated call: a call signature (pyblasgemm.calls) of NumPy arrays ----------------

_ND = np.ndarray
_peek = calls.cache.peek
_may_share = _layout.may_share_ndarrays      # (the arrays are exact ndarrays there)


class _Repeat(NamedTuple):
    """What a repeated NumPy call of SciPy's signature runs: the gemm its first call ran on the
    host, on arrays of the same dtypes, shapes and strides (the key's facts), again."""

    host: object            # that gemm's pyblasgemm.blas._HostCall (its operands in its order)
    swap: bool              # it ran as Cᵀ = op(B)ᵀ op(A)ᵀ: on (b, a)
    shape: tuple            # (m, n)
    writable: bool          # c given (of the result's dtype): Fortran-contiguous
    in_place: bool          # c given: written in place (else a Fortran-ordered copy written)


_FLOAT32 = struct.Struct("f")


def _to_float32(v: float) -> float:
    """``float(numpy.float32(v))`` for a number within float32's range: both are C's cast of
    the double to float (struct's native ``'f'``), at a fifth of the cost (~0.1 µs against
    ~0.4 µs on the 2-core dev host).

    >>> _to_float32(0.1) == float(np.float32(0.1)), _to_float32(-3.4028235e38)
    (True, -3.4028234663852886e+38)
    """
    return _FLOAT32.unpack(_FLOAT32.pack(v))[0]


def _reader(row):
    """``read(value)``: a repeated call's alpha or beta (a Python float or int; a complex for
    ``c`` / ``z``) as gemm's description holds it after SciPy's reading (:func:`_scalar`, then
    gemm's ``check_scalar``: rounded to the scalar type, +0 for any zero), or None where more
    than that cast is at stake (past the type's range, NaN, inf: the full path reads it).

    >>> read = _reader(TYPE_ROWS["s"])
    >>> read(0.1), read(-0.0), read(2), read(1e39), read(float("nan"))
    (0.10000000149011612, 0.0, 2.0, None, None)
    >>> _reader(TYPE_ROWS["z"])(-0.0), _reader(TYPE_ROWS["c"])(0.1 + 2j)
    (0j, (0.10000000149011612+2j))
    """
    kind = row.scalar_kind
    if kind == "int":
        return lambda v: v if INT32_MIN <= v <= INT32_MAX else None
    lim = _SCALAR_LIMITS[row.prefix]
    single = row.scalar_dtype in _SINGLE
    if kind == "real":
        def read(v):
            if not -lim <= v <= lim:
                return None
            return (_to_float32(v) if single else float(v)) + 0.0
        return read

    def read_complex(v):
        if type(v) is complex:
            re, im = v.real, v.imag
            if not (-lim <= re <= lim and -lim <= im <= lim):
                return None
        elif not -lim <= v <= lim:
            return None
        else:
            re, im = float(v), 0.0
        v = complex(_to_float32(re), _to_float32(im)) if single else complex(re, im)
        return 0j if v == 0 else v
    return read_complex


#: the scalar types a repeated call takes (others: the full path, every call)
_SCALAR_TYPES = {"real": (float, int), "complex": (float, int, complex), "int": (int,)}
_empty = np.empty


def _target(hit: _Repeat, c, c_dtype, overwrite_c: int, a, b):
    """The array a repeated call with a ``c`` writes, as its first call wrote: ``c`` itself or a
    Fortran-ordered copy of it (what :func:`_output` decides); None where this ``c`` would be
    treated otherwise (read-only or misaligned now, or sharing bytes with ``a`` or ``b``: the
    full path decides exactly)."""
    flags = c.flags
    in_place = overwrite_c != 0 and hit.writable and flags.aligned and flags.writeable
    if in_place != hit.in_place:
        return None
    if in_place:
        # apart, as the full path's exact check would find too: arrays that own their memory
        # unless one is another (three flags reads: ~0.3 µs), else byte ranges apart (two
        # numpy.may_share_memory calls, undispatched: ~0.4 µs); otherwise the full path decides
        if ((flags.owndata and c is not a and c is not b and a.flags.owndata
             and b.flags.owndata) or (not _may_share(c, a) and not _may_share(c, b))):
            return c
        return None
    return np.array(c, dtype=c_dtype, order="F", copy=True)


def _record(sig, host_ran, backend, c, out, result, a, b, given_a, given_b) -> None:
    """After a full call with no temporary: remember it under its key ``sig`` when the gemm it
    made ran on the host as one description (``host_ran``:
    :func:`pyblasgemm._strided.take_unlaunched`'s) on the arrays given (``a`` and ``b`` as
    read are ``given_a`` and ``given_b``: nothing converted) into the result itself (no
    reshaped view)."""
    if (host_ran is None or a is not given_a or b is not given_b or out is not result
            or (c is not None and c.dtype != out.dtype)):      # (a cast c: warnings of its own)
        return
    desc, swapped = host_ran
    if (desc.xp != "numpy" or desc.batch != 1 or desc.is_noop or desc.scales_only
            or not current_settings().cache):
        return
    plan = plan_for(desc, check_backend("gemm", backend))      # cached: the plan that ran
    if plan.backend != "host" or isinstance(plan.launch, CompositeSpec):
        return
    first, second = (b, a) if swapped else (a, b)
    host = _host_call(desc, desc.row, None, None, first, second, out)
    writable = c is not None and c.flags.f_contiguous
    calls.put(sig[0], _Repeat(host, swapped, out.shape, writable, out is c))


def _make(prefix: str):
    row = TYPE_ROWS[prefix]
    routine = prefix + "gemm"
    zero = 0 if row.scalar_kind == "int" else 0.0
    form = "scipy." + routine
    c_dtype = row.c_dtype
    read = _reader(row)
    one_read, zero_read = read(1), read(zero)   # (the common scalars, read once)
    scalar_types = _SCALAR_TYPES[row.scalar_kind]

    def xgemm(alpha, a, b, beta=zero, c=None, trans_a=0, trans_b=0, overwrite_c=0, *,
              backend=None, compute=None):
        sig = None
        if (type(a) is _ND and type(b) is _ND and type(trans_a) is int and type(trans_b) is int
                and type(overwrite_c) is int and type(alpha) in scalar_types
                and type(beta) in scalar_types):
            # a repeated NumPy call: its key proves what SciPy's reading and gemm's checks
            # proved (flags, dtypes, shapes, strides, c's shape); the scalars' values and c's
            # pointer, alignment and writability it cannot (a 4x4 sgemm(1.0, a, b): 110-190
            # µs a call through them, 4-7 µs here on the 2-core dev host; see
            # tests/test_scipy_host_speed.py)
            sig = calls.key(calls.words(form, compute, backend, None,
                                        (trans_a, trans_b, overwrite_c, type(alpha), type(beta))),
                            a, b, c)
            try:
                hit = None if sig is None else _peek(sig[0])
            except TypeError:           # an unhashable word (compute=[...]): the full path names it
                hit = None
            if hit is not None:
                alpha_read = one_read if alpha == 1 else read(alpha)
                beta_read = zero_read if beta == 0 else read(beta)
                # (alpha 0, or one that rounds to 0: C = beta·C, which the full path answers)
                if alpha_read and beta_read is not None:
                    if c is None:         # beta in range, so finite: c need not exist
                        out, beta_read = _empty(hit.shape, c_dtype, order="F"), zero_read
                    else:
                        out = _target(hit, c, c_dtype, overwrite_c, a, b)
                    if out is not None:
                        first, second = (b, a) if hit.swap else (a, b)
                        host = hit.host
                        product = host.product          # (the recipe: no method's frame)
                        if not (alpha_read == 1 and beta_read == 0 and product is not None
                                and product(first, second, out)):
                            host.run(first, second, out, alpha_read, beta_read)
                        return out
        # SciPy's order (its wrapper's): which refusal comes first when several apply
        overwrite = _overwrite(routine, overwrite_c)
        ta = _trans(routine, "trans_a", trans_a)
        tb = _trans(routine, "trans_b", trans_b)
        alpha = _scalar(routine, "alpha", alpha, row)
        beta = zero if beta is None else _scalar(routine, "beta", beta, row)
        xp = _arrays.xp_of("cupy" if _arrays.is_cupy_array(a) else "numpy")
        given_a, given_b = a, b
        a = _operand(routine, "a", a, xp, row)
        b = _operand(routine, "b", b, xp, row)
        m, k = a.shape if ta == "N" else a.shape[::-1]
        kb, n = b.shape if tb == "N" else b.shape[::-1]
        if kb != k:
            side = "rows" if tb == "N" else "columns"
            raise _error_class()(f"{routine}: b has {kb} {side} (op(b) is {kb} x {n}), but "
                                 f"op(a) is {m} x {k}: the inner dimensions must agree "
                                 f"(trans_a={_short(trans_a)}, trans_b={_short(trans_b)})")
        copy_to = None
        if c is None:
            if row.scalar_kind != "int" and not _finite(beta):
                # SciPy's c is then a zero matrix, which a NaN or infinite beta makes NaN
                result = out = xp.zeros((m, n), dtype=row.c_dtype, order="F")
            else:                         # beta * 0 adds nothing: c need not exist
                result = out = xp.empty((m, n), dtype=row.c_dtype, order="F")
                beta = zero
        else:
            result, out, copy_to = _output(routine, c, m, n, xp, row, overwrite, (a, b))
        if sig is not None:
            _strided.take_unlaunched()      # (an older call's, forgotten)
        _gemm(ta, tb, a, b, out=out, alpha=alpha, beta=beta, backend=backend, compute=compute)
        if copy_to is not None:
            copy_to[...] = out
        elif sig is not None:
            _record(sig, _strided.take_unlaunched(), backend, c, out, result, a, b, given_a,
                    given_b)
        return result

    xgemm.__name__ = xgemm.__qualname__ = routine
    kind = row.ab_dtype.name + (f" ({row.c_dtype.name} result)" if row.c_dtype != row.ab_dtype else "")
    rules = ("SciPy's argument rules" if prefix in "sdcz" else
             "sgemm's argument rules" if prefix in "hb" else "its own rule for integers")
    xgemm.__doc__ = (f"c = {routine}(alpha, a, b, beta=0.0, c=None, trans_a=0, trans_b=0, "
                     f"overwrite_c=0): ``scipy.linalg.blas``'s GEMM signature for {kind}, "
                     f"with {rules} (see :mod:`pyblasgemm.scipy`).")
    return xgemm


# typed by one Protocol: NumPy in gives NumPy out, CuPy CuPy (pyblasgemm._typing.ScipyRoutine)
_ROUTINES: dict[str, ScipyRoutine] = {prefix: _make(prefix) for prefix in "sdczhbi"}
sgemm = _ROUTINES["s"]
dgemm = _ROUTINES["d"]
cgemm = _ROUTINES["c"]
zgemm = _ROUTINES["z"]
hgemm = _ROUTINES["h"]
bgemm = _ROUTINES["b"]
igemm = _ROUTINES["i"]
