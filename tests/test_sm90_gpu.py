"""GPU tests of the Hopper kernel (wgmma + TMA, sm_90a) against a float64 NumPy oracle and cuBLAS.

Every kind (f16, bf16: four transpose pairs; s8: 'TN', the only arrangement s8 wgmma reads) x
every decomposition of the persistent scheduler x every shipped tile, on sizes 1, 7, 31, 129,
1000 and non-multiples of the tiles, padded leading dimensions (still 16-byte multiples, as TMA
needs), alpha/beta with beta == 0 over NaN-poisoned C; error within 2x cuBLAS's on the same
inputs (s8: exact); split-k and stream-k bitwise repeatable; unaligned or s8 non-TN problems are
refused with a reason (the planner sends them to the mma.sync kernel).
Runs only on a compute capability 9.0 GPU.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("ml_dtypes")


def _is_hopper() -> bool:
    try:
        return cp.cuda.runtime.getDeviceCount() > 0 and cp.cuda.Device().compute_capability == "90"
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _is_hopper(), reason="needs a compute capability 9.0 GPU")]

from kernel_cases import Case  # noqa: E402
from pyblasgemm.kernels import SM90_CONFIGS_BY_TILE, run  # noqa: E402
from pyblasgemm.kernels.config import SM90_SMALL_CONFIGS  # noqa: E402
from pyblasgemm.kernels import jit  # noqa: E402

LAYOUTS = {"f16": ["NN", "NT", "TN", "TT"], "bf16": ["NN", "NT", "TN", "TT"], "s8": ["TN"]}
KIND_CASES = [(k, lay) for k in ("f16", "bf16", "s8") for lay in LAYOUTS[k]]
DECOMPS = ["sliced", "splitk_parallel", "streamk", "hybrid", "sliced_c2"]  # c2: 2-CTA clusters, multicast
TILES = [256, 192, 128, 64, "w1-128", "w1-64"]  # w1: one consumer warpgroup (64-row tiles)
ACC = {"f16": "f32", "bf16": "f32", "s8": "s32"}
# sizes: 1, primes, non-multiples of 64/128/256 on every axis; k=1000 crosses many stages
SHAPES = [(1, 1, 1), (7, 31, 129), (129, 7, 31), (31, 129, 1000), (257, 130, 77), (300, 260, 200)]
PADS = {"f16": 8, "bf16": 8, "s8": 16}  # one 16-byte vector of padding: TMA-legal
LDM = PADS  # leading dimensions rounded up to 16 bytes


def cfg(kind, bm, decomp, splits=0):
    if isinstance(bm, str):
        base = SM90_SMALL_CONFIGS[kind][int(bm.split("-")[1])]
    else:
        base = SM90_CONFIGS_BY_TILE[kind][bm]
    if decomp == "sliced_c2":
        return replace(base, cluster=2)
    return replace(base, decomposition=decomp, splits=splits if decomp == "splitk_parallel" else 0)


def _run(case, config, **kw):
    run(case.problem(), config, **kw)
    cp.cuda.get_current_stream().synchronize()
    return case.c_d.get()


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """Compile every instantiation the module uses, in parallel threads (NVRTC drops the GIL)."""
    specs = set()
    for (kind, lay), d, bm in itertools.product(KIND_CASES, DECOMPS, TILES):
        specs.add((cfg(kind, bm, "streamk" if d == "hybrid" else d), kind, lay[0], lay[1], ACC[kind], True))
    jit.warm(sorted(specs, key=str))


@pytest.mark.parametrize("bm", TILES)
@pytest.mark.parametrize("decomp", DECOMPS)
@pytest.mark.parametrize("kind,layout", KIND_CASES, ids=[f"{k}-{lay}" for k, lay in KIND_CASES])
def test_cross_product(kind, layout, decomp, bm):
    rng = np.random.default_rng(abs(hash((kind, layout, decomp, bm))) % 2**32)
    for (m, n, k), (alpha, beta), pad in itertools.product(SHAPES, [(1.0, 0.0), (0.5, -1.5)], (0, PADS[kind])):
        if kind == "s8":
            alpha, beta = (1, 0) if beta == 0 else (2, -1)
        case = Case(kind, ACC[kind], layout[0], layout[1], m, n, k, pad=pad, alpha=alpha, beta=beta, rng=rng,
                    ld_multiple=LDM[kind])
        c = cfg(kind, bm, decomp, splits=3)
        ok, why = c.validate(case.problem())
        if not ok:
            # every TMA-legal shape must be accepted; record which one was not
            pytest.fail(f"{c.name} refused {m}x{n}x{k} lda={case.lda} ldb={case.ldb}: {why}")
        out = _run(case, c, sm_count={"hybrid": 3, "sliced_c2": 4}.get(decomp))
        case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("decomp", DECOMPS)
@pytest.mark.parametrize("kind,layout", [("f16", "TN"), ("bf16", "NT"), ("s8", "TN"), ("f16", "NN")])
def test_large_1000(kind, layout, decomp):
    """1000^3 with padded ld's and alpha/beta, every decomposition (hybrid with 5 'SMs': both
    its data-parallel waves and its stream-k tail run)."""
    alpha, beta = (3, 1) if kind == "s8" else (0.75, 0.25)
    case = Case(kind, ACC[kind], layout[0], layout[1], 1000, 1000, 1000, pad=PADS[kind], alpha=alpha, beta=beta,
                ld_multiple=LDM[kind])
    out = _run(case, cfg(kind, 256, decomp, splits=4), sm_count=5 if decomp == "hybrid" else None)
    case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("decomp", ["splitk_parallel", "streamk", "hybrid", "sliced_c2"])
@pytest.mark.parametrize("kind", ["f16", "s8"])
def test_bitwise_deterministic(kind, decomp):
    layout = "TN"
    case = Case(kind, ACC[kind], layout[0], layout[1], 300, 260, 3000, alpha=1 if kind == "s8" else 1.0, beta=0,
                ld_multiple=LDM[kind])
    c = cfg(kind, 128, decomp, splits=7)
    outs = [_run(case, c, sm_count=5 if decomp == "hybrid" else None).tobytes() for _ in range(3)]
    assert outs[0] == outs[1] == outs[2]


def test_streamk_many_peers():
    """Stream-k with few CTAs and long K: one tile's K range spans several CTAs (owner adds
    several partials) and CTAs start mid-tile."""
    case = Case("bf16", "f32", "T", "N", 384, 256, 5000, alpha=1.0, beta=0.5)
    out = _run(case, cfg("bf16", 128, "streamk"), sm_count=7)
    case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("kind,layout", [("f16", "TN"), ("bf16", "NT"), ("s8", "TN")])
def test_batched_and_broadcast(kind, layout):
    """Strided batches walk the tensor maps' third dimension; stride 0 broadcasts B."""
    alpha, beta = (1, 0) if kind == "s8" else (1.0, 0.0)
    case = Case(kind, ACC[kind], layout[0], layout[1], 77, 45, 130, pad=PADS[kind], batch=3, alpha=alpha, beta=beta,
                ld_multiple=LDM[kind])
    out = _run(case, cfg(kind, 128, "sliced"))
    case.check(out, case.reference(), None)
    p = replace(case.problem(), stride_b=0)
    case.b_h[1:] = case.b_h[0]
    case.b_d[...] = cp.asarray(case.b_h)
    case.c_d[...] = cp.asarray(case.c_h)
    run(p, cfg(kind, 128, "streamk"), sm_count=4)
    cp.cuda.get_current_stream().synchronize()
    case.check(case.c_d.get(), case.reference(), None)


def test_refusals_name_the_reason():
    """What TMA / s8 wgmma cannot read is refused with the rule that failed."""
    c = cfg("f16", 128, "sliced")
    odd = Case("f16", "f32", "N", "N", 33, 20, 17, pad=0)  # lda = 33 halves: not 16-byte
    ok, why = c.validate(odd.problem())
    assert not ok and "lda" in why and "16" in why
    with pytest.raises(ValueError, match="lda"):
        run(odd.problem(), c)
    s8 = Case("s8", "s32", "N", "N", 64, 64, 64, alpha=1, beta=0)
    ok, why = cfg("s8", 128, "sliced").validate(s8.problem())
    assert not ok and "K-major" in why
    ok, why = replace(c, decomposition="splitk_serial").validate(odd.problem())
    assert not ok and "parallel" in why


def test_bound_launch_reuses_descriptors():
    """A bound launch called with new pointers patches the TMA addresses (same results as a
    fresh bind), and refuses pointers outside its alignment class."""
    from pyblasgemm.kernels.launch import bind

    c = cfg("f16", 128, "sliced")
    one = Case("f16", "f32", "T", "N", 200, 150, 300, ld_multiple=8)
    two = Case("f16", "f32", "T", "N", 200, 150, 300, ld_multiple=8)
    bl = bind(one.problem(), c)
    for case in (one, two, one):
        case.c_d[...] = cp.nan
        bl(case.a_d.data.ptr, case.b_d.data.ptr, case.c_d.data.ptr, 1.0, 0.0)
        cp.cuda.get_current_stream().synchronize()
        case.check(case.c_d.get(), case.reference(), case.cublas_out())
    with pytest.raises(ValueError, match="alignment"):
        bl(one.a_d.data.ptr + 2, one.b_d.data.ptr, one.c_d.data.ptr)


@pytest.mark.parametrize("decomp", ["sliced", "streamk", "sliced_c2"])
@pytest.mark.parametrize("kind,layout", [("f16", "NT"), ("s8", "TN")])
def test_unaligned_c_takes_direct_stores(kind, layout, decomp):
    """C off the 16-byte grid (A and B still TMA-legal): the epilogue cannot use TMA stores or
    paired stores and writes element by element; beta = 0 and beta != 0 both."""
    for alpha, beta in ([(1, 0), (2, -1)] if kind == "s8" else [(1.0, 0.0), (0.5, -1.5)]):
        case = Case(kind, ACC[kind], layout[0], layout[1], 333, 190, 250, alpha=alpha, beta=beta,
                    ld_multiple=LDM[kind])
        # C one element into a larger buffer, ldc odd: element-aligned only
        ldc = case.m + 1
        big = cp.full(ldc * case.n + 1, -7 if kind == "s8" else cp.nan, dtype=case.c_d.dtype)
        host_c = np.full((1, case.n, ldc), 0, dtype=case.c_h.dtype)
        host_c[0, :, : case.m] = case.c_h[0, :, : case.m]
        big[1:] = cp.asarray(host_c.ravel())
        p = replace(case.problem(), c_ptr=big.data.ptr + big.itemsize, ldc=ldc, stride_c=ldc * case.n)
        run(p, cfg(kind, 128, decomp), sm_count=4 if decomp != "sliced" else None)
        cp.cuda.get_current_stream().synchronize()
        got = big[1:].get().reshape(1, case.n, ldc)[:, :, : case.m].transpose(0, 2, 1)
        ref = case.reference()
        if kind == "s8":
            assert np.array_equal(got, ref.astype(np.int64).astype(np.int32))
        else:
            err = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)
            assert err < 2e-3, err
        assert np.all(big[:1].get() == big.dtype.type(-7)) if kind == "s8" else np.isnan(big[:1].get()).all()


def sanitize_cases():
    """One small problem per kind x decomposition (with beta = 0 and beta != 0, an interior tile
    and edges), for running under compute-sanitizer: ``python tests/test_sm90_gpu.py`` (exit
    status 1 on a wrong result)."""
    bad = 0
    rng = np.random.default_rng(1)
    for (kind, layout), decomp in itertools.product(KIND_CASES, DECOMPS):
        for alpha, beta in ([(1, 0), (2, -1)] if kind == "s8" else [(1.0, 0.0), (0.5, 0.25)]):
            case = Case(kind, ACC[kind], layout[0], layout[1], 300, 200, 300, alpha=alpha, beta=beta, rng=rng,
                        ld_multiple=LDM[kind])
            try:
                out = _run(case, cfg(kind, 128, decomp, splits=3),
                           sm_count={"hybrid": 3, "sliced_c2": 4, "streamk": 5}.get(decomp))
                case.check(out, case.reference())
                status = "ok"
            except AssertionError as e:
                bad += 1
                status = f"FAIL {e}"
            print(f"{kind} {layout} {decomp} beta={beta}: {status}", flush=True)
    return bad


if __name__ == "__main__":
    import sys

    sys.exit(1 if sanitize_cases() else 0)
