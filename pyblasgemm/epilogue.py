"""Epilogues: what happens to the product before it is stored.

``gemm`` and ``matmul`` take five keywords that extend ``alpha·op(a)·op(b) + beta·out``:

``bias``
    a vector added to every row (shape ``(n,)`` or ``(1, n)``: one value per column, as in
    ``x @ w + b``) or to every column (shape ``(m, 1)``: one value per row), of the output's
    dtype or the operands' (float32 or the output's for a dequantized int8 product);
``activation``
    a name of :data:`ACTIVATIONS` (the erf GELU, its tanh approximation, relu, silu, ...),
    applied last;
``preactivation_out``
    an array of the output's shape and dtype that receives the value before the activation
    (what a backward pass needs);
``scale_a``, ``scale_b``
    for int8 operands: float32 scales per row of ``op(a)`` (shape ``(m,)``) and per column of
    ``op(b)`` (shape ``(n,)``), or one scalar each; the int32 product is dequantized to
    ``scale_a[i] · scale_b[j] · (op(a) @ op(b))[i, j]`` and the output is float16, bfloat16
    or float32 (``out``'s dtype, or ``matmul``'s ``dtype=``; float32 when neither says).

The order is cuBLASLt's: ``y = act(alpha·dequant(op(a)·op(b)) + beta·out + bias)``, with the
pre-activation value ``alpha·… + bias`` written to ``preactivation_out``. Everything between
the accumulator and the store is computed in the accumulation type (float32 for 16-bit and
int8 operands, the output's type otherwise) and rounded once, so 16-bit results do not round
twice. NaN and Inf propagate as in the unfused sequence (``relu(NaN)`` is NaN).

This module is a leaf (it imports only the array and dtype helpers): the activation table, one row per
activation with its host definition, device code, derivative and PyTorch form; the checks of
the keywords (:func:`check`); and the epilogue a description carries (:class:`EpilogueSpec`,
``GemmDesc.epilogue``). How a call runs is the planner's choice among three routes, priced by
its model and recorded in the plan (``Plan.epilogue``, shown by ``Plan.explain()``;
:func:`last_route` reads the last one): fused in our kernel's store, fused in cuBLASLt's
epilogue (relu and the tanh GELU), or unfused: the planned GEMM into the accumulation type,
then one elementwise pass (NumPy on the host; on a GPU a kernel that includes
``epilogue/activation.cuh``, the device definitions the fused kernels share). Every route
rounds once from the same float32 values.

Example
-------
>>> import numpy as np, pyblasgemm
>>> x = np.array([[1., -2.], [3., 4.]], dtype=np.float32)
>>> w = np.eye(2, dtype=np.float32)
>>> pre = np.empty((2, 2), np.float32)
>>> pyblasgemm.matmul(x, w, bias=np.array([0.5, 0.5], np.float32), activation="relu",
...                   preactivation_out=pre)
array([[1.5, 0. ],
       [3.5, 4.5]], dtype=float32)
>>> pre
array([[ 1.5, -1.5],
       [ 3.5,  4.5]], dtype=float32)
"""
from __future__ import annotations

import math
import threading
from typing import Callable, NamedTuple

import numpy as np

from . import _arrays
from ._types import dtype_text

__all__ = ["ACTIVATIONS", "Activation", "Epilogue", "EpilogueSpec", "EPILOGUE_KEYWORDS", "check",
           "check_activation", "last_route"]

#: the keywords that turn a gemm / matmul call into one with an epilogue
EPILOGUE_KEYWORDS = ("bias", "activation", "preactivation_out", "scale_a", "scale_b")

_SQRT_HALF = 1 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_C = 0.044715


_ERF: list = []


def _erf_function():
    """scipy.special.erf where SciPy is installed (an optional dependency), else
    :func:`_erf_numpy`. Looked up on first use: importing scipy.special costs ~0.3 s."""
    if not _ERF:
        try:
            from scipy.special import erf
        except ImportError:
            erf = _erf_numpy
        _ERF.append(erf)
    return _ERF[0]


def _dd_coefficients(terms: int) -> tuple:
    """(hi, lo) float64 pairs of erf's Taylor coefficients 2/√π·(-1)ⁿ/(n!(2n+1)), exact to
    ~2⁻¹⁰⁶ (from a 50-digit 2/√π in rationals)."""
    from fractions import Fraction

    two_over_sqrt_pi = Fraction("1.1283791670955125738961589031215451716881012586580")
    hi, lo = [], []
    for n in range(terms):
        c = two_over_sqrt_pi * (-1) ** n / (math.factorial(n) * (2 * n + 1))
        h = float(c)
        hi.append(h)
        lo.append(float(c - Fraction(h)))
    return np.array(hi), np.array(lo)


#: |x| below: the Taylor series in double-double (the alternating series loses up to
#: log2(erfi(x)/erf(x)) ≈ 7 bits at 2.5 of its 106); above: 1 - erfc by continued fraction
_ERF_SERIES_END = 2.5
_ERF_TERMS = 48          # 6.25ⁿ/(n!(2n+1)) < 2⁻⁶⁰ from n = 44 on
_ERF_TINY_TERMS = 19     # below 0.84375: 0.712ⁿ/(n!(2n+1)) < 2⁻⁶⁰ from n = 16 on
_TWO_OVER_SQRT_PI_MINUS_1 = 0.12837916709551257390   # correctly rounded, not 1.128… - 1
_ERF_CF_TERMS = 60       # the continued fraction at 2.5: erfc to ~1e-10 relative, 1e-14 of an ulp of erf
_ERF_DD: list = []


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _two_prod(a, b):
    # Dekker: exact a·b = p + e without an FMA (|a|, |b| < 2**996: no overflow in the split)
    p = a * b
    ca, cb = 134217729.0 * a, 134217729.0 * b
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _erf_numpy(x):
    """erf in NumPy, float64-accurate (within 2 ulp of ``math.erf``; tested on a wide grid
    with the tails, NaN, ±Inf and -0.0): the GELU's erf where SciPy is not installed.
    Float16/32 inputs are computed in float64 and rounded once to their type.

    >>> import math, numpy as np
    >>> from pyblasgemm.epilogue import _erf_numpy
    >>> float(_erf_numpy(np.float64(0.5))) == math.erf(0.5)
    True
    >>> _erf_numpy(np.array([-np.inf, -0.0, np.nan, 3.0], np.float32))
    array([-1.       , -0.       ,        nan,  0.9999779], dtype=float32)
    """
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    v = np.abs(x.astype(np.float64))
    out = np.ones_like(v)                     # |x| ≥ 6 and ±Inf: erfc(6) < 2⁻⁵⁴ rounds away
    out[np.isnan(v)] = np.nan
    if not _ERF_DD:
        _ERF_DD.append(_dd_coefficients(_ERF_TERMS))
    chi, clo = _ERF_DD[0]
    tiny = v < 0.84375
    if tiny.any():                            # erf = x + x·r(x²), r small: one rounding dominates
        a = v[tiny]
        y = a * a
        r = np.full_like(a, chi[_ERF_TINY_TERMS - 1])
        for n in range(_ERF_TINY_TERMS - 2, 0, -1):
            r = r * y + chi[n]
        out[tiny] = a + a * (r * y + _TWO_OVER_SQRT_PI_MINUS_1)
    small = (v >= 0.84375) & (v < _ERF_SERIES_END)
    if small.any():
        a = v[small]
        yh, yl = _two_prod(a, a)              # x² exactly
        sh, sl = np.full_like(a, chi[-1]), np.full_like(a, clo[-1])
        for n in range(_ERF_TERMS - 2, -1, -1):   # Horner in x², double-double
            ph, pl = _two_prod(sh, yh)
            pl += sh * yl + sl * yh
            sh, sl = _two_sum(ph, pl)
            th, tl = _two_sum(sh, chi[n])
            tl += sl + clo[n]
            sh, sl = _two_sum(th, tl)
        ph, pl = _two_prod(sh, a)
        out[small] = ph + (pl + sl * a)
    mid = (v >= _ERF_SERIES_END) & (v < 6.0)
    if mid.any():
        a = v[mid]
        t = a.copy()                          # erfc(x)·√π·e^(x²) = 1/(x + ½/(x + 1/(x + 3/2/(x + …))))
        for k in range(_ERF_CF_TERMS, 0, -1):
            t = a + (0.5 * k) / t
        out[mid] = 1.0 - np.exp(-a * a) / (math.sqrt(math.pi) * t)
    out = np.copysign(out, x)                 # odd; keeps -0.0, NaN stays NaN
    return out.astype(dtype, copy=False)


def _gelu(x):
    erf = _erf_function()

    return x * x.dtype.type(0.5) * (x.dtype.type(1) + erf(x * x.dtype.type(_SQRT_HALF)))


def _gelu_tanh(x):
    t = x.dtype.type
    return t(0.5) * x * (t(1) + np.tanh(t(_SQRT_2_OVER_PI) * (x + t(_GELU_C) * x * x * x)))


def _silu(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): x / inf = -0
        return x / (x.dtype.type(1) + np.exp(-x))


def _sigmoid(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): 1 / inf = 0
        return x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))


def _relu(x):
    # x < 0 is False for NaN: NaN stays NaN, as torch.relu keeps it
    return np.where(x < 0, x.dtype.type(0), x)


# The derivatives, on the pre-activation ``p``, written once against a math namespace ``m``
# (exp, tanh, erf, sigmoid, where, ones_like, zeros_like): ``torch`` for pyblasgemm.torch's
# backward, :data:`HOST_MATH` (NumPy) for the host.

def _d_relu(p, m):
    return m.where(p > 0, m.ones_like(p), m.zeros_like(p))     # 0 at 0: PyTorch's convention


def _d_gelu(p, m):
    return 0.5 * (1.0 + m.erf(p * _SQRT_HALF)) + p * m.exp(-0.5 * p * p) * _INV_SQRT_2PI


def _d_gelu_tanh(p, m):
    # y = p/2 · (1 + tanh u), u = √(2/π)(p + c p³): the tanh form's exact derivative
    t = m.tanh(_SQRT_2_OVER_PI * (p + _GELU_C * p * p * p))
    return 0.5 * (1.0 + t) + 0.5 * p * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * p * p)


def _d_silu(p, m):
    s = m.sigmoid(p)
    return s * (1.0 + p * (1.0 - s))


def _d_sigmoid(p, m):
    s = m.sigmoid(p)
    return s * (1.0 - s)


class _HostMath:
    """The namespace the derivatives take, on NumPy arrays (erf from SciPy when installed)."""

    exp, tanh, where = staticmethod(np.exp), staticmethod(np.tanh), staticmethod(np.where)
    ones_like, zeros_like = staticmethod(np.ones_like), staticmethod(np.zeros_like)

    @staticmethod
    def erf(x):
        return _erf_function()(x)

    @staticmethod
    def sigmoid(x):
        return _sigmoid(np.asarray(x))


HOST_MATH = _HostMath()


class Activation(NamedTuple):
    """One activation, the single source of every fact about it: its name, its code in the
    device headers (``case`` of ``pyblasgemm::activate`` in ``epilogue/activation.cuh``), its
    host definition on float32 / float64 arrays, its formula and its derivative's (for the
    docs), the derivative on the pre-activation (``derivative(p, math)``, see
    :data:`HOST_MATH`) and PyTorch's own function of that name (``torch_forward(p, torch)``:
    what :mod:`pyblasgemm.torch` applies and differentiates)."""

    name: str
    code: int
    host: Callable
    formula: str
    derivative: Callable
    derivative_formula: str
    torch_forward: Callable
    nan_inf: str = "as the formula"


#: name -> Activation; the device codes are ``pyblasgemm::Activation`` in activation.cuh
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("relu", 1, _relu, "0 if x < 0 else x", _d_relu,
               "1 where p > 0, else 0 (PyTorch's convention at 0)", lambda p, t: t.relu(p),
               "NaN stays NaN"),
    Activation("gelu", 2, _gelu, "x/2 · (1 + erf(x/√2)) (exact)", _d_gelu,
               "Φ(p) + p·φ(p) = ½(1 + erf(p/√2)) + p·exp(−p²/2)/√(2π)",
               lambda p, t: t.nn.functional.gelu(p)),
    Activation("gelu_tanh", 3, _gelu_tanh, "x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))",
               _d_gelu_tanh, "½(1 + t) + ½·p·(1 − t²)·√(2/π)·(1 + 3·0.044715·p²), "
               "t = tanh(√(2/π)(p + 0.044715 p³))",
               lambda p, t: t.nn.functional.gelu(p, approximate="tanh")),
    Activation("silu", 4, _silu, "x / (1 + exp(-x))", _d_silu, "σ(p)·(1 + p·(1 − σ(p)))",
               lambda p, t: t.nn.functional.silu(p)),
    Activation("sigmoid", 5, _sigmoid, "1 / (1 + exp(-x))", _d_sigmoid, "σ(p)·(1 − σ(p))",
               lambda p, t: t.sigmoid(p)),
)}


def activation_table(kind: str = "definition") -> str:
    """The activations as a reStructuredText table (``kind``: ``'definition'``, the forward
    formulas with their NaN / Inf behaviour; ``'derivative'``, the derivatives): the docs'
    tables are made from :data:`ACTIVATIONS` by this (docs/conf.py), never written by hand.

    >>> print(activation_table("derivative").splitlines()[3])
    ``'none'``      1
    """
    if kind == "definition":
        rows = [(f"``{a.name!r}``", a.formula, a.nan_inf) for a in ACTIVATIONS.values()]
        head = ("``activation=``", "definition", "NaN / ±Inf")
    elif kind == "derivative":
        rows = [("``'none'``", "1")] + [(f"``{a.name!r}``", a.derivative_formula)
                                        for a in ACTIVATIONS.values()]
        head = ("activation", "``act'(p)``")
    else:
        raise ValueError(f"activation_table: kind={kind!r} is not 'definition' or 'derivative'")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    rule = " ".join("=" * w for w in widths)

    def line(cells):
        return " ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([rule, line(head), rule] + [line(r) for r in rows] + [rule])


class Epilogue(NamedTuple):
    """The checked epilogue of one call, in the caller's terms (its arrays are held by the
    call, not here)."""

    bias_axis: str | None          # 'cols' (one value per column: shape (n,)), 'rows' ((m, 1))
    activation: Activation | None
    preactivation: bool
    dequantize: bool               # int8 operands, float output scaled by scale_a / scale_b

    def describe(self) -> str:
        """One line for ``explain()`` and messages, e.g. ``'bias per column, gelu'``."""
        parts = []
        if self.dequantize:
            parts.append("dequantize (scale_a per row, scale_b per column)")
        if self.bias_axis:
            parts.append(f"bias per {self.bias_axis[:-1]}")
        if self.activation:
            parts.append(self.activation.name)
        if self.preactivation:
            parts.append("pre-activation out")
        return ", ".join(parts) or "none"


class EpilogueSpec(NamedTuple):
    """The epilogue of a described problem (``GemmDesc.epilogue``), in the description's
    column-major terms: what the planner prices its routes by. Hashable; part of the plan's key.

    >>> EpilogueSpec("gelu", "n", 16, False, 0).describe()
    'bias per column of the described C, gelu'
    """

    activation: str | None         # a name of ACTIVATIONS
    bias: str | None               # 'm': one value per row of the described C, 'n': per column
    bias_align: int                # the bias pointer's alignment in bytes (<= 16; 0: no bias)
    preactivation: bool            # the value before the activation is written too (at C's offsets)
    pre_align: int                 # its pointer's alignment (0: none)
    dequantize: str | None = None  # int8 products scaled per row / column to this float type
    blocker: str = ""              # why no fused route can take these arrays ('': none)

    @property
    def code(self) -> int:
        """The activation's device code (0: none)."""
        return 0 if self.activation is None else ACTIVATIONS[self.activation].code

    def describe(self) -> str:
        parts = []
        if self.dequantize:
            parts.append(f"int8 dequantized to {self.dequantize}")
        if self.bias:
            parts.append(f"bias per {'row' if self.bias == 'm' else 'column'} of the described C")
        if self.activation:
            parts.append(self.activation)
        if self.preactivation:
            parts.append("pre-activation out")
        return ", ".join(parts) or "none"


def check_activation(routine: str, value) -> Activation | None:
    if value is None:
        return None
    row = ACTIVATIONS.get(value) if isinstance(value, str) else None
    if row is None:
        raise ValueError(f"{routine}: activation={value!r} is not one of "
                         f"{', '.join(map(repr, ACTIVATIONS))} (or None)")
    return row


def _check_vector(routine, name, x, xp_name, length, what):
    if _arrays.array_module_name(x) != xp_name:
        raise TypeError(f"{routine}: {name} must be a {'NumPy' if xp_name == 'numpy' else 'CuPy'} "
                        f"array like the operands, not {type(x).__name__}")
    if x.shape not in ((length,), ()):
        raise ValueError(f"{routine}: {name} must have shape ({length},) ({what}) or be a scalar, "
                         f"got shape {x.shape}")


def check(routine: str, out_shape: tuple, mn: tuple, out_dtype, xp_name: str, bias, activation,
          preactivation_out, scale_a, scale_b, operand_dtype, names=None) -> Epilogue:
    """The Epilogue of a call, or a ValueError / TypeError naming the argument, its value and
    the rule, raised before any work. ``out_shape``: the result's shape; ``mn``: (m, n) of
    the product (1 for a vector operand's missing side, as matmul promotes it). ``names``:
    how the caller's user named the arguments where that is not ``bias``, ``scale_a``...
    (``{'bias': 'b1'}`` for :func:`pyblasgemm.fused_mlp`, ``'bias[2]'`` for a group).

    >>> import numpy as np
    >>> check("fused_mlp", (2, 4), (2, 4), np.float32, "numpy", np.ones(3, np.float32), None,
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


def acc_dtype(out_dtype):
    """The type the epilogue computes in: float32 for 16-bit and dequantized outputs, else the
    output's own."""
    d = np.dtype(out_dtype)
    return np.dtype(np.float32) if d.itemsize == 2 or d.char == "f" else d


# ---------------------------------------------------------------------------------------------
# The route of the last call: a thin reader of its plan (Plan.epilogue, Plan.group)

_last = threading.local()


def note_route(route) -> None:
    """Record how this thread's call with an epilogue ran: the plan's route (an object with a
    ``line``), set where the route runs (``execute``, the unfused pass)."""
    _last.route = route


def last_route() -> str:
    """How this thread's last call with an epilogue (or grouped call) ran, in one line: the
    ``line`` of its plan's route (``Plan.epilogue`` / ``Plan.group``; ``Plan.explain()`` shows
    the priced alternatives), e.g. ``'cuBLASLt epilogue GELU_BIAS (fused in the GEMM)'``.

    >>> import numpy as np, pyblasgemm
    >>> _ = pyblasgemm.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), activation="relu")
    >>> pyblasgemm.epilogue.last_route()
    'host: the product in the accumulation type, then the epilogue in NumPy'
    """
    route = getattr(_last, "route", None)
    return "no call with an epilogue yet" if route is None else route.line
