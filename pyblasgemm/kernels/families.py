"""The kernel-family registry: one entry per family of our GEMM kernels, holding everything
that differs between families, so that no other module asks which family a config is.

A family is one device header (one C++ kernel template) and its host side. Its entry says:

===========================  ===============================================================
what                         attribute / method
===========================  ===============================================================
identity, config names       ``name`` (``KernelConfig.family``), ``title``, ``name_prefix``
where it runs                ``why_not_on(cc)``
config space, tile shapes    ``decompositions``, ``kinds``, ``candidate_tiles(kind)``
constraint predicate         ``threads(cfg)``, ``smem_bytes(cfg, kind)``,
                             ``validate(cfg, problem, kind, max_smem)``, ``any_alignment``
launch geometry and spec     ``ctas_per_sm``, ``geometry(...)``, ``kernel_args(...)``,
                             ``prep_kinds``, ``fusable(kind, cfg, dequantize)``
jit                          ``header``, ``compile_target``, ``kernel_name(...)``,
                             ``reduce_name(...)``, ``prep_name(kind)``
launcher                     ``prepared_launch``, ``bound_launch(...)``
cost model                   ``peak(arch, kind)``, ``layout_sensitive``, ``calibration``,
                             ``wide_tile_pruning``, ``host_bound_rule``
===========================  ===============================================================

The entries (:data:`MMA_SYNC`, :data:`HOPPER`) fill :data:`~pyblasgemm.kernels.config.KERNEL_FAMILIES`
when this module is imported (``pyblasgemm.kernels`` imports it); a config reaches its entry
through :attr:`KernelConfig.kernel_family <pyblasgemm.kernels.config.KernelConfig.kernel_family>`.
The registry lives in ``config.py`` so that the layers below this module (config, geometry,
spec, jit, launch, the planner) look entries up without importing this one: the registry is
filled from the top, never imported from below (no import cycle). docs/design/kernel-families.md
lists what adding a family takes.

Example
-------
>>> from pyblasgemm.kernels.config import KERNEL_FAMILIES, SM90_CONFIGS_BY_TILE
>>> [f.name for f in KERNEL_FAMILIES.values()]        # the order the planner offers their tiles
['sm90a', 'sm80']
>>> fam = SM90_CONFIGS_BY_TILE["f16"][256].kernel_family
>>> fam.title, fam.compile_target, fam.why_not_on((8, 0))[:29]
('the wgmma/TMA kernel', 'sm_90a', 'the wgmma/TMA kernel is built')
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace

from . import jit, mma_sync, sm90
from .config import (DECOMPOSITIONS, DEQUANT_KINDS, FP8_KINDS, FUSED_KINDS, GROUPED, KERNEL_FAMILIES, SHIPPED_CONFIGS, SM90_CONFIGS,
                     SM90_CONFIGS_BY_TILE, SM90_DECOMPOSITIONS, SM90_GROUPED_TABLE_BYTES, SM90_KINDS, SM90_PREP_KINDS,
                     SM90_SMALL_CONFIGS, KernelConfig, sm90_prep_shape)
from .geometry import tile_geometry
from .problem import ACCUMULATE, C_BYTES, ELEM_BYTES, KernelProblem

__all__ = ["KernelFamily", "MmaSyncFamily", "HopperFamily", "MMA_SYNC", "HOPPER", "register",
           "SM90_PREP_MAX_BYTES"]

#: our kernels' batch and split-k run along gridDim.y / gridDim.z, whose hardware limit is 65535
_GRID_YZ_MAX = 65535
#: the Hopper fp32 paths' prepared operands (:func:`~pyblasgemm.kernels.config.sm90_prep_shape`)
#: take at most this many bytes of workspace
SM90_PREP_MAX_BYTES = 4 << 30
#: kinds whose wgmma chains go into fresh registers added to the accumulator by a rounding FADD
#: (3xTF32; a float32 C shows the tensor cores' truncating accumulation): two register sets
_TWO_ACCUMULATOR_KINDS = ("3xtf32", "f16_out32", "bf16_out32") + FP8_KINDS


class KernelFamily(ABC):
    """What one kernel family decides (the registry's entry). Subclasses set the data
    attributes and implement the methods; :func:`register` adds the one instance.

    Data attributes:

    ``name``               ``KernelConfig.family`` of its configs ('sm80', 'sm90a')
    ``title``              how messages name it ('the mma.sync kernel')
    ``name_prefix``        prefix of its configs' names and calibration tile keys ('' or 'sm90a_')
    ``header``             the device header NVRTC compiles (under ``kernels/include``)
    ``compile_target``     None: compiled for the device's own arch (any sm_80+); else the one
                           arch-specific target (``'sm_90a'``) it is compiled for; either way by
                           :mod:`~pyblasgemm.kernels.jit`, cubins kept in the kernel cache
    ``decompositions``     the decompositions its kernel runs
    ``kinds``              the kernel kinds it runs
    ``prep_kinds``         kinds whose operands a prep kernel rewrites first (one launch per operand)
    ``ctas_per_sm``        fixed CTAs per SM of every launch (a persistent grid over a shared
                           memory ring), or None: estimated by the planner, asked of the driver
    ``any_alignment``      runs operands of any element alignment and leading dimension (a
                           scalar operand path): no plan needs to pack its operands
    ``prepared_launch``    ``launch.prepare`` builds its own ``PreparedLaunch`` (the mma.sync
                           kernel's argument list); False: it wraps a :meth:`bound_launch`
    ``layout_sensitive``   the calibration's per-layout factor applies (operands read from
                           shared memory K- or MN-major at different speeds)
    ``calibration``        None: tile efficiencies in the calibration's ``ours`` table (unmeasured
                           tiles extrapolated from the warp tile's MMA density); else the name of
                           its own section (tile efficiencies, host cost, stream-k spread)
    ``wide_tile_pruning``  the planner drops tiles wider than twice ``m`` (measured slower than
                           the model says)
    ``host_bound_rule``    its bound call's host cost is the one ``call_host_us`` measured, so the
                           planner's host-bound rule may pick it
    """

    name: str
    title: str
    name_prefix: str
    header: str
    compile_target: str | None
    decompositions: tuple
    kinds: tuple
    prep_kinds: tuple = ()
    ctas_per_sm: int | None = None
    any_alignment: bool
    prepared_launch: bool
    layout_sensitive: bool
    calibration: str | None
    wide_tile_pruning: bool
    host_bound_rule: bool
    #: the oldest compute capability it runs on and the newest (None: every later one)
    min_cc: tuple = (8, 0)
    max_cc: tuple | None = None

    def __repr__(self) -> str:
        return f"<kernel family {self.name!r}: {self.title}>"

    def why_not_on(self, cc: tuple) -> str:
        """Why it cannot run on a device of compute capability ``cc`` ('' when it can)."""
        cc = tuple(cc)
        if cc < self.min_cc or (self.max_cc is not None and cc > self.max_cc):
            return self._arch_refusal(cc)
        return ""

    def _arch_refusal(self, cc: tuple) -> str:
        (lo, lo_minor), device = self.min_cc, f"(device is sm_{cc[0]}{cc[1]})"
        if self.max_cc == self.min_cc:
            return f"{self.title} runs on compute capability {lo}.{lo_minor} only {device}"
        if self.max_cc is not None:
            return f"{self.title} runs on sm_{lo}{lo_minor} to sm_{self.max_cc[0]}{self.max_cc[1]} only {device}"
        return f"{self.title} needs sm_{lo}{lo_minor} or newer {device}"

    # -- cost model -----------------------------------------------------------------------------

    @abstractmethod
    def peak(self, arch, kind: str) -> float:
        """The chip-wide FLOP/s the cost model scales its tile efficiencies by (``arch``: a
        :class:`~pyblasgemm.planner.arch.ArchSpec`; ``kind``: the mainloop's kernel kind)."""

    # -- config space and constraints ----------------------------------------------------------

    @abstractmethod
    def candidate_tiles(self, kind: str) -> list:
        """The tiles (sliced configs) the planner scores for ``kind``, in its order."""

    @abstractmethod
    def threads(self, cfg: KernelConfig) -> int:
        """Threads per CTA."""

    @abstractmethod
    def smem_bytes(self, cfg: KernelConfig, kind: str) -> int:
        """Dynamic shared memory per CTA."""

    @abstractmethod
    def validate(self, cfg: KernelConfig, problem: KernelProblem | None, kind: str,
                 max_smem: int) -> tuple[bool, str]:
        """(ok, reason): the family's rules for ``cfg`` (on ``problem``, or compiled for ``kind``)."""

    @abstractmethod
    def fusable(self, kind: str, cfg: KernelConfig, dequantize: bool) -> bool:
        """Whether ``cfg`` runs a fused epilogue (bias / activation; with ``dequantize`` an int8
        product scaled to float) for ``kind``."""

    # -- launch geometry and arguments ---------------------------------------------------------

    @abstractmethod
    def geometry(self, problem: KernelProblem, cfg: KernelConfig, sm_count: int, occupancy: int) -> dict:
        """Grid, splits, k-steps per split, stream-k tiles and workspace bytes (``ws_bytes``)."""

    @abstractmethod
    def kernel_args(self, problem: KernelProblem, cfg: KernelConfig, g: dict) -> tuple:
        """(GEMM kernel argument values, split-k reduce kernel's or None) with geometry ``g``."""

    # -- jit ------------------------------------------------------------------------------------

    @abstractmethod
    def kernel_name(self, cfg: KernelConfig, kind: str, transa: str, transb: str,
                    accumulate: str | None, vec: bool, epi: int) -> str:
        """The C++ name expression of the GEMM kernel instantiation."""

    @abstractmethod
    def reduce_name(self, cfg: KernelConfig, kind: str, accumulate: str | None, epi: int) -> str:
        """The split-k reduction kernel's name expression."""

    def prep_name(self, kind: str) -> str | None:
        """The operand-prep kernel's name expression for ``kind`` (None: no prep)."""
        return None

    # -- launcher -------------------------------------------------------------------------------

    @abstractmethod
    def bound_launch(self, problem: KernelProblem, spec, kern, red, dev_id: int, epilogue: tuple):
        """The bound launch of ``problem``'s class with ``spec`` and the compiled kernels."""

    def grouped_launch(self, kind: str, cfg: KernelConfig, vec: bool, epilogue: tuple):
        """The persistent grouped launch of ``cfg`` (``decomposition == 'grouped'``) for
        ``kind``: this family's walk over the problems (``vec``: the 16-byte operand path;
        ``epilogue``: ``(EPI code, bias axis)``)."""
        raise ValueError(f"{self.title} has no grouped launch ({cfg.name})")


class MmaSyncFamily(KernelFamily):
    """The mma.sync kernel (impls/sm80_gemm.cuh): cp.async ring, any sm_80+ device, every kind,
    every decomposition, a scalar operand path for unaligned operands."""

    name = "sm80"
    title = "the mma.sync kernel"
    name_prefix = ""
    header = jit.KERNEL_HEADER
    compile_target = None
    decompositions = DECOMPOSITIONS + (GROUPED,)
    kinds = tuple(ACCUMULATE)
    any_alignment = True
    prepared_launch = True
    layout_sensitive = True
    calibration = None
    wide_tile_pruning = False
    host_bound_rule = True

    def _arch_refusal(self, cc: tuple) -> str:
        return f"our mma.sync kernels need sm_80 or newer (device is sm_{cc[0]}{cc[1]})"

    def peak(self, arch, kind):
        return arch.mma_sync_peak(kind)

    def candidate_tiles(self, kind: str) -> list:
        return [replace(c, decomposition="sliced", splits=0) for c in SHIPPED_CONFIGS.get(kind, ())]

    def threads(self, cfg: KernelConfig) -> int:
        return 32 * cfg.warps_m * cfg.warps_n

    def smem_bytes(self, cfg: KernelConfig, kind: str) -> int:
        """max(cp.async ring, fp32 epilogue staging tile)."""
        ring = cfg.stages * (cfg.bm + cfg.bn) * cfg.bk_bytes(kind)
        stage = cfg.bn * (cfg.bm + 4) * 4
        return max(ring, stage)

    def validate(self, cfg, problem, kind, max_smem):
        c = cfg
        if c.cluster != 1:
            return False, f"clusters are the Hopper kernel's (cluster={c.cluster} with family 'sm80')"
        if c.consumer != "wgmma":
            return False, f"consumer={c.consumer!r} is the Hopper kernel's (family 'sm90a')"

        eb, cb = ELEM_BYTES[kind], C_BYTES[kind]
        if c.decomposition not in self.decompositions:
            return False, f"decomposition {c.decomposition!r} not in {self.decompositions}"
        if c.bm not in (64, 128, 256) or c.bn not in (64, 128, 256):
            return False, f"bm, bn must be 64, 128 or 256 (got {c.bm}x{c.bn})"
        if c.bk_bytes(kind) not in (64, 128):
            return False, f"bk*sizeof(elem) must be 64 or 128 bytes (bk={c.bk}, {eb}-byte {kind})"
        if c.warps_m * c.warps_n not in (4, 8):
            return False, f"warps_m*warps_n must be 4 or 8 (got {c.warps_m}x{c.warps_n})"
        wtm, wtn = c.bm // c.warps_m, c.bn // c.warps_n
        if c.bm % c.warps_m or c.bn % c.warps_n or wtm % 16 or wtn % 16:
            return False, f"warp tile {c.bm}/{c.warps_m} x {c.bn}/{c.warps_n} must be multiples of 16"
        if wtm * wtn > 64 * 64:
            return False, f"warp tile {wtm}x{wtn} exceeds 64x64 (accumulators would spill)"
        if not 3 <= c.stages <= 5:
            return False, f"stages must be 3..5 (got {c.stages})"
        t = c.threads
        for rows, cols_b, what in ((c.bm, c.bk_bytes(kind), "A"), (c.bn, c.bk_bytes(kind), "B")):
            if (rows * cols_b // 16) % t:
                return False, f"{what} tile of {rows * cols_b // 16} 16-byte chunks does not divide over {t} threads"
        for mn in (c.bm, c.bn):
            if mn * eb // 16 not in (2, 4, 8, 16, 32):
                return False, f"an M/N-contiguous smem row of {mn} {eb}-byte elements is not 2..32 chunks"
        if (c.bm * c.bn // (16 // cb)) % t or (c.bm * c.bn // 4) % t:
            return False, "epilogue vectors do not divide over the threads"
        if c.smem_bytes(kind) > max_smem:
            return False, f"needs {c.smem_bytes(kind)} B shared memory > {max_smem} B available"
        if c.decomposition.startswith("splitk") and not (c.splits == 0 or 2 <= c.splits <= _GRID_YZ_MAX):
            return False, f"split-k needs splits = 0 (auto) or >= 2 (got {c.splits})"
        if c.decomposition in ("sliced", "streamk", "hybrid") and c.splits not in (0, 1):
            return False, f"{c.decomposition} takes no splits (got {c.splits})"
        if c.group_m < 1:
            return False, "group_m must be >= 1"
        if problem is None:
            return True, ""
        if problem.acc not in ACCUMULATE[kind]:
            return False, f"accumulate {problem.acc!r} not available for {kind} (choose from {ACCUMULATE[kind]})"
        if problem.transa not in "NT" or problem.transb not in "NT" or len(problem.transa + problem.transb) != 2:
            return False, f"transa/transb must be 'N' or 'T' (got {problem.transa!r}, {problem.transb!r})"
        tiles = -(-problem.m // c.bm) * -(-problem.n // c.bn)
        if tiles * problem.batch >= 2**31:
            return False, f"{tiles * problem.batch} tiles exceed the 2^31 grid limit"
        if c.decomposition in ("sliced", "splitk_serial", "splitk_parallel") and problem.batch > _GRID_YZ_MAX:
            return False, f"batch {problem.batch} > {_GRID_YZ_MAX} (grid.z); use streamk/hybrid"
        if max(problem.m, problem.n, problem.k) >= 2**31:
            return False, "m, n, k must be < 2^31"
        return True, ""

    def fusable(self, kind, cfg, dequantize):
        # the store is staged through shared memory: the epilogue adds no registers to the
        # mainloop's (CI compiles the fused variants spill-free)
        return kind in DEQUANT_KINDS if dequantize else kind in FUSED_KINDS

    def geometry(self, problem, cfg, sm_count, occupancy):
        g = tile_geometry(problem, cfg, sm_count, occupancy)
        g["ws_bytes"] = g["ws_slots"] * cfg.bm * cfg.bn * 4
        return g

    def kernel_args(self, problem, cfg, g):
        return mma_sync.kernel_args(problem, cfg, g)

    def kernel_name(self, cfg, kind, transa, transb, accumulate, vec, epi):
        return jit.kernel_name(cfg, kind, transa, transb, accumulate, vec, epi)

    def reduce_name(self, cfg, kind, accumulate, epi):
        return (f"pyblasgemm::splitk_reduce_kernel<{jit.kind_struct(kind, accumulate)}, {cfg.bm}, {cfg.bn}"
                f"{f', {epi}' if epi else ''}>")

    def bound_launch(self, problem, spec, kern, red, dev_id, epilogue):
        return mma_sync.BoundLaunch(problem, spec, kern, red, dev_id, epilogue)

    def grouped_launch(self, kind, cfg, vec, epilogue):
        """The table walk of impls/sm80_gemm.cuh (MODE kGrouped) and its one-launch form."""
        from .grouped import GroupedLaunch

        return GroupedLaunch(kind, "N", "N", vec, epilogue, cfg)


class HopperFamily(KernelFamily):
    """The Hopper kernel (impls/sm90_gemm.cuh): TMA ring, wgmma (or mma.sync) consumer
    warpgroups, a persistent grid of one CTA per SM, sm_90a only; fp32 operands pass a prep
    kernel (impls/sm90_tf32_prep.cuh)."""

    name = "sm90a"
    title = "the wgmma/TMA kernel"
    name_prefix = "sm90a_"
    header = jit.SM90_HEADER
    #: wgmma and setmaxnreg exist only on the arch-specific sm_90a, which CuPy cannot build
    compile_target = jit.SM90_ARCH
    decompositions = SM90_DECOMPOSITIONS
    kinds = SM90_KINDS
    prep_kinds = SM90_PREP_KINDS
    #: one CTA per SM: the TMA ring takes most of shared memory, and the grid is persistent
    ctas_per_sm = 1
    any_alignment = False
    prepared_launch = False
    #: wgmma reads K- and MN-major operands from shared memory alike
    layout_sensitive = False
    calibration = "sm90"
    wide_tile_pruning = True
    #: the Hopper launchers cost more host time (~15 µs) than call_host_us measured (mma.sync's)
    host_bound_rule = False
    min_cc = max_cc = (9, 0)

    def _arch_refusal(self, cc: tuple) -> str:
        return (f"the wgmma/TMA kernel is built for sm_90a, which runs on compute capability 9.0 "
                f"only (device is sm_{cc[0]}{cc[1]})")

    def peak(self, arch, kind):
        return arch.best_peak(kind)        # wgmma: the family's best instruction

    def candidate_tiles(self, kind: str) -> list:
        tiles = list(SM90_CONFIGS_BY_TILE.get(kind, {}).values())
        tiles += [c for c in SM90_CONFIGS.get(kind, ()) if c.cluster > 1]
        tiles += list(SM90_SMALL_CONFIGS.get(kind, {}).values())
        return tiles

    def threads(self, cfg: KernelConfig) -> int:
        return 128 * (1 + cfg.warps_m)   # producer warpgroup + warps_m consumer warpgroups

    def smem_bytes(self, cfg: KernelConfig, kind: str) -> int:
        """The TMA ring (128 bytes of K per row of both tiles per stage) + the epilogue's
        TMA-store staging (2 x 8 KB per consumer warpgroup) + mbarriers + 1 KB alignment."""
        parts = 2 if kind == "3xtf32" else 1     # a 3xTF32 stage holds big and small halves
        table = SM90_GROUPED_TABLE_BYTES if cfg.decomposition == GROUPED else 0   # the grouped walk's groups
        return cfg.stages * (cfg.bm + cfg.bn) * 128 * parts + 16384 * cfg.warps_m + 16 * cfg.stages + 1024 + table

    def validate(self, cfg, problem, kind, max_smem):
        """The Hopper kernel's rules (impls/sm90_gemm.cuh): tile, pipeline, and what TMA and s8
        wgmma need of the operands. Anything refused here runs on the mma.sync kernel or cuBLAS."""
        c = cfg
        if kind not in self.kinds:
            return False, f"the Hopper kernel runs {self.kinds} (not {kind}: that is the mma.sync kernel's)"
        if c.decomposition == GROUPED:
            return _validate_sm90_grouped(c, kind, max_smem)
        if c.decomposition not in self.decompositions:
            return False, (f"the Hopper kernel's persistent scheduler runs {self.decompositions} "
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
        if kind in self.prep_kinds:
            return _validate_sm90_prep(c, p)
        if p.acc not in ("f32", "s32"):
            return False, f"the Hopper kernel accumulates in fp32/s32 (accumulate={p.acc!r} is mma.sync's)"
        if p.transa not in ("N", "T") or p.transb not in ("N", "T"):
            return False, f"transa/transb must be 'N' or 'T' (got {p.transa!r}, {p.transb!r})"
        if kind in DEQUANT_KINDS and (p.transa, p.transb) != ("T", "N"):
            return False, (f"{kind} wgmma reads K-major operands only: needs transa='T', transb='N' "
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

    def fusable(self, kind, cfg, dequantize):
        # wgmma consumers only; stream-k / hybrid on 256-wide tiles spill 12-300 bytes per
        # thread when fused (ptxas: 128 accumulators beside the stream-k walker's state)
        return (cfg.consumer == "wgmma" and (kind in DEQUANT_KINDS if dequantize else kind in FUSED_KINDS)
                and not (cfg.decomposition in ("streamk", "hybrid") and cfg.bm == 256))

    def geometry(self, problem, cfg, sm_count, occupancy):
        """A persistent grid of at most ``sm_count`` CTAs for every decomposition; split-k
        partials are whole fp32/s32 matrices, one per split. The fp32 kinds run the prepared
        "TN" problem (K tripled for 3xTF32): geometry of that, ``prep_bytes`` of prepared
        operands added to ``ws_bytes``."""
        if problem.kind in self.prep_kinds:
            g = self._geometry(sm90.prepared_problem(problem), cfg, sm_count)
            g["prep_bytes"] = sm90_prep_shape(problem)[2]
            g["ws_bytes"] += g["prep_bytes"]
            return g
        return self._geometry(problem, cfg, sm_count)

    @staticmethod
    def _geometry(p: KernelProblem, c: KernelConfig, sm_count: int) -> dict:
        g = tile_geometry(p, c, sm_count, 1)
        if c.decomposition == "sliced" and c.cluster > 1:
            # units of `cluster` tile rows along n (the pair shares its m-side operand)
            units = -(-(-(-p.n // c.bn)) // c.cluster) * -(-p.m // c.bm) * p.batch
            # at least one cluster, even when a test's sm_count override is below its size
            g.update(grid=(c.cluster * max(1, min(units, sm_count // c.cluster)), 1, 1))
        elif c.decomposition == "sliced":
            g.update(grid=(min(g["tiles"], sm_count), 1, 1))
        elif c.decomposition == "splitk_parallel":
            g.update(grid=(min(g["tiles"] * g["splits"], sm_count), 1, 1), ws_slots=0)
            g["ws_bytes"] = g["splits"] * p.batch * p.m * p.n * 4
            return g
        g["ws_bytes"] = g["ws_slots"] * c.bm * c.bn * 4
        return g

    def kernel_args(self, problem, cfg, g):
        if problem.kind in self.prep_kinds:
            # the GEMM runs the prepared "TN" problem; its geometry holds no prep bytes
            return sm90.kernel_args(sm90.prepared_problem(problem), cfg,
                                    dict(g, ws_bytes=g["ws_bytes"] - g["prep_bytes"]))
        return sm90.kernel_args(problem, cfg, g)

    def kernel_name(self, cfg, kind, transa, transb, accumulate, vec, epi):
        return jit.sm90_kernel_name(cfg, kind, transa, transb, epi)

    def reduce_name(self, cfg, kind, accumulate, epi):
        return f"pyblasgemm::sm90_splitk_reduce<pyblasgemm::{jit.SM90_KIND[kind]}{f', {epi}' if epi else ''}>"

    def prep_name(self, kind):
        return jit.SM90_PREP_NAME.get(kind)

    def bound_launch(self, problem, spec, kern, red, dev_id, epilogue):
        if problem.kind in self.prep_kinds:
            prep = jit.get_prep_kernel(spec.config, problem.kind, problem.transa, problem.transb)
            return sm90.Sm90PrepLaunch(problem, spec, kern, red, prep, dev_id)
        return sm90.Sm90Launch(problem, spec, kern, red, dev_id, epilogue)

    def grouped_launch(self, kind, cfg, vec, epilogue):
        """The Hopper grouped walk (MODE kGrouped of impls/sm90_gemm.cuh; device-side sizes
        only; TMA reads every operand, so there is no scalar path to choose)."""
        return sm90.Sm90GroupedLaunch(kind, cfg, epilogue)


def _sm90_grouped_static_smem(threads: int) -> int:
    """The grouped walk's static shared memory beside the dynamic: scan_groups' arrays
    (impls/grouped_offsets.cuh: 8 bytes a thread and ~0.4 KB of scratch) in ptxas's 1 KB
    units (ptxas: 3072 bytes for 256 threads)."""
    return -(-(8 * threads + 8 * 32 + 4 * 32 + 16) // 1024) * 1024


def _validate_sm90_grouped(c: KernelConfig, kind: str, max_smem: int) -> tuple[bool, str]:
    """The Hopper grouped walk's rules (MODE kGrouped, impls/sm90_gemm.cuh): 16-bit operands,
    wgmma consumers, no cluster, a tile of the shipped shapes, the ring, the group table and the
    scan's static arrays under the shared-memory limit. Its operands' rules (TMA alignment, the
    group count) are checked by :class:`~pyblasgemm.kernels.sm90.Sm90GroupedLaunch` per call."""
    if kind not in ("f16", "bf16"):
        return False, f"the Hopper grouped walk runs f16 and bf16 (not {kind})"
    if (c.warps_m, c.warps_n) not in ((1, 1), (2, 1)) or c.bn != 64 * c.warps_m or c.bm not in (64, 128, 192, 256):
        return False, (f"Hopper grouped tile: bn must be 64 per consumer warpgroup and bm 64/128/192/256 "
                       f"(got {c.bm}x{c.bn}, warps {c.warps_m}x{c.warps_n})")
    if c.bk * ELEM_BYTES[kind] != 128 or not 2 <= c.stages <= 16:
        return False, f"Hopper grouped tile: bk of 128 bytes and 2..16 stages (got bk={c.bk}, stages={c.stages})"
    if c.cluster != 1 or c.consumer != "wgmma" or c.splits not in (0, 1):
        return False, "the Hopper grouped walk runs wgmma consumers without clusters or splits"
    need = c.smem_bytes(kind) + _sm90_grouped_static_smem(128 * (1 + c.warps_m))
    if need > max_smem:
        return False, f"needs {need} B shared memory (ring, group table, scan) > {max_smem} B available"
    return True, ""


def _validate_sm90_prep(c: KernelConfig, p: KernelProblem) -> tuple[bool, str]:
    """The Hopper fp32 paths: the prep kernel reads any layout, leading dimension and
    alignment, so only the size of its workspace and of the tripled K are bounded."""
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


def register(*families: KernelFamily) -> None:
    """Add families to the registry, in the order the planner offers their tiles; a name
    already taken is a ValueError."""
    for fam in families:
        if fam.name in KERNEL_FAMILIES:
            raise ValueError(f"kernel family {fam.name!r} is registered already ({KERNEL_FAMILIES[fam.name]})")
        KERNEL_FAMILIES[fam.name] = fam


MMA_SYNC = MmaSyncFamily()
HOPPER = HopperFamily()
# the Hopper kernel's tiles are offered first on a device that runs both (the planner's order)
register(HOPPER, MMA_SYNC)
