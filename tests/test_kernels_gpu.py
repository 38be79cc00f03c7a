"""GPU tests of pyblasgemm's own kernels against a float64 NumPy oracle and cuBLAS.

Every kind x transpose pair x decomposition on small odd shapes (1, 7, 31, 129, 1000 and
non-multiples of the tile), padded and odd leading dimensions (the latter take the scalar,
non-cp.async path), alpha/beta with beta == 0 over NaN-poisoned C. Error must stay within
2x cuBLAS's on the same inputs (s8: exact). Split-k and stream-k must be bitwise repeatable.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
ml_dtypes = pytest.importorskip("ml_dtypes")


def _has_gpu() -> bool:
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="no CUDA device")]

from pyblasgemm.kernels import KernelConfig, KernelProblem, SHIPPED_CONFIGS, run, supports  # noqa: E402
from pyblasgemm.kernels import jit  # noqa: E402

KINDS = [("f16", "f32"), ("f16", "f16"), ("bf16", "f32"), ("s8", "s32"), ("tf32", "f32"), ("3xtf32", "f32"),
         ("f16_out32", "f32"), ("bf16_out32", "f32"), ("f32", "f32")]
LAYOUTS = ["NN", "NT", "TN", "TT"]
DECOMPS = ["sliced", "splitk_serial", "splitk_parallel", "streamk", "hybrid"]
from kernel_cases import EPS_OUT, NP_IN, NP_OUT, Case, tf32_round  # noqa: E402,F401


def config_for(kind, decomp, small=False, splits=0):
    cfgs = SHIPPED_CONFIGS[kind]
    base = cfgs[5] if small else cfgs[0]
    return replace(base, decomposition=decomp, splits=(splits if decomp.startswith("splitk") else 0))


SMALL_SHAPES = [(1, 1, 1), (7, 31, 129), (129, 7, 31), (31, 129, 1000), (200, 130, 77)]
SMALL_ALPHABETA = [(1.0, 0.0), (0.5, -1.5)]


def _run_case(case, cfg, **kw):
    run(case.problem(), cfg, **kw)
    cp.cuda.get_current_stream().synchronize()
    return case.c_d.get()


@pytest.fixture(scope="module", autouse=True)
def _warm(request):
    """Compile every instantiation the module's selected tests need in parallel threads first
    (the kinds of the collected tests: ``-k f32`` compiles the f32 kernels only)."""
    selected = {item.callspec.params.get("kind") for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    specs = set()
    for (kind, acc), lay, d in itertools.product(KINDS, LAYOUTS, DECOMPS):
        if kind not in selected:
            continue
        for small in (False, True):
            cfg = config_for(kind, d, small=small)
            for vec in (True, False):
                specs.add((cfg if cfg.decomposition != "hybrid" else replace(cfg, decomposition="streamk"),
                           kind, lay[0], lay[1], acc, vec))
    jit.warm(sorted(specs, key=str))


@pytest.mark.parametrize("kind,acc", KINDS, ids=[f"{k}-{a}" for k, a in KINDS])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("decomp", DECOMPS)
def test_small_cross_product(kind, acc, layout, decomp):
    rng = np.random.default_rng(hash((kind, acc, layout, decomp)) % 2**32)
    for (m, n, k), (alpha, beta), pad in itertools.product(SMALL_SHAPES, SMALL_ALPHABETA, (0, 3)):
        if (m, n, k) == (1, 1, 1) and pad:
            continue
        if kind == "s8":
            alpha, beta = (1, 0) if beta == 0 else (2, -1)
        case = Case(kind, acc, layout[0], layout[1], m, n, k, pad=pad, alpha=alpha,
                    beta=beta, rng=rng)
        small = m * n <= 128 * 128 and decomp == "sliced"
        cfg = config_for(kind, decomp, small=small, splits=3 if decomp == "splitk_serial" else 5)
        out = _run_case(case, cfg, sm_count=3 if decomp == "hybrid" else None)
        case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("kind,acc", KINDS, ids=[f"{k}-{a}" for k, a in KINDS])
@pytest.mark.parametrize("decomp", DECOMPS)
def test_large_1000(kind, acc, decomp):
    """1000^3 (not a multiple of any tile) with padded ld's, one layout per decomposition."""
    layout = LAYOUTS[DECOMPS.index(decomp) % 4]
    alpha, beta = (3, 1) if kind == "s8" else (0.75, 0.25)
    case = Case(kind, acc, layout[0], layout[1], 1000, 1000, 1000, pad=8, alpha=alpha, beta=beta)
    cfg = config_for(kind, decomp, splits=4)
    out = _run_case(case, cfg, sm_count=3 if decomp == "hybrid" else None)
    case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("decomp", ["splitk_serial", "splitk_parallel", "streamk", "hybrid"])
@pytest.mark.parametrize("kind,acc", [("f16", "f32"), ("tf32", "f32"), ("s8", "s32")])
def test_bitwise_deterministic(kind, acc, decomp):
    case = Case(kind, acc, "N", "N", 300, 260, 3000, alpha=1 if kind == "s8" else 1.0, beta=0)
    cfg = config_for(kind, decomp, splits=7)
    outs = [_run_case(case, cfg, sm_count=5 if decomp == "hybrid" else None).tobytes() for _ in range(3)]
    assert outs[0] == outs[1] == outs[2]


def test_3xtf32_accuracy():
    """3xTF32 within 2x cuBLAS SGEMM's error and >= 10x more accurate than plain tf32."""
    for m, n, k in [(257, 129, 1000), (64, 64, 4096)]:
        errs = {}
        case = Case("3xtf32", "f32", "N", "N", m, n, k, pad=0)
        ref = case.reference()
        for kind in ("tf32", "3xtf32"):
            case.kind = kind
            case.c_d[...] = cp.nan
            errs[kind] = case.check(_run_case(case, None), ref)
        sg = cp.matmul(*[cp.ascontiguousarray(x) for x in case.ops(case.a_d, case.b_d)]).get()
        sgemm_err = np.linalg.norm(sg.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert errs["3xtf32"] <= 2 * sgemm_err + 1e-7, (errs, sgemm_err)
        assert errs["3xtf32"] * 10 <= errs["tf32"], errs


@pytest.mark.parametrize("decomp", DECOMPS)
def test_f32_is_sgemm_arithmetic(decomp):
    """The FP32 FMA kind keeps subnormal products and sums (CuPy compiles with -ftz=true: the
    kind's FMAs are PTX fma.rn.f32, which it does not rewrite; split-k and stream-k partials are
    added by add.rn.f32) and adds k in ascending order with one rounding per term."""
    # 2^-70 * 2^-70 = 2^-140, subnormal in float32 (normal from 2^-126): flushed, it is zero
    case = Case("f32", "f32", "N", "N", 70, 40, 33, alpha=1.0, beta=0.0)
    case.a_h[...] = np.float32(2.0**-70)
    case.b_h[...] = np.float32(2.0**-70)
    case.a_d[...] = cp.asarray(case.a_h)
    case.b_d[...] = cp.asarray(case.b_h)
    out = case.c_view(_run_case(case, config_for("f32", decomp, splits=3)))
    assert np.all(out == np.float32(33 * 2.0**-140)), out.ravel()[:4]
    # 1 then eight terms of 2^-24: each addition is a tie that rounds to even, 1.0, so the
    # sequential float32 sum is 1.0 where a tree of partial sums would give 1 + 2^-21
    case = Case("f32", "f32", "T", "N", 1, 1, 9, alpha=1.0, beta=0.0)
    case.a_h[...] = 1.0
    case.b_h[...] = np.float32(2.0**-24)
    case.b_h[0, 0, 0] = 1.0
    case.a_d[...] = cp.asarray(case.a_h)
    case.b_d[...] = cp.asarray(case.b_h)
    want = np.float32(0.0)
    for t in case.b_h.ravel()[:9]:
        want = np.float32(want + np.float32(t))
    got = case.c_view(_run_case(case, config_for("f32", "sliced", small=True)))
    assert got.ravel()[0] == want, (got.ravel()[0], want)


def test_batched_broadcast():
    """Strided batch with a broadcast (stride 0) B."""
    case = Case("f16", "f32", "T", "N", 77, 45, 130, batch=3, alpha=1.0, beta=0.0)
    p = replace(case.problem(), stride_b=0)
    case.b_h[1:] = case.b_h[0]
    run(p)
    out = case.c_d.get()
    ref = case.reference()
    case.check(out, ref, None)
    assert np.linalg.norm(case.c_view(out).astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def test_default_config_and_supports():
    case = Case("bf16", "f32", "N", "T", 333, 222, 111)
    ok, why = supports(case.problem())
    assert ok, why
    cfg = run(case.problem())
    assert isinstance(cfg, KernelConfig)
    case.check(case.c_d.get(), case.reference(), case.cublas_out())
    bad = replace(case.problem(), kind="f64")
    assert not supports(bad)[0]
    with pytest.raises(ValueError):
        run(case.problem(), KernelConfig(bm=96))


@pytest.mark.parametrize("kind,acc", [("f16", "f32"), ("s8", "s32"), ("3xtf32", "f32")])
@pytest.mark.parametrize("decomp", DECOMPS)
def test_bound_launch_matches_run(kind, acc, decomp):
    """bind() + calls with fresh pointers: bitwise equal to run(), back-to-back on one stream
    (shared workspace and flags) and on a second stream."""
    from pyblasgemm.kernels.launch import bind

    cfg = config_for(kind, decomp, splits=3)
    kw = dict(sm_count=3) if decomp == "hybrid" else {}
    cases = [Case(kind, acc, "N", "T", 300, 200, 700, alpha=(2 if kind == "s8" else 0.5),
                  beta=(-1 if kind == "s8" else 0.25), rng=np.random.default_rng(i)) for i in range(3)]
    want = []
    for c in cases:
        c0 = c.c_d.copy()
        run(c.problem(), cfg, **kw)
        want.append(c.c_d.get())
        c.c_d[...] = c0
    bl = bind(cases[0].problem(), cfg, **kw)
    # same class -> the same launch (a new object: execute keeps the one it binds, not bind)
    again = bind(cases[1].problem(), cfg, **kw)
    assert again is not bl and again.spec.same_as(bl.spec)
    for c in cases:  # back-to-back, no sync in between
        bl(c.a_d.data.ptr, c.b_d.data.ptr, c.c_d.data.ptr, c.alpha, c.beta)
    cp.cuda.get_current_stream().synchronize()
    for c, w in zip(cases, want):
        assert c.c_d.get().tobytes() == w.tobytes()
    s2 = cp.cuda.Stream(non_blocking=True)
    c = cases[0]
    c.c_d[...] = cp.asarray(c.c_h)
    cp.cuda.Device().synchronize()
    bl(c.a_d.data.ptr, c.b_d.data.ptr, c.c_d.data.ptr, c.alpha, c.beta, stream=s2)
    s2.synchronize()
    assert c.c_d.get().tobytes() == want[0].tobytes()
    if bl.a_align > 1:  # a pointer outside the bound alignment class is refused
        with pytest.raises(ValueError):
            bl(c.a_d.data.ptr + bl.a_align // 2, c.b_d.data.ptr, c.c_d.data.ptr, c.alpha, c.beta)
    if bl.c_align > 1:
        with pytest.raises(ValueError):
            bl(c.a_d.data.ptr, c.b_d.data.ptr, c.c_d.data.ptr + bl.c_align // 2, c.alpha, c.beta)
    # a 16-byte-aligned class refuses an element-aligned (but not 16-byte) pointer
    v = Case(kind, acc, "T", "N", 64, 64, 64, alpha=(1 if kind == "s8" else 1.0), beta=(0 if kind == "s8" else 0.0))
    bv = bind(v.problem())
    assert bv.a_align == 16
    with pytest.raises(ValueError):
        bv(v.a_d.data.ptr + 16 // 2 if kind != "s8" else v.a_d.data.ptr + 1, v.b_d.data.ptr, v.c_d.data.ptr,
           v.alpha, v.beta)


def test_bound_launch_host_time():
    """Host time of one small f16 call through bind() (reported; asserted loosely)."""
    import time

    from pyblasgemm.kernels.launch import bind, prepare

    n = 64
    case = Case("f16", "f32", "N", "N", n, n, n)
    p = case.problem()
    bl = bind(p)
    a, b, c = case.a_d.data.ptr, case.b_d.data.ptr, case.c_d.data.ptr
    for _ in range(200):
        bl(a, b, c, 1.0, 0.0)
    cp.cuda.Device().synchronize()

    def med(fn, reps=2000):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
            if len(ts) % 500 == 0:
                cp.cuda.Device().synchronize()  # keep the launch queue from filling
        return sorted(ts)[len(ts) // 2] * 1e6

    t_bind = med(lambda: bind(p)(a, b, c, 1.0, 0.0), reps=300)     # a new launch each time
    t_call = med(lambda: bl(a, b, c, 1.0, 0.0))
    t_prep = med(lambda: prepare(p)(), reps=300)
    ca, cb_ = cp.asarray(case.a_h[0]), cp.asarray(case.b_h[0])
    t_cupy = med(lambda: cp.matmul(ca, cb_), reps=1000)
    cp.cuda.Device().synchronize()
    print(f"\nhost us per call (median): bind()+call {t_bind:.2f}, BoundLaunch call {t_call:.2f}, "
          f"prepare()+call {t_prep:.2f}, cupy.matmul {t_cupy:.2f}")
    case.check(case.c_d.get(), case.reference(), None)
    assert t_call < 50


def sanitize_cases():
    """One small problem per kind x decomposition (and both operand paths), for running under
    compute-sanitizer: ``python tests/test_kernels_gpu.py`` (exit status 1 on a wrong result)."""
    bad = 0
    rng = np.random.default_rng(1)
    for (kind, acc), decomp in itertools.product(KINDS, DECOMPS):
        lay = LAYOUTS[(KINDS.index((kind, acc)) + DECOMPS.index(decomp)) % 4]
        for pad in (0, 1):
            alpha, beta = (2, -1) if kind == "s8" else (0.5, 0.25)
            case = Case(kind, acc, lay[0], lay[1], 70, 50, 300, pad=pad, alpha=alpha, beta=beta, rng=rng)
            cfg = config_for(kind, decomp, splits=3)
            try:
                case.check(_run_case(case, cfg, sm_count=2 if decomp == "hybrid" else None), case.reference())
                status = "ok"
            except AssertionError as e:
                bad += 1
                status = f"FAIL {e}"
            print(f"{kind}-{acc} {lay} {decomp} pad={pad}: {status}", flush=True)
    return bad


if __name__ == "__main__":
    import sys

    sys.exit(1 if sanitize_cases() else 0)
