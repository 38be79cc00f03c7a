"""Operands packed into aligned storage before the GEMM: a pitched copy per operand.

TMA describes a global tensor only when its row pitch is a multiple of 16 bytes, and the
mma.sync kernel's cp.async takes 16-byte chunks under the same rule; an odd leading dimension
(``lda = 8959`` in float16) otherwise leaves the scalar-copy path, which ran at 40-60 TFLOP/s
where cuBLAS ran 100-200 (H100, issue 14). A pitched device-to-device copy
(``cudaMemcpy2DAsync``) into storage whose pitch is rounded up to 16 bytes costs two passes of
the operand over DRAM (~80 µs for a 117 MB operand at 3 TB/s) and puts the problem back on the
fast kernels; the planner weighs that cost (:func:`copy_seconds`) against what it saves.

Example (on a GPU)::

    steps = pack_steps(problem, ("a",))     # problem: the caller's KernelProblem
    launch = PackedLaunch(bind(packed), steps, device)   # packed: the same with A's ld aligned
    launch(a_ptr, b_ptr, c_ptr, 1.0, 0.0, stream_handle)
"""
from __future__ import annotations

from dataclasses import dataclass

from .problem import KernelProblem

__all__ = ["PackStep", "pack_steps", "PackedLaunch", "copy_seconds"]

#: cudaMemcpyDeviceToDevice
_D2D = 3
@dataclass(frozen=True)
class PackStep:
    """One operand's copy: ``rows`` contiguous elements per column, ``cols`` columns (all batch
    entries of a dense batch, as one pitched block), from pitch ``ld`` to pitch ``packed_ld``."""

    operand: str        # 'a' or 'b'
    rows: int
    cols: int
    ld: int
    packed_ld: int
    elem_bytes: int

    @property
    def nbytes(self) -> int:
        """Bytes of the packed storage."""
        return self.packed_ld * self.cols * self.elem_bytes


def _ld_for(rows: int, elem_bytes: int) -> int:
    per = 16 // elem_bytes
    return -(-rows // per) * per


def pack_steps(problem: KernelProblem, operands: tuple) -> tuple:
    """The copies that put ``operands`` ('a', 'b') of ``problem`` into 16-byte pitched storage.
    A batch must be one pitched block (``stride == ld * cols``); the planner only asks then."""
    steps = []
    eb = problem.elem_bytes
    for name in operands:
        if name == "a":
            rows, cols = (problem.k, problem.m) if problem.transa == "T" else (problem.m, problem.k)
            ld, stride = problem.lda, problem.stride_a
        elif name == "b":
            rows, cols = (problem.n, problem.k) if problem.transb == "T" else (problem.k, problem.n)
            ld, stride = problem.ldb, problem.stride_b
        else:
            raise ValueError(f"pack_steps: operand {name!r} is not 'a' or 'b'")
        if problem.batch > 1 and stride != ld * cols:
            raise ValueError(f"pack_steps: operand {name!r}'s batch entries are not one pitched "
                             f"block (stride {stride} != ld {ld} x {cols} columns)")
        steps.append(PackStep(name, rows, cols * problem.batch, ld, _ld_for(rows, eb), eb))
    return tuple(steps)


def copy_seconds(nbytes: int, dram_bw: float) -> float:
    """Predicted GPU time of one pitched copy of ``nbytes``: read and write once at DRAM speed
    (the copy kernel streams; an odd source pitch costs it partial sectors, within the
    bandwidth floor's error at these sizes)."""
    return 2.0 * nbytes / dram_bw


class PackedLaunch:
    """A bound launch of the packed problem preceded by the copies: called exactly like the
    launch it wraps, with the caller's pointers. The packed storage is owned here, one set per
    stream (calls on one stream are ordered by it), and freed with the launch."""

    __slots__ = ("inner", "steps", "a_align", "b_align", "c_align", "_dev", "_bufs", "_copy",
                 "spec", "config", "__weakref__")

    def __init__(self, inner, steps: tuple, dev: int):
        from cupy.cuda import runtime

        self.inner, self.steps, self._dev = inner, steps, dev
        self.spec, self.config = getattr(inner, "spec", None), getattr(inner, "config", None)
        # the unpacked operand keeps the inner launch's class; a packed one needs only its
        # element alignment, but the class was planned with every pointer 16-byte aligned
        self.a_align = self.b_align = 16
        self.c_align = getattr(inner, "c_align", 16)
        self._bufs = {}
        self._copy = runtime.memcpy2DAsync

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes owned: the packed storage over all streams, plus the inner launch's."""
        own = sum(b.nbytes for bufs in self._bufs.values() for b in bufs)
        return own + int(getattr(self.inner, "workspace_nbytes", 0) or 0)

    def _storage(self, sptr: int) -> tuple:
        import cupy

        with cupy.cuda.Device(self._dev):
            bufs = tuple(cupy.empty(s.nbytes, dtype=cupy.uint8) for s in self.steps)
        self._bufs[sptr] = bufs
        return bufs

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        from .driver import stream_handle

        sptr = stream if type(stream) is int else stream_handle(stream)
        bufs = self._bufs.get(sptr) or self._storage(sptr)
        ptrs = {"a": a_ptr, "b": b_ptr}
        for s, buf in zip(self.steps, bufs):
            dst = buf.data.ptr
            self._copy(dst, s.packed_ld * s.elem_bytes, ptrs[s.operand], s.ld * s.elem_bytes,
                       s.rows * s.elem_bytes, s.cols, _D2D, sptr)
            ptrs[s.operand] = dst
        self.inner(ptrs["a"], ptrs["b"], c_ptr, alpha, beta, sptr)
