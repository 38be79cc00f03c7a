"""GPU tests of the GEMV kernel (:mod:`pyblasgemm.kernels.gemv`) against a float64 (int64) oracle.

Every A/B layout pair in both orientations (the token side as n, as ``x @ W.T``, or as m), so
both weight layouts and every mainloop; tokens 1, 2, 7, 16, 24, 33, 64 (every token-group
count); weight rows and K from {1, 7, 33, 257, 1000, 4096, 4099}; float16, bfloat16 (16-bit and
float32 C), float32, int8 -> int32; padded leading dimensions (odd ones take the element-load
path), pointers off their 16-byte alignment; alpha/beta with beta = 0 over a NaN-filled C;
everything of C's buffer outside the m x n matrix poisoned and checked untouched; a grid of few
SMs beside the device's (row tiles shared between CTAs: the in-kernel reduction), every result
checked bitwise equal on a second call. About 40 s on an H100 (compiling ~100 instantiations in
parallel first).

    python -m pytest -q -m gpu tests/test_gemv_gpu.py
"""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu        # (conftest skips the marker without a device)

from pyblasgemm._types import TYPE_ROWS  # noqa: E402
from pyblasgemm.desc import describe  # noqa: E402
from pyblasgemm.kernels import gemv  # noqa: E402

from _ref import C_DTYPES, DTYPES, check_close, expected, random_array  # noqa: E402

LAYOUTS = ["NN", "NT", "TN", "TT"]
TOKENS = [1, 2, 7, 16, 24, 33, 64]
#: (weight rows, K): odd, prime-ish and tile +- 1 sizes; the 4096² one in one case of nine
SIZES = [(1, 1), (7, 33), (33, 7), (257, 257), (1000, 4099), (4099, 1000), (257, 1000), (1000, 257), (4096, 4096)]
#: (prefix, compute): every GEMV kind
ROUTES = [("h", "fp32"), ("b", "fp32"), ("s", "fp32"), ("i", "int32"), ("sh", "fp32"), ("sb", "fp32")]
#: the bytes C's buffer starts as (outside the m x n matrix they must survive every call)
POISON_WORD = 0x7FC0DEAD


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


class Problem:
    """A BLAS problem on stored column-major buffers (raw bytes on the device), C's buffer
    poisoned outside the m x n matrix, and its float64 reference."""

    def __init__(self, prefix, compute, ta, tb, m, n, k, pad, alpha, beta, rng, offset=0):
        self.prefix, self.compute, self.ta, self.tb, self.m, self.n, self.k = prefix, compute, ta, tb, m, n, k
        self.alpha, self.beta = alpha, beta
        dt, cdt = np.dtype(DTYPES[prefix]), np.dtype(C_DTYPES[prefix])
        ra, ca = (k, m) if ta == "T" else (m, k)
        rb, cb = (n, k) if tb == "T" else (k, n)
        self.lda, self.ldb, self.ldc = ra + pad, rb + pad, m + pad
        self.a = random_array(rng, prefix, self.lda * ca + offset)
        self.b = random_array(rng, prefix, self.ldb * cb)
        words = np.full(self.ldc * n * cdt.itemsize // 4 + 1, POISON_WORD, np.uint32)
        c_full = np.frombuffer(words.tobytes(), dtype=cdt)[: self.ldc * n].copy()
        self.c0 = random_array(rng, prefix, (m, n), c=True)
        cview = c_full.reshape(n, self.ldc).T           # column-major m x n inside
        if beta == 0 and prefix != "i":
            cview[:m, :] = np.nan                      # beta == 0: C must not be read
        else:
            cview[:m, :] = self.c0
        self.c_start = c_full.copy()
        self.opa = self._matrix(self.a[offset:], self.lda, ra, ca)
        self.opa = self.opa.T if ta == "T" else self.opa
        self.opb = self._matrix(self.b, self.ldb, rb, cb)
        self.opb = self.opb.T if tb == "T" else self.opb
        self.a_d = cp.asarray(self.a.view(np.uint8))
        self.b_d = cp.asarray(self.b.view(np.uint8))
        self.c_d = cp.asarray(c_full.view(np.uint8))
        self.pa = self.a_d.data.ptr + offset * dt.itemsize
        self.pb, self.pc = self.b_d.data.ptr, self.c_d.data.ptr
        self.cdt = cdt
        self.desc = describe("test", TYPE_ROWS[prefix], compute, ta, tb, m, n, k, self.lda, self.ldb, self.ldc,
                             1, 0, 0, 0, "cupy", cp.cuda.Device().id, (self.pa, self.pb, self.pc), alpha, beta)

    @staticmethod
    def _matrix(buf, ld, rows, cols):
        """The column-major rows x cols matrix in ``buf`` (a view: no copy of a 4096² operand)."""
        return np.lib.stride_tricks.as_strided(buf, (rows, cols), (buf.itemsize, ld * buf.itemsize), writeable=False)

    def reset(self):
        self.c_d[...] = cp.asarray(self.c_start.view(np.uint8))

    def result(self) -> np.ndarray:
        return self.c_d.get().view(self.cdt)

    def check(self, got: np.ndarray, what: str) -> None:
        full = got.reshape(self.n, self.ldc).T
        outside = np.ones_like(full, dtype=bool)
        outside[: self.m, :] = False
        start = self.c_start.reshape(self.n, self.ldc).T
        assert np.array_equal(_bits(full)[outside], _bits(start)[outside]), f"{what}: C written outside the m x n matrix"
        ref, scale = expected(self.alpha, self.opa, self.opb, self.beta, self.c0)
        check_close(full[: self.m, :], ref, scale, self.prefix, self.compute, what)

    def run_checked(self, launch, what: str) -> None:
        """``launch`` on this problem: checked against the reference and C's poison, then run
        again on C's starting bytes and compared bit for bit."""
        launch(self.pa, self.pb, self.pc, self.alpha, self.beta)
        first = self.result()
        self.check(first, what)
        self.reset()
        launch(self.pa, self.pb, self.pc, self.alpha, self.beta)
        assert np.array_equal(first.view(np.uint8), self.result().view(np.uint8)), f"{what}: not bitwise repeatable"


def _scales(prefix, i):
    if prefix == "i":
        return ((1, 0), (2, -1))[i % 2]
    return ((1.0, 0.0), (0.5, -1.5))[i % 2]


def _cases():
    """The matrix: each route x layout pair x orientation x token count, the size list
    rotating (every route meets every size on both weight layouts), pads 0 / 3 / one vector's
    worth rotating, every fifth case's A pointer one element off its alignment, alpha/beta
    alternating. The float32-C kinds (the 16-bit mainloops with another store) take every
    second token count."""
    out, i = [], 0
    for (prefix, compute), lay, orient in itertools.product(ROUTES, LAYOUTS, ("n", "m")):
        tokens = TOKENS if prefix not in ("sh", "sb") else TOKENS[::2]
        for t in tokens:
            R, K = SIZES[i % len(SIZES)]
            pad = (0, 3, 16 // np.dtype(DTYPES[prefix]).itemsize)[i % 3]
            m, n = (R, t) if orient == "n" else (t, R)
            out.append((prefix, compute, lay, m, n, K, pad, _scales(prefix, i), i % 5 == 4))
            i += 1
    return out


CASES = _cases()


def _desc(c):
    """The case's description without arrays (its pointers' alignment class only)."""
    prefix, compute, lay, m, n, k, pad, _, offset = c
    row = TYPE_ROWS[prefix]
    ra = k if lay[0] == "T" else m
    rb = n if lay[1] == "T" else k
    isz = np.dtype(DTYPES[prefix]).itemsize
    return describe("test", row, compute, lay[0], lay[1], m, n, k, ra + pad, rb + pad, m + pad, 1, 0, 0, 0,
                    "cupy", 0, (isz if offset else 16,), 1.0, 0.0)


@pytest.fixture(scope="module")
def _warm():
    """Compile every instantiation CASES uses, in parallel threads, first."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    gemv.warm({gemv.plan(_desc(c), sms).kernel_name for c in CASES})


@pytest.mark.parametrize("prefix,compute", ROUTES, ids=[f"{p}-{c}" for p, c in ROUTES])
def test_every_layout_token_count_and_size(prefix, compute, _warm):
    rng = np.random.default_rng(zlib.crc32(f"{prefix} {compute}".encode()))
    mine = [c for c in CASES if c[0] == prefix]
    for n_case, (_, _, lay, m, n, k, pad, (alpha, beta), offset) in enumerate(mine):
        p = Problem(prefix, compute, lay[0], lay[1], m, n, k, pad, alpha, beta, rng, offset=int(offset))
        ok, why = gemv.gemv_applies(p.desc)
        assert ok, why
        # every other case on a 3-SM grid: row tiles shared by CTAs, the in-kernel reduction
        launch = gemv.bind(p.desc, sm_count=3 if n_case % 2 else None)
        what = f"{prefix}/{compute} {lay} m={m} n={n} k={k} pad={pad} off={offset} {launch.spec.path}"
        p.run_checked(launch, what)


def test_run_entry_point_and_streams():
    """``gemv.run`` on the current stream and on another, the launch reused with new pointers."""
    rng = np.random.default_rng(7)
    p = Problem("b", "fp32", "T", "N", 4096, 4, 4096, 0, 1.0, 0.0, rng)
    launch = gemv.run(p.desc, p.pa, p.pb, p.pc)
    cp.cuda.get_current_stream().synchronize()
    p.check(p.result(), "run")
    q = Problem("b", "fp32", "T", "N", 4096, 4, 4096, 0, 1.0, 0.0, rng)
    s = cp.cuda.Stream()
    assert gemv.bind(q.desc) is launch                     # same problem class: the cached launch
    launch(q.pa, q.pb, q.pc, 1.0, 0.0, s)
    s.synchronize()
    q.check(q.result(), "run on a second stream")
    assert launch.workspace_nbytes > 0
    with pytest.raises(ValueError, match="alignment class"):
        launch(q.pa + 2, q.pb, q.pc, 1.0, 0.0)


def test_large_k_split_is_exact_for_int8():
    """int8 at K = 65536: every partial and the cross-CTA sum exact (int32), bitwise repeatable."""
    rng = np.random.default_rng(3)
    p = Problem("i", "int32", "T", "N", 512, 3, 65536, 0, 1, 0, rng)
    launch = gemv.bind(p.desc, split="stream_k")
    assert launch.spec.slots > 0
    launch(p.pa, p.pb, p.pc, 1, 0)
    p.check(p.result(), "int8 K=65536")
    # the row-block split of the same problem: 32 blocks, 16 warps each, sums in warp order
    p.reset()
    rows = gemv.bind(p.desc, split="rows")
    assert rows.spec.split == "rows" and rows.spec.wk == 16
    rows(p.pa, p.pb, p.pc, 1, 0)
    p.check(p.result(), "int8 K=65536, row blocks")


def _sweep_variants():
    """bench/gemv_sweep.py's VARIANTS ({token groups: [(name, tiles, CTAs per SM)]}): every ring
    the sweep may pick is checked here first."""
    import importlib.util
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gemv_sweep", root / "bench" / "gemv_sweep.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(root / "bench"))
    return mod.VARIANTS


#: (weight rows, K) with K a multiple of every kind's vector (so the weight takes aligned vector
#: loads and the ring runs): odd rows, K tails past the last whole step (1000 % 32 = 8 for 16-bit,
#: 1008 % 64 = 48 for int8), one row, and a 4096-row layer slice
RING_SIZES = {"b": [(1, 64), (33, 1000), (257, 4104), (4096, 1000)], "h": [(1000, 1000), (7, 256)],
              "i": [(257, 1008), (33, 4112)]}


def _ring_cases():
    out = []
    for g, variants in _sweep_variants().items():
        for name, tiles, occ in variants:
            for prefix, sizes in RING_SIZES.items():
                for i, (R, K) in enumerate(sizes):
                    for t in ((1, 3, 8) if g == 1 else (9, 16)):
                        out.append((g, name, tiles, occ, prefix, R, K, t, i % 2 == 1))
    return out


RING_CASES = _ring_cases()


@pytest.mark.parametrize("g,name", sorted({(c[0], c[1]) for c in RING_CASES}),
                         ids=[f"tg{g}-{n}" for g, n in sorted({(c[0], c[1]) for c in RING_CASES})])
def test_ring_variants_of_the_sweep(g, name):
    """Each mma_k ring the sweep times (register ring, activations prefetched, cp.async ring in
    shared memory, its depth and tiles), x @ W.T (token side n) and its transpose (token side m),
    T in the token group, every case's C poisoned outside the matrix, every other case on a
    3-SM grid (row tiles shared: the in-kernel reduction), bitwise equal on a second call."""
    rng = np.random.default_rng(zlib.crc32(f"ring {g} {name}".encode()))
    cases = [c for c in RING_CASES if c[0] == g and c[1] == name]
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for n_case, (_, _, tiles, occ, prefix, R, K, t, few) in enumerate(cases):
        compute = "int32" if prefix == "i" else "fp32"
        orient_n = n_case % 3 != 2
        m, n = (R, t) if orient_n else (t, R)
        alpha, beta = _scales(prefix, n_case)
        p = Problem(prefix, compute, "T", "N", m, n, K, 0, alpha, beta, rng)
        launch = gemv.bind(p.desc, tiles=tiles, occupancy=occ, sm_count=3 if few else None)
        s = launch.spec
        assert s.path == "mma_k" and s.loads == 3 and s.pipe == gemv.pipe_of("mma_k", s.token_groups, 3, tiles[4])
        what = f"{name} {prefix} m={m} n={n} k={K} ctas={s.ctas}/{sms * s.occupancy} pipe={s.pipe} smem={s.smem}"
        p.run_checked(launch, what)


#: the row-block split (gemv_rows_kernel): weight rows (partial last block, one row, a block per
#: CTA and grid-stride), K in vectors of 16 bytes with tails past the last whole 64-element step
#: (8, 56, 264, 1000, 4104: every K % 64 but one nonzero), tokens across both token groups
ROWS_SIZES = [(1, 8), (7, 56), (33, 264), (257, 1000), (1000, 4104), (4096, 1000), (4099, 64)]
ROWS_TOKENS = [1, 3, 7, 8, 9, 16]
#: (grid SMs or None for the device's, warps resident per SM or None for the driver's count)
ROWS_GRIDS = [(None, None), (3, 2), (1, 1), (5, 20)]


@pytest.mark.parametrize("prefix,compute", [("b", "fp32"), ("h", "fp32"), ("sb", "fp32"), ("i", "int32")],
                         ids=["b", "h", "sb", "i"])
def test_rows_split(prefix, compute):
    """The row-block split (x @ W.T, 16-byte vectors, T <= 16) against float64 (int64): every
    size of ROWS_SIZES with every token count, the grid of the device and grids that put several
    blocks on one CTA (grid-stride) or one warp per CTA; alpha / beta with beta = 0 over a
    NaN-filled C, C poisoned outside the matrix, bitwise equal on a second call, and the
    stream-k split of the same problem within the same tolerance."""
    rng = np.random.default_rng(zlib.crc32(f"rows {prefix}".encode()))
    i = 0
    for (R, K), t in itertools.product(ROWS_SIZES, ROWS_TOKENS):
        K = K if prefix != "i" else 16 * (-(-K // 16))          # int8 vectors: 16 elements
        sms, warps = ROWS_GRIDS[i % len(ROWS_GRIDS)]
        alpha, beta = _scales(prefix, i)
        i += 1
        p = Problem(prefix, compute, "T", "N", R, t, K, 0, alpha, beta, rng)
        launch = gemv.bind(p.desc, split="rows", sm_count=sms, resident_warps=warps)
        s = launch.spec
        assert s.split == "rows" and s.loads == 3 and s.workspace_bytes == 0
        what = f"rows {prefix} R={R} T={t} K={K} wk={s.wk} ctas={s.ctas}/{s.row_tiles} sms={sms} warps={warps}"
        p.run_checked(launch, what)
        if i % 3 == 0:
            p.reset()
            gemv.bind(p.desc, split="stream_k", sm_count=sms)(p.pa, p.pb, p.pc, alpha, beta)
            p.check(p.result(), what + " (stream-k)")


def _rows_variants():
    """bench/gemv_bench.py's ROWS_VARIANTS ({token groups: [(name, tiles or None)]}): every ring
    the row-block sweep may pick is checked here first."""
    import importlib.util
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gemv_bench_rows", root / "bench" / "gemv_bench.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(root / "bench"))
    return [(g, name, tiles) for g, v in mod.ROWS_VARIANTS.items() for name, tiles in v if tiles is not None]


ROWS_VARIANT_CASES = _rows_variants()


@pytest.mark.parametrize("g,name,tiles", ROWS_VARIANT_CASES, ids=[f"tg{g}-{n}" for g, n, _ in ROWS_VARIANT_CASES])
def test_rows_split_variants_of_the_sweep(g, name, tiles):
    """Each row-block ring the bench's sweep times: bfloat16 and int8, odd rows, K tails, token
    counts of the group, the device's grid and a grid-stride one, C poisoned, bitwise repeat."""
    rng = np.random.default_rng(zlib.crc32(f"rows variant {g} {name}".encode()))
    i = 0
    for prefix in ("b", "i"):
        for (R, K), t in itertools.product(ROWS_SIZES[1:], (1, 5, 8) if g == 1 else (9, 16)):
            K = K if prefix != "i" else 16 * (-(-K // 16))
            sms, warps = ROWS_GRIDS[i % len(ROWS_GRIDS)]
            alpha, beta = _scales(prefix, i)
            i += 1
            p = Problem(prefix, "int32" if prefix == "i" else "fp32", "T", "N", R, t, K, 0, alpha, beta, rng)
            launch = gemv.bind(p.desc, tiles=tiles, split="rows", sm_count=sms, resident_warps=warps)
            s = launch.spec
            assert s.split == "rows" and (s.p1, s.p2, s.pipe) == (tiles[0], tiles[1], tiles[4])
            what = f"rows {name} {prefix} R={R} T={t} K={K} wk={s.wk} ctas={s.ctas}/{s.row_tiles}"
            p.run_checked(launch, what)


def test_rows_split_grid_fits_the_device():
    """On the device: decode layers take the row-block split by default, their CTAs all resident
    at once (the driver's count for the chosen CTA size), one block per CTA."""
    from pyblasgemm.kernels.driver import occupancy

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for n, k, t in ((4096, 4096, 1), (14336, 4096, 4), (4096, 14336, 16), (18944, 3584, 1), (6144, 4096, 16)):
        d = describe("test", TYPE_ROWS["b"], "fp32", "T", "N", n, t, k, k, k, n, 1, 0, 0, 0, "cupy",
                     cp.cuda.Device().id, (16,), 1.0, 0.0)
        launch = gemv.bind(d)
        s = launch.spec
        assert s.split == "rows", (n, k, t)
        resident = occupancy(launch.kern.kernel.ptr, s.threads, s.smem)
        assert s.ctas == s.row_tiles <= sms * resident, (n, k, t, s.ctas, resident, s.wk)


def test_decode_route_through_matmul(monkeypatch):
    """``pyblasgemm.matmul(x, W.T)`` (CuPy float16, W as torch.nn.Linear holds it) at 1-8 tokens
    on a 7168 x 4608 weight: the planner's decode route (the GEMV kernel's row-block split) on the
    devices it was measured on (sm_90 with H100 or H200 memory), against float64; 16 tokens, and other
    devices, stay on the ordinary planner. Bitwise equal on a second call."""
    import pyblasgemm
    from pyblasgemm.planner import decode
    from pyblasgemm.planner.arch import arch_for_device

    monkeypatch.setattr(decode, "ENABLED", True)        # (the shipped setting; a test may not rely on it)
    pyblasgemm.clear_plan_cache()
    arch = arch_for_device(cp.cuda.Device().id)
    measured_device = arch.cc == decode.MEASURED_CC and arch.dram_bw < decode.MAX_DRAM_BW
    rng = np.random.default_rng(33)
    k, n = 4608, 7168                                   # 63 MiB of float16 weight
    w = cp.asarray((rng.standard_normal((n, k)) * 0.02).astype(np.float16))
    for t in (1, 3, 8, 16):
        x = cp.asarray(rng.standard_normal((t, k)).astype(np.float16))
        text = pyblasgemm.explain(x, w.T)
        assert ("decode:" in text) == (measured_device and t <= decode.MAX_TOKENS), text
        y = pyblasgemm.matmul(x, w.T)
        ref = x.get().astype(np.float64) @ w.get().astype(np.float64).T
        scale = np.abs(x.get().astype(np.float64)) @ np.abs(w.get().astype(np.float64)).T
        err = np.max(np.abs(y.get().astype(np.float64) - ref) / (scale + 1e-30))
        assert y.shape == (t, n) and err <= 2.0 ** -10, (t, err)
        again = pyblasgemm.matmul(x, w.T)
        assert cp.array_equal(y.view(cp.uint16), again.view(cp.uint16)), t
    pyblasgemm.clear_plan_cache()                       # (no decode plan outlives the setting)
