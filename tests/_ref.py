"""The oracle: float64 (complex128) NumPy on fresh random data, and the tolerances, in one place.

The error of a result is measured elementwise against the natural scale of each entry,
``|alpha| * (|op(A)| @ |op(B)|) + |beta| * |C|``: a correct GEMM's rounding error is a small
multiple of the working precision of that scale, whatever the cancellation in the sum.
"""
from fractions import Fraction

import ml_dtypes
import numpy as np

from pyblasgemm.kinds import ROUTES

#: relative error bound (against the scale above) per (dtype prefix, compute mode): the kinds
#: table's ``rtol`` (pyblasgemm/kinds.py says why each is what it is)
TOLERANCE = {key: route.rtol for key, route in ROUTES.items()}

DTYPES = {
    "s": np.float32, "d": np.float64, "h": np.float16, "b": ml_dtypes.bfloat16,
    "i": np.int8, "c": np.complex64, "z": np.complex128, "sh": np.float16, "sb": ml_dtypes.bfloat16,
}
C_DTYPES = dict(DTYPES, i=np.int32, sh=np.float32, sb=np.float32)


def random_array(rng, prefix, size, c=False):
    """Fresh random values of the prefix's dtype (never zeros); int8 spans the full range."""
    dtype = C_DTYPES[prefix] if c else DTYPES[prefix]
    if prefix == "i":
        lo, hi = (-1000, 1000) if c else (-128, 128)
        return rng.integers(lo, hi, size=size).astype(dtype)
    x = rng.uniform(-1, 1, size=size)
    if prefix in ("c", "z"):
        x = x + 1j * rng.uniform(-1, 1, size=size)
    return x.astype(dtype)


def op(x, trans):
    return x if trans == "N" else (x.T.conj() if trans == "C" else x.T)


def col_major(buf, rows, cols, ld):
    """rows x cols column-major matrix with leading dimension ld, read from a 1-D buffer."""
    buf = np.asarray(buf).reshape(-1, order="F")
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), dtype=buf.dtype)
    idx = np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return buf[idx]


def widen(x):
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    return x.astype(np.float64)


def expected(alpha, opa, opb, beta, c):
    """(float64 reference, elementwise scale) for alpha * opa @ opb + beta * c."""
    a64, b64, c64 = widen(opa), widen(opb), widen(c)
    prod = a64 @ b64
    scale = abs(alpha) * (np.abs(a64) @ np.abs(b64))
    ref = alpha * prod
    if beta != 0:
        ref = ref + beta * c64
        scale = scale + abs(beta) * np.abs(c64)
    return ref, scale


def check_close(got, ref, scale, prefix, compute, what=""):
    """Assert every element is within the tolerance of its scale (NaN never passes)."""
    # an absolute floor: one unit of the output type's subnormal range (a float16 result below
    # 6e-5 is subnormal, and its spacing, 6e-8, is no relative error bound)
    out_dtype = np.asarray(got).dtype
    floor = np.finfo(np.float32).tiny
    if out_dtype.kind == "f" or out_dtype == ml_dtypes.bfloat16:
        floor = max(floor, float(ml_dtypes.finfo(out_dtype).smallest_subnormal))
    got = widen(got)
    tol = TOLERANCE[(prefix, compute)]
    if prefix == "i":
        # int32 arithmetic wraps: compare modulo 2^32
        want = (np.asarray(np.rint(np.real(ref)), dtype=np.int64)).astype(np.int32)
        np.testing.assert_array_equal(got.astype(np.int64).astype(np.int32), want, err_msg=what)
        return
    assert np.all(np.isfinite(got)), f"{what}: non-finite values in the result"
    err = np.abs(got - ref)
    bound = tol * scale + floor
    worst = np.max(err / bound) if err.size else 0.0
    assert np.all(err <= bound), f"{what}: error {worst:.3g}x the {prefix}/{compute} tolerance"


def exact(a, b):
    """a @ b exactly (rational arithmetic on the operands' values), as an object array of
    Fractions, or of (re, im) pairs of Fractions for complex operands: the emulated modes'
    reference (every product and sum exact, nothing rounded)."""
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), object)
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        a, b = np.asarray(a, complex), np.asarray(b, complex)
        ar = [[Fraction(float(v.real)) for v in r] for r in a]
        ai = [[Fraction(float(v.imag)) for v in r] for r in a]
        br = [[Fraction(float(v.real)) for v in r] for r in b]
        bi = [[Fraction(float(v.imag)) for v in r] for r in b]
        for i in range(m):
            for j in range(n):
                out[i, j] = (sum((ar[i][h] * br[h][j] - ai[i][h] * bi[h][j] for h in range(k)), Fraction(0)),
                             sum((ar[i][h] * bi[h][j] + ai[i][h] * br[h][j] for h in range(k)), Fraction(0)))
        return out
    fa = [[Fraction(float(v)) for v in r] for r in a]
    fb = [[Fraction(float(v)) for v in r] for r in b]
    for i in range(m):
        for j in range(n):
            out[i, j] = sum((fa[i][h] * fb[h][j] for h in range(k)), Fraction(0))
    return out


def count_violations(c, ref, scale, gamma: float, underflow) -> int:
    """How many elements (parts, for complex) of ``c`` lie further from the exact ``ref``
    (:func:`exact`) than ``gamma * scale + underflow``: a componentwise error bound
    ``γ Σ|a||b| + η`` checked in rational arithmetic."""
    bad = 0
    for (i, j), r in np.ndenumerate(ref):
        tol = Fraction(float(gamma * scale[i, j])) + Fraction(underflow)
        if isinstance(r, tuple):
            bad += abs(Fraction(float(c[i, j].real)) - r[0]) > tol
            bad += abs(Fraction(float(c[i, j].imag)) - r[1]) > tol
        else:
            bad += abs(Fraction(float(c[i, j])) - r) > tol
    return bad
