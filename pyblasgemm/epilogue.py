"""Epilogues: what happens to the product before it is stored.

``gemm`` and ``matmul`` take five keywords that extend ``alpha·op(a)·op(b) + beta·out``:

``bias``
    a vector added to every row (shape ``(n,)`` or ``(1, n)``: one value per column, as in
    ``x @ w + b``) or to every column (shape ``(m, 1)``: one value per row), of the output's
    dtype or the operands' (float32 or the output's for a dequantized int8 product);
``activation``
    ``'relu'``, ``'gelu'`` (exact, with erf), ``'gelu_tanh'`` (the tanh approximation) or
    ``'silu'`` or ``'sigmoid'``, applied last;
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

How it runs (:func:`last_route` says which): on a GPU, fused in our Hopper kernel's store
when the plan runs it (16-bit operands; :func:`_kernel_fused`), else fused in cuBLASLt where it
has the epilogue (relu, the tanh GELU), else unfused: the product in the accumulation type
(float32 for 16-bit operands, int32 for int8) by the planned GEMM, then one pass that applies
the epilogue (NumPy on the host; on a GPU one elementwise kernel that includes
``epilogue/activation.cuh``, the device definitions the fused kernel shares). Every route
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
import sys
import threading
from typing import Callable, NamedTuple

import numpy as np

from . import _arrays, streams

__all__ = ["ACTIVATIONS", "Activation", "Epilogue", "EPILOGUE_KEYWORDS"]

#: the keywords that turn a gemm / matmul call into one with an epilogue
EPILOGUE_KEYWORDS = ("bias", "activation", "preactivation_out", "scale_a", "scale_b")

_SQRT_HALF = 1 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


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
    return t(0.5) * x * (t(1) + np.tanh(t(_SQRT_2_OVER_PI) * (x + t(0.044715) * x * x * x)))


def _silu(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): x / inf = -0
        return x / (x.dtype.type(1) + np.exp(-x))


def _sigmoid(x):
    with np.errstate(over="ignore"):     # exp(-x) = inf for x < -88 (float32): 1 / inf = 0
        return x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x))


def _relu(x):
    # x < 0 is False for NaN: NaN stays NaN, as torch.relu keeps it
    return np.where(x < 0, x.dtype.type(0), x)


class Activation(NamedTuple):
    """One activation: its name, its code in the device headers (``activation.cuh``), and
    its host definition on float32 / float64 arrays."""

    name: str
    code: int
    host: Callable
    formula: str


#: name -> Activation; the device codes are ``pyblasgemm::Activation`` in activation.cuh
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("relu", 1, _relu, "0 if x < 0 else x (NaN stays NaN)"),
    Activation("gelu", 2, _gelu, "x/2 · (1 + erf(x/√2))"),
    Activation("gelu_tanh", 3, _gelu_tanh, "x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))"),
    Activation("silu", 4, _silu, "x / (1 + exp(-x))"),
    Activation("sigmoid", 5, _sigmoid, "1 / (1 + exp(-x))"),
)}


class Epilogue(NamedTuple):
    """The checked epilogue of one call (its arrays are held by the call, not here)."""

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
    from ._types import dtype_text

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


def apply(epi: Epilogue, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out):
    """``out[...] = act(v)`` (and ``preactivation_out[...] = v``) with ``v = t + bias``, where
    ``t`` holds ``alpha·op(a)·op(b) + beta·out`` in :func:`acc_dtype`, a (..., m, n) array;
    when dequantizing, ``t`` is the int32 product and ``v = alpha·scale_a·scale_b·t +
    beta·c_old + bias`` (``beta`` None: C not read). Runs where ``t`` lives. An integer or
    bool ``t`` (an integer result: NumPy's product, wrapped as its loop wraps) is summed and
    activated exactly (:func:`_apply_integer`) and cast to ``out``'s type last."""
    if t.dtype.kind in "iub" and not epi.dequantize:
        return _apply_integer(epi, t, bias, preactivation_out, out)
    if _arrays.array_module_name(t) == "numpy":
        return _apply_host(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out)
    from .kernels.epilogue_ops import apply_device

    return apply_device(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out)


def _apply_host(epi, t, alpha, beta, c_old, bias, scale_a, scale_b, preactivation_out, out):
    wide = np.float64 if t.dtype == np.float64 else (t.dtype.type if t.dtype.kind == "c" else np.float32)
    v = t
    if epi.dequantize:
        v = np.float32(alpha) * (scale_a.reshape(-1, 1) * scale_b.reshape(-1) * t.astype(np.float32))
    if beta is not None:
        v = v + wide(beta) * c_old.astype(wide)
    if bias is not None:
        b = bias.astype(wide)
        v = v + (b.reshape(-1, 1) if epi.bias_axis == "rows" else b.reshape(-1))
    v = np.asarray(v, dtype=wide)
    if preactivation_out is not None:
        preactivation_out[...] = v.astype(preactivation_out.dtype)
    if epi.activation is not None:
        v = epi.activation.host(v)
    out[...] = v.astype(out.dtype)
    return out


def _apply_integer(epi, t, bias, preactivation_out, out):
    """The epilogue of an integer or bool result, before its cast (a cast first turned a
    product of -23 into 233 for a uint8 result, and relu kept it): ``v = t + bias`` in 64-bit
    integers (uint64 for a uint64 product), relu on them exactly, the other activations in
    float64 (truncated back to integers as ``astype`` truncates), then one cast to ``out``'s
    type, wrapping as NumPy's ``astype`` does."""
    xp = _arrays.xp_of(_arrays.array_module_name(t))
    wide = np.uint64 if t.dtype == np.uint64 else np.int64
    v = t.astype(wide)
    if bias is not None:
        b = bias.astype(wide)
        v += b.reshape(-1, 1) if epi.bias_axis == "rows" else b.reshape(-1)
    if preactivation_out is not None:
        preactivation_out[...] = v.astype(preactivation_out.dtype)
    if epi.activation is not None and epi.activation.name == "relu":
        v = xp.where(v < 0, v.dtype.type(0), v)
    elif epi.activation is not None:
        f = v.astype(np.float64)
        only = Epilogue(None, epi.activation, False, False)
        v = apply(only, f, None, None, None, None, None, None, None, xp.empty_like(f)).astype(wide)
    out[...] = v.astype(out.dtype)
    return out


class _Route(threading.local):
    last = "no call with an epilogue yet"


_route = _Route()
#: how the unfused calls run, by where the arrays live
_UNFUSED = {"numpy": "host: the product in the accumulation type, then the epilogue in NumPy",
            "cupy": "GPU: the planned GEMM into the accumulation type, then one elementwise "
                    "epilogue pass (not fused)"}


def last_route() -> str:
    """How this thread's last call with an epilogue ran, in one line (what ``explain()`` says
    of a plan, for epilogues), e.g. ``'cuBLASLt epilogue GELU_BIAS (fused in the GEMM)'``.

    >>> import numpy as np, pyblasgemm
    >>> _ = pyblasgemm.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), activation="relu")
    >>> pyblasgemm.epilogue.last_route()
    'host: the product in the accumulation type, then the epilogue in NumPy'
    """
    return _route.last


#: cublasLtEpilogue_t codes by name, for the route's description
_LT_NAMES = {4: "BIAS", 2: "RELU", 6: "RELU_BIAS", 32: "GELU", 36: "GELU_BIAS", 160: "GELU_AUX",
             164: "GELU_AUX_BIAS"}


def _fused(routine, row, compute, ta, tb, a, b, c, alpha, beta, epi, bias, pre, fresh_c, backend,
           autotune, stream):
    """Run ``c = act(alpha·op(a)·op(b) + beta·c + bias)`` (and the pre-activation) as one
    launch when the arrays allow it (2-D, no copies, the bias contiguous in C's dtype, the
    pre-activation in C's layout and its own memory). Returns the :class:`_FusedCall` that ran
    (for the call-signature fast path), or None: the unfused route is the caller's.

    Which launch: the plan's. When it picks our Hopper kernel (wgmma consumers, 16-bit
    operands), that kernel with the epilogue in its store (:func:`_kernel_fused`); otherwise
    cuBLASLt's epilogue where cuBLASLt has this one (:func:`_lt_fused`: relu and the tanh GELU,
    bias along D's rows); where cuBLAS is planned and cuBLASLt lacks the epilogue, our kernel
    again if the model puts it below cuBLAS plus the unfused pass. Each is one pass over C where
    the unfused route makes three (the float32 product written, read back, the result written)."""
    if backend is None:       # PYBLASGEMM_BACKEND, as the planner reads it
        from .planner.overrides import current_settings

        route = current_settings().backend
    else:
        route = backend
    if row is None or route not in ("auto", "cublas", "tensorcore") or epi.dequantize or a.ndim != 2 \
            or b.ndim != 2 or a.dtype != row.ab_dtype or b.dtype != row.ab_dtype or c.dtype != row.c_dtype:
        return None             # (matmul of mixed dtypes: the planned path converts)
    if type(alpha) not in (int, float) or type(beta) not in (int, float) or alpha == 0:
        return None             # the planned path checks and answers these
    m, n = c.shape
    k = a.shape[1] if ta == "N" else a.shape[0]
    if m == 0 or n == 0 or k == 0:
        return None
    from ._layout import may_overlap

    widen = None
    if bias is not None and bias.dtype != c.dtype and bias.dtype.itemsize == 2 and c.dtype == np.float32:
        # a 16-bit bias (the operands' type) for a float32 result: widened exactly, n elements
        # (one small cast beside the fused call instead of the unfused route's passes)

        widen = c.dtype
        with streams.on(None if stream is None else streams.handle(stream)):
            bias = bias.astype(widen)
    if bias is not None and (bias.dtype != c.dtype or not bias.flags.c_contiguous):
        return None             # both launches read the bias contiguously, in C's type
    if pre is not None and (pre.strides != c.strides or may_overlap(pre, c)):
        return None             # the pre-activation is written at C's offsets
    from ._strided import _fast_desc
    from ._types import resolve_compute

    fast = _fast_desc(routine, row, resolve_compute(row, compute, routine), ta, tb, a, b, c, alpha,
                      beta, 1, (0, 0, 0), m, n, k, fresh_c)
    if fast is None:
        return None
    desc, first, second, swapped = fast
    # the user's columns are the description's m index when C was described transposed
    bias_axis = None if bias is None else ("m" if (epi.bias_axis == "cols") == swapped else "n")

    sptr = streams.current() if stream is None else streams.handle(stream)
    ptrs = (_arrays.data_ptr(first), _arrays.data_ptr(second), _arrays.data_ptr(c),
            0 if bias is None else _arrays.data_ptr(bias), 0 if pre is None else _arrays.data_ptr(pre))
    # our kernel reads the bias in pairs of elements: a pointer aligned to a pair
    ours = route in ("auto", "tensorcore") and ptrs[3] % (2 * c.itemsize) == 0
    ran = _kernel_fused(desc, epi, bias_axis, ptrs, backend, autotune, sptr) if ours else None
    if ran is None and route in ("auto", "cublas"):
        ran = _lt_fused(desc, epi, bias_axis, ptrs, sptr)
    if ran is None and ours and route == "auto":
        # cuBLAS planned and cuBLASLt has no such epilogue: our fused kernel when the model
        # says it beats cuBLAS plus the unfused pass
        ran = _kernel_fused(desc, epi, bias_axis, ptrs, backend, autotune, sptr, over_cublas=True)
    if ran is None:
        return None
    launch, lt = ran
    return _FusedCall(launch, lt, swapped, desc.alpha, desc.beta, _route.last, widen)


class _FusedCall(NamedTuple):
    """A fused epilogue call as it ran: what a repeated call with the same signature replays."""

    launch: object      # our Sm90Launch (bias=, pre= keywords) or cuBLASLt's (positional)
    lt: bool
    swap: bool          # operands in the description's order: (b, a)
    alpha: object       # the description's typed scalars
    beta: object
    route: str          # last_route()'s line
    widen: object       # the dtype a 16-bit bias is cast to first (float32 results), or None

    def __call__(self, pa, pb, pc, pbias, ppre, sptr) -> None:
        first, second = (pb, pa) if self.swap else (pa, pb)
        if self.lt:
            self.launch(first, second, pc, self.alpha, self.beta, sptr, pbias, ppre)
        else:
            self.launch(first, second, pc, self.alpha, self.beta, sptr, bias=pbias, pre=ppre)
        _route.last = self.route


def _unfused_pass_s(desc, arch) -> float:
    """The model's time of the unfused route's extra work: the float32 product written and
    read back, the result written (bytes at DRAM bandwidth), and one more launch (~5 µs
    measured between back-to-back launches on an H100)."""
    return desc.m * desc.n * desc.batch * (4 + 4 + desc.row.c_dtype.itemsize) / arch.dram_bw + 5e-6


def _kernel_fused(desc, epi, bias_axis, ptrs, backend, autotune, sptr, over_cublas=False):
    """The plan's own Hopper kernel with the epilogue in its store, when the plan picks one
    that takes it (:func:`pyblasgemm.kernels.launch.fusable`). ``over_cublas``: the plan
    picked cuBLAS; take our kernel's best plan when its predicted time is below cuBLAS's plus
    :func:`_unfused_pass_s` (H100, 4096³ bias + GELU: 0.236 ms fused against 0.284 ms for
    cuBLAS and the pass). (launch, False) if it ran, else None."""
    from .planner import plan_for
    from .plancache import get_plan_cache

    kw = {} if autotune is None else dict(autotune=autotune)
    plan = plan_for(desc, backend, **kw)
    if over_cublas:
        if plan.backend != "cublas" or plan.predicted_s is None or plan.arch is None:
            return None
        try:
            ours = plan_for(desc, "tensorcore", **kw)
        except NotImplementedError:
            return None
        if ours.predicted_s is None or ours.predicted_s > plan.predicted_s + _unfused_pass_s(desc, plan.arch):
            return None
        plan = ours
    if plan.backend != "tensorcore" or plan.pack or plan.config is None:
        return None
    from .kernels.jit import epilogue_code

    cache = get_plan_cache()
    code = epilogue_code(epi.activation.code if epi.activation else 0)
    key = ("fused-launch", desc.key, plan.config, code, bias_axis)
    launch = cache.get(key)
    if launch is None:
        from .backends.tensorcore import kernel_problem
        from .kernels.launch import bind, fusable

        problem = kernel_problem(desc)
        launch = bind(problem, plan.config, spec=plan.launch, epilogue=(code, bias_axis)) \
            if fusable(problem.kind, plan.config) else False
        cache.put(key, launch)
    if launch is False:
        return None
    pa, pb, pc, pbias, ppre = ptrs
    launch(pa, pb, pc, desc.alpha, desc.beta, sptr, bias=pbias, pre=ppre)
    _route.last = f"pyblasgemm kernel {plan.config.name}, the epilogue fused in its store"
    return launch, False


def _int32_shadow(result):
    """An int32 array object over ``result``'s address with its element strides: what the int8
    product's description is read off (shape, strides, address). Never read or written as
    int32: the dequantizing kernel writes ``result``'s own type at those element offsets."""
    import cupy

    isz = result.dtype.itemsize
    return cupy.ndarray(result.shape, np.int32, memptr=result.data,
                        strides=tuple(s // isz * 4 for s in result.strides))


def _dequant_fused(a, b, ta, tb, result, alpha, beta, epi, bias, pre, scale_a, scale_b, fresh_c,
                   backend, autotune, stream) -> bool:
    """An int8 product dequantized in the store of our mma.sync kernel: ``result =
    act(alpha·scale_a·scale_b·(op(a)·op(b)) + beta·result + bias)`` in one launch. True if it
    ran; False: the unfused route is the caller's.

    When: 2-D CuPy operands, contiguous float32 scales of full length, the bias (if any) in the
    result's type, the result (and pre-activation) 16-byte aligned in whole 16-byte columns;
    the plan's mma.sync config, or, where the plan picks the Hopper kernel or cuBLAS, the best
    mma.sync candidate when the model puts it below the plan plus the unfused pass
    (:func:`_unfused_pass_s`): the int8 Hopper kernel has no fused store."""
    from .kernels.jit import DEQUANT_OUT, epilogue_code

    route = backend
    if route is None:
        from .planner.overrides import current_settings

        route = current_settings().backend
    out_name = result.dtype.name
    if route not in ("auto", "tensorcore") or out_name not in DEQUANT_OUT or a.ndim != 2 or b.ndim != 2:
        return False
    if type(alpha) not in (int, float) or type(beta) not in (int, float) or alpha == 0:
        return False
    m, n = result.shape
    k = a.shape[1] if ta == "N" else a.shape[0]
    if 0 in (m, n, k) or scale_a.shape != (m,) or scale_b.shape != (n,) \
            or not (scale_a.flags.c_contiguous and scale_b.flags.c_contiguous):
        return False
    if bias is not None and (bias.dtype != result.dtype or not bias.flags.c_contiguous):
        return False
    from ._layout import may_overlap

    if pre is not None and (pre.strides != result.strides or may_overlap(pre, result)
                            or _arrays.data_ptr(pre) % 16):
        return False
    if not fresh_c and (may_overlap(result, a) or may_overlap(result, b)):
        return False            # (checked here: the int32 shadow's extent is not the result's)
    from ._strided import _fast_desc
    from ._types import ROW_BY_DTYPE, resolve_compute

    row = ROW_BY_DTYPE[np.dtype(np.int8)]
    fast = _fast_desc("gemm", row, resolve_compute(row, None, "gemm"), ta, tb, a, b,
                      _int32_shadow(result), 1, 0, 1, (0, 0, 0), m, n, k, True)
    if fast is None:
        return False
    desc, first, second, swapped = fast
    if _arrays.data_ptr(result) % 16 or desc.ldc % (16 // result.dtype.itemsize):
        return False            # the kernel's 16-byte stores in the result's type
    bias_axis = None if bias is None else ("m" if (epi.bias_axis == "cols") == swapped else "n")
    code = epilogue_code(epi.activation.code if epi.activation else 0, out_name)
    launch = _dequant_launch(desc, code, bias_axis, backend, autotune)
    if launch is None:
        return False

    sm, sn = (scale_b, scale_a) if swapped else (scale_a, scale_b)
    sptr = streams.current() if stream is None else streams.handle(stream)
    launch(_arrays.data_ptr(first), _arrays.data_ptr(second), _arrays.data_ptr(result), float(alpha),
           float(beta), sptr, bias=0 if bias is None else _arrays.data_ptr(bias),
           pre=0 if pre is None else _arrays.data_ptr(pre), scale_m=_arrays.data_ptr(sm),
           scale_n=_arrays.data_ptr(sn))
    _route.last = f"pyblasgemm kernel {launch.config.name}, int8 dequantized in its store"
    return True


def _dequant_launch(desc, code, bias_axis, backend, autotune):
    """The bound mma.sync launch of the int8 problem ``desc`` with the dequantizing epilogue
    ``code`` (cached per problem), or None when the model prefers the unfused route."""
    from .plancache import get_plan_cache

    cache = get_plan_cache()
    key = ("dequant-launch", desc.key, code, bias_axis, backend, autotune)
    launch = cache.get(key)
    if launch is not None:
        return launch or None
    from .planner import plan_for

    kw = {} if autotune is None else dict(autotune=autotune)
    plan = plan_for(desc, backend, **kw)
    config = None
    from .kernels.launch import fusable

    if plan.backend == "tensorcore" and plan.config is not None and plan.config.kernel_family.any_alignment:
        # a plan that packs the operands (rows not 16-byte multiples) runs here on the scalar
        # operand path instead: bound without the packed problem's spec
        config, spec = plan.config, None if plan.pack else plan.launch
    elif plan.backend == "tensorcore" and plan.config is not None and not plan.pack \
            and fusable("s8", plan.config, dequantize=True):
        config, spec = plan.config, plan.launch     # the Hopper int8 kernel's dequantizing store
    elif plan.predicted_s is not None and plan.arch is not None:
        ours = [c for c in plan.candidates if c.backend == "tensorcore" and c.config is not None
                and c.config.kernel_family.any_alignment and c.score is not None]
        best = min(ours, key=lambda c: c.time, default=None)
        if best is not None and best.time <= plan.predicted_s + _unfused_pass_s(desc, plan.arch):
            config, spec = best.config, None
    launch = False
    if config is not None:
        from .backends.tensorcore import kernel_problem
        from .kernels.launch import bind

        launch = bind(kernel_problem(desc), config, spec=spec, epilogue=(code, bias_axis))
    cache.put(key, launch)
    return launch or None


def _lt_fused(desc, epi, bias_axis, ptrs, sptr):
    """One ``cublasLtMatmul`` with cuBLASLt's epilogue, when it has this one
    (:data:`~pyblasgemm.backends.cublaslt.LT_EPILOGUES`: relu and the tanh GELU, with or
    without a bias; the GELU's pre-activation too) and the arrays meet its rules (the bias
    along D's rows, pointers 16-byte aligned, the pre-activation's ld a multiple of 8).
    (launch, True) if it ran, else None."""
    from .backends.cublaslt import EPILOGUE_ALIGN, LT_EPILOGUES

    pa, pb, pc, pbias, ppre = ptrs
    code = LT_EPILOGUES.get((epi.activation.name if epi.activation else None, bool(pbias), bool(ppre)))
    if code is None or (pbias and (bias_axis != "m" or pbias % EPILOGUE_ALIGN)) \
            or (ppre and (ppre % EPILOGUE_ALIGN or desc.ldc % 8)):
        return None             # cuBLASLt adds one bias value per row of D only
    from .backends.cublas import _TYPES
    from .backends.cublaslt import make_epilogue_launch
    from .plancache import get_plan_cache

    from .kinds import base_compute

    types = _TYPES.get((desc.prefix, base_compute(desc.compute)))
    if types is None:
        return None
    cache, key = get_plan_cache(), ("lt-epilogue", desc.key, code)
    launch = cache.get(key)
    if launch is None:
        launch = make_epilogue_launch(desc, types, desc.device, code) or False
        cache.put(key, launch)
    if launch is False:
        return None
    launch(pa, pb, pc, desc.alpha, desc.beta, sptr, pbias, ppre)
    _route.last = f"cuBLASLt epilogue {_LT_NAMES[code]} (fused in the GEMM)"
    return launch, True


def _ordered_result(xp, shape, dtype, like_c: bool):
    return xp.empty(shape, dtype) if like_c else xp.empty(shape[::-1], dtype).T


def gemm_with_epilogue(transa, transb, a, b, out, alpha, beta, compute, backend, autotune,
                       stream, bias, activation, preactivation_out, scale_a, scale_b):
    """:func:`pyblasgemm.gemm` with an epilogue (see the module's docstring)."""
    from ._types import ROW_BY_DTYPE
    from .desc import check_gemm_flag, check_scalar, _scalar_value
    from .gemm import gemm
    from . import arrays

    r = "gemm"
    if arrays.is_foreign(a, b, out, bias, preactivation_out, scale_a, scale_b):
        return _foreign_gemm(transa, transb, a, b, out, alpha, beta, compute, backend, autotune,
                             stream, bias, activation, preactivation_out, scale_a, scale_b)
    for name, x in (("a", a), ("b", b)):
        if _arrays.array_module_name(x) is None:
            raise TypeError(f"{r}: {name} must be a NumPy or CuPy array, not {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{r}: {name} must be 2-D, got {x.ndim}-D with shape {x.shape}")
    row = ROW_BY_DTYPE.get(a.dtype)
    if row is None or a.dtype != b.dtype:
        return gemm(transa, transb, a, b, out, alpha, beta)    # its own error names the dtypes
    ta = check_gemm_flag(r, 1, "transa", transa, row)
    tb = check_gemm_flag(r, 2, "transb", transb, row)
    m = a.shape[0] if ta == "N" else a.shape[1]
    n = b.shape[1] if tb == "N" else b.shape[0]
    if (a.shape[1] if ta == "N" else a.shape[0]) != (b.shape[0] if tb == "N" else b.shape[1]):
        return gemm(transa, transb, a, b, out, alpha, beta)    # its own error names the sizes
    dequant = scale_a is not None or scale_b is not None
    if out is not None:
        out_dtype = out.dtype
        if getattr(out, "shape", None) != (m, n):
            raise ValueError(f"{r}: out has shape {getattr(out, 'shape', None)}; op(a) @ op(b) is ({m}, {n})")
        if not _arrays.is_writeable(out):
            raise ValueError(f"{r}: out is read-only")
    else:
        out_dtype = np.dtype(np.float32) if dequant else row.c_dtype
    xp_name = _arrays.array_module_name(a)
    epi = check(r, (m, n), (m, n), out_dtype, xp_name, bias, activation, preactivation_out, scale_a,
                scale_b, a.dtype)
    # the scalars as gemm checks them (its positions), before either route runs
    alpha = check_scalar(r, 6, "alpha", _scalar_value(alpha), row)
    beta = check_scalar(r, 7, "beta", _scalar_value(beta), row)
    xp = _arrays.xp_of(xp_name)
    kw = dict(compute=compute, backend=backend, autotune=autotune, stream=stream)
    read_c = out is not None and beta != 0
    like_c = a.flags.c_contiguous and b.flags.c_contiguous
    result = out if out is not None else _ordered_result(xp, (m, n), out_dtype, like_c)
    if dequant and xp_name == "cupy" and _dequant_fused(
            a, b, ta, tb, result, alpha, beta if read_c else 0, epi, bias, preactivation_out, scale_a,
            scale_b, out is None, backend, autotune, stream):
        return result
    if dequant:
        _route.last = _UNFUSED[xp_name]
        with _pass_stream(xp_name, stream):    # the pass on the call's stream, as the product
            t = gemm(transa, transb, a, b, **kw)                      # the exact int32 product
            return apply(epi, t, alpha, beta if read_c else None, out if read_c else None, bias,
                         scale_a, scale_b, preactivation_out, result)
    if xp_name == "cupy" and _fused(r, _row_for(a.dtype, out_dtype), compute, ta, tb, a, b, result,
                                    alpha, beta if read_c else 0, epi, bias, preactivation_out,
                                    out is None, backend, autotune, stream):
        return result
    _route.last = _UNFUSED[xp_name]
    acc = acc_dtype(out_dtype)
    with _pass_stream(xp_name, stream):        # the pass on the call's stream, as the product
        t = out.astype(acc) if read_c else _ordered_result(xp, (m, n), acc, like_c)
        gemm(transa, transb, a, b, t, alpha, beta if read_c else 0, **kw)   # alpha·AB + beta·C in acc
        return apply(epi, t, None, None, None, bias, None, None, preactivation_out, result)


def _row_for(ab_dtype, out_dtype):
    """The type row computing ``out_dtype`` from ``ab_dtype`` operands (shgemm/sbgemm for a
    float32 result of 16-bit operands), or None."""
    from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES

    row = ROW_BY_DTYPE.get(np.dtype(ab_dtype))
    if row is not None and row.c_dtype == out_dtype:
        return row
    return ROW_BY_DTYPES.get((np.dtype(ab_dtype), np.dtype(out_dtype)))


def _matmul_shape(a, b) -> tuple:
    """numpy.matmul's result shape; for shapes it refuses, its own error (raised by NumPy on
    zero-stride stand-ins: no memory, no work)."""
    sa = a.shape if a.ndim > 1 else (1,) + a.shape
    sb = b.shape if b.ndim > 1 else b.shape + (1,)
    try:
        if a.ndim == 0 or b.ndim == 0 or sa[-1] != sb[-2]:
            raise ValueError
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        cell = np.zeros((), np.int8)
        np.matmul(np.broadcast_to(cell, a.shape), np.broadcast_to(cell, b.shape))
        raise      # (not reached: NumPy raised above)
    return batch + ((sa[-2],) if a.ndim > 1 else ()) + ((sb[-1],) if b.ndim > 1 else ())


class _Replay(NamedTuple):
    """A matmul call with an epilogue that ran fused, as its call signature replays it."""

    call: _FusedCall
    shape: tuple
    dtype: object


def _call_signature(a, b, dtype, compute, backend, bias, activation):
    """The key of a repeated ``matmul(a, b, bias=, activation=, dtype=, compute=, backend=)``
    with CuPy arrays, a fresh result and no pre-activation, or None (not such a call): the
    :func:`pyblasgemm.calls.key` of the operands, with the bias (its own alignment class)."""
    from . import calls

    nd = calls.cupy_type()
    if nd is None or type(a) is not nd or (bias is not None and type(bias) is not nd) \
            or not (activation is None or type(activation) is str) \
            or not (dtype is None or isinstance(dtype, (type, np.dtype, str))) \
            or not (compute is None or type(compute) is str) or not (backend is None or type(backend) is str):
        return None
    sig = calls.key(("matmul-epilogue", dtype, compute, backend, activation), a, b, None, (bias,))
    return None if sig is None else sig[0]


def matmul_with_epilogue(a, b, out, dtype, compute, backend, autotune, stream, bias, activation,
                         preactivation_out, scale_a, scale_b):
    """:func:`pyblasgemm.matmul` with an epilogue (see the module's docstring)."""
    from .plancache import get_plan_cache

    key = None
    if out is None and preactivation_out is None and scale_a is None and scale_b is None and autotune is None:
        # a repeated fused call goes straight to its launch (16 x 11008 x 4096 on an H100:
        # the full path's checks, description and plan lookups are most of a ~40 µs call)
        key = _call_signature(a, b, dtype, compute, backend, bias, activation)
        replay = None if key is None else get_plan_cache().get(key)
        if replay is not None:
            c = type(a)(replay.shape, replay.dtype)
            pc = c.data.ptr
            if not pc & 15:
                sptr = streams.current() if stream is None else streams.handle(stream)
                call = replay.call
                if bias is not None and call.widen is not None:
                    with streams.on(sptr):              # (freed after the launch: same stream)
                        bias = bias.astype(call.widen)
                call(a.data.ptr, b.data.ptr, pc, 0 if bias is None else bias.data.ptr, 0, sptr)
                return c
    from .matmul import _with_core_dims, matmul
    from . import arrays

    r = "matmul"
    if arrays.is_foreign(a, b, out, bias, preactivation_out, scale_a, scale_b):
        # (after the CuPy replay: its key refuses every other type)
        return _foreign_matmul(a, b, out, dtype, compute, backend, autotune, stream, bias,
                               activation, preactivation_out, scale_a, scale_b)
    xp_name = _arrays.array_module_name(a)
    if xp_name is None or _arrays.array_module_name(b) != xp_name:
        raise TypeError(f"{r}: an epilogue needs a and b to be NumPy arrays or CuPy arrays "
                        f"(both of one kind), got {type(a).__name__} and {type(b).__name__}")
    shape = _matmul_shape(a, b)
    dequant = scale_a is not None or scale_b is not None
    # NumPy's result type (bfloat16 @ bfloat16 is float32 with ml_dtypes), and NumPy's rule
    # for dtype= and out: what numpy.matmul refuses (a float product into uint8 or bool) is
    # refused here too, before any work
    loop, out_dtype = numpy_result(r, a.dtype, b.dtype, dtype, out if dtype is None else None)
    if dequant and dtype is None and out is None:
        out_dtype = np.dtype(np.float32)
    if out is not None and (out.shape != shape or out.dtype != out_dtype):
        raise ValueError(f"{r}: out has shape {out.shape} and dtype {out.dtype.name}; the result "
                         f"is {shape} {np.dtype(out_dtype).name}")
    if out is not None and not _arrays.is_writeable(out):
        raise ValueError(f"{r}: out is read-only")
    mn = (a.shape[-2] if a.ndim > 1 else 1, b.shape[-1] if b.ndim > 1 else 1)
    epi = check(r, shape, mn, out_dtype, xp_name, bias, activation, preactivation_out, scale_a,
                scale_b, a.dtype)
    kw = dict(compute=compute, backend=backend, autotune=autotune, stream=stream)
    xp = _arrays.xp_of(xp_name)
    result = out if out is not None else xp.empty(shape, out_dtype)
    # the epilogue sees (..., m, n): views with matmul's dropped vector axes put back
    def full(x):
        return None if x is None else _with_core_dims(x, a.ndim, b.ndim)

    if dequant and xp_name == "cupy" and a.ndim == 2 and b.ndim == 2 and _dequant_fused(
            a, b, "N", "N", result, 1.0, 0.0, epi, bias, preactivation_out, scale_a, scale_b,
            out is None, backend, autotune, stream):
        pass
    elif dequant:
        _route.last = _UNFUSED[xp_name]
        with _pass_stream(xp_name, stream):    # the pass on the call's stream, as the product
            t = matmul(a, b, dtype=np.int32, **kw)
            apply(epi, full(xp.asarray(t)), 1.0, None, None, bias, scale_a, scale_b,
                  full(preactivation_out), full(result))
    elif xp_name == "cupy" and a.ndim == 2 and b.ndim == 2 and (ran := _fused(
            r, _row_for(a.dtype, out_dtype), compute, "N", "N", a, b, result, 1.0, 0.0, epi, bias,
            preactivation_out, out is None, backend, autotune, stream)):
        from .planner.overrides import current_settings

        if key is not None and current_settings().cache and result.flags.c_contiguous \
                and not result.data.ptr & 15:
            get_plan_cache().put(key, _Replay(ran, result.shape, result.dtype))
            _last_replay.value = _Replay(ran, result.shape, result.dtype)
    else:
        _route.last = _UNFUSED[xp_name]
        with _pass_stream(xp_name, stream):    # the pass on the call's stream, as the product
            _unfused_matmul(a, b, kw, xp, loop, out_dtype, epi, bias, full, preactivation_out, result)
    return result if result.shape else result[()]


def _pass_stream(xp_name: str, stream):
    """Where the unfused epilogue pass runs: the call's stream on the GPU; on the host nothing
    (the stream, checked, changes nothing there, and asking CuPy for its current stream needs a
    GPU driver)."""
    handle = streams.handle(stream)
    return streams.on(handle if xp_name == "cupy" else None)


def _unfused_matmul(a, b, kw, xp, loop, out_dtype, epi, bias, full, preactivation_out, result):
    """The product in the accumulation type, then the epilogue's one elementwise pass."""
    from .matmul import matmul

    if a.dtype.kind in "iub":
        # integer or bool operands: NumPy's own product, the operands cast to its loop type
        # and multiplied in it, wrapping as it wraps (cupy.matmul's dtype=int64 casts the
        # int32 product instead); an integer result is summed and activated exactly, then
        # cast (apply)
        t = xp.asarray(matmul(a.astype(loop, copy=False), b.astype(loop, copy=False), **kw))
        if out_dtype.kind not in "iub":
            t = t.astype(acc_dtype(out_dtype), copy=False)
    else:
        acc = acc_dtype(out_dtype)
        t = matmul(a, b, dtype=acc, **kw) if a.dtype.itemsize == 2 else matmul(a, b, **kw)
        t = xp.asarray(t, dtype=acc)
    apply(epi, full(t), None, None, None, bias, None, None, full(preactivation_out), full(result))


# ---------------------------------------------------------------------------------------------
# Foreign arrays (PyTorch tensors, JAX arrays, CUDA-array-interface and DLPack objects): the
# call runs on their NumPy / CuPy views (pyblasgemm.arrays) and answers in their framework


def _epilogue_named(a, b, out, bias, pre, scale_a, scale_b):
    return [("a", a), ("b", b), ("out", out), ("bias", bias), ("preactivation_out", pre),
            ("scale_a", scale_a), ("scale_b", scale_b)]


def _framework_dtype(conv, dtype, out, dequant: bool):
    """``dtype=`` for a call on the views: bfloat16 for bfloat16 @ bfloat16 from PyTorch or JAX
    (their rule; NumPy's, which the views would follow, is float32), so that ``bias``,
    ``preactivation_out`` and the result are bfloat16 as the caller's framework makes them;
    otherwise ``dtype`` as given."""
    if dtype is None and out is None and not dequant and conv.kind in ("torch", "jax"):
        na, nb = conv.arrays[:2]
        if getattr(na, "dtype", None) is not None and na.dtype.name == "bfloat16" \
                and getattr(nb, "dtype", None) == na.dtype:
            return na.dtype
    return dtype


class _LastReplay(threading.local):
    value = None


#: the fused call a CuPy-view call just recorded (read by the torch door to record it too)
_last_replay = _LastReplay()


class _TorchReplay(NamedTuple):
    """A fused call recorded for torch tensors: the launch and the result tensor's layout."""

    call: _FusedCall
    shape: tuple
    strides: tuple
    dtype: object           # the torch dtype


def _torch_fused_key(a, b, dtype, compute, backend, bias, activation):
    """(key, pointers) of a repeatable fused call on CUDA tensors, or (None, None)."""
    from . import arrays

    if not (activation is None or type(activation) is str) or not (
            dtype is None or isinstance(dtype, (type, np.dtype, str))) or not (
            compute is None or type(compute) is str) or not (backend is None or type(backend) is str):
        return None, None
    key, ptrs = arrays.torch_signature(("epilogue-call", dtype, compute, backend, activation), (a, b, bias))
    # the launch is bound on the current device (CUDA tensors only: a CPU one gave no key)
    return (None, None) if key is None else ((*key, _arrays.current_device()), ptrs)


def _foreign_matmul(a, b, out, dtype, compute, backend, autotune, stream, bias, activation, pre,
                    scale_a, scale_b):
    from . import arrays
    from .plancache import get_plan_cache

    key = None
    if out is None and pre is None and scale_a is None and scale_b is None and autotune is None:
        # a repeated fused call on CUDA tensors: its launch on their pointers, the result from
        # torch's allocator (the converting path below costs ~200 µs a call; H200, 64³ fp16)
        key, ptrs = _torch_fused_key(a, b, dtype, compute, backend, bias, activation)
        hit = None if key is None else get_plan_cache().get(key)
        if hit is not None:
            c = sys.modules["torch"].empty_strided(hit.shape, hit.strides, dtype=hit.dtype, device=a.device)
            pc = c.data_ptr()
            if not pc & 15:
                sptr = arrays.torch_raw_stream(a.get_device()) if stream is None else streams.handle(stream)
                hit.call(ptrs[0], ptrs[1], pc, 0 if bias is None else ptrs[2], 0, sptr)
                return c
    if arrays.needs_grad(a, b, out, bias, pre, scale_a, scale_b):
        return _differentiable_linear(a, b, out, dtype, compute, backend, autotune, stream, bias,
                                      activation, pre, scale_a, scale_b)
    conv = arrays.convert("matmul", _epilogue_named(a, b, out, bias, pre, scale_a, scale_b),
                          writes=("out", "preactivation_out"))
    na, nb, nout, nbias, npre, nsa, nsb = conv.arrays
    dtype = _framework_dtype(conv, dtype, out, scale_a is not None or scale_b is not None)
    _last_replay.value = None
    with conv.allocating():
        result = matmul_with_epilogue(na, nb, nout, dtype, compute, backend, autotune,
                                      conv.stream if stream is None else stream, nbias, activation,
                                      npre, nsa, nsb)
    back = out if out is not None else conv.back(result, framework_type=False)
    ran, _last_replay.value = _last_replay.value, None
    if key is not None and ran is not None and ran.call.widen is None and back.is_contiguous():
        get_plan_cache().put(key, _TorchReplay(ran.call, tuple(back.shape), back.stride(), back.dtype))
    return back


def _foreign_gemm(transa, transb, a, b, out, alpha, beta, compute, backend, autotune, stream, bias,
                  activation, pre, scale_a, scale_b):
    from . import arrays

    if arrays.needs_grad(a, b, out, bias, pre, scale_a, scale_b):
        raise TypeError("gemm: a tensor requires grad, and gemm is not differentiable: "
                        "pyblasgemm.matmul(x, w, bias=, activation=) is (it runs "
                        "pyblasgemm.torch.linear), or detach the tensors / call under "
                        "torch.no_grad()")
    conv = arrays.convert("gemm", _epilogue_named(a, b, out, bias, pre, scale_a, scale_b),
                          writes=("out", "preactivation_out"))
    na, nb, nout, nbias, npre, nsa, nsb = conv.arrays
    with conv.allocating():
        result = gemm_with_epilogue(transa, transb, na, nb, nout, alpha, beta, compute, backend,
                                    autotune, conv.stream if stream is None else stream, nbias,
                                    activation, npre, nsa, nsb)
    # (gemm's result type is the operands' own: bfloat16 stays bfloat16)
    return out if out is not None else conv.back(result, framework_type=False)


def _differentiable_linear(x, w, out, dtype, compute, backend, autotune, stream, bias, activation,
                           pre, scale_a, scale_b):
    """``matmul(x, w, bias=, activation=)`` with a tensor that requires grad: exactly
    ``pyblasgemm.torch.linear(x, w.T, bias, activation)`` when it is that call (``w`` 2-D,
    ``bias`` of shape (n,) or None, no other keyword), else a TypeError saying what is
    differentiable (never a silent detach)."""
    r = "matmul"
    check_activation(r, activation)
    import torch

    given = dict(out=out, dtype=dtype, compute=compute, backend=backend, autotune=autotune,
                 stream=stream, preactivation_out=pre, scale_a=scale_a, scale_b=scale_b)
    extra = [f"{k}=" for k, v in given.items() if v is not None]
    tensors = all(isinstance(v, torch.Tensor) for v in (x, w) + ((bias,) if bias is not None else ()))
    shaped = tensors and x.dim() >= 1 and w.dim() == 2 and (
        bias is None or tuple(bias.shape) == (w.shape[1],))
    if extra or not shaped:
        what = (", ".join(extra) if extra else
                "operands that are not all tensors" if not tensors else
                f"a of shape {tuple(x.shape)}, b of shape {tuple(w.shape)}"
                + ("" if bias is None else f" and bias of shape {tuple(bias.shape)}"))
        raise TypeError(f"{r}: an epilogue with {what} on tensors that require grad: the "
                        f"differentiable epilogue is pyblasgemm.torch.linear's, "
                        f"activation(x @ w + bias) for tensors x (..., k), w (k, n) and bias (n,) "
                        f"or None, with no out=, preactivation_out=, scale_a=, scale_b=, dtype=, "
                        f"compute=, backend=, autotune= or stream=; detach the tensors, or call "
                        f"under torch.no_grad()")
    from .torch import linear

    # nn.Linear's weight is (n, k): w.T, a view the gradient flows through
    return linear(x, w.T, bias, activation)
