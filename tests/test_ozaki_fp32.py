"""FP32-accurate products on int8 tensor cores (issue 34 item 2): ``compute='int8-ozaki'`` and its
dial for float32 and complex64 (:func:`pyblasgemm.ozaki.sgemm_ozaki`, ``cgemm_ozaki``).

The promise checked here: at the default dial every element is within native SGEMM's
componentwise bound ``γ_k Σ_k |a_ik||b_kj|`` (u = 2^-24) of the exact product, on hard inputs
(rows spread over many binades, graded columns, cancellation, subnormals, tiny k); the exact
reference is rational arithmetic (Fractions) on the float32 inputs. The host backend runs
pyblasgemm.ozaki's steps; the GPU tests (marked gpu) require its bits where no element ran
natively.
"""
from fractions import Fraction

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import ozaki as oz
from _ref import count_violations, exact, op
from conftest import gpu_cupy

U32 = 2.0**-24
#: float32's smallest subnormal: a product or sum below the normal range rounds to its grid
ETA32 = 2.0**-149


def violations(c, a, b):
    """How many elements (parts) of ``c`` break native float32's bound ``γ_k Σ|a||b| + k η``
    against the exact product. Complex: each part against ``γ_(k+1) Σ|a||b|`` with complex
    moduli, the bound of CGEMM's products (each term ``ar·br - ai·bi`` rounded within
    ``γ_2 |a||b|``, then k - 1 sums): at k = 1 native CGEMM itself exceeds ``γ_1`` (seen
    here); the guard holds the stricter ``γ_k``, as float64's does."""
    k = a.shape[1]
    steps = k + 1 if np.iscomplexobj(a) or np.iscomplexobj(b) else k
    # Σ|a||b| in float64 (each product exact, the sum rounded up a little: only the scale)
    scale = (np.abs(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64))
             @ np.abs(b.astype(np.complex128 if np.iscomplexobj(b) else np.float64))) * (1 + 2.0**-40)
    return count_violations(c, exact(a, b), scale, steps * U32 / (1 - steps * U32), Fraction(k) * Fraction(ETA32))


def f32(*xs):
    return tuple(np.asarray(x, np.float32) for x in xs)


def graded(rng, m, k, n, binades):
    """Columns of A alternately x1 and x2^-binades, rows of B the reverse: every term a large
    element times a small one (the float64 guard's issue-30 case, float32's scale)."""
    a = rng.uniform(0.5, 1.0, (m, k)) * rng.choice([-1, 1], (m, k))
    b = rng.uniform(0.5, 1.0, (k, n)) * rng.choice([-1, 1], (k, n))
    a *= np.where(np.arange(k) % 2 == 0, 1.0, 2.0 ** -binades)[None, :]
    b *= np.where(np.arange(k) % 2 == 0, 2.0 ** -binades, 1.0)[:, None]
    return f32(a, b)


def spread(rng, m, k, n, lo, hi):
    """Elements each scaled by 2^-u, u uniform in [lo, hi] binades."""
    return f32(rng.standard_normal((m, k)) * 2.0 ** -rng.uniform(lo, hi, (m, k)),
               rng.standard_normal((k, n)) * 2.0 ** -rng.uniform(lo, hi, (k, n)))


def row_scales(rng, m, k, n):
    """Rows of A and columns of B scaled over 2^-60 .. 2^60 (their products stay within
    float32's range, ~2^±126; the subnormal case goes below it)."""
    return f32(rng.standard_normal((m, k)) * 2.0 ** rng.integers(-60, 61, (m, 1)),
               rng.standard_normal((k, n)) * 2.0 ** rng.integers(-60, 61, (1, n)))


def cancelling(rng, m, k, n):
    """Products that cancel to about 2^-20 of Σ|a||b|."""
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    half = k // 2
    a[:, half:2 * half] = a[:, :half]
    b[half:2 * half] = -b[:half] * (1 + 2.0**-20)
    return f32(a, b)


def subnormal(rng, m, k, n):
    """A's elements near and below float32's smallest normal (2^-126), B's O(2^±10): products
    and results in the subnormal range."""
    a = rng.standard_normal((m, k)) * 2.0 ** -rng.integers(118, 146, (m, k)).astype(float)
    b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-10, 10, (k, n)).astype(float)
    return f32(a, b)


def squares():
    """(1 + 2^-13)² - 1 + 0.5 - 0.5 = 2^-12 + 2^-26 exactly; float32 products lose the 2^-26."""
    x = np.float32(1 + 2**-13)
    return f32([[x, 1, 1, 1]], [[x], [-1], [0.5], [-0.5]])


CASES = {
    "squares (k = 4)": lambda rng: squares(),
    "graded 2^-12 (k = 24)": lambda rng: graded(rng, 6, 24, 5, 12),
    "graded 2^-20 (k = 40)": lambda rng: graded(rng, 5, 40, 4, 20),
    "spread 0-30 binades (k = 30)": lambda rng: spread(rng, 5, 30, 4, 0, 30),
    "spread 0-12 binades (k = 17)": lambda rng: spread(rng, 5, 17, 5, 0, 12),
    "row scales 2^±60 (k = 33)": lambda rng: row_scales(rng, 6, 33, 5),
    "cancelling (k = 32)": lambda rng: cancelling(rng, 4, 32, 4),
    "subnormal (k = 12)": lambda rng: subnormal(rng, 4, 12, 4),
    "k = 1": lambda rng: f32(rng.standard_normal((3, 1)), rng.standard_normal((1, 4))),
    "k = 2": lambda rng: f32(rng.standard_normal((3, 2)), rng.standard_normal((2, 2))),
    "k = 3": lambda rng: f32(rng.standard_normal((3, 3)), rng.standard_normal((3, 2))),
    "normal (k = 50)": lambda rng: f32(rng.standard_normal((4, 50)), rng.standard_normal((50, 3))),
}


def complex_case(case, rng):
    (ar, br), (ai, bi) = CASES[case](rng), CASES[case](rng)
    return (ar + 1j * ai).astype(np.complex64), (br + 1j * bi).astype(np.complex64)


# --------------------------------------------------------------------------- host

def test_settings_keep_26_bits_and_the_guard():
    for k in (1, 8, 1024, 8192, 65536):
        s = oz.setting(k, precision="float32")
        assert s.bits >= oz.DEFAULT_BITS_FP32 == 26 and s.guard and s.precision == "float32"
        assert s.count == 1 or oz.bits_for(s.count - 1, k) < oz.DEFAULT_BITS_FP32
        assert s.count < oz.setting(k).count        # fewer moduli than float64's default
    assert oz.setting(1024, precision="float32").count == 8
    assert not oz.setting(1024, bits=25, precision="float32").guard
    with pytest.raises(ValueError, match="precision='float16'"):
        oz.setting(64, precision="float16")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("draw", range(2))
def test_default_is_within_native_sgemm_bound_componentwise(case, draw):
    rng = np.random.default_rng(draw * 1000 + len(case))
    a, b = CASES[case](rng)
    c, how = oz.sgemm_ozaki(a, b)
    assert c.dtype == np.float32 and how.guard and how.precision == "float32"
    assert violations(c, a, b) == 0, (case, how.describe())
    # the public forms (matmul may run Cᵀ = Bᵀ Aᵀ: other bits, the same guarantee)
    assert violations(pyblasgemm.matmul(a, b, compute="int8-ozaki"), a, b) == 0
    got = pyblasgemm.gemm("N", "N", np.asfortranarray(a), np.asfortranarray(b), compute="int8-ozaki")
    assert violations(np.asarray(got), a, b) == 0


@pytest.mark.parametrize("case", ["graded 2^-12 (k = 24)", "spread 0-30 binades (k = 30)", "subnormal (k = 12)",
                                  "cancelling (k = 32)", "k = 1", "normal (k = 50)"])
def test_complex64_default_is_within_native_cgemm_bound(case):
    rng = np.random.default_rng(len(case) + 7)
    a, b = complex_case(case, rng)
    c, how = oz.cgemm_ozaki(a, b)
    assert c.dtype == np.complex64 and how.k == 2 * a.shape[1] and how.precision == "float32"
    assert violations(c, a, b) == 0, (case, how.describe())
    assert violations(pyblasgemm.matmul(a, b, compute="int8-ozaki"), a, b) == 0


def test_the_scheme_keeps_what_native_float32_loses():
    """The squares case: native float32 rounds x² first and returns 2^-12; the default keeps
    the exact 2^-12 + 2^-26 (one rounding). Graded data without the guard is far outside
    native's bound, with it the elements it cannot prove run natively and it says so."""
    a, b = squares()
    c, how = oz.sgemm_ozaki(a, b)
    assert float(c[0, 0]) == 2.0**-12 + 2.0**-26 and float((a @ b)[0, 0]) == 2.0**-12
    assert how.native_elements == 0
    rng = np.random.default_rng(30)
    a, b = graded(rng, 6, 24, 5, 20)
    raw, _ = oz.sgemm_ozaki(a, b, fallback=False)
    assert violations(raw, a, b) > 0
    c, how = oz.sgemm_ozaki(a, b)
    assert how.whole_native and "the whole product runs natively" in how.describe()
    np.testing.assert_array_equal(c, a @ b)                     # native float32: NumPy's SGEMM
    a[:3, 1::2] = a[:3, 0::2]                             # three rows the bits hold: the others native
    c, how = oz.sgemm_ozaki(a, b)
    assert how.native_elements == 15 and not how.whole_native, how
    assert "15 elements natively (the guard could not prove native float32's" in how.describe()
    assert violations(c, a, b) == 0


def test_random_data_needs_no_native_element_and_beats_native():
    """The guard costs one int8 GEMM and nothing more on random data (k >= 8), and the error
    is below native float32's against a long-double reference."""
    rng = np.random.default_rng(8)
    for k in (8, 33, 200, 1024):
        a, b = f32(rng.standard_normal((16, k)), rng.standard_normal((k, 12)))
        a[3] = 0.0
        c, how = oz.sgemm_ozaki(a, b)
        assert how.native_elements == 0 and how.native_rows == 0 and how.native_cols == 0, (k, how)
        assert not c[3].any()
        rows = np.arange(16) != 3                       # the zero row's scale is 0
        ref = a[rows].astype(np.longdouble) @ b.astype(np.longdouble)
        scale = np.abs(a[rows]).astype(np.longdouble) @ np.abs(b).astype(np.longdouble)
        ours = float(np.max(np.abs(c[rows] - ref) / scale))
        native = float(np.max(np.abs((a @ b)[rows] - ref) / scale))
        assert ours < native, (k, ours, native)


def test_inputs_within_two_binades_give_the_exact_product_rounded():
    """26 bits hold every float32 within 2 binades of its line's largest exactly: C is the
    exact product rounded to float32 (the float64 reconstruction's two ulps aside: within
    u |exact| + 2^-50 |exact|)."""
    rng = np.random.default_rng(4)
    a = f32(rng.uniform(0.5, 2.0, (5, 37)) * rng.choice([-1, 1], (5, 37)))[0]
    b = f32(rng.uniform(0.5, 2.0, (37, 4)) * rng.choice([-1, 1], (37, 4)))[0]
    c, how = oz.sgemm_ozaki(a, b)
    assert how.native_elements == 0
    for (i, j), r in np.ndenumerate(exact(a, b)):
        assert abs(Fraction(float(c[i, j])) - r) <= (Fraction(U32) + Fraction(2.0**-50)) * abs(r)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_inf_and_nan_propagate_as_native(dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 9)).astype(dtype)
    b = rng.standard_normal((9, 5)).astype(dtype)
    a[1, 4], b[2, 3] = np.inf, np.nan
    with np.errstate(invalid="ignore"):
        native = a @ b
        got = pyblasgemm.matmul(a, b, compute="int8-ozaki")
        c, how = (oz.sgemm_ozaki if dtype == np.float32 else oz.cgemm_ozaki)(a, b)
    assert how is None and got.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(native))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(native))
    np.testing.assert_array_equal(c, native)


def test_terms_past_float32s_range_keep_their_finite_sum():
    """2^130 terms overflow float32 (SGEMM: inf - inf = NaN); the integer product keeps their
    sum, 2^129 - 3·2^127 = 2^127 (finite, exact); a sum past FLT_MAX rounds to Inf, with
    NumPy's overflow warning."""
    a = np.array([[2.0**100, 2.0**100, 2.0**99, 3 * 2.0**98]], np.float32)
    b = np.array([[2.0**30], [-2.0**30], [2.0**30], [-2.0**29]], np.float32)
    with np.errstate(all="ignore"):
        assert np.isnan(a @ b).all()
    got = pyblasgemm.matmul(a, b, compute="int8-ozaki")
    assert float(got[0, 0]) == 2.0**129 - 3 * 2.0**127
    b[1] = 2.0**30
    with pytest.warns(RuntimeWarning, match="overflow encountered in matmul"):
        got = pyblasgemm.matmul(a, b, compute="int8-ozaki")
    assert np.isposinf(got).all()


@pytest.mark.parametrize("m,k,n", [(0, 5, 3), (4, 0, 3), (3, 5, 0), (1, 1, 1), (1, 7, 1), (7, 13, 11),
                                   (17, 31, 2), (2, 1, 19)])
def test_sizes_zero_one_odd_and_prime(m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a, b = f32(rng.standard_normal((m, k)), rng.standard_normal((k, n)))
    got = pyblasgemm.matmul(a, b, compute="int8-ozaki")
    assert got.dtype == np.float32 and got.shape == (m, n)
    if k == 0:
        assert not got.any()
    assert violations(got, a, b) == 0
    z = (a + 1j * a[::-1]).astype(np.complex64)
    w = (b - 1j * b[:, ::-1]).astype(np.complex64)
    gz = pyblasgemm.matmul(z, w, compute="int8-ozaki")
    assert gz.dtype == np.complex64 and violations(gz, z, w) == 0


def _padded(rng, rows, cols, ld, dtype):
    """A column-major rows x cols matrix in an ld x cols buffer whose padding is NaN."""
    x = rng.standard_normal((ld, cols)) * 2.0 ** rng.integers(-6, 7, (ld, cols))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((ld, cols))
    buf = np.asfortranarray(x.astype(dtype))
    buf[rows:] = np.nan
    return buf


def _expected(oa, ob, c, alpha, beta):
    """What the host's int8-ozaki computes: the scheme's float64 (complex128) product, alpha and
    beta in that type (beta == 0: C not read), one rounding to C's type."""
    x, _ = oz.emulated(np.ascontiguousarray(oa), np.ascontiguousarray(ob))
    out = x * x.dtype.type(alpha) if alpha != 1 else x
    if beta != 0:
        out = out + c.astype(x.dtype) * x.dtype.type(beta)
    return out.astype(c.dtype)


@pytest.mark.parametrize("transa", ["N", "T", "C"])
@pytest.mark.parametrize("transb", ["N", "T", "C"])
@pytest.mark.parametrize("prefix", ["s", "c"])
def test_blas_form_every_transpose_padded_alpha_beta(prefix, transa, transb):
    """sgemm / cgemm with leading dimensions past the rows (padding NaN), every transpose pair,
    alpha and beta (applied in float64, C rounded once), and beta = 0 over a NaN C."""
    if prefix == "s" and "C" in (transa, transb):
        transa, transb = transa.replace("C", "T"), transb.replace("C", "T")
    dtype = np.float32 if prefix == "s" else np.complex64
    routine = getattr(pyblasgemm, prefix + "gemm")
    rng = np.random.default_rng(ord(transa) * 3 + ord(transb) + len(prefix))
    m, n, k = 13, 7, 29
    ra, ca = (m, k) if transa == "N" else (k, m)
    rb, cb = (k, n) if transb == "N" else (n, k)
    a, b = _padded(rng, ra, ca, ra + 3, dtype), _padded(rng, rb, cb, rb + 5, dtype)
    oa, ob = op(a[:ra], transa), op(b[:rb], transb)
    alpha, beta = (1.5, -0.5) if prefix == "s" else (1.5 - 0.25j, 0.5 + 1j)
    c = _padded(rng, m, n, m + 2, dtype)
    want = _expected(oa, ob, c[:m], alpha, beta)
    routine(transa, transb, m, n, k, alpha, a.ravel(order="F"), ra + 3, b.ravel(order="F"), rb + 5, beta,
            c.ravel(order="F"), m + 2, compute="int8-ozaki")
    np.testing.assert_array_equal(c[:m], want)
    assert np.isnan(c[m:]).all()                         # C's padding untouched
    nan_c = np.full((m + 2, n), np.nan, dtype, order="F")
    routine(transa, transb, m, n, k, 1.0, a.ravel(order="F"), ra + 3, b.ravel(order="F"), rb + 5, 0.0,
            nan_c.ravel(order="F"), m + 2, compute="int8-ozaki")
    assert np.isfinite(nan_c[:m]).all()
    np.testing.assert_array_equal(nan_c[:m], _expected(oa, ob, nan_c[:m], 1.0, 0.0))
    assert violations(nan_c[:m], oa, ob) == 0


def test_gemm_and_matmul_on_batches_and_layouts():
    rng = np.random.default_rng(9)
    a, b = f32(rng.standard_normal((3, 10, 21)), rng.standard_normal((3, 21, 6)))
    got = pyblasgemm.matmul(a, b, compute="int8-ozaki")
    for i in range(3):
        assert violations(got[i], a[i], b[i]) == 0
    out = pyblasgemm.gemm("T", "N", np.asfortranarray(a[0].T), np.asfortranarray(b[0]), compute="int8-ozaki")
    np.testing.assert_array_equal(np.asarray(out), oz.sgemm_ozaki(a[0], b[0])[0])


@pytest.mark.parametrize("bits", [1, 8, 20, 26, 40, 62])
def test_the_dial_and_its_stated_bound(bits):
    """Every dial from 1 to 62 bits: the stated bound (ozaki.error_bound: the truncation, 2u|c|
    and one subnormal ulp) holds against the exact product on hard inputs, the scheme alone;
    more bits, smaller error; at 62 bits the inputs are kept exactly."""
    rng = np.random.default_rng(bits)
    m, k, n = 5, 24, 4
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 21, (m, k)))
    a[1, 1::2] = -a[1, 0::2] * (1 + 2.0**-20)          # cancellation
    a[2] *= 2.0**-100                                   # a tiny row: C's row 2 subnormal
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-6, 7, (k, n)))
    a, b = f32(a, b)
    c, how = oz.sgemm_ozaki(a, b, bits=bits, fallback=False)
    assert how.bits == bits and how.guard == (bits >= oz.DEFAULT_BITS_FP32)
    bound = oz.error_bound(a, b, c, how)
    for (i, j), r in np.ndenumerate(exact(a, b)):
        assert abs(Fraction(float(c[i, j])) - r) <= Fraction(float(bound[i, j])), (bits, i, j)
    public = pyblasgemm.matmul(a, b, compute=f"int8-ozaki-{bits}")
    assert public.dtype == np.float32 and public.shape == (m, n)
    if bits == 62:     # nothing truncated: every element within float32's rounding of the exact
        assert violations(c, a, b) == 0
    z = (a + 0.5j * a).astype(np.complex64)
    cz, hz = oz.cgemm_ozaki(z, b.astype(np.complex64), bits=bits, fallback=False)
    assert hz.bits == bits and cz.dtype == np.complex64


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("bad", ["int8-ozaki-0", "int8-ozaki-63", "int8-ozaki-x", "int8-ozaki-", "int8-ozaki--5"])
def test_invalid_dials_name_the_argument_the_value_and_the_bound(dtype, bad):
    a = np.ones((2, 3), dtype)
    with pytest.raises(ValueError) as info:
        pyblasgemm.matmul(a, a.T, compute=bad)
    text = str(info.value)
    assert f"compute={bad!r}" in text and np.dtype(dtype).name in text and "bits 1..62" in text, text
    c = np.zeros(4, dtype)
    with pytest.raises(ValueError, match="bits 1..62"):
        getattr(pyblasgemm, "sgemm" if dtype == np.float32 else "cgemm")(
            "N", "N", 2, 2, 3, 1.0, a.ravel(), 2, a.ravel(), 3, 0.0, c, 2, compute=bad)


def test_wrong_types_for_the_host_routines():
    with pytest.raises(TypeError, match="float32"):
        oz.sgemm_ozaki(np.ones((2, 2)), np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="complex64"):
        oz.cgemm_ozaki(np.ones((2, 2), np.complex128), np.ones((2, 2), np.complex64))
    with pytest.raises(TypeError, match="float16"):
        oz.emulated(np.ones((2, 2), np.float16), np.ones((2, 2), np.float16))


def test_the_float32_default_stays_native(monkeypatch):
    """Only a call that names the mode runs it: the package default and the environment
    variable refuse it, and a plain float32 plan is never the composition."""
    from pyblasgemm.settings import SettingError

    assert pyblasgemm.get_default_compute() == "fp32"
    with pytest.raises(ValueError, match="mode='int8-ozaki' must be one of 'fp32', 'tf32', '3xtf32'"):
        pyblasgemm.set_default_compute("int8-ozaki")
    monkeypatch.setenv("PYBLASGEMM_FP32_COMPUTE", "int8-ozaki")
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", None)
    with pytest.raises(SettingError, match="PYBLASGEMM_FP32_COMPUTE='int8-ozaki'"):
        pyblasgemm.get_default_compute()
    monkeypatch.setattr("pyblasgemm._types._default_compute_fp32", "fp32")
    for dtype in ("float32", "complex64"):
        p = pyblasgemm.plan(8192, 8192, 8192, dtype, arch="sm_90")
        assert p.decomposition != "ozaki" and "Ozaki" not in p.explain()


@pytest.mark.parametrize("dtype,native", [("float32", "native SGEMM"), ("complex64", "native CGEMM")])
def test_plans_and_explain_state_bits_and_bound(dtype, native):
    """An explicit int8-ozaki: the planner weighs the composition against native SGEMM / CGEMM
    (small: native, and says why), and explain() states the bits kept and the error bound."""
    small = pyblasgemm.plan(64, 64, 64, dtype, compute="int8-ozaki", arch="sm_90")
    assert small.backend == "cublas" and small.reason.startswith(f"{native} predicted faster")
    large = pyblasgemm.plan(8192, 8192, 8192, dtype, compute="int8-ozaki", arch="sm_90")
    text = large.explain()
    two = 2 if dtype == "complex64" else 1
    how = oz.setting(8192 * two, precision="float32")
    assert large.backend == "tensorcore" and large.decomposition == "ozaki", text
    assert f"as {how.bits}-bit integers" in text and f"error: {how.bound()}" in text
    assert "u = 2^-24" in text and "never above native float32's" in text and native in text
    dial = pyblasgemm.plan(8192, 8192, 8192, dtype, compute="int8-ozaki-16", arch="sm_90").explain()
    assert "as 16-bit integers" in dial and "(the guard)" not in dial
    forced = pyblasgemm.plan(64, 64, 64, dtype, compute="int8-ozaki", backend="tensorcore", arch="sm_90")
    assert forced.backend == "tensorcore" and forced.launch.setting.precision == "float32"


# --------------------------------------------------------------------------- GPU

_cupy = gpu_cupy        # (conftest's: CuPy, or the test skipped without a device)


def _gpu_and_host(transa, transb, a, b, c, alpha, beta, compute="int8-ozaki", routes=None):
    """(GPU result, host result, GPU route) of one gemm call on the same bytes; ``routes``: a
    list the (GPU, host) routes are appended to."""
    from pyblasgemm.composite import last_route

    cupy = _cupy()
    out_d = cupy.asarray(c, order="F")
    pyblasgemm.gemm(transa, transb, cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), out_d, alpha, beta,
                    compute=compute, backend="tensorcore")
    route = last_route()
    out_h = np.array(c, order="F")
    pyblasgemm.gemm(transa, transb, a, b, out_h, alpha, beta, compute=compute)
    if routes is not None:
        routes.append((route, last_route()))
    return cupy.asnumpy(out_d), out_h, route


def _native_elements(route: str, shape) -> int:
    """At most how many elements a composite route computed natively (its record's words:
    'R rows and C columns natively', 'E elements natively', or a whole native product)."""
    import re

    m, n = shape
    if route.startswith("native"):
        return m * n
    count = 0
    lines = re.search(r"(\d+) rows and (\d+) columns natively", route)
    if lines:
        count += int(lines.group(1)) * n + int(lines.group(2)) * m
    found = re.search(r"(\d+) elements natively", route)
    return count + (int(found.group(1)) if found else 0)


def _host_bits_but_native(gpu, host, gpu_route, host_route, scale, k):
    """The emulated elements carry the host's bits; natively computed ones are cuBLAS's SGEMM /
    CGEMM against the host BLAS's (another summation order): within native's bound, and no
    more of them differ than the GPU's record says ran natively (and as many as the host's
    record says, where the host keeps one)."""
    native = _native_elements(gpu_route, gpu.shape)
    if host_route is not None and host_route != gpu_route:
        assert native == _native_elements(host_route, gpu.shape), (gpu_route, host_route)
    differ = int(np.count_nonzero(gpu != host))
    assert differ <= native, (differ, native, gpu_route)
    assert np.all(np.abs(gpu.astype(np.complex128) - host) <= 4 * (k + 2) * U32 * scale), gpu_route


GPU_SIZES = [(1, 1, 1), (7, 5, 3), (33, 17, 64), (130, 70, 257), (64, 300, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SIZES)
@pytest.mark.parametrize("transa,transb", [("N", "N"), ("N", "T"), ("T", "N"), ("T", "T")])
def test_gpu_sgemm_has_the_host_bits(m, n, k, transa, transb):
    """The float32 passes read the operands as they are and round C once: the host's bits,
    alpha and beta included, and beta = 0 over a NaN C. k <= 2: the guard proves nothing,
    native SGEMM on both sides (cuBLAS's and the host BLAS's roundings)."""
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    sa = (m, k) if transa == "N" else (k, m)
    sb = (k, n) if transb == "N" else (n, k)
    a, b = f32(rng.standard_normal(sa), rng.standard_normal(sb))
    c = f32(rng.standard_normal((m, n)))[0]
    gpu, host, route = _gpu_and_host(transa, transb, a, b, c, 1.5, -0.5)
    if k <= 2:
        assert route.startswith("native: the guard"), route
        scale = 1.5 * np.abs(op(a, transa)).astype(float) @ np.abs(op(b, transb)) + 0.5 * np.abs(c)
        assert np.all(np.abs(gpu.astype(float) - host) <= 4 * (k + 2) * U32 * scale)
        return
    # small k leaves the guard little room (its allowance is (k - 2)u): some elements may run
    # natively, on both sides alike
    routes = []
    gpu, host, route = _gpu_and_host(transa, transb, a, b, c, 1.5, -0.5, routes=routes)
    scale = 1.5 * np.abs(op(a, transa)).astype(float) @ np.abs(op(b, transb)) + 0.5 * np.abs(c)
    _host_bits_but_native(gpu, host, *routes[-1], scale, k)
    if k >= 64:
        assert route.startswith("pyblasgemm Ozaki II") and "natively" not in route, route
    nan_c = np.full((m, n), np.nan, np.float32, order="F")
    gpu, host, _ = _gpu_and_host(transa, transb, a, b, nan_c, 1.0, 0.0, routes=routes)
    _host_bits_but_native(gpu, host, *routes[-1], scale - 0.5 * np.abs(c), k)
    assert np.isfinite(gpu).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", GPU_SIZES[1:4])
@pytest.mark.parametrize("transa,transb", [("N", "N"), ("T", "N"), ("C", "N"), ("N", "C"), ("C", "T"), ("C", "C")])
def test_gpu_cgemm_has_the_host_bits(m, n, k, transa, transb):
    """complex64: stacked in float32, the same passes; the host's bits with real alpha / beta,
    within CGEMM's rounding of it with complex ones."""
    rng = np.random.default_rng(m + 11 * n + 5 * k)
    sa = (m, k) if transa == "N" else (k, m)
    sb = (k, n) if transb == "N" else (n, k)
    a = (rng.standard_normal(sa) + 1j * rng.standard_normal(sa)).astype(np.complex64)
    b = (rng.standard_normal(sb) + 1j * rng.standard_normal(sb)).astype(np.complex64)
    c = (rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))).astype(np.complex64)
    routes = []
    gpu, host, route = _gpu_and_host(transa, transb, a, b, c, 1.0, 0.0, routes=routes)
    product_scale = np.abs(op(a, transa)).astype(float) @ np.abs(op(b, transb)) * 2.1
    _host_bits_but_native(gpu, host, *routes[-1], product_scale, k)
    if k >= 64:
        assert route.startswith("pyblasgemm Ozaki II") and "natively" not in route, route
    gpu, host, _ = _gpu_and_host(transa, transb, a, b, c, 0.5 - 2j, 1 + 0.25j)
    scale = np.abs(op(a, transa)).astype(float) @ np.abs(op(b, transb)) * 2.1 + np.abs(c) * 1.1
    assert np.all(np.abs(gpu.astype(np.complex128) - host) <= 4 * U32 * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("transa,transb", [("N", "N"), ("T", "T")])
def test_gpu_default_is_within_native_sgemm_bound(case, transa, transb):
    """The hard inputs on the GPU (subnormal operands included: read without -ftz's flush):
    within native SGEMM's bound; where nothing ran natively, the host's bits."""
    cupy = _cupy()
    rng = np.random.default_rng(len(case))
    a, b = CASES[case](rng)
    m, n = a.shape[0], b.shape[1]
    sa = np.asfortranarray(a if transa == "N" else a.T)
    sb = np.asfortranarray(b if transb == "N" else b.T)
    gpu, host, route = _gpu_and_host(transa, transb, sa, sb, np.full((m, n), np.nan, np.float32, order="F"),
                                     1.0, 0.0)
    assert violations(gpu, a, b) == 0, (case, route)
    _, how = oz.sgemm_ozaki(a, b)
    if how.native_elements == 0 and how.native_rows + how.native_cols == 0 and not how.whole_native:
        np.testing.assert_array_equal(gpu, host)
    del cupy


@pytest.mark.gpu
def test_gpu_subnormal_operands_and_results_are_kept():
    """Float32 operands below 2^-126 (a (double) conversion under CuPy's -ftz would read them as
    0) and a result in the subnormal range: the host's bits."""
    cupy = _cupy()
    rng = np.random.default_rng(126)
    a = f32(rng.uniform(1, 2, (9, 40)) * 2.0**-140)[0]                 # every element subnormal
    b = f32(rng.uniform(1, 2, (40, 6)) * rng.choice([-1, 1], (40, 6)))[0]
    got = cupy.asnumpy(pyblasgemm.matmul(cupy.asarray(a), cupy.asarray(b), compute="int8-ozaki",
                                         backend="tensorcore"))
    np.testing.assert_array_equal(got, pyblasgemm.matmul(a, b, compute="int8-ozaki"))
    assert np.count_nonzero(got) > 0 and violations(got, a, b) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_gpu_inf_nan_run_natively(dtype):
    from pyblasgemm.composite import last_route

    cupy = _cupy()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((20, 30)).astype(dtype)
    b = rng.standard_normal((30, 10)).astype(dtype)
    a[3, 4], b[7, 2] = np.inf, np.nan
    got = cupy.asnumpy(pyblasgemm.matmul(cupy.asarray(a), cupy.asarray(b), compute="int8-ozaki",
                                         backend="tensorcore"))
    assert last_route().startswith("native")
    with np.errstate(invalid="ignore"):
        native = a @ b
    np.testing.assert_array_equal(np.isnan(got), np.isnan(native))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(native))


@pytest.mark.gpu
@pytest.mark.parametrize("compute", ["int8-ozaki-1", "int8-ozaki-12", "int8-ozaki-26", "int8-ozaki-62"])
def test_gpu_dial_padded_leading_dimensions(compute):
    """The dial's extremes with leading dimensions past the rows (padding NaN): the host's bits."""
    cupy = _cupy()
    rng = np.random.default_rng(3)
    buf_a = np.full((50, 40), np.nan, np.float32, order="F")
    buf_a[:37] = rng.standard_normal((37, 40))
    buf_b = np.full((45, 23), np.nan, np.float32, order="F")
    buf_b[:40] = rng.standard_normal((40, 23))
    c = np.asfortranarray(rng.standard_normal((37, 23)).astype(np.float32))
    out_d = cupy.asarray(c, order="F")
    pyblasgemm.sgemm("N", "N", 37, 23, 40, 2.0, cupy.asarray(buf_a).ravel(order="F"), 50,
                     cupy.asarray(buf_b).ravel(order="F"), 45, 0.5, out_d.ravel(order="F"), 37,
                     compute=compute, backend="tensorcore")
    from pyblasgemm.composite import last_route

    gpu_route = last_route()
    out_h = np.array(c, order="F")
    pyblasgemm.sgemm("N", "N", 37, 23, 40, 2.0, buf_a.ravel(order="F"), 50, buf_b.ravel(order="F"), 45, 0.5,
                     out_h.ravel(order="F"), 37, compute=compute)
    # few bits: the guard sends elements to native SGEMM (cuBLAS's order against the host's)
    scale = 2.0 * np.abs(buf_a[:37]).astype(float) @ np.abs(buf_b[:40]) + 0.5 * np.abs(c)
    _host_bits_but_native(cupy.asnumpy(out_d), out_h, gpu_route, last_route(), scale, 40)


@pytest.mark.gpu
def test_gpu_graded_with_alpha_beta_and_determinism():
    """Graded data at 256³ (columns of A alternately x1 and x2^-20): native elements taken from
    cuBLAS SGEMM, every element within native's bound-level error; two runs, the same bits."""
    from pyblasgemm.composite import last_route

    cupy = _cupy()
    rng = np.random.default_rng(34)
    a, b = graded(rng, 256, 256, 256, 20)
    c = f32(rng.standard_normal((256, 256)))[0]
    runs = []
    for _ in range(2):
        out = cupy.asarray(c, order="F")
        pyblasgemm.gemm("N", "N", cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), out, 1.5, -0.5,
                        compute="int8-ozaki", backend="tensorcore")
        runs.append(cupy.asnumpy(out))
    assert "natively" in last_route() or last_route().startswith("native")
    np.testing.assert_array_equal(runs[0], runs[1])
    ref = 1.5 * (a.astype(np.float64) @ b.astype(np.float64)) - 0.5 * c.astype(np.float64)
    scale = 1.5 * (np.abs(a).astype(np.float64) @ np.abs(b)) + 0.5 * np.abs(c)
    assert np.all(np.abs(runs[0] - ref) <= (256 + 4) * U32 * scale)


@pytest.mark.gpu
def test_gpu_plans_on_the_device():
    small = pyblasgemm.plan(64, 64, 64, "float32", compute="int8-ozaki")
    assert small.backend == "cublas" and "native SGEMM" in small.reason
    text = pyblasgemm.plan(8192, 8192, 8192, "float32", compute="int8-ozaki").explain()
    assert "Ozaki II" in text and "u = 2^-24" in text


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_framework_arrays_take_the_mode_and_answer_in_their_type(framework):
    """PyTorch CPU tensors and JAX CPU arrays go through the array door to the host route:
    the same bits as NumPy's call, in the caller's type (float32 and complex64)."""
    mod = pytest.importorskip(framework)
    rng = np.random.default_rng(9)
    for dtype in (np.float32, np.complex64):
        a = rng.standard_normal((5, 7)).astype(dtype)
        b = rng.standard_normal((7, 3)).astype(dtype)
        want = pyblasgemm.matmul(a, b, compute="int8-ozaki")
        if framework == "torch":
            got = pyblasgemm.matmul(mod.from_numpy(a), mod.from_numpy(b), compute="int8-ozaki")
            assert isinstance(got, mod.Tensor)
        else:
            got = pyblasgemm.matmul(mod.numpy.asarray(a), mod.numpy.asarray(b), compute="int8-ozaki")
            assert isinstance(got, mod.Array)
        np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_framework_float64_arrays_take_the_mode_in_matmul_and_the_raw_form(framework):
    """float64 / complex128 from PyTorch CPU tensors and JAX CPU arrays (64-bit types on): the
    host route's bits in the caller's type, through matmul and (tensors) the BLAS raw form
    (dgemm / zgemm, 'T' on A, alpha and beta, column-major buffers)."""
    mod = pytest.importorskip(framework)
    rng = np.random.default_rng(11)
    m, n, k = 6, 4, 9
    for dtype, raw in ((np.float64, pyblasgemm.dgemm), (np.complex128, pyblasgemm.zgemm)):
        a, b, c = (rng.standard_normal(s) + (1j * rng.standard_normal(s) if dtype == np.complex128 else 0)
                   for s in ((m, k), (k, n), (m, n)))
        a, b, c = a.astype(dtype), b.astype(dtype), c.astype(dtype)
        # column-major buffers: A stored k x m (op 'T'), B k x n, C m x n
        bufs = (a.ravel(), b.T.ravel(), c.T.ravel())

        def raw_call(wrap):
            ba, bb, bc = (wrap(x.copy()) for x in bufs)
            return raw("T", "N", m, n, k, 0.5, ba, k, bb, k, -2.0, bc, m, compute="int8-ozaki")

        want = pyblasgemm.matmul(a, b, compute="int8-ozaki")
        want_raw = raw_call(np.asarray)
        if framework == "torch":
            got = pyblasgemm.matmul(mod.from_numpy(a), mod.from_numpy(b), compute="int8-ozaki")
            got_raw = raw_call(mod.from_numpy)
            assert isinstance(got, mod.Tensor) and isinstance(got_raw, mod.Tensor)
            assert got.dtype == mod.from_numpy(a).dtype
        else:
            from test_composite_gpu import _x64
            with _x64(mod):
                got = pyblasgemm.matmul(mod.numpy.asarray(a), mod.numpy.asarray(b), compute="int8-ozaki")
                assert isinstance(got, mod.Array) and got.dtype == a.dtype
                # the raw form writes C: a JAX C is refused before any work, saying what to use
                with pytest.raises(TypeError, match="c is a JAX array, which is immutable.*pyblasgemm.matmul"):
                    raw_call(mod.numpy.asarray)
            np.testing.assert_array_equal(np.asarray(got), want)
            continue
        np.testing.assert_array_equal(np.asarray(got), want)
        np.testing.assert_array_equal(got_raw.numpy(), want_raw)
