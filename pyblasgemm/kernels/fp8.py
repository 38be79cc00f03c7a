"""The GPU route of float8 products (:func:`pyblasgemm.fp8.scaled_matmul` with CuPy arrays, and
CUDA tensors / JAX GPU arrays through the array door): the mma.sync kernel's float8 kinds
(``KindFp8F32``, sm_89+) with the scales in the dequantizing store; on sm_90 the Hopper
kernel's (``Sm90KindFp8``: wgmma, TMA) for K-major operands, block scales included
(:func:`pyblasgemm.planner.fp8.sm90_config`; :data:`FAMILY` = 'sm80' keeps mma.sync).

``out = act(alpha·(scale_a ⊙ a) @ (scale_b ⊙ b) + beta·out + bias)`` in one launch: the
kernel accumulates the raw float8 products in float32 and its store multiplies each element
by ``scale_m[row] · scale_n[col]`` (or the one value of a per-tensor scale: a pointer read on
the device, so a captured CUDA graph replays whatever the scale holds then), then alpha,
beta·C, bias and the activation, in that order (``epilogue/sm80_smem_epilogue.cuh``); block
scales are applied in the mainloop instead (below).

Orientation. The kernel is column-major; a row-major result ``c`` (m x n) is computed as
``c^T = b^T a^T`` (kernel m = n, n = m, A = b, B = a: scale_b scales the kernel's rows); a
column-major result directly. Each operand is read in place in whichever of its two layouts
it has: K-contiguous operands (``a`` row-major, ``b`` column-major: ``torch._scaled_mm``'s
layout) take ldmatrix fragments, the others the s8 kind's byte gathers (the m16n8k32
fragments of float8 and int8 are the same bytes), so no layout is packed or refused. An
operand with neither layout (strided both ways, negative strides) is copied to a row-major one
first. A result (or ``preactivation_out``) that is neither C- nor F-contiguous in whole
16-byte rows, is misaligned or overlaps an operand is computed into a padded temporary and
copied (with ``beta != 0`` the old values are copied in first).

Routes (:func:`pyblasgemm.planner.fp8.choose_route`: the plan's backend and ``reason``). cuBLASLt's FP8 GEMM
(:class:`pyblasgemm.backends.cublaslt.LtFp8Launch`) runs a product where it can take it and is
the faster: on an H200 (bench/results/fp8_h200_2026-11-29_e1f052c.json) our kernels ran
0.72-0.85x ``torch._scaled_mm`` (which is cuBLASLt) at 4096³ / 8192³, per-tensor and per-row /
per-column scales alike, so every case above
:data:`pyblasgemm.planner.fp8.DECODE_ROWS` that cuBLASLt takes goes to
it. It takes only the "TN" form on sm_89 / sm_90 (``a`` row-major, ``b`` column-major: both
K-contiguous, ``torch._scaled_mm``'s layout), K and the leading dimensions multiples of 16
bytes, 16-byte aligned pointers, not e5m2 x e5m2, per-tensor scales everywhere, per-row /
per-column and 128-block scales on sm_90 with cuBLAS 12.9+ only (one kind for both operands),
block scales only for a row-major result, bias only along the result's columns (rows for an
F-ordered result) and not with a float32 output, and of the activations only relu and
gelu_tanh (cuBLASLt's GELU is the tanh form), without ``preactivation_out``. The other layouts
are not transposed for it: a float8 transpose copy is a full extra pass over an operand
(at decode shapes the weight: more bytes than the GEMM reads), and our kernels read every
layout in place. Block scales go to cuBLASLt above it too (it ran 2.15-2.44x
ours at 4096³ / 8192³ on the H200): it reads them rearranged, and
:class:`pyblasgemm.backends.cublaslt.LtBlockScaled` rearranges them with this module's
:data:`BLOCK_SCALES_SOURCE` into buffers the launch owns, in the call's stream, so
a CUDA graph holds the call (scales that are not CuPy float32 arrays of the block shapes are
rearranged into per-call temporaries instead, which a graph cannot hold). ``backend='cublas'``
(or :data:`ROUTE` = 'cublaslt') forces cuBLASLt, refused with the reason where it cannot;
``backend='tensorcore'`` (or :data:`ROUTE` = 'ours') forces our kernels.

Block scales (``scale_a`` per 1 x 128 block of a, ``scale_b`` per 128 x 128 block of b, or
either beside the other layouts): DeepGEMM's promotion. The mainloop sums each 128-wide K
block into a second accumulator set and adds it into the first scaled by the block's
``scale_m · scale_n`` (a round-to-nearest FMA, in registers: the scales are read from global
memory once per block per lane); the store then scales nothing. On the Hopper kernel a stage
is one K block (float8's 128-byte K rows), and the wgmma consumers promote after each stage
(``sm90_fold_block_scaled``): a 128 x 128 scale of the kernel's m side is one value per tile
and stage. On mma.sync (sm_89, and operands that are not K-major) a block is two BK = 64
steps, and the two accumulator sets take the 128 x 64 tile of 32 x 32 warp tiles
(``FP8_CONFIGS['block']``): the 64 x 32 warp tiles spill.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kinds import FP8_KINDS  # noqa: F401  (importers read the kinds here)
from .jit import EPI_BLOCK_SHIFT

__all__ = ["MIN_CC", "FAMILY", "ROUTE", "check_device", "Arranged", "arrange", "kernel_lds", "kernel_problem",
           "launch_config", "device_scale", "in_place", "BLOCK_SCALES_SOURCE", "BLOCK_SCALE_THREADS"]

#: mma.sync with e4m3 / e5m2 operands exists from sm_89 (Ada) on
MIN_CC = (8, 9)

#: which kernel runs float8 products on sm_90: None (:func:`pyblasgemm.planner.fp8.config_for`'s
#: rule: the Hopper kernel for K-major operands, block scales included, else mma.sync) or 'sm80'
#: (always mma.sync: the tests run both). Block scales on the Hopper kernel against mma.sync's
#: block tile (H200, bench/results/fp8_h200_2026-11-29_e1f052c.json, both forced, same bytes):
#: 0.31-0.32x its time at 4096^3 / 8192^3, 0.62-0.88x on Llama-3-8B's gate/up and down layers
#: at M = 16 and 64, 1.06-1.16x on the 4096 x 4096 projection.
FAMILY = None

#: which route runs float8 products when ``backend=`` leaves it open: None
#: (:func:`pyblasgemm.planner.fp8.choose_route`'s rule), 'cublaslt' or 'ours' (forced, as
#: ``backend='cublas'`` / ``'tensorcore'`` force them)
ROUTE = None


def check_device(routine: str) -> None:
    """NotImplementedError (the host route is the way) when the current device is older than
    sm_89, whose tensor cores take no float8 operands."""
    import cupy

    cc = cupy.cuda.Device().compute_capability
    major, minor = int(cc[:-1]), int(cc[-1])
    if (major, minor) < MIN_CC:
        raise NotImplementedError(
            f"{routine}: float8 products on the GPU need compute capability "
            f"{MIN_CC[0]}.{MIN_CC[1]} or newer (mma.sync with e4m3 / e5m2 operands); this device is "
            f"{major}.{minor}: pass NumPy arrays for the host route")


def _layout(x) -> tuple | None:
    """``('row', ld)`` when ``x[i, j]`` (2-D, 1-byte elements) is at ``i*ld + j``, ``('col', ld)``
    when at ``i + j*ld``, None when neither (size-1 extents take any stride)."""
    r, c = x.shape
    s0, s1 = x.strides
    if (c == 1 or s1 == 1) and (r == 1 or s0 >= c):
        return "row", s0 if r > 1 else c
    if (r == 1 or s0 == 1) and (c == 1 or s1 >= r):
        return "col", s1 if c > 1 else r
    return None


def _dense(cp, x):
    """A row-major copy of a float8 CuPy array (copied as its bytes: CuPy has no float8 kernels)."""
    return cp.ascontiguousarray(x.view(np.uint8)).view(x.dtype)


def _writable_in_place(x, isz: int, ops) -> str | None:
    """'row' / 'col' when the kernel can store into ``x`` as it is (C- or F-ordered rows of
    whole 16-byte multiples, 16-byte aligned, not overlapping an operand), else None."""
    from .._layout import may_overlap

    r, c = x.shape
    s0, s1 = (s // isz for s in x.strides)
    if x.data.ptr % 16 or any(may_overlap(x, o) for o in ops):
        return None
    if (c == 1 or s1 == 1) and (r == 1 or s0 >= c) and (s0 * isz) % 16 == 0 and s0 > 0:
        return "row"
    if (r == 1 or s0 == 1) and (c == 1 or s1 >= r) and (s1 * isz) % 16 == 0 and s1 > 0:
        return "col"
    return None


def _padded(cp, m: int, n: int, dtype):
    """An (m, n) row-major view of a buffer whose rows are whole 16-byte multiples."""
    per = 16 // np.dtype(dtype).itemsize
    return cp.empty((m, -(-n // per) * per), dtype)[:, :n]


class Arranged(NamedTuple):
    """A float8 product's arrays as the kernels read and write them (:func:`arrange`): ``a``,
    ``b`` in one of their two layouts (``la`` / ``lb``: ``('row' | 'col', ld)``), ``c`` (and
    ``pre``, or None) stored ``target`` ('row' / 'col') ``ldc`` elements apart, 16-byte aligned;
    each the caller's own array where it could be read or written in place, else a copy or a
    padded temporary (then the caller copies ``c`` / ``pre`` back)."""

    a: object
    b: object
    c: object
    pre: object
    la: tuple
    lb: tuple
    target: str
    ldc: int


def arrange(cp, a, b, result, pre, beta: float) -> Arranged:
    """What only the GPU route knows of a float8 product's CuPy arrays: an operand with neither
    layout (strided both ways, negative strides) is copied to a row-major one; a result (or
    ``pre``) that is neither C- nor F-contiguous in whole 16-byte rows, is misaligned or meets
    an operand is replaced by a padded C-ordered temporary (holding the result's values when
    ``beta != 0``). Run on the caller's stream (the copies are enqueued there).

    Example (on a GPU)::

        arranged = arrange(cupy, a, b, out, None, 0.0)
        arranged.c is out               # an aligned, C-ordered out: written in place
    """
    m, k = a.shape
    n = b.shape[1]
    isz = result.dtype.itemsize
    la = _layout(a)
    if la is None:
        a, la = _dense(cp, a), ("row", k)
    lb = _layout(b)
    if lb is None:
        b, lb = _dense(cp, b), ("row", n)
    elif n == 1 and b.strides[0] == 1:      # one K-contiguous column: both layouts; say K-major
        lb = ("col", k)
    target = _writable_in_place(result, isz, (a, b))
    if pre is not None and (target is None or pre.strides != result.strides or pre.data.ptr % 16
                            or _writable_in_place(pre, isz, (a, b, result)) != target):
        target = None
    c, p = result, pre
    if target is None:
        target = "row"
        c = _padded(cp, m, n, result.dtype)
        if beta != 0:
            c[...] = result
        p = None if pre is None else _padded(cp, m, n, result.dtype)
    per = 16 // isz
    if target == "row":     # one row (m == 1): any ldc >= n in whole 16-byte multiples
        ldc = c.strides[0] // isz if m > 1 else -(-n // per) * per
    else:
        ldc = c.strides[1] // isz if n > 1 else -(-m // per) * per
    return Arranged(a, b, c, p, la, lb, target, ldc)


def kernel_lds(desc) -> tuple:
    """``(lda, ldb)`` of a float8 description as the kernels (ours and cuBLASLt's) take them:
    the call's, raised to the rows each operand stores where it has one row or column only (a
    size-1 extent takes any stride; the kernels need ld >= its stored rows even then).

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 1), ("col", 1), "row", 1, 1, 64, 4,
    ...                  ("tensor", "tensor"), "float32", None, None, False, "cupy", 0, (16,), 1.0, 0.0)
    >>> (d.lda, d.ldb), kernel_lds(d)
    ((1, 1), (64, 64))
    """
    return (max(desc.lda, desc.k if desc.transa == "T" else desc.m),
            max(desc.ldb, desc.n if desc.transb == "T" else desc.k))


def kernel_problem(desc, pa: int | None = None, pb: int | None = None, pc: int | None = None):
    """The kernels' ``KernelProblem`` of a float8 description (its column-major problem: kind,
    transposes, sizes, :func:`kernel_lds`). Without pointers, addresses of the description's
    alignment class (``desc.ptr_align`` for the operands; C is 16-byte aligned on this route,
    :func:`arrange`'s rule), so that a launch bound for it takes every such call's pointers.

    >>> from pyblasgemm.desc import describe_fp8
    >>> d = describe_fp8("doc", "float8_e4m3fn", "float8_e4m3fn", ("row", 64), ("col", 64), "row", 16, 48, 64,
    ...                  48, ("tensor", "tensor"), "float32", None, None, False, "cupy", 0, (8,), 1.0, 0.0)
    >>> p = kernel_problem(d); (p.kind, p.transa, p.transb, p.m, p.n, p.k), p.operands_vectorizable()
    (('e4m3', 'T', 'N', 48, 16, 64), False)
    """
    from .problem import KernelProblem

    lda, ldb = kernel_lds(desc)
    if pa is None:
        pa = pb = desc.ptr_align
        pc = 16
    return KernelProblem(desc.prefix, desc.transa, desc.transb, desc.m, desc.n, desc.k, lda, ldb, desc.ldc, pa, pb,
                         pc, float(desc.alpha), float(desc.beta))


def launch_config(problem, config, epi: int, sm_count: int):
    """The config a float8 launch runs: the plan's, or mma.sync's where the Hopper kernel's TMA
    rules refuse the problem (16-byte leading dimensions and pointers), its block tile for block
    scales (``epi``'s block modes).

    >>> from pyblasgemm.kernels.problem import KernelProblem
    >>> from pyblasgemm.kernels.config import SM90_SMALL_CONFIGS
    >>> p = KernelProblem("e4m3", "T", "N", 4096, 16, 4096, 4100, 4096, 4096, 16, 16, 16, 1.0, 0.0)
    >>> launch_config(p, SM90_SMALL_CONFIGS["e4m3"][64], 0, 132).family
    'sm80'
    """
    from .config import fp8_config

    if config.validate(problem)[0]:     # (the mma.sync tiles take every problem)
        return config
    return fp8_config(problem.m, problem.n, problem.k, sm_count, bool(epi >> EPI_BLOCK_SHIFT & 0o77))


def device_scale(cp, s):
    """A scale as a contiguous float32 device array (a per-tensor scalar stays one element:
    the kernel reads it through its pointer; a NumPy float32 scalar is copied to the device)."""
    if not isinstance(s, cp.ndarray):
        return cp.asarray(np.asarray(s, np.float32).reshape(1))
    s = s.reshape(-1) if s.ndim else s.reshape(1)
    return s if s.flags.c_contiguous else cp.ascontiguousarray(s)


def in_place(given, used) -> bool:
    """Whether a launch read ``given`` (a CuPy array, or None) at its own address: no copy
    (a strided or NumPy scale, a bias of another dtype, are copied first)."""
    if given is None:
        return used is None
    return type(given) is type(used) and given.data.ptr == used.data.ptr


BLOCK_SCALES_SOURCE = r"""
// cuBLASLt's block-scaled float8 GEMM reads its scales in other layouts than the ones callers
// hold (DeepGEMM's and torch._scaled_mm's inputs: a's 1 x 128 scales as (m, kb), b's 128 x 128
// scales as (kb, nb), any strides, in elements): a's as VEC128_32F, (kb, m) M-contiguous; b's
// as BLK128x128_32F, (nb, ldq) K-block-contiguous with ldq = kb rounded up to 4 (16-byte rows,
// the padding zero). One grid-stride pass writes both into buffers the launch owns.
extern "C" __global__ void pyblasgemm_fp8_lt_block_scales(
    const float* __restrict__ sa, long long sa_row, long long sa_col, float* __restrict__ sa_out,
    long long m, long long kb,
    const float* __restrict__ sb, long long sb_row, long long sb_col, float* __restrict__ sb_out,
    long long nb, long long ldq) {
  const long long total_a = m * kb, total = total_a + nb * ldq;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    if (i < total_a) {
      const long long q = i / m, r = i - q * m;            // sa_out[q * m + r] = sa[r, q]
      sa_out[i] = sa[r * sa_row + q * sa_col];
    } else {
      const long long j = i - total_a, col = j / ldq, q = j - col * ldq;
      sb_out[j] = q < kb ? sb[q * sb_row + col * sb_col] : 0.0f;   // sb_out[col, q] = sb[q, col]
    }
  }
}
"""
#: the relayout's CTAs: 256 threads each, at most 2 per SM (it moves at most a few MB: 8192 x 64
#: floats for a's 1 x 128 scales at m = 8192, k = 8192 is 2 MB)
BLOCK_SCALE_THREADS = 256
