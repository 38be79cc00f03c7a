"""Operands packed into aligned storage before the GEMM: a pitched copy, or a transposing one.

TMA describes a global tensor only when its row pitch is a multiple of 16 bytes, and the
mma.sync kernel's cp.async takes 16-byte chunks under the same rule; an odd leading dimension
(``lda = 8959`` in float16) otherwise leaves the scalar-copy path, which ran at 40-60 TFLOP/s
where cuBLAS ran 100-200 (H100, issue 14). A pitched device-to-device copy
(``cudaMemcpy2DAsync``) into storage whose pitch is rounded up to 16 bytes costs two passes of
the operand over DRAM (~70 µs for a 117 MB operand at 3.35 TB/s) and puts the problem back on
the fast kernels. The Hopper int8 kernel reads K-major operands only (8-bit ``wgmma`` has no
transpose bit): an M- or N-major int8 operand is transposed into K-major storage
(``src/pack_transpose.cu``, 64 x 64 byte tiles through shared memory). The planner weighs
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

from .problem import KernelProblem

__all__ = ["PackStep", "pack_steps", "PackedLaunch", "copy_seconds", "TRANSPOSE_SOURCE"]

#: cudaMemcpyDeviceToDevice
_D2D = 3
#: the transposing copy's CUDA source (outside include/: the GEMM headers' fingerprint)
TRANSPOSE_SOURCE = Path(__file__).resolve().parent / "src" / "pack_transpose.cu"
_TILE = 64              # bytes per side of the transpose's tile (src/pack_transpose.cu)


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


def _ld_for(rows: int, elem_bytes: int) -> int:
    per = 16 // elem_bytes
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
            pld = _ld_for(cols, eb)
            steps.append(PackStep(name, rows, cols, batch, ld, stride, pld, pld * rows if batch > 1 else 0,
                                  eb, True))
            continue
        if batch > 1 and stride != ld * cols:
            raise ValueError(f"pack_steps: operand {name!r}'s batch entries are not one pitched "
                             f"block (stride {stride} != ld {ld} x {cols} columns)")
        pld = _ld_for(rows, eb)
        steps.append(PackStep(name, rows, cols, batch, ld, stride, pld, pld * cols if batch > 1 else 0, eb))
    return tuple(steps)


#: the transposing copy's assumed fraction of DRAM bandwidth (byte-wide loads and stores, one
#: 64 x 64 tile per CTA; the pitched copy is taken at the full bandwidth)
TRANSPOSE_BW_FRACTION = 0.5


def copy_seconds(nbytes: int, dram_bw: float, transpose: bool = False) -> float:
    """Predicted GPU time of one packing copy of ``nbytes``: read and written once at DRAM
    speed (the pitched copy streams whole 32-byte sectors; an odd source pitch costs partial
    sectors at the row ends only), the transposing copy at ``TRANSPOSE_BW_FRACTION`` of it."""
    return 2.0 * nbytes / (dram_bw * (TRANSPOSE_BW_FRACTION if transpose else 1.0))


_transpose_fn: dict = {}
_lock = threading.Lock()


def _transpose_kernel(dev: int):
    """The compiled transposing copy for device ``dev`` (NVRTC through CuPy, cached by CuPy)."""
    fn = _transpose_fn.get(dev)
    if fn is None:
        import cupy

        with _lock, cupy.cuda.Device(dev):
            mod = cupy.RawModule(code=TRANSPOSE_SOURCE.read_text(), options=("-std=c++17",))
            fn = _transpose_fn[dev] = mod.get_function("pyb_transpose_b8")
    return fn


class _TransposeArgs:
    """The transposing copy's arguments as ctypes cells and the void* array cuLaunchKernel reads."""

    _TYPES = (ct.c_uint64, ct.c_int64, ct.c_int64, ct.c_uint64, ct.c_int64, ct.c_int64, ct.c_int32,
              ct.c_int32)

    def __init__(self, step: PackStep, dst: int):
        vals = (0, step.ld, step.stride, dst, step.packed_ld, step.packed_stride, step.rows, step.cols)
        self.cells = [t(v) for t, v in zip(self._TYPES, vals)]
        self.ptrs = (ct.c_void_p * len(self.cells))(*[ct.addressof(c) for c in self.cells])
        self.addr = ct.addressof(self.ptrs)
        self.grid = (-(-step.rows // _TILE), -(-step.cols // _TILE), step.batch)


class PackedLaunch:
    """A bound launch of the packed problem preceded by the copies: called exactly like the
    launch it wraps, with the caller's pointers. The packed storage is owned here, one set per
    stream (calls on one stream are ordered by it), and freed with the launch."""

    __slots__ = ("inner", "steps", "a_align", "b_align", "c_align", "_dev", "_slots", "_copy",
                 "_launch", "_tfn", "spec", "config", "__weakref__")

    def __init__(self, inner, steps: tuple, dev: int):
        from cupy.cuda import runtime

        from .driver import _driver

        self.inner, self.steps, self._dev = inner, steps, dev
        self.spec, self.config = getattr(inner, "spec", None), getattr(inner, "config", None)
        # the plan was made for every pointer 16-byte aligned (the unpacked operand's class)
        self.a_align = self.b_align = 16
        self.c_align = getattr(inner, "c_align", 16)
        self._slots = {}
        self._copy = runtime.memcpy2DAsync
        self._launch = _driver().launchKernel
        self._tfn = _transpose_kernel(dev).kernel.ptr if any(s.transpose for s in steps) else 0

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes owned: the packed storage over all streams, plus the inner launch's."""
        own = sum(b.nbytes for bufs, _ in self._slots.values() for b in bufs)
        return own + int(getattr(self.inner, "workspace_nbytes", 0) or 0)

    def _slot(self, sptr: int) -> tuple:
        import cupy

        with cupy.cuda.Device(self._dev):
            bufs = tuple(cupy.empty(s.nbytes, dtype=cupy.uint8) for s in self.steps)
        args = tuple(_TransposeArgs(s, b.data.ptr) if s.transpose else None
                     for s, b in zip(self.steps, bufs))
        slot = self._slots[sptr] = (bufs, args)
        return slot

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        from .driver import stream_handle

        sptr = stream if type(stream) is int else stream_handle(stream)
        bufs, args = self._slots.get(sptr) or self._slot(sptr)
        ptrs = {"a": a_ptr, "b": b_ptr}
        for s, buf, targs in zip(self.steps, bufs, args):
            src, dst = ptrs[s.operand[0]], buf.data.ptr
            if targs is not None:
                targs.cells[0].value = src
                gx, gy, gz = targs.grid
                self._launch(self._tfn, gx, gy, gz, 16, 16, 1, 0, sptr, targs.addr, 0)
            else:
                eb = s.elem_bytes
                self._copy(dst, s.packed_ld * eb, src, s.ld * eb, s.rows * eb, s.cols * s.batch, _D2D, sptr)
            ptrs[s.operand[0]] = dst
        self.inner(ptrs["a"], ptrs["b"], c_ptr, alpha, beta, sptr)
