"""Every argument error: its type, its message (routine, position, name, value, bound), raised
before any work, with nothing written to C."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import BlasArgumentError


def _args(m=5, n=4, k=3, lda=None, ldb=None, ldc=None, dtype=np.float16, c_dtype=None):
    lda = lda or m
    ldb = ldb or k
    ldc = ldc or m
    a = np.ones(lda * k, dtype=dtype)
    b = np.ones(ldb * n, dtype=dtype)
    c = np.full(ldc * n, 7, dtype=c_dtype or dtype)
    return ["N", "N", m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc]


def _raises(exc, match, args, routine=pyblasgemm.hgemm, **kw):
    c = args[11]
    before = c.copy()
    with pytest.raises(exc, match=match) as info:
        routine(*args, **kw)
    np.testing.assert_array_equal(c, before)   # nothing half-written
    return info.value


def test_lda_message_like_xerbla():
    args = _args(lda=5)
    args[7] = 3
    err = _raises(BlasArgumentError, None, args)
    assert str(err) == "hgemm: parameter 8 (lda=3) must be >= max(1, m) = 5"
    assert (err.position, err.name, err.value) == (8, "lda", 3)
    assert isinstance(err, ValueError)


def test_lda_bound_names_k_when_transposed():
    args = _args()
    args[0] = "T"
    _raises(BlasArgumentError, r"parameter 8 \(lda=5\) must be >= max\(1, k\) = 3|", args)
    args[7] = 2
    _raises(BlasArgumentError, r"hgemm: parameter 8 \(lda=2\) must be >= max\(1, k\) = 3", args)


@pytest.mark.parametrize("pos,name,value,match", [
    (0, "transa", "X", r"hgemm: parameter 1 \(transa='X'\) must be one of 'N', 'T', 'C'"),
    (1, "transb", "", r"hgemm: parameter 2 \(transb=''\) must be one of"),
    (0, "transa", "NT", r"parameter 1 \(transa='NT'\)"),
    (2, "m", -1, r"hgemm: parameter 3 \(m=-1\) must be >= 0"),
    (3, "n", -2, r"hgemm: parameter 4 \(n=-2\) must be >= 0"),
    (4, "k", -3, r"hgemm: parameter 5 \(k=-3\) must be >= 0"),
    (9, "ldb", 2, r"hgemm: parameter 10 \(ldb=2\) must be >= max\(1, k\) = 3"),
    (12, "ldc", 4, r"hgemm: parameter 13 \(ldc=4\) must be >= max\(1, m\) = 5"),
    (12, "ldc", 0, r"parameter 13 \(ldc=0\) must be >= max\(1, m\) = 5"),
])
def test_scalar_argument_errors(pos, name, value, match):
    args = _args()
    args[pos] = value
    _raises(BlasArgumentError, match, args)


def test_ld_at_least_one_even_for_empty():
    args = _args(m=0)
    args[7] = 0
    _raises(BlasArgumentError, r"parameter 8 \(lda=0\) must be >= max\(1, m\) = 1", args)


def test_checks_in_reference_order():
    """Several bad arguments: the first in parameter order is reported, as xerbla does."""
    args = _args()
    args[2], args[12] = -1, 0
    _raises(BlasArgumentError, r"parameter 3 \(m=-1\)", args)


@pytest.mark.parametrize("pos,value,match", [
    (2, 2.5, r"hgemm: parameter 3 \(m=2.5\) must be an integer, not float"),
    (7, "5", r"parameter 8 \(lda='5'\) must be an integer"),
    (5, 1j, r"hgemm: parameter 6 \(alpha=1j\) must be a real number for float16"),
    (10, "0", r"parameter 11 \(beta='0'\) must be a real number"),
])
def test_type_errors(pos, value, match):
    args = _args()
    args[pos] = value
    _raises(TypeError, match, args)


def test_igemm_scalars_are_int32():
    args = _args(dtype=np.int8, c_dtype=np.int32)
    args[5] = 1.5
    _raises(TypeError, r"igemm: parameter 6 \(alpha=1.5\) must be an integer", args,
            routine=pyblasgemm.igemm)
    args[5] = 2**31
    _raises(BlasArgumentError, r"igemm: parameter 6 \(alpha=2147483648\) must be in the int32 "
            r"range", args, routine=pyblasgemm.igemm)


def test_buffer_too_small_names_array_and_sizes():
    args = _args(m=5, k=3)
    args[6] = np.ones(14, dtype=np.float16)
    _raises(BlasArgumentError, r"hgemm: parameter 7 \(a\) holds 14 elements, but a 5 x 3 "
            r"column-major matrix with lda=5 needs lda\*\(3-1\)\+5 = 15", args)
    args = _args(ldc=6)
    args[11] = np.ones(6 * 3 + 4, dtype=np.float16)
    _raises(BlasArgumentError, r"parameter 12 \(c\) holds 22 elements.*needs ldc\*\(4-1\)\+5 = 23",
            args)


def test_last_column_needs_only_its_rows():
    """A buffer exactly ld*(cols-1)+rows long is enough (as a BLAS pointer would be)."""
    args = _args(m=5, k=3, lda=8)
    args[6] = np.ones(8 * 2 + 5, dtype=np.float16)
    pyblasgemm.hgemm(*args)


def test_wrong_dtype_names_expected():
    args = _args()
    args[8] = args[8].astype(np.float32)
    _raises(TypeError, r"hgemm: parameter 9 \(b\) has dtype float32; expected float16", args)
    args = _args(dtype=np.int8, c_dtype=np.int8)
    args[5], args[10] = 1, 0
    _raises(TypeError, r"igemm: parameter 12 \(c\) has dtype int8; expected int32", args,
            routine=pyblasgemm.igemm)


def test_not_an_array():
    args = _args()
    args[6] = [1.0] * 15
    _raises(TypeError, r"parameter 7 \(a\) must be a NumPy or CuPy array, not list", args)


@pytest.mark.parametrize("make", [
    lambda: np.ones((5, 3), dtype=np.float16),                   # C-ordered 2-D
    lambda: np.ones(30, dtype=np.float16)[::2],                  # strided 1-D
    lambda: np.ones((5, 3, 1), dtype=np.float16, order="F"),     # 3-D
])
def test_layout_errors(make):
    args = _args()
    args[6] = make()
    _raises(ValueError, r"parameter 7 \(a\) must be a contiguous 1-D buffer or an F-contiguous",
            args)


def test_read_only_c():
    args = _args()
    args[11].flags.writeable = False
    with pytest.raises(ValueError, match=r"parameter 12 \(c\) is read-only"):
        pyblasgemm.hgemm(*args)


def test_c_overlapping_a():
    buf = np.ones(100, dtype=np.float16)
    args = _args()
    args[6] = buf[:15]
    args[11] = buf[10:30]
    _raises(ValueError, r"hgemm: c overlaps a in memory", args)


def test_c_adjacent_to_a_is_fine():
    buf = np.ones(100, dtype=np.float16)
    args = _args()
    args[6] = buf[:15]
    args[11] = buf[15:35]
    pyblasgemm.hgemm(*args)
    np.testing.assert_array_equal(buf[:15], 1)


def test_bad_compute_and_backend():
    _raises(ValueError, r"hgemm: compute='tf32' is not available for float16; choose one of "
            r"'fp32', 'fp16'", _args(), compute="tf32")
    _raises(ValueError, r"hgemm: backend='magic' must be one of", _args(), backend="magic")


def test_gpu_backend_on_host_arrays():
    _raises(ValueError, r"backend='cublas' runs on CuPy arrays, but the arrays are NumPy",
            _args(), backend="cublas")


@pytest.mark.gpu
def test_numpy_mixed_with_cupy():
    import cupy
    args = _args()
    args[8] = cupy.asarray(args[8])
    _raises(TypeError, r"hgemm: a is a numpy array but b is a cupy array", args)


@pytest.mark.gpu
def test_host_backend_on_gpu_arrays():
    import cupy
    args = _args()
    for i in (6, 8, 11):
        args[i] = cupy.asarray(args[i])
    with pytest.raises(ValueError, match="backend='host' runs on NumPy arrays"):
        pyblasgemm.hgemm(*args, backend="host")


@pytest.mark.gpu
def test_arrays_on_different_gpus():
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    args = _args()
    args[6] = cupy.asarray(args[6])
    with cupy.cuda.Device(1):
        args[8] = cupy.asarray(args[8])
    args[11] = cupy.asarray(args[11])
    with pytest.raises(TypeError, match="on GPU 0 but b is on GPU 1"):
        pyblasgemm.hgemm(*args)


def test_set_default_compute():
    with pytest.raises(ValueError, match="mode='fp8'"):
        pyblasgemm.set_default_compute("fp8")
    pyblasgemm.set_default_compute("tf32")
    try:
        assert pyblasgemm.get_default_compute() == "tf32"
        a = np.full(4, 1 + 2**-15, dtype=np.float32)   # 1 + 2^-15 rounds to 1 in tf32
        c = np.zeros(1, dtype=np.float32)
        pyblasgemm.sgemm("T", "N", 1, 1, 4, 1.0, a, 4, a, 4, 0.0, c, 1)
        assert c[0] == 4.0
        pyblasgemm.sgemm("T", "N", 1, 1, 4, 1.0, a, 4, a, 4, 0.0, c, 1, compute="fp32")
        assert c[0] > 4.0
    finally:
        pyblasgemm.set_default_compute("fp32")
    pyblasgemm.clear_plan_cache()


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(st.sampled_from("sdhbicz"), st.sampled_from("NnTtCc"), st.sampled_from("NnTtCc"),
       st.integers(0, 6), st.integers(0, 6), st.integers(0, 6), st.integers(0, 3),
       st.integers(-1, 3), st.booleans())
def test_fast_and_checked_descriptions_agree(prefix, ta, tb, m, n, k, pad, short, alias):
    """The fast guard of describe_blas and the checked path describe valid calls identically,
    and on invalid ones the fast path defers to the checked one (same exception)."""
    from pyblasgemm.desc import describe_blas, describe_blas_checked
    from pyblasgemm._types import TYPE_ROWS
    row = TYPE_ROWS[prefix]
    a_rows = m if ta in "Nn" else k
    b_rows = k if tb in "Nn" else n
    lda, ldb, ldc = max(1, a_rows) + pad, max(1, b_rows) + pad, max(1, m) + pad
    buf = np.ones(lda * 7 + ldb * 7 + ldc * 7 + 8, dtype=row.ab_dtype)
    a = buf[: lda * 6 + 6 - short]
    b = np.ones(ldb * 6 + 6, dtype=row.ab_dtype)
    c = np.ones(ldc * 6 + 6, dtype=row.c_dtype)
    if alias and row.c_dtype == row.ab_dtype:
        c = buf[2:]
    alpha, beta = (2, 3) if prefix == "i" else (2.0, 3.0)
    args = (row, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, None, None)
    try:
        want = describe_blas_checked(*args)
    except (ValueError, TypeError) as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            describe_blas(*args)
        return
    assert describe_blas(*args) == want


import re  # noqa: E402
