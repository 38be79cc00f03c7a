"""The Ozaki scheme II on the host (pyblasgemm/ozaki.py): each step against exact integer or
rational arithmetic written here independently (Python ints and fractions), then the whole
product against an exact rational reference and against native float64."""
import math
from fractions import Fraction

import numpy as np
import pytest

from pyblasgemm import ozaki as oz


def exact_product(a, b):
    """a @ b with every product and sum exact (Fractions), rounded once to float64."""
    m, k = a.shape
    n = b.shape[1]
    fa = [[Fraction(float(v)) for v in row] for row in a]
    fb = [[Fraction(float(v)) for v in row] for row in b]
    return np.array([[float(sum(fa[i][h] * fb[h][j] for h in range(k))) for j in range(n)] for i in range(m)])


def test_moduli_are_pairwise_coprime_and_fit_int8_residues():
    assert len(oz.MODULI) == len(set(oz.MODULI)) and max(oz.MODULI) == 256
    for i, p in enumerate(oz.MODULI):
        for q in oz.MODULI[i + 1:]:
            assert math.gcd(p, q) == 1, (p, q)
    x = np.arange(-70000, 70000, 7, dtype=np.int64)
    for p in oz.MODULI:
        r = oz.residues(x, p)
        assert r.dtype == np.int8
        assert r.min() >= -(p // 2) and r.max() <= (p - 1) // 2, p
        np.testing.assert_array_equal((x - r.astype(np.int64)) % p, 0)


@pytest.mark.parametrize("k", [1, 7, 1024, 8192, 2**17])
def test_bits_for_is_the_largest_that_the_moduli_hold(k):
    for count in (4, 8, 12, 16, 18, 20):
        try:
            b = oz.bits_for(count, k)
        except ValueError:
            assert 2 * k * 4 >= math.prod(oz.MODULI[:count])
            continue
        p = math.prod(oz.MODULI[:count])
        assert oz._holds(k, b, p) and 2 * k * 4**b < p
        assert b == oz.MAX_BITS or not oz._holds(k, b + 1, p)
    s = oz.setting(k)
    # the fewest moduli that keep DEFAULT_BITS, then every bit they hold
    assert s.bits == oz.bits_for(s.count, k) >= oz.DEFAULT_BITS and s.guard
    assert s.count == 1 or oz.bits_for(s.count - 1, k) < oz.DEFAULT_BITS
    assert s.count == 1 or oz.bits_for(s.count - 1, k) < s.bits


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="count=0"):
        oz.bits_for(0, 10)
    with pytest.raises(ValueError, match="k=0"):
        oz.bits_for(4, 0)
    with pytest.raises(ValueError, match="bits=63"):
        oz.setting(10, bits=63)
    with pytest.raises(ValueError, match="cannot hold"):
        oz.bits_for(1, 2**20)
    with pytest.raises(TypeError, match="float64"):
        oz.dgemm_ozaki(np.ones((2, 2), np.float32), np.ones((2, 2)))
    with pytest.raises(ValueError, match="inner sizes"):
        oz.dgemm_ozaki(np.ones((2, 3)), np.ones((2, 2)))


@pytest.mark.parametrize("count", [1, 3, 10, 18, 34])
def test_reconstruct_recovers_every_integer_of_the_symmetric_range(count):
    mods = oz.MODULI[:count]
    big = math.prod(mods)
    rng = np.random.default_rng(count)
    # the range bits_for keeps: |X| <= (1/2 - 2^-20) P
    lim = big * (2**19 - 1) // 2**20
    xs = [0, 1, -1, lim, -lim, lim - 1, -(lim - 1), 2**53 - 1, -(2**53 - 1)] if big > 2 else [0]
    xs += [int(v) for v in rng.integers(-2**62, 2**62, size=40)] if big > 2**64 else []
    xs += [int.from_bytes(rng.bytes(40), "little") % (2 * lim + 1) - lim for _ in range(60)]
    xs += [int(v) for v in rng.integers(-2**40, 2**40, size=20)]
    xs = [x for x in xs if -lim <= x <= lim] or [0]
    got = oz.reconstruct([np.array([x % p for x in xs], dtype=np.int64) for p in mods], mods)
    for x, g in zip(xs, got.tolist()):
        if abs(x) < 2**53:
            assert g == float(x), (count, x, g)           # exact where X fits 53 bits
        else:
            assert abs(Fraction(g) - x) <= 2 * math.ulp(float(x)), (count, x, g)


@pytest.mark.parametrize("bits", [4, 24, 53, 62])
def test_split_truncates_each_row_to_bits(bits):
    rng = np.random.default_rng(bits)
    x = rng.standard_normal((5, 9)) * np.logspace(-20, 20, 9)
    x[2] = 0.0
    ints, e = oz.split(x, axis=1, bits=bits)
    assert ints.dtype == np.int64 and e.tolist()[2] == 0 and not ints[2].any()
    assert np.all(np.abs(ints) < 2**bits)
    for i in range(5):
        for j in range(9):
            exact = Fraction(float(x[i, j])) * Fraction(2) ** int(e[i])
            assert int(ints[i, j]) == math.trunc(exact), (i, j)
    cols, f = oz.split(x.T, axis=0, bits=bits)
    np.testing.assert_array_equal(cols, ints.T)
    np.testing.assert_array_equal(f, e)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (3, 130, 4), (16, 17, 2)])
def test_dgemm_ozaki_is_at_least_as_accurate_as_native_float64(m, k, n):
    rng = np.random.default_rng(m * 1000 + k)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = exact_product(a, b)
    c, how = oz.dgemm_ozaki(a, b)
    assert how.count == oz.setting(k).count and how.bits == oz.setting(k).bits
    scale = np.abs(a) @ np.abs(b)
    ours = np.max(np.abs(c - ref) / scale)
    native = np.max(np.abs(a @ b - ref) / scale)
    assert ours <= max(native, 2.0**-53), (ours, native)
    # the inputs are kept exactly where they are within 9 binades of their row's / column's
    # largest: then the result is the exact product rounded once
    ai, _ = oz.split(a, 1, how.bits)
    if np.all(np.abs(a) >= np.max(np.abs(a), axis=1, keepdims=True) * 2.0**-9) and \
            np.all(np.abs(b) >= np.max(np.abs(b), axis=0, keepdims=True) * 2.0**-9):
        np.testing.assert_array_equal(c, ref)
    again, _ = oz.dgemm_ozaki(a, b)
    np.testing.assert_array_equal(again, c)               # deterministic


def test_dgemm_ozaki_on_magnitudes_spread_over_60_decades():
    """Rows and columns scale independently: a spread between rows (or between columns)
    costs nothing; within a row, elements far below its largest are truncated (normwise
    error of the kept bits)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 12)) * np.logspace(-30, 30, 6)[:, None]      # rows 1e-30..1e30
    b = rng.standard_normal((12, 5)) * np.logspace(-30, 30, 5)[None, :]
    ref = exact_product(a, b)
    # k = 12: native float64 is nearly exact this short; all 62 bits match it
    c, how = oz.dgemm_ozaki(a, b, bits=oz.MAX_BITS)
    scale = np.abs(a) @ np.abs(b)
    assert np.max(np.abs(c - ref) / scale) <= max(np.max(np.abs(a @ b - ref) / scale), 2.0**-53)


def test_the_precision_dial_trades_moduli_for_accuracy():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((8, 64)), rng.standard_normal((64, 8))
    ref = exact_product(a, b)
    scale = np.abs(a) @ np.abs(b)
    errs = []
    for count in (6, 8, 10, 12, 14, 17):
        c, how = oz.dgemm_ozaki(a, b, count=count)
        err = np.max(np.abs(c - ref) / scale)
        # truncating both operands to `bits` bits: at most 2 · 2^(1 - bits) of |A||B| per entry,
        # relative to the row's / column's largest elements (a factor below max/|a|)
        rowmax = np.max(np.abs(a), axis=1, keepdims=True) @ np.max(np.abs(b), axis=0, keepdims=True)
        assert np.all(np.abs(c - ref) <= 64 * 2.0 ** (1 - how.bits) * rowmax * 64 + 2.0**-53 * np.abs(ref))
        errs.append(err)
    assert errs == sorted(errs, reverse=True) and errs[0] > 1e3 * max(errs[-1], 2.0**-60), errs


def test_inf_nan_and_empty_k_are_multiplied_natively():
    a, b = np.ones((2, 3)), np.ones((3, 2))
    a[0, 1] = np.inf
    c, how = oz.dgemm_ozaki(a, b)
    assert how is None and np.isinf(c[0]).all() and (c[1] == 3).all()
    b[2, 1] = np.nan
    c, how = oz.dgemm_ozaki(np.ones((2, 3)), b)
    assert how is None and np.isnan(c[:, 1]).all()
    c, how = oz.dgemm_ozaki(np.ones((2, 0)), np.ones((0, 4)))
    assert how is None and c.shape == (2, 4) and not c.any()


def exact_complex_product(a, b):
    """Complex a @ b with exact real and imaginary parts (Fractions), each rounded once."""
    re = [[Fraction(float(v.real)) for v in row] for row in a]
    im = [[Fraction(float(v.imag)) for v in row] for row in a]
    bre = [[Fraction(float(v.real)) for v in row] for row in b]
    bim = [[Fraction(float(v.imag)) for v in row] for row in b]
    m, k = a.shape
    n = b.shape[1]
    out = np.empty((m, n), np.complex128)
    for i in range(m):
        for j in range(n):
            r = sum(re[i][h] * bre[h][j] - im[i][h] * bim[h][j] for h in range(k))
            s = sum(re[i][h] * bim[h][j] + im[i][h] * bre[h][j] for h in range(k))
            out[i, j] = complex(float(r), float(s))
    return out


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 19, 3), (4, 64, 6)])
def test_zgemm_ozaki_is_at_least_as_accurate_as_native_complex128(m, k, n):
    rng = np.random.default_rng(m + 100 * k)
    a = rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k))
    b = rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))
    ref = exact_complex_product(a, b)
    c, how = oz.zgemm_ozaki(a, b)
    assert how.k == 2 * k and how.bits == oz.setting(2 * k).bits
    scale = np.abs(a) @ np.abs(b)
    for part in (np.real, np.imag):
        ours = np.max(np.abs(part(c) - part(ref)) / scale)
        native = np.max(np.abs(part(a @ b) - part(ref)) / scale)
        assert ours <= max(native, 2.0**-53), (ours, native)
    np.testing.assert_array_equal(oz.zgemm_ozaki(a, b)[0], c)


def test_zgemm_ozaki_rounds_each_part_once():
    """Re = (1 + 2^-30)² - 1·(1 + 2^-29) is exactly 2^-60. Native complex128 rounds the first
    product to 1 + 2^-29 and returns 0; the combined integer product keeps it."""
    a = np.array([[(1 + 2.0**-30) + 1j]])
    b = np.array([[(1 + 2.0**-30) + (1 + 2.0**-29) * 1j]])
    c, _ = oz.zgemm_ozaki(a, b, fallback=False)
    assert (a @ b)[0, 0].real == 0.0
    assert c[0, 0].real == 2.0**-60
    assert c[0, 0] == exact_complex_product(a, b)[0, 0]
    # the default's guard cannot prove native's bound at k = 1 (the reconstruction may be two
    # ulps off where native rounds once): native arithmetic answers
    c, how = oz.zgemm_ozaki(a, b)
    assert c[0, 0] == (a @ b)[0, 0] and how.native_elements == 1
    with pytest.raises(TypeError, match="complex128"):
        oz.zgemm_ozaki(np.ones((1, 1)), b)
    inf = np.array([[np.inf + 0j]])
    c, how = oz.zgemm_ozaki(inf, b)
    assert how is None


def test_rows_and_columns_the_scaling_cannot_hold_are_multiplied_natively():
    """[1e10, 1e-10] @ [0, 1] is 1e-10: scaled to 62 bits against 1e10, 1e-10 truncates to 0.
    Without the fallback that term is lost; with it (the default) the row is native."""
    a = np.array([[1e10, 1e-10], [1.0, 2.0]])
    b = np.array([[0.0, 1.0], [1.0, 1.0]])
    raw, _ = oz.dgemm_ozaki(a, b, fallback=False)
    assert raw[0, 0] == 0.0
    c, how = oz.dgemm_ozaki(a, b)
    assert c[0, 0] == 1e-10 and how.native_rows == 1 and how.native_cols == 0
    np.testing.assert_array_equal(c, exact_product(a, b))
    assert "1 rows and 0 columns natively" in how.describe()
    # a column of b with the same spread; the complex form likewise
    c, how = oz.dgemm_ozaki(b.T.copy(), a.T.copy())
    assert how.native_cols == 1 and c[0, 0] == 1e-10
    z, how = oz.zgemm_ozaki(a.astype(complex) * 1j, b.astype(complex))
    assert how.native_rows == 1 and z[0, 0] == 1e-10j


def test_spread_within_rows_stays_within_native_error_with_the_fallback():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 20)) * 10.0 ** rng.uniform(-30, 30, (6, 20))
    b = rng.standard_normal((20, 4)) * 10.0 ** rng.uniform(-30, 30, (20, 4))
    ref = exact_product(a, b)
    c, how = oz.dgemm_ozaki(a, b)
    assert how.native_rows == 6 and how.native_cols == 4      # 60 decades: nothing holds
    # native float64 (the host BLAS's own order and blocking, so within its error bound, not
    # bitwise a @ b: OpenBLAS on 16 cores blocked a @ b[:, cols] differently from a @ b)
    bound = 2 * a.shape[1] * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(c - ref) <= bound)
    a[:3] = rng.standard_normal((3, 20))                       # three rows the scaling holds
    b = rng.standard_normal((20, 4))                           # and every column
    c, how = oz.dgemm_ozaki(a, b)
    assert how.native_rows == 3 and how.native_cols == 0
    np.testing.assert_array_equal(c[3:], a[3:] @ b)
    scale = np.abs(a) @ np.abs(b)
    ref = exact_product(a, b)
    assert np.max(np.abs(c - ref) / scale) <= max(np.max(np.abs(a @ b - ref) / scale), 2.0**-53)


def test_the_default_is_below_native_error_at_k_1024():
    """The default (DEFAULT_BITS) against native float64, both against a long-double reference
    (random normal, the issue's smallest size class)."""
    rng = np.random.default_rng(1024)
    a, b = rng.standard_normal((24, 1024)), rng.standard_normal((1024, 24))
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    scale = np.abs(a).astype(np.longdouble) @ np.abs(b).astype(np.longdouble)
    c, how = oz.dgemm_ozaki(a, b)
    ours = float(np.max(np.abs(c.astype(np.longdouble) - ref) / scale))
    native = float(np.max(np.abs((a @ b).astype(np.longdouble) - ref) / scale))
    assert how.bits >= oz.DEFAULT_BITS and ours < native / 2, (ours, native)


@pytest.mark.parametrize("count", [2, 9, 16, 34])
def test_crt_tables_sum_back_to_the_basis(count):
    """The chunks of P / p_l and of P add up exactly, each chunk fits CRT_CHUNK_BITS bits, and
    y_l inverts P / p_l mod p_l: the constants the GPU kernels are compiled with."""
    mods = oz.MODULI[:count]
    big = math.prod(mods)
    t = oz.crt_tables(count)
    assert sum(int(c) for c in t["p"]) == big and len(t["p"]) == oz.crt_chunks(count)
    for p, y, chunks in zip(mods, t["y"], t["m"]):
        assert sum(int(c) for c in chunks) == big // p and (big // p) * y % p == 1
        for c in chunks:
            mant = int(c) >> (int(c) & -int(c)).bit_length() - 1 if c else 0
            assert mant < 2**oz.CRT_CHUNK_BITS


def _exact(a, b):
    """a @ b as exact Fractions (no rounding at all)."""
    fa = [[Fraction(float(v)) for v in row] for row in a]
    fb = [[Fraction(float(v)) for v in row] for row in b]
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*fb)] for row in fa]


@pytest.mark.parametrize("bits", [8, 20, 34, 45])
def test_the_stated_error_bound_holds_against_the_exact_product(bits):
    """oz.error_bound (what explain() states) bounds |c - a@b| on hard inputs: rows spread
    over 60 binades, cancellation (x and -x + tiny), tiny and huge rows; the scheme alone
    (fallback=False), so every element is the scheme's. And it is not vacuous: it is within
    a factor 2^12 of the worst error seen at 8 bits."""
    rng = np.random.default_rng(bits)
    m, k, n = 6, 40, 5
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-30, 31, (m, k)))
    a[1, 1::2] = -a[1, 0::2] * (1 + 2.0**-40)          # cancellation
    a[2] *= 2.0**-900                                   # a tiny row (no underflow of c)
    a[3] *= 2.0**900
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-8, 9, (k, n)))
    c, how = oz.dgemm_ozaki(a, b, bits=bits, fallback=False)
    bound = oz.error_bound(a, b, c, how)
    exact = _exact(a, b)
    worst = 0.0
    for i in range(m):
        for j in range(n):
            err = abs(Fraction(float(c[i, j])) - exact[i][j])
            assert err <= Fraction(float(bound[i, j])), (bits, i, j, float(err), bound[i, j])
            worst = max(worst, float(err / Fraction(float(bound[i, j]))))
    if bits == 8:
        assert worst > 2.0**-12, worst


def test_explain_states_the_bits_and_the_bound():
    import pyblasgemm

    text = pyblasgemm.plan(8192, 8192, 8192, "f64", compute="int8-ozaki-40", arch="sm_90").explain()
    how = oz.setting(8192, bits=40)
    assert f"as {how.bits}-bit integers" in text and f"error: {how.bound()}" in text
    assert "(the guard)" in pyblasgemm.plan(8192, 8192, 8192, "f64", compute="int8-ozaki", arch="sm_90").explain()
