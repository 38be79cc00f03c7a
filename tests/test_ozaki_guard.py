"""The emulated float64's guarantee (pyblasgemm.ozaki's guard): at the default dial the result
is never less accurate than native float64's error bound, componentwise,
``|C - exact| <= γ_k Σ_k |a_ik| |b_kj|`` with ``γ_k = k u / (1 - k u)``, on any input.

Every case here failed before the guard (issue 30: graded data kept ~5 bits of an element 50
binades below its row's largest). The exact reference is rational arithmetic (Fractions); the
GPU cases also require the host's bits where no element ran natively.
"""
from fractions import Fraction

import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import ozaki as oz
from _ref import count_violations, exact
from conftest import gpu_cupy

U = 2.0**-53


def violations(c, a, b):
    """How many elements of ``c`` break native float64's bound γ_k Σ|a||b| + k η against the
    exact product (η = 2^-1074: a product below the normal range rounds to the subnormal grid;
    complex: each part against γ_k Σ|a||b| with complex moduli, the bound of the
    4-real-multiply product native ZGEMM computes)."""
    k = a.shape[1]
    # Σ|a||b| rounded up a little: it is only the bound's scale
    scale = (np.abs(a) @ np.abs(b)) * (1 + 4 * k * U)
    return count_violations(c, exact(a, b), scale, k * U / (1 - k * U), Fraction(2 * k) * Fraction(2) ** -1074)


def graded(rng, m, k, n, binades, mag=(0.5, 1.0)):
    """Columns of A alternately scaled by 1 and 2^-binades, rows of B the reverse: every term
    of every dot product is a large element times a small one (issue 30's H100 case)."""
    a = rng.uniform(*mag, (m, k)) * rng.choice([-1, 1], (m, k))
    b = rng.uniform(*mag, (k, n)) * rng.choice([-1, 1], (k, n))
    small = 2.0 ** -binades
    a *= np.where(np.arange(k) % 2 == 0, 1.0, small)[None, :]
    b *= np.where(np.arange(k) % 2 == 0, small, 1.0)[:, None]
    return a, b


def spread(rng, m, k, n, lo, hi):
    """Random normal elements each scaled by 2^-u, u uniform in [lo, hi] binades."""
    a = rng.standard_normal((m, k)) * 2.0 ** -rng.uniform(lo, hi, (m, k))
    b = rng.standard_normal((k, n)) * 2.0 ** -rng.uniform(lo, hi, (k, n))
    return a, b


def cancelling(rng, m, k, n):
    """Rows of A and columns of B whose products cancel to about 2^-40 of Σ|a||b|."""
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    half = k // 2
    a[:, half:2 * half] = a[:, :half]
    b[half:2 * half] = -b[:half] * (1 + 2.0**-40)
    return a, b


def subnormal(rng, m, k, n):
    """Elements near and below float64's smallest normal (2^-1022), mixed with normal ones."""
    a = rng.standard_normal((m, k)) * 2.0 ** -rng.integers(1000, 1070, (m, k))
    b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-30, 30, (k, n))
    return a, b


def issue_example():
    x = 2.0**-50 * (4 / 3)
    return np.array([[1.0, x]]), np.array([[x], [1.0]])


CASES = {
    "issue example (k = 2)": lambda rng: issue_example(),
    "graded 2^-45 (k = 24)": lambda rng: graded(rng, 6, 24, 5, 45),
    "graded 2^-30 (k = 40)": lambda rng: graded(rng, 5, 40, 4, 30),
    "graded 2^-20 (k = 64)": lambda rng: graded(rng, 4, 64, 4, 20),
    "spread 20-54 binades (k = 30)": lambda rng: spread(rng, 5, 30, 4, 20, 54),
    "spread 0-54 binades (k = 16)": lambda rng: spread(rng, 5, 16, 5, 0, 54),
    "cancelling (k = 32)": lambda rng: cancelling(rng, 4, 32, 4),
    "subnormal (k = 12)": lambda rng: subnormal(rng, 4, 12, 4),
    "tiny k (k = 3)": lambda rng: (rng.standard_normal((3, 3)), rng.standard_normal((3, 2))),
    "normal (k = 50)": lambda rng: (rng.standard_normal((4, 50)), rng.standard_normal((50, 3))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("draw", range(3))
def test_default_is_within_native_bound_componentwise(case, draw):
    rng = np.random.default_rng(draw * 1000 + len(case))
    a, b = CASES[case](rng)
    c, how = oz.dgemm_ozaki(a, b)
    assert how.guard
    assert violations(c, a, b) == 0, (case, how.describe())
    # the public form (it may run Cᵀ = Bᵀ Aᵀ: other bits, the same guarantee)
    assert violations(pyblasgemm.matmul(a, b, compute="int8-ozaki"), a, b) == 0


def test_graded_data_is_taken_natively_and_said():
    """The issue's cases: without the guard (fallback off) the error is far above native's;
    with it every element is within native's bound and the setting says how many ran natively."""
    rng = np.random.default_rng(30)
    a, b = graded(rng, 6, 24, 5, 45)
    raw, _ = oz.dgemm_ozaki(a, b, fallback=False)
    assert violations(raw, a, b) > 0                      # what the issue saw
    c, how = oz.dgemm_ozaki(a, b)
    assert how.native_elements == 30 and how.whole_native and "the whole product runs natively" in how.describe()
    np.testing.assert_array_equal(c, a @ b)
    a[:3, 1::2] = a[:3, 0::2]                             # three rows the bits hold: the others native
    c, how = oz.dgemm_ozaki(a, b)
    assert how.native_elements == 15 and not how.whole_native and "15 elements natively" in how.describe()
    assert violations(c, a, b) == 0
    a, b = issue_example()
    raw, _ = oz.dgemm_ozaki(a, b, fallback=False)
    assert abs(raw[0, 0] - (a @ b)[0, 0]) > 1e-18         # 0.4% off at 57 bits (1.6% at 55)
    c, how = oz.dgemm_ozaki(a, b)
    assert c[0, 0] == (a @ b)[0, 0] and how.native_elements == 1


def test_random_data_needs_no_native_element():
    """The guard costs one int8 GEMM, nothing more, where the bits suffice (k >= 8 on random
    normal data; also a zero row, which makes no error)."""
    rng = np.random.default_rng(8)
    for k in (9, 33, 200, 1024):
        a, b = rng.standard_normal((16, k)), rng.standard_normal((k, 12))
        a[3] = 0.0
        c, how = oz.dgemm_ozaki(a, b)
        assert how.native_elements == 0 and how.native_rows == 0, (k, how)


@pytest.mark.parametrize("case", ["graded 2^-30", "spread", "normal"])
def test_zgemm_default_is_within_native_bound(case):
    rng = np.random.default_rng(31)
    if case == "normal":
        a = rng.standard_normal((4, 20)) + 1j * rng.standard_normal((4, 20))
        b = rng.standard_normal((20, 3)) + 1j * rng.standard_normal((20, 3))
    else:
        make = (lambda r: graded(r, 4, 20, 3, 30)) if case.startswith("graded") else \
            (lambda r: spread(r, 4, 20, 3, 0, 54))
        (ar, br), (ai, bi) = make(rng), make(rng)
        a, b = ar + 1j * ai, br + 1j * bi
    c, how = oz.zgemm_ozaki(a, b)
    assert violations(c, a, b) == 0, (case, how.describe())
    raw, _ = oz.zgemm_ozaki(a, b, fallback=False)
    if case != "normal":
        assert violations(raw, a, b) > 0


def test_blas_and_gemm_forms_keep_the_guarantee():
    rng = np.random.default_rng(32)
    a, b = graded(rng, 5, 40, 4, 30)
    c = np.full(5 * 4, np.nan)
    pyblasgemm.dgemm("N", "N", 5, 4, 40, 1.0, a.ravel(order="F"), 5, b.ravel(order="F"), 40, 0.0, c, 5,
                     compute="int8-ozaki")
    assert violations(c.reshape((5, 4), order="F"), a, b) == 0
    out = pyblasgemm.gemm("N", "N", np.asfortranarray(a), np.asfortranarray(b), compute="int8-ozaki")
    assert violations(np.asarray(out), a, b) == 0


def test_dials_below_the_default_have_no_guard():
    rng = np.random.default_rng(33)
    a, b = graded(rng, 4, 40, 3, 30)
    _, how = oz.dgemm_ozaki(a, b, bits=40)
    assert not how.guard and how.native_elements == 0 and how.planes == how.count
    assert oz.setting(1024).planes == oz.setting(1024).count + 1


# --------------------------------------------------------------------------- GPU

_cupy = gpu_cupy        # (conftest's: CuPy, or the test skipped without a device)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("transa,transb", [("N", "N"), ("T", "N"), ("N", "T"), ("T", "T")])
def test_gpu_default_is_within_native_bound(case, transa, transb):
    """On the GPU (our int8 kernels, the guard's plane in the batch): the same guarantee; where
    no element ran natively the host's bits, alpha and beta included."""
    from pyblasgemm.composite import last_route

    cupy = _cupy()
    rng = np.random.default_rng(len(case))
    a, b = CASES[case](rng)
    m, n = a.shape[0], b.shape[1]
    sa = np.asfortranarray(a if transa == "N" else a.T)
    sb = np.asfortranarray(b if transb == "N" else b.T)
    out = cupy.asarray(np.full((m, n), np.nan), order="F")
    pyblasgemm.gemm(transa, transb, cupy.asarray(sa, order="F"), cupy.asarray(sb, order="F"), out, 1.0, 0.0,
                    compute="int8-ozaki", backend="tensorcore")
    route = last_route()
    got = cupy.asnumpy(out)
    assert violations(got, a, b) == 0, (case, route)
    host = np.full((m, n), np.nan, order="F")
    pyblasgemm.gemm(transa, transb, sa, sb, host, 1.0, 0.0, compute="int8-ozaki")
    _, how = oz.dgemm_ozaki(a, b)
    native_lines = how.native_rows + how.native_cols
    assert ("natively" in route) == (how.native_elements > 0 or native_lines > 0), (route, how)
    assert route.startswith("native: the guard") == how.whole_native, (route, how)
    if how.native_elements == 0 and native_lines == 0:
        np.testing.assert_array_equal(got, host)
    elif route.startswith("pyblasgemm"):   # cuBLAS's elements and lines may differ from the host BLAS's
        native = how.native_elements + how.native_rows * n + how.native_cols * m
        assert np.count_nonzero(got != host) <= native, (route, how)


@pytest.mark.gpu
def test_gpu_graded_8192_like_issue_with_alpha_beta():
    """The issue's H100 case at a size the test affords (512³, columns of A alternately x1 and
    x2^-30, rows of B the reverse): normwise error at native's level, not 1e-8; alpha and beta
    applied to the native elements as to the rest."""
    from pyblasgemm.composite import last_route

    cupy = _cupy()
    rng = np.random.default_rng(34)
    a, b = graded(rng, 512, 512, 512, 30)
    c = rng.standard_normal((512, 512))
    ref = 1.5 * (a.astype(np.longdouble) @ b.astype(np.longdouble)) - 0.5 * c
    out = cupy.asarray(c, order="F")
    pyblasgemm.gemm("N", "N", cupy.asarray(a, order="F"), cupy.asarray(b, order="F"), out, 1.5, -0.5,
                    compute="int8-ozaki", backend="tensorcore")
    assert "natively" in last_route()
    native = 1.5 * cupy.asnumpy(cupy.asarray(a) @ cupy.asarray(b)) - 0.5 * c
    err = float(np.linalg.norm((cupy.asnumpy(out) - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))
    err_native = float(np.linalg.norm((native - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))
    assert err <= 2 * err_native + 1e-16, (err, err_native)


@pytest.mark.gpu
def test_gpu_zgemm_graded_within_native_bound():
    cupy = _cupy()
    rng = np.random.default_rng(35)
    (ar, br), (ai, bi) = graded(rng, 6, 20, 5, 30), graded(rng, 6, 20, 5, 30)
    a, b = ar + 1j * ai, br + 1j * bi
    got = cupy.asnumpy(pyblasgemm.matmul(cupy.asarray(a), cupy.asarray(b), compute="int8-ozaki",
                                         backend="tensorcore"))
    assert violations(got, a, b) == 0
