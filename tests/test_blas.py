"""The BLAS raw form against the float64 oracle, on every backend present.

Every prefix x all transpose pairs x sizes (0, 1, odd, prime, larger than a tile) x padded
leading dimensions x alpha/beta, including beta == 0 with NaN in C and alpha == 0 with NaN in A.
C's padding rows (between m and ldc) are filled with a sentinel that must survive.
"""
import itertools

import numpy as np
import pytest

import pyblasgemm
from _ref import C_DTYPES, TOLERANCE, col_major, expected, check_close, op, random_array
from conftest import XP_PARAMS, to_host

ROUTINES = {p: getattr(pyblasgemm, p + "gemm") for p in pyblasgemm._types.BLAS_ROWS}
COMPUTES = [(p, c) for (p, c) in TOLERANCE if c != "3xtf32"] + [("s", "3xtf32")]
TRANS = ["NN", "NT", "TN", "TT"]
SHAPES = [(1, 1, 1), (7, 5, 3), (33, 17, 9), (2, 31, 13), (64, 1, 40)]
LARGE = [(1000, 33, 7), (129, 130, 257)]

SENTINEL = {"i": 12345}


def _backends(xp_name):
    return ["host"] if xp_name == "numpy" else ["cublas", "tensorcore", "auto"]


def run_case(xp, backend, prefix, compute, ta, tb, m, n, k, alpha, beta, pad=3, seed=0,
             nan_c=False, nan_a=False):
    rng = np.random.default_rng(seed)
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    lda, ldb, ldc = max(1, a_rows) + pad, max(1, b_rows) + pad, max(1, m) + pad
    a = random_array(rng, prefix, lda * max(a_cols, 1))
    b = random_array(rng, prefix, ldb * max(b_cols, 1))
    c = random_array(rng, prefix, ldc * max(n, 1), c=True)
    if nan_a and prefix != "i":
        a[:] = np.nan
        b[:] = np.nan
    if prefix != "i":
        # padding rows of C hold a sentinel; with beta == 0 the matrix itself is NaN (poison)
        c_mat = col_major(c, ldc, max(n, 1), ldc)
        c_mat[m:, :] = 7
        if nan_c:
            c_mat[:m, :] = np.nan
        c = c_mat.reshape(-1, order="F").copy()
    opa = op(col_major(a, a_rows, a_cols, lda), ta)
    opb = op(col_major(b, b_rows, b_cols, ldb), tb)
    c_before = col_major(c, m, n, ldc)
    if alpha == 0:  # A and B are not read (they may be NaN): the product term is absent
        opa, opb = np.zeros_like(opa), np.zeros_like(opb)
    ref, scale = expected(alpha, opa, opb, beta,
                          np.zeros_like(c_before) if beta == 0 else c_before)
    da, db, dc = xp.asarray(a), xp.asarray(b), xp.asarray(c)
    routine = ROUTINES[prefix]
    out = routine(ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc, compute=compute,
                  backend=backend)
    assert out is dc
    got_all = to_host(dc)
    got = col_major(got_all, m, n, ldc)
    what = f"{routine.__name__}({ta}{tb}, m={m}, n={n}, k={k}, alpha={alpha}, beta={beta})"
    if m and n and ((alpha != 0 and k != 0) or beta != 1):
        check_close(got, ref, scale, prefix, compute, what)
    else:  # quick return: C untouched, bit for bit
        np.testing.assert_array_equal(got_all.view(np.uint8), c.view(np.uint8))
    # nothing outside the m x n matrix was written
    pad_rows = col_major(got_all, ldc, max(n, 1), ldc)[m:, :]
    orig_pad = col_major(c, ldc, max(n, 1), ldc)[m:, :]
    np.testing.assert_array_equal(pad_rows.view(np.uint8), orig_pad.view(np.uint8))


@pytest.mark.parametrize("xp_name", XP_PARAMS)
@pytest.mark.parametrize("prefix,compute", COMPUTES)
@pytest.mark.parametrize("trans", TRANS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_blas_sizes(xp_name, prefix, compute, trans, m, n, k):
    import importlib
    xp = importlib.import_module(xp_name)
    alpha, beta = (2, -3) if prefix == "i" else (1.5, -0.5)
    for backend in _backends(xp_name):
        if not _runs(xp_name, backend, prefix, compute):
            continue
        run_case(xp, backend, prefix, compute, trans[0], trans[1], m, n, k, alpha, beta)
        run_case(xp, backend, prefix, compute, trans[0], trans[1], m, n, k, alpha, 0,
                 nan_c=True, seed=1)


@pytest.mark.parametrize("xp_name", XP_PARAMS)
@pytest.mark.parametrize("prefix,compute", COMPUTES)
@pytest.mark.parametrize("m,n,k", LARGE)
def test_blas_large(xp_name, prefix, compute, m, n, k):
    import importlib
    xp = importlib.import_module(xp_name)
    alpha, beta = (1, 1) if prefix == "i" else (0.75, 0.25)
    for backend in _backends(xp_name):
        if _runs(xp_name, backend, prefix, compute):
            for ta, tb in ("TN", "NT"):
                run_case(xp, backend, prefix, compute, ta, tb, m, n, k, alpha, beta)


@pytest.mark.parametrize("xp_name", XP_PARAMS)
@pytest.mark.parametrize("prefix", list(pyblasgemm._types.BLAS_ROWS))
@pytest.mark.parametrize("m,n,k,alpha,beta", [
    (0, 5, 3, 1, 1), (5, 0, 3, 1, 0), (4, 5, 0, 1, 0), (4, 5, 0, 1, 2), (4, 5, 0, 1, 1),
    (4, 5, 3, 0, 1), (4, 5, 3, 0, 0), (4, 5, 3, 0, 3),
])
def test_blas_degenerate(xp_name, prefix, m, n, k, alpha, beta):
    """Quick returns, k == 0 and alpha == 0 (A and B are NaN and must not be read)."""
    import importlib
    xp = importlib.import_module(xp_name)
    compute = pyblasgemm._types.TYPE_ROWS[prefix].computes[0]
    for backend in _backends(xp_name):
        if _runs(xp_name, backend, prefix, compute):
            run_case(xp, backend, prefix, compute, "N", "T", m, n, k, alpha, beta,
                     nan_a=(alpha == 0 or k == 0), nan_c=(beta == 0))


@pytest.mark.parametrize("xp_name", XP_PARAMS)
@pytest.mark.parametrize("flags", ["CN", "NC", "CC", "CT", "tc", "nn"])
@pytest.mark.parametrize("prefix", ["c", "z", "s", "h"])
def test_blas_conjugate_flags(xp_name, flags, prefix):
    """'C' is the conjugate transpose for complex data and 'T' for real; flags in any case."""
    import importlib
    xp = importlib.import_module(xp_name)
    compute = pyblasgemm._types.TYPE_ROWS[prefix].computes[0]
    for backend in _backends(xp_name):
        if not _runs(xp_name, backend, prefix, compute):
            continue
        run_case(xp, backend, prefix, compute, flags[0].upper(), flags[1].upper(), 9, 6, 5,
                 0.5 if prefix in "sh" else 0.5 - 1j, 1, seed=3)


def _runs(xp_name, backend, prefix, compute):
    """Whether this backend offers the mode; where it does not, check that it says so loudly
    (NotImplementedError naming the mode), never substituting another computation."""
    if xp_name == "numpy":
        return True
    from pyblasgemm.kinds import ROUTES
    # cuBLAS runs compute='3xtf32' as its float32 SGEMM (kinds.ROUTES): no refusal there
    route = ROUTES[(prefix, compute)]
    # composite routes (float64 through int8, complex on tf32 / 3xTF32) run on our kernels
    refuses = ((backend == "tensorcore" and route.kernel_kind is None and route.composite is None)
               or (compute == "3xtf32" and backend == "tensorcore" and not _tensorcore_available()))
    if refuses:
        import cupy
        dt = {"s": cupy.float32, "d": cupy.float64, "c": cupy.complex64, "z": cupy.complex128}
        x = cupy.ones(4, dtype=dt[prefix])
        with pytest.raises(NotImplementedError):
            getattr(pyblasgemm, prefix + "gemm")("N", "N", 2, 2, 2, 1.0, x, 2, x, 2, 0.0,
                                                 cupy.ones(4, dt[prefix]), 2, compute=compute,
                                                 backend=backend)
        return False
    return True


def _tensorcore_available():
    try:
        import pyblasgemm.backends.tensorcore  # noqa: F401
        return True
    except ImportError:
        return False


def test_blas_padded_2d_fortran_buffers():
    """F-contiguous 2-D buffers whose first dimension is the leading dimension."""
    rng = np.random.default_rng(5)
    a = np.asfortranarray(rng.standard_normal((10, 4)))
    b = np.asfortranarray(rng.standard_normal((6, 3)))
    c = np.asfortranarray(np.full((8, 3), np.nan))
    pyblasgemm.dgemm("N", "N", 7, 3, 4, 1.0, a, 10, b, 6, 0.0, c, 8)
    np.testing.assert_allclose(c[:7], a[:7] @ b[:4], rtol=1e-13)
    assert np.isnan(c[7]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("prefix,compute", [("h", "fp32"), ("h", "fp16"), ("b", "fp32"),
                                            ("s", "tf32"), ("sh", "fp32"), ("sb", "fp32")])
@pytest.mark.parametrize("m,n,k", [(129, 130, 257), (1000, 33, 1000), (7, 1000, 31)])
@pytest.mark.parametrize("ta,tb", ["NN", "TN", "NT", "TT"])
def test_low_precision_error_within_twice_cublas(prefix, compute, m, n, k, ta, tb):
    """Every GPU backend's error vs float64 is at most twice cuBLAS's on the same inputs."""
    import cupy
    rng = np.random.default_rng(m * 7 + n + k)
    a_shape = (m, k) if ta == "N" else (k, m)
    b_shape = (k, n) if tb == "N" else (n, k)
    a = random_array(rng, prefix, a_shape[0] * a_shape[1])
    b = random_array(rng, prefix, b_shape[0] * b_shape[1])
    ref = op(col_major(a, *a_shape, a_shape[0]).astype(np.float64), ta) @ \
        op(col_major(b, *b_shape, b_shape[0]).astype(np.float64), tb)
    errors = {}
    for backend in ("cublas", "tensorcore"):
        c = cupy.full(m * n, np.nan, dtype=C_DTYPES[prefix])
        ROUTINES[prefix](ta, tb, m, n, k, 1.0, cupy.asarray(a), a_shape[0], cupy.asarray(b),
                         b_shape[0], 0.0, c, m, compute=compute, backend=backend)
        got = col_major(c.get(), m, n, m).astype(np.float64)
        errors[backend] = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert errors["tensorcore"] <= 2 * errors["cublas"] + 1e-7, errors
