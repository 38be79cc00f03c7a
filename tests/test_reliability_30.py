"""Issue #30 (reliability), items 3, 6 and 8: the adversarial cases, one test each.

Each failed on the code before the fix: an epilogue with an integer or bool ``dtype=`` cast
before its activation (and NumPy refuses such a ``dtype=`` for float operands); messages that
named an argument the user never gave (``backend=`` for ``PYBLASGEMM_BACKEND``, ``gemm``'s
``bias`` for ``grouped_matmul``'s ``bias[1]``, ``matmul``'s for ``fused_mlp``'s ``b1``), said
"float32 ... expected float32" for byte-swapped data, or were NumPy's bare "assignment
destination is read-only"; ``gemm`` refused an ``out`` sharing bytes with ``a`` (NumPy computes
it); the int8 host route widened whole operands to float64 (2^31 x 1 ran out of memory).
"""
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

import pyblasgemm

from conftest import to_host


# ---------------------------------------------------------------------------------------------
# 3. An epilogue's dtype=: NumPy's rule, the activation before the cast
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_epilogue_refuses_the_integer_dtype_numpy_refuses(xp, dtype):
    """a @ b = -23 with dtype=uint8 and relu was 233 (the product cast first, relu after)."""
    a = xp.asarray(np.array([[-23.0]], np.float32))
    b = xp.asarray(np.array([[1.0]], np.float32))
    with pytest.raises(TypeError):
        np.matmul(to_host(a), to_host(b), dtype=dtype)              # NumPy's rule
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=rf"matmul: dtype={name} is refused for float32 @ float32"):
        pyblasgemm.matmul(a, b, dtype=dtype, activation="relu")
    with pytest.raises(TypeError, match=rf"matmul: out has dtype {name}, refused"):
        pyblasgemm.matmul(a, b, out=xp.zeros((1, 1), dtype), bias=xp.zeros(1, dtype))
    # int16 operands into uint8: NumPy refuses that cast of the operands too
    i16 = xp.asarray(np.array([[-23]], np.int16))
    with pytest.raises(TypeError, match="dtype=uint8 is refused for int16 @ int16"):
        pyblasgemm.matmul(i16, i16, dtype=np.uint8, activation="relu")


def _gelu64(v):
    return v * 0.5 * (1 + erf(v / np.sqrt(2.0)))


def test_epilogue_integer_result_is_numpys_product_activated_before_the_cast(xp):
    """An integer result NumPy computes: its product (in dtype=, as NumPy's matmul forms it),
    plus the bias, activated exactly, then cast. The int32 product was formed in int32 (2^20 x
    2^12 wrapped to 0 before the int64 cast; cupy.matmul's dtype= does so too) and the
    activation in float32 (2^40 + 8 rounded to 2^40)."""
    a = np.array([[2**20, -300], [-200, 7]], np.int32)
    b = np.array([[2**12, 3], [1, -5]], np.int32)
    want = np.maximum(np.matmul(a, b, dtype=np.int64), 0)            # [[2^32 - 300, ...]]
    got = pyblasgemm.matmul(xp.asarray(a), xp.asarray(b), dtype=np.int64, activation="relu")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(to_host(got), want)
    x = xp.asarray(np.array([[2**30 + 3, -5]], np.int64))
    got = pyblasgemm.matmul(x, xp.asarray(np.array([[1], [0]], np.int64)), activation="gelu")
    np.testing.assert_array_equal(to_host(got), _gelu64(np.array([[2.0**30 + 3]])).astype(np.int64))
    a, b = np.array([[200, -300], [-200, 7]], np.int16), np.array([[20, 3], [1, -5]], np.int16)
    bias = np.array([7, -2100], np.int32)
    pre = xp.empty((2, 2), np.int32)
    got = pyblasgemm.matmul(xp.asarray(a), xp.asarray(b), dtype=np.int32, bias=xp.asarray(bias),
                            activation="relu", preactivation_out=pre)
    np.testing.assert_array_equal(to_host(pre), np.matmul(a, b, dtype=np.int32) + bias)
    np.testing.assert_array_equal(to_host(got), np.maximum(to_host(pre), 0))
    # int64 values past float32's 24 bits stay exact through relu and a bias
    x = xp.asarray(np.array([[2**40 + 1, 5], [-(2**41), 3]], np.int64))
    w = xp.asarray(np.array([[1], [1]], np.int64))
    got = pyblasgemm.matmul(x, w, bias=xp.asarray(np.array([2], np.int64)), activation="relu")
    np.testing.assert_array_equal(to_host(got), [[2**40 + 8], [0]])


def test_epilogue_bfloat16_dtype_kept_where_numpy_has_no_loop():
    """NumPy refuses every dtype=bfloat16 (ml_dtypes has no bfloat16 matmul loop); the epilogue
    keeps it as NumPy keeps an out of that type: a float32 product, activated, rounded once."""
    a = np.array([[1.5, -2.0]], np.float32)
    b = np.array([[2.0], [1.0]], np.float32)
    got = pyblasgemm.matmul(a, b, dtype=ml_dtypes.bfloat16, activation="relu")
    assert got.dtype == ml_dtypes.bfloat16 and float(got[0, 0]) == 1.0
    with pytest.raises(TypeError, match="dtype=uint8 is refused"):      # (the failing half)
        pyblasgemm.matmul(a, b, dtype=np.uint8, activation="relu")


# ---------------------------------------------------------------------------------------------
# 6. Messages name what the user gave
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def env_backend(monkeypatch):
    """PYBLASGEMM_BACKEND set for one test (settings are read once per plan cache)."""
    def set_to(value):
        monkeypatch.setenv("PYBLASGEMM_BACKEND", value)
        pyblasgemm.clear_plan_cache()
    yield set_to
    monkeypatch.delenv("PYBLASGEMM_BACKEND", raising=False)
    pyblasgemm.clear_plan_cache()


def test_environment_backend_is_named_as_the_variable(env_backend):
    env_backend("cublas")
    a = np.ones((2, 2), np.float32)
    i8 = np.ones((2, 2), np.int8)
    calls = [lambda: pyblasgemm.gemm("N", "N", a, a),
             lambda: pyblasgemm.gemm("N", "N", a, a, activation="relu"),
             lambda: pyblasgemm.matmul(a, a),      # the NumPy fast path (it served these silently)
             lambda: pyblasgemm.matmul(i8, i8),
             lambda: pyblasgemm.matmul(a.astype(np.complex128), a.astype(np.complex128)),
             lambda: pyblasgemm.matmul(a, a, out=np.empty((2, 2), np.float32)),
             lambda: pyblasgemm.matmul(i8, i8, out=np.empty((2, 2), np.int8)),
             lambda: pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, a.ravel(), 2, a.ravel(), 2, 0.0,
                                      np.zeros(4, np.float32), 2)]
    for call in calls:
        with pytest.raises(ValueError, match=r"PYBLASGEMM_BACKEND='cublas' runs on CuPy arrays, "
                                             r"but the arrays are NumPy arrays") as info:
            call()
        assert "backend=" not in str(info.value)
    # the forms built on gemm / matmul name themselves, not the product they run
    for routine, call in (("grouped_matmul", lambda: pyblasgemm.grouped_matmul([a], [a])),
                          ("grouped_matmul", lambda: pyblasgemm.grouped_matmul(a, a[None], offsets=[2])),
                          ("fused_mlp", lambda: pyblasgemm.fused_mlp(a, a, a))):
        with pytest.raises(ValueError, match=rf"^{routine}: PYBLASGEMM_BACKEND='cublas' runs on CuPy"):
            call()
    # a backend= the user did give is still named as such
    with pytest.raises(ValueError, match=r"gemm: backend='tensorcore' runs on CuPy"):
        pyblasgemm.gemm("N", "N", a, a, backend="tensorcore")


def test_byte_swapped_dtypes_are_named_with_their_byte_order():
    """'>f4' is named float32 too: the messages were "dtype float32 is not supported" and
    "has dtype float32; expected float32"."""
    sw = np.ones((2, 2), ">f4")
    a = np.ones((2, 2), np.float32)
    order = r"float32 in non-native byte order \('>f4'\)"
    with pytest.raises(TypeError, match=rf"gemm: a has dtype {order}; .* native byte order"):
        pyblasgemm.gemm("N", "N", sw, a)
    with pytest.raises(TypeError, match=rf"gemm: b has dtype {order}"):
        pyblasgemm.gemm("N", "N", a, sw)
    with pytest.raises(TypeError, match=rf"gemm: out has dtype {order}; expected float32"):
        pyblasgemm.gemm("N", "N", a, a, out=np.zeros((2, 2), ">f4"))
    with pytest.raises(TypeError, match=rf"sgemm: parameter 7 \(a\) has dtype {order}; expected float32"):
        pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, sw.ravel(), 2, a.ravel(), 2, 0.0,
                         np.zeros(4, np.float32), 2)
    with pytest.raises(TypeError, match=rf"matmul: bias has dtype {order}; it must have"):
        pyblasgemm.matmul(a, a, bias=np.ones(2, ">f4"))
    i8 = np.ones((2, 2), np.int8)
    with pytest.raises(TypeError, match=rf"matmul: scale_a must be float32, got {order}"):
        pyblasgemm.matmul(i8, i8, scale_a=np.ones(2, ">f4"), scale_b=np.ones(2, np.float32))


def test_grouped_matmul_names_its_own_arguments_and_runs_nothing_on_error():
    """The list form's errors came from the inner gemm (``gemm: bias has shape``) after the
    earlier problems had run; the expert form's list of biases was an AttributeError."""
    a = [np.ones((2, 3), np.float32), np.ones((1, 2), np.float32)]
    b = [np.ones((3, 4), np.float32), np.ones((2, 5), np.float32)]
    out = [np.zeros((2, 4), np.float32), np.zeros((1, 5), np.float32)]
    bias = [np.ones(4, np.float32), np.ones(4, np.float32)]          # problem 1 needs (5,)
    with pytest.raises(ValueError, match=r"grouped_matmul: bias\[1\] has shape \(4,\); it must be \(5,\)"):
        pyblasgemm.grouped_matmul(a, b, out=out, bias=bias)
    assert not out[0].any()                       # problem 0 did not run before the error
    with pytest.raises(TypeError, match=r"grouped_matmul: bias\[0\] has dtype float64"):
        pyblasgemm.grouped_matmul(a, b, bias=[np.ones(4), np.ones(5)])
    with pytest.raises(ValueError, match=r"grouped_matmul: out\[1\] has shape \(1, 4\); expected \(1, 5\)"):
        pyblasgemm.grouped_matmul(a, b, out=[out[0], np.zeros((1, 4), np.float32)])
    with pytest.raises(TypeError, match=r"grouped_matmul: a\[1\] has dtype float32 but b\[1\] has dtype float64"):
        pyblasgemm.grouped_matmul(a, [b[0], np.ones((2, 5))])
    with pytest.raises(ValueError, match=r"grouped_matmul: compute='tf33'"):
        pyblasgemm.grouped_matmul(a, b, compute="tf33")
    read_only = np.zeros((1, 5), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"grouped_matmul: out\[1\] is read-only"):
        pyblasgemm.grouped_matmul(a, b, out=[out[0], read_only])
    # the expert form: one (groups, n) array, not a list of vectors
    x, w = np.ones((3, 2), np.float32), np.ones((2, 2, 4), np.float32)
    with pytest.raises(TypeError, match=r"grouped_matmul: bias must be one numpy array of shape \(2, 4\)"):
        pyblasgemm.grouped_matmul(x, w, offsets=[1, 3], bias=[np.ones(4, np.float32)] * 2)
    with pytest.raises(TypeError, match=r"grouped_matmul: bias has dtype float64"):
        pyblasgemm.grouped_matmul(x, w, offsets=[1, 3], bias=np.ones((2, 4)))


def test_fused_mlp_names_its_own_arguments():
    """The errors were matmul's: ``matmul: bias has shape (3,)`` for fused_mlp's b1."""
    x = np.ones((2, 3), np.float32)
    w1, w2 = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(ValueError, match=r"fused_mlp: b1 has shape \(3,\); it must be \(4,\)"):
        pyblasgemm.fused_mlp(x, w1, w2, b1=np.ones(3, np.float32))
    with pytest.raises(TypeError, match=r"fused_mlp: b2 has dtype float64"):
        pyblasgemm.fused_mlp(x, w1, w2, b2=np.ones(2))
    with pytest.raises(ValueError, match=r"fused_mlp: compute='tf33'"):
        pyblasgemm.fused_mlp(x, w1, w2, compute="tf33")
    with pytest.raises(ValueError, match=r"fused_mlp: backend='gpu'"):
        pyblasgemm.fused_mlp(x, w1, w2, backend="gpu")


def test_read_only_outputs_with_an_epilogue_are_named(xp):
    """NumPy's bare "assignment destination is read-only", after the product had run."""
    if xp is not np:
        pytest.skip("CuPy arrays have no read-only flag")
    a = np.ones((2, 2), np.float32)
    ro = np.zeros((2, 2), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="matmul: out is read-only"):
        pyblasgemm.matmul(a, a, out=ro, activation="relu")
    with pytest.raises(ValueError, match="gemm: out is read-only"):
        pyblasgemm.gemm("N", "N", a, a, out=ro, bias=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="matmul: preactivation_out is read-only"):
        pyblasgemm.matmul(a, a, activation="relu", preactivation_out=ro)
    i8 = np.ones((2, 2), np.int8)
    one = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="matmul: out is read-only"):
        pyblasgemm.matmul(i8, i8, out=ro, scale_a=one, scale_b=one)


def test_gemm_computes_an_out_that_shares_bytes_with_a(xp):
    """An out whose byte range interleaves with a's (two column blocks of one matrix) was
    refused as overlapping; NumPy and CuPy compute it. An out that does overlap a gets the
    answer from a's values before the call, as NumPy's out= does (beta included)."""
    rng = np.random.default_rng(30)
    buf_h = rng.uniform(-1, 1, (6, 8))
    b_h = rng.uniform(-1, 1, (4, 4))
    buf = xp.asarray(buf_h)
    a, out = buf[:, :4], buf[:, 4:]                   # disjoint, interleaved
    assert pyblasgemm.gemm("N", "N", a, xp.asarray(b_h), out=out) is out
    np.testing.assert_allclose(to_host(out), buf_h[:, :4] @ b_h, rtol=1e-12)
    np.testing.assert_array_equal(to_host(buf)[:, :4], buf_h[:, :4])     # a untouched
    # overlapping: out is a shifted by one row; alpha and beta read the values before the call
    buf = xp.asarray(buf_h)
    a, out = buf[:4, :4], buf[1:5, :4]
    want = 2.0 * buf_h[:4, :4] @ b_h - 0.5 * buf_h[1:5, :4]
    pyblasgemm.gemm("N", "N", a, xp.asarray(b_h), out=out, alpha=2.0, beta=-0.5)
    np.testing.assert_allclose(to_host(buf)[1:5, :4], want, rtol=1e-12)
    # and with an epilogue
    buf = xp.asarray(buf_h)
    a, out = buf[:4, :4], buf[:4, 4:]
    got = pyblasgemm.gemm("N", "N", a, xp.asarray(b_h), out=out, activation="relu")
    np.testing.assert_allclose(to_host(got), np.maximum(buf_h[:4, :4] @ b_h, 0), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# 8. The int8 host route: NumPy's results in at most twice NumPy's memory
# ---------------------------------------------------------------------------------------------

def _peak(call, warm=True):
    """(result, peak bytes traced while ``call`` ran; NumPy reports its arrays to tracemalloc).
    ``warm``: the call runs once untraced first, so that what its first run in a process loads
    (plans, tables: tracemalloc counts Python's objects too) is not counted as the route's
    temporaries (in the whole suite, a replanned call's objects made one peak 12 MB against
    NumPy's 4 MB; alone it passed)."""
    if warm:
        call()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _int8(rng, shape, fill=None):
    if fill is not None:
        return np.full(shape, fill, np.int8)
    return rng.integers(-128, 128, shape, dtype=np.int8)


#: (m, k, n, fill): a tall column (the 2^31 x 1 out-of-memory case, scaled down to 2^22), a
#: long k (4 blocks of 1024 terms), and k = 2^17 of -128 x -128 (the int32 sum wraps)
INT8_CASES = [(2**22, 1, 1, None), (4096, 4096, 1, None), (64, 2**17, 64, -128)]


@pytest.mark.parametrize("m, k, n, fill", INT8_CASES, ids=lambda v: str(v))
def test_int8_host_route_to_int32_within_twice_numpys_memory(m, k, n, fill):
    """int8 @ int8 on the host to int32 (gemm; matmul's dtype=int32): NumPy's bits (its int32
    matmul wraps every add, we wrap the exact sum: the same value modulo 2^32) in at most 2x
    the memory numpy.matmul(a, b, dtype=int32) takes. The route made float64 copies of whole
    operands and an int64 product: ~3x NumPy's for a tall column."""
    rng = np.random.default_rng(8)
    a, b = _int8(rng, (m, k), fill), _int8(rng, (k, n), fill)
    want, numpy_peak = _peak(lambda: np.matmul(a, b, dtype=np.int32))
    for call in (lambda: pyblasgemm.gemm("N", "N", a, b),
                 lambda: pyblasgemm.matmul(a, b, dtype=np.int32)):
        got, peak = _peak(call)
        np.testing.assert_array_equal(got, want)
        assert peak <= 2 * numpy_peak, (peak, numpy_peak)
    # alpha and beta wrap as the GPU's int32 arithmetic: the exact value modulo 2^32
    c0 = rng.integers(-(2**31), 2**31, (m, n), dtype=np.int32)
    c = c0.copy()
    _, peak = _peak(lambda: pyblasgemm.gemm("N", "N", a, b, out=c, alpha=2**30 + 1, beta=-(2**31)), warm=False)
    exact = (want.astype(np.int64) * (2**30 + 1) - c0.astype(np.int64) * 2**31) % 2**32
    np.testing.assert_array_equal(c.view(np.uint32), exact.astype(np.uint32))
    assert peak <= 2 * numpy_peak, (peak, numpy_peak)


def test_int8_host_route_to_int8_within_twice_numpys_memory():
    """An int8 result (matmul with out= or backend=) went through an int32 array of the
    result's size beside the float64 and int64 ones (2^31 x 1: out of memory where NumPy
    needs its 2 GiB result); now NumPy's bits at most 2x NumPy's memory."""
    rng = np.random.default_rng(9)
    a, b = _int8(rng, (2**22, 1)), _int8(rng, (1, 1))
    want, numpy_peak = _peak(lambda: np.matmul(a, b))
    out = np.empty((2**22, 1), np.int8)
    for call in (lambda: pyblasgemm.matmul(a, b, out=out),
                 lambda: pyblasgemm.matmul(a, b, backend="host")):
        got, peak = _peak(call)
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want)
        assert peak <= 2 * numpy_peak, (peak, numpy_peak)
