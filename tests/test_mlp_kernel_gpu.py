"""The on-chip MLP kernel on a GPU (skipped elsewhere, see conftest.py): float16 and bfloat16,
every activation, with and without biases, M from 1 to 1000 (partial CTAs), sizes that are not
multiples of the tiles, a wide hidden layer, one and several N2 splits; against a float64 host
reference with h rounded to the layer dtype as fused_mlp documents; every element written;
NaN confined to its row; forcing the kernel where it cannot run raises.

Tolerance (per element of y), derived rather than guessed. Let u be the dtype's unit roundoff
(2^-11 float16, 2^-8 bfloat16), e = 2^-24 (float32's), h16 the reference's rounded h:
* the kernel's pre-activation differs from the float64 one by at most (K1 + 2) e (|x| @ |w1| +
  |b1|) (float32 accumulation, any order), its activation in float32 by ~ a few e relative (erf,
  tanh, exp); with the activations' slopes <= 1.13 that is |dh32| <= 1.2 (K1 + 4) e S1 +
  2^-21 (|pre| + |h|) per element;
* rounding to the dtype can then land one ulp (<= 2u |h16|) away from the reference's
  rounding, so |h_kernel - h16| <= 2u |h16| + |dh32| (+ the dtype's smallest subnormal);
* the second product adds (N1 + 2) e (|h16| @ |w2| + |b2|) of float32 accumulation, and y's
  own rounding u |y|.
Summed with |w2|: tol = u |y| + (1 + 4u) [2u |h16| @ |w2| + |dh32| @ |w2| + (N1 + 2) e (|h16| @
|w2| + |b2|) + tiny |1| @ |w2|]. The 2u |h16| @ |w2| term is the worst case of every h rounding
the other way; the test also checks that the typical error is far below it.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from scipy.special import erf

import pyblasgemm
from pyblasgemm.kernels import mlp_kernel as mk

pytestmark = pytest.mark.gpu

ACTS = {None: (0, lambda v: v), "relu": (1, lambda v: np.where(v < 0, 0.0, v)),
        "gelu": (2, lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2)))),
        "gelu_tanh": (3, lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))),
        "silu": (4, lambda v: v / (1 + np.exp(-v)))}
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
U = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133}
E32 = 2.0**-24


def _data(m, k1, n1, n2, dtype, seed, bias=True):
    rng = np.random.default_rng(seed)
    t = DTYPES[dtype]
    x = rng.uniform(-1, 1, (m, k1)).astype(t)
    w1 = (rng.uniform(-1, 1, (k1, n1)) * (2 / math.sqrt(k1))).astype(t)   # pre-activations ~ +-1
    w2 = (rng.uniform(-1, 1, (n1, n2)) * (2 / math.sqrt(n1))).astype(t)
    b1 = rng.uniform(-0.5, 0.5, n1).astype(t) if bias else None
    b2 = rng.uniform(-0.5, 0.5, n2).astype(t) if bias else None
    return x, w1, w2, b1, b2


def _reference(x, w1, w2, b1, b2, act, dtype):
    """(y in float64 from h rounded to the dtype, the per-element tolerance derived above)."""
    with np.errstate(all="ignore"):      # Inf / NaN inputs propagate; the float64 math is the reference
        return _reference_f64(x, w1, w2, b1, b2, act, dtype)


def _reference_f64(x, w1, w2, b1, b2, act, dtype):
    f = ACTS[act][1]
    x64, w164, w264 = (a.astype(np.float64) for a in (x, w1, w2))
    c1 = np.zeros(w1.shape[1]) if b1 is None else b1.astype(np.float64)
    c2 = np.zeros(w2.shape[1]) if b2 is None else b2.astype(np.float64)
    pre = x64 @ w164 + c1
    h = f(pre)
    h16 = h.astype(np.float32).astype(DTYPES[dtype]).astype(np.float64)   # the kernel: fp32, rounded once
    y = h16 @ w264 + c2
    u, k1, n1 = U[dtype], x.shape[1], w1.shape[1]
    s1 = np.abs(x64) @ np.abs(w164) + np.abs(c1)
    dh32 = 1.2 * (k1 + 4) * E32 * s1 + 2.0**-21 * (np.abs(pre) + np.abs(h))
    aw2 = np.abs(w264)
    ah = np.abs(h16) @ aw2
    tol = u * np.abs(y) + (1 + 4 * u) * (2 * u * ah + dh32 @ aw2 + (n1 + 2) * E32 * (ah + np.abs(c2))
                                         + TINY[dtype] * aw2.sum(axis=0))
    return y, tol, ah


def _check(got, want, tol, ah, dtype):
    import cupy

    g = cupy.asnumpy(got).astype(np.float64)
    assert np.all(np.isfinite(g)), f"{np.sum(~np.isfinite(g))} elements not written or not finite"
    err = np.abs(g - want)
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} beyond the bound; worst at {np.unravel_index(np.argmax(err - tol), err.shape)}: "
                           f"err {err.max():.3g}, bound there {tol.flat[np.argmax(err - tol)]:.3g}")
    # typical agreement: y's own rounding plus a tenth of the rest of the bound for nearly every
    # element (h rounds differently from the reference only where float32 and float64 straddle a
    # rounding midpoint: ~1e-4 of the elements), far inside the worst case
    own = U[dtype] * np.abs(want)
    assert np.mean(err <= own + 0.1 * (tol - own)) >= 0.9, "typical error larger than y's rounding"


def _run(x, w1, w2, b1, b2, act, dtype, splits=None, method="on_chip"):
    """Through fused_mlp (method='on_chip') or, with ``splits``, the launcher on a NaN-poisoned y."""
    import cupy

    dx, dw1, dw2 = (cupy.asarray(a) for a in (x, w1, w2))
    db1 = None if b1 is None else cupy.asarray(b1)
    db2 = None if b2 is None else cupy.asarray(b2)
    if splits is None:
        return pyblasgemm.fused_mlp(dx, dw1, dw2, db1, db2, activation=act, method=method)
    m, n2 = x.shape[0], w2.shape[1]
    y = cupy.full((m, n2), np.nan, dtype=DTYPES[dtype])          # poisoned: every element written
    mk.launch(dx.data.ptr, dw1.data.ptr, 0 if db1 is None else db1.data.ptr, dw2.data.ptr,
              0 if db2 is None else db2.data.ptr, y.data.ptr, m, x.shape[1], w1.shape[1], n2, dtype,
              ACTS[act][0], splits, None)
    cupy.cuda.get_current_stream().synchronize()
    return y


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("act", list(ACTS), ids=lambda a: str(a))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("splits", [1, 2])
def test_every_activation_and_dtype(dtype, act, bias, splits):
    x, w1, w2, b1, b2 = _data(65, 72, 200, 136, dtype, seed=ACTS[act][0], bias=bias)
    want, tol, ah = _reference(x, w1, w2, b1, b2, act, dtype)
    _check(_run(x, w1, w2, b1, b2, act, dtype, splits=splits), want, tol, ah, dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m", [1, 7, 33, 64, 65, 1000])
@pytest.mark.parametrize("shape", [(72, 200, 136), (64, 1024, 256), (256, 128, 520), (8, 8, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rows_and_shapes(dtype, m, shape):
    k1, n1, n2 = shape
    x, w1, w2, b1, b2 = _data(m, k1, n1, n2, dtype, seed=m + k1)
    want, tol, ah = _reference(x, w1, w2, b1, b2, "gelu", dtype)
    _check(_run(x, w1, w2, b1, b2, "gelu", dtype), want, tol, ah, dtype)      # the plan's splits
    chunks = -(-n2 // mk.CHUNK)
    for splits in sorted({1, chunks, max(1, chunks // 2)}):                  # explicit splits, poisoned y
        _check(_run(x, w1, w2, b1, b2, "gelu", dtype, splits=splits), want, tol, ah, dtype)


def test_the_plan_keeps_two_gemms_and_both_methods_agree():
    import cupy

    x, w1, w2, b1, b2 = _data(33, 72, 200, 136, "float16", seed=7)
    plan = pyblasgemm.mlp_plan(33, 72, 200, 136, max_smem=mk.max_smem(0), sm_count=mk.sm_count(0))
    assert plan.on_chip_fits and plan.n2_splits == 2
    args = [cupy.asarray(a) for a in (x, w1, w2, b1, b2)]
    auto = pyblasgemm.fused_mlp(*args, activation="silu")
    forced = pyblasgemm.fused_mlp(*args, activation="silu", method="on_chip")
    two = pyblasgemm.fused_mlp(*args, activation="silu", method="two_gemms")
    assert plan.kernel == "two GEMMs with fused epilogues"          # measured faster (mlp.ON_CHIP_MEASURED)
    assert cupy.array_equal(auto, two)
    want, tol, ah = _reference(x, w1, w2, b1, b2, "silu", "float16")
    _check(two, want, tol, ah, "float16")                           # both within the same bound
    _check(forced, want, tol, ah, "float16")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("act", ["relu", "gelu", None], ids=str)
def test_nan_in_x_reaches_only_its_row(dtype, act):
    import cupy

    x, w1, w2, b1, b2 = _data(70, 64, 136, 264, dtype, seed=11)
    x[5, 3] = np.nan
    x[66, 0] = np.inf              # Inf times signed weights: NaN or +-Inf in h, only row 66
    y = cupy.asnumpy(_run(x, w1, w2, b1, b2, act, dtype, splits=2)).astype(np.float64)
    assert np.all(np.isnan(y[5]))
    other = np.delete(y, [5, 66], axis=0)
    assert np.all(np.isfinite(other))
    # row 66 as the unfused sequence has it (h rounded to the dtype, then the second product)
    want, _, _ = _reference(x[66:67], w1, w2, b1, b2, act, dtype)
    assert np.array_equal(np.isnan(y[66]), np.isnan(want[0]))
    assert np.array_equal(np.isposinf(y[66]), np.isposinf(want[0]))


def test_forcing_the_kernel_where_it_cannot_run_raises():
    import cupy

    f16 = np.float16
    wide = [cupy.ones(s, f16) for s in ((4, 64), (64, 4096), (4096, 64))]
    with pytest.raises(ValueError, match=r"method='on_chip' cannot run: a CTA's 64 rows of h are 64 x 4096 x 2 B"):
        pyblasgemm.fused_mlp(*wide, method="on_chip")
    odd = [cupy.ones(s, f16) for s in ((4, 64), (64, 100), (100, 64))]
    with pytest.raises(ValueError, match=r"cannot run: N1 = 100 is not a multiple of 8"):
        pyblasgemm.fused_mlp(*odd, method="on_chip")
    f32 = [cupy.ones(s, np.float32) for s in ((4, 64), (64, 64), (64, 64))]
    with pytest.raises(ValueError, match=r"cannot run: the on-chip kernel takes float16 or bfloat16"):
        pyblasgemm.fused_mlp(*f32, method="on_chip")
    strided = [cupy.ones((4, 128), f16)[:, ::2], cupy.ones((64, 64), f16), cupy.ones((64, 64), f16)]
    with pytest.raises(ValueError, match=r"cannot run: x is not C-contiguous"):
        pyblasgemm.fused_mlp(*strided, method="on_chip")
    base = cupy.ones(4 * 64 + 4, f16)
    shifted = [base[4:].reshape(4, 64), cupy.ones((64, 64), f16), cupy.ones((64, 64), f16)]  # 8 B off
    with pytest.raises(ValueError, match=r"cannot run: x is not 16-byte aligned"):
        pyblasgemm.fused_mlp(*shifted, method="on_chip")
    # without method=, each falls back to two GEMMs and still computes the layer
    y = pyblasgemm.fused_mlp(*odd, activation="relu")
    assert y.shape == (4, 64) and float(y[0, 0]) == 6400.0
