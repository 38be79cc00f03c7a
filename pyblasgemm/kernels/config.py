"""Kernel configurations: tile shape, warp layout, pipeline depth, decomposition.

Every constraint on a (config, problem) pair lives in :meth:`KernelConfig.validate`; the
launcher, the tests and (later) the planner all ask it, nothing else re-derives the rules.

Decompositions (all bitwise reproducible run to run; partials are summed in a fixed order):

``sliced``           one CTA per C tile walks all of K (data-parallel; the default).
``splitk_serial``    ``splits`` CTAs per tile each take a K range; split s waits for s-1's running
                     sum (fp32/s32 workspace + per-tile flag), the last one applies alpha/beta.
``splitk_parallel``  each split writes an fp32/s32 partial tile; a reduce kernel sums them in
                     split order and applies alpha/beta.
``streamk``          persistent grid (SMs x occupancy CTAs); the MAC iterations of all tiles are
                     split evenly; the CTA holding a tile's k-step 0 adds the other CTAs' partials
                     in CTA order (Osama et al., PPoPP'23).
``hybrid``           as streamk, but whole waves of tiles go data-parallel first and only the
                     last (partial) wave plus one full wave are shared stream-k style.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..kinds import KERNEL_KINDS
from .problem import ACCUMULATE, C_BYTES, ELEM_BYTES, KernelProblem

__all__ = ["KernelConfig", "DECOMPOSITIONS", "SHIPPED_CONFIGS", "SM90_CONFIGS", "default_config", "MAX_SMEM_SM90",
           "SM90_KINDS", "SM90_DECOMPOSITIONS", "SM90_CONFIGS_BY_TILE", "SM90_MMA_SYNC_CONFIGS",
           "SM90_SMALL_CONFIGS", "SM90_PREP_KINDS", "sm90_prep_shape"]

DECOMPOSITIONS = ("sliced", "splitk_serial", "splitk_parallel", "streamk", "hybrid")
#: template MODE of impls/sm80_gemm.cuh (hybrid and streamk share the kernel)
MODE = {"sliced": 0, "splitk_serial": 1, "splitk_parallel": 2, "streamk": 3, "hybrid": 3, "grouped": 4}
#: the mma.sync kernel's persistent walk over a device-side table of problems
#: (:mod:`pyblasgemm.kernels.grouped`): a tile config with ``decomposition="grouped"``
GROUPED = "grouped"
#: opt-in dynamic shared memory per block: sm_90 227 KB, sm_80 163 KB, sm_86/89 99 KB
MAX_SMEM_SM90 = 232448
_GRID_YZ_MAX = 65535
SM90_KINDS = tuple(KERNEL_KINDS)      # the Hopper kernel runs every kind
#: fp32 operands on the Hopper kernel: a prep kernel writes them K-major, rounded to tf32 (3xTF32:
#: rows of [big | small] halves) into a workspace of at most this many bytes
SM90_PREP_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.sm90_prep)
SM90_PREP_MAX_BYTES = 4 << 30
#: fp32-output kinds: the 16-bit mainloop with a 4-byte epilogue; CI compiles fewer of their
#: tiles (the mainloop instantiations are the 16-bit kinds', tested in full)
_OUT32_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.base_kind != k)
#: kinds whose wgmma chains go into fresh registers added to the accumulator by a rounding FADD
#: (3xTF32; a float32 C shows the tensor cores' truncating accumulation): two register sets
_TWO_ACCUMULATOR_KINDS = ("3xtf32", "f16_out32", "bf16_out32")
#: decompositions of the Hopper kernel's persistent scheduler (its split-k is the parallel one)
SM90_DECOMPOSITIONS = ("sliced", "splitk_parallel", "streamk", "hybrid")


@dataclass(frozen=True)
class KernelConfig:
    """One kernel configuration. ``bk`` is in elements of the kind (f16: 32 = 64 bytes).

    ``splits`` = 0 lets the launcher choose (split-k only); ``group_m`` = tile rows per
    rasterization group (L2 reuse). Example::

        KernelConfig(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, stages=4)
    """

    bm: int = 128
    bn: int = 128
    bk: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 4
    decomposition: str = "sliced"
    splits: int = 0
    group_m: int = 8
    #: 'sm80': the mma.sync kernel (sm_80 and newer); 'sm90a': the Hopper wgmma + TMA kernel
    family: str = "sm80"
    #: CTAs per thread-block cluster (Hopper, data-parallel): 2 = pairs sharing the m-side
    #: operand through TMA multicast
    cluster: int = 1
    #: Hopper kernel's consumer warps: 'wgmma', or 'mma.sync' (the same TMA ring feeding
    #: mma.sync m16n8k16 from ldmatrix fragments, 64 x bm/4 per warp; f16/bf16, bm 128 or 256,
    #: every decomposition)
    consumer: str = "wgmma"

    @property
    def name(self) -> str:
        s = "sm90a_" if self.family == "sm90a" else ""
        s += f"{self.decomposition}_{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}_s{self.stages}"
        if self.splits:
            s += f"_k{self.splits}"
        if self.cluster != 1:
            s += f"_c{self.cluster}"
        if self.consumer != "wgmma":
            s += "_mmasync"
        return s + f"_g{self.group_m}"

    @property
    def is_sm90(self) -> bool:
        return self.family == "sm90a"

    @property
    def threads(self) -> int:
        if self.is_sm90:
            return 128 * (1 + self.warps_m)   # producer warpgroup + warps_m consumer warpgroups
        return 32 * self.warps_m * self.warps_n

    @property
    def mode(self) -> int:
        return MODE[self.decomposition]

    def bk_bytes(self, kind: str) -> int:
        return self.bk * ELEM_BYTES[kind]

    def smem_bytes(self, kind: str) -> int:
        """Dynamic shared memory: max(cp.async ring, fp32 epilogue staging tile); sm90a: the
        TMA ring (128 bytes of K per row of both tiles per stage) + the epilogue's TMA-store
        staging (2 x 8 KB per consumer warpgroup) + mbarriers + 1 KB alignment."""
        if self.is_sm90:
            parts = 2 if kind == "3xtf32" else 1     # a 3xTF32 stage holds big and small halves
            return self.stages * (self.bm + self.bn) * 128 * parts + 16384 * self.warps_m + 16 * self.stages + 1024
        ring = self.stages * (self.bm + self.bn) * self.bk_bytes(kind)
        stage = self.bn * (self.bm + 4) * 4
        return max(ring, stage)

    def validate(self, problem: KernelProblem | None = None, *, kind: str | None = None,
                 max_smem: int = MAX_SMEM_SM90) -> tuple[bool, str]:
        """(ok, reason): may this config run ``problem`` (or compile for ``kind``)?"""
        kind = problem.kind if problem is not None else kind
        if kind not in ELEM_BYTES:
            return False, f"unknown kind {kind!r}; expected one of {tuple(ELEM_BYTES)}"
        if self.family == "sm90a":
            return _validate_sm90(self, problem, kind, max_smem)
        if self.family != "sm80":
            return False, f"family {self.family!r} must be 'sm80' or 'sm90a'"
        if self.cluster != 1:
            return False, f"clusters are the Hopper kernel's (cluster={self.cluster} with family 'sm80')"
        if self.consumer != "wgmma":
            return False, f"consumer={self.consumer!r} is the Hopper kernel's (family 'sm90a')"

        eb, cb = ELEM_BYTES[kind], C_BYTES[kind]
        if self.decomposition not in DECOMPOSITIONS + (GROUPED,):
            return False, f"decomposition {self.decomposition!r} not in {DECOMPOSITIONS + (GROUPED,)}"
        if self.bm not in (64, 128, 256) or self.bn not in (64, 128, 256):
            return False, f"bm, bn must be 64, 128 or 256 (got {self.bm}x{self.bn})"
        if self.bk_bytes(kind) not in (64, 128):
            return False, f"bk*sizeof(elem) must be 64 or 128 bytes (bk={self.bk}, {eb}-byte {kind})"
        if self.warps_m * self.warps_n not in (4, 8):
            return False, f"warps_m*warps_n must be 4 or 8 (got {self.warps_m}x{self.warps_n})"
        wtm, wtn = self.bm // self.warps_m, self.bn // self.warps_n
        if self.bm % self.warps_m or self.bn % self.warps_n or wtm % 16 or wtn % 16:
            return False, f"warp tile {self.bm}/{self.warps_m} x {self.bn}/{self.warps_n} must be multiples of 16"
        if wtm * wtn > 64 * 64:
            return False, f"warp tile {wtm}x{wtn} exceeds 64x64 (accumulators would spill)"
        if not 3 <= self.stages <= 5:
            return False, f"stages must be 3..5 (got {self.stages})"
        t = self.threads
        for rows, cols_b, what in ((self.bm, self.bk_bytes(kind), "A"), (self.bn, self.bk_bytes(kind), "B")):
            if (rows * cols_b // 16) % t:
                return False, f"{what} tile of {rows * cols_b // 16} 16-byte chunks does not divide over {t} threads"
        for mn in (self.bm, self.bn):
            if mn * eb // 16 not in (2, 4, 8, 16, 32):
                return False, f"an M/N-contiguous smem row of {mn} {eb}-byte elements is not 2..32 chunks"
        if (self.bm * self.bn // (16 // cb)) % t or (self.bm * self.bn // 4) % t:
            return False, "epilogue vectors do not divide over the threads"
        if self.smem_bytes(kind) > max_smem:
            return False, f"needs {self.smem_bytes(kind)} B shared memory > {max_smem} B available"
        if self.decomposition.startswith("splitk") and not (self.splits == 0 or 2 <= self.splits <= _GRID_YZ_MAX):
            return False, f"split-k needs splits = 0 (auto) or >= 2 (got {self.splits})"
        if self.decomposition in ("sliced", "streamk", "hybrid") and self.splits not in (0, 1):
            return False, f"{self.decomposition} takes no splits (got {self.splits})"
        if self.group_m < 1:
            return False, "group_m must be >= 1"
        if problem is None:
            return True, ""
        if problem.acc not in ACCUMULATE[kind]:
            return False, f"accumulate {problem.acc!r} not available for {kind} (choose from {ACCUMULATE[kind]})"
        if problem.transa not in "NT" or problem.transb not in "NT" or len(problem.transa + problem.transb) != 2:
            return False, f"transa/transb must be 'N' or 'T' (got {problem.transa!r}, {problem.transb!r})"
        tiles = -(-problem.m // self.bm) * -(-problem.n // self.bn)
        if tiles * problem.batch >= 2**31:
            return False, f"{tiles * problem.batch} tiles exceed the 2^31 grid limit"
        if self.decomposition in ("sliced", "splitk_serial", "splitk_parallel") and problem.batch > _GRID_YZ_MAX:
            return False, f"batch {problem.batch} > {_GRID_YZ_MAX} (grid.z); use streamk/hybrid"
        if max(problem.m, problem.n, problem.k) >= 2**31:
            return False, "m, n, k must be < 2^31"
        return True, ""


def _validate_sm90(c: KernelConfig, problem: KernelProblem | None, kind: str, max_smem: int) -> tuple[bool, str]:
    """The Hopper kernel's rules (impls/sm90_gemm.cuh): tile, pipeline, and what TMA and s8
    wgmma need of the operands. Anything refused here runs on the mma.sync kernel or cuBLAS."""
    if kind not in SM90_KINDS:
        return False, f"the Hopper kernel runs {SM90_KINDS} (not {kind}: that is the mma.sync kernel's)"
    if c.decomposition not in SM90_DECOMPOSITIONS:
        return False, (f"the Hopper kernel's persistent scheduler runs {SM90_DECOMPOSITIONS} "
                       f"(not {c.decomposition!r}; its split-k is the parallel one)")
    if (c.warps_m, c.warps_n) not in ((1, 1), (2, 1)):
        return False, (f"Hopper kernel: warps_m x warps_n names the 1 x 1 or 2 x 1 consumer warpgroups "
                       f"(got {c.warps_m}x{c.warps_n})")
    if c.bn != 64 * c.warps_m or c.bm not in (64, 128, 192, 256):
        return False, (f"Hopper tile: bn must be 64 per consumer warpgroup ({64 * c.warps_m}) and bm "
                       f"64/128/192/256 (got {c.bm}x{c.bn})")
    if c.bk * ELEM_BYTES[kind] != 128:
        return False, f"Hopper tile: bk must be 128 bytes of K (got bk={c.bk} {kind})"
    if not 2 <= c.stages <= 16:
        return False, f"stages must be 2..16 (got {c.stages})"
    if c.smem_bytes(kind) > max_smem:
        return False, f"needs {c.smem_bytes(kind)} B shared memory > {max_smem} B available"
    if c.decomposition == "splitk_parallel" and not (c.splits == 0 or c.splits >= 2):
        return False, f"split-k needs splits = 0 (auto) or >= 2 (got {c.splits})"
    if c.decomposition != "splitk_parallel" and c.splits not in (0, 1):
        return False, f"{c.decomposition} takes no splits (got {c.splits})"
    if c.group_m < 1:
        return False, "group_m must be >= 1"
    if c.cluster not in (1, 2):
        return False, f"cluster must be 1 or 2 (got {c.cluster})"
    if c.cluster == 2 and c.decomposition != "sliced":
        return False, f"2-CTA clusters run the data-parallel schedule only (not {c.decomposition!r})"
    if c.consumer not in ("wgmma", "mma.sync"):
        return False, f"consumer must be 'wgmma' or 'mma.sync' (got {c.consumer!r})"
    if c.consumer == "mma.sync" and (kind not in ("f16", "bf16") or c.bm not in (128, 256) or c.warps_m != 2):
        return False, (f"mma.sync consumers run f16/bf16 with two consumer warpgroups and bm 128 or 256 "
                       f"(a 64 x bm/4 warp tile; got {kind}, bm={c.bm}, warps_m={c.warps_m})")
    if kind in _TWO_ACCUMULATOR_KINDS and c.bm > 128:
        return False, (f"{kind} keeps a second set of accumulators (rounded adds): wgmma N = bm <= 128 "
                       f"(got bm={c.bm})")
    if problem is None:
        return True, ""
    p = problem
    if kind in SM90_PREP_KINDS:
        return _validate_sm90_prep(c, p, kind)
    if p.acc not in ("f32", "s32"):
        return False, f"the Hopper kernel accumulates in fp32/s32 (accumulate={p.acc!r} is mma.sync's)"
    if p.transa not in ("N", "T") or p.transb not in ("N", "T"):
        return False, f"transa/transb must be 'N' or 'T' (got {p.transa!r}, {p.transb!r})"
    if kind == "s8" and (p.transa, p.transb) != ("T", "N"):
        return False, (f"s8 wgmma reads K-major operands only: needs transa='T', transb='N' "
                       f"(got {p.transa!r}, {p.transb!r})")
    eb = ELEM_BYTES[kind]
    for name, ld in (("lda", p.lda), ("ldb", p.ldb)):
        if (ld * eb) % 16:
            return False, f"TMA needs {name}*{eb} bytes to be a multiple of 16 ({name}={ld})"
    if p.a_ptr % 16 or p.b_ptr % 16:
        return False, "TMA needs 16-byte aligned A and B pointers"
    if p.batch > 1:
        for name, st in (("stride_a", p.stride_a), ("stride_b", p.stride_b)):
            if st and (st * eb) % 16:
                return False, f"TMA needs {name}*{eb} bytes to be a multiple of 16 ({name}={st})"
    if p.batch > 1:
        # each batch's matrix is a box-aligned slab of a 3-D tensor map: no overlapping batches
        cols_a = p.k if p.transa == "N" else p.m
        cols_b = p.n if p.transb == "N" else p.k
        for name, st, need in (("stride_a", p.stride_a, p.lda * cols_a), ("stride_b", p.stride_b, p.ldb * cols_b)):
            if st and st < need:
                return False, f"TMA needs non-overlapping batches: {name}={st} < {need}"
    if max(p.lda, p.ldb, p.stride_a, p.stride_b) * eb >= 2**40:
        return False, "TMA strides must be < 2^40 bytes"
    if max(p.m, p.n, p.k) >= 2**31:
        return False, "m, n, k must be < 2^31"
    tiles = -(-p.m // c.bm) * -(-p.n // c.bn) * p.batch
    if tiles * max(1, c.splits) >= 2**31:
        return False, f"{tiles} tiles x {c.splits} splits exceed 2^31 work units"
    return True, ""


def sm90_prep_shape(p: KernelProblem) -> tuple[int, int, int]:
    """(sections, kpad, workspace bytes) of the Hopper fp32 paths' prepared operands: op(A) and
    op(B) K-major in ``sections`` blocks of ``kpad`` (k rounded up to a 32-element stage)
    columns each (3xTF32: [big | small]); a broadcast operand (batch stride 0) is prepared once.

    Example::

        >>> from pyblasgemm.kernels import KernelProblem
        >>> sm90_prep_shape(KernelProblem("3xtf32", "N", "N", 100, 50, 70, 100, 70, 100, 0, 0, 0))
        (2, 96, 115200)
    """
    sections = 2 if p.kind == "3xtf32" else 1
    kpad = -(-p.k // 32) * 32
    bat_a = p.batch if p.batch > 1 and p.stride_a else 1
    bat_b = p.batch if p.batch > 1 and p.stride_b else 1
    return sections, kpad, (bat_a * p.m + bat_b * p.n) * sections * kpad * 4


def _validate_sm90_prep(c: KernelConfig, p: KernelProblem, kind: str) -> tuple[bool, str]:
    """The fp32 paths: the prep kernel reads any layout, leading dimension and alignment, so
    only the size of its workspace and of the tripled K are bounded."""
    if p.transa not in ("N", "T") or p.transb not in ("N", "T"):
        return False, f"transa/transb must be 'N' or 'T' (got {p.transa!r}, {p.transb!r})"
    sections, kpad, ws = sm90_prep_shape(p)
    if ws > SM90_PREP_MAX_BYTES:
        return False, (f"the prepared tf32 operands would take {ws / 2**30:.1f} GiB "
                       f"(> {SM90_PREP_MAX_BYTES >> 30} GiB)")
    if sections * kpad >= 2**31 or max(p.m, p.n) >= 2**31:
        return False, "m, n and the prepared K must be < 2^31"
    tiles = -(-p.m // c.bm) * -(-p.n // c.bn) * p.batch
    if tiles * max(1, c.splits) >= 2**31:
        return False, f"{tiles} tiles x {c.splits} splits exceed 2^31 work units"
    return True, ""


def _cfg(**kw) -> KernelConfig:
    return KernelConfig(**kw)


_DECOMP_SET = ("sliced", "splitk_serial", "splitk_parallel", "streamk", "hybrid")

#: per kind: the configurations CI compiles (each for all four transpose pairs, vectorized and
#: scalar operand paths). The first one is the kind's workhorse.
SHIPPED_CONFIGS: dict[str, tuple[KernelConfig, ...]] = {}
for _kind, _big, _small, _extra in (
    # measured on H100 with the pipelined mainloop (NOTES.md, optimization 2): 128-byte K rows
    # (bk=64) with 3 stages beat bk=32/4 stages by 6-8%; 128x256x64 is best at >= 4096^3.
    ("f16", dict(bk=64, warps_m=2, warps_n=2, stages=3), dict(bk=32, stages=4),
     [dict(bm=128, bn=256, bk=64, warps_m=2, warps_n=4, stages=3)]),
    ("bf16", dict(bk=64, warps_m=2, warps_n=2, stages=3), dict(bk=32, stages=4),
     [dict(bm=128, bn=256, bk=64, warps_m=2, warps_n=4, stages=3)]),
    # measured on H100 (NOTES.md run 2): 128x256x128-byte K beats 128x256x64 B by 11% for s8;
    # 128-byte K rows beat 64-byte ones for tf32 by ~15%; 3xTF32 keeps 64-byte rows (with
    # 128 its stream-k instantiation spills 8 bytes on sm_80; speed was within 5%).
    ("s8", dict(bk=64, warps_m=2, warps_n=4, stages=4), dict(bk=64, stages=4),
     [dict(bm=128, bn=256, bk=128, warps_m=2, warps_n=4, stages=3)]),
    ("tf32", dict(bk=32, warps_m=2, warps_n=4, stages=3), dict(bk=16, stages=4), []),
    ("3xtf32", dict(bk=16, warps_m=2, warps_n=4, stages=4), dict(bk=16, stages=4), []),
):
    _list = [_cfg(bm=128, bn=128, decomposition=d, **_big) for d in _DECOMP_SET]
    _list.append(_cfg(bm=64, bn=64, warps_m=2, warps_n=2, **_small))
    _list += [_cfg(**e) for e in _extra]
    SHIPPED_CONFIGS[_kind] = tuple(_list)
# fp32 output (shgemm / sbgemm) on mma.sync: these kinds add each k-step's products to the
# accumulator with a rounding FADD (mma/sm80_kinds.cuh), which needs registers for the fresh
# sums: 8 warps, 64-byte K rows (64x32 warp tiles; 64x64 tiles or 128-byte rows spill) in every
# decomposition, and the small tile
for _kind in ("f16_out32", "bf16_out32"):
    SHIPPED_CONFIGS[_kind] = tuple(
        [_cfg(bm=128, bn=128, bk=32, warps_m=2, warps_n=4, stages=4, decomposition=d) for d in _DECOMP_SET]
        + [_cfg(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=4)])


#: the Hopper kernel's shipped tiles per kind (bm = the wgmma N over m, bn = 128 over n): CI
#: compiles each for sm_90a with every decomposition and layout it accepts.
SM90_CONFIGS: dict[str, tuple[KernelConfig, ...]] = {}
for _kind in SM90_KINDS:
    _bk = 128 // ELEM_BYTES[_kind]
    # 192 (4 stages): 3072^3 in 128x192 tiles is 384 tiles = 2.9 waves on 132 SMs, where 128x128
    # gives 4.4 and 128x256 2.2 (ncu: cuBLAS picks 192x192 there)
    _tiles = [dict(bm=256, stages=4), dict(bm=192, stages=4), dict(bm=128, stages=6), dict(bm=64, stages=8)]
    # one consumer warpgroup (64-row tiles over n, deep rings): more CTAs for thin and long-K
    # problems (ncu: cuBLAS runs 256x256x65536 as 64x64 tiles with 13 stages on 128 CTAs)
    _small = [dict(bm=128, stages=8), dict(bm=64, stages=12)]
    if _kind == "tf32":
        _tiles, _small = [dict(bm=256, stages=4), dict(bm=128, stages=6)], [dict(bm=64, stages=12)]
    elif _kind in _OUT32_KINDS:   # two accumulator sets: wgmma N <= 128
        _tiles, _small = [dict(bm=128, stages=6), dict(bm=64, stages=8)], [dict(bm=64, stages=12)]
    elif _kind == "3xtf32":   # two accumulator sets: wgmma N <= 128; stages hold big + small halves
        _tiles, _small = [dict(bm=128, stages=3), dict(bm=64, stages=4)], [dict(bm=64, stages=6)]
    SM90_CONFIGS[_kind] = tuple(
        KernelConfig(bn=128, bk=_bk, warps_m=2, warps_n=1, family="sm90a", decomposition=d, **t)
        for t in _tiles for d in SM90_DECOMPOSITIONS) + tuple(
        KernelConfig(bn=128, bk=_bk, warps_m=2, warps_n=1, family="sm90a", cluster=2, **t) for t in _tiles) + tuple(
        KernelConfig(bn=64, bk=_bk, warps_m=1, warps_n=1, family="sm90a", decomposition=d, **t)
        for t in _small for d in SM90_DECOMPOSITIONS)
#: kind -> {bm: the sliced Hopper config with that tile}
SM90_CONFIGS_BY_TILE = {k: {c.bm: c for c in v if c.decomposition == "sliced" and c.cluster == 1 and c.bn == 128}
                        for k, v in SM90_CONFIGS.items()}
#: mma.sync consumers on the Hopper kernel's TMA ring (``consumer='mma.sync'``): what mma.sync
#: reaches on Hopper when TMA feeds it (bench/bench_mma_sync.py, issue #3's speed target). CI
#: compiles them; the planner does not choose them (the wgmma consumers are faster everywhere
#: measured), so they run when a config is forced.
SM90_MMA_SYNC_CONFIGS: dict[str, tuple[KernelConfig, ...]] = {
    _kind: tuple(replace(SM90_CONFIGS_BY_TILE[_kind][256], consumer="mma.sync", **kw)
                 for kw in (dict(), dict(decomposition="splitk_parallel"), dict(decomposition="streamk"),
                            dict(decomposition="hybrid"), dict(cluster=2), dict(bm=128, stages=6)))
    for _kind in ("f16", "bf16")}
#: kind -> {bm: the sliced one-consumer-warpgroup (bn = 64) Hopper config with that tile}
SM90_SMALL_CONFIGS = {k: {c.bm: c for c in v if c.decomposition == "sliced" and c.bn == 64}
                      for k, v in SM90_CONFIGS.items()}


def default_config(problem: KernelProblem, sm_count: int) -> KernelConfig:
    """A simple documented rule (the planner will replace it).

    1. Tile: 64x64 when m*n <= 128*128 (a 128x128 tile would be mostly padding), else
       128x128 (s8, f16, bf16: 128x256 with 128-byte K rows when m and n are both >= 4096).
    2. Decomposition, with tiles = output tiles x batch and kt = BK steps per tile:
       - tiles < sm_count and kt >= 16 (long K, too few tiles to fill the GPU): split-k with
         splits = min(kt // 4, ceil(sm_count / tiles)); serial when splits <= 4, else parallel.
       - more than one wave and the last wave less than half full (sm_count tile slots assumed)
         and kt >= 8: hybrid (data-parallel full waves + stream-k tail).
       - otherwise sliced-k.
    """
    kind = problem.kind
    base = SHIPPED_CONFIGS[kind][0]
    if problem.m * problem.n <= 128 * 128:
        base = SHIPPED_CONFIGS[kind][5]
    elif kind in ("s8", "f16", "bf16") and problem.m >= 4096 and problem.n >= 4096:
        # measured (H100, pipelined mainloop): s8 128x256x128 957 TOPS vs 685 for 128x128x64;
        # f16 128x256x64 434-447 TF/s vs 396-435 for 128x128x64 at 4096^3 and 8192^3.
        base = SHIPPED_CONFIGS[kind][6]
    tiles = -(-problem.m // base.bm) * -(-problem.n // base.bn) * problem.batch
    kt = -(-problem.k // base.bk)
    if tiles < sm_count and kt >= 16:
        splits = max(2, min(kt // 4, -(-sm_count // tiles)))
        d = "splitk_serial" if splits <= 4 else "splitk_parallel"
        cfg = replace(SHIPPED_CONFIGS[kind][0], decomposition=d, splits=splits)
        if base.bm == 64:
            cfg = replace(base, decomposition=d, splits=splits)
        return cfg
    waves = tiles / sm_count
    if waves > 1 and (waves - int(waves)) and (waves - int(waves)) < 0.5 and kt >= 8 and base.bm == 128:
        return replace(base, decomposition="hybrid")
    return base
