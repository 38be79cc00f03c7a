"""Host side of the Hopper kernel (impls/sm90_gemm.cuh): TMA descriptors and the bound launch.

The kernel reads A and B through two TMA tensor maps (``CUtensorMap``, 128 bytes) passed by
value as ``__grid_constant__`` parameters. They are encoded once per bound problem class with the
driver's ``cuTensorMapEncodeTiled`` (through cuda.bindings, as every driver call:
:mod:`~pyblasgemm.kernels.driver`); a call with new pointers patches only the address with
``cuTensorMapReplaceAddress``. ``cuLaunchKernel`` copies parameter values at launch time, so one
buffer per stream slot is reused call after call.

Operand maps (3-D: the third dimension walks the batch; a batch stride of 0 broadcasts by
keeping that dimension at size 1 and passing a zero batch coordinate):

=============  ==========================  =========================  ==================
operand        K-major (K contiguous)      MN-major                   box
=============  ==========================  =========================  ==================
P = op(B)^T    transb='N': (k, n, batch)   transb='T': (n, k, batch)  (64|128 K, 128) / (64, 64)
Q = op(A)      transa='T': (k, m, batch)   transa='N': (m, k, batch)  (64|128 K, bm) / (64, 64)
=============  ==========================  =========================  ==================

Every box is 128 bytes wide with the 128-byte swizzle that the wgmma descriptors expect, and
elements outside the tensor read as zeros (so edges need no predication in the mainloop).

fp32 operands (``tf32``, ``3xtf32``) take one more step, :class:`Sm90PrepLaunch`: tf32 wgmma
reads K-major operands only, so a prep kernel writes op(A) and op(B) K-major, rounded to tf32
(3xTF32: rows of [big | small] halves) into a workspace, and the GEMM runs "TN" on it.
"""
from __future__ import annotations

import ctypes as ct
import threading
from dataclasses import replace

from ..kinds import KERNEL_KINDS
from .config import KernelConfig, sm90_prep_shape
# at module level: an import inside __call__ ran on every launch (hot path)
from .driver import (bindings, check, device_pointer, function, launch_config, launch_kernel, memset_words_async,
                     recover, set_scales, stream, stream_handle)
from .problem import ELEM_BYTES, KernelProblem

__all__ = ["Sm90Launch", "Sm90PrepLaunch", "Sm90GroupedLaunch", "tma_maps", "encode_tiled", "TMA_DTYPE",
           "prepared_problem", "kernel_args", "grouped_refusal"]

#: CUtensorMapDataType of each kind's A/B (s8 moves as raw bytes) and of its C
#: (CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6, BFLOAT16 = 9, UINT8 = 0, INT32 = 3, FLOAT32 = 7)
#: fp32 operands move as FLOAT32 words (the prep kernel rounded them to tf32 already)
TMA_DTYPE = {k: r.tma_ab for k, r in KERNEL_KINDS.items()}       # the kinds table's rows
TMA_C_DTYPE = {k: r.tma_c for k, r in KERNEL_KINDS.items()}


def _cluster_config(grid: int, smem: int, cluster: int, threads: int = 384, on_stream=None):
    """A ``CUlaunchConfig`` (cuLaunchKernelEx) of ``grid`` CTAs in clusters of ``cluster``;
    ``on_stream``: its CUstream (a launcher keeps one config per stream)."""
    cu = bindings()
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dim = attr.value.clusterDim
    dim.x, dim.y, dim.z = cluster, 1, 1
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    if on_stream is not None:
        cfg.hStream = on_stream
    return cfg


def max_active_clusters(func_ptr: int, smem: int, cluster: int, threads: int = 384) -> int:
    """How many clusters of ``cluster`` CTAs can be resident at once (the driver's answer: an SM
    pair must sit in one GPC, so this can be below SMs / cluster).

    Example::

        fit = max_active_clusters(kern.ptr, config.smem_bytes("f16"), 2)   # e.g. 66 on an H100
    """
    cu = bindings()
    cfg = _cluster_config(cluster, smem, cluster, threads)
    return int(check(cu.cuOccupancyMaxActiveClusters(cu.CUfunction(func_ptr), cfg), "cuOccupancyMaxActiveClusters"))


def encode_tiled(kind: str, ptr: int, dims, strides_bytes, box, dtype: int | None = None):
    """A 3-D tiled ``CUtensorMap``: ``dims`` innermost first, ``strides_bytes`` of dims 1 and 2,
    ``box`` the copied tile, 128-byte swizzle, out-of-range elements read as zeros; ``dtype`` a
    CUtensorMapDataType (default: the kind's A/B type). Raises ValueError with the driver's
    error. Its 128 bytes are at ``.getPtr()`` (what a kernel parameter array points to).

    Example::

        m = encode_tiled("f16", a.data.ptr, (k, m_rows, 1), (lda * 2, lda * 2 * m_rows), (64, 256, 1))
    """
    cu = bindings()
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    err, tmap = cu.cuTensorMapEncodeTiled(
        TMA_DTYPE[kind] if dtype is None else dtype, 3, ptr, [u64(d) for d in dims],
        [u64(x) for x in strides_bytes], [u32(b) for b in box], [u32(1)] * 3,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)   # FILL_NONE: zeros
    if err:
        raise ValueError(f"cuTensorMapEncodeTiled failed ({getattr(err, 'name', 'CUresult')} {int(err)}) for "
                         f"dims={tuple(dims)} strides={tuple(strides_bytes)} box={tuple(box)} ptr=0x{ptr:x}")
    return tmap


def _batch_dim(rows: int, ld: int, stride: int, batch: int, eb: int):
    """(size, stride bytes) of the batch dimension; a broadcast (stride 0) keeps size 1."""
    if batch > 1 and stride:
        return batch, stride * eb
    return 1, -(-(rows * ld * eb) // 16) * 16  # unused with size 1, but must be a multiple of 16


def tma_maps(p: KernelProblem, config: KernelConfig):
    """The (dims, strides, box) of the P (from B) and Q (from A) maps for ``p`` (see the table
    in this module's docstring), and whether each walks the batch.

    Example::

        p = KernelProblem("f16", "T", "N", 300, 200, 512, 512, 512, 300, 256, 256, 256)
        (pdims, pstrides, pbox), qmap, p_batched, q_batched = tma_maps(p, SM90_CONFIGS_BY_TILE["f16"][256])
        # pdims == (512, 200, 1): K contiguous, n rows; pbox == (64, 128, 1)
    """
    eb = ELEM_BYTES[p.kind]
    bke = 128 // eb
    # a prepared 3xTF32 row is [big | small], k columns each: the K-major maps span both halves
    kext = 2 * p.k if p.kind == "3xtf32" else p.k
    if p.transb == "N":    # B(k x n) column-major: K contiguous
        pb, ps = _batch_dim(p.n, p.ldb, p.stride_b, p.batch, eb)
        pmap = ((kext, p.n, pb), (p.ldb * eb, ps), (bke, config.bn, 1))
    else:                  # B stored n x k: N contiguous
        pb, ps = _batch_dim(p.k, p.ldb, p.stride_b, p.batch, eb)
        pmap = ((p.n, p.k, pb), (p.ldb * eb, ps), (64, bke, 1))
    if p.transa == "T":    # A stored k x m: K contiguous
        qb, qs = _batch_dim(p.m, p.lda, p.stride_a, p.batch, eb)
        # in a 2-CTA cluster each CTA loads (and multicasts) half of the Q rows
        qmap = ((kext, p.m, qb), (p.lda * eb, qs), (bke, config.bm // config.cluster, 1))
    else:                  # A(m x k) column-major: M contiguous
        qb, qs = _batch_dim(p.k, p.lda, p.stride_a, p.batch, eb)
        qmap = ((p.m, p.k, qb), (p.lda * eb, qs), (64, bke, 1))
    return pmap, qmap, pb > 1, qb > 1


def c_map(p: KernelProblem, c_bytes: int | None = None):
    """The TMA-store map of C (m, n, batch) with 64-row x 128-byte boxes (the epilogue's);
    ``c_bytes``: C's element size when it is not the kind's (a dequantized int8 product).

    Example::

        dims, strides, box = c_map(p)     # ((m, n, 1), (ldc * 2, ...), (64, 64, 1)) for fp16 C
    """
    cb = c_bytes or p.c_bytes
    batch, stride = _batch_dim(p.n, p.ldc, p.stride_c, p.batch, cb)
    return (p.m, p.n, batch), (p.ldc * cb, stride), (128 // cb, 64, 1)


def kernel_args(p: KernelProblem, config: KernelConfig, g: dict):
    """(GEMM kernel argument values, split-k reduce kernel's or None) of ``config`` on ``p``
    (for the fp32 kinds: the prepared problem) with geometry ``g``: everything but the
    pointers, TMA maps and scales (left 0), in the names of ``_FIELDS`` / ``_RED_FIELDS``. The
    kernel's tiles run over (n, m): P comes from B, Q from A. Pure; the plan's
    :class:`~pyblasgemm.kernels.spec.LaunchSpec` holds the result."""
    _, _, pbat, qbat = tma_maps(p, config)
    args = dict(c=0, ws=0, flags=0, mt=p.n, nt=p.m, k=p.k, ldc=p.ldc, sc=p.stride_c, batch=p.batch,
                p_batched=int(pbat), q_batched=int(qbat), alpha=0.0, beta=0.0, ialpha=0, ibeta=0,
                c_pair=int(p.c_vectorizable()), group_m=config.group_m, splits=g["splits"],
                kt_per_split=g["kt_per_split"], dp_tiles=g["dp_tiles"], sk_tiles=g["sk_tiles"],
                bias=0, pre=0, bias_mode=0, scale_m=0, scale_n=0, offsets=0, offsets_wide=0, group_rows=0,
                bias_group_bytes=0)
    red = None
    if config.decomposition == "splitk_parallel":
        red = dict(ws=0, c=0, mt=p.n, nt=p.m, ldc=p.ldc, sc=p.stride_c, batch=p.batch,
                   splits=g["splits"], alpha=0.0, beta=0.0, ialpha=0, ibeta=0, bias=0, pre=0, bias_mode=0,
                   scale_m=0, scale_n=0)
    return args, red


_FIELDS = [("c", ct.c_uint64), ("ws", ct.c_uint64), ("flags", ct.c_uint64), ("mt", ct.c_int32), ("nt", ct.c_int32),
           ("k", ct.c_int32), ("ldc", ct.c_int64), ("sc", ct.c_int64), ("batch", ct.c_int32),
           ("p_batched", ct.c_int32), ("q_batched", ct.c_int32), ("alpha", ct.c_float), ("beta", ct.c_float),
           ("ialpha", ct.c_int32), ("ibeta", ct.c_int32), ("c_pair", ct.c_int32), ("group_m", ct.c_int32),
           ("splits", ct.c_int32), ("kt_per_split", ct.c_int32), ("dp_tiles", ct.c_int32), ("sk_tiles", ct.c_int32),
           ("bias", ct.c_uint64), ("pre", ct.c_uint64), ("bias_mode", ct.c_int32), ("scale_m", ct.c_uint64),
           ("scale_n", ct.c_uint64), ("offsets", ct.c_uint64), ("offsets_wide", ct.c_int32),
           ("group_rows", ct.c_int64), ("bias_group_bytes", ct.c_int64)]
_RED_FIELDS = [("ws", ct.c_uint64), ("c", ct.c_uint64), ("mt", ct.c_int32), ("nt", ct.c_int32), ("ldc", ct.c_int64),
               ("sc", ct.c_int64), ("batch", ct.c_int32), ("splits", ct.c_int32), ("alpha", ct.c_float),
               ("beta", ct.c_float), ("ialpha", ct.c_int32), ("ibeta", ct.c_int32), ("bias", ct.c_uint64),
               ("pre", ct.c_uint64), ("bias_mode", ct.c_int32), ("scale_m", ct.c_uint64), ("scale_n", ct.c_uint64)]
#: CU_TENSOR_MAP_DATA_TYPE_UINT8: the Ozaki digit store's byte planes
TMA_UINT8 = 0


def digit_boxes_fit(p: KernelProblem) -> bool:
    """Whether the Ozaki digit store (one byte a product, ``jit.EPI_RESIDUE``) of ``p`` can go
    out in TMA boxes (and paired 2-byte stores at tile edges): C's pointer, leading dimension
    and batch stride in whole 16-byte units (in bytes: elements). Else every digit is one
    byte store.

    >>> from pyblasgemm.kernels.problem import KernelProblem
    >>> digit_boxes_fit(KernelProblem("s8", "T", "N", 4096, 4096, 4096, 4096, 4096, 4096, 0, 0, 256,
    ...                               batch=16, stride_c=4096 * 4096))
    True
    """
    return p.c_ptr % 16 == 0 and p.ldc % 16 == 0 and (p.batch == 1 or p.stride_c % 16 == 0)


#: a dequantized int8 product's output (jit.DEQUANT_OUT's codes) -> (bytes, TMA element type),
#: read off the kinds whose C is that type
DEQUANT_C = {0: (4, TMA_C_DTYPE["tf32"]), 1: (2, TMA_C_DTYPE["f16"]), 2: (2, TMA_C_DTYPE["bf16"])}
#: bias_mode of the fused epilogue (impls/sm90_gemm.cuh): one value per D column (C's m index)
#: or per D row (C's n index)
BIAS_MODE = {None: 0, "m": 1, "n": 2}


class _Slot:
    """One stream's workspace, flags and kernel-parameter buffers."""

    __slots__ = ("ws", "flags", "flags_ptr", "flags_dptr", "flags_words", "tma_p", "tma_q", "tma_c", "cells", "params",
                 "params_addr", "rcells", "rparams", "rparams_addr", "last_a", "last_b", "last_c", "stream", "lcfg")


class Sm90Launch:
    """A compiled, validated launch of one problem class on the Hopper kernel; call it with
    the operand pointers, exactly like :class:`~pyblasgemm.kernels.launch.BoundLaunch`:
    ``launch(a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream=None)``.

    A and B must be 16-byte aligned (TMA); C must be in the alignment class it was bound for
    (``c_align`` bytes: paired stores when C allows them). ValueError otherwise.

    Example::

        launch = bind(problem, SM90_CONFIGS_BY_TILE["f16"][256])   # a Sm90Launch on an H100
        launch(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
    """

    def __init__(self, problem: KernelProblem, spec, kern, red, dev: int, epilogue: tuple = (0, None)):
        # calls from several threads take turns: the per-stream argument cells (and prepared
        # operands) are filled and the kernels launched under it (cuLaunchKernel copies the values)
        self._lock = threading.Lock()
        from dataclasses import replace as dc_replace
        from types import MappingProxyType

        p, g, config, smem = problem, dict(spec.geometry), spec.config, spec.smem
        #: (EPI template argument, bias along 'm' / 'n' / None): a fused epilogue's launch
        #: takes ``bias=`` and ``pre=`` pointers per call
        from .jit import EPI_DEQUANT, EPI_OUT_SHIFT, EPI_RESIDUE

        self.epilogue = epilogue
        self._fused = bool(epilogue[0])
        #: a dequantized int8 product (float alpha / beta, scale_m= / scale_n= per call) and
        #: C's element size and TMA type; the Ozaki digit store writes one byte (its table is
        #: the bias= pointer)
        self._dequant = bool(epilogue[0] & EPI_DEQUANT)
        self._residue = bool(epilogue[0] & EPI_RESIDUE)
        self._c_bytes, self._c_tma = (DEQUANT_C[epilogue[0] >> EPI_OUT_SHIFT & 3] if self._dequant
                                      else (1, TMA_UINT8) if self._residue
                                      else (problem.c_bytes, TMA_C_DTYPE[problem.kind]))
        self.problem, self.spec, self.config, self.geometry, self.smem, self.kern, self.red = (
            problem, spec, config, g, smem, kern, red)
        self._dev = dev
        # driver handles made once: cuda.bindings converts a bare int on every call
        self._fptr = function(kern.ptr)
        self._rptr = function(red.ptr) if red is not None else None
        self._replace_address = bindings().cuTensorMapReplaceAddress
        self._launch_ex = bindings().cuLaunchKernelEx
        self._grid = int(g["grid"][0])
        self._int = p.kind == "s8" and not self._dequant
        self._pmap, self._qmap, _, _ = tma_maps(p, config)
        # paired C stores in the same alignment class the mma.sync path uses for 16-byte stores
        # (callers key their bound launches on it); it implies even ldc and 2-element alignment
        self.c_align = 16 if p.c_vectorizable() or self._dequant else p.c_bytes
        self.a_align = self.b_align = 16
        self._base = dict(spec.args, bias_mode=BIAS_MODE[epilogue[1]])   # all but pointers and scales
        if self._residue:       # byte planes: TMA boxes where C's rows and planes are 16-byte aligned
            boxes = digit_boxes_fit(p)
            self.c_align = 16 if boxes else 1
            self._base["c_pair"] = int(boxes)
        self._rbase = None if spec.red_args is None else dict(spec.red_args, bias_mode=BIAS_MODE[epilogue[1]])
        self._rgrid = -(-(p.batch * p.m * p.n) // 256)
        self._slots: dict = {}
        self._last = None
        self._cluster = config.cluster
        if self._cluster > 1:
            # a persistent grid must be co-resident: no more clusters than the driver can place
            fit = max_active_clusters(kern.ptr, smem, self._cluster, config.threads)
            if fit < 1:
                raise ValueError(f"{config.name}: no {self._cluster}-CTA cluster fits on this device")
            self._grid = min(self._grid, fit * self._cluster)
            self.geometry = dict(g, grid=(self._grid, 1, 1))
            if self.geometry != g:     # the device placed fewer clusters than the plan's grid
                self.spec = dc_replace(spec, geometry=MappingProxyType(self.geometry))

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes of workspace and flags this launch owns, over all streams it ran on."""
        return sum((s.ws.nbytes if s.ws is not None else 0) + (s.flags.nbytes if s.flags is not None else 0)
                   for s in self._slots.values())

    def _slot(self, sptr: int) -> _Slot:
        import cupy

        g, p = self.geometry, self.problem
        s = _Slot()
        with cupy.cuda.Device(self._dev):
            s.ws = cupy.empty(g["ws_bytes"], dtype=cupy.uint8) if g["ws_bytes"] else None
            s.flags = cupy.zeros(g["flags"], dtype=cupy.int32) if g["flags"] else None
        s.flags_ptr = s.flags.data.ptr if s.flags is not None else 0
        s.flags_dptr = device_pointer(s.flags_ptr) if s.flags is not None else None
        s.flags_words = g["flags"]
        s.stream = stream(sptr)
        # encoded with the bound problem's (aligned) pointers; each call replaces the address
        s.tma_p = encode_tiled(p.kind, p.b_ptr, *self._pmap)
        s.tma_q = encode_tiled(p.kind, p.a_ptr, *self._qmap)
        # else the kernel never reads the C map (direct stores): 128 bytes it is passed unread
        s.tma_c = (encode_tiled(p.kind, p.c_ptr, *c_map(p, self._c_bytes), dtype=self._c_tma)
                   if self._base["c_pair"] else bindings().CUtensorMap())
        s.last_a, s.last_b, s.last_c = p.a_ptr, p.b_ptr, p.c_ptr
        ws_ptr = s.ws.data.ptr if s.ws is not None else 0
        s.cells = {name: typ(dict(self._base, ws=ws_ptr, flags=s.flags_ptr)[name]) for name, typ in _FIELDS}
        ptrs = [s.tma_p.getPtr(), s.tma_q.getPtr(), s.tma_c.getPtr()]
        ptrs += [ct.addressof(s.cells[n]) for n, _ in _FIELDS]
        s.params = (ct.c_void_p * len(ptrs))(*ptrs)
        s.params_addr = ct.addressof(s.params)
        s.rcells = s.rparams = None
        s.rparams_addr = 0
        if self._rptr is not None:
            rbase = dict(self._rbase, ws=ws_ptr)
            s.rcells = {name: typ(rbase[name]) for name, typ in _RED_FIELDS}
            rp = [ct.addressof(s.rcells[n]) for n, _ in _RED_FIELDS]
            s.rparams = (ct.c_void_p * len(rp))(*rp)
            s.rparams_addr = ct.addressof(s.rparams)
        # every GEMM launch is cuLaunchKernelEx on this config (4 arguments converted, not 11: see
        # driver.launch_config), clusters or not
        s.lcfg = (_cluster_config(self._grid, self.smem, self._cluster, self.config.threads, s.stream)
                  if self._cluster > 1 else
                  launch_config((self._grid, 1, 1), (self.config.threads, 1, 1), self.smem, s.stream))
        self._slots[sptr] = s
        return s

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None, bias: int = 0,
                 pre: int = 0, scale_m: int = 0, scale_n: int = 0) -> None:
        with self._lock:   # one caller at a time: the cells are shared (see __init__)
            sptr = stream_handle(stream)
            if (bias or pre or scale_m or scale_n) and not self._fused:
                raise ValueError("bias= / pre= / scale_m= / scale_n= need a launch bound with a fused epilogue")
            if self._dequant and not (scale_m and scale_n):
                raise ValueError("a dequantizing launch needs scale_m= and scale_n= pointers")
            if (a_ptr | b_ptr) & 15 or c_ptr & (self.c_align - 1):
                raise ValueError(f"pointers 0x{a_ptr:x}, 0x{b_ptr:x}, 0x{c_ptr:x} are outside the bound alignment class "
                                 f"(A/B 16 B for TMA, C {self.c_align} B): bind() again for them")
            last = self._last
            if last is not None and last[0] == sptr:
                s = last[1]
            else:
                s = self._slots.get(sptr) or self._slot(sptr)
                self._last = (sptr, s)
            if b_ptr != s.last_b:
                self._readdress(s.tma_p, b_ptr)
                s.last_b = b_ptr
            if a_ptr != s.last_a:
                self._readdress(s.tma_q, a_ptr)
                s.last_a = a_ptr
            if c_ptr != s.last_c and self._base["c_pair"]:
                self._readdress(s.tma_c, c_ptr)
                s.last_c = c_ptr
            cells = s.cells
            cells["c"].value = c_ptr
            set_scales(cells, self._int, alpha, beta)
            if self._fused:
                cells["bias"].value, cells["pre"].value = bias, pre
                cells["scale_m"].value, cells["scale_n"].value = scale_m, scale_n
            if s.flags_dptr is not None:
                memset_words_async(self._dev, s.flags_dptr, s.flags_words, s.stream)
            err, = self._launch_ex(s.lcfg, self._fptr, s.params_addr, 0)
            if err:     # a fresh thread (a context made, launched again) or the driver's refusal
                recover(err, self._dev, f"cuLaunchKernelEx ({self.config.name})", self._launch_ex, s.lcfg,
                        self._fptr, s.params_addr, 0)
            if self._rptr is not None:
                rc = s.rcells
                rc["c"].value = c_ptr
                set_scales(rc, self._int, alpha, beta)
                if self._fused:
                    rc["bias"].value, rc["pre"].value = bias, pre
                    rc["scale_m"].value, rc["scale_n"].value = scale_m, scale_n
                launch_kernel(self._dev, self._rptr, self._rgrid, 1, 1, 256, 1, 1, 0, s.stream, s.rparams_addr)

    def _readdress(self, tmap, ptr: int) -> None:
        """Point a slot's tensor map at ``ptr``; a failure raises (a launch with the map unchanged
        would read the previous call's operand)."""
        err, = self._replace_address(tmap, ptr)
        if err:
            recover(err, self._dev, "cuTensorMapReplaceAddress", self._replace_address, tmap, ptr)


# --- fp32 operands: prep kernel + the GEMM on its K-major output -------------------------------

#: sm90_tf32_prep's parameters (impls/sm90_tf32_prep.cuh)
_PREP_FIELDS = [("x", ct.c_uint64), ("out", ct.c_uint64), ("rows", ct.c_int32), ("k", ct.c_int32),
                ("ldx", ct.c_int64), ("sx", ct.c_int64), ("k_major", ct.c_int32), ("kpad", ct.c_int32),
                ("small_mask", ct.c_int32)]
#: 3xTF32 rows: [big | small] for both operands (bit s set: section s holds the small part)
_SMALL_MASK = 0b10


def prepared_problem(p: KernelProblem) -> KernelProblem:
    """The "TN" problem the Hopper GEMM runs for an fp32 problem ``p`` (pointers left at 0):
    K becomes ``kpad`` (k rounded up to a stage), both operands K-major with rows of
    ``sections * kpad`` (3xTF32: the [big | small] halves).

    Example::

        q = prepared_problem(KernelProblem("3xtf32", "N", "T", 100, 50, 70, 100, 50, 100, 0, 0, 0))
        # q.transa, q.transb, q.k, q.lda == 'T', 'N', 96, 192   (two halves of 96)
    """
    sections, kpad, _ = sm90_prep_shape(p)
    ld = sections * kpad
    sa = p.m * ld if p.batch > 1 and p.stride_a else 0
    sb = p.n * ld if p.batch > 1 and p.stride_b else 0
    return replace(p, transa="T", transb="N", k=kpad, lda=ld, ldb=ld, a_ptr=0, b_ptr=0, stride_a=sa, stride_b=sb)


class Sm90PrepLaunch:
    """A bound launch of an fp32 problem (``tf32`` / ``3xtf32``) on the Hopper kernel; the same
    call as :class:`Sm90Launch`: ``launch(a_ptr, b_ptr, c_ptr, alpha=1.0, beta=0.0, stream=None)``.

    Each call runs the prep kernel on op(A) and on op(B) (any layout, leading dimension and
    4-byte alignment), then the GEMM (an :class:`Sm90Launch` of :func:`prepared_problem`, bound
    once per stream to that stream's prepared-operand workspace).

    Example::

        launch = bind(problem_3xtf32, SM90_CONFIGS_BY_TILE["3xtf32"][128])  # on an H100
        launch(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
    """

    def __init__(self, problem: KernelProblem, spec, kern, red, prep, dev: int):
        # calls from several threads take turns: the per-stream argument cells (and prepared
        # operands) are filled and the kernels launched under it (cuLaunchKernel copies the values)
        self._lock = threading.Lock()
        from types import MappingProxyType

        p, geometry = problem, dict(spec.geometry)
        self.problem, self.spec, self.config, self.geometry, self.smem = (
            problem, spec, spec.config, geometry, spec.smem)
        self._dev = dev
        self._prep_ptr = function(prep.ptr)
        self._kern, self._red = kern, red
        sections, kpad, self._ws_bytes = sm90_prep_shape(p)
        self._inner_problem = prepared_problem(p)
        # the GEMM's own spec: the prepared problem's geometry, without the prep bytes
        self._inner_spec = replace(spec, geometry=MappingProxyType(
            dict(geometry, ws_bytes=geometry["ws_bytes"] - self._ws_bytes)))
        self.a_align = self.b_align = 4
        self.c_align = 16 if p.c_vectorizable() else p.c_bytes   # as the GEMM's Sm90Launch
        bat_a = p.batch if p.batch > 1 and p.stride_a else 1
        bat_b = p.batch if p.batch > 1 and p.stride_b else 1
        self._q_bytes = bat_a * p.m * sections * kpad * 4
        # (rows, ld, batch stride, K-major?, batches, small-part mask) of op(A) and of op(B)^T;
        # plain tf32 (one section) writes the big parts only
        mask_q = mask_p = _SMALL_MASK if sections == 2 else 0
        self._a_spec = (p.m, p.lda, p.stride_a, p.transa == "T", bat_a, mask_q)
        self._b_spec = (p.n, p.ldb, p.stride_b, p.transb == "N", bat_b, mask_p)
        self._sections, self._kpad = sections, kpad
        self._slots: dict = {}

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes of prepared operands and GEMM workspace owned, over all streams."""
        return sum(s[0].nbytes + s[4].workspace_nbytes for s in self._slots.values())

    def _slot(self, sptr: int):
        import cupy

        with cupy.cuda.Device(self._dev):
            ws = cupy.empty(self._ws_bytes, dtype=cupy.uint8)
        q_ptr = ws.data.ptr
        p_ptr = q_ptr + self._q_bytes   # 16-byte aligned: kpad is a multiple of 32 elements
        gemm = Sm90Launch(replace(self._inner_problem, a_ptr=q_ptr, b_ptr=p_ptr), self._inner_spec,
                          self._kern, self._red, self._dev)
        blocks = []
        for (rows, ld, stride, k_major, bat, mask), out in ((self._a_spec, q_ptr), (self._b_spec, p_ptr)):
            vals = dict(x=0, out=out, rows=rows, k=self.problem.k, ldx=ld, sx=stride if bat > 1 else 0,
                        k_major=int(k_major), kpad=self._kpad, small_mask=mask)
            cells = {name: typ(vals[name]) for name, typ in _PREP_FIELDS}
            params = (ct.c_void_p * len(_PREP_FIELDS))(*[ct.addressof(cells[n]) for n, _ in _PREP_FIELDS])
            grid = (self._kpad // 32, -(-rows // 32), bat)
            blocks.append((cells, params, grid, ct.addressof(params)))
        slot = (ws, q_ptr, p_ptr, blocks, gemm, stream(sptr))
        self._slots[sptr] = slot
        return slot

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        with self._lock:   # one caller at a time: the cells are shared (see __init__)
            sptr = stream_handle(stream)
            if (a_ptr | b_ptr) & 3:
                raise ValueError(f"pointers 0x{a_ptr:x}, 0x{b_ptr:x} are not 4-byte aligned float32 data")
            _, q_ptr, p_ptr, blocks, gemm, cs = self._slots.get(sptr) or self._slot(sptr)
            for x_ptr, (cells, _params, grid, params_addr) in zip((a_ptr, b_ptr), blocks):
                cells["x"].value = x_ptr
                launch_kernel(self._dev, self._prep_ptr, grid[0], grid[1], grid[2], 32, 8, 1, 0, cs, params_addr)
            gemm(q_ptr, p_ptr, c_ptr, alpha, beta, stream)


# --- the grouped walk: mixture-of-experts layers with device-side group sizes ------------------

def grouped_refusal(kind: str, values: dict, groups: int, elem_bytes: int) -> str:
    """Why the Hopper grouped walk cannot run an expert-form call (``values``: the expert
    form's bases, strides and sizes, :data:`~pyblasgemm.kernels.grouped.OFFSETS_FIELDS`' names),
    or '' when it can: TMA reads the tokens and the weights (16-byte aligned bases and strides),
    the kernel's shared table holds :data:`~pyblasgemm.kernels.config.SM90_MAX_GROUPS` groups,
    and K must be at least 1 (a tile with no k-step would store stale accumulators).

    >>> grouped_refusal("bf16", dict(weights=0, tokens=0, w_group_bytes=2048, x_row_bytes=64, lda=32,
    ...                 k=32, scale_w=0, scale_x=0), 4, 2)
    ''
    >>> grouped_refusal("bf16", dict(weights=0, tokens=0, w_group_bytes=2048, x_row_bytes=66, lda=32,
    ...                 k=32, scale_w=0, scale_x=0), 4, 2)
    "TMA needs the tokens' row stride (66 bytes) in whole 16 bytes"
    """
    from .config import SM90_MAX_GROUPS

    if kind not in ("f16", "bf16"):
        return f"the Hopper grouped walk runs float16 and bfloat16 (not {kind})"
    if groups > SM90_MAX_GROUPS:
        return f"{groups} groups > {SM90_MAX_GROUPS}, the Hopper grouped walk's shared table"
    if values["k"] < 1:
        return "k = 0"
    if values.get("scale_w") or values.get("scale_x"):
        return "the Hopper grouped walk has no dequantizing store"
    for what, v in (("the weights' address", values["weights"]), ("the tokens' address", values["tokens"]),
                    ("the weights' group stride", values["w_group_bytes"]),
                    ("the weights' row stride", values["lda"] * elem_bytes),
                    ("the tokens' row stride", values["x_row_bytes"])):
        if v % 16:
            return f"TMA needs {what} ({v} bytes) in whole 16 bytes"
    return ""


class Sm90GroupedLaunch:
    """The Hopper kernel's grouped walk (``MODE == kGrouped`` in impls/sm90_gemm.cuh) for the
    expert form with device-side group sizes: ``launch_offsets(groups, offsets_ptr,
    offsets_bytes, values)``, as :meth:`GroupedLaunch.launch_offsets
    <pyblasgemm.kernels.grouped.GroupedLaunch.launch_offsets>` takes it, one launch that reads
    the sizes on the GPU (a CUDA graph of it replays any sizes).

    The kernel's problem is the stacked one (row-major ``out = tokens @ weights[g]`` per group
    is the kernel's D = P Q^T): P = the tokens, one TMA map over all ``rows`` (K-major), Q = the
    weights as a batch of ``groups`` matrices (MN-major: the features contiguous), C = the
    stacked output (its TMA-store map over all rows where C allows 16-byte boxes). Tensor maps
    are encoded per stream for the call's shapes and re-pointed when only the addresses change.

    Example (on an H100 / H200)::

        launch = Sm90GroupedLaunch("bf16", SM90_GROUPED_CONFIGS["bf16"]["medium"])
        launch.launch_offsets(groups, offs.data.ptr, 4, values)     # values: grouped.py's
    """

    def __init__(self, kind: str, config: KernelConfig, epilogue: tuple = (0, None)):
        import cupy

        from .jit import get_kernels

        from .jit import SM90_HEADER

        ok, why = config.validate(kind=kind)
        # (the family's own header: impls/sm90_gemm.cuh's MODE kGrouped is the walk launched here)
        if not ok or config.decomposition != "grouped" or config.kernel_family.header != SM90_HEADER:
            raise ValueError(f"Sm90GroupedLaunch: {config.name} is not a Hopper grouped config for {kind}"
                             f"{': ' + why if why else ''}")
        self.kind, self.config, self.epilogue = kind, config, epilogue
        self._lock = threading.Lock()
        self.kern, _ = get_kernels(config, kind, "N", "N", None, True, epi=epilogue[0])
        self.smem = config.smem_bytes(kind)
        dev = cupy.cuda.Device()
        self._dev = dev.id
        self._sms = dev.attributes["MultiProcessorCount"]   # one CTA per SM (the ring fills the SM)
        self._fptr = function(self.kern.ptr)
        self._eb = ELEM_BYTES[kind]
        self._replace_address = bindings().cuTensorMapReplaceAddress
        # stream handle -> [shape key, tensor maps, cells, params array, last bases]
        self._slots: dict = {}

    def _maps(self, groups: int, v: dict):
        """(dims, strides, box) of the tokens' (P), the weights' (Q) and the output's (C) maps."""
        eb, cfg = self._eb, self.config
        rows, m, k, ob = v["rows"], v["m"], v["k"], v["out_bytes"]
        x_rows = max(rows, 1)
        pmap = ((k, x_rows, 1), (v["x_row_bytes"], -(-(x_rows * v["x_row_bytes"]) // 16) * 16), (64, cfg.bn, 1))
        qmap = ((m, k, groups), (v["lda"] * eb, v["w_group_bytes"]), (64, 64, 1))
        cmap = ((m, x_rows, 1), (v["ldc"] * ob, -(-(x_rows * v["ldc"] * ob) // 16) * 16), (128 // ob, 64, 1))
        return pmap, qmap, cmap

    def launch_offsets(self, groups: int, offsets_ptr: int, offsets_bytes: int, values: dict,
                       fused: bool | None = None) -> None:
        """One launch of the walk over ``groups`` groups whose end rows (or, with ``group_rows``
        > 0 in ``values``, the masked layout's valid row counts) are ``offsets_bytes``-wide
        integers at ``offsets_ptr`` on the GPU. ``fused`` is accepted for the table launch's
        signature: this launch is always one. ValueError, before any work, where TMA or the
        group table cannot take the arrays (:func:`grouped_refusal`)."""
        if groups == 0 or values["rows"] == 0 or values["m"] == 0:
            return
        why = grouped_refusal(self.kind, values, groups, self._eb)
        if why:
            raise ValueError(f"Sm90GroupedLaunch: {why}")
        if offsets_bytes not in (4, 8):
            raise ValueError(f"Sm90GroupedLaunch: offsets_bytes={offsets_bytes} must be 4 or 8")
        cfg = self.config
        tiles_n = -(-values["m"] // cfg.bm)
        # no more CTAs than tiles can exist: each group adds at most one partial row tile
        bound = tiles_n * (-(-values["rows"] // cfg.bn) + groups)
        if bound >= 2**31:
            raise ValueError(f"Sm90GroupedLaunch: up to {bound} tiles exceed 2^31")
        with self._lock:
            sptr = stream_handle(None)
            out_bytes = values["out_bytes"]
            c_pair = int(values["out"] % 16 == 0 and values["ldc"] % (16 // out_bytes) == 0)
            shape = (groups, values["rows"], values["m"], values["k"], values["x_row_bytes"], values["lda"],
                     values["w_group_bytes"], values["ldc"], out_bytes, c_pair)
            slot = self._slots.get(sptr)
            if slot is None or slot[0] != shape:
                slot = self._slots[sptr] = self._slot(sptr, shape, groups, values, c_pair)
            _, (tma_p, tma_q, tma_c), cells, _, params_addr, last, cs = slot
            for i, (tmap, base) in enumerate(((tma_p, values["tokens"]), (tma_q, values["weights"]),
                                              (tma_c, values["out"]))):
                if base != last[i] and (i < 2 or c_pair):
                    err, = self._replace_address(tmap, base)
                    if err:
                        recover(err, self._dev, "cuTensorMapReplaceAddress", self._replace_address, tmap, base)
                    last[i] = base
            cells["c"].value = values["out"]
            cells["offsets"].value, cells["offsets_wide"].value = offsets_ptr, int(offsets_bytes == 8)
            cells["group_rows"].value = values.get("group_rows", 0)
            cells["bias"].value, cells["bias_mode"].value = values.get("bias", 0), values.get("bias_mode", 0)
            cells["bias_group_bytes"].value = values.get("bias_group_bytes", 0)
            cells["alpha"].value, cells["beta"].value = values.get("alpha", 1.0), values.get("beta", 0.0)
            launch_kernel(self._dev, self._fptr, max(1, min(bound, self._sms)), 1, 1, cfg.threads, 1, 1, self.smem,
                          cs, params_addr)

    def _slot(self, sptr: int, shape: tuple, groups: int, v: dict, c_pair: int):
        """A stream's tensor maps and argument cells for one shape (``shape``: what the maps and
        the constant arguments depend on)."""
        pmap, qmap, cmap = self._maps(groups, v)
        kind = self.kind
        tma_p = encode_tiled(kind, v["tokens"], *pmap)
        tma_q = encode_tiled(kind, v["weights"], *qmap)
        tma_c = (encode_tiled(kind, v["out"], *cmap, dtype=TMA_C_DTYPE[kind]) if c_pair
                 else bindings().CUtensorMap())
        base = dict(c=0, ws=0, flags=0, mt=v["rows"], nt=v["m"], k=v["k"], ldc=v["ldc"], sc=0, batch=groups,
                    p_batched=0, q_batched=1, alpha=1.0, beta=0.0, ialpha=0, ibeta=0, c_pair=c_pair,
                    group_m=self.config.group_m, splits=1, kt_per_split=0, dp_tiles=0, sk_tiles=0, bias=0, pre=0,
                    bias_mode=0, scale_m=0, scale_n=0, offsets=0, offsets_wide=0, group_rows=0, bias_group_bytes=0)
        cells = {name: typ(base[name]) for name, typ in _FIELDS}
        ptrs = [tma_p.getPtr(), tma_q.getPtr(), tma_c.getPtr()] + [ct.addressof(cells[n]) for n, _ in _FIELDS]
        params = (ct.c_void_p * len(ptrs))(*ptrs)
        return [shape, (tma_p, tma_q, tma_c), cells, params, ct.addressof(params),
                [v["tokens"], v["weights"], v["out"]], stream(sptr)]
