"""Defects found by adversarial testing (issue: reliability), one test each, host and GPU.

Each of these failed on the code before the fix: empty batch dimensions in matmul, gemm's
``beta`` with a fresh output, ``cupy.cublas.gemm``'s 'H' / integer flags and 0-d scalars,
alpha / beta overflow, and NumPy's other matmul keywords.
"""
import ml_dtypes
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import BlasArgumentError

from conftest import to_host

MATMUL_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
                 np.complex128, np.int8]

EMPTY_BATCH_SHAPES = [((0, 3, 2), (0, 2, 4)), ((0, 3, 2), (2, 4)), ((5, 0, 3, 2), (5, 0, 2, 4)),
                      ((1, 0, 3, 2), (6, 1, 2, 4)), ((0, 3, 2), (2,)), ((2,), (0, 2, 4)),
                      ((0, 1, 1), (0, 1, 1)), ((3, 0, 2, 2), (1, 2, 2))]


@pytest.mark.parametrize("dtype", MATMUL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shapes", EMPTY_BATCH_SHAPES, ids=str)
def test_matmul_empty_batch_dimension(xp, shapes, dtype):
    """A zero-size batch dimension gives the library's own empty result (was IndexError)."""
    a, b = xp.ones(shapes[0], dtype=dtype), xp.ones(shapes[1], dtype=dtype)
    got = pyblasgemm.matmul(a, b)
    if xp is not np and dtype == ml_dtypes.bfloat16:
        # cupy.matmul has no bfloat16 loop: NumPy's shape, CuPy's promotion (bfloat16)
        want = xp.empty(np.matmul(np.ones(shapes[0]), np.ones(shapes[1])).shape, dtype=dtype)
    else:
        want = (np.matmul if xp is np else xp.matmul)(a, b)
    assert type(got) is type(want) and got.shape == want.shape and got.dtype == want.dtype
    out = xp.empty(want.shape, dtype=want.dtype)
    assert pyblasgemm.matmul(a, b, out=out) is out


def test_matmul_empty_batch_with_a_broadcast_out_is_numpys_error():
    arr, out = np.ones((0, 1, 1)), np.ones((1, 1, 1))
    with pytest.raises(ValueError, match="non-broadcastable"):
        pyblasgemm.matmul(arr, arr, out=out)


@pytest.mark.parametrize("beta", [np.nan, np.inf, -np.inf])
def test_gemm_beta_ignored_without_out(xp, beta):
    """out omitted: beta is not applied (0 * nan was nan, so the result was all NaN)."""
    a = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    got = to_host(pyblasgemm.gemm("N", "T", a, a, beta=beta))
    np.testing.assert_allclose(got, to_host(a) @ to_host(a).T)


@pytest.mark.parametrize("flag, op", [("H", "C"), ("h", "C"), (0, "N"), (1, "T"), (2, "C"),
                                      ("C", "C"), ("n", "N")])
def test_gemm_takes_cupy_flags(xp, flag, op):
    """cupy.cublas.gemm's 'H' and its integer operations 0/1/2 (they were rejected)."""
    rng = np.random.default_rng(1)
    a_h = (rng.uniform(-1, 1, (3, 3)) + 1j * rng.uniform(-1, 1, (3, 3))).astype(np.complex64)
    a = xp.asarray(a_h)
    want = {"N": a_h, "T": a_h.T, "C": a_h.conj().T}[op] @ a_h
    got = to_host(pyblasgemm.gemm(flag, "N", a, a))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flag", [3, -1, True, "X", "NT", None, 1.0])
def test_gemm_rejects_other_flags(xp, flag):
    a = xp.ones((2, 2), dtype=np.float32)
    with pytest.raises(BlasArgumentError, match=r"gemm: parameter 1 \(transa.*'H' or 0, 1, 2"):
        pyblasgemm.gemm(flag, "N", a, a)


def test_gemm_zero_d_array_scalars(xp):
    """alpha / beta as 0-d NumPy and CuPy arrays, as cupy.cublas.gemm accepts them."""
    a = xp.asarray(np.arange(4, dtype=np.float64).reshape(2, 2))
    out = xp.ones((2, 2), dtype=np.float64)
    for alpha, beta in ((np.array(2.0), np.array(-1.0)), (xp.asarray(2.0), xp.asarray(-1.0))):
        c = out.copy()
        pyblasgemm.gemm("N", "N", a, a, out=c, alpha=alpha, beta=beta)
        np.testing.assert_allclose(to_host(c), 2 * to_host(a) @ to_host(a) - 1)


@pytest.mark.parametrize("value, what", [(10**400, "cannot be converted to float32"),
                                         (1e39, "outside the float32 range"),
                                         (-(2**200), "outside the float32 range"),
                                         (complex(1, 1e39), "outside the complex64 range")])
@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_scalar_overflow_is_a_blas_argument_error(xp, value, what, name):
    """An alpha / beta beyond the routine's scalar type names routine, parameter and value
    (was a bare OverflowError, or a silent infinity); C is left as it was."""
    prefix = "c" if isinstance(value, complex) else "s"
    dtype = np.complex64 if prefix == "c" else np.float32
    routine = getattr(pyblasgemm, prefix + "gemm")
    a = xp.ones(4, dtype=dtype)
    c = xp.full(4, 7, dtype=dtype)
    scalars = dict(alpha=1.0, beta=0.0)
    scalars[name] = value
    position = 6 if name == "alpha" else 11
    with pytest.raises(BlasArgumentError, match=fr"{prefix}gemm: parameter {position} \({name}=.*{what}"):
        routine("N", "N", 2, 2, 2, scalars["alpha"], a, 2, a, 2, scalars["beta"], c, 2)
    assert np.all(to_host(c) == 7)


def test_scalar_overflow_in_gemm_and_float64_range():
    a = np.ones((2, 2), dtype=np.float32)
    with pytest.raises(BlasArgumentError, match=r"gemm: parameter 6 \(alpha=1e\+39\)"):
        pyblasgemm.gemm("N", "N", a, a, alpha=1e39)
    d = np.ones(4)
    out = np.zeros(4)
    pyblasgemm.dgemm("N", "N", 2, 2, 2, 1e39, d, 2, d, 2, 0.0, out, 2)   # fits a double
    assert np.all(out == 2e39)
    with pytest.raises(BlasArgumentError, match="cannot be converted to float64"):
        pyblasgemm.dgemm("N", "N", 2, 2, 2, 10**400, d, 2, d, 2, 0.0, out, 2)


def test_infinite_and_nan_scalars_are_still_ieee_values():
    a, c = np.ones(4, dtype=np.float32), np.zeros(4, dtype=np.float32)
    pyblasgemm.sgemm("N", "N", 2, 2, 2, np.inf, a, 2, a, 2, 0.0, c, 2)
    assert np.all(c == np.inf)


def test_matmul_numpy_keywords(xp):
    """casting=, order=, subok=, axes= are numpy's / cupy's (they raised TypeError here)."""
    a = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    want = to_host(a) @ to_host(a).T
    out = xp.zeros((2, 2), dtype=bool)
    assert pyblasgemm.matmul(a, a.T, out=out, casting="unsafe") is out
    np.testing.assert_array_equal(to_host(out), want.astype(bool))
    np.testing.assert_allclose(to_host(pyblasgemm.matmul(a, a.T, order="K", casting="same_kind")),
                               want)
    batch = xp.asarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    axes = [(-1, -2), (-2, -1), (-2, -1)]
    got = pyblasgemm.matmul(batch, batch, axes=axes)
    np.testing.assert_allclose(to_host(got), np.matmul(to_host(batch), to_host(batch), axes=axes))


def test_matmul_axes_and_subok_on_the_host():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    want = np.matmul(a, a, axes=[(-1, -2), (-2, -1), (-2, -1)])
    np.testing.assert_array_equal(pyblasgemm.matmul(a, a, axes=[(-1, -2), (-2, -1), (-2, -1)]),
                                  want)
    m = np.ones((2, 2), dtype=np.float16)
    assert type(pyblasgemm.matmul(m, m, subok=False)) is np.ndarray
    with pytest.raises(TypeError):
        pyblasgemm.matmul(m, m, no_such_keyword=1)


@pytest.mark.parametrize("prefix", ["s", "d", "c", "z", "h"])
@pytest.mark.parametrize("backend", [None, "cublas"])
def test_negative_zero_beta_does_not_read_c(xp, prefix, backend):
    """beta = -0.0 is beta == 0: C is not read (the GPU fuzz found cuBLAS reading it, so NaN
    in C came back as NaN: cuBLAS tests beta's bits)."""
    from _ref import DTYPES
    dtype = DTYPES[prefix]
    rng = np.random.default_rng(3)
    a_h = rng.uniform(-1, 1, 16).astype(dtype)
    a = xp.asarray(a_h)
    c = xp.full(16, np.nan, dtype=dtype)
    beta = complex(-0.0, -0.0) if prefix in "cz" else -0.0
    if xp is np and backend == "cublas":       # refused before any work: C untouched
        with pytest.raises(ValueError, match="backend='cublas' runs on CuPy arrays"):
            getattr(pyblasgemm, prefix + "gemm")("N", "T", 4, 4, 4, 1.0, a, 4, a, 4, beta, c,
                                                  4, backend=backend)
        assert np.all(np.isnan(c))
        return
    getattr(pyblasgemm, prefix + "gemm")("N", "T", 4, 4, 4, 1.0, a, 4, a, 4, beta, c, 4,
                                          backend=backend)
    a64 = a_h.astype(np.complex128).reshape(4, 4, order="F")
    np.testing.assert_allclose(to_host(c).astype(np.complex128).reshape(4, 4, order="F"),
                               a64 @ a64.T, rtol=2e-3, atol=2e-3)


FLT_MIN = float(np.finfo(np.float32).tiny)


@pytest.mark.parametrize("prefix", ["s", "b", "h", "c"])
@pytest.mark.parametrize("backend", [None, "tensorcore", "cublas"])
@pytest.mark.parametrize("k", [0, 1, 8])
def test_subnormal_terms_are_kept(xp, prefix, backend, k):
    """alpha = beta = FLT_MIN: alpha·AB and beta·C are subnormal, their sum is not (the GPU fuzz
    found our epilogue and the alpha = 0 / k = 0 path flushing them: CuPy compiles with
    -ftz=true); the result matches the float64 reference like cuBLAS's."""
    from _ref import DTYPES, check_close, expected
    dtype = DTYPES[prefix]
    rng = np.random.default_rng(5)
    a_h = rng.uniform(0.5, 1, 4 * max(k, 1)).astype(dtype)
    c_h = (-rng.uniform(0.5, 1, 16)).astype(dtype)
    if prefix == "c":
        c_h = c_h * 1j
    a, c = xp.asarray(a_h), xp.asarray(c_h)
    alpha = 0.0 if k == 0 else FLT_MIN
    beta = complex(0, FLT_MIN) if prefix == "c" else FLT_MIN
    routine = getattr(pyblasgemm, prefix + "gemm")
    refusal = None
    if xp is np and backend is not None:
        refusal = ValueError            # GPU backends run CuPy arrays
    elif backend == "tensorcore" and prefix == "c" and k:
        refusal = NotImplementedError   # complex float32: not on our kernels at compute='fp32'
        # (float32 is: the FP32 FMA kind, whose subnormal products and sums are kept)
    if refusal is not None:
        with pytest.raises(refusal):
            routine("N", "T", 4, 4, k, alpha, a, 4, a, 4, beta, c, 4, backend=backend)
        np.testing.assert_array_equal(to_host(c), c_h)      # nothing written
        return
    routine("N", "T", 4, 4, k, alpha, a, 4, a, 4, beta, c, 4, backend=backend)
    opa = a_h.reshape(max(k, 1), 4).T[:, :k]
    ref, scale = expected(alpha, opa, opa.T, beta, c_h.reshape(4, 4, order="F"))
    got = to_host(c).reshape(4, 4, order="F")
    check_close(got, ref, scale, prefix, {"s": "fp32", "b": "fp32", "h": "fp32", "c": "fp32"}[prefix])
    assert np.all(np.abs(got.astype(np.complex128)) > 0) or prefix == "h"   # nothing flushed


@pytest.mark.parametrize("form", ["raw", "gemm", "matmul"])
def test_forced_gpu_backend_on_numpy_arrays_is_refused_for_empty_problems_too(form):
    """k = 0 / empty shapes are answered without planning, but a backend that cannot run the
    arrays is still an error (it was silently run on the host)."""
    a = np.ones((3, 0), dtype=np.float32)
    with pytest.raises(ValueError, match="backend='cublas' runs on CuPy arrays"):
        if form == "raw":
            pyblasgemm.sgemm("N", "N", 3, 3, 0, 1.0, np.ones(3, np.float32), 3,
                             np.ones(3, np.float32), 1, 0.0, np.ones(9, np.float32), 3,
                             backend="cublas")
        elif form == "gemm":
            pyblasgemm.gemm("N", "T", a, a, backend="cublas")
        else:
            pyblasgemm.matmul(a, a.T, backend="cublas")
