"""CPU tests of the GEMV kernel's host side and index arithmetic (no GPU, no NVRTC).

* every BLAS layout maps onto the canonical W / X / out strides (checked by reading the
  operands back through them);
* :func:`~pyblasgemm.kernels.gemv.gemv_applies` and :func:`~pyblasgemm.kernels.gemv.plan`:
  reasons, the load classes, the one-wave grid, workspace and shared-memory bounds;
* the NumPy emulator of the kernel (tests/gemv_emulator.py) computes exact integer products
  on every mainloop, token-group count, load class, odd sizes and tails, with every unit
  covered once, every entry of C stored once, and every workspace slot written once.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from pyblasgemm._types import TYPE_ROWS
from pyblasgemm.desc import describe
from pyblasgemm.kernels import gemv

import gemv_emulator


def _desc(prefix, ta, tb, m, n, k, pad=0, compute=None, batch=1, align=16):
    row = TYPE_ROWS[prefix]
    compute = compute or row.computes[0]
    lda = (k if ta == "T" else m) + pad
    ldb = (n if tb == "T" else k) + pad
    return describe("test", row, compute, ta, tb, m, n, k, lda, ldb, m + pad, batch, 0, 0, 0, "cupy", 0,
                    (align,), 1.0, 0.0)


# ---- the canonical form --------------------------------------------------------------------------

def _stored(rows, cols, ld, rng):
    """A column-major rows x cols matrix with leading dimension ld, as its flat buffer."""
    buf = rng.integers(-9, 10, size=ld * cols)
    return buf


def _read(buf, ld, rows, cols):
    return np.array([[buf[i + j * ld] for j in range(cols)] for i in range(rows)])


@pytest.mark.parametrize("ta,tb", list(itertools.product("NT", "NT")))
@pytest.mark.parametrize("m,n", [(40, 3), (3, 40), (5, 5), (64, 64), (65, 2), (2, 65)])
def test_canonical_strides_read_the_operands(ta, tb, m, n):
    k, pad = 7, 2
    rng = np.random.default_rng(m * 100 + n)
    d = _desc("h", ta, tb, m, n, k, pad=pad)
    ra, ca = (k, m) if ta == "T" else (m, k)
    rb, cb = (n, k) if tb == "T" else (k, n)
    a, b = _stored(ra, ca, d.lda, rng), _stored(rb, cb, d.ldb, rng)
    opa = _read(a, d.lda, ra, ca)
    opa = opa.T if ta == "T" else opa
    opb = _read(b, d.ldb, rb, cb)
    opb = opb.T if tb == "T" else opb
    cn = gemv.canonical(d)
    wbuf, xbuf = (a, b) if cn.orient == "n" else (b, a)
    W = np.array([[wbuf[r * cn.w_rs + p * cn.w_ks] for p in range(k)] for r in range(cn.R)])
    X = np.array([[xbuf[t * cn.x_ts + p * cn.x_ks] for p in range(k)] for t in range(cn.T)])
    prod = W @ X.T                                   # out[r, t]
    c_index = {(r, t): r * cn.c_rs + t * cn.c_ts for r in range(cn.R) for t in range(cn.T)}
    want = opa @ opb                                 # C, m x n column-major: C[i, j] at i + j ldc
    for (r, t), at in c_index.items():
        i, j = at % d.ldc, at // d.ldc
        assert prod[r, t] == want[i, j]
    assert cn.T == min(m, n) if min(m, n) <= gemv.MAX_TOKENS else True
    assert cn.T <= gemv.MAX_TOKENS


def test_linear_layer_is_n_oriented_and_k_contiguous():
    # x @ W.T as torch.nn.Linear holds W: transa='T', transb='N', m = out features, n = tokens
    cn = gemv.canonical(_desc("b", "T", "N", 4096, 16, 4096))
    assert (cn.orient, cn.R, cn.T, cn.w_ks, cn.x_ks, cn.c_rs) == ("n", 4096, 16, 1, 1, 1)
    # x @ W with W (in, out) row-major (a JAX Dense kernel): the weight is R-contiguous
    cn = gemv.canonical(_desc("b", "N", "N", 4096, 16, 4096))
    assert (cn.w_rs, cn.w_ks) == (1, 4096)


# ---- which problems, and the plan ----------------------------------------------------------------

@pytest.mark.parametrize("prefix,compute,ok", [
    ("h", "fp32", True), ("b", "fp32", True), ("sh", "fp32", True), ("sb", "fp32", True), ("i", "int32", True),
    ("s", "fp32", True), ("s", "tf32", True), ("s", "3xtf32", True), ("h", "fp16", False), ("d", "fp64", False),
    ("c", "fp32", False), ("z", "fp64", False)])
def test_applies_by_route(prefix, compute, ok):
    got, why = gemv.gemv_applies(_desc(prefix, "T", "N", 128, 4, 64, compute=compute))
    assert got == ok and (ok or "no GEMV kernel" in why)


def test_applies_reasons():
    assert gemv.gemv_applies(_desc("h", "T", "N", 128, 65, 64))[1].startswith("C is 128 x 65")
    assert gemv.gemv_applies(_desc("h", "T", "N", 65, 128, 64))[1].startswith("C is 65 x 128")
    assert gemv.gemv_applies(_desc("h", "T", "N", 128, 64, 64)) == (True, "")
    assert "batch=3" in gemv.gemv_applies(_desc("h", "T", "N", 128, 4, 64, batch=3))[1]
    assert "32-bit indices" in gemv.gemv_applies(_desc("h", "T", "N", 2**31 - 1, 4, 64))[1]
    assert gemv.gemv_applies(_desc("h", "T", "N", gemv.MAX_EXTENT, 4, 64))[0]
    with pytest.raises(ValueError, match="needs m or n <= 64"):
        gemv.plan(_desc("h", "T", "N", 128, 65, 64), 132)
    with pytest.raises(ValueError, match="sm_count"):
        gemv.plan(_desc("h", "T", "N", 128, 4, 64), 0)


@pytest.mark.parametrize("prefix", ["h", "b", "sh", "sb", "i", "s"])
@pytest.mark.parametrize("ta,tb", list(itertools.product("NT", "NT")))
@pytest.mark.parametrize("t", [1, 2, 7, 16, 33, 64])
def test_plan_bounds(prefix, ta, tb, t):
    for R, K in ((1, 1), (257, 1000), (4096, 4096 + 3), (14336, 4096)):
        d = _desc(prefix, ta, tb, R, t, K) if t <= R else _desc(prefix, ta, tb, t, R, K)
        for sms, occ in ((132, None), (7, 3)):
            s = gemv.plan(d, sms, occ)
            units = s.row_tiles * s.csteps
            assert 1 <= s.ctas <= min(units, sms * s.occupancy)
            assert s.smem <= 48 * 1024                     # no opt-in needed
            assert s.threads <= (256 if s.split == "stream_k" else 32 * gemv.MAX_ROWS_WARPS) and s.threads % 32 == 0
            assert s.T <= 8 * s.token_groups and s.cta_rows * s.row_tiles >= s.R
            assert s.slots in (0, s.row_tiles + s.ctas)
            if s.ctas > s.row_tiles:
                assert s.slots > 0                         # some tile has two contributors
            name = s.kernel_name
            assert any(name == inst[4] for inst in gemv.all_instantiations())


def test_load_classes():
    # 16-byte aligned, K % 8 == 0: both operands vectorized
    s = gemv.plan(_desc("h", "T", "N", 4096, 1, 4096), 132)
    assert s.loads == gemv.W_VEC | gemv.X_VEC and s.w_align == 16 and s.x_align == 16
    # K % 8 != 0 (rows of 4099 halves): element loads for both
    s = gemv.plan(_desc("h", "T", "N", 4096, 1, 4099), 132)
    assert s.loads == 0 and s.w_align == s.x_align == 2
    # padded to 4104: aligned rows, but vectors would straddle K: still element loads
    s = gemv.plan(_desc("h", "T", "N", 4096, 1, 4099, pad=5), 132)
    assert s.loads == 0
    # X strided (transb='T': tokens contiguous): the weight alone
    s = gemv.plan(_desc("h", "T", "T", 4096, 4, 4096), 132)
    assert s.loads == gemv.W_VEC
    # pointers only 8-byte aligned
    s = gemv.plan(_desc("h", "T", "N", 4096, 4, 4096, align=8), 132)
    assert s.loads == 0
    # R-contiguous weight: R % RPT == 0 needed for its vectors
    s = gemv.plan(_desc("b", "N", "N", 4096, 1, 4096), 132)
    assert s.path == "mma_r" and s.loads & gemv.W_VEC
    assert not gemv.plan(_desc("b", "N", "N", 4095, 1, 4096), 132).loads & gemv.W_VEC


def test_instantiation_list_covers_every_kind_path_and_class():
    insts = gemv.all_instantiations()
    # 6 kinds x 2 weight layouts x 4 token groups x 4 load classes, then the row-block split: 5
    # kinds on the mma_k mainloop x its token groups
    assert len(insts) == len({i[4] for i in insts}) == 6 * 2 * 4 * 4 + 5 * len(gemv.ROWS_TILES)
    assert {(i[0], i[1]) for i in insts if i[1] != "mma_k/rows"} == {
        ("f16", "mma_k"), ("f16", "mma_r"), ("bf16", "mma_k"), ("bf16", "mma_r"), ("f16_out32", "mma_k"),
        ("f16_out32", "mma_r"), ("bf16_out32", "mma_k"), ("bf16_out32", "mma_r"), ("s8", "mma_k"), ("s8", "fma_r"),
        ("f32", "fma_k"), ("f32", "fma_r")}


# ---- the emulated kernel -------------------------------------------------------------------------

def _check(spec, rng, alpha=1.0, beta=0.0):
    w = rng.integers(-4, 5, size=(spec.R, spec.K))
    x = rng.integers(-4, 5, size=(spec.T, spec.K))
    c0 = rng.integers(-4, 5, size=(spec.R, spec.T))
    e = (gemv_emulator.run_rows if spec.split == "rows" else gemv_emulator.run)(spec, w, x, alpha, beta, c0)
    want = alpha * (w @ x.T) + beta * c0
    assert np.array_equal(e.c, want), (spec.path, spec.R, spec.T, spec.K)
    assert e.coverage.min() == e.coverage.max() == 1, "every warp step of every row block once"
    assert e.stored.min() == e.stored.max() == 1, "every entry of C stored once"
    assert len(e.slots_used) == len(set(e.slots_used))


PATH_CASES = [("h", "T", "mma_k"), ("i", "T", "mma_k"), ("b", "N", "mma_r"), ("s", "T", "fma_k"),
              ("s", "N", "fma_r"), ("i", "N", "fma_r")]


@pytest.mark.parametrize("prefix,ta,path", PATH_CASES, ids=[p for *_, p in PATH_CASES])
@pytest.mark.parametrize("t", [1, 9, 33])
def test_emulated_kernel_is_exact(prefix, ta, path, t):
    """Every mainloop, three token-group counts, odd R and K (tails), vector and element loads,
    a grid that splits row tiles between CTAs and one that does not."""
    rng = np.random.default_rng(t)
    for R, K, sms, align, tb in ((37, 77, 3, 16, "N"), (48, 64, 1, 16, "N"), (40, 130, 5, 2, "T")):
        d = _desc(prefix, ta, tb, R, t, K, align=align)
        spec = gemv.plan(d, sms, 1)
        assert spec.path == path
        _check(spec, rng, *((2, -1) if prefix == "i" else (0.5, -1.5)))


def test_emulated_kernel_t64_and_vector_tails():
    rng = np.random.default_rng(64)
    for prefix, ta in (("h", "T"), ("b", "N"), ("s", "T"), ("s", "N")):
        spec = gemv.plan(_desc(prefix, ta, "N", 72, 64, 40), 2, 1)
        assert spec.token_groups == 8
        _check(spec, rng)
    # R-contiguous vectors past R read the last rows instead (R % RPT == 0 with a partial tile)
    spec = gemv.plan(_desc("b", "N", "N", 72, 3, 33), 4, 1)
    assert spec.loads & gemv.W_VEC and spec.R % spec.p1 == 0 and spec.R % spec.cta_rows
    _check(spec, rng)


def test_mma_fragments_are_a_bijection():
    for per in (2, 4):
        for pos in (gemv_emulator._a_positions, gemv_emulator._b_positions):
            seen = [p for lane in range(32) for reg in pos(per, lane >> 2, lane & 3) for p in reg]
            assert len(seen) == len(set(seen)) == (16 * 8 * per if pos is gemv_emulator._a_positions else 8 * 8 * per)


def test_one_contributor_stores_directly():
    # a grid of one CTA per row tile, no split: no workspace
    d = _desc("h", "T", "N", 64, 1, 64)
    spec = gemv.plan(d, 1, 1, split="stream_k")
    assert spec.slots == 0 and spec.workspace_bytes == 4 * spec.row_tiles
    e = gemv_emulator.run(spec, np.ones((64, 64)), np.ones((1, 64)))
    assert e.slots_used == [] and np.all(e.c == 64)


# ---- the benchmark's host side ---------------------------------------------------------------------

def test_bench_measures_the_linear_layer_and_knows_the_peaks():
    import importlib.util
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gemv_bench", root / "bench" / "gemv_bench.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(root / "bench"))
    # y = x @ W.T, W (n x k) as nn.Linear holds it: the weight K-contiguous, tokens as T
    cn = gemv.canonical(bench._desc(16, 14336, 4096, "bfloat16", (16,)))
    assert (cn.orient, cn.R, cn.T, cn.K, cn.w_ks, cn.w_rs, cn.x_ks, cn.c_ts) == ("n", 14336, 16, 4096, 1, 4096, 1, 14336)
    assert bench.peak_bw("NVIDIA H100 80GB HBM3") == 3.35e12 and bench.peak_bw("NVIDIA H200") == 4.8e12
    assert bench.peak_bw("NVIDIA H100 PCIe") == 2.0e12 and bench.peak_bw("Tesla T4") is None
    rows = [{"m": 1, "ratio_steady": 1.2, "ratio_single": 1.1, "ours": {"pct_peak": 80.0}},
            {"m": 1, "ratio_steady": 0.8, "ratio_single": 0.9, "ours": {"pct_peak": 70.0}},
            {"m": 16, "failure": "x"}]
    s = bench.summarize(rows)
    assert s["failures"] == 1 and abs(s["m1"]["geomean_ratio_steady"] - (1.2 * 0.8) ** 0.5) < 1e-12
    assert (s["m1"]["min_pct_peak"], s["m1"]["max_pct_peak"]) == (70.0, 80.0) and "m16" not in s


def test_launch_packs_the_kernel_arguments(monkeypatch):
    """The bound launch's host path without a GPU: the argument cells the kernel receives
    (weight and activations swapped where T = m), the scales written once, the alignment class
    enforced, the grid of the plan."""
    import ctypes
    import types

    from pyblasgemm.kernels.mma_sync import _ArgPack

    launched = []
    monkeypatch.setattr(gemv, "function", lambda ptr: ("fn", ptr))
    monkeypatch.setattr(gemv, "cu_stream", lambda h: ("stream", h))
    monkeypatch.setattr(gemv, "launch_kernel", lambda *a: launched.append(a))

    def fake_slot(self, sptr):
        pack = _ArgPack(self._fields, dict(self._base, ws=0xA000, counters=0xB000))
        slot = (types.SimpleNamespace(nbytes=64), types.SimpleNamespace(nbytes=4), pack,
                [(float("nan"), float("nan"))], ("stream", sptr))
        self._slots[sptr] = slot
        return slot

    monkeypatch.setattr(gemv.GemvLaunch, "_slot", fake_slot)
    kern = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=77))
    # T = m: W is B (weight rows = n), X is A
    d = _desc("s", "N", "N", 3, 500, 64)
    spec = gemv.plan(d, 4, 1)
    launch = gemv.GemvLaunch(spec, kern, 0)
    launch(0x1000, 0x2000, 0x3000, 0.5, -1.0, 7)
    launch(0x1100, 0x2100, 0x3100, 0.5, -1.0, 7)
    assert len(launched) == 2
    dev, fn, gx, gy, gz, bx, by, bz, smem, stream, params = launched[-1]
    assert (fn, gx, bx, smem, stream) == (("fn", 77), spec.ctas, spec.threads, spec.smem, ("stream", 7))
    cells = launch._slots[7][2].cells
    assert (cells["w"].value, cells["x"].value, cells["c"].value) == (0x2100, 0x1100, 0x3100)
    assert (cells["alpha"].value, cells["beta"].value) == (0.5, -1.0)
    assert (cells["R"].value, cells["T"].value, cells["K"].value) == (500, 3, 64)
    assert (cells["w_rs"].value, cells["w_ks"].value, cells["c_rs"].value, cells["c_ts"].value) == (64, 1, 3, 1)
    argv = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_uint64.from_address(argv[0]).value == 0x2100          # the kernel's first argument: W
    assert launch.workspace_nbytes == 68
    with pytest.raises(ValueError, match="alignment class"):
        launch(0x1002, 0x2000, 0x3000, 1.0, 0.0, 7)                        # X (A) off 16 bytes
    # int8: integer scales only
    spec8 = gemv.plan(_desc("i", "T", "N", 256, 2, 64), 4, 1)
    launch8 = gemv.GemvLaunch(spec8, kern, 0)
    with pytest.raises(ValueError, match="integer"):
        launch8(0x1000, 0x2000, 0x3000, 1.5, 0, 0)
    launch8(0x1000, 0x2000, 0x3000, 2, -1, 0)
    assert (launch8._slots[0][2].cells["ialpha"].value, launch8._slots[0][2].cells["ibeta"].value) == (2, -1)


def test_ring_pipe_and_shared_memory():
    """PIPE reaches the kernel only for the mma_k mainloop with both operands vectorized, and a
    cp.async ring's shared memory (the header's STAGES x NVEC x 512 bytes per warp) is planned
    beside the parking area."""
    d = describe("t", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 1, 4096, 4096, 4096, 4096, 1, 0, 0, 0,
                 "cupy", 0, (16,), 1.0, 0.0)
    s = gemv.plan(d, 132, split="stream_k")
    assert s.path == "mma_k" and s.loads == 3 and s.pipe == gemv.PIPES["mma_k"][1]
    assert gemv.plan(d, 132).pipe == gemv.ROWS_TILES[1][2]            # the row-block split's own ring
    assert s.kernel_name.endswith(f", {s.pipe}>")
    for pipe, ring in ((0, 0), (2 | gemv.X_PRE, 0), (gemv.ASYNC | 4, 4 * (2 * 2 + 1) * 512),
                       (gemv.ASYNC, 0)):
        t = gemv.plan(d, 132, tiles=(2, 1, 1, 4, pipe))
        assert t.pipe == pipe and t.smem == 4 * 128 * 8 + 4 * ring, (pipe, t.smem)
    # T = 16: two token groups' activation vectors per slot
    d16 = describe("t", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 16, 4096, 4096, 4096, 4096, 1, 0, 0, 0,
                   "cupy", 0, (16,), 1.0, 0.0)
    t = gemv.plan(d16, 132, tiles=(2, 1, 2, 2, gemv.ASYNC | 3))
    assert t.smem == 4 * 128 * 16 + 4 * 3 * (4 + 2) * 512
    # element loads (an odd K): no ring parameter, the header's defaults
    odd = describe("t", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 1, 4095, 4095, 4095, 4096, 1, 0, 0, 0,
                   "cupy", 0, (16,), 1.0, 0.0)
    assert gemv.plan(odd, 132).pipe == 0 and gemv.plan(odd, 132, tiles=(2, 1, 1, 4, gemv.ASYNC | 4)).pipe == 0
    # other mainloops never take one
    assert gemv.pipe_of("mma_r", 1, 3) == gemv.pipe_of("fma_k", 1, 3) == 0


# ---- the row-block split -------------------------------------------------------------------------

def test_rows_split_sizes_one_wave_of_whole_blocks():
    """Decode layers (x @ W.T, 16-byte vectors, T <= 16) take the row-block split by default: every
    block on its own resident CTA, the warps per CTA as many as that allows (<= the block's steps,
    <= 16), no workspace; T > 16, tiles given, or element loads keep the stream-k split, and
    asking for 'rows' where it cannot run is an error naming the reason."""
    layers = [(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096), (3584, 4608), (3584, 18944), (18944, 3584)]
    for k, n in layers:
        for t in (1, 7, 16):
            for sms, warps in ((132, 16), (132, 20), (78, 16)):
                s = gemv.plan(_desc("b", "T", "N", n, t, k), sms, split=None, resident_warps=warps)
                assert s.split == "rows" and s.path == "mma_k" and s.loads == 3 and s.wr == 1
                assert s.workspace_bytes == 0 and s.slots == 0
                assert s.row_tiles == -(-n // 16) and s.ctas == min(s.row_tiles, sms * s.occupancy)
                assert s.occupancy == warps // s.wk and 1 <= s.wk <= gemv.MAX_ROWS_WARPS
                wsteps = -(-k // gemv._geometry("mma_k", s.p1, s.p2, s.token_groups, 2)[1])
                if s.wk < min(gemv.MAX_ROWS_WARPS, wsteps, warps):
                    # one more warp per CTA would leave a block without a resident CTA
                    assert s.row_tiles > sms * (warps // (s.wk + 1))
                if s.row_tiles <= sms * warps:
                    assert s.ctas == s.row_tiles                    # one wave, no grid-stride
                assert s.smem == s.wk * 4 * s.token_groups * 128
                assert any(s.kernel_name == i[4] for i in gemv.all_instantiations())
    # llama3-8b o at T = 1: 256 blocks, 8 warps of 16 steps each (16 warps per SM), two CTAs per SM
    s = gemv.plan(_desc("b", "T", "N", 4096, 1, 4096), 132, resident_warps=16)
    assert (s.row_tiles, s.wk, s.ctas, s.csteps) == (256, 8, 256, 16)
    # the default residency is the instantiation's (ROWS_RESIDENT_WARPS): 24 warps -> 12 per CTA
    assert gemv.plan(_desc("b", "T", "N", 4096, 1, 4096), 132).wk == 12
    assert gemv.plan(_desc("b", "T", "N", 4096, 33, 4096), 132).split == "stream_k"
    assert gemv.plan(_desc("b", "T", "N", 4096, 1, 4099), 132).split == "stream_k"     # element loads
    assert gemv.plan(_desc("b", "T", "N", 4096, 1, 4096), 132, tiles=(1, 2, 1, 4, 10)).split == "stream_k"
    with pytest.raises(ValueError, match="split='rows' needs the mma_k mainloop"):
        gemv.plan(_desc("b", "T", "N", 4096, 33, 4096), 132, split="rows")
    with pytest.raises(ValueError, match="split='diagonal'"):
        gemv.plan(_desc("b", "T", "N", 4096, 1, 4096), 132, split="diagonal")
    with pytest.raises(ValueError, match="resident_warps=0"):
        gemv.plan(_desc("b", "T", "N", 4096, 1, 4096), 132, split="rows", resident_warps=0)


@pytest.mark.parametrize("prefix", ["h", "b", "i", "sb"])
@pytest.mark.parametrize("t", [1, 7, 9, 16])
def test_emulated_rows_split_is_exact(prefix, t):
    """The row-block split emulated: odd R (a partial last block), K tails past the last whole
    step, more warps than steps, one CTA for several blocks (grid-stride), alpha / beta; the
    stream-k split of the same problems alike."""
    rng = np.random.default_rng(100 + t)
    unit = 16 if prefix == "i" else 8
    for R, K, sms, warps in ((37, 10 * unit, 3, 4), (33, 3 * unit, 1, 2), (16, 130 * unit, 1, 16), (70, unit, 2, 1),
                             (16, 3 * unit, 1, 16)):
        d = _desc(prefix, "T", "N", R, t, K)
        rows = gemv.plan(d, sms, split="rows", resident_warps=warps)
        assert rows.split == "rows"
        kstep = gemv._geometry("mma_k", rows.p1, rows.p2, rows.token_groups, rows.kind.elem_bytes)[1]
        assert rows.wk <= -(-K // kstep)                                       # never more warps than steps
        _check(rows, rng, *((2, -1) if prefix == "i" else (0.5, -1.5)))
        _check(gemv.plan(d, sms, 1, split="stream_k"), rng)
    # grid-stride: 3 blocks on one CTA slot
    d = _desc(prefix, "T", "N", 40, t, 4 * unit)
    s = gemv.plan(d, 1, split="rows", resident_warps=1)
    assert (s.ctas, s.row_tiles, s.wk) == (1, 3, 1)
    e = gemv_emulator.run_rows(s, np.ones((40, 4 * unit)), np.ones((t, 4 * unit)))
    assert e.contributors == {0: [0], 1: [0], 2: [0]} and np.all(e.c == 4 * unit)


def test_one_token_with_a_unit_leading_dimension_takes_vectors():
    """matmul's view of a 1 x K activation row: column-major NN, m = 1, lda = 1 (the token stride
    is 1, never used). Both operands still take 16-byte vectors, the row-block split runs it, and
    the emulation is exact; with two tokens the same stride forbids vectors."""
    d = describe("t", TYPE_ROWS["h"], "fp32", "N", "N", 1, 700, 4096, 1, 4096, 1, 1, 0, 0, 0,
                 "cupy", 0, (256,), 1.0, 0.0)
    s = gemv.plan(d, 132)
    assert (s.orient, s.T, s.R, s.canonical.x_ts, s.canonical.x_ks) == ("m", 1, 700, 1, 1)
    assert s.loads == gemv.W_VEC | gemv.X_VEC and s.split == "rows"
    _check(s, np.random.default_rng(1))
    d2 = describe("t", TYPE_ROWS["h"], "fp32", "N", "N", 2, 700, 4096, 2, 4096, 2, 1, 0, 0, 0,
                  "cupy", 0, (256,), 1.0, 0.0)
    assert not gemv.plan(d2, 132).loads & gemv.X_VEC
