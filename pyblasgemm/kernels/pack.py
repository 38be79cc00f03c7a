"""Operands packed into aligned storage before the GEMM: a pitched copy, or a transposing one.

TMA describes a global tensor only when its row pitch is a multiple of 16 bytes, and the
mma.sync kernel's cp.async takes 16-byte chunks under the same rule; an odd leading dimension
(``lda = 8959`` in float16) otherwise leaves the scalar-copy path, which ran at 40-60 TFLOP/s
where cuBLAS ran 100-200 (H100, issue 14). A pitched copy into storage whose
pitch is rounded up to 16 bytes (our kernel in ``src/pack_copies.cu``: ``cudaMemcpy2DAsync``
with an odd source pitch reached only 24-42 % of the H100's DRAM bandwidth) costs two passes
of the operand over DRAM and puts the problem back on the fast kernels. The Hopper int8 kernel reads K-major operands only (8-bit ``wgmma`` has no
transpose bit): an M- or N-major int8 operand is transposed into K-major storage
(``src/pack_copies.cu``, 64 x 64 byte tiles through shared memory). The planner weighs
each copy's cost (:func:`copy_seconds`) against what it saves.

Example (on a GPU)::

    steps = pack_steps(problem, ("a",))     # problem: the caller's KernelProblem
    launch = PackedLaunch(bind(packed), steps, device)   # packed: the same with A's ld aligned
    launch(a_ptr, b_ptr, c_ptr, 1.0, 0.0, stream_handle)
"""
from __future__ import annotations

import ctypes as ct
import threading
from dataclasses import dataclass
from pathlib import Path

from .driver import function, launch_kernel, stream, stream_handle
from .problem import KernelProblem

__all__ = ["PackStep", "pack_steps", "packed_ld", "PackedLaunch", "copy_seconds", "PACK_ALIGN",
           "PACK_SOURCE", "COPY_KERNELS"]

#: the copies' CUDA source (outside include/: the GEMM headers' fingerprint)
PACK_SOURCE = Path(__file__).resolve().parent / "src" / "pack_copies.cu"
_TILE = 64              # bytes per side of the transpose's tile (src/pack_copies.cu)


@dataclass(frozen=True)
class PackStep:
    """One operand's copy: a stored ``rows x cols`` column-major matrix per batch entry (pitch
    ``ld``, entries ``stride`` apart) into storage of pitch ``packed_ld`` (entries
    ``packed_stride`` apart); ``transpose``: the storage holds its ``cols x rows`` transpose."""

    operand: str        # 'a' or 'b'
    rows: int
    cols: int
    batch: int
    ld: int
    stride: int
    packed_ld: int
    packed_stride: int
    elem_bytes: int
    transpose: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of the packed storage."""
        per_entry = self.packed_ld * (self.rows if self.transpose else self.cols)
        return max(self.packed_stride * (self.batch - 1) + per_entry, per_entry) * self.elem_bytes


#: 16 bytes: TMA's rule for global strides and base addresses, and cp.async's widest copy
PACK_ALIGN = 16


def packed_ld(rows: int, elem_bytes: int) -> int:
    """The smallest leading dimension >= ``rows`` whose pitch is a multiple of PACK_ALIGN bytes.

    Example::

        >>> packed_ld(1023, 2), packed_ld(1024, 2), packed_ld(5001, 1)
        (1024, 1024, 5008)
    """
    per = PACK_ALIGN // elem_bytes
    return -(-rows // per) * per


def pack_steps(problem: KernelProblem, operands: tuple) -> tuple:
    """The copies that put ``operands`` of ``problem`` into 16-byte pitched storage: 'a', 'b'
    (same layout), 'at', 'bt' (transposed: int8 only, to K-major). A same-layout copy of a
    batch needs its entries to be one pitched block (``stride == ld * cols``); a transposing
    one any stride but 0 (the planner asks only then)."""
    steps = []
    eb = problem.elem_bytes
    for name in operands:
        which, transpose = name[0], name.endswith("t")
        if which == "a" and name in ("a", "at"):
            rows, cols = (problem.k, problem.m) if problem.transa == "T" else (problem.m, problem.k)
            ld, stride = problem.lda, problem.stride_a
        elif which == "b" and name in ("b", "bt"):
            rows, cols = (problem.n, problem.k) if problem.transb == "T" else (problem.k, problem.n)
            ld, stride = problem.ldb, problem.stride_b
        else:
            raise ValueError(f"pack_steps: operand {name!r} is not 'a', 'b', 'at' or 'bt'")
        batch = problem.batch
        if transpose:
            if eb != 1:
                raise ValueError(f"pack_steps: the transposing copy moves bytes (int8), not {eb}-byte elements")
            if batch > 1 and stride == 0:
                raise ValueError(f"pack_steps: operand {name!r} is broadcast over the batch")
            pld = packed_ld(cols, eb)
            steps.append(PackStep(name, rows, cols, batch, ld, stride, pld, pld * rows if batch > 1 else 0,
                                  eb, True))
            continue
        if batch > 1 and stride != ld * cols:
            raise ValueError(f"pack_steps: operand {name!r}'s batch entries are not one pitched "
                             f"block (stride {stride} != ld {ld} x {cols} columns)")
        pld = packed_ld(rows, eb)
        steps.append(PackStep(name, rows, cols, batch, ld, stride, pld, pld * cols if batch > 1 else 0, eb))
    return tuple(steps)


#: The copies' GPU time, fitted to bench/pack_probe.py on the H100 (4-134 MB; files
#: bench/results/pack_probe_h100_2026-11-24_kernel_v{1,2}.json, each point within 10 %): a
#: fixed cost (launch and ramp) plus the bytes read and written at the measured fraction of
#: DRAM bandwidth. (A first guess of the full bandwidth was 2.4-9.7x too cheap:
#: bench/results/pack_probe_h100_2026-11-24.json, cudaMemcpy2DAsync.)
PITCHED_COPY = {"fixed_s": 9.7e-6, "bw_fraction": 0.69}        # kernel_v2.json, >= 512 rows
FLAT_COPY = {"fixed_s": 8.0e-6, "bw_fraction": 0.42}           # kernel_v1.json
TRANSPOSE_COPY = {"fixed_s": 12.9e-6, "bw_fraction": 0.47}     # kernel_v2.json
#: columns shorter than this take the flat copy (the column copy's blocks cover 1024 rows)
FLAT_BELOW_ROWS = 512
_FLAT_BLOCKS = 1056             # the flat copy's grid-stride grid: 8 blocks per SM on 132
#: the copy kernels of src/pack_copies.cu
COPY_KERNELS = ("pyb_transpose_b8",) + tuple(
    f"pyb_pitch_copy{flat}_b{b}" for flat in ("", "_flat") for b in (1, 2, 4))


def copy_seconds(nbytes: int, dram_bw: float, transpose: bool = False, rows: int = 1 << 30) -> float:
    """Predicted GPU time of one packing copy of ``nbytes`` (of packed storage) whose columns
    hold ``rows`` elements: a fixed cost plus the bytes read and written at the measured
    fraction of DRAM bandwidth of the kernel that runs it.

    Example::

        >>> round(copy_seconds(134_217_728, 3.35e12, rows=8191) * 1e6)   # measured 125.2
        126
    """
    c = TRANSPOSE_COPY if transpose else (PITCHED_COPY if rows >= FLAT_BELOW_ROWS else FLAT_COPY)
    return c["fixed_s"] + 2.0 * nbytes / (dram_bw * c["bw_fraction"])


_fns: dict = {}
_lock = threading.Lock()


def _copy_kernels(dev: int) -> dict:
    """{name: CUfunction} of the packing copies on device ``dev``: compiled by the package's
    own NVRTC compile (:func:`pyblasgemm.kernels.jit.load_kernels`, its options and its disk
    cache, as every other kernel family), loaded once per process and device."""
    fns = _fns.get(dev)
    if fns is None:
        from .jit import load_kernels

        with _lock:
            loaded = load_kernels(PACK_SOURCE.read_text(), COPY_KERNELS, dev)
            fns = _fns[dev] = {n: function(k.ptr) for n, k in loaded.items()}
    return fns


class _CopyArgs:
    """One copy's kernel, grid, block and arguments (ctypes cells and the void* array
    cuLaunchKernel reads); the source pointer, cell 0, is set per call."""

    def __init__(self, step: PackStep, dst: int, fns: dict):
        if step.transpose:
            types = (ct.c_uint64, ct.c_int64, ct.c_int64, ct.c_uint64, ct.c_int64, ct.c_int64,
                     ct.c_int32, ct.c_int32)
            vals = (0, step.ld, step.stride, dst, step.packed_ld, step.packed_stride, step.rows, step.cols)
            self.fn = fns["pyb_transpose_b8"]
            self.grid, self.block = (-(-step.rows // _TILE), -(-step.cols // _TILE), step.batch), (16, 16, 1)
        else:
            # a dense batch is one pitched block: its entries' columns follow one another
            cols = step.cols * step.batch
            types = (ct.c_uint64, ct.c_int64, ct.c_uint64, ct.c_int64, ct.c_int32, ct.c_int64)
            vals = (0, step.ld, dst, step.packed_ld, step.rows, cols)
            if step.rows >= FLAT_BELOW_ROWS:
                self.fn = fns[f"pyb_pitch_copy_b{step.elem_bytes}"]
                # 256 threads x 4 elements per block along a column; columns along y
                # (hardware limit 65535, the kernel strides over the rest)
                self.grid = (min(64, -(-step.rows // 1024)), min(cols, 65535), 1)
            else:
                self.fn = fns[f"pyb_pitch_copy_flat_b{step.elem_bytes}"]
                self.grid = (min(_FLAT_BLOCKS, -(-step.rows * cols // 256)), 1, 1)
            self.block = (256, 1, 1)
        self.cells = [t(v) for t, v in zip(types, vals)]
        self.ptrs = (ct.c_void_p * len(self.cells))(*[ct.addressof(c) for c in self.cells])
        self.addr = ct.addressof(self.ptrs)


class PackedLaunch:
    """A bound launch of the packed problem preceded by the copies: called exactly like the
    launch it wraps, with the caller's pointers. The packed storage is owned here, one set per
    stream (calls on one stream are ordered by it), and freed with the launch."""

    __slots__ = ("_lock", "inner", "steps", "a_align", "b_align", "c_align", "_dev", "_slots",
                 "_fns", "spec", "config", "__weakref__")

    def __init__(self, inner, steps: tuple, dev: int):
        # calls from several threads take turns: the packed copies and the inner launch share
        # per-stream buffers (a Dask threaded scheduler's tasks raced here: H100, this session)
        self._lock = threading.Lock()
        self.inner, self.steps, self._dev = inner, steps, dev
        self.spec, self.config = getattr(inner, "spec", None), getattr(inner, "config", None)
        # the plan was made for every pointer 16-byte aligned (the unpacked operand's class)
        self.a_align = self.b_align = 16
        self.c_align = getattr(inner, "c_align", 16)
        self._slots = {}
        self._fns = _copy_kernels(dev)

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes owned: the packed storage over all streams, plus the inner launch's."""
        own = sum(b.nbytes for bufs, *_ in self._slots.values() for b in bufs)
        return own + int(getattr(self.inner, "workspace_nbytes", 0) or 0)

    def _slot(self, sptr: int) -> tuple:
        import cupy

        with cupy.cuda.Device(self._dev):
            bufs = tuple(cupy.empty(s.nbytes, dtype=cupy.uint8) for s in self.steps)
        args = tuple(_CopyArgs(s, b.data.ptr, self._fns) for s, b in zip(self.steps, bufs))
        slot = self._slots[sptr] = (bufs, args, stream(sptr))
        return slot

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        with self._lock:   # one caller at a time: the cells are shared (see __init__)
            sptr = stream if type(stream) is int else stream_handle(stream)
            bufs, args, cs = self._slots.get(sptr) or self._slot(sptr)
            ptrs = {"a": a_ptr, "b": b_ptr}
            for s, buf, cargs in zip(self.steps, bufs, args):
                name = s.operand[0]
                cargs.cells[0].value = ptrs[name]
                (gx, gy, gz), (bx, by, bz) = cargs.grid, cargs.block
                launch_kernel(self._dev, cargs.fn, gx, gy, gz, bx, by, bz, 0, cs, cargs.addr)
                ptrs[name] = buf.data.ptr
            self.inner(ptrs["a"], ptrs["b"], c_ptr, alpha, beta, sptr)
