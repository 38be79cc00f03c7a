"""The type table: one row per BLAS prefix, and the ``compute=`` modes each accepts.

Everything that depends on "which dtype is this routine about" is read from here, so a new
type is one new row, not a search through the code base.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from .kinds import FP8_KINDS, OZAKI, OZAKI_FAST

if TYPE_CHECKING:     # types only (pyblasgemm._typing)
    from ._typing import Fp32Compute

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)
int8 = np.dtype(np.int8)
int32 = np.dtype(np.int32)


@dataclasses.dataclass(frozen=True)
class TypeRow:
    """What a BLAS prefix means: operand dtype, output dtype, scalar kind, compute modes."""

    prefix: str             # 's', 'd', 'h', 'b', 'i', 'c', 'z'; 'sh', 'sb' (16-bit in, float32 out)
    ab_dtype: np.dtype      # dtype of A and B
    c_dtype: np.dtype       # dtype of C
    scalar_dtype: np.dtype  # what alpha and beta are converted to (cuBLAS's scale type)
    computes: tuple         # accepted compute= modes; the first is the default
    #: B's dtype on the rows of an operand pair (the float8 rows: A and B may be e4m3 or e5m2
    #: each), None on the rows of one operand type (B is ``ab_dtype``, as A)
    b_dtype: np.dtype | None = None

    @property
    def scalar_kind(self) -> str:
        """'real', 'complex' or 'int': what alpha and beta may be."""
        return {"f": "real", "c": "complex", "i": "int"}[self.scalar_dtype.kind]

    @property
    def routine(self) -> str:
        return self.prefix + "gemm"

    @property
    def is_complex(self) -> bool:
        return self.scalar_kind == "complex"


TYPE_ROWS = {
    "s": TypeRow("s", float32, float32, float32, ("fp32", "tf32", "3xtf32", "int8-ozaki")),
    "d": TypeRow("d", float64, float64, float64, ("fp64", "int8-ozaki")),
    "h": TypeRow("h", float16, float16, float32, ("fp32", "fp16")),
    "b": TypeRow("b", bfloat16, bfloat16, float32, ("fp32",)),
    "i": TypeRow("i", int8, int32, int32, ("int32",)),
    "c": TypeRow("c", complex64, complex64, complex64, ("fp32", "tf32", "3xtf32", "int8-ozaki")),
    "z": TypeRow("z", complex128, complex128, complex128, ("fp64", "int8-ozaki")),
    # mixed precision, named as OpenBLAS names them: 16-bit A and B, float32 C and scalars,
    # float32 accumulation (the products of 16-bit values are exact in float32)
    "sh": TypeRow("sh", float16, float32, float32, ("fp32",)),
    "sb": TypeRow("sb", bfloat16, float32, float32, ("fp32",)),
}
# The float8 operand pairs, one row per kind of kinds.FP8_KINDS (named as it names them), in the
# description's column-major terms (A is the call's b for a row-major result: c^T = b^T a^T):
# float32 accumulation and scalars, C float32 by default (float16 / bfloat16: the epilogue's
# ``dequantize``, as for int8); the scales are the description's (EpilogueSpec.scales,
# GemmDesc.block_scales). pyblasgemm.fp8.scaled_matmul's products, not gemm's or matmul's.
TYPE_ROWS.update({kind: TypeRow(kind, np.dtype(getattr(ml_dtypes, a)), float32, float32, ("fp32",),
                                np.dtype(getattr(ml_dtypes, b))) for (a, b), kind in FP8_KINDS.items()})
#: the rows of one operand type: the BLAS routines' (``<prefix>gemm``), gemm's and matmul's (the
#: float8 pairs are scaled_matmul's alone)
BLAS_ROWS = {prefix: row for prefix, row in TYPE_ROWS.items() if row.b_dtype is None}


def dtype_text(dtype) -> str:
    """A dtype as messages name it: its name, and for a byte-swapped dtype its code and byte
    order too (``'>f4'`` and ``'<f4'`` are both named float32, and only one is supported: a
    message saying "float32 ... expected float32" would not say what is wrong).

    >>> import numpy as np
    >>> dtype_text(np.float32), dtype_text(np.dtype(">f4"))
    ('float32', "float32 in non-native byte order ('>f4')")
    """
    d = np.dtype(dtype)
    if d.isnative:
        return d.name
    return f"{d.name} in non-native byte order ({d.str!r})"


#: operand dtype -> the type row of that operand type with its own output type (gemm, matmul;
#: not the float8 pairs: scaled_matmul's)
ROW_BY_DTYPE = {row.ab_dtype: row for row in BLAS_ROWS.values() if row.ab_dtype == row.c_dtype
                or row.prefix == "i"}
#: (operand dtype, output dtype) -> type row: gemm's ``out=`` and matmul's ``dtype=`` pick
#: the mixed-precision rows with it
ROW_BY_DTYPES = {(row.ab_dtype, row.c_dtype): row for row in BLAS_ROWS.values()}

# --- package-wide default for compute= -------------------------------------------------------
#: the modes a package-wide float32 default may be (set_default_compute, PYBLASGEMM_FP32_COMPUTE):
#: float32's own less the emulation, which runs only where a call names it (issue 34: the
#: default for float32 stays a native mode; the planner never picks the emulation by itself)
FP32_DEFAULTS = tuple(c for c in TYPE_ROWS["s"].computes if c != "int8-ozaki")
# Only float32 has a real choice of default (IEEE fp32, or the faster tf32 / 3xtf32 modes).
# None until first needed: then ``PYBLASGEMM_FP32_COMPUTE`` (validated by settings.py) or
# what set_default_compute() chose. Not read at import, so a bad value fails on first use.
_default_compute_fp32: str | None = None


def set_default_compute(mode: Fp32Compute) -> None:
    """Set the package-wide default ``compute=`` for float32 problems.

    ``'fp32'`` (the default: IEEE float32 accuracy), ``'tf32'`` or ``'3xtf32'``, in any case,
    or the ecosystem's words for them (:data:`COMPUTE_ALIASES`: ``'ieee'`` and ``'highest'``
    are ``'fp32'``, ``'tf32x3'`` and ``'high'`` are ``'3xtf32'``). The environment variable
    ``PYBLASGEMM_FP32_COMPUTE`` (the same words) sets it until this is called. Other dtypes
    have one sensible default each (fp32 accumulation for 16-bit floats, int32 for int8) and
    are not affected. Repeated calls remembered with no ``compute=`` are forgotten when the
    default changes (the plan cache's call signatures), so the next one runs the new mode.

    Example
    -------
    >>> import pyblasgemm
    >>> pyblasgemm.set_default_compute('tf32')
    >>> pyblasgemm.get_default_compute()
    'tf32'
    >>> pyblasgemm.set_default_compute('HIGH')            # JAX's and torch's word for 3xtf32
    >>> pyblasgemm.get_default_compute()
    '3xtf32'
    >>> pyblasgemm.set_default_compute('fp32')
    """
    global _default_compute_fp32
    row = TYPE_ROWS["s"]
    word = mode.lower() if isinstance(mode, str) else None
    word = compute_aliases("s").get(word, word)
    if word not in FP32_DEFAULTS:
        raise ValueError(
            f"set_default_compute: mode={mode!r} must be one of "
            f"{', '.join(repr(c) for c in FP32_DEFAULTS)} or an alias of one "
            f"({', '.join(f'{a!r}: {w!r}' for a, w in compute_aliases('s').items())}), any case")
    if word != _default_compute_fp32:
        # a call signature remembered without compute= (pyblasgemm.calls) ran the old default
        from .plancache import get_plan_cache

        get_plan_cache().free()
    _default_compute_fp32 = word


def get_default_compute() -> str:
    """The package-wide default ``compute=`` for float32 problems (see :func:`set_default_compute`).

    Example
    -------
    >>> import pyblasgemm
    >>> pyblasgemm.get_default_compute()
    'fp32'
    """
    global _default_compute_fp32
    if _default_compute_fp32 is None:
        from . import settings
        _default_compute_fp32 = settings.get("PYBLASGEMM_FP32_COMPUTE", FP32_DEFAULTS,
                                             compute_aliases("s"))
    return _default_compute_fp32


#: the precision dial's bounds: bits kept per scaled row / column (pyblasgemm.ozaki.MAX_BITS)
OZAKI_BITS = (1, 62)


def _ozaki_dial(row: TypeRow, compute):
    """'int8-ozaki-<bits>', 'int8-ozaki-fast' or 'int8-ozaki-<bits>-fast' normalized, for a
    row with the emulated mode and bits in range; else None.

    >>> _ozaki_dial(TYPE_ROWS["d"], "INT8-OZAKI-040-Fast"), _ozaki_dial(TYPE_ROWS["d"], "int8-ozaki-fast-40")
    ('int8-ozaki-40-fast', None)
    """
    if not isinstance(compute, str) or OZAKI not in row.computes:
        return None
    word = compute.lower()
    if not word.startswith(OZAKI + "-"):
        return None
    words = word[len(OZAKI) + 1:].split("-")
    fast = words[-1] == OZAKI_FAST
    bits = words[:-1] if fast else words
    if bits == [] and fast:
        return f"{OZAKI}-{OZAKI_FAST}"
    if len(bits) != 1 or not (bits[0].isascii() and bits[0].isdigit()) \
            or not OZAKI_BITS[0] <= int(bits[0]) <= OZAKI_BITS[1]:
        return None
    return f"{OZAKI}-{int(bits[0])}" + (f"-{OZAKI_FAST}" if fast else "")


#: the ecosystem's words for our compute modes, one row per alias: alias -> {prefix: mode} (a
#: prefix absent from a row does not take that alias). Resolved by :func:`resolve_compute`, the
#: one place compute names are checked.
_IEEE = {"s": "fp32", "c": "fp32", "d": "fp64", "z": "fp64", "h": "fp32", "b": "fp32",
         "sh": "fp32", "sb": "fp32"}
COMPUTE_ALIASES = {
    "tf32x3": {"s": "3xtf32", "c": "3xtf32"},   # Triton's input_precision spelling
    "ieee": _IEEE,                              # Triton: full IEEE products in the data's type
    "highest": _IEEE,                           # JAX's Precision.HIGHEST, torch's 'highest'
    # JAX's Precision.HIGH (a 3-pass split) and torch's 'high' (TF32 or a split): our split
    "high": {"s": "3xtf32", "c": "3xtf32"},
}


def compute_aliases(prefix: str) -> dict:
    """``{alias: mode}`` of the type row ``prefix``: :data:`COMPUTE_ALIASES` read for one type
    (``PYBLASGEMM_FP32_COMPUTE`` and :func:`set_default_compute` take float32's).

    >>> compute_aliases("d")
    {'ieee': 'fp64', 'highest': 'fp64'}
    """
    return {alias: modes[prefix] for alias, modes in COMPUTE_ALIASES.items() if prefix in modes}


def resolve_compute(row: TypeRow, compute, routine: str) -> str:
    """Turn the user's ``compute=`` (or None) into one of the row's modes, or raise ValueError.

    Any case; the aliases of :data:`COMPUTE_ALIASES` name the row's modes too.

    >>> resolve_compute(TYPE_ROWS["s"], "TF32x3", "sgemm"), resolve_compute(TYPE_ROWS["z"], "highest", "zgemm")
    ('3xtf32', 'fp64')
    """
    if compute is None:
        return get_default_compute() if row.prefix == "s" else row.computes[0]
    if isinstance(compute, str):
        word = compute.lower()
        if word in row.computes:
            return word
        alias = COMPUTE_ALIASES.get(word)
        if alias is not None and row.prefix in alias:
            return alias[row.prefix]
    dial = _ozaki_dial(row, compute)
    if dial is not None:
        return dial
    raise ValueError(
        f"{routine}: compute={compute!r} is not available for {row.ab_dtype.name}; "
        f"choose one of {', '.join(repr(c) for c in row.computes)}"
        + (f" (or 'int8-ozaki-<bits>', bits {OZAKI_BITS[0]}..{OZAKI_BITS[1]}; a last word '-fast' for the "
           f"2-norm scaling: 'int8-ozaki-fast', 'int8-ozaki-<bits>-fast')"
           if "int8-ozaki" in row.computes else ""))


def acc_dtype(out_dtype):
    """The type the epilogue computes in: float32 for 16-bit and dequantized outputs, else the
    output's own.

    >>> acc_dtype(bfloat16), acc_dtype(np.float64)
    (dtype('float32'), dtype('float64'))
    """
    d = np.dtype(out_dtype)
    return np.dtype(np.float32) if d.itemsize == 2 or d.char == "f" else d
