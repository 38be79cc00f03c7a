"""Pure-Python tests of the Hopper kernel's host rules (no GPU, no CuPy, no CUDA driver).

* ``KernelConfig.validate`` for ``family='sm90a'`` (families.HopperFamily.validate): what TMA and s8
  wgmma need of the operands, the tile / pipeline / shared-memory bounds, the decompositions;
* ``sm90.tma_maps``: the (dims, strides, box) of the P = op(B)^T and Q = op(A) tensor maps for
  every layout, batched and broadcast (batch stride 0);
* ``launch.launch_geometry`` for Hopper configs: a persistent grid of at most ``sm_count`` CTAs,
  whole-matrix split-k workspace, stream-k waves and per-CTA iterations (hypothesis).

Problems carry fake, suitably aligned integer pointers: nothing is dereferenced.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyblasgemm.kernels.config import (MAX_SMEM_SM90, SM90_CONFIGS, SM90_CONFIGS_BY_TILE, SM90_DECOMPOSITIONS,
                                       SM90_KINDS, SM90_MMA_SYNC_CONFIGS, SM90_PREP_KINDS, KernelConfig,
                                       sm90_prep_shape)
from pyblasgemm.planner.model import parse_config_name
from pyblasgemm.kernels.launch import launch_geometry
from pyblasgemm.kernels.problem import ELEM_BYTES, KernelProblem
from pyblasgemm.kernels.sm90 import prepared_problem, tma_maps

LAYOUTS = ("NN", "NT", "TN", "TT")
LAYOUTS_OF = {"f16": LAYOUTS, "bf16": LAYOUTS, "s8": ("TN",), "f16_out32": LAYOUTS, "bf16_out32": LAYOUTS,
              "tf32": LAYOUTS, "3xtf32": LAYOUTS,
              "e4m3": ("TN",), "e4m3_e5m2": ("TN",), "e5m2_e4m3": ("TN",), "e5m2": ("TN",)}
#: the float8 kinds: K-major only (as s8), their tiles what pyblasgemm.kernels.fp8 picks
FP8 = ("e4m3", "e4m3_e5m2", "e5m2_e4m3", "e5m2")
#: kinds with a second (rounding) accumulator set: tiles at most 128 wide
TWO_ACC = ("3xtf32", "f16_out32", "bf16_out32") + FP8
#: the kinds whose operands TMA reads as stored (fp32 kinds read a prepared K-major copy)
TMA_KINDS = tuple(k for k in SM90_KINDS if k not in SM90_PREP_KINDS)
#: fake device pointers, 256-byte aligned like the CuPy pool's
A_PTR, B_PTR, C_PTR = 0x7F00_0000_0000, 0x7F00_4000_0000, 0x7F00_8000_0000
#: the kernel's fixed D-tile extent over n (2 consumer warpgroups x 64 rows)
BMT = 128
ALL_SM90 = list(dict.fromkeys(c for v in SM90_CONFIGS.values() for c in v))  # f16 and bf16 share configs


def _up(x: int, v: int) -> int:
    return -(-x // v) * v


def prob(kind: str, lay: str, m: int, n: int, k: int, *, pad: int = 0, lda: int | None = None,
         ldb: int | None = None, batch: int = 1, stride_a: int | None = None, stride_b: int | None = None,
         a_off: int = 0, b_off: int = 0, accumulate: str | None = None) -> KernelProblem:
    """A column-major problem whose leading dimensions are the stored row counts rounded up to
    16 bytes (+ ``pad`` elements) and whose batches are packed (unless strides are given)."""
    ta, tb = lay
    v = 16 // ELEM_BYTES[kind]
    rows_a, cols_a = (m, k) if ta == "N" else (k, m)
    rows_b, cols_b = (k, n) if tb == "N" else (n, k)
    lda = _up(rows_a, v) + pad if lda is None else lda
    ldb = _up(rows_b, v) + pad if ldb is None else ldb
    if batch > 1:
        stride_a = lda * cols_a if stride_a is None else stride_a
        stride_b = ldb * cols_b if stride_b is None else stride_b
    else:
        stride_a = stride_a or 0
        stride_b = stride_b or 0
    return KernelProblem(kind, ta, tb, m, n, k, lda, ldb, m, A_PTR + a_off, B_PTR + b_off, C_PTR,
                         accumulate=accumulate, batch=batch, stride_a=stride_a, stride_b=stride_b,
                         stride_c=m * n if batch > 1 else 0)


def refused(cfg: KernelConfig, p: KernelProblem | None = None, *, kind: str | None = None, **kw) -> str:
    ok, why = cfg.validate(p, kind=kind, **kw)
    assert not ok, f"{cfg.name} accepted {p}"
    assert why, "a refusal must say why"
    return why


def base(kind: str = "f16", tile: int = 128, **kw) -> KernelConfig:
    return replace(SM90_CONFIGS_BY_TILE[kind][tile], **kw)


# --- validate: what is accepted ---------------------------------------------------------------------

SHAPES = [(1, 1, 1), (7, 31, 129), (129, 7, 31), (300, 260, 200), (4096, 4096, 4096), (256, 128, 64)]


@pytest.mark.parametrize("kind", SM90_KINDS)
def test_every_shipped_config_accepts_its_layouts(kind):
    for cfg in SM90_CONFIGS[kind]:
        assert cfg.validate(kind=kind) == (True, ""), cfg.name
        for (m, n, k) in SHAPES:
            for lay in LAYOUTS_OF[kind]:
                for extra in (dict(), dict(pad=16 // ELEM_BYTES[kind]), dict(batch=3),
                              dict(batch=5, stride_a=0), dict(batch=2, stride_b=0), dict(a_off=16, b_off=48)):
                    p = prob(kind, lay, m, n, k, **extra)
                    assert cfg.validate(p) == (True, ""), (cfg.name, p)


def test_shipped_configs_cover_tiles_and_decompositions():
    for kind in SM90_KINDS:
        if kind in FP8:     # 128 x 128 and 64 x 64, sliced and parallel split-k
            assert {(c.bm, c.bn, c.decomposition, c.cluster) for c in SM90_CONFIGS[kind]} == {
                (t, t, d, 1) for t in (64, 128) for d in ("sliced", "splitk_parallel")}
            continue
        # fp32-output kinds: fewer tiles (the mainloops are the 16-bit kinds', tested in full)
        # (3xTF32: two accumulator sets, wgmma N <= 128)
        wide = (64, 128) if kind in TWO_ACC else (128, 256) if kind == "tf32" else (64, 128, 192, 256)
        narrow = (64, 128) if kind in ("f16", "bf16", "s8") else (64,)
        plain = [c for c in SM90_CONFIGS[kind] if getattr(c, "cluster", 1) == 1 and c.bn == 128]
        assert {(c.bm, c.decomposition) for c in plain} == {(bm, d) for bm in wide for d in SM90_DECOMPOSITIONS}
        one_wg = [c for c in SM90_CONFIGS[kind] if c.bn == 64]   # one consumer warpgroup
        assert {(c.bm, c.decomposition) for c in one_wg} == {(bm, d) for bm in narrow for d in SM90_DECOMPOSITIONS}
        for c in SM90_CONFIGS[kind]:
            assert c.family == "sm90a" and c.bn == 64 * c.warps_m and c.bk * ELEM_BYTES[kind] == 128
            assert c.threads == 128 * (1 + c.warps_m)
            assert c.smem_bytes(kind) <= MAX_SMEM_SM90, c.name


# --- validate: what is refused, and why --------------------------------------------------------------

@pytest.mark.parametrize("lay", ["NN", "NT", "TT"])
def test_s8_needs_k_major_operands(lay):
    for cfg in SM90_CONFIGS["s8"]:
        why = refused(cfg, prob("s8", lay, 256, 256, 256))
        assert "K-major" in why, why


@pytest.mark.parametrize("kind,lay", [(k, lay) for k in TMA_KINDS for lay in LAYOUTS_OF[k]])
def test_leading_dimensions_must_be_16_byte_multiples(kind, lay):
    cfg = SM90_CONFIGS_BY_TILE[kind][128]
    eb = ELEM_BYTES[kind]
    m, n, k = 256, 192, 320                      # every stored row count a 16-byte multiple
    good = prob(kind, lay, m, n, k)
    assert cfg.validate(good) == (True, "")
    for bump in range(1, 16 // eb):              # element-aligned but not 16-byte aligned
        why = refused(cfg, replace(good, lda=good.lda + bump))
        assert "lda" in why and "16" in why, why
        why = refused(cfg, replace(good, ldb=good.ldb + bump))
        assert "ldb" in why and "16" in why, why
    assert cfg.validate(replace(good, lda=good.lda + 16 // eb, ldb=good.ldb + 16 // eb))[0]


@pytest.mark.parametrize("kind", TMA_KINDS)
def test_operand_pointers_must_be_16_byte_aligned(kind):
    cfg = SM90_CONFIGS_BY_TILE[kind][128]
    lay = LAYOUTS_OF[kind][-1]
    eb = ELEM_BYTES[kind]
    assert cfg.validate(prob(kind, lay, 100, 100, 100, a_off=16, b_off=32))[0]
    for off in range(eb, 16, eb):                # element-aligned (legal for mma.sync), not for TMA
        for which in ("a_off", "b_off"):
            why = refused(cfg, prob(kind, lay, 100, 100, 100, **{which: off}))
            assert "align" in why, why
    # C needs no 16-byte alignment on this kernel (scalar edge stores)
    p = prob(kind, lay, 100, 100, 100)
    assert cfg.validate(replace(p, c_ptr=p.c_ptr + 4))[0]


def test_batch_strides():
    cfg = base("f16")
    p = prob("f16", "NN", 64, 64, 64, batch=4)
    assert cfg.validate(p)[0]
    why = refused(cfg, replace(p, stride_a=p.stride_a + 1))
    assert "stride_a" in why, why
    why = refused(cfg, replace(p, stride_b=p.stride_b - 8))        # 16-byte multiple, but overlapping
    assert "stride_b" in why and "overlap" in why, why
    assert cfg.validate(replace(p, stride_a=0, stride_b=0))[0]     # broadcast both
    assert cfg.validate(replace(p, batch=1, stride_a=3, stride_b=5))[0]  # strides unused at batch 1


def test_kernel_kinds_and_accumulate():
    for kind in ("tf32", "3xtf32"):
        why = refused(base("f16"), kind=kind)         # bk = 64 fp32 elements: 256 bytes
        assert "bk" in why, why
    why = refused(base("3xtf32", 128, bm=256, stages=2), kind="3xtf32")
    assert "accumulators" in why and "128" in why, why
    why = refused(base("f16"), prob("f16", "NN", 64, 64, 64, accumulate="f16"))
    assert "fp32" in why, why
    refused(base("f16"), prob("f16", "NX", 64, 64, 64))


def test_decompositions():
    why = refused(base(decomposition="splitk_serial", splits=2), kind="f16")
    assert "parallel" in why, why
    refused(base(decomposition="bogus"), kind="f16")
    why = refused(base(decomposition="splitk_parallel", splits=1), kind="f16")
    assert "splits" in why, why
    assert base(decomposition="splitk_parallel", splits=0).validate(kind="f16")[0]
    assert base(decomposition="splitk_parallel", splits=7).validate(kind="f16")[0]
    for d in ("sliced", "streamk", "hybrid"):
        why = refused(base(decomposition=d, splits=3), kind="f16")
        assert "splits" in why, why
    refused(base(group_m=0), kind="f16")


def test_mma_sync_consumers():
    """consumer='mma.sync': f16/bf16, two consumer warpgroups, bm 128/256, every decomposition
    (clusters too); the name carries it and parses back; the sm80 family refuses it."""
    for kind, cfgs in SM90_MMA_SYNC_CONFIGS.items():
        for c in cfgs:
            assert c.validate(kind=kind)[0], c.name
            assert "_mmasync" in c.name and parse_config_name(c.name) == c
            for lay in LAYOUTS:
                assert c.validate(prob(kind, lay, 300, 260, 200))[0], (c.name, lay)
    sync = base(tile=256, consumer="mma.sync")
    for kind in ("s8", "f16_out32", "tf32", "3xtf32"):
        assert "f16/bf16" in refused(base(kind, tile=128, consumer="mma.sync"), kind=kind)
    assert "bm 128 or 256" in refused(replace(sync, bm=192), kind="f16")
    assert "two consumer warpgroups" in refused(base(tile=128, consumer="mma.sync", warps_m=1, bn=64), kind="f16")
    for d in ("streamk", "hybrid", "splitk_parallel"):
        assert replace(sync, decomposition=d).validate(kind="bf16")[0], d
    assert "wgmma" in refused(replace(sync, consumer="tensor"), kind="f16")
    why = refused(KernelConfig(consumer="mma.sync"), kind="f16")
    assert "sm90a" in why, why


@pytest.mark.parametrize("kind", SM90_KINDS)
def test_stage_and_tile_bounds(kind):
    eb = ELEM_BYTES[kind]
    # bm=64: the whole 2..8 range fits in 227 KB (3xTF32 stages hold two halves: 2..4)
    for stages in range(2, 5 if kind == "3xtf32" else 9):
        assert base(kind, 128, bm=64, stages=stages).validate(kind=kind) == (True, ""), stages
    for stages in (-1, 0, 1, 17, 32):
        why = refused(base(kind, 128, bm=64, stages=stages), kind=kind)
        assert "stages" in why, why
    for bm in (32, 96, 160, 320, 512):
        why = refused(base(kind, 128, bm=bm), kind=kind)
        assert "bm" in why, why
    for bm in (64, 128, 192, 256):
        ok, why = base(kind, 128, bm=bm, stages=2 if kind == "3xtf32" else 4).validate(kind=kind)
        if kind in TWO_ACC and bm > 128:           # two accumulator sets: wgmma N <= 128
            assert not ok and "accumulators" in why, why
        else:
            assert ok, (bm, why)
    for bn in (64, 192, 256):                    # bn = 64 per consumer warpgroup (2 here)
        why = refused(base(kind, 128, bn=bn), kind=kind)
        assert "bn" in why, why
    assert base(kind, 128, bn=64, warps_m=1).validate(kind=kind)[0]   # one consumer warpgroup
    for bk in (64 // eb, 256 // eb):
        why = refused(base(kind, 128, bk=bk), kind=kind)
        assert "bk" in why, why
    for wm, wn in ((2, 2), (1, 2), (4, 1), (3, 1)):
        why = refused(base(kind, 128, warps_m=wm, warps_n=wn), kind=kind)
        assert "warpgroup" in why, why
    refused(base(kind, 128, family="sm100"), kind=kind)


@pytest.mark.parametrize("kind", SM90_KINDS)
def test_shared_memory_limit(kind):
    # the ring: stages x (128 + bm) rows x 128 bytes, + the epilogue's TMA-store staging (2 x 2 x
    # 8 KB), + 16 bytes of mbarriers a stage, + 1 KB alignment
    for bm in ((64, 128) if kind in TWO_ACC else (64, 128, 192, 256)):
        for stages in range(2, 9):
            c = base(kind, 128, bm=bm, stages=stages)
            need = stages * (BMT + bm) * 128 * (2 if kind == "3xtf32" else 1) + 16384 * 2 + 16 * stages + 1024
            assert c.smem_bytes(kind) == need
            ok, why = c.validate(kind=kind)
            assert ok == (need <= MAX_SMEM_SM90), (bm, stages, why)
            if not ok:
                assert "shared memory" in why and str(need) in why, why
    why = refused(base(kind, 128, bm=256, stages=5), kind=kind)   # 5 x 384 x 128 = 245760 > 232448
    assert "shared memory" in why, why
    shipped = SM90_CONFIGS_BY_TILE[kind][128]
    why = refused(shipped, kind=kind, max_smem=shipped.smem_bytes(kind) - 1)  # a smaller opt-in limit
    assert "shared memory" in why, why
    assert shipped.validate(kind=kind, max_smem=shipped.smem_bytes(kind))[0]


# --- TMA maps ----------------------------------------------------------------------------------------

#: every shipped two-warpgroup sliced tile (bm 64..256, with and without a 2-CTA cluster)
_MAP_CASES = [(k, lay, c) for k in TMA_KINDS for lay in LAYOUTS_OF[k] for c in SM90_CONFIGS[k]
              if c.decomposition == "sliced" and c.bn == 128 and c.bm in (64, 128, 256)]


@pytest.mark.parametrize("kind,lay,cfg", _MAP_CASES, ids=[f"{k}-{lay}-{c.name}" for k, lay, c in _MAP_CASES])
def test_tma_maps_per_layout(kind, lay, cfg):
    bm, cluster = cfg.bm, cfg.cluster
    eb = ELEM_BYTES[kind]
    bke = 128 // eb
    m, n, k = 300, 260, 200
    p = prob(kind, lay, m, n, k, pad=16 // eb)
    pmap, qmap, pbat, qbat = tma_maps(p, cfg)
    assert (pbat, qbat) == (False, False)
    # P = op(B)^T: B(k x n) col-major ('N', K contiguous) or B stored n x k ('T', N contiguous)
    if lay[1] == "N":
        want_p = ((k, n, 1), (p.ldb * eb, _up(n * p.ldb * eb, 16)), (bke, BMT, 1))
    else:
        want_p = ((n, k, 1), (p.ldb * eb, _up(k * p.ldb * eb, 16)), (64, bke, 1))
    # Q = op(A): A stored k x m ('T', K contiguous) or A(m x k) col-major ('N', M contiguous);
    # in a 2-CTA cluster each CTA loads (and multicasts) half of Q's K-major rows
    if lay[0] == "T":
        want_q = ((k, m, 1), (p.lda * eb, _up(m * p.lda * eb, 16)), (bke, bm // cluster, 1))
    else:
        want_q = ((m, k, 1), (p.lda * eb, _up(k * p.lda * eb, 16)), (64, bke, 1))
    assert tuple(map(tuple, pmap)) == want_p
    assert tuple(map(tuple, qmap)) == want_q
    for dims, strides, box in (pmap, qmap):
        _check_map_legal(dims, strides, box, eb)


def _check_map_legal(dims, strides, box, eb):
    """What cuTensorMapEncodeTiled and the 128-byte swizzle require of a 3-D map."""
    assert len(dims) == len(box) == 3 and len(strides) == 2
    assert all(1 <= d < 2**32 for d in dims)
    assert all(s % 16 == 0 and 0 < s < 2**40 for s in strides), strides
    assert strides[0] >= dims[0] * eb, "rows overlap"
    if dims[2] > 1:
        assert strides[1] >= dims[1] * strides[0], "batches overlap"
    assert all(1 <= b <= 256 for b in box), box
    assert box[0] * eb == 128, "the 128-byte swizzle needs 128-byte box rows"
    assert box[2] == 1


@pytest.mark.parametrize("lay", LAYOUTS)
def test_tma_maps_batched_and_broadcast(lay):
    kind, eb = "bf16", 2
    cfg = SM90_CONFIGS_BY_TILE[kind][128]
    m, n, k, batch = 72, 40, 56, 6
    p = prob(kind, lay, m, n, k, batch=batch, stride_a=None, stride_b=None)
    pmap, qmap, pbat, qbat = tma_maps(p, cfg)
    assert (pbat, qbat) == (True, True)
    assert pmap[0][2] == qmap[0][2] == batch
    assert pmap[1][1] == p.stride_b * eb and qmap[1][1] == p.stride_a * eb
    for mp in (pmap, qmap):
        _check_map_legal(*mp, eb)
    # broadcast A (stride 0): Q's batch dimension collapses to size 1; P still walks the batch
    pa = replace(p, stride_a=0)
    pmap2, qmap2, pbat2, qbat2 = tma_maps(pa, cfg)
    assert (pbat2, qbat2) == (True, False)
    assert qmap2[0][2] == 1 and qmap2[0][:2] == qmap[0][:2] and qmap2[2] == qmap[2]
    assert pmap2 == pmap
    for mp in (pmap2, qmap2):
        _check_map_legal(*mp, eb)
    # broadcast B
    pb = replace(p, stride_b=0)
    pmap3, qmap3, pbat3, qbat3 = tma_maps(pb, cfg)
    assert (pbat3, qbat3) == (False, True)
    assert pmap3[0][2] == 1 and qmap3 == qmap
    # a batch of 1 never walks the batch, whatever its strides say
    p1 = replace(p, batch=1)
    assert tma_maps(p1, cfg)[2:] == (False, False)
    assert tma_maps(p1, cfg)[0][0][2] == tma_maps(p1, cfg)[1][0][2] == 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(k, lay) for k in TMA_KINDS for lay in LAYOUTS_OF[k]]),
       st.sampled_from([64, 128, 192, 256]), st.integers(1, 70000), st.integers(1, 70000), st.integers(1, 70000),
       st.integers(0, 4), st.integers(1, 9), st.sampled_from(["packed", "a0", "b0", "gap"]))
def test_tma_maps_legal_for_every_valid_problem(kl, bm, m, n, k, padv, batch, strides):
    kind, lay = kl
    assume(not (kind in TWO_ACC and bm > 128))
    eb = ELEM_BYTES[kind]
    cfg = base(kind, 128, bm=bm, stages=4)
    p = prob(kind, lay, m, n, k, pad=padv * 16 // eb, batch=batch)
    if batch > 1 and strides != "packed":
        p = replace(p, stride_a=0 if strides == "a0" else p.stride_a + (64 // eb) * (strides == "gap"),
                    stride_b=0 if strides == "b0" else p.stride_b)
    assert cfg.validate(p) == (True, ""), p
    pmap, qmap, pbat, qbat = tma_maps(p, cfg)
    for mp in (pmap, qmap):
        _check_map_legal(*mp, eb)
    assert pbat == (batch > 1 and p.stride_b != 0) and qbat == (batch > 1 and p.stride_a != 0)
    # the K extent of each map is k; the other is n (P) / m (Q)
    assert sorted(pmap[0][:2]) == sorted((k, n)) and sorted(qmap[0][:2]) == sorted((k, m))


# --- launch geometry -----------------------------------------------------------------------------------

def _kernel_tiles(p: KernelProblem, cfg: KernelConfig) -> tuple[int, int]:
    """(tiles, kt) as impls/sm90_gemm.cuh counts them: D = C^T, 128 rows over n, bm columns over m,
    128 bytes of K a stage (fp32 kinds: of the prepared K)."""
    k = prepared_problem(p).k if p.kind in SM90_PREP_KINDS else p.k
    return -(-p.n // cfg.bn) * -(-p.m // cfg.bm) * p.batch, -(-k // (128 // ELEM_BYTES[p.kind]))


def _check_geometry(p: KernelProblem, cfg: KernelConfig, sms: int) -> dict:
    g = dict(launch_geometry(p, cfg, sms))
    if p.kind in SM90_PREP_KINDS:
        # the GEMM's own workspace (checked below) + the prepared operands
        assert g["prep_bytes"] == sm90_prep_shape(p)[2]
        g["ws_bytes"] -= g.pop("prep_bytes")
    grid = g["grid"]
    tiles, kt = _kernel_tiles(p, cfg)
    assert (g["tiles"], g["kt"]) == (tiles, kt)
    assert grid[1] == grid[2] == 1, "the Hopper kernel runs a 1-D persistent grid"
    assert 1 <= grid[0] <= sms, f"grid {grid[0]} with {sms} SMs (one CTA per SM, all co-resident)"
    cl = getattr(cfg, "cluster", 1)
    assert grid[0] % cl == 0, f"grid {grid[0]} is not whole clusters of {cl}"
    d = cfg.decomposition
    if d == "sliced":
        units = tiles if cl == 1 else -(-(-(-p.n // cfg.bn)) // cl) * -(-p.m // cfg.bm) * p.batch
        assert grid[0] <= cl * units, "idle clusters"
        assert grid[0] == cl * min(units, sms // cl)
        assert g["ws_bytes"] == 0 and g["flags"] == 0
    elif d == "splitk_parallel":
        s, kps = g["splits"], g["kt_per_split"]
        assert 1 <= s <= kt
        if cfg.splits:
            assert s <= cfg.splits
        assert (s - 1) * kps < kt <= s * kps, "an empty split"
        assert grid[0] == min(tiles * s, sms)
        assert g["ws_bytes"] == s * p.batch * p.m * p.n * 4
        assert g["flags"] == 0
    else:
        ctas = grid[0]
        dp, sk = g["dp_tiles"], g["sk_tiles"]
        assert dp + sk == tiles and dp >= 0 and sk >= 0
        assert dp % ctas == 0, "data-parallel tiles must be whole waves of the grid"
        if d == "streamk":
            assert dp == 0
        total = sk * kt
        if sk:
            # every stream-k CTA gets >= 1 MAC iteration: CTA c owns [c*total//G, (c+1)*total//G)
            assert ctas <= total
            sizes = {(c + 1) * total // ctas - c * total // ctas for c in (0, ctas // 2, ctas - 1)}
            assert min(sizes) >= 1
        assert g["flags"] == ctas
        assert g["ws_bytes"] == ctas * cfg.bm * cfg.bn * 4   # one partial tile slot per CTA
    return g


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_SM90), st.sampled_from(SM90_KINDS), st.integers(1, 20000), st.integers(1, 20000),
       st.integers(1, 40000), st.integers(1, 16), st.sampled_from([1, 2, 3, 7, 66, 114, 132, 1000]),
       st.sampled_from([0, 0, 2, 3, 5, 64, 1000]))
def test_launch_geometry_invariants(cfg, kind, m, n, k, batch, sms, splits):
    cfg = replace(cfg, bk=128 // ELEM_BYTES[kind])
    if cfg.decomposition == "splitk_parallel":
        cfg = replace(cfg, splits=splits)
    p = prob(kind, LAYOUTS_OF[kind][0], m, n, k, batch=batch)
    ok, why = cfg.validate(p)
    assume(ok)
    assume(sms >= getattr(cfg, "cluster", 1))  # fewer SMs than a cluster: the next test
    _check_geometry(p, cfg, sms)


def test_cluster_grid_with_fewer_sms_than_a_cluster():
    """sm_count < cluster (e.g. ``run(..., sm_count=1)``): the launch must not get an empty grid."""
    empty = []
    for cfg in ALL_SM90:
        cl = getattr(cfg, "cluster", 1)
        if cl == 1:
            continue
        kind = "f16" if cfg.bk == 64 else "s8"
        try:
            g = launch_geometry(prob(kind, "TN", 1000, 1000, 1000), cfg, cl - 1)
        except ValueError:
            continue  # refusing is fine
        if g["grid"][0] < 1:
            empty.append(f"{cfg.name} on {cl - 1} SM(s): grid {g['grid']}")
    assert not empty, "empty persistent grid:\n" + "\n".join(empty)


@pytest.mark.parametrize("m,n,k,batch,sms", [(3072, 3072, 3072, 1, 132), (100, 100, 5000, 1, 7), (1, 1, 1, 1, 132),
                                            (1000, 1000, 1000, 1, 3), (129, 7, 31, 5, 3), (8192, 8192, 64, 1, 132),
                                            (4096, 1000, 8192, 3, 114), (257, 4100, 64, 2, 132)])
@pytest.mark.parametrize("cfg", ALL_SM90, ids=lambda c: c.name)
def test_launch_geometry_examples(cfg, m, n, k, batch, sms):
    kind = {64: "f16", 128: "s8", 32: "3xtf32" if cfg.bm <= 128 else "tf32"}[cfg.bk]
    _check_geometry(prob(kind, "TN", m, n, k, batch=batch), cfg, sms)


def test_splitk_workspace_is_whole_matrices_per_split():
    cfg = base("f16", 128, decomposition="splitk_parallel", splits=4)
    p = prob("f16", "NN", 300, 200, 64 * 40, batch=3)
    g = launch_geometry(p, cfg, 132)
    assert g["splits"] == 4 and g["kt_per_split"] == 10
    assert g["ws_bytes"] == 4 * 3 * 300 * 200 * 4
    # auto splits (0): at least 2, never an empty split, grid within the SMs
    g = launch_geometry(p, replace(cfg, splits=0), 132)
    assert g["splits"] >= 2 and g["ws_bytes"] == g["splits"] * 3 * 300 * 200 * 4
    assert g["grid"][0] <= 132


def test_hybrid_runs_whole_waves_data_parallel():
    cfg = base("f16", 128, decomposition="hybrid")
    sms = 10
    # 128 x 128 tiles over D = C^T: n/128 x m/128 = 5 x 7 = 35 tiles = 3 waves of 10 + 5
    p = prob("f16", "NN", 7 * 128, 5 * 128, 64 * 20)
    g = _check_geometry(p, cfg, sms)
    assert g["tiles"] == 35 and g["grid"][0] == sms
    assert g["dp_tiles"] == 20 and g["sk_tiles"] == 15     # last partial wave + one full wave
    g = _check_geometry(p, replace(cfg, decomposition="streamk"), sms)
    assert g["dp_tiles"] == 0 and g["sk_tiles"] == 35


# --- fp32 operands: the prep kernel's prepared problem ------------------------------------------

@pytest.mark.parametrize("kind", SM90_PREP_KINDS)
@pytest.mark.parametrize("lay", LAYOUTS)
def test_fp32_kinds_accept_any_layout_ld_and_alignment(kind, lay):
    """The prep kernel reads op(A)/op(B) with scalar loads: no TMA rule reaches the user's data."""
    cfg = SM90_CONFIGS_BY_TILE[kind][128]
    for extra in (dict(), dict(pad=1), dict(pad=3, a_off=4, b_off=8), dict(batch=3, pad=5),
                  dict(batch=4, stride_b=0)):
        p = prob(kind, lay, 77, 45, 130, **extra)
        assert cfg.validate(p) == (True, ""), (p, cfg.validate(p))


@pytest.mark.parametrize("kind,sections", [("tf32", 1), ("3xtf32", 2)])
@pytest.mark.parametrize("lay", LAYOUTS)
def test_prepared_problem_is_k_major_with_padded_sections(kind, sections, lay):
    p = prob(kind, lay, 100, 50, 70, pad=3, batch=2)
    q = prepared_problem(p)
    kpad = 96                                      # 70 rounded up to a 32-element stage
    # 3xTF32 rows hold [big | small] halves: K stays kpad, the leading dimension doubles
    assert (q.transa, q.transb, q.k, q.lda, q.ldb) == ("T", "N", kpad, sections * kpad, sections * kpad)
    pmap, qmap, _, _ = tma_maps(q, SM90_CONFIGS_BY_TILE[kind][128])
    assert pmap[0][0] == qmap[0][0] == sections * kpad     # the maps span both halves
    assert (q.m, q.n, q.ldc, q.stride_c, q.batch) == (p.m, p.n, p.ldc, p.stride_c, p.batch)
    assert (q.stride_a, q.stride_b) == (100 * sections * kpad, 50 * sections * kpad)
    assert sm90_prep_shape(p) == (sections, kpad, 2 * (100 + 50) * sections * kpad * 4)
    # a broadcast operand is prepared once
    b0 = replace(p, stride_b=0)
    assert prepared_problem(b0).stride_b == 0
    assert sm90_prep_shape(b0)[2] == (2 * 100 + 50) * sections * kpad * 4
    # the GEMM's geometry is the prepared problem's; the workspace adds the prepared operands
    cfg = SM90_CONFIGS_BY_TILE[kind][128]
    g = launch_geometry(p, cfg, 132)
    assert g["kt"] == kpad // 32 and g["prep_bytes"] == sm90_prep_shape(p)[2]
    assert g["ws_bytes"] == g["prep_bytes"]       # sliced: no partials, only the prepared operands


def test_fp32_prepared_workspace_is_bounded():
    cfg = SM90_CONFIGS_BY_TILE["3xtf32"][128]
    why = refused(cfg, prob("3xtf32", "NN", 40000, 40000, 20000))
    assert "GiB" in why, why
    assert cfg.validate(prob("3xtf32", "NN", 8192, 8192, 8192))[0]      # 1.5 GiB
