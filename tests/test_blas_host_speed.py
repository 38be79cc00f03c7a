"""The BLAS form's host fast path (issue 35, item 6): a repeated NumPy raw-form call reuses the
problem it described the first time (pyblasgemm.blas._HostCall) and keeps every check its key
cannot prove: overlap of C with A or B, C's writability, the scalars' values."""
import numpy as np
import pytest

import pyblasgemm
from pyblasgemm import blas

TRANS = ["N", "T", "C"]


def _op(x, t):
    return x if t == "N" else (x.T if t == "T" else x.conj().T)


def _buffers(dtype, ta, tb, m, n, k, rng):
    a = np.asfortranarray(rng.standard_normal((m, k) if ta == "N" else (k, m)).astype(dtype))
    b = np.asfortranarray(rng.standard_normal((k, n) if tb == "N" else (n, k)).astype(dtype))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * np.asfortranarray(rng.standard_normal(a.shape)).astype(dtype)
        b = b + 1j * np.asfortranarray(rng.standard_normal(b.shape)).astype(dtype)
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    c = np.asfortranarray(rng.standard_normal((m, n)).astype(dtype))
    return a, b, c


@pytest.fixture
def described(monkeypatch):
    """Counts describe_blas calls: the full path describes (and plans) every problem."""
    count = [0]
    real = blas.describe_blas

    def counting(*args):
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(blas, "describe_blas", counting)
    return count


@pytest.mark.parametrize("routine,dtype", [("sgemm", np.float32), ("dgemm", np.float64),
                                           ("cgemm", np.complex64), ("zgemm", np.complex128)])
@pytest.mark.parametrize("ta", TRANS)
@pytest.mark.parametrize("tb", TRANS)
def test_repeated_call_reuses_its_plan_and_is_right(routine, dtype, ta, tb, described):
    pyblasgemm.clear_plan_cache()
    rng = np.random.default_rng(7)
    m, n, k = 3, 5, 4
    f = getattr(pyblasgemm, routine)
    tol = 1e-5 if np.dtype(dtype).itemsize * (2 if np.dtype(dtype).kind != "c" else 1) <= 8 else 1e-12
    for call in range(3):       # first call described; later ones with new data, same key
        a, b, c = _buffers(dtype, ta, tb, m, n, k, rng)
        want = 1.5 * (_op(a, ta) @ _op(b, tb)) + 0.5 * c
        lda, ldb = a.shape[0], b.shape[0]
        got = f(ta, tb, m, n, k, 1.5, a, lda, b, ldb, 0.5, c, m)
        assert got is c
        np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    # real scalars on complex routines are not cached (as the GPU path): two describes there
    assert described[0] == (1 if np.dtype(dtype).kind != "c" else 3)


def test_beta_zero_does_not_read_c_on_a_hit(described):
    pyblasgemm.clear_plan_cache()
    a = np.arange(16, dtype=np.float32)
    c = np.zeros(16, np.float32)
    pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)
    c[:] = np.nan
    pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)
    assert described[0] == 1
    np.testing.assert_array_equal(c.reshape(4, 4, order="F"),
                                  a.reshape(4, 4, order="F") @ a.reshape(4, 4, order="F"))


def test_hit_keeps_the_checks_the_key_cannot_prove():
    pyblasgemm.clear_plan_cache()
    buf = np.zeros(32, np.float32)
    a, c = buf[:16], buf[16:]
    pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)     # cached signature
    with pytest.raises(ValueError, match="overlaps"):                   # same key, C on A
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, buf[16:], 4, buf[16:], 4, 0.0, c, 4)
    c.flags.writeable = False
    with pytest.raises(ValueError):
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)
    c.flags.writeable = True
    with pytest.raises(pyblasgemm.BlasArgumentError, match="alpha"):
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1e300, a, 4, a, 4, 0.0, c, 4)
    with pytest.raises(pyblasgemm.BlasArgumentError, match="beta"):
        pyblasgemm.sgemm("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, -1e300, c, 4)
    before = c.copy()
    pyblasgemm.sgemm("N", "N", 4, 4, 4, 0.0, a, 4, a, 4, 1.0, c, 4)       # alpha 0: C unchanged
    np.testing.assert_array_equal(c, before)


def test_repeated_call_is_fast():
    """Generous: the full path cost 22-70 µs at 4x4 on the dev hosts, the hit ~5-12 µs."""
    import time

    pyblasgemm.clear_plan_cache()
    a = np.ones(16, np.float32)
    c = np.zeros(16, np.float32)
    f = pyblasgemm.sgemm
    f("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            f("N", "N", 4, 4, 4, 1.0, a, 4, a, 4, 0.0, c, 4)
        best = min(best, (time.perf_counter() - t0) / 200)
    t0 = time.perf_counter()
    for _ in range(200):
        np.matmul(a.reshape(4, 4), a.reshape(4, 4))
    floor = (time.perf_counter() - t0) / 200
    assert best < max(20e-6, 15 * floor), (best, floor)


# --- SciPy's signature given to the raw form (issue 35, item 7): pointed to pyblasgemm.scipy --


def test_scipy_signature_points_to_pyblasgemm_scipy():
    a = np.ones((2, 2), np.float32, order="F")
    with pytest.raises(TypeError, match=r"missing 10 required arguments.*pyblasgemm\.scipy\.sgemm"):
        pyblasgemm.sgemm(1.0, a, a)
    with pytest.raises(TypeError, match=r"missing 1 required argument: 'ldc'") as info:
        pyblasgemm.shgemm("N", "N", 1, 1, 1, 1.0, a, 1, a, 1, 0.0, a)
    assert "pyblasgemm.scipy" not in str(info.value)      # no SciPy form of shgemm


def test_help_shows_the_blas_signature():
    import inspect

    params = list(inspect.signature(pyblasgemm.dgemm).parameters.values())
    assert [p.name for p in params[:13]] == ["transa", "transb", "m", "n", "k", "alpha", "a",
                                              "lda", "b", "ldb", "beta", "c", "ldc"]
    assert all(p.default is inspect.Parameter.empty for p in params[:13])


@pytest.mark.parametrize("routine,dtype", [("sgemm", np.float32), ("dgemm", np.float64)])
@pytest.mark.parametrize("ta", TRANS)
@pytest.mark.parametrize("tb", TRANS)
def test_plain_product_on_a_hit(routine, dtype, ta, tb, described):
    """alpha 1, beta 0 (numpy.matmul straight into C on a hit), new data each call."""
    pyblasgemm.clear_plan_cache()
    rng = np.random.default_rng(11)
    f = getattr(pyblasgemm, routine)
    for _ in range(3):
        a, b, c = _buffers(dtype, ta, tb, 3, 5, 4, rng)
        c[:] = np.nan                                   # beta 0: never read
        f(ta, tb, 3, 5, 4, 1.0, a, a.shape[0], b, b.shape[0], 0.0, c, 3)
        np.testing.assert_allclose(c, _op(a, ta) @ _op(b, tb), rtol=1e-5)
    assert described[0] == 1


def test_overflow_on_a_hit_is_reported_as_numpy_reports_it():
    pyblasgemm.clear_plan_cache()
    a = np.ones(4, np.float32)
    c = np.zeros(4, np.float32)
    pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, a, 2, a, 2, 0.0, c, 2)
    big = np.full(4, 3e38, np.float32)
    with pytest.warns(RuntimeWarning, match="overflow encountered in matmul") as rec:
        pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, big, 2, big, 2, 0.0, c, 2)
    assert rec[0].filename == __file__                  # at the caller's line
    assert np.isinf(c).all()
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        pyblasgemm.sgemm("N", "N", 2, 2, 2, 1.0, big, 2, big, 2, 0.0, c, 2)
