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

LAYOUTS = {"f16": ["NN", "NT", "TN", "TT"], "bf16": ["NN", "NT", "TN", "TT"], "s8": ["TN"],
           "f16_out32": ["NN", "NT", "TN", "TT"], "bf16_out32": ["NN", "TT"]}
KIND_CASES = [(k, lay) for k in ("f16", "bf16", "s8") for lay in LAYOUTS[k]]
#: fp32 C from 16-bit operands: the 16-bit mainloop, the 4-byte epilogue; their shipped tiles
OUT32_CASES = [(k, lay) for k in ("f16_out32", "bf16_out32") for lay in LAYOUTS[k]]
OUT32_TILES = [128, 64, "w1-64"]   # two accumulator sets (rounding FADDs): wgmma N <= 128
#: fp32 operands (tf32, 3xTF32): the prep kernel reads any layout and leading dimension (pad 3:
#: not a 16-byte multiple), the GEMM runs its K-major copy; 3xTF32 tiles are <= 128 wide
PREP_TILES = {"tf32": [256, 128, "w1-64"], "3xtf32": [128, 64, "w1-64"]}
DECOMPS = ["sliced", "splitk_parallel", "streamk", "hybrid", "sliced_c2"]  # c2: 2-CTA clusters, multicast
TILES = [256, 192, 128, 64, "w1-128", "w1-64"]  # w1: one consumer warpgroup (64-row tiles)
PREP_PARAMS = [(kind, lay, d, bm) for kind in ("tf32", "3xtf32") for lay in ("NN", "NT", "TN", "TT")
               for d in DECOMPS for bm in PREP_TILES[kind] if not (isinstance(bm, str) and d == "sliced_c2")]
#: mma.sync consumers (f16/bf16, 64 x 64 and 64 x 32 warp tiles), every layout and decomposition
SYNC_DECOMPS = DECOMPS
SYNC_PARAMS = [(kind, lay, d, bm) for kind in ("f16", "bf16") for lay in ("NN", "NT", "TN", "TT")
               for d in SYNC_DECOMPS for bm in ("sync-256", "sync-128")]
ACC = {"f16": "f32", "bf16": "f32", "s8": "s32", "f16_out32": "f32", "bf16_out32": "f32", "tf32": "f32",
       "3xtf32": "f32"}
# sizes: 1, primes, non-multiples of 64/128/256 on every axis; k=1000 crosses many stages
SHAPES = [(1, 1, 1), (7, 31, 129), (129, 7, 31), (31, 129, 1000), (257, 130, 77), (300, 260, 200)]
PADS = {"f16": 8, "bf16": 8, "s8": 16, "f16_out32": 8, "bf16_out32": 8}  # one 16-byte vector: TMA-legal
LDM = PADS  # leading dimensions rounded up to 16 bytes


def cfg(kind, bm, decomp, splits=0):
    if isinstance(bm, str) and bm.startswith("sync"):   # mma.sync consumers on the TMA ring
        base = replace(SM90_CONFIGS_BY_TILE[kind][int(bm.split("-")[1])], consumer="mma.sync")
    elif isinstance(bm, str):
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
    for kind, lay, d, bm in OUT32_PARAMS + PREP_PARAMS + SYNC_PARAMS:
        specs.add((cfg(kind, bm, "streamk" if d == "hybrid" else d), kind, lay[0], lay[1], ACC[kind], True))
    jit.warm(sorted(specs, key=str))


def _check_cross(kind, layout, decomp, bm, pad, ld_multiple):
    """Every shape of SHAPES x alpha/beta (beta = 0 over NaN-poisoned C) x padding 0 / ``pad``:
    accepted by the config and within 2x cuBLAS's error."""
    rng = np.random.default_rng(abs(hash((kind, layout, decomp, bm))) % 2**32)
    for (m, n, k), (alpha, beta), p in itertools.product(SHAPES, [(1.0, 0.0), (0.5, -1.5)], (0, pad)):
        if kind == "s8":
            alpha, beta = (1, 0) if beta == 0 else (2, -1)
        case = Case(kind, ACC[kind], layout[0], layout[1], m, n, k, pad=p, alpha=alpha, beta=beta, rng=rng,
                    ld_multiple=ld_multiple)
        c = cfg(kind, bm, decomp, splits=3)
        ok, why = c.validate(case.problem())
        if not ok:
            # every legal shape must be accepted; record which one was not
            pytest.fail(f"{c.name} refused {m}x{n}x{k} lda={case.lda} ldb={case.ldb}: {why}")
        out = _run(case, c, sm_count={"hybrid": 3, "sliced_c2": 4}.get(decomp))
        case.check(out, case.reference(), case.cublas_out())


@pytest.mark.parametrize("bm", TILES)
@pytest.mark.parametrize("decomp", DECOMPS)
@pytest.mark.parametrize("kind,layout", KIND_CASES, ids=[f"{k}-{lay}" for k, lay in KIND_CASES])
def test_cross_product(kind, layout, decomp, bm):
    _check_cross(kind, layout, decomp, bm, PADS[kind], LDM[kind])


# clusters are shipped for the two-warpgroup tiles only
OUT32_PARAMS = [(kind, lay, d, bm) for (kind, lay), d, bm in itertools.product(OUT32_CASES, DECOMPS, OUT32_TILES)
                if not (isinstance(bm, str) and d == "sliced_c2")]


@pytest.mark.parametrize("kind,layout,decomp,bm", OUT32_PARAMS, ids=["-".join(map(str, p)) for p in OUT32_PARAMS])
def test_fp32_output_cross_product(kind, layout, decomp, bm):
    """16-bit operands with a float32 C (shgemm / sbgemm): the same mainloop, 4-byte epilogue
    (TMA-store boxes of 32 columns, paired 8-byte stores, fp32 split-k / stream-k partials)."""
    _check_cross(kind, layout, decomp, bm, PADS[kind], LDM[kind])


@pytest.mark.parametrize("kind,layout,decomp,bm", PREP_PARAMS, ids=["-".join(map(str, p)) for p in PREP_PARAMS])
def test_fp32_operands_cross_product(kind, layout, decomp, bm):
    """float32 through tf32 / 3xTF32 on wgmma: prep kernel (any layout, ld not a 16-byte
    multiple) + the K-major GEMM; error within 2x cuBLAS's (tf32: the exactly rounded tf32
    product; 3xTF32: SGEMM) on sizes 1..1000, alpha/beta with NaN-poisoned C."""
    _check_cross(kind, layout, decomp, bm, 3, 1)   # pad 3: not a 16-byte multiple


@pytest.mark.parametrize("kind,layout,decomp,bm", SYNC_PARAMS, ids=["-".join(map(str, p)) for p in SYNC_PARAMS])
def test_mma_sync_consumers_cross_product(kind, layout, decomp, bm):
    """The TMA ring feeding mma.sync consumers (ldmatrix from the 128-byte-swizzled stages, K- and
    MN-major operands): same shapes, alpha/beta, NaN-poisoned C and error bound as wgmma."""
    _check_cross(kind, layout, decomp, bm, PADS[kind], LDM[kind])


@pytest.mark.parametrize("layout", ["NN", "TN", "NT", "TT"])
def test_3xtf32_accuracy_on_wgmma(layout):
    """3xTF32 on wgmma within 2x cuBLAS SGEMM's error and >= 10x more accurate than tf32."""
    for m, n, k in [(257, 129, 1000), (64, 64, 4096), (300, 200, 9000)]:
        errs = {}
        case = Case("3xtf32", "f32", layout[0], layout[1], m, n, k, pad=1)
        ref = case.reference()
        for kind in ("tf32", "3xtf32"):
            case.kind = kind
            case.c_d[...] = cp.nan
            errs[kind] = case.check(_run(case, cfg(kind, 128, "sliced")), ref)
        sg = cp.matmul(*[cp.ascontiguousarray(x) for x in case.ops(case.a_d, case.b_d)]).get()
        sgemm_err = np.linalg.norm(sg.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert errs["3xtf32"] <= 2 * sgemm_err + 1e-7, (errs, sgemm_err)
        assert errs["3xtf32"] * 10 <= errs["tf32"], errs


def test_fp32_operands_batched_and_broadcast():
    """tf32 prep walks batches; a broadcast operand (batch stride 0) is prepared once."""
    for kind, bstride0 in (("3xtf32", False), ("3xtf32", True), ("tf32", True)):
        case = Case(kind, "f32", "N", "T", 77, 45, 130, pad=3, batch=3)
        p = case.problem()
        if bstride0:
            p = replace(p, stride_b=0)
            case.b_h[1:] = case.b_h[0]
            case.b_d[...] = cp.asarray(case.b_h)    # same pointer: batches 1.. equal batch 0 too
        run(p, cfg(kind, 128, "sliced"))
        out = case.c_d.get()
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


DETERMINISM = [(kind, bm, d) for kind, bm in (("f16", 128), ("s8", 128))
               for d in ("splitk_parallel", "streamk", "hybrid", "sliced_c2")]
DETERMINISM += [("f16", "sync-256", d) for d in ("splitk_parallel", "streamk", "hybrid", "sliced_c2")]


@pytest.mark.parametrize("kind,bm,decomp", DETERMINISM, ids=["-".join(map(str, p)) for p in DETERMINISM])
def test_bitwise_deterministic(kind, bm, decomp):
    layout = "TN"
    case = Case(kind, ACC[kind], layout[0], layout[1], 300, 260, 3000, alpha=1 if kind == "s8" else 1.0, beta=0,
                ld_multiple=LDM[kind])
    c = cfg(kind, bm, decomp, splits=7)
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


def _sanitize_specs(which: str):
    """(kind, layout, decomposition, tile) of the sanitizer run: ``all`` = every kind x layout x
    decomposition on the 128-wide tile; ``new`` = the tiles and kinds added after the last clean
    run (192-wide and one-warpgroup tiles, fp32 C, tf32 / 3xTF32 with the prep kernel, mma.sync
    consumers); ``sync`` = the mma.sync consumers only."""
    specs = []
    if which == "all":
        specs += [(kind, lay, d, 128) for (kind, lay), d in itertools.product(KIND_CASES, DECOMPS)]
    specs += [("f16", "TN", d, bm) for d in DECOMPS for bm in (192, "w1-128", "w1-64")
              if not (isinstance(bm, str) and d == "sliced_c2")]
    specs += [(kind, lay, d, 128) for kind, lay in (("f16_out32", "NT"), ("bf16_out32", "TN")) for d in DECOMPS]
    specs += [(kind, lay, d, 128) for kind, lay in (("tf32", "NT"), ("3xtf32", "NN")) for d in DECOMPS]
    if which in ("all", "new", "sync"):
        if which == "sync":
            specs = []
        specs += [(kind, lay, d, "sync-256") for kind, lay in (("f16", "TN"), ("bf16", "NT")) for d in SYNC_DECOMPS]
        specs += [("f16", lay, "sliced", "sync-128") for lay in ("NN", "TT")]
    return specs


def sanitize_cases(which: str = "all"):
    """One small problem per spec (with beta = 0 and beta != 0, an interior tile and edges), for
    running under compute-sanitizer: ``python tests/test_sm90_gpu.py [all|new]`` (exit status 1
    on a wrong result)."""
    bad = 0
    rng = np.random.default_rng(1)
    for kind, layout, decomp, bm in _sanitize_specs(which):
        for alpha, beta in ([(1, 0), (2, -1)] if kind == "s8" else [(1.0, 0.0), (0.5, 0.25)]):
            case = Case(kind, ACC[kind], layout[0], layout[1], 300, 200, 300, alpha=alpha, beta=beta, rng=rng,
                        ld_multiple=LDM.get(kind, 1))
            try:
                out = _run(case, cfg(kind, bm, decomp, splits=3),
                           sm_count={"hybrid": 3, "sliced_c2": 4, "streamk": 5}.get(decomp))
                case.check(out, case.reference(), case.cublas_out())   # accuracy too, not only NaN/padding
                status = "ok"
            except AssertionError as e:
                bad += 1
                status = f"FAIL {e}"
            print(f"{kind} {layout} {decomp} {bm} beta={beta}: {status}", flush=True)
    return bad


if __name__ == "__main__":
    import sys

    sys.exit(1 if sanitize_cases(sys.argv[1] if len(sys.argv) > 1 else "all") else 0)
