"""The grouped launch: many independent GEMMs of different sizes in one persistent launch of
the mma.sync kernel (``MODE == kGrouped`` in impls/sm80_gemm.cuh).

The host writes one 128-byte row per problem (:data:`PROBLEM_ROW`, the ``GroupedProblem``
struct of params.cuh) into a device-side table; the grid (at most one CTA per SM and per tile)
walks the tiles of all problems, problem after problem, and each CTA finds a tile's problem by
binary search over the rows' ``tile_begin``. Every problem shares the kind, the layout
('N'/'T' of A and B), the operand path and the fused epilogue of the launch; sizes, pointers,
leading dimensions, alpha and beta are per problem.

Example::

    launch = GroupedLaunch("f16", "N", "N", vec=True)
    launch([GroupedProblem(a0, b0, c0, 128, 64, 256, lda=128, ldb=256, ldc=128), ...])
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .config import KernelConfig, SHIPPED_CONFIGS
from .mma_sync import BIAS_MODE

__all__ = ["GROUPED_CONFIGS", "PROBLEM_ROW", "GroupedProblem", "GroupedLaunch", "pack_table"]

#: kind -> the tile the grouped launch runs. 16-bit: 128 x 128 with 128-byte K rows over 8 warps
#: (the 4-warp workhorse spills 36 B in the grouped walk: its problem fields come from global
#: memory and stay live beside 128 accumulators per thread; 8 warps: 64 per thread, 193
#: registers, no spill); s8: its workhorse (189 registers).
GROUPED_CONFIGS = {
    "f16": KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=3, decomposition="grouped"),
    "bf16": KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=3, decomposition="grouped"),
    "s8": replace(SHIPPED_CONFIGS["s8"][0], decomposition="grouped"),
}

#: params.cuh's GroupedProblem, field by field (offsets fixed: the device reads this layout)
PROBLEM_ROW = np.dtype({
    "names": ["A", "B", "C", "bias", "pre", "scale_m", "scale_n", "lda", "ldb", "ldc", "m", "n", "k",
              "tile_begin", "alpha", "beta", "ialpha", "ibeta", "c_vec", "bias_mode"],
    "formats": ["<u8"] * 7 + ["<i8"] * 3 + ["<i4"] * 4 + ["<f4"] * 2 + ["<i4"] * 4,
    "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116],
    "itemsize": 128,
})


@dataclass(frozen=True)
class GroupedProblem:
    """One problem of a grouped launch: column-major ``C (m x n) = alpha·op(A)·op(B) + beta·C``
    (then the launch's epilogue) with the launch's transposes; pointers are device addresses."""

    a_ptr: int
    b_ptr: int
    c_ptr: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    alpha: float | int = 1
    beta: float | int = 0
    bias_ptr: int = 0
    scale_m_ptr: int = 0
    scale_n_ptr: int = 0


def pack_table(problems, config: KernelConfig, is_int: bool, out_bytes: int, bias_mode: int):
    """(the table as a NumPy array of :data:`PROBLEM_ROW`, total tiles): problems without tiles
    (m or n = 0) are left out; ``tile_begin`` numbers the tiles problem after problem.

    >>> cfg = GROUPED_CONFIGS["f16"]
    >>> rows, tiles = pack_table([GroupedProblem(16, 32, 64, 200, 100, 8, 200, 8, 200),
    ...                           GroupedProblem(16, 32, 64, 0, 100, 8, 1, 8, 1),
    ...                           GroupedProblem(16, 32, 64, 128, 300, 8, 128, 8, 128)], cfg, False, 2, 0)
    >>> rows["tile_begin"].tolist(), rows["m"].tolist(), tiles       # 2 x 1, then 1 x 3 tiles
    ([0, 2], [200, 128], 5)
    """
    kept = [p for p in problems if p.m > 0 and p.n > 0]
    rows = np.zeros(len(kept), PROBLEM_ROW)
    begin = 0
    ov = 16 // out_bytes
    for i, p in enumerate(kept):
        r = rows[i]
        r["A"], r["B"], r["C"], r["bias"] = p.a_ptr, p.b_ptr, p.c_ptr, p.bias_ptr
        r["scale_m"], r["scale_n"] = p.scale_m_ptr, p.scale_n_ptr
        r["lda"], r["ldb"], r["ldc"], r["m"], r["n"], r["k"] = p.lda, p.ldb, p.ldc, p.m, p.n, p.k
        r["tile_begin"] = begin
        if is_int:
            r["ialpha"], r["ibeta"] = int(p.alpha), int(p.beta)
        else:
            r["alpha"], r["beta"] = float(p.alpha), float(p.beta)
        r["c_vec"] = int(p.c_ptr % 16 == 0 and p.ldc % ov == 0)
        r["bias_mode"] = bias_mode
        begin += -(-p.m // config.bm) * -(-p.n // config.bn)
    if begin >= 2**31:
        raise ValueError(f"grouped launch: {begin} tiles exceed 2^31")
    return rows, begin


class GroupedLaunch:
    """One compiled grouped kernel: (kind, transa, transb, operand path, epilogue) on the
    current device. Call it with a list of :class:`GroupedProblem`; it writes the table to the
    device (a copy from pageable memory: the host buffer is free when it returns) and
    launches once on CuPy's current stream.

    ``epilogue``: (EPI, bias axis 'm' / 'n' / None) as for
    :func:`~pyblasgemm.kernels.launch.bind`; a dequantizing EPI gives s8 problems float scales
    and ``out_bytes``-wide results (16-byte aligned C with whole 16-byte columns: checked)."""

    def __init__(self, kind: str, transa: str, transb: str, vec: bool, epilogue: tuple = (0, None)):
        import cupy

        from .jit import EPI_DEQUANT, get_kernels

        if kind not in GROUPED_CONFIGS:
            raise ValueError(f"grouped launch: kind {kind!r} is not one of {tuple(GROUPED_CONFIGS)}")
        self.kind, self.config, self.epilogue = kind, GROUPED_CONFIGS[kind], epilogue
        self.dequant = bool(epilogue[0] & EPI_DEQUANT)
        self.kern, _ = get_kernels(self.config, kind, transa, transb, None, vec, epi=epilogue[0])
        self.smem = self.config.smem_bytes(kind)
        dev = cupy.cuda.Device()
        from .launch import _occupancy

        self.ctas = dev.attributes["MultiProcessorCount"] * _occupancy(self.kern, self.config.threads, self.smem)

    def __call__(self, problems, out_bytes: int) -> int:
        """Launch ``problems`` on CuPy's current stream; returns the number of tiles walked
        (0: nothing launched)."""
        import cupy

        is_int = self.kind == "s8" and not self.dequant
        if self.dequant:
            ov = 16 // out_bytes
            for i, p in enumerate(problems):
                if p.m and p.n and (p.c_ptr % 16 or p.ldc % ov):
                    raise ValueError(f"grouped launch: problem {i}'s C (0x{p.c_ptr:x}, ldc={p.ldc}) is not "
                                     f"16-byte aligned in whole 16-byte columns")
        rows, tiles = pack_table(problems, self.config, is_int, out_bytes, BIAS_MODE[self.epilogue[1]])
        if tiles == 0:
            return 0
        table = cupy.empty(rows.nbytes, np.uint8)
        table.set(rows.view(np.uint8))      # on this stream, before the launch
        # A: the table, m: its row count, dp_tiles: the tiles (impls/sm80_gemm.cuh, kGrouped)
        i32, u64 = np.int32, np.uint64
        args = (u64(table.data.ptr), u64(0), u64(0), u64(0), u64(0), i32(len(rows)), i32(0), i32(0),
                np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0), i32(1),
                np.float32(0), np.float32(0), i32(0), i32(0), i32(0), i32(self.config.group_m), i32(1),
                i32(0), i32(tiles), i32(0), u64(0), u64(0), i32(0), u64(0), u64(0))
        self.kern((min(tiles, self.ctas),), (self.config.threads,), args, shared_mem=self.smem)
        # (CuPy's pool hands table's memory out again only to work ordered after the launch)
        return tiles
