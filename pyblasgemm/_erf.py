"""erf on the host, float64-accurate without SciPy: the exact GELU's erf (pyblasgemm.epilogue).

SciPy is an optional dependency; where it is missing, :func:`erf_numpy` computes erf in NumPy
(a double-double Taylor series below 2.5, a continued fraction above) within 2 ulp of
``math.erf``. Imports nothing of the package.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["erf_function", "erf_numpy"]

_ERF: list = []


def erf_function():
    """scipy.special.erf where SciPy is installed (an optional dependency), else
    :func:`erf_numpy`. Looked up on first use: importing scipy.special costs ~0.3 s."""
    if not _ERF:
        try:
            from scipy.special import erf
        except ImportError:
            erf = erf_numpy
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


def erf_numpy(x):
    """erf in NumPy, float64-accurate (within 2 ulp of ``math.erf``; tested on a wide grid
    with the tails, NaN, ±Inf and -0.0): the GELU's erf where SciPy is not installed.
    Float16/32 inputs are computed in float64 and rounded once to their type.

    >>> import math, numpy as np
    >>> from pyblasgemm._erf import erf_numpy
    >>> float(erf_numpy(np.float64(0.5))) == math.erf(0.5)
    True
    >>> erf_numpy(np.array([-np.inf, -0.0, np.nan, 3.0], np.float32))
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
