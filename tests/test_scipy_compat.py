"""pyblasgemm.scipy against scipy.linalg.blas itself: same values (within the routine's
tolerance), shapes, dtypes, memory order, ``overwrite_c`` behaviour and refusals, on NumPy
arrays (and on CuPy arrays on a GPU machine, compared with SciPy on host copies)."""
import itertools

import numpy as np
import pytest
import scipy.linalg.blas as sblas

from pyblasgemm import scipy as pblas

from conftest import to_host

#: (prefix, SciPy routine, relative tolerance against SciPy's own result)
ROUTINES = [("s", sblas.sgemm, 2e-5), ("d", sblas.dgemm, 1e-12), ("c", sblas.cgemm, 2e-5),
            ("z", sblas.zgemm, 1e-12)]


def _rand(rng, shape, complex_):
    x = rng.uniform(-1, 1, shape)
    return x + 1j * rng.uniform(-1, 1, shape) if complex_ else x


def _close(got, want, tol):
    scale = np.max(np.abs(want)) if want.size else 1.0
    np.testing.assert_allclose(to_host(got), want, rtol=tol, atol=tol * max(scale, 1.0) * 4)


@pytest.mark.parametrize("prefix,ref,tol", ROUTINES, ids=[r[0] for r in ROUTINES])
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product((0, 1, 2), repeat=2)))
def test_values_shapes_and_order_match_scipy(xp, prefix, ref, tol, trans_a, trans_b):
    rng = np.random.default_rng(7 + 3 * trans_a + trans_b)
    m, n, k = 13, 7, 29                     # odd, prime: no tile multiple
    cplx = prefix in "cz"
    a = _rand(rng, (m, k) if trans_a == 0 else (k, m), cplx)
    b = _rand(rng, (k, n) if trans_b == 0 else (n, k), cplx)
    c = _rand(rng, (m, n), cplx)
    alpha, beta = (0.5 - 0.25j, 1.5 + 1j) if cplx else (0.5, 1.5)
    fn = getattr(pblas, prefix + "gemm")
    for kw in ({}, {"beta": beta, "c": c}):
        want = ref(alpha, a, b, trans_a=trans_a, trans_b=trans_b, **kw)
        args = {k_: (xp.asarray(v) if k_ == "c" else v) for k_, v in kw.items()}
        got = fn(alpha, xp.asarray(a), xp.asarray(b), trans_a=trans_a, trans_b=trans_b, **args)
        assert type(got) is type(xp.asarray(a))
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.flags.f_contiguous and want.flags.f_contiguous
        _close(got, want, tol)


@pytest.mark.parametrize("prefix,ref,tol", ROUTINES[:2], ids=["s", "d"])
def test_overwrite_c_like_scipy(xp, prefix, ref, tol):
    """In place exactly when SciPy is: overwrite_c and a Fortran-ordered c of the routine's type."""
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, (5, 4))
    dt = np.float32 if prefix == "s" else np.float64
    fn = getattr(pblas, prefix + "gemm")
    cases = [(dt, "F", 1, True), (dt, "C", 1, False), (dt, "F", 0, False),
             (np.float64 if dt is np.float32 else np.float32, "F", 1, False)]
    for c_dtype, order, overwrite, in_place in cases:
        c0 = rng.uniform(-1, 1, (6, 4))
        c_ref = np.array(c0, dtype=c_dtype, order=order)
        want = ref(2.0, a, b, beta=0.5, c=c_ref, overwrite_c=overwrite)
        assert (want is c_ref) == in_place                          # SciPy's own behaviour
        c_ours = xp.array(c0, dtype=c_dtype, order=order)
        before = to_host(c_ours).copy()
        got = fn(2.0, xp.asarray(a), xp.asarray(b), beta=0.5, c=c_ours, overwrite_c=overwrite)
        assert (got is c_ours) == in_place
        _close(got, want, tol)
        if not in_place:
            np.testing.assert_array_equal(to_host(c_ours), before)   # c untouched


def test_inputs_are_converted_like_scipy():
    """Integer, float64 and C/F-ordered inputs are converted to the routine's type; beta
    without c is ignored; beta = 0 never reads c (NaN there stays out)."""
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(pblas.sgemm(1, a, b), sblas.sgemm(1, a, b))
    np.testing.assert_array_equal(pblas.sgemm(1, a, b, beta=2.0), sblas.sgemm(1, a, b, beta=2.0))
    nan_c = np.full((2, 4), np.nan)
    got = pblas.dgemm(1, a, b, beta=0, c=nan_c)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, sblas.dgemm(1, a, b, beta=0, c=nan_c))
    assert pblas.sgemm(1, np.ones((0, 3)), b).shape == sblas.sgemm(1, np.ones((0, 3)), b).shape


@pytest.mark.parametrize("kwargs,match", [
    ({"trans_a": 3}, "trans_a=3 must be 0"),
    ({"trans_b": -1}, "trans_b=-1 must be 0"),
    ({"trans_a": "T"}, "trans_a='T' must be 0"),
])
def test_bad_trans_is_refused(kwargs, match):
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match=match):
        pblas.sgemm(1.0, a, a, **kwargs)
    with pytest.raises(Exception):                 # SciPy refuses these too
        sblas.sgemm(1.0, a, a, **kwargs)


def test_shape_errors_name_the_arguments():
    a, b = np.ones((2, 3)), np.ones((2, 4))
    with pytest.raises(ValueError, match=r"op\(a\) is 2 x 3 but op\(b\) is 2 x 4"):
        pblas.sgemm(1.0, a, b)
    with pytest.raises(ValueError, match=r"c has shape \(3, 3\), the product is 2 x 2"):
        pblas.sgemm(1.0, a, a, trans_b=1, c=np.ones((3, 3)))
    with pytest.raises(ValueError, match="a must be 2-D"):
        pblas.sgemm(1.0, np.ones(3), b)


@pytest.mark.parametrize("prefix,dtype,c_dtype,rtol", [
    ("h", np.float16, np.float16, 4e-3), ("b", "bfloat16", "bfloat16", 3e-2), ("i", np.int8, np.int32, 0)])
def test_types_scipy_lacks(xp, prefix, dtype, c_dtype, rtol):
    """hgemm, bgemm, igemm keep SciPy's signature for float16, bfloat16 and int8 (int32 out)."""
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    c_dtype = ml_dtypes.bfloat16 if c_dtype == "bfloat16" else c_dtype
    rng = np.random.default_rng(5)
    if prefix == "i":
        a, b = rng.integers(-128, 128, (9, 17)), rng.integers(-128, 128, (11, 17))
        alpha, beta = 2, 3
        c = rng.integers(-1000, 1000, (9, 11))
    else:
        a, b, c = rng.uniform(-1, 1, (9, 17)), rng.uniform(-1, 1, (11, 17)), rng.uniform(-1, 1, (9, 11))
        alpha, beta = 0.5, 0.25
    a_t, b_t, c_t = a.astype(dtype), b.astype(dtype), c.astype(c_dtype)
    got = getattr(pblas, prefix + "gemm")(alpha, xp.asarray(a_t), xp.asarray(b_t), beta=beta,
                                           c=xp.asarray(c_t), trans_b=1)
    assert got.dtype == np.dtype(c_dtype) and got.flags.f_contiguous
    want = alpha * a_t.astype(np.float64) @ b_t.astype(np.float64).T + beta * c_t.astype(np.float64)
    if prefix == "i":
        np.testing.assert_array_equal(to_host(got), want.astype(np.int64).astype(np.int32))
    else:
        np.testing.assert_allclose(to_host(got).astype(np.float64), want, rtol=rtol, atol=rtol * 4)
