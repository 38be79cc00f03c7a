"""grouped_matmul (list and expert forms) and fused_mlp against float64 references, on NumPy
everywhere and CuPy on a GPU (the ``xp`` fixture); ragged groups with empty experts; errors
before any work."""
import math

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

import pyblasgemm
from conftest import to_host

UNIT = {np.float16: 2.0**-11, ml_dtypes.bfloat16: 2.0**-8, np.float32: 2.0**-24}


def _close(got, want64, scale, dtype):
    err = np.abs(np.asarray(to_host(got), np.float64) - want64)
    assert np.all(err <= 4 * UNIT[dtype] * (np.abs(want64) + scale) + 1e-6 * scale), float(err.max())


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_expert_form_with_ragged_and_empty_groups(xp, dtype):
    rng = np.random.default_rng(1)
    sizes = [5, 0, 17, 1, 0, 33]                 # experts 1 and 4 get no tokens
    k, n = 24, 10
    a = rng.uniform(-1, 1, (sum(sizes), k)).astype(dtype)
    b = rng.uniform(-1, 1, (len(sizes), k, n)).astype(dtype)
    bias = rng.uniform(-1, 1, (len(sizes), n)).astype(dtype)
    ends = np.cumsum(sizes)
    out_dtype = dtype                                           # gemm's: 16-bit stays 16-bit
    out = xp.full((sum(sizes), n), np.nan, out_dtype)           # poisoned: every row written
    res = pyblasgemm.grouped_matmul(xp.asarray(a), xp.asarray(b), offsets=ends, out=out,
                                    bias=xp.asarray(bias), activation="relu")
    assert res is out
    start = 0
    for g, end in enumerate(ends):
        v = a[start:end].astype(np.float64) @ b[g].astype(np.float64) + bias[g].astype(np.float64)
        scale = np.abs(a[start:end].astype(np.float64)) @ np.abs(b[g].astype(np.float64)) + 1
        _close(out[start:end], np.maximum(v, 0), scale, out_dtype)
        start = end


def test_list_form_of_different_sizes_with_int8_dequant(xp):
    rng = np.random.default_rng(2)
    shapes = [(3, 7, 5), (1, 64, 9), (40, 8, 2)]
    a = [rng.integers(-128, 128, (m, k)).astype(np.int8) for m, k, _ in shapes]
    b = [rng.integers(-128, 128, (k, n)).astype(np.int8) for _, k, n in shapes]
    sa = [rng.uniform(0.01, 0.1, m).astype(np.float32) for m, _, _ in shapes]
    sb = [rng.uniform(0.01, 0.1, n).astype(np.float32) for _, _, n in shapes]
    got = pyblasgemm.grouped_matmul([xp.asarray(x) for x in a], [xp.asarray(y) for y in b],
                                    scale_a=[xp.asarray(s) for s in sa], scale_b=[xp.asarray(s) for s in sb],
                                    dtype=np.float32)
    assert len(got) == 3
    for g in range(3):
        want = sa[g][:, None].astype(np.float64) * sb[g] * (a[g].astype(np.float64) @ b[g].astype(np.float64))
        np.testing.assert_allclose(to_host(got[g]), want, rtol=1e-6, atol=1e-6)
    plain = pyblasgemm.grouped_matmul([xp.asarray(x) for x in a], [xp.asarray(y) for y in b])
    for g in range(3):                    # gemm's int32 result, exact
        assert plain[g].dtype == np.int32
        np.testing.assert_array_equal(to_host(plain[g]), a[g].astype(np.int64) @ b[g].astype(np.int64))


@pytest.mark.parametrize("kw,exc,words", [
    (dict(offsets=[2, 1]), ValueError, ["offsets[1]=1", "offsets[0]=2"]),
    (dict(offsets=[1, 3]), ValueError, ["offsets[-1]=3", "row count 4"]),
    (dict(offsets=[4]), ValueError, ["1 entries", "2 groups"]),
    (dict(offsets=[-1, 4]), ValueError, ["offsets[0]=-1"]),
    (dict(offsets=[2, 4], bias=np.ones((2, 5), np.float32)), ValueError, ["bias has shape (2, 5)", "(2, 3)"]),
])
def test_expert_form_errors(kw, exc, words):
    a, b = np.ones((4, 2), np.float32), np.ones((2, 2, 3), np.float32)
    with pytest.raises(exc) as e:
        pyblasgemm.grouped_matmul(a, b, **kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_list_form_errors():
    a = [np.ones((2, 3), np.float32)]
    with pytest.raises(ValueError, match="1 problems and b 2"):
        pyblasgemm.grouped_matmul(a, a + a)
    with pytest.raises(ValueError, match=r"problem 0: a is \(2, 3\) and b is \(2, 3\)"):
        pyblasgemm.grouped_matmul(a, a)
    with pytest.raises(ValueError, match="bias must be a list"):
        pyblasgemm.grouped_matmul(a, [np.ones((3, 2), np.float32)], bias=np.ones(2, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
def test_fused_mlp_matches_the_two_step_reference(xp, dtype, act):
    rng = np.random.default_rng(3)
    t, f, h, o = 9, 16, 40, 7
    x, w1, w2 = (rng.uniform(-1, 1, s).astype(dtype) for s in ((t, f), (f, h), (h, o)))
    b1, b2 = rng.uniform(-1, 1, h).astype(dtype), rng.uniform(-1, 1, o).astype(dtype)
    y = pyblasgemm.fused_mlp(xp.asarray(x), xp.asarray(w1), xp.asarray(w2), xp.asarray(b1), xp.asarray(b2),
                             activation=act)
    assert y.dtype == dtype and y.shape == (t, o)
    f64 = {"gelu": lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))), "relu": lambda v: np.maximum(v, 0),
           "silu": lambda v: v / (1 + np.exp(-v))}[act]
    hid = f64(x.astype(np.float64) @ w1.astype(np.float64) + b1).astype(dtype).astype(np.float64)  # h in 16 bits
    want = hid @ w2.astype(np.float64) + b2
    scale = np.abs(hid) @ np.abs(w2.astype(np.float64)) + 1
    _close(y, want, scale + 4 * UNIT[dtype] * np.abs(hid).sum(), dtype)


def test_mlp_plan_says_whether_the_intermediate_fits_on_chip():
    small, wide = pyblasgemm.mlp_plan(4096, 1024, 1024, 1024), pyblasgemm.mlp_plan(16, 4096, 11008, 4096)
    assert small.on_chip_fits and small.kernel == "two GEMMs with fused epilogues" and "173568 B of shared memory" in small.explain()
    assert not wide.on_chip_fits and "1376 KB" in wide.explain()
    with pytest.raises(ValueError, match="inner sizes differ"):
        pyblasgemm.fused_mlp(np.ones((2, 3)), np.ones((4, 5)), np.ones((5, 1)))
