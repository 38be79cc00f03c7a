"""The grouped launch: many independent GEMMs of different sizes in one persistent launch of
the mma.sync kernel (``MODE == kGrouped`` in impls/sm80_gemm.cuh).

The host writes one 128-byte row per problem (:data:`PROBLEM_ROW`, the ``GroupedProblem``
struct of params.cuh) into a device-side table; the grid (at most one CTA per SM and per tile)
walks the tiles of all problems, problem after problem, and each CTA finds a tile's problem by
binary search over the rows' ``tile_begin``. Every problem shares the kind, the layout
('N'/'T' of A and B), the operand path and the fused epilogue of the launch; sizes, pointers,
leading dimensions, alpha and beta are per problem.

With the expert form's end offsets on the device (:meth:`GroupedLaunch.launch_offsets`), or the
masked layout's valid row counts (``group_rows`` > 0), the problems are found there: up to :data:`FUSED_MAX_GROUPS` groups every CTA of one launch scans
the offsets into shared memory (impls/grouped_fused.cuh); past that a table kernel writes the
table first (impls/grouped_offsets.cuh).

Example::

    launch = GroupedLaunch("f16", "N", "N", vec=True)
    launch(dict(A=[a0, a1], B=[b0, b1], C=[c0, c1], m=[128, 64], ...), out_bytes=2)
"""
from __future__ import annotations

import ctypes
import threading

from dataclasses import replace

import numpy as np

from .config import FP8_KINDS, KernelConfig, SHIPPED_CONFIGS
from .driver import copy_to_device_async, device_pointer, function, launch_kernel, record_event, stream, stream_handle
from .jit import raw_function
from .mma_sync import BIAS_MODE, _arg_ctypes, _ArgPack

#: pinned host buffers per stream the tables go through (a call waits only for the copy made
#: this many calls before it)
PINNED_RING = 4
#: the grouped launch's kernel arguments besides the table: everything else is per problem
_BLANK = dict(a=0, b=0, c=0, ws=0, flags=0, m=0, n=0, k=0, lda=0, ldb=0, ldc=0, sa=0, sb=0, sc=0, batch=1,
              alpha=0.0, beta=0.0, ialpha=0, ibeta=0, c_vec=0, group_m=8, splits=1, kt_per_split=0,
              dp_tiles=0, sk_tiles=0, bias=0, pre=0, bias_mode=0, scale_m=0, scale_n=0)

__all__ = ["GROUPED_CONFIGS", "GROUPED_SMALL_CONFIGS", "SMALL_GROUP_ROWS", "grouped_config", "hopper_grouped_config", "PROBLEM_ROW",
           "COLUMNS", "GroupedLaunch", "pack_table", "OFFSETS_FIELDS", "offsets_kernel", "FUSED_FIELDS",
           "FUSED_MAX_GROUPS", "fused_kernel_name"]

#: kind -> the tile the grouped launch runs. 16-bit: 128 x 128 with 128-byte K rows over 8 warps
#: (the 4-warp workhorse spills 36 B in the grouped walk: its problem fields come from global
#: memory and stay live beside 128 accumulators per thread; 8 warps: 64 per thread, 193
#: registers, no spill); s8: its workhorse (189 registers).
GROUPED_CONFIGS = {
    "f16": KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=3, decomposition="grouped"),
    "bf16": KernelConfig(bm=128, bn=128, bk=64, warps_m=2, warps_n=4, stages=3, decomposition="grouped"),
    "s8": replace(SHIPPED_CONFIGS["s8"][0], decomposition="grouped"),
}
#: float8 (sm_89+): the s8 kind's tile and operand path (the m16n8k32 fragments of float8 and
#: int8 are the same bytes, kernels/fp8.py), always with the dequantizing store; 204 registers,
#: no spill (tests/test_grouped_fused_compile.py)
GROUPED_CONFIGS.update({kind: GROUPED_CONFIGS["s8"] for kind in FP8_KINDS})

#: kind -> the tile for groups of few rows (mixture-of-experts layers at small batch: each
#: expert's tokens are the kernel's n). A 128-wide n tile idles past the group's rows and the
#: launch is bound by streaming the experts' weights (op(A)); 64-wide n tiles of 4 stages
#: (96 KB) with 8 warps of 32x32 warp tiles in at most 128 registers (124; launch bounds: 2 CTAs
#: per SM) keep two CTAs per SM, twice the weight bytes in flight of the one 128x128 CTA.
#: H100, the kernel alone (bench/grouped_tiles.py, grouped_tiles_h100_2026-11-28_b60283a.json):
#: 64 experts of <= 64 tokens, k = n = 1024: 69.9 µs against 86.0 for 128x128 (4-warp 128x64
#: 67.2, 256x64 with one CTA 67.0, 64x64 with three 75.5); 128 experts, 2048: 407 against 529
#: (256x64 406, 4-warp 128x64 420); mean 62 rows: 76.8 against 97.5 (the best of the five).
GROUPED_SMALL_CONFIGS = {
    "f16": KernelConfig(bm=128, bn=64, bk=64, warps_m=4, warps_n=2, stages=4, decomposition="grouped"),
    "bf16": KernelConfig(bm=128, bn=64, bk=64, warps_m=4, warps_n=2, stages=4, decomposition="grouped"),
}
#: a grouped launch whose groups average at most this many rows (the kernel's n) takes
#: :data:`GROUPED_SMALL_CONFIGS`' tile
SMALL_GROUP_ROWS = 64


def grouped_config(kind: str, mean_rows: float) -> KernelConfig:
    """The grouped launch's tile for ``kind`` when its groups average ``mean_rows`` rows (the
    kernel's n; with the sizes on the device the host knows only the total and the group
    count, so the mean is what every caller can give).

    >>> grouped_config("bf16", 31.0).name, grouped_config("bf16", 500.0).name
    ('grouped_128x64x64_w4x2_s4_g8', 'grouped_128x128x64_w2x4_s3_g8')
    """
    if mean_rows <= SMALL_GROUP_ROWS and kind in GROUPED_SMALL_CONFIGS:
        return GROUPED_SMALL_CONFIGS[kind]
    return GROUPED_CONFIGS[kind]

#: The Hopper grouped walk (impls/sm90_gemm.cuh, MODE kGrouped; device-side sizes only): the
#: tile by the groups' mean rows, at most HOPPER_SMALL_ROWS: 64-row tiles (one consumer
#: warpgroup, 8 stages), at most HOPPER_MEDIUM_ROWS: 128 x 128, else 128 x 256.
HOPPER_SMALL_ROWS = 64
HOPPER_MEDIUM_ROWS = 512


def hopper_grouped_config(kind: str, mean_rows: float) -> KernelConfig | None:
    """The Hopper grouped walk's tile for ``kind`` when its groups average ``mean_rows`` rows,
    or None where the walk has no tile for the kind.

    >>> hopper_grouped_config("bf16", 31.0).name, hopper_grouped_config("bf16", 2048.0).name
    ('sm90a_grouped_128x64x64_w1x1_s8_g8', 'sm90a_grouped_256x128x64_w2x1_s3_g8')
    >>> hopper_grouped_config("s8", 100.0) is None
    True
    """
    from .config import SM90_GROUPED_CONFIGS

    tiles = SM90_GROUPED_CONFIGS.get(kind)
    if tiles is None:
        return None
    if mean_rows <= HOPPER_SMALL_ROWS:
        return tiles["small"]
    return tiles["medium"] if mean_rows <= HOPPER_MEDIUM_ROWS else tiles["large"]


#: params.cuh's GroupedProblem, field by field (offsets fixed: the device reads this layout)
PROBLEM_ROW = np.dtype({
    "names": ["A", "B", "C", "bias", "pre", "scale_m", "scale_n", "lda", "ldb", "ldc", "m", "n", "k",
              "tile_begin", "alpha", "beta", "ialpha", "ibeta", "c_vec", "bias_mode", "reserved0", "reserved1"],
    "formats": ["<u8"] * 7 + ["<i8"] * 3 + ["<i4"] * 4 + ["<f4"] * 2 + ["<i4"] * 6,
    "offsets": [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124],
    "itemsize": 128,
})
# (every byte a field: NumPy copies a structured array field by field, so bytes outside the
# fields would come out of a copy as whatever the new buffer held)


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
    count = int(keep.sum())
    rows = np.zeros(count, PROBLEM_ROW)
    # whole columns through plain 2-D views of the rows (a structured field write costs
    # ~3 µs each: 20 of them were a third of a small launch's host time)
    u64 = rows.view(np.uint64).reshape(count, 16)
    i64 = rows.view(np.int64).reshape(count, 16)
    i32 = rows.view(np.int32).reshape(count, 32)
    for name in ("A", "B", "C", "bias", "pre", "scale_m", "scale_n"):
        if name in cols:
            u64[:, PROBLEM_ROW.fields[name][1] // 8] = np.asarray(cols[name], np.uint64)[keep]
    for name in ("lda", "ldb", "ldc"):
        i64[:, PROBLEM_ROW.fields[name][1] // 8] = np.asarray(cols[name], np.int64)[keep]
    for name in ("m", "n", "k"):
        i32[:, PROBLEM_ROW.fields[name][1] // 4] = np.asarray(cols[name], np.int64)[keep]
    i32[:, PROBLEM_ROW.fields["tile_begin"][1] // 4] = (np.cumsum(tiles) - tiles)[keep]
    if is_int:
        rows["ialpha"], rows["ibeta"] = int(alpha), int(beta)
    else:
        rows["alpha"], rows["beta"] = float(alpha), float(beta)
    ov = 16 // out_bytes
    i32[:, PROBLEM_ROW.fields["c_vec"][1] // 4] = (u64[:, 2] % 16 == 0) & (i64[:, 9] % ov == 0)
    i32[:, PROBLEM_ROW.fields["bias_mode"][1] // 4] = bias_mode
    return rows, total


class GroupedLaunch:
    """One compiled grouped kernel: (kind, transa, transb, operand path, epilogue) on the
    current device. Call it with the problems' columns (:data:`COLUMNS`, one entry per
    problem); it packs the table (:func:`pack_table`), copies it through a ring of pinned host
    buffers into a device table it keeps per stream, and launches once on CuPy's current
    stream, through ``cuLaunchKernel`` with a pre-packed argument block.

    ``config``: the tile (default :data:`GROUPED_CONFIGS`' for ``kind``; see
    :func:`grouped_config`). ``epilogue``: (EPI, bias axis 'm' / 'n' / None) as for
    :func:`~pyblasgemm.kernels.launch.bind`; a dequantizing EPI gives s8 problems float scales
    and ``out_bytes``-wide results (16-byte aligned C with whole 16-byte columns: checked).

    Example::

        launch = GroupedLaunch("f16", "N", "N", vec=True, epilogue=(epilogue_code(2), "m"))
        launch(columns, out_bytes=2)         # float16 results, bias per m index, erf GELU
    """

    def __init__(self, kind: str, transa: str, transb: str, vec: bool, epilogue: tuple = (0, None),
                 config: KernelConfig | None = None):
        import cupy

        from .jit import EPI_DEQUANT, get_kernels

        if kind not in GROUPED_CONFIGS:
            raise ValueError(f"grouped launch: kind {kind!r} is not one of {tuple(GROUPED_CONFIGS)}")
        if config is not None and config.decomposition != "grouped":
            raise ValueError(f"grouped launch: {config.name} is not a grouped config")
        self.kind, self.epilogue = kind, epilogue
        self.layout = (transa, transb, vec)
        self.config = GROUPED_CONFIGS[kind] if config is None else config
        self.dequant = bool(epilogue[0] & EPI_DEQUANT)
        self.kern, _ = get_kernels(self.config, kind, transa, transb, None, vec, epi=epilogue[0])
        self.smem = self.config.smem_bytes(kind)
        dev = cupy.cuda.Device()
        from .launch import _occupancy

        self.ctas = dev.attributes["MultiProcessorCount"] * _occupancy(self.kern, self.config.threads, self.smem)
        self._dev = dev.id
        self._fptr = function(self.kern.kernel.ptr)
        # stream handle -> (table buffer, argument pack, pinned ring, turn, table CUdeviceptr, CUstream)
        self._slots = {}
        # stream handle -> (device table, tile count, GEMM arguments, table kernel's arguments, CUstream)
        self._offset_slots = {}
        # stream handle -> (the one-launch kernel's arguments, CUstream)
        self._fused_slots = {}
        # (offsets' bytes (4, 8), masked layout) -> (CUfunction, grid cap: SMs x CTAs per SM) of
        # the one-launch form
        self._fused_kernels = {}
        self._lock = threading.Lock()   # calls from several threads take turns on the ring and table

    def __call__(self, cols: dict, out_bytes: int, alpha=1, beta=0) -> int:
        """Launch the problems of ``cols`` (:data:`COLUMNS`, column-major, the launch's
        transposes) on CuPy's current stream; returns the number of tiles walked (0: nothing
        launched)."""
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
        self.launch_rows(rows, tiles)
        return tiles

    def launch_rows(self, rows, tiles: int) -> None:
        """Launch a table packed by :func:`pack_table` (``tiles``: its total) on CuPy's current
        stream; a repeated call may pass a packed table with new addresses in its pointer
        columns (``grouped_matmul``'s call-signature replay)."""
        with self._lock:
            self._launch_rows(rows, tiles)

    def _launch_rows(self, rows, tiles: int) -> None:
        import cupy

        if tiles == 0:
            return
        sptr = stream_handle(None)
        slot = self._slots.get(sptr)
        if slot is not None and slot[0].nbytes < rows.nbytes:
            for _, event in slot[2]:
                event.synchronize()     # the old ring's copies are made before it is let go
            slot = None
        if slot is None:
            # one device table per stream, grown as needed (a later call's copy into it is
            # ordered after this stream's earlier launches), fed from a ring of pinned host
            # buffers: a copy from pageable memory waited for the stream's earlier work
            # (H100, 64 small experts: 210 µs a call for 123 µs of GPU time)
            nbytes = max(rows.nbytes, 128 * 64)
            table = cupy.empty(nbytes, np.uint8)
            pack = _ArgPack(_arg_ctypes(), dict(_BLANK, a=table.data.ptr, group_m=self.config.group_m))
            ring = [(cupy.cuda.alloc_pinned_memory(nbytes), cupy.cuda.Event(block=False, disable_timing=True))
                    for _ in range(PINNED_RING)]
            slot = self._slots[sptr] = (table, pack, ring, [0], device_pointer(table.data.ptr), stream(sptr))
        table, pack, ring, turn, table_dptr, cs = slot
        host, done = ring[turn[0]]
        turn[0] = (turn[0] + 1) % PINNED_RING
        done.synchronize()          # this buffer's copy, PINNED_RING calls ago, has been made
        np.frombuffer(host, np.uint8, rows.nbytes)[:] = rows.view(np.uint8)
        copy_to_device_async(self._dev, table_dptr, host.ptr, rows.nbytes, cs)
        record_event(self._dev, done.ptr, cs)
        # A: the table, m: its row count, dp_tiles: the tiles (impls/sm80_gemm.cuh, kGrouped)
        pack.cells["m"].value, pack.cells["dp_tiles"].value = len(rows), tiles
        launch_kernel(self._dev, self._fptr, min(tiles, self.ctas), 1, 1, self.config.threads, 1, 1, self.smem,
                      cs, pack.addr)

    def launch_offsets(self, groups: int, offsets_ptr: int, offsets_bytes: int, values: dict,
                       fused: bool | None = None) -> None:
        """The expert form with device-side end offsets (``offsets_ptr``: ``groups`` int32 or
        int64 on the launch's device, ``offsets_bytes`` 4 or 8), on CuPy's current stream, with
        no copy to or from the host, so a CUDA graph of the call replays any sizes.
        ``values``: the scalars and base pointers (:data:`OFFSETS_FIELDS`; the group and row
        strides in bytes, ``rows`` the tokens' count). With ``group_rows`` > 0 in ``values``
        the layout is the masked one: the tokens are ``groups`` blocks of ``group_rows`` rows
        (``rows`` = groups x group_rows) and ``offsets_ptr`` holds each block's valid row count
        (``masked_m``), clamped to [0, group_rows] on the device (impls/grouped_offsets.cuh).

        ``fused`` (None: up to :data:`FUSED_MAX_GROUPS` groups): one launch, whose CTAs each
        scan the offsets into shared memory before walking the tiles
        (impls/grouped_fused.cuh); False: two, the table-building kernel
        (impls/grouped_offsets.cuh) writing the problems and their tile count to global memory,
        then the grouped GEMM reading them. Both grids are the bound ``tiles_m * (row tiles +
        groups)``, at most one CTA per SM slot; both give the same bits.

        Example (on a GPU; pyblasgemm.grouped builds ``values`` from the arrays)::

            launch = GroupedLaunch("f16", "N", "N", vec=True)
            launch.launch_offsets(groups, offsets.data.ptr, 4, values)   # int32 offsets
        """
        if groups == 0:
            return
        if fused is None:
            fused = groups <= FUSED_MAX_GROUPS
        elif fused and groups > FUSED_MAX_GROUPS:
            raise ValueError(f"grouped launch: fused=True takes at most {FUSED_MAX_GROUPS} groups, got {groups}")
        tiles_m = -(-values["m"] // self.config.bm)
        bound = tiles_m * (-(-values["rows"] // self.config.bn) + groups)
        if bound >= 2**31:
            raise ValueError(f"grouped launch: up to {bound} tiles exceed 2^31")
        if fused:
            self._launch_fused(groups, offsets_ptr, offsets_bytes, values, tiles_m, bound)
            return
        with self._lock:
            sptr = stream_handle(None)
            slot = self._offset_slots.get(sptr)
            if slot is not None and slot[0].nbytes < groups * PROBLEM_ROW.itemsize:
                slot = None     # (the old table is freed in stream order: CuPy's pool)
            if slot is None:
                import cupy

                table = cupy.empty(max(groups, 64) * PROBLEM_ROW.itemsize, np.uint8)
                total = cupy.zeros(1, np.int32)
                gemm = _ArgPack(_arg_ctypes(), dict(_BLANK, a=table.data.ptr, flags=total.data.ptr,
                                                    group_m=self.config.group_m, dp_tiles=-1))
                build = _ArgPack(OFFSETS_FIELDS, dict(_OFFSETS_BLANK, table=table.data.ptr,
                                                      total=total.data.ptr))
                slot = self._offset_slots[sptr] = (table, total, gemm, build, stream(sptr))
            table, total, gemm, build, cs = slot
            cells = build.cells
            cells["group_rows"].value = 0       # (the contiguous layout unless values name it)
            for name, value in values.items():
                cells[name].value = value
            cells["offsets"].value, cells["groups"].value = offsets_ptr, groups
            cells["bn"].value = self.config.bn
            cells["tiles_m"].value = tiles_m
            kern = offsets_kernel(self._dev, offsets_bytes)
            launch_kernel(self._dev, kern, 1, 1, 1, 1024, 1, 1, 0, cs, build.addr)
            gemm.cells["m"].value = groups
            launch_kernel(self._dev, self._fptr, max(1, min(bound, self.ctas)), 1, 1, self.config.threads, 1, 1,
                          self.smem, cs, gemm.addr)

    def _launch_fused(self, groups, offsets_ptr, offsets_bytes, values, tiles_m, bound) -> None:
        """:meth:`launch_offsets`' one-launch form (its checks made)."""
        fn, cap = self._fused_kernel(offsets_bytes, values.get("group_rows", 0) > 0)
        with self._lock:
            sptr = stream_handle(None)
            slot = self._fused_slots.get(sptr)
            if slot is None:
                pack = _ArgPack(FUSED_FIELDS, dict(_FUSED_BLANK, group_m=self.config.group_m, bn=self.config.bn))
                slot = self._fused_slots[sptr] = (pack, stream(sptr))
            pack, cs = slot
            cells = pack.cells
            cells["group_rows"].value = 0       # (the contiguous layout unless values name it)
            for name, value in values.items():
                cells[name].value = value
            cells["offsets"].value, cells["groups"].value, cells["tiles_m"].value = offsets_ptr, groups, tiles_m
            launch_kernel(self._dev, fn, max(1, min(bound, cap)), 1, 1, self.config.threads, 1, 1, self.smem, cs,
                          pack.addr)

    def _fused_kernel(self, offsets_bytes: int, masked: bool = False):
        """(CUfunction, CTAs of the whole GPU) of the one-launch form for int32 (4) or int64
        (8) offsets (``masked``: the masked layout's row counts), compiled on first use (its
        static shared arrays lower the CTAs per SM only where they do not fit beside the tile's
        ring)."""
        hit = self._fused_kernels.get((offsets_bytes, masked))
        if hit is None:
            import cupy

            from .driver import occupancy, set_max_dynamic_shared_memory

            transa, transb, vec = self.layout
            name = fused_kernel_name(self.config, self.kind, transa, transb, vec, self.epilogue[0], offsets_bytes,
                                     masked)
            fn = raw_function(_FUSED_SOURCE, name, self._dev)
            with cupy.cuda.Device(self._dev):
                if self.smem > 48 * 1024:
                    set_max_dynamic_shared_memory(int(fn), self.smem)
                sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
                hit = (fn, sms * occupancy(int(fn), self.config.threads, self.smem))
            with self._lock:
                hit = self._fused_kernels.setdefault((offsets_bytes, masked), hit)
        return hit


def _offsets_fields():
    import ctypes as ct

    p, ll, i, f = ct.c_void_p, ct.c_longlong, ct.c_int, ct.c_float
    return [("table", p), ("total", p), ("offsets", p), ("weights", p), ("tokens", p), ("out", p), ("bias", p),
            ("scale_w", p), ("scale_x", p), ("w_group_bytes", ll), ("x_row_bytes", ll), ("out_row_bytes", ll),
            ("bias_group_bytes", ll), ("scale_w_group_bytes", ll), ("lda", ll), ("ldb", ll), ("ldc", ll),
            ("rows", ll), ("groups", i), ("m", i), ("k", i), ("tiles_m", i), ("bn", i), ("out_bytes", i),
            ("alpha", f), ("beta", f), ("ialpha", i), ("ibeta", i), ("bias_mode", i), ("group_rows", ll)]


#: the table-building kernel's arguments, in impls/grouped_offsets.cuh's order
OFFSETS_FIELDS = _offsets_fields()
_OFFSETS_BLANK = {name: 0 for name, _ in OFFSETS_FIELDS}
_OFFSETS_SOURCE = "#include <pyblasgemm/impls/grouped_offsets.cuh>\n"
_OFFSETS_NAMES = {4: "pyblasgemm::grouped_offsets_kernel<int>", 8: "pyblasgemm::grouped_offsets_kernel<long long>"}


#: groups the one-launch expert form scans into shared memory (impls/grouped_fused.cuh's
#: kFusedMaxGroups: 12 bytes a group, 6 KB beside the tile's ring); more take two launches
FUSED_MAX_GROUPS = 512
#: the one-launch kernel's arguments: the table kernel's without the table and its tile count,
#: and the tile raster's group height
FUSED_FIELDS = [f for f in OFFSETS_FIELDS if f[0] not in ("table", "total")] + [("group_m", ctypes.c_int)]
_FUSED_BLANK = {name: 0 for name, _ in FUSED_FIELDS}
_FUSED_SOURCE = "#include <pyblasgemm/impls/grouped_fused.cuh>\n"
_OFFSET_TYPES = {4: "int", 8: "long long"}


def fused_kernel_name(config: KernelConfig, kind: str, transa: str, transb: str, vec: bool, epi: int,
                      offsets_bytes: int, masked: bool = False) -> str:
    """The C++ name expression of the one-launch expert kernel for a grouped ``config``.

    >>> fused_kernel_name(GROUPED_SMALL_CONFIGS["bf16"], "bf16", "N", "N", True, 0, 4)
    'pyblasgemm::grouped_fused_kernel<pyblasgemm::KindBF16F32, false, true, 128, 64, 128, 4, 2, 4, true, 0, int, false>'
    >>> fused_kernel_name(GROUPED_SMALL_CONFIGS["bf16"], "bf16", "N", "N", True, 0, 8, masked=True)[-16:]
    'long long, true>'
    """
    from .jit import kind_struct

    return (f"pyblasgemm::grouped_fused_kernel<{kind_struct(kind)}, {str(transa == 'T').lower()}, "
            f"{str(transb == 'N').lower()}, {config.bm}, {config.bn}, {config.bk_bytes(kind)}, {config.warps_m}, "
            f"{config.warps_n}, {config.stages}, {str(vec).lower()}, {epi}, {_OFFSET_TYPES[offsets_bytes]}, "
            f"{str(masked).lower()}>")


def offsets_kernel(device: int, offsets_bytes: int):
    """The table-building kernel for int32 (4) or int64 (8) offsets on ``device`` (a driver
    function handle), compiled once per (device, headers).

    Example (on a GPU)::

        fn = offsets_kernel(0, 4)          # impls/grouped_offsets.cuh for int32 offsets
        fn is offsets_kernel(0, 4)         # True: compiled once
    """
    return raw_function(_OFFSETS_SOURCE, _OFFSETS_NAMES[offsets_bytes], device)
