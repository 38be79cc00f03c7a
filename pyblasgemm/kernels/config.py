"""Kernel configurations: tile shape, warp layout, pipeline depth, decomposition.

Every constraint on a (config, problem) pair is asked through :meth:`KernelConfig.validate`,
which applies its kernel family's rules (:mod:`~pyblasgemm.kernels.families`); the launcher,
the tests and the planner all ask it, nothing else re-derives the rules.

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
from .problem import ELEM_BYTES, KernelProblem

__all__ = ["KernelConfig", "DECOMPOSITIONS", "SHIPPED_CONFIGS", "SM90_CONFIGS", "default_config", "MAX_SMEM_SM90",
           "SM90_KINDS", "SM90_DECOMPOSITIONS", "SM90_CONFIGS_BY_TILE", "SM90_MMA_SYNC_CONFIGS",
           "SM90_SMALL_CONFIGS", "SM90_PREP_KINDS", "sm90_prep_shape", "KERNEL_FAMILIES", "families_on",
           "FP8_KINDS", "FP8_CONFIGS", "DEQUANT_KINDS", "fp8_config", "SM90_GROUPED_CONFIGS",
           "SM90_GROUPED_TABLE_BYTES", "SM90_MAX_GROUPS"]

DECOMPOSITIONS = ("sliced", "splitk_serial", "splitk_parallel", "streamk", "hybrid")
#: template MODE of impls/sm80_gemm.cuh (hybrid and streamk share the kernel)
MODE = {"sliced": 0, "splitk_serial": 1, "splitk_parallel": 2, "streamk": 3, "hybrid": 3, "grouped": 4}
#: the mma.sync kernel's persistent walk over a device-side table of problems
#: (:mod:`pyblasgemm.kernels.grouped`): a tile config with ``decomposition="grouped"``
GROUPED = "grouped"
#: opt-in dynamic shared memory per block: sm_90 227 KB, sm_80 163 KB, sm_86/89 99 KB
MAX_SMEM_SM90 = 232448
#: the kinds the Hopper kernel runs: every tensor-core kind (the FP32 FMA kind is the mma.sync kernel's)
SM90_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.sm90_struct is not None)
#: fp32 operands on the Hopper kernel: a prep kernel writes them K-major, rounded to tf32 (3xTF32:
#: rows of [big | small] halves) into a workspace (at most ``families.SM90_PREP_MAX_BYTES``)
SM90_PREP_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.sm90_prep)
#: fp32-output kinds: the 16-bit mainloop with a 4-byte epilogue; CI compiles fewer of their
#: tiles (the mainloop instantiations are the 16-bit kinds', tested in full)
_OUT32_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.base_kind != k)
#: decompositions of the Hopper kernel's persistent scheduler (its split-k is the parallel one)
SM90_DECOMPOSITIONS = ("sliced", "splitk_parallel", "streamk", "hybrid")
#: the kinds whose kernels take a fused epilogue (float accumulators; the fp32 operand kinds
#: pass a prep kernel on Hopper and are left out everywhere)
FUSED_KINDS = ("f16", "bf16", "f16_out32", "bf16_out32", "f32")
#: the float8 kinds (either type per operand; mma.sync on sm_89+): they always run with the
#: dequantizing store (the scales and the float output type), never plain
FP8_KINDS = tuple(k for k, r in KERNEL_KINDS.items() if r.ab_dtype.startswith("float8"))
#: the kinds whose product the fused store dequantizes (EPI & kEpiDequant): int8 and float8
DEQUANT_KINDS = ("s8",) + FP8_KINDS

#: The kernel-family registry: ``KernelConfig.family`` -> its entry (a
#: :class:`~pyblasgemm.kernels.families.KernelFamily`), in the order the planner offers their
#: tiles. :mod:`pyblasgemm.kernels.families` fills it when ``pyblasgemm.kernels`` is imported;
#: it lives here so that every layer below that module looks families up without importing it.
KERNEL_FAMILIES: dict = {}


def families_on(cc: tuple) -> list:
    """The registered kernel families that run on compute capability ``cc``, in the
    planner's order.

    >>> [f.name for f in families_on((8, 6))], [f.name for f in families_on((9, 0))]
    (['sm80'], ['sm90a', 'sm80'])
    """
    return [f for f in KERNEL_FAMILIES.values() if not f.why_not_on(cc)]


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
    def kernel_family(self):
        """The registry entry of this config's family (:mod:`~pyblasgemm.kernels.families`):
        everything that differs between the mma.sync and the Hopper kernel. ValueError for a
        family that is not registered.

        >>> KernelConfig().kernel_family.title
        'the mma.sync kernel'
        """
        fam = KERNEL_FAMILIES.get(self.family)
        if fam is None:
            raise ValueError(f"family={self.family!r} is not a kernel family; "
                             f"registered: {tuple(KERNEL_FAMILIES)}")
        return fam

    @property
    def name(self) -> str:
        fam = KERNEL_FAMILIES.get(self.family)
        s = fam.name_prefix if fam is not None else f"{self.family}_"
        s += f"{self.decomposition}_{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}_s{self.stages}"
        if self.splits:
            s += f"_k{self.splits}"
        if self.cluster != 1:
            s += f"_c{self.cluster}"
        if self.consumer != "wgmma":
            s += "_mmasync"
        return s + f"_g{self.group_m}"

    @property
    def threads(self) -> int:
        return self.kernel_family.threads(self)

    @property
    def mode(self) -> int:
        return MODE[self.decomposition]

    def bk_bytes(self, kind: str) -> int:
        return self.bk * ELEM_BYTES[kind]

    def smem_bytes(self, kind: str) -> int:
        """Dynamic shared memory per CTA (the family's formula: the mma.sync kernel's
        cp.async ring or epilogue staging tile, the Hopper kernel's TMA ring and store staging)."""
        return self.kernel_family.smem_bytes(self, kind)

    def validate(self, problem: KernelProblem | None = None, *, kind: str | None = None,
                 max_smem: int = MAX_SMEM_SM90) -> tuple[bool, str]:
        """(ok, reason): may this config run ``problem`` (or compile for ``kind``)? The rules
        are its family's (``KernelFamily.validate``)."""
        kind = problem.kind if problem is not None else kind
        if kind not in ELEM_BYTES:
            return False, f"unknown kind {kind!r}; expected one of {tuple(ELEM_BYTES)}"
        fam = KERNEL_FAMILIES.get(self.family)
        if fam is None:
            return False, f"family {self.family!r} must be {' or '.join(repr(f) for f in sorted(KERNEL_FAMILIES))}"
        return fam.validate(self, problem, kind, max_smem)


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


# IEEE float32 on the FP32 FMA pipes: 8 warps of 64x32 warp tiles (64 accumulators and 64
# operand registers a lane, 4 k at a time: mma/sm80_warp_mma.cuh) with 64-byte K rows, in every
# decomposition, and the 64x64 tile with 32x32 warp tiles for the small problems it is for
SHIPPED_CONFIGS["f32"] = tuple(
    [_cfg(bm=128, bn=128, bk=16, warps_m=2, warps_n=4, stages=4, decomposition=d) for d in _DECOMP_SET]
    + [_cfg(bm=64, bn=64, bk=16, warps_m=2, warps_n=2, stages=4)])


# float8 on mma.sync (pyblasgemm.fp8's GPU route; kept out of SHIPPED_CONFIGS: no BLAS route
# plans them, and sm_80 cannot compile them). 8 warps of 64x32 warp tiles with 64-byte K rows
# (the workhorse, and its serial split-k for long K on few tiles), and 64x64 for the small
# products (decode: m of 1..64 tokens is the kernel's n, after the swap to C^T = B^T A^T).
# The s8 kind's 128x256 tile and 128-byte K rows spill here (ptxas, sm_90: 12-180 bytes in
# the K-major layout): each k32 step's fresh accumulators live beside the pipelined fragments.
# BK = 64 divides the 128-wide K blocks of the block scales.
FP8_CONFIGS: dict[str, KernelConfig] = {
    "medium": _cfg(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=4),
    "medium_splitk": _cfg(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=4, decomposition="splitk_serial"),
    "small": _cfg(bm=64, bn=64, bk=64, warps_m=2, warps_n=2, stages=4),
    "small_splitk": _cfg(bm=64, bn=64, bk=64, warps_m=2, warps_n=2, stages=4, decomposition="splitk_serial"),
    # block scales (the mainloop's promotion keeps a second accumulator set: 64x32 warp tiles
    # spill 112-176 bytes in the K-major layout on sm_90, ptxas): 8 warps of 32x32
    "block": _cfg(bm=128, bn=64, bk=64, warps_m=4, warps_n=2, stages=4),
    "block_splitk": _cfg(bm=128, bn=64, bk=64, warps_m=4, warps_n=2, stages=4, decomposition="splitk_serial"),
}


def fp8_config(m: int, n: int, k: int, sm_count: int, block: bool = False) -> KernelConfig:
    """The float8 product's tile (of :data:`FP8_CONFIGS`) for the kernel's m x n x k, a rule
    in the shape of :func:`default_config` (the planner does not price float8 yet):

    1. 64x64 when a 128x128 tile would be mostly padding (m or n <= 64, or m*n <= 128*128);
       else 128x128 (block scales, ``block``: 128x64 with 32x32 warp tiles).
    2. Fewer tiles than SMs and at least 16 BK steps (long K, decode): serial split-k over
       min(kt // 4, ceil(sms / tiles), 16) splits, summed in split order (reproducible bits).

    >>> c = fp8_config(4096, 16, 4096, 132); (c.bm, c.bn, c.decomposition, c.splits)
    (64, 64, 'splitk_serial', 3)
    >>> fp8_config(8192, 8192, 8192, 132).name
    'sliced_128x128x64_w2x4_s4_g8'
    """
    small = min(m, n) <= 64 or m * n <= 128 * 128
    name = "small" if small else "block" if block else "medium"
    base = FP8_CONFIGS[name]
    tiles = -(-m // base.bm) * -(-n // base.bn)
    kt = -(-k // base.bk)
    if tiles < sm_count and kt >= 16:
        splits = max(2, min(kt // 4, -(-sm_count // tiles), 16))
        return replace(FP8_CONFIGS[name + "_splitk"], splits=splits)
    return base


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
    elif _kind in FP8_KINDS:   # two accumulator sets (the promotion): wgmma N <= 128, sliced + split-k
        # 4 stages: 1,028-1,036 TF/s at 4096^3 / 8192^3 against 956-982 with 6 and 965-1,001
        # with 5 (H200, same run, .dev/fp8_cfg.py's variants, 4b5442e)
        _tiles, _small = [dict(bm=128, stages=4)], [dict(bm=64, stages=8)]
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
    if _kind in FP8_KINDS:     # what pyblasgemm.planner.fp8.sm90_config picks: sliced, parallel split-k
        SM90_CONFIGS[_kind] = tuple(c for c in SM90_CONFIGS[_kind]
                                    if c.cluster == 1 and c.decomposition in ("sliced", "splitk_parallel"))
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

#: the Hopper grouped walk (``decomposition="grouped"``, MODE kGrouped in impls/sm90_gemm.cuh):
#: mixture-of-experts layers with device-side group sizes. ``bn`` is the tile over a group's rows
#: (the tokens), ``bm`` over the output features. Named by the groups they suit:
#: 'small' (<= 64 rows: one consumer warpgroup, 64-row tiles, a deep ring to stream the weights),
#: 'medium' (128-row tiles, 128 features) and 'large' (128 x 256, 3 stages: a fourth stage of
#: 48 KB does not fit beside the group table and the scan's shared arrays under 227 KB).
SM90_GROUPED_CONFIGS: dict[str, dict[str, KernelConfig]] = {
    _kind: {"small": KernelConfig(bm=128, bn=64, bk=64, warps_m=1, warps_n=1, stages=8, family="sm90a",
                                  decomposition=GROUPED),
            "medium": KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=1, stages=5, family="sm90a",
                                   decomposition=GROUPED),
            "large": KernelConfig(bm=256, bn=128, bk=64, warps_m=2, warps_n=1, stages=3, family="sm90a",
                                  decomposition=GROUPED)}
    for _kind in ("f16", "bf16")}
#: bytes of the grouped walk's table of group ends and first tiles in dynamic shared memory
#: (impls/sm90_gemm.cuh's Sm90GroupTable, rounded up to 16) and the groups it holds
SM90_GROUPED_TABLE_BYTES = 6160
SM90_MAX_GROUPS = 512


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
