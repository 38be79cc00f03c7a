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
    launch(dict(A=[a0, a1], B=[b0, b1], C=[c0, c1], m=[128, 64], ...), out_bytes=2)
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .config import KernelConfig, SHIPPED_CONFIGS
from .mma_sync import BIAS_MODE

__all__ = ["GROUPED_CONFIGS", "PROBLEM_ROW", "COLUMNS", "GroupedLaunch", "pack_table"]

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


#: the per-problem columns a table is built from (arrays or sequences of one length)
COLUMNS = ("A", "B", "C", "bias", "scale_m", "scale_n", "lda", "ldb", "ldc", "m", "n", "k")


def pack_table(cols: dict, config: KernelConfig, is_int: bool, out_bytes: int, bias_mode: int,
               alpha=1, beta=0):
    """(the table as a NumPy array of :data:`PROBLEM_ROW`, total tiles) from per-problem
    columns (:data:`COLUMNS`; vectorized, no Python loop over problems): problems without
    tiles (m or n = 0) are left out; ``tile_begin`` numbers the tiles problem after problem.
    ``alpha``, ``beta``: one pair for every problem.

    >>> cfg = GROUPED_CONFIGS["f16"]
    >>> cols = dict(A=[16, 16, 16], B=[32] * 3, C=[64] * 3, bias=[0] * 3, scale_m=[0] * 3, scale_n=[0] * 3,
    ...             lda=[200, 1, 128], ldb=[8] * 3, ldc=[200, 1, 128], m=[200, 0, 128], n=[100, 100, 300], k=[8] * 3)
    >>> rows, tiles = pack_table(cols, cfg, False, 2, 0)
    >>> rows["tile_begin"].tolist(), rows["m"].tolist(), tiles       # 2 x 1, then 1 x 3 tiles
    ([0, 2], [200, 128], 5)
    """
    m, n = np.asarray(cols["m"], np.int64), np.asarray(cols["n"], np.int64)
    keep = (m > 0) & (n > 0)
    tiles = np.where(keep, -(-m // config.bm) * -(-n // config.bn), 0)
    total = int(tiles.sum())
    if total >= 2**31:
        raise ValueError(f"grouped launch: {total} tiles exceed 2^31")
    rows = np.zeros(int(keep.sum()), PROBLEM_ROW)
    for name in COLUMNS:
        rows[name] = np.asarray(cols[name], PROBLEM_ROW.fields[name][0])[keep]
    rows["tile_begin"] = (np.cumsum(tiles) - tiles)[keep]
    if is_int:
        rows["ialpha"], rows["ibeta"] = int(alpha), int(beta)
    else:
        rows["alpha"], rows["beta"] = float(alpha), float(beta)
    ov = 16 // out_bytes
    rows["c_vec"] = (rows["C"] % 16 == 0) & (rows["ldc"] % ov == 0)
    rows["bias_mode"] = bias_mode
    return rows, total


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

    def __call__(self, cols: dict, out_bytes: int, alpha=1, beta=0) -> int:
        """Launch the problems of ``cols`` (:data:`COLUMNS`, column-major, the launch's
        transposes) on CuPy's current stream; returns the number of tiles walked (0: nothing
        launched)."""
        import cupy

        is_int = self.kind == "s8" and not self.dequant
        if self.dequant:
            c, ldc = np.asarray(cols["C"], np.uint64), np.asarray(cols["ldc"], np.int64)
            live = (np.asarray(cols["m"]) > 0) & (np.asarray(cols["n"]) > 0)
            bad = live & ((c % 16 != 0) | (ldc % (16 // out_bytes) != 0))
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"grouped launch: problem {i}'s C (0x{int(c[i]):x}, ldc={int(ldc[i])}) is "
                                 f"not 16-byte aligned in whole 16-byte columns")
        rows, tiles = pack_table(cols, self.config, is_int, out_bytes, BIAS_MODE[self.epilogue[1]], alpha, beta)
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
