"""The problem handed to our kernels: one (strided-batched) column-major GEMM.

C (m x n, column-major, leading dimension ldc) = alpha * op(A) @ op(B) + beta * C.
``transa='N'``: op(A)[i, p] = a[i + p*lda]   (M-contiguous);  ``'T'``: a[p + i*lda] (K-contiguous).
``transb='N'``: op(B)[p, j] = b[p + j*ldb]   (K-contiguous);  ``'T'``: b[j + p*ldb] (N-contiguous).
Batch index z advances each operand pointer by ``stride_*`` elements (0 broadcasts).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..kinds import KERNEL_KINDS

__all__ = ["KernelProblem", "KINDS", "ACCUMULATE", "ELEM_BYTES", "C_BYTES", "OUT_DTYPE", "BASE_KIND"]

# Every table below is read off the kinds table (pyblasgemm/kinds.py: one row per kind).
#: kind -> allowed accumulate types (first = default)
ACCUMULATE = {k: r.accumulators for k, r in KERNEL_KINDS.items()}
KINDS = tuple(ACCUMULATE)
#: bytes per A/B element
ELEM_BYTES = {k: r.elem_bytes for k, r in KERNEL_KINDS.items()}
#: bytes per C element
C_BYTES = {k: r.c_bytes for k, r in KERNEL_KINDS.items()}
#: NumPy dtype name of C
OUT_DTYPE = {k: r.c_dtype for k, r in KERNEL_KINDS.items()}
#: the kind whose MMA and operand path a kind shares (calibration, peaks): the fp32-output
#: kinds run the 16-bit kinds' mainloop and differ only in the epilogue
BASE_KIND = {k: r.base_kind for k, r in KERNEL_KINDS.items()}


@dataclass(frozen=True)
class KernelProblem:
    """One GEMM for :func:`pyblasgemm.kernels.launch.run` (all sizes in elements).

    The caller guarantees m, n, k >= 1, alpha != 0, lda/ldb/ldc >= the stored row count,
    and that C does not overlap A or B. ``beta == 0`` means C is written without being read.

    Example::

        p = KernelProblem(kind="f16", transa="N", transb="N", m=128, n=64, k=32,
                          lda=128, ldb=32, ldc=128, a_ptr=a.data.ptr, b_ptr=b.data.ptr,
                          c_ptr=c.data.ptr, alpha=1.0, beta=0.0)
    """

    kind: str
    transa: str
    transb: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    a_ptr: int
    b_ptr: int
    c_ptr: int
    alpha: float | int = 1.0
    beta: float | int = 0.0
    accumulate: str | None = None  # None -> the kind's default (f32, or s32 for s8)
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0

    @property
    def acc(self) -> str:
        """The accumulate type, with the kind's default filled in."""
        return self.accumulate if self.accumulate is not None else ACCUMULATE[self.kind][0]

    @property
    def a_k_contiguous(self) -> bool:
        return self.transa == "T"

    @property
    def b_k_contiguous(self) -> bool:
        return self.transb == "N"

    @property
    def elem_bytes(self) -> int:
        return ELEM_BYTES[self.kind]

    @property
    def c_bytes(self) -> int:
        return C_BYTES[self.kind]

    def operands_vectorizable(self) -> bool:
        """True when A and B allow 16-byte cp.async: pointers 16-byte aligned and
        lda/ldb (and batch strides) multiples of 16 bytes' worth of elements."""
        ve = 16 // self.elem_bytes
        ok = self.a_ptr % 16 == 0 and self.b_ptr % 16 == 0 and self.lda % ve == 0 and self.ldb % ve == 0
        if self.batch > 1:
            ok = ok and self.stride_a % ve == 0 and self.stride_b % ve == 0
        return ok

    def c_vectorizable(self) -> bool:
        """True when C allows 16-byte stores (interior chunks; edges stay scalar)."""
        ov = 16 // self.c_bytes
        ok = self.c_ptr % 16 == 0 and self.ldc % ov == 0
        if self.batch > 1:
            ok = ok and self.stride_c % ov == 0
        return ok
