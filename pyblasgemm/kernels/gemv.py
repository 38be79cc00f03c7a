"""Decode-shaped products on pyblasgemm's GEMV kernel (``include/pyblasgemm/gemv/gemv.cuh``).

A problem whose C has at most :data:`MAX_TOKENS` rows or columns reads its larger operand (the
*weight*, R x K) once and the smaller one (the *activations*, T x K, T <= 64) many times from
cache: its time is the weight's bytes over the memory bandwidth. This module is a separate
entry point for that kernel; the planner's decode route (:mod:`pyblasgemm.planner.decode`) calls it.

* :func:`gemv_applies` (pure): can the kernel compute this :class:`~pyblasgemm.desc.GemmDesc`?
* :func:`plan` (pure): kernel instantiation, grid, workspace, and every argument but pointers
  and scales, from the description, the SM count and the CTAs resident per SM;
* :func:`bind` / :func:`run` (GPU): compile (NVRTC, once per device), allocate the workspace
  (per stream) and launch; ``run(desc, a_ptr, b_ptr, c_ptr, alpha, beta, stream)``.

The BLAS problem ``C = alpha op(A) op(B) + beta C`` (column-major, :mod:`pyblasgemm.desc`) maps
onto the kernel's canonical form ``out[r, t] = alpha sum_p W[r, p] X[t, p] + beta out[r, t]``:
with n <= 64 (``x @ W.T`` as ``torch.nn.Linear`` holds W is transa='T', transb='N', m = out
features, n = tokens) W = op(A), X = op(B)ᵀ; with m <= 64 (and m < n) W = op(B)ᵀ, X = op(A).

Every result is bitwise reproducible run to run: partial sums over K are added in a fixed
order (the kernel's header says how), in one launch.

Example
-------
>>> from pyblasgemm._types import TYPE_ROWS
>>> from pyblasgemm.desc import describe
>>> d = describe("doc", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 1, 4096, 4096, 4096, 4096, 1, 0, 0,
...              0, "cupy", 0, (16,), 1.0, 0.0)
>>> gemv_applies(d)
(True, '')
>>> s = plan(d, sm_count=132)                 # the row-block split: 256 blocks of 16 rows, 12 warps each
>>> s.split, s.path, s.R, s.T, s.K, s.threads, s.ctas, s.row_tiles, s.csteps
('rows', 'mma_k', 4096, 1, 4096, 384, 256, 256, 11)
>>> s.kernel_name
'pyblasgemm::gemv::gemv_rows_kernel<pyblasgemm::gemv::KindBF16, 1, 1, 1, 12>'
>>> s = plan(d, sm_count=132, occupancy=4, split="stream_k")
>>> s.threads, s.ctas, s.row_tiles, s.csteps
(128, 528, 256, 16)
>>> s.kernel_name
'pyblasgemm::gemv::gemv_kernel<pyblasgemm::gemv::KindBF16, 0, 1, 2, 1, 3, 1, 4, 10>'
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from types import MappingProxyType

from ..kinds import base_compute
from .driver import function, launch_kernel, occupancy, set_max_dynamic_shared_memory, set_scales, stream_handle
from .driver import stream as cu_stream

__all__ = ["MAX_TOKENS", "GemvKind", "GEMV_KINDS", "TILES", "TILES_X_ELEM", "tiles_of", "PIPES", "X_PRE", "ASYNC", "NO_PREFETCH", "pipe_of", "ring_bytes",
           "SPLITS", "ROWS_TILES", "ROWS_RESIDENT_WARPS", "MAX_ROWS_WARPS", "rows_kernel_name",
           "GemvSpec", "gemv_applies", "plan",
           "kernel_name", "all_instantiations", "compile_offline", "get_kernel", "warm", "GemvLaunch",
           "bind", "run", "HEADER", "MAX_REGISTERS", "MAX_EXTENT"]

HEADER = "pyblasgemm/gemv/gemv.cuh"
#: the largest token count (C's smaller side) the kernel takes: 8 MMA columns x 8 token groups
MAX_TOKENS = 64
#: __launch_bounds__(256, 2) in the header: ptxas keeps every instantiation within this many
#: registers per thread (two 256-thread CTAs fit an SM's 64 K registers)
MAX_REGISTERS = 128
#: CTAs' threads resident per SM that :func:`plan` assumes when not told (128 registers per
#: thread: 512 threads fill 64 K registers); :func:`bind` asks the driver instead
ASSUMED_RESIDENT_THREADS = 512
#: the largest m, n, k: row and k indices are 32-bit in the kernel, and a step or tile past the
#: end (up to 512 rows, 512 k) must not overflow
MAX_EXTENT = 2**31 - 1024


@dataclass(frozen=True)
class GemvKind:
    """One operand type of the GEMV kernel: its C++ kind structs for a K-contiguous and for an
    R-contiguous weight, and which mainloop each takes (:data:`TILES`)."""

    name: str
    struct_k: str           # C++ kind (namespace pyblasgemm::gemv) with a K-contiguous weight
    path_k: str
    struct_r: str           # ... with an R-contiguous weight
    path_r: str
    elem_bytes: int
    c_bytes: int
    integer: bool           # int8 in, int32 out, integer alpha and beta


def _kind(name, k, pk, r, pr, eb, cb, integer=False):
    return GemvKind(name, k, pk, r, pr, eb, cb, integer)


_KINDS = {k.name: k for k in (
    _kind("f16", "KindF16", "mma_k", "KindF16", "mma_r", 2, 2),
    _kind("bf16", "KindBF16", "mma_k", "KindBF16", "mma_r", 2, 2),
    _kind("f16_out32", "KindF16Out32", "mma_k", "KindF16Out32", "mma_r", 2, 4),
    _kind("bf16_out32", "KindBF16Out32", "mma_k", "KindBF16Out32", "mma_r", 2, 4),
    _kind("s8", "KindS8", "mma_k", "KindS8Fma", "fma_r", 1, 4, integer=True),
    # float32 on CUDA cores (FFMA, round to nearest): as accurate as SGEMM, so it serves the
    # tf32 and 3xTF32 modes too (a weight read once leaves no time for tensor cores to save)
    _kind("f32", "KindF32", "fma_k", "KindF32", "fma_r", 4, 4),
)}

#: (BLAS prefix, compute mode) -> the GEMV kind that serves it. Not served: float16 accumulation
#: ('h', 'fp16': this kernel accumulates in float32, a different answer), float64 and complex.
GEMV_KINDS = MappingProxyType({
    ("h", "fp32"): _KINDS["f16"], ("b", "fp32"): _KINDS["bf16"], ("sh", "fp32"): _KINDS["f16_out32"],
    ("sb", "fp32"): _KINDS["bf16_out32"], ("i", "int32"): _KINDS["s8"], ("s", "fp32"): _KINDS["f32"],
    ("s", "tf32"): _KINDS["f32"], ("s", "3xtf32"): _KINDS["f32"],
})

#: template PATH of the header per mainloop
PATHS = {"mma_k": 0, "mma_r": 1, "fma_k": 2, "fma_r": 3}
#: per mainloop and token groups TG = ceil(T / 8): (P1, P2, WR, WK): the header's template P1,
#: P2 (mma_k: row groups of 16 per warp, 16-byte vectors per row per step; mma_r: rows per lane;
#: fma_k: rows per lane, token lanes; fma_r: token lanes) and the CTA's warps along
#: rows (WR: they share each activation load through L1) x along k (WK: their sums meet in shared
#: memory, so a CTA publishes one partial, not WK). Every instantiation stays within
#: MAX_REGISTERS without spilling, with 2-8 KB of weight in flight per warp.
TILES = MappingProxyType({
    "mma_k": {1: (1, 2, 1, 4), 2: (2, 1, 2, 2), 4: (1, 2, 4, 2), 8: (1, 1, 8, 1)},
    "mma_r": {1: (8, 0, 1, 4), 2: (4, 0, 2, 2), 4: (4, 0, 4, 2), 8: (2, 0, 8, 1)},
    "fma_k": {1: (4, 1, 2, 2), 2: (2, 1, 4, 1), 4: (2, 2, 8, 1), 8: (2, 4, 8, 1)},
    "fma_r": {1: (1, 0, 1, 4), 2: (2, 0, 2, 2), 4: (4, 0, 4, 2), 8: (8, 0, 8, 1)},
})
#: where the activations take no aligned vector loads (the warp stages them through its parking
#: area, which a 128-byte step does not fit at T <= 8): these tiles instead of :data:`TILES`'
TILES_X_ELEM = MappingProxyType({"mma_k": {1: (2, 1, 1, 4)}})


def tiles_of(path: str, tg: int, loads: int) -> tuple:
    """(P1, P2, WR, WK) of the shipped instantiation for this mainloop, token groups and load
    class (:data:`TILES`, or :data:`TILES_X_ELEM` without aligned activation vectors)."""
    if not loads & X_VEC and tg in TILES_X_ELEM.get(path, {}):
        return TILES_X_ELEM[path][tg]
    return TILES[path][tg]


#: the mma_k mainloop's register ring per token groups (the header's template PIPE, applied
#: where both operands take aligned vector loads, else 0: the header's defaults): bits 0-2 the
#: ring's depth, bit 3 (:data:`X_PRE`) the activations' vectors loaded with the weight's, steps
#: ahead, bit 4 (:data:`ASYNC`) the ring in shared memory (MmaK's comment says why). Other
#: mainloops: 0.
X_PRE = 8
#: bit 4 of PIPE: the ring in shared memory, filled by cp.async (implies X_PRE)
ASYNC = 16
#: bit 5 of PIPE: the weight's loads without the 256-byte L2 prefetch hint
NO_PREFETCH = 32
PIPES = MappingProxyType({"mma_k": {1: 2 | X_PRE, 2: 2 | X_PRE, 4: 0, 8: 0}})
#: token groups of 8 the kernel is instantiated for (a T between two runs the larger; the
#: kernel skips the groups past T)
TOKEN_GROUPS = (1, 2, 4, 8)
#: template LOADS bits: the weight's / the activations' rows take aligned vector loads
W_VEC, X_VEC = 1, 2


#: token groups -> how the mma_k mainloop with both operands in 16-byte vectors splits the work
#: by default: 'rows' (gemv_rows_kernel: whole row blocks per CTA, K split over the CTA's warps
#: only, no workspace; the weight's rows must give every resident warp a share, which decode
#: layers' 3584-18944 rows do) or 'stream_k' (gemv_kernel: equal unit ranges across the grid,
#: partials of shared row tiles summed in the kernel). Other mainloops and load classes:
#: 'stream_k'. docs/design/gemv.md, fourth round, says why and what was measured.
SPLITS = MappingProxyType({1: "rows", 2: "rows", 4: "stream_k", 8: "stream_k"})
#: the row-block split's mma_k tiles per token groups: (row groups of 16 per warp, 16-byte vectors
#: per row per step, PIPE). T <= 8: one 16-row MMA tile x 64 bytes of each row per warp step, a
#: register ring of four steps with the activations prefetched: 76 registers, so 24 warps per SM
#: and more blocks x warps in flight (the H100 sweep, bench/results/gemv_rows_*_2ea2fde: geomean
#: 3% under the 128-byte two-step ring at 90 registers / 20 warps, gate/up 0.93x -> 1.0x of
#: cuBLAS). T = 16: 128 bytes per row step, two steps, activations prefetched (124 registers; the
#: leaner rings lost 5% there)
ROWS_TILES = MappingProxyType({1: (1, 1, 4 | X_PRE), 2: (1, 2, 2 | X_PRE)})
#: warps resident per SM with ROWS_TILES' instantiation (sm_90 ptxas: 76 registers -> 24, 124 ->
#: 16; the driver's count on an H100): the plan's default, which bind() replaces by the
#: driver's count on the device
ROWS_RESIDENT_WARPS = MappingProxyType({1: 24, 2: 16})
#: the most warps of a row-block CTA (the header's __launch_bounds__(512, 1))
MAX_ROWS_WARPS = 16


def _token_groups(t: int) -> int:
    return next(g for g in TOKEN_GROUPS if 8 * g >= t)


def _geometry(path: str, p1: int, p2: int, tg: int, eb: int) -> tuple:
    """(rows per warp, k per warp step, accumulators per thread, W vector bytes, X vector bytes)
    of a mainloop instantiation: the header's ROWS, KSTEP, OUT and vector widths."""
    if path == "mma_k":
        ve = 16 // eb
        return 16 * p1, 4 * p2 * ve, p1 * tg * 4, 16, 16
    if path == "mma_r":
        return 8 * p1, 16, (p1 // 2) * tg * 4, 2 * p1, 8
    if path == "fma_k":
        return (4 // p2) * p1, 8 * (16 // eb), p1 * (8 * tg // p2), 16, 16
    lr = 32 // p1
    return 4 * lr, 4, 4 * (8 * tg // p1), 4 * eb, 4 * eb


def kernel_name(kind: GemvKind, path: str, p1: int, p2: int, tg: int, loads: int, wr: int, wk: int,
                pipe: int = 0) -> str:
    """The header's name expression for one instantiation.

    >>> kernel_name(GEMV_KINDS[("h", "fp32")], "mma_r", 8, 0, 2, 3, 2, 2)
    'pyblasgemm::gemv::gemv_kernel<pyblasgemm::gemv::KindF16, 1, 8, 0, 2, 3, 2, 2, 0>'
    """
    struct = kind.struct_k if path == kind.path_k else kind.struct_r
    return (f"pyblasgemm::gemv::gemv_kernel<pyblasgemm::gemv::{struct}, {PATHS[path]}, {p1}, {p2}, {tg}, {loads}, "
            f"{wr}, {wk}, {pipe}>")


def rows_kernel_name(kind: GemvKind, rg: int, kv: int, tg: int, pipe: int) -> str:
    """The header's name expression for one row-block instantiation (gemv_rows_kernel).

    >>> rows_kernel_name(GEMV_KINDS[("b", "fp32")], 1, 2, 1, 10)
    'pyblasgemm::gemv::gemv_rows_kernel<pyblasgemm::gemv::KindBF16, 1, 2, 1, 10>'
    """
    return f"pyblasgemm::gemv::gemv_rows_kernel<pyblasgemm::gemv::{kind.struct_k}, {rg}, {kv}, {tg}, {pipe}>"


def ring_bytes(path: str, p1: int, p2: int, tg: int, pipe: int) -> int:
    """Shared memory of one warp's cp.async ring (the header's MmaK::RING_BYTES): 0 unless the
    mma_k mainloop runs with :data:`ASYNC` (two or more stages, at most two token groups)."""
    if path != "mma_k" or not pipe & ASYNC or (pipe & 7) < 2 or tg > 2:
        return 0
    return (pipe & 7) * (p1 * 2 * p2 + tg * p2) * 512


def pipe_of(path: str, tg: int, loads: int, asked: int | None = None) -> int:
    """The template PIPE of an instantiation: :data:`PIPES` (or ``asked``) for the mma_k
    mainloop where both operands take aligned vectors, else 0."""
    if path != "mma_k" or loads != (W_VEC | X_VEC):
        return 0
    return PIPES[path][tg] if asked is None else asked


def all_instantiations() -> list[tuple]:
    """Every (kind name, path, token groups, loads, name expression) the kernel ships: each
    kind on both weight layouts, every token group count, every load class; then the row-block
    split's (path 'mma_k/rows', both operands in vectors) for every kind on the mma_k mainloop."""
    out = []
    for kind in _KINDS.values():
        for path in (kind.path_k, kind.path_r):
            for tg in TOKEN_GROUPS:
                for loads in range(4):
                    p1, p2, wr, wk = tiles_of(path, tg, loads)
                    out.append((kind.name, path, tg, loads,
                                kernel_name(kind, path, p1, p2, tg, loads, wr, wk, pipe_of(path, tg, loads))))
    for kind in _KINDS.values():
        if kind.path_k == "mma_k":
            for tg, (rg, kv, pipe) in ROWS_TILES.items():
                out.append((kind.name, "mma_k/rows", tg, W_VEC | X_VEC, rows_kernel_name(kind, rg, kv, tg, pipe)))
    return out


# ---------------------------------------------------------------------------------------------
# Which problems, and how (pure)
# ---------------------------------------------------------------------------------------------

def gemv_applies(desc) -> tuple[bool, str]:
    """(ok, reason): can the GEMV kernel compute ``desc`` (a validated
    :class:`~pyblasgemm.desc.GemmDesc`)? It needs a real type it serves (:data:`GEMV_KINDS`),
    one problem (no batch), and C with at most :data:`MAX_TOKENS` rows or columns. Whether it
    is the fastest choice is the planner's question, not this one.

    >>> from pyblasgemm._types import TYPE_ROWS
    >>> from pyblasgemm.desc import describe
    >>> d = describe("doc", TYPE_ROWS["h"], "fp32", "N", "N", 100, 100, 8, 100, 8, 100, 1, 0, 0, 0,
    ...              "cupy", 0, (16,), 1.0, 0.0)
    >>> gemv_applies(d)
    (False, 'C is 100 x 100: the GEMV kernel needs m or n <= 64')
    """
    kind = GEMV_KINDS.get((desc.prefix, base_compute(desc.compute)))
    if kind is None:
        return False, f"no GEMV kernel for {desc.prefix}gemm with compute={desc.compute!r}"
    if desc.batch != 1:
        return False, f"batch={desc.batch}: the GEMV kernel runs one problem"
    if min(desc.m, desc.n) > MAX_TOKENS:
        return False, f"C is {desc.m} x {desc.n}: the GEMV kernel needs m or n <= {MAX_TOKENS}"
    if min(desc.m, desc.n, desc.k) < 1:
        return False, f"m, n, k = {desc.m}, {desc.n}, {desc.k}: an empty product is answered before any kernel"
    if desc.transa not in ("N", "T") or desc.transb not in ("N", "T"):
        return False, f"transa={desc.transa!r}, transb={desc.transb!r}: real types take 'N' or 'T'"
    if max(desc.m, desc.n, desc.k) > MAX_EXTENT:
        return False, f"m, n, k = {desc.m}, {desc.n}, {desc.k}: the kernel's 32-bit indices need each <= {MAX_EXTENT}"
    return True, ""


@dataclass(frozen=True)
class Canonical:
    """The canonical problem of a description: ``orient`` 'n' (T = n, W = op(A)) or 'm'
    (T = m, W = op(B)ᵀ); strides in elements."""

    orient: str
    R: int
    T: int
    K: int
    w_rs: int
    w_ks: int
    x_ts: int
    x_ks: int
    c_rs: int
    c_ts: int

    @property
    def w_k_contiguous(self) -> bool:
        return self.w_ks == 1


def canonical(desc) -> Canonical:
    """Map a description onto ``out[r, t] = sum_p W[r, p] X[t, p]`` (see the module docstring).

    >>> from pyblasgemm._types import TYPE_ROWS
    >>> from pyblasgemm.desc import describe
    >>> d = describe("doc", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 3, 1024, 1024, 1024, 4096, 1, 0, 0,
    ...              0, "cupy", 0, (16,), 1.0, 0.0)          # x @ W.T, 3 tokens
    >>> canonical(d)
    Canonical(orient='n', R=4096, T=3, K=1024, w_rs=1024, w_ks=1, x_ts=1024, x_ks=1, c_rs=1, c_ts=4096)
    """
    m, n, k = desc.m, desc.n, desc.k
    a_k = desc.transa == "T"      # op(A)[i, p] = a[p + i lda] (K-contiguous) or a[i + p lda]
    b_k = desc.transb == "N"      # op(B)[p, j] = b[p + j ldb] (K-contiguous) or b[j + p ldb]
    if n <= MAX_TOKENS and (n <= m or m > MAX_TOKENS):
        w_rs, w_ks = (desc.lda, 1) if a_k else (1, desc.lda)
        x_ts, x_ks = (desc.ldb, 1) if b_k else (1, desc.ldb)
        return Canonical("n", m, n, k, w_rs, w_ks, x_ts, x_ks, 1, desc.ldc)
    w_rs, w_ks = (desc.ldb, 1) if b_k else (1, desc.ldb)
    x_ts, x_ks = (desc.lda, 1) if a_k else (1, desc.lda)
    return Canonical("m", n, m, k, w_rs, w_ks, x_ts, x_ks, desc.ldc, 1)


def _loads(cn: Canonical, path: str, w_vb: int, x_vb: int, eb: int, w_align: int, x_align: int) -> int:
    """The LOADS class: bit W_VEC where the weight's vectors are aligned and never straddle K
    (K-contiguous) or R (R-contiguous); bit X_VEC where the activations are K-contiguous with
    aligned vectors that never straddle K. ``*_align``: the largest power of two (<= 16) dividing
    the operand's pointer (bytes)."""
    bits = 0
    if cn.w_k_contiguous:
        if w_align % w_vb == 0 and (cn.w_rs * eb) % w_vb == 0 and cn.K % (w_vb // eb) == 0:
            bits |= W_VEC
    elif w_align % w_vb == 0 and (cn.w_ks * eb) % w_vb == 0 and cn.R % (w_vb // eb) == 0:
        bits |= W_VEC
    # one token: its stride is never used (tokens past T read token T - 1 = 0), so a 1 x K row
    # that a caller describes with ld = 1 (matmul's 1-row x) still takes vectors
    if cn.x_ks == 1 and x_align % x_vb == 0 and (cn.T == 1 or (cn.x_ts * eb) % x_vb == 0) \
            and cn.K % (x_vb // eb) == 0:
        bits |= X_VEC
    return bits


@dataclass(frozen=True)
class GemvSpec:
    """Everything about one GEMV launch but the pointers and the scales (pure arithmetic).

    ``ctas`` CTAs of ``wr x wk`` warps split the ``row_tiles x csteps`` units (row tile of
    ``cta_rows`` rows, CTA step of ``wk`` warp steps) evenly, in one wave; ``slots`` workspace
    slots of ``slot_bytes`` hold the partials of row tiles several CTAs share (one int32
    counter per row tile counts their arrivals); ``smem`` bytes of shared memory per CTA.
    ``split`` 'rows' (gemv_rows_kernel): ``ctas`` CTAs of ``wk`` warps (``wr`` = 1) take whole row
    tiles (blocks), grid-stride; ``occupancy`` is then the CTAs of ``wk`` warps resident per SM;
    no workspace."""

    kind: GemvKind
    canonical: Canonical
    path: str
    token_groups: int
    p1: int
    p2: int
    wr: int
    wk: int
    loads: int
    cta_rows: int
    row_tiles: int
    csteps: int
    ctas: int
    slots: int
    slot_bytes: int
    smem: int
    w_align: int            # bytes the weight's / the activations' pointers must be aligned to
    x_align: int
    sm_count: int
    occupancy: int
    pipe: int = 0           # the header's template PIPE (:func:`pipe_of`)
    split: str = "stream_k"  # 'stream_k' (gemv_kernel) or 'rows' (gemv_rows_kernel)

    @property
    def R(self) -> int:
        return self.canonical.R

    @property
    def T(self) -> int:
        return self.canonical.T

    @property
    def K(self) -> int:
        return self.canonical.K

    @property
    def orient(self) -> str:
        return self.canonical.orient

    @property
    def threads(self) -> int:
        return 32 * self.wr * self.wk

    @property
    def kernel_name(self) -> str:
        if self.split == "rows":
            return rows_kernel_name(self.kind, self.p1, self.p2, self.token_groups, self.pipe)
        return kernel_name(self.kind, self.path, self.p1, self.p2, self.token_groups, self.loads, self.wr, self.wk,
                           self.pipe)

    @property
    def workspace_bytes(self) -> int:
        if self.split == "rows":
            return 0
        return self.slots * self.slot_bytes + 4 * self.row_tiles

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weight, each read once: the launch's time at the memory's bandwidth."""
        return self.R * self.K * self.kind.elem_bytes


def _tile_is_shared(rt: int, csteps: int, units: int, ctas: int) -> bool:
    """Whether row tile ``rt``'s first and last units lie in different CTAs (the header's cta_of)."""
    u0 = rt * csteps
    return ((u0 + 1) * ctas - 1) // units != ((u0 + csteps) * ctas - 1) // units


def plan(desc, sm_count: int, occupancy: int | None = None, align: tuple | None = None,
         tiles: tuple | None = None, split: str | None = None, resident_warps: int | None = None) -> GemvSpec:
    """The :class:`GemvSpec` of ``desc`` on ``sm_count`` SMs with ``occupancy`` CTAs resident per
    SM (default: as many as make :data:`ASSUMED_RESIDENT_THREADS` threads). The grid is one wave
    (``sm_count x occupancy`` CTAs, fewer when the units are fewer): every CTA streams the same
    number of weight bytes, within one CTA step. ``align``: (A's, B's) pointer alignment in bytes
    (default: the description's ``ptr_align`` for both). ``tiles``: (P1, P2, WR, WK) or (P1, P2,
    WR, WK, PIPE) in place of :data:`TILES`' and :data:`PIPES`' (experiments: bench/gemv_bench.py --sweep; such instantiations are not in the
    compile checks). ``split``: 'stream_k' or 'rows' (default: :data:`SPLITS` where the row-block
    split applies, the mma_k mainloop with both operands in 16-byte vectors and at most 16
    tokens, and no ``tiles`` are given; else 'stream_k'). The row-block split reads ``tiles`` as
    (row groups, vectors per row, PIPE), ignores ``occupancy`` and sizes its CTAs for
    ``resident_warps`` warps per SM (default :data:`ROWS_RESIDENT_WARPS`): the
    largest number of warps per CTA with one resident CTA per row block (:func:`_plan_rows`).
    ValueError where :func:`gemv_applies` says no, or where 'rows' is asked and does not apply.

    >>> from pyblasgemm._types import TYPE_ROWS
    >>> from pyblasgemm.desc import describe
    >>> d = describe("doc", TYPE_ROWS["s"], "fp32", "N", "N", 3, 50000, 700, 3, 700, 3, 1, 0, 0, 0,
    ...              "cupy", 0, (16,), 1.0, 0.0)                  # 3 rows of C: T = m
    >>> s = plan(d, 132)
    >>> s.orient, s.R, s.T, s.path, s.loads                      # W = op(B)ᵀ, K-contiguous
    ('m', 50000, 3, 'fma_k', 1)
    """
    ok, why = gemv_applies(desc)
    if not ok:
        raise ValueError(f"gemv.plan: {why}")
    if type(sm_count) is not int or sm_count < 1:
        raise ValueError(f"gemv.plan: sm_count={sm_count!r} must be an int >= 1")
    kind = GEMV_KINDS[(desc.prefix, base_compute(desc.compute))]
    cn = canonical(desc)
    path = kind.path_k if cn.w_k_contiguous else kind.path_r
    tg = _token_groups(cn.T)
    p1, p2, wr, wk = tiles[:4] if tiles is not None else TILES[path][tg]
    asked_pipe = tiles[4] if tiles is not None and len(tiles) > 4 else None
    eb = kind.elem_bytes
    rows, kstep, out, w_vb, x_vb = _geometry(path, p1, p2, tg, eb)
    a_al, b_al = align if align is not None else (desc.ptr_align, desc.ptr_align)
    w_al, x_al = (a_al, b_al) if cn.orient == "n" else (b_al, a_al)
    loads = _loads(cn, path, w_vb, x_vb, eb, w_al, x_al)
    if tiles is None and tiles_of(path, tg, loads) != (p1, p2, wr, wk):
        # (the load class depends on the vector widths only, the same for both tile sets)
        p1, p2, wr, wk = tiles_of(path, tg, loads)
        rows, kstep, out, w_vb, x_vb = _geometry(path, p1, p2, tg, eb)
    pipe = pipe_of(path, tg, loads, asked_pipe)
    rows_fit = path == "mma_k" and loads == (W_VEC | X_VEC) and tg in ROWS_TILES
    if split is None:
        split = SPLITS[tg] if rows_fit and tiles is None else "stream_k"
    if split not in ("rows", "stream_k"):
        raise ValueError(f"gemv.plan: split={split!r} must be 'rows' or 'stream_k'")
    if split == "rows":
        if not rows_fit:
            raise ValueError(f"gemv.plan: split='rows' needs the mma_k mainloop with 16-byte loads of both operands "
                             f"and T <= {8 * max(ROWS_TILES)}; this problem: path {path}, loads {loads}, T = {cn.T}")
        rg, kv, rpipe = tiles[:2] + (tiles[4],) if tiles is not None else ROWS_TILES[tg]
        return _plan_rows(kind, cn, tg, loads, rg, kv, rpipe, sm_count, resident_warps)
    threads = 32 * wr * wk
    if occupancy is None:
        occupancy = max(1, ASSUMED_RESIDENT_THREADS // threads)
    if type(occupancy) is not int or occupancy < 1:
        raise ValueError(f"gemv.plan: occupancy={occupancy!r} must be an int >= 1")
    cta_rows = wr * rows
    row_tiles = -(-cn.R // cta_rows)
    csteps = -(-(-(-cn.K // kstep)) // wk)
    units = row_tiles * csteps
    ctas = min(units, sm_count * occupancy)
    shared = ctas > row_tiles or any(_tile_is_shared(rt, csteps, units, ctas) for rt in range(row_tiles))
    entries = wr * out * 32                  # one CTA partial: the header's n_entries
    return GemvSpec(kind, cn, path, tg, p1, p2, wr, wk, loads, cta_rows, row_tiles, csteps, ctas,
                    row_tiles + ctas if shared else 0, 4 * entries,
                    -(-4 * threads * out // 16) * 16 + (threads // 32) * ring_bytes(path, p1, p2, tg, pipe),
                    w_vb if loads & W_VEC else eb, x_vb if loads & X_VEC else eb, sm_count, occupancy, pipe)


def _plan_rows(kind, cn, tg, loads, rg, kv, pipe, sm_count, resident_warps) -> GemvSpec:
    """The row-block split (gemv_rows_kernel): blocks of 16 rg rows; WK warps per CTA split a
    block's warp steps (warp w: steps w, w + WK, ...). WK is the largest (<= the block's steps,
    <= :data:`MAX_ROWS_WARPS`) with every block on its own resident CTA (``blocks <= sm_count x
    (resident_warps // WK)``): one wave, each warp streaming the same bytes within one step, no
    CTA left to start after the others end. More blocks than one warp each can take: WK = 1,
    grid-stride over the blocks.

    >>> from pyblasgemm.desc import describe
    >>> from pyblasgemm._types import TYPE_ROWS
    >>> d = describe("doc", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 1, 4096, 4096, 4096, 4096, 1, 0, 0,
    ...              0, "cupy", 0, (16,), 1.0, 0.0)
    >>> s = plan(d, 132, split="rows")          # 256 blocks of 16 rows, 12 warps each, 2 CTAs per SM
    >>> s.row_tiles, s.wk, s.ctas, s.occupancy, s.threads
    (256, 12, 256, 2, 384)
    """
    if resident_warps is None:
        resident_warps = ROWS_RESIDENT_WARPS[tg]
    if type(resident_warps) is not int or resident_warps < 1:
        raise ValueError(f"gemv.plan: resident_warps={resident_warps!r} must be an int >= 1")
    eb = kind.elem_bytes
    rows, kstep, out, w_vb, x_vb = _geometry("mma_k", rg, kv, tg, eb)
    blocks = -(-cn.R // rows)
    wsteps = -(-cn.K // kstep)
    wk = 1
    for cand in range(min(MAX_ROWS_WARPS, wsteps, resident_warps), 0, -1):
        if blocks <= sm_count * (resident_warps // cand):
            wk = cand
            break
    per_sm = max(1, resident_warps // wk)
    ctas = min(blocks, sm_count * per_sm)
    return GemvSpec(kind, cn, "mma_k", tg, rg, kv, 1, wk, loads, rows, blocks, -(-wsteps // wk), ctas, 0, 0,
                    wk * out * 128, w_vb, x_vb, sm_count, per_sm, pipe, "rows")


# ---------------------------------------------------------------------------------------------
# Compile (jit.load_kernels: NVRTC, the kernel cache, as every family)
# ---------------------------------------------------------------------------------------------

def _source() -> str:
    from .jit import PACKAGE_VERSION, header_fingerprint

    return f"// pyblasgemm {PACKAGE_VERSION} headers sha256={header_fingerprint()}\n#include \"{HEADER}\"\n"


def compile_offline(names: list[str], arch: str = "sm_80") -> tuple[bytes, str, dict]:
    """Compile instantiations without a GPU (no CUDA context): ``(cubin, log, {name expression:
    lowered name})``; the log carries ptxas's resource report (``jit.ptxas_resources``).

    Example::

        cubin, log, lowered = compile_offline([spec.kernel_name], "sm_90")
    """
    from .jit import compile_program

    return compile_program(_source(), "pyblasgemm_gemv.cu", names, arch)


_kernels: dict = {}
_kernels_lock = threading.Lock()


def get_kernel(name: str, device_id: int | None = None):
    """The compiled instantiation ``name`` on the current (or given) device, compiled once per
    (device, headers' fingerprint, name); :class:`~pyblasgemm.kernels.jit.KernelCompileError`
    with NVRTC's log if it fails.

    Example (on a GPU)::

        kern = get_kernel(plan(desc, 132).kernel_name)
    """
    import cupy

    from . import jit

    dev = cupy.cuda.Device(device_id)
    key = (dev.id, jit.header_fingerprint(), name)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    kern = jit.load_kernels(_source(), [name], dev.id)[name]
    with _kernels_lock:
        _kernels[key] = kern
    return kern


def warm(names, workers: int | None = None) -> None:
    """Compile many instantiations in parallel threads (NVRTC releases the GIL)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers or min(16, os.cpu_count() or 1)) as ex:
        list(ex.map(get_kernel, sorted(set(names))))


# ---------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------

def _arg_fields():
    import ctypes as ct

    # (name, ctype) in the order of gemv_kernel's parameters
    return [("w", ct.c_uint64), ("x", ct.c_uint64), ("c", ct.c_uint64), ("ws", ct.c_uint64),
            ("counters", ct.c_uint64), ("R", ct.c_int32), ("T", ct.c_int32), ("K", ct.c_int32),
            ("w_rs", ct.c_int64), ("w_ks", ct.c_int64), ("x_ts", ct.c_int64), ("x_ks", ct.c_int64),
            ("c_rs", ct.c_int64), ("c_ts", ct.c_int64), ("alpha", ct.c_float), ("beta", ct.c_float),
            ("ialpha", ct.c_int32), ("ibeta", ct.c_int32), ("row_tiles", ct.c_int32)]


class GemvLaunch:
    """A compiled, planned GEMV launch of one problem class: ``launch(a_ptr, b_ptr, c_ptr,
    alpha, beta, stream)`` enqueues ``C = alpha op(A) op(B) + beta C`` (the description's BLAS
    operands; the launch maps them onto weight and activations). Workspace and counters are
    owned per stream (calls on one stream are ordered by it; the kernel leaves the counters
    zeroed for the next call). Pointers outside the alignment class the launch was planned for
    raise ValueError. Calls from several threads take turns."""

    __slots__ = ("spec", "kern", "_fptr", "_dev", "_slots", "_lock", "_fields", "_base", "_amask",
                 "_bmask", "_swap", "_int", "_last", "_grid", "__weakref__")

    def __init__(self, spec: GemvSpec, kern, dev: int):
        self.spec, self.kern, self._dev = spec, kern, dev
        self._fptr = function(kern.kernel.ptr)      # the CUfunction, made once
        self._lock = threading.Lock()
        self._slots: dict = {}
        self._fields = _arg_fields()
        cn = spec.canonical
        self._base = dict(w=0, x=0, c=0, ws=0, counters=0, R=cn.R, T=cn.T, K=cn.K, w_rs=cn.w_rs, w_ks=cn.w_ks,
                          x_ts=cn.x_ts, x_ks=cn.x_ks, c_rs=cn.c_rs, c_ts=cn.c_ts, alpha=0.0, beta=0.0,
                          ialpha=0, ibeta=0, row_tiles=spec.row_tiles)
        self._swap = cn.orient == "m"          # W is B, X is A
        w_mask, x_mask = spec.w_align - 1, spec.x_align - 1
        self._amask, self._bmask = (x_mask, w_mask) if self._swap else (w_mask, x_mask)
        self._int = spec.kind.integer
        self._last = None                      # (stream handle, its slot): the repeated call's
        self._grid = (spec.ctas, spec.threads, spec.smem)

    @property
    def workspace_nbytes(self) -> int:
        """GPU bytes of workspace and counters this launch owns, over all streams it ran on."""
        return sum(s[0].nbytes + s[1].nbytes for s in self._slots.values())

    def _slot(self, sptr: int):
        """Workspace, counters and argument cells for the stream ``sptr``. The counters are
        zeroed in that stream's order, so its first launch finds them zero (a stream that does
        not wait for CuPy's could otherwise run the kernel before the memset)."""
        import cupy

        from ..streams import on
        from .mma_sync import _ArgPack

        with cupy.cuda.Device(self._dev), on(sptr):
            ws = cupy.empty(max(1, self.spec.slots * self.spec.slot_bytes), dtype=cupy.uint8)
            # (the row-block split reads no counters: one word for the argument)
            counters = cupy.zeros(self.spec.row_tiles if self.spec.split != "rows" else 1, dtype=cupy.int32)
        pack = _ArgPack(self._fields, dict(self._base, ws=ws.data.ptr, counters=counters.data.ptr))
        slot = (ws, counters, pack, [(float("nan"), float("nan"))], cu_stream(sptr))
        self._slots[sptr] = slot
        return slot

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha=1.0, beta=0.0, stream=None) -> None:
        with self._lock:
            if a_ptr & self._amask or b_ptr & self._bmask:
                raise ValueError(f"pointers 0x{a_ptr:x}, 0x{b_ptr:x} are outside the alignment class this GEMV "
                                 f"launch was planned for (A {self._amask + 1} B, B {self._bmask + 1} B)")
            sptr = stream if type(stream) is int else stream_handle(stream)
            last = self._last
            if last is not None and last[0] == sptr:
                slot = last[1]
            else:
                slot = self._slots.get(sptr) or self._slot(sptr)
                self._last = (sptr, slot)
            cells = slot[2].cells
            if self._swap:
                cells["w"].value, cells["x"].value = b_ptr, a_ptr
            else:
                cells["w"].value, cells["x"].value = a_ptr, b_ptr
            cells["c"].value = c_ptr
            if (alpha, beta) != slot[3][0]:
                set_scales(cells, self._int, alpha, beta)
                slot[3][0] = (alpha, beta)
            ctas, threads, smem = self._grid
            launch_kernel(self._dev, self._fptr, ctas, 1, 1, threads, 1, 1, smem, slot[4], slot[2].addr)


def _occupancy(kern, threads: int, smem: int) -> int | None:
    try:
        return occupancy(kern.kernel.ptr, threads, smem)
    except Exception:  # pragma: no cover - the planned assumption stands
        return None


def bind(desc, *, sm_count: int | None = None, tiles: tuple | None = None,
         occupancy: int | None = None, split: str | None = None, resident_warps: int | None = None) -> GemvLaunch:
    """A cached :class:`GemvLaunch` for ``desc``'s problem class on the current device (the
    plan cache, tag 'gemv': bounded, and :func:`pyblasgemm.get_plan_cache` frees it). The grid
    uses the driver's count of resident CTAs. ``sm_count``: fewer SMs than the device has
    (tests); ``tiles``: see :func:`plan`; ``occupancy``: CTAs per SM to plan for (at most what
    the driver fits); ``split``: see :func:`plan` (the row-block split's CTAs are sized for the
    warps the driver keeps resident, or ``resident_warps``). ValueError where
    :func:`gemv_applies` says no.

    Example (on a GPU)::

        launch = bind(desc); launch(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0)
    """
    import cupy

    from ..plancache import get_plan_cache

    dev = cupy.cuda.Device()
    cache = get_plan_cache()
    key = ("gemv", dev.id, desc.key, sm_count, tiles, occupancy, split, resident_warps)
    hit = cache.get(key)
    if hit is not None:
        return hit
    sms = dev.attributes["MultiProcessorCount"]
    sms = min(sm_count, sms) if sm_count else sms
    spec = plan(desc, sms, occupancy, tiles=tiles, split=split)
    kern = get_kernel(spec.kernel_name, dev.id)
    if spec.split == "rows":
        # warps resident per SM: the driver's count for 2-warp CTAs of this instantiation
        # (registers decide: 90 at T <= 8 -> 20 warps, 124 at T = 16 -> 16), unless asked
        warps = resident_warps
        if warps is None:
            occ2 = _occupancy(kern, 64, 2 * (spec.smem // spec.wk))
            warps = min(2 * MAX_ROWS_WARPS, 2 * occ2) if occ2 else ASSUMED_RESIDENT_THREADS // 32
        spec = plan(desc, sms, tiles=tiles, split="rows", resident_warps=warps)
        # one resident CTA per row block: fewer CTAs of this size resident than planned ->
        # plan for fewer warps, until the plan's CTAs all fit at once
        for _ in range(2 * MAX_ROWS_WARPS):
            occ = _occupancy(kern, spec.threads, spec.smem)
            if occ is None or occ >= spec.occupancy or warps <= 1:
                break
            warps = min(warps - 1, occ * spec.wk)
            spec = plan(desc, sms, tiles=tiles, split="rows", resident_warps=max(1, warps))
        launch = GemvLaunch(spec, kern, dev.id)
        cache.put(key, launch)
        return launch
    if spec.smem > 48 * 1024:       # above the default dynamic limit: opt in (a larger cp.async ring)
        set_max_dynamic_shared_memory(kern.kernel.ptr, spec.smem)
    occ = _occupancy(kern, spec.threads, spec.smem)
    if occ is not None and occ < spec.occupancy:   # one wave: never more CTAs than fit at once
        spec = plan(desc, sms, occ, tiles=tiles)
    launch = GemvLaunch(spec, kern, dev.id)
    cache.put(key, launch)
    return launch


def run(desc, a_ptr: int, b_ptr: int, c_ptr: int, alpha=None, beta=None, stream=None) -> GemvLaunch:
    """Compute ``desc`` (``C = alpha op(A) op(B) + beta C``, BLAS column-major operands at these
    device pointers) with the GEMV kernel on ``stream`` (CuPy's current stream if None, a CuPy
    stream or a raw ``cudaStream_t``); alpha / beta default to the description's. Returns the
    bound launch (call it again with new pointers for the same class).

    Example (on a GPU: y = x @ W.T, x 1 x 4096, W 4096 x 4096 row-major, bfloat16)::

        d = describe("gemv", TYPE_ROWS["b"], "fp32", "T", "N", 4096, 1, 4096, 4096, 4096, 4096,
                     1, 0, 0, 0, "cupy", 0, (w.data.ptr, x.data.ptr, y.data.ptr), 1.0, 0.0)
        run(d, w.data.ptr, x.data.ptr, y.data.ptr)
    """
    launch = bind(desc)
    launch(a_ptr, b_ptr, c_ptr, desc.alpha if alpha is None else alpha, desc.beta if beta is None else beta,
           stream)
    return launch
