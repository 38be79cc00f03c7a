"""Hypothesis fuzz of the three forms (raw BLAS, gemm, matmul) against a float64 reference.

Every example draws fresh random data (never zeros), a dtype and compute mode, flags in every
spelling the form accepts, sizes from 0 through odd, prime and tile-straddling values, padded
leading dimensions and offset (misaligned) pointers, alpha and beta (beta = 0 with C poisoned
by NaN), and a backend (auto or forced). It checks the result against the float64 reference
within the per-dtype tolerance of ``tests/_ref.py``, that nothing outside C's m x n region
changed (ld padding and a guard tail), and that a refusal (a forced backend that cannot run
the problem) left C bitwise unchanged.

The host variants run in CI on NumPy arrays; the ``gpu`` variants run the same checks on CuPy
arrays with the GPU backends forced and auto. ``tools/run_fuzz.py`` runs the GPU variants for
a set time and records the example and failure counts.
"""
import collections
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import pyblasgemm
from pyblasgemm._types import BLAS_ROWS, ROW_BY_DTYPE, TYPE_ROWS
from _ref import TOLERANCE, check_close, col_major, expected, random_array, widen

#: examples run per check, by array module (tools/run_fuzz.py reads it)
EXAMPLES = collections.Counter()

SIZES = st.one_of(st.integers(0, 9), st.sampled_from([16, 17, 31, 37, 63, 64, 65, 97, 127, 128,
                                                       129, 255, 257]),
                  st.integers(10, 300))
PADS = st.sampled_from([0, 0, 0, 1, 3, 8, 61])
#: examples per test and run; tools/run_fuzz.py raises it (FUZZ_EXAMPLES) for timed GPU runs
SETTINGS = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None,
                    derandomize=False, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _xp(name):
    if name == "cupy":
        import cupy
        return cupy
    return np


def _host(x):
    return x.get() if type(x).__module__.startswith("cupy") else np.asarray(x)


def _scalar(draw, kind, zero_weight=True):
    if kind == "int":
        return draw(st.sampled_from([0, 1, -1, 2, -3]) if zero_weight else st.integers(-3, 3))
    real = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5]),
                     st.floats(-2, 2, allow_nan=False, allow_subnormal=False))
    value = draw(real)
    if kind == "complex" and draw(st.booleans()):
        value = complex(value, draw(real))
    return value


def _backends(xp_name):
    return [None, "host"] if xp_name == "numpy" else [None, "tensorcore", "cublas"]


def _poison(c_host, beta, prefix):
    """C's values as given to the routine: NaN where beta = 0 (it must not be read)."""
    if beta == 0 and c_host.dtype.kind in "fc":
        c_host = c_host.copy()
        c_host[...] = np.nan
    return c_host


# ---------------------------------------------------------------------------------------------
# The raw BLAS form
# ---------------------------------------------------------------------------------------------

@st.composite
def raw_cases(draw, xp_name):
    prefix = draw(st.sampled_from(sorted(BLAS_ROWS)))
    row = TYPE_ROWS[prefix]
    return dict(
        prefix=prefix, compute=draw(st.sampled_from(row.computes)),
        transa=draw(st.sampled_from("NnTtCc")), transb=draw(st.sampled_from("NnTtCc")),
        m=draw(SIZES), n=draw(SIZES), k=draw(SIZES),
        pads=(draw(PADS), draw(PADS), draw(PADS)), offset=draw(st.integers(0, 3)),
        alpha=_scalar(draw, row.scalar_kind), beta=_scalar(draw, row.scalar_kind),
        backend=draw(st.sampled_from(_backends(xp_name))), seed=draw(st.integers(0, 2**32 - 1)))


def check_raw(xp_name, case):
    xp = _xp(xp_name)
    prefix, m, n, k = case["prefix"], case["m"], case["n"], case["k"]
    row = TYPE_ROWS[prefix]
    ta, tb = case["transa"].upper(), case["transb"].upper()
    ta, tb = (t if row.is_complex or t != "C" else "T" for t in (ta, tb))
    rng = np.random.default_rng(case["seed"])
    a_rows, a_cols = (m, k) if ta == "N" else (k, m)
    b_rows, b_cols = (k, n) if tb == "N" else (n, k)
    pa, pb, pc = case["pads"]
    lda, ldb, ldc = max(1, a_rows) + pa, max(1, b_rows) + pb, max(1, m) + pc
    off, tail = case["offset"], 5

    def buffer(rows, cols, ld, c=False):
        size = off + (ld * cols if rows and cols else 0) + tail
        return random_array(rng, prefix, size, c=c)

    a_h, b_h = buffer(a_rows, a_cols, lda), buffer(b_rows, b_cols, ldb)
    c_h = buffer(m, n, ldc, c=True)
    alpha, beta = case["alpha"], case["beta"]
    core = (slice(off, off + ldc * n),)
    if beta == 0 and c_h.dtype.kind in "fc" and m and n:
        view = c_h[off:off + ldc * n].reshape(n, ldc)
        view[:, :m] = np.nan                  # the matrix region is poisoned, padding is not
    before = c_h.copy()
    a, b, c = (xp.asarray(x)[off:] for x in (a_h, b_h, c_h))
    routine = getattr(pyblasgemm, row.routine)
    try:
        routine(case["transa"], case["transb"], m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                compute=case["compute"], backend=case["backend"])
    except NotImplementedError:
        # a forced backend that cannot run this problem refuses before any work
        assert case["backend"] is not None
        np.testing.assert_array_equal(_host(c), before[off:])
        EXAMPLES[f"raw-{xp_name}-refused"] += 1
        return
    got = np.concatenate([before[:off], _host(c)])
    # outside the m x n matrix nothing changed: the offset, the ld padding and the tail
    np.testing.assert_array_equal(got[:off], before[:off])
    np.testing.assert_array_equal(got[off + (ldc * n if m and n else 0):],
                                  before[off + (ldc * n if m and n else 0):])
    if m and n:
        pad_now = got[core].reshape(n, ldc)[:, m:]
        pad_before = before[core].reshape(n, ldc)[:, m:]
        np.testing.assert_array_equal(pad_now, pad_before)
        c0 = col_major(before[off:], m, n, ldc)
        if beta == 0:
            c0 = np.zeros_like(c0)
        opa = _op(col_major(a_h[off:], a_rows, a_cols, lda), ta)
        opb = _op(col_major(b_h[off:], b_rows, b_cols, ldb), tb)
        ref, scale = expected(alpha, opa, opb, beta, c0)
        check_close(col_major(got[off:], m, n, ldc), ref, scale, prefix, case["compute"],
                    what=repr(case))
    EXAMPLES[f"raw-{xp_name}"] += 1


def _op(x, flag):
    return x if flag == "N" else (x.T.conj() if flag == "C" else x.T)


@SETTINGS
@given(raw_cases("numpy"))
def test_fuzz_raw_host(case):
    check_raw("numpy", case)


@pytest.mark.gpu
@SETTINGS
@given(raw_cases("cupy"))
def test_fuzz_raw_gpu(case):
    check_raw("cupy", case)


# ---------------------------------------------------------------------------------------------
# gemm (cupy.cublas.gemm's form)
# ---------------------------------------------------------------------------------------------

GEMM_FLAGS = ["N", "T", "C", "H", "n", "t", "c", "h", 0, 1, 2]
_FLAG_OP = {"N": "N", "T": "T", "C": "C", "H": "C", 0: "N", 1: "T", 2: "C"}


@st.composite
def gemm_cases(draw, xp_name):
    dtype = draw(st.sampled_from(sorted(ROW_BY_DTYPE, key=str)))
    row = ROW_BY_DTYPE[dtype]
    out_dtype = row.c_dtype
    given_out = draw(st.booleans())
    if given_out and dtype.itemsize == 2 and draw(st.booleans()):
        out_dtype = np.dtype(np.float32)          # shgemm / sbgemm through a float32 out=
    return dict(
        prefix=row.prefix, dtype=dtype, out_dtype=out_dtype,
        transa=draw(st.sampled_from(GEMM_FLAGS)), transb=draw(st.sampled_from(GEMM_FLAGS)),
        m=draw(SIZES), n=draw(SIZES), k=draw(SIZES),
        layouts=tuple(draw(st.sampled_from(["C", "F", "sliced"])) for _ in range(3)),
        out=given_out, zero_d=draw(st.booleans()),
        alpha=_scalar(draw, row.scalar_kind), beta=_scalar(draw, row.scalar_kind),
        backend=draw(st.sampled_from(_backends(xp_name))), seed=draw(st.integers(0, 2**32 - 1)))


def _laid_out(xp, host, layout):
    """The host matrix as a device/host array in C order, F order, or a strided slice."""
    if layout in ("C", "F"):       # always a copy: the caller keeps ``host`` as the reference
        return xp.asarray(np.array(host, order=layout, copy=True))
    big = np.zeros((host.shape[0] * 2 + 1, host.shape[1] + 3), dtype=host.dtype)
    cols = slice(2, 2 + host.shape[1])
    big[1::2, cols] = host
    return xp.asarray(big)[1::2, cols]


def check_gemm(xp_name, case):
    xp = _xp(xp_name)
    rng = np.random.default_rng(case["seed"])
    prefix, m, n, k = case["prefix"], case["m"], case["n"], case["k"]
    fa, fb = (_FLAG_OP[f.upper() if isinstance(f, str) else f] for f in (case["transa"], case["transb"]))
    a_shape = (m, k) if fa == "N" else (k, m)
    b_shape = (k, n) if fb == "N" else (n, k)
    a_h = random_array(rng, prefix, a_shape)
    b_h = random_array(rng, prefix, b_shape)
    a, b = _laid_out(xp, a_h, case["layouts"][0]), _laid_out(xp, b_h, case["layouts"][1])
    alpha, beta = case["alpha"], case["beta"]
    mixed = case["out_dtype"] != TYPE_ROWS[prefix].c_dtype
    sprefix = {"h": "sh", "b": "sb"}[prefix] if mixed else prefix
    c_h = random_array(rng, sprefix, (m, n), c=True)
    if case["out"]:
        c_given = _poison(c_h, beta, prefix)
        out = _laid_out(xp, c_given, case["layouts"][2])
    else:
        out, c_given = None, None
    if case["zero_d"]:
        alpha, beta = np.asarray(alpha), xp.asarray(beta)
    before = None if out is None else _host(out).copy()
    try:
        got = pyblasgemm.gemm(case["transa"], case["transb"], a, b, out=out, alpha=alpha,
                              beta=beta, backend=case["backend"])
    except NotImplementedError:
        assert case["backend"] is not None
        if out is not None:
            np.testing.assert_array_equal(_host(out), before)
        EXAMPLES[f"gemm-{xp_name}-refused"] += 1
        return
    assert got.shape == (m, n) and got.dtype == case["out_dtype"]
    if out is not None:
        assert got is out
    alpha_v, beta_v = complex(alpha) if prefix in "cz" else alpha, beta
    if hasattr(beta_v, "item"):
        beta_v = beta_v.item()
    if hasattr(alpha_v, "item"):
        alpha_v = alpha_v.item()
    if out is None:
        beta_v, c0 = 0, np.zeros((m, n))
    else:
        c0 = np.zeros((m, n)) if beta_v == 0 else c_given
    ref, scale = expected(alpha_v, _op(a_h, fa if prefix in "cz" or fa != "C" else "T"),
                          _op(b_h, fb if prefix in "cz" or fb != "C" else "T"), beta_v, c0)
    check_close(_host(got), ref, scale, sprefix, TYPE_ROWS[sprefix].computes[0], what=repr(case))
    EXAMPLES[f"gemm-{xp_name}"] += 1


@SETTINGS
@given(gemm_cases("numpy"))
def test_fuzz_gemm_host(case):
    check_gemm("numpy", case)


@pytest.mark.gpu
@SETTINGS
@given(gemm_cases("cupy"))
def test_fuzz_gemm_gpu(case):
    check_gemm("cupy", case)


# ---------------------------------------------------------------------------------------------
# matmul (numpy.matmul's semantics)
# ---------------------------------------------------------------------------------------------

#: relative tolerance by the result dtype (the kernels' accumulation as in _ref.TOLERANCE)
MATMUL_TOLERANCE = {"float16": TOLERANCE[("h", "fp32")], "bfloat16": TOLERANCE[("b", "fp32")],
                    "float32": TOLERANCE[("s", "fp32")], "float64": TOLERANCE[("d", "fp64")],
                    "complex64": TOLERANCE[("c", "fp32")], "complex128": TOLERANCE[("z", "fp64")]}

BATCH_DIM = st.sampled_from([1, 1, 2, 3, 0])


@st.composite
def matmul_cases(draw, xp_name):
    dtype = draw(st.sampled_from(sorted(ROW_BY_DTYPE, key=str)))
    nb = draw(st.integers(0, 3))
    batch = [draw(BATCH_DIM) for _ in range(nb)]
    a_batch = [d if draw(st.integers(0, 3)) else 1 for d in batch][draw(st.integers(0, nb)):]
    b_batch = [d if draw(st.integers(0, 3)) else 1 for d in batch][draw(st.integers(0, nb)):]
    small = st.one_of(st.integers(0, 9), st.sampled_from([16, 31, 64, 65, 129]))
    return dict(
        dtype=dtype, a_batch=tuple(a_batch), b_batch=tuple(b_batch),
        m=draw(small), n=draw(small), k=draw(small),
        a_vec=draw(st.integers(0, 4)) == 0, b_vec=draw(st.integers(0, 4)) == 0,
        transposed=(draw(st.booleans()), draw(st.booleans())),
        out=draw(st.sampled_from([None, "C", "F"])),
        dtype_kw=dtype.itemsize == 2 and draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)))


def _operand(rng, xp, prefix, batch, rows, cols, vector, transposed):
    if vector:
        return xp.asarray(random_array(rng, prefix, (rows,)))
    if transposed:       # a swapped view of the last two dims: not C-contiguous
        host = random_array(rng, prefix, tuple(batch) + (cols, rows))
        return xp.swapaxes(xp.asarray(host), -1, -2)
    return xp.asarray(random_array(rng, prefix, tuple(batch) + (rows, cols)))


def check_matmul(xp_name, case):
    xp = _xp(xp_name)
    rng = np.random.default_rng(case["seed"])
    prefix = ROW_BY_DTYPE[case["dtype"]].prefix
    m, n, k = case["m"], case["n"], case["k"]
    a = _operand(rng, xp, prefix, case["a_batch"], m, k, case["a_vec"], case["transposed"][0])
    b = _operand(rng, xp, prefix, case["b_batch"], k, n, case["b_vec"], case["transposed"][1])
    kw = {"dtype": np.float32} if case["dtype_kw"] else {}
    # the library's own answer decides shape and dtype (and whether it is an error)
    if xp is not np and case["dtype"] == ml_dtypes.bfloat16:
        # cupy.matmul has no bfloat16 loop (TypeError) and pyblasgemm has one: NumPy on host
        # copies decides the shape (and the errors); the dtype is CuPy's promotion's
        try:
            shape = np.matmul(_host(a), _host(b)).shape
        except ValueError:
            with pytest.raises(ValueError):
                pyblasgemm.matmul(a, b, **kw)
            EXAMPLES[f"matmul-{xp_name}-error"] += 1
            return
        theirs, dtype = None, np.dtype(kw.get("dtype", ml_dtypes.bfloat16))
    else:
        try:
            theirs = (np.matmul if xp is np else xp.matmul)(a, b, **kw)
        except (ValueError, TypeError) as exc:
            with pytest.raises(type(exc)):
                pyblasgemm.matmul(a, b, **kw)
            EXAMPLES[f"matmul-{xp_name}-error"] += 1
            return
        shape, dtype = np.shape(theirs), theirs.dtype
    out = None
    if case["out"] is not None and len(shape) > 0:
        host = np.full(shape, np.nan, dtype=dtype) if dtype.kind in "fc" else np.zeros(shape, dtype)
        out = xp.asarray(host if case["out"] == "C" or len(shape) < 2
                         else np.asfortranarray(host))
    got = pyblasgemm.matmul(a, b, out=out, **kw)
    if out is not None:
        assert got is out
    assert np.shape(got) == shape and got.dtype == dtype, (np.shape(got), shape, got.dtype, dtype)
    got_h = np.asarray(_host(got))
    if dtype.kind in "iu":
        np.testing.assert_array_equal(got_h, _host(theirs))     # wrapping int8, exact
    else:
        a64, b64 = widen(_host(a)), widen(_host(b))
        ref = np.matmul(a64, b64)
        scale = np.matmul(np.abs(a64), np.abs(b64))
        tol = MATMUL_TOLERANCE[dtype.name]
        assert np.all(np.isfinite(got_h)), f"{case}: non-finite values"
        err = np.abs(widen(got_h) - ref)
        floor = float(ml_dtypes.finfo(dtype).smallest_subnormal) if dtype.kind == "f" or \
            dtype == ml_dtypes.bfloat16 else np.finfo(np.float32).tiny
        assert np.all(err <= tol * scale + floor), f"{case}: error"
    EXAMPLES[f"matmul-{xp_name}"] += 1


@SETTINGS
@given(matmul_cases("numpy"))
def test_fuzz_matmul_host(case):
    check_matmul("numpy", case)


@pytest.mark.gpu
@SETTINGS
@given(matmul_cases("cupy"))
def test_fuzz_matmul_gpu(case):
    check_matmul("cupy", case)
