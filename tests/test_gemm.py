"""The pythonic gemm: shapes from 2-D arrays, any memory order, views used in place."""
import numpy as np
import pytest

import pyblasgemm
from _ref import check_close, expected, op, random_array
from conftest import to_host

PREFIX_COMPUTE = [("s", "fp32"), ("d", "fp64"), ("h", "fp32"), ("b", "fp32"), ("i", "int32"),
                  ("c", "fp32"), ("z", "fp64"), ("sh", "fp32"), ("sb", "fp32")]


def _layouts(xp, x, which):
    """x in a given memory arrangement, same values."""
    if which == "C":
        return xp.ascontiguousarray(x)
    if which == "F":
        return xp.asfortranarray(x)
    if which == "Tview":   # transposed view of an F array: C-contiguous, no copy made
        return xp.asfortranarray(x.T).T
    # a strided view with no unit stride
    big = xp.zeros((x.shape[0] * 2, x.shape[1] * 3), dtype=x.dtype)
    big[::2, ::3] = x
    return big[::2, ::3]


@pytest.mark.parametrize("prefix,compute", PREFIX_COMPUTE)
@pytest.mark.parametrize("ta,tb", [("N", "N"), ("N", "T"), ("T", "N"), ("C", "C")])
@pytest.mark.parametrize("la,lb,lo", [("C", "C", "C"), ("F", "F", "F"), ("C", "F", "F"),
                                      ("Tview", "C", "C"), ("S", "F", "S"), ("F", "S", "C")])
def test_gemm_layouts(xp, prefix, compute, ta, tb, la, lb, lo):
    rng = np.random.default_rng(11)
    m, n, k = 13, 7, 9
    a = random_array(rng, prefix, (m, k) if ta == "N" else (k, m))
    b = random_array(rng, prefix, (k, n) if tb == "N" else (n, k))
    c = random_array(rng, prefix, (m, n), c=True)
    alpha, beta = (3, -1) if prefix == "i" else (0.5, 2.0)
    ref, scale = expected(alpha, op(a, ta), op(b, tb), beta, c)
    da, db = _layouts(xp, xp.asarray(a), la), _layouts(xp, xp.asarray(b), lb)
    dc = _layouts(xp, xp.asarray(c), lo)
    out = pyblasgemm.gemm(ta, tb, da, db, out=dc, alpha=alpha, beta=beta, compute=compute)
    assert out is dc
    check_close(to_host(dc), ref, scale, prefix, compute, f"gemm {ta}{tb} {la}{lb}{lo}")


@pytest.mark.parametrize("prefix", ["sh", "sb"])
def test_gemm_float32_out_for_16bit_operands_keeps_float32_accuracy(xp, prefix):
    """A float32 out makes gemm shgemm / sbgemm: no rounding to 16 bits, no float16 overflow
    (every product here is 3e4 and the sums 1e6, far beyond float16's 65504)."""
    rng = np.random.default_rng(21)
    m, n, k = 37, 29, 64
    a = (random_array(rng, prefix, (m, k)).astype(np.float32) * 180 + 200).astype(
        random_array(rng, prefix, 1).dtype)
    b = (random_array(rng, prefix, (k, n)).astype(np.float32) * 60 + 100).astype(a.dtype)
    c = np.full((m, n), np.nan, dtype=np.float32)       # beta = 0: never read
    ref, scale = expected(1.0, a, b, 0.0, c)
    assert ref.max() > 1e6
    out = xp.asarray(c)
    pyblasgemm.gemm("N", "N", xp.asarray(a), xp.asarray(b), out=out)
    check_close(to_host(out), ref, scale, prefix, "fp32", f"gemm {prefix} float32 out")
    with pytest.raises(TypeError, match="out has dtype float64; expected .* or float32"):
        pyblasgemm.gemm("N", "N", xp.asarray(a), xp.asarray(b), out=xp.asarray(c, dtype=np.float64))


def test_gemm_new_output_order_and_ignores_beta(xp):
    a = xp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    out = pyblasgemm.gemm("N", "T", a, a, beta=5.0)
    assert out.flags.c_contiguous and out.shape == (2, 2)      # both inputs C-ordered
    out = pyblasgemm.gemm("N", "T", a, xp.asfortranarray(a), beta=5.0)
    assert out.flags.f_contiguous
    np.testing.assert_allclose(to_host(out), to_host(a) @ to_host(a).T)


def test_gemm_int8_gives_int32(xp):
    a = xp.asarray(np.full((3, 4), 127, dtype=np.int8))
    out = pyblasgemm.gemm("N", "T", a, a)
    assert out.dtype == np.int32
    assert int(to_host(out)[0, 0]) == 4 * 127 * 127


def test_gemm_views_are_not_copied():
    """A transposed C-ordered output is computed in place (Cᵀ = Bᵀ Aᵀ), not via a temporary."""
    a = np.random.default_rng(1).standard_normal((6, 4))
    b = np.random.default_rng(2).standard_normal((4, 5))
    out = np.empty((6, 5))
    pyblasgemm.gemm("N", "N", a, b, out=out)
    np.testing.assert_allclose(out, a @ b)
    big = np.empty((8, 6))
    view = big[1:7, :5]              # a C-ordered, padded view
    assert pyblasgemm.gemm("N", "N", a, b, out=view) is view
    np.testing.assert_allclose(big[1:7, :5], a @ b)


@pytest.mark.parametrize("args,exc,match", [
    (lambda: (np.ones((2, 3)), np.ones((4, 2))), ValueError,
     r"gemm: op\(a\) is 2 x 3 but op\(b\) is 4 x 2; the inner dimensions 3 and 4 must agree"),
    (lambda: (np.ones((2, 3)), np.ones((3, 2), np.float32)), TypeError,
     "a has dtype float64 but b has dtype float32"),
    (lambda: (np.ones((2, 3), np.int64), np.ones((3, 2), np.int64)), TypeError,
     "gemm: dtype int64 is not supported"),
    (lambda: (np.ones(3), np.ones((3, 2))), ValueError, "gemm: a must be 2-D, got 1-D"),
    (lambda: ([[1.0]], np.ones((1, 1))), TypeError, "gemm: a must be a NumPy or CuPy array"),
])
def test_gemm_errors(args, exc, match):
    a, b = args()
    with pytest.raises(exc, match=match):
        pyblasgemm.gemm("N", "N", a, b)


def test_gemm_out_errors():
    a, b = np.ones((2, 3)), np.ones((3, 4))
    with pytest.raises(ValueError, match=r"out has shape \(4, 2\); expected \(2, 4\)"):
        pyblasgemm.gemm("N", "N", a, b, out=np.ones((4, 2)))
    with pytest.raises(TypeError, match="out has dtype float32; expected float64"):
        pyblasgemm.gemm("N", "N", a, b, out=np.ones((2, 4), np.float32))
    # an out overlapping a is computed as NumPy's out= is: as if from copies (issue #30)
    buf = np.arange(20.0)
    want = buf[:6].reshape(2, 3) @ b
    pyblasgemm.gemm("N", "N", buf[:6].reshape(2, 3), b, out=buf[4:12].reshape(2, 4))
    np.testing.assert_array_equal(buf[4:12].reshape(2, 4), want)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cublas", "tensorcore"])
def test_gemm_runs_on_the_current_stream(backend):
    """Work is enqueued on CuPy's current stream: waiting on an event recorded on that stream
    alone is enough to see the result (cuBLASLt takes the stream per call: no handle state)."""
    import cupy
    rng = np.random.default_rng(4)
    a = cupy.asarray(rng.uniform(-1, 1, (512, 512)).astype(np.float16))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out = pyblasgemm.gemm("N", "N", a, a, backend=backend)
        done = cupy.cuda.Event()
        done.record(stream)
    done.synchronize()
    want = a.get().astype(np.float32) @ a.get().astype(np.float32)
    np.testing.assert_allclose(out.get().astype(np.float32), want, rtol=2e-2, atol=2e-2)
