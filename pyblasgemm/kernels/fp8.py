"""The GPU route of float8 products (:func:`pyblasgemm.fp8.scaled_matmul` with CuPy arrays, and
CUDA tensors / JAX GPU arrays through the array door): the mma.sync kernel's float8 kinds
(``KindFp8F32``, sm_89+) with the scales in the dequantizing store; on sm_90 the Hopper
kernel's (``Sm90KindFp8``: wgmma, TMA) for K-major operands, block scales included
(:func:`sm90_config`; :data:`FAMILY` = 'sm80' keeps mma.sync).

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

Routes (:func:`choose_route`, the plan's ``route`` and ``why``). cuBLASLt's FP8 GEMM
(:class:`pyblasgemm.backends.cublaslt.LtFp8Launch`) runs a product where it can take it and is
the faster: on an H200 (bench/results/fp8_h200_2026-11-29_e1f052c.json) our kernels ran
0.72-0.85x ``torch._scaled_mm`` (which is cuBLASLt) at 4096³ / 8192³, per-tensor and per-row /
per-column scales alike, so every case above :data:`DECODE_ROWS` that cuBLASLt takes goes to
it. It takes only the "TN" form on sm_89 / sm_90 (``a`` row-major, ``b`` column-major: both
K-contiguous, ``torch._scaled_mm``'s layout), K and the leading dimensions multiples of 16
bytes, 16-byte aligned pointers, not e5m2 x e5m2, per-tensor scales everywhere, per-row /
per-column and 128-block scales on sm_90 with cuBLAS 12.9+ only (one kind for both operands),
block scales only for a row-major result, bias only along the result's columns (rows for an
F-ordered result) and not with a float32 output, and of the activations only relu and
gelu_tanh (cuBLASLt's GELU is the tanh form), without ``preactivation_out``. The other layouts
are not transposed for it: a float8 transpose copy is a full extra pass over an operand
(at decode shapes the weight: more bytes than the GEMM reads), and our kernels read every
layout in place. Block scales go to cuBLASLt above :data:`DECODE_ROWS` too (it ran 2.15-2.44x
ours at 4096³ / 8192³ on the H200): it reads them rearranged, and :class:`LtBlockScaled`
rearranges them with a kernel of ours into buffers the launch owns, in the call's stream, so
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

import threading
from typing import NamedTuple

import numpy as np

from ..backends import cublaslt as lt
from ..kinds import FP8_KINDS  # noqa: F401  (importers read the kinds here)
from ..planner import fp8 as planner
from ..planner.fp8 import (_ACTIVATION_NAMES, _FORCED, _LT_BLOCKS_FASTER, _LT_FASTER,  # noqa: F401  (moved:
                           _OURS_FOR_DECODE, _SCALE_PAIRS, DECODE_ROWS, MIN_CC, lt_refusal, sm90_config)  # re-exported)
from ..plancache import get_plan_cache
from .jit import EPI_BLOCK_SHIFT

__all__ = ["run", "plan", "problem_of", "warm_specs", "sm90_config", "Fp8Plan", "Fp8Launch", "last_launch",
           "check_device", "MIN_CC", "FAMILY", "ROUTE", "choose_route", "lt_refusal", "Ran", "LtBlockScaled"]

#: the bound launches live in the plan cache (bounded, LRU; ``free()`` returns their split-k
#: workspace), each under one key, so that a call signature replaying one refers to it and
#: goes when it goes (:meth:`pyblasgemm.plancache.PlanCache.put`)
_cache = get_plan_cache()
_last = threading.local()


class Fp8Launch(NamedTuple):
    """How :func:`run` ran a product as one launch on the caller's own memory (operands, result,
    scales and bias read and written in place: no copy, no temporary), so that a repeated call
    can run it again on its pointers: ``launch(pm, pn, pc, alpha, beta, stream, bias=, pre=0,
    scale_m=, scale_n=)`` with the operands and their scales in the kernel's order (b's first
    when ``swap``: c^T = b^T a^T)."""

    launch: object
    swap: bool
    config: object          # the KernelConfig that ran


def last_launch():
    """The :class:`Fp8Launch` of this thread's last :func:`run`, or None when that run copied
    an operand, a scale or the bias, or computed into a temporary (then no replay may stand
    for it)."""
    return getattr(_last, "launch", None)


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


def _bound(problem, config, epi: int, bias_axis):
    """The bound launch of this problem class, config and epilogue on the current device."""
    from cupy.cuda import runtime

    from .launch import bind
    from .spec import problem_class

    key = ("launch", "float8", runtime.getDevice(), problem_class(problem), config, epi, bias_axis)
    hit = _cache.get(key)
    if hit is None:
        hit = bind(problem, config, epilogue=(epi, bias_axis))
        _cache.put(key, hit)        # (a size-0 cache keeps nothing: bound anew each call)
    return hit


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


class Fp8Plan(NamedTuple):
    """How one float8 product is launched (:func:`plan`): the kernel's column-major problem."""

    swap: bool          # c^T = b^T a^T (a row-major result): kernel A is b, its rows c's columns
    kind: str
    transa: str
    transb: str
    m: int              # the kernel's m, n, k and leading dimensions (elements)
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    config: object      # the KernelConfig (fp8_config's rule)
    epi: int            # the EPI template argument
    bias_axis: str | None   # the kernel's 'm' / 'n' axis of the bias
    route: str = "ours"     # 'cublaslt' or 'ours' (choose_route's rule)
    why: str = ""           # the rule's reason, in words

    def explain(self) -> str:
        """Which route the plan takes and why, in one line.

        >>> plan(256, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", ("row", 4096), ("col", 4096), "row",
        ...      4096, ("tensor", "tensor"), "bfloat16", 0, None, 132, (9, 0), lt_version=130100).explain()
        'cublaslt: cuBLASLt takes this case and ran 1.20-1.35x our kernels at 4096³ / 8192³ on an H200 (per-tensor and row-wise scales)'
        """
        return f"{self.route}: {self.why}"


class Ran(NamedTuple):
    """What :func:`run` ran: ``route`` ('cublaslt' / 'ours'), ``line`` (the route report's
    line), ``config`` (our KernelConfig; None on cuBLASLt)."""

    route: str
    line: str
    config: object


#: which kernel runs float8 products on sm_90: None (the rule of :func:`plan`: the Hopper
#: kernel for K-major operands, block scales included, else mma.sync) or 'sm80' (always
#: mma.sync: the tests run both). Block scales on the Hopper kernel against mma.sync's block
#: tile (H200, bench/results/fp8_h200_2026-11-29_e1f052c.json, both forced, same bytes):
#: 0.31-0.32x its time at 4096^3 / 8192^3, 0.62-0.88x on Llama-3-8B's gate/up and down layers
#: at M = 16 and 64, 1.06-1.16x on the 4096 x 4096 projection.
FAMILY = None

#: which route runs float8 products when ``backend=`` leaves it open: None (:func:`choose_route`'s
#: rule), 'cublaslt' or 'ours' (forced, as ``backend='cublas'`` / ``'tensorcore'`` force them)
ROUTE = None


def choose_route(refusal: str | None, layouts: tuple, backend=None, rows: int | None = None) -> tuple:
    """:func:`pyblasgemm.planner.fp8.choose_route` under this module's :data:`ROUTE`: ``(route,
    why)``, 'cublaslt' where cuBLASLt takes the case (``refusal`` None) and is measured faster
    (``rows`` above :data:`DECODE_ROWS`), 'ours' elsewhere; ``backend`` 'cublas' / 'tensorcore'
    (or :data:`ROUTE`) forces one. Pure.

    >>> choose_route(None, ("rows", "cols"))[0], choose_route(None, ("rows", "cols"), rows=16)[0]
    ('cublaslt', 'ours')
    """
    return planner.choose_route(refusal, layouts, backend, rows, ROUTE)


def plan(m: int, n: int, k: int, a_dtype: str, b_dtype: str, la: tuple, lb: tuple, target: str, ldc: int,
         layouts: tuple, out_name: str, activation_code: int, bias_axis, sm_count: int,
         cc: tuple = (8, 9), lt_version=None, backend=None, aligned: bool = True, has_pre: bool = False) -> Fp8Plan:
    """The launch of ``(scale_a ⊙ a) @ (scale_b ⊙ b)`` for a (m x k) and b (k x n) of layouts
    ``la`` / ``lb`` (:func:`_layout`'s ``('row' | 'col', ld)``) into a result stored ``target``
    ('row': C-ordered rows ``ldc`` apart, computed as c^T = b^T a^T; 'col': F-ordered):
    pure arithmetic, no device. The product's description
    (:func:`pyblasgemm.desc.describe_fp8`) planned by the planner's float8 route
    (:mod:`pyblasgemm.planner.fp8`: the config, the EPI code and the route, under :data:`FAMILY`
    and :data:`ROUTE`), as the kernel's column-major problem. The kernel's scale_m is then
    scale_b when ``swap`` (else scale_a), its scale_n the other. On sm_90 (``cc``) a product
    with both operands K-major takes the Hopper kernel (:func:`sm90_config`), block scales
    included (:data:`FAMILY` = 'sm80' keeps mma.sync); the caller falls back to mma.sync where its TMA rules refuse the problem.
    ``route`` / ``why``: :func:`choose_route` on :func:`lt_refusal` (``lt_version``: cuBLASLt's,
    None when it is not loaded; ``aligned``: all pointers 16-byte aligned; ``has_pre``: a
    ``preactivation_out``); our kernel's fields are filled either way (the fallback's).

    >>> p = plan(16, 4096, 4096, "float8_e4m3fn", "float8_e5m2", ("row", 4096), ("col", 4096), "row",
    ...          4096, ("rows", "tensor"), "bfloat16", 0, "cols", 132)
    >>> p.swap, p.kind, p.transa, p.transb, (p.m, p.n, p.k), p.bias_axis, p.config.decomposition
    (True, 'e5m2_e4m3', 'T', 'N', (4096, 16, 4096), 'm', 'splitk_serial')
    """
    from ..desc import describe_fp8

    # (an aligned product's pointers are 16-byte aligned, the bias' too; no pointers: no arrays here)
    desc = describe_fp8("fp8", a_dtype, b_dtype, la, lb, target, m, n, k, ldc, layouts, out_name,
                        _activation_name(activation_code), bias_axis, has_pre, "cupy", -1,
                        (16 if aligned else 1,), 1.0, 0.0)
    machine = planner.machine(cc, sm_count)
    config = planner.config_for(desc, machine, FAMILY)
    epi = planner.epilogue_code_of(desc)
    route, why = planner.route_for(desc, machine, lt_version, backend, ROUTE)
    # the kernel needs ld >= its stored rows even where one row is all there is
    lda = max(desc.lda, k if desc.transa == "T" else desc.m)
    ldb = max(desc.ldb, desc.n if desc.transb == "T" else k)
    return Fp8Plan(desc.swap, desc.prefix, desc.transa, desc.transb, desc.m, desc.n, k, lda, ldb, ldc, config, epi,
                   desc.epilogue.bias, route, why)


def _activation_name(code: int) -> str | None:
    """The activation of a device code (0: none), or a ValueError naming the code and the codes
    there are (``run``'s codes are ACTIVATIONS' own: a caller passing another one is wrong).

    >>> _activation_name(3), _activation_name(0)
    ('gelu_tanh', None)
    """
    if code == 0:
        return None
    name = _ACTIVATION_NAMES.get(code)
    if name is None:
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(_ACTIVATION_NAMES.items()))
        raise ValueError(f"activation_code={code!r} is not an activation's code (0: none, {codes})")
    return name


def problem_of(pl: Fp8Plan, pa: int, pb: int, pc: int, alpha: float, beta: float, sm_count: int) -> tuple:
    """``(KernelProblem, KernelConfig)`` of a plan on these pointers: the plan's config, or
    mma.sync's where the Hopper kernel's TMA rules refuse the problem (16-byte leading
    dimensions and pointers)."""
    from .config import fp8_config
    from .problem import KernelProblem

    problem = KernelProblem(pl.kind, pl.transa, pl.transb, pl.m, pl.n, pl.k, pl.lda, pl.ldb, pl.ldc, pa, pb, pc,
                            float(alpha), float(beta))
    config = pl.config
    if not config.validate(problem)[0]:     # (the mma.sync tiles take every problem)
        config = fp8_config(pl.m, pl.n, pl.k, sm_count, bool(pl.epi >> EPI_BLOCK_SHIFT & 0o77))
    return problem, config


def warm_specs(cases, sm_count: int, cc: tuple, device_id: int | None = None) -> list:
    """The :func:`pyblasgemm.kernels.jit.warm` specs of float8 products on dense, 256-byte
    aligned arrays (the tests' and benches' warm-up: a cold cache compiles them in parallel).
    ``cases``: ``(m, n, k, a dtype name, b dtype name, a order, b order, result order,
    layouts, output dtype name, activation code, bias axis)`` with orders 'C' / 'F'.

    >>> from pyblasgemm.kernels.jit import kernel_name
    >>> [s[1] for s in warm_specs([(16, 4096, 4096, "float8_e4m3fn", "float8_e4m3fn", "C", "F", "C",
    ...                             ("tensor", "cols"), "bfloat16", 0, None)], 132, (8, 9))]
    ['e4m3']
    """
    out = []
    for m, n, k, ta, tb, oa, ob, oc, layouts, out_name, act, axis in cases:
        isz = 4 if out_name == "float32" else 2
        per = 16 // isz
        la = ("row", k) if oa == "C" else ("col", m)
        lb = ("row", n) if ob == "C" else ("col", k)
        if oc == "F" and (n == 1 or m % per == 0):
            target, ldc = "col", (m if n > 1 else -(-m // per) * per)
        else:       # C-ordered in place, or a padded C-ordered temporary
            target, ldc = "row", -(-n // per) * per
        pl = plan(m, n, k, ta, tb, la, lb, target, ldc, layouts, out_name, act, axis, sm_count, cc)
        base = 0x7F00_0000_0000
        problem, config = problem_of(pl, base, base + (1 << 32), base + (2 << 32), 1.0, 0.0, sm_count)
        out.append((config, pl.kind, pl.transa, pl.transb, None, problem.operands_vectorizable(), device_id,
                    pl.epi))
    return list(dict.fromkeys(out))


def run(routine: str, a, b, result, layouts: tuple, scale_a, scale_b, alpha: float, beta: float,
        bias, bias_axis, activation_code: int, pre, stream=None, backend=None):
    """``result = act(alpha·(scale_a ⊙ a) @ (scale_b ⊙ b) + beta·result + bias)`` on the GPU,
    everything checked by the caller (:func:`pyblasgemm.fp8.scaled_matmul`): CuPy float8 ``a``
    (m x k, k >= 1) and ``b`` (k x n), ``result`` (m x n, float32 / float16 / bfloat16),
    ``layouts`` what :func:`pyblasgemm.fp8.check_scales` returned, ``bias_axis`` 'cols' /
    'rows' / None (the epilogue's), ``pre`` the pre-activation array or None, ``backend``
    None / 'auto' / 'cublas' / 'tensorcore' (:func:`choose_route`). Returns the :class:`Ran`
    (route, report line, our KernelConfig or None). Enqueued on ``stream`` (a raw handle; None:
    CuPy's current stream). A cuBLASLt route whose heuristic finds no algorithm falls back to
    our kernels (a ValueError where ``backend='cublas'`` forced it), before any launch.

    Example::

        run("matmul", a, b, out, ("tensor", "cols"), sa, sb, 1.0, 0.0, None, None, 0, None)
    """
    import cupy as cp

    from ..streams import current, on

    check_device(routine)
    _last.launch = None
    m, k = a.shape
    n = b.shape[1]
    sptr = current() if stream is None else stream
    given_a, given_b = a, b
    isz = result.dtype.itemsize
    # (streams.on: CuPy's Stream.from_external where it has it, which CuPy 14 asks for instead of
    # the ExternalStream it warns about; nothing to do on the current stream)
    with on(stream):
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
        dev = cp.cuda.Device()
        cc = dev.compute_capability
        vbias = None
        if bias is not None:
            vbias = cp.ascontiguousarray(bias.reshape(-1)).astype(result.dtype, copy=False)
        aligned = not (a.data.ptr % 16 or b.data.ptr % 16 or c.data.ptr % 16
                       or (vbias is not None and vbias.data.ptr % 16))
        pl = plan(m, n, k, a.dtype.name, b.dtype.name, la, lb, target, ldc, layouts, result.dtype.name,
                  activation_code, bias_axis, dev.attributes["MultiProcessorCount"], (int(cc[:-1]), int(cc[-1])),
                  lt_version(), backend, aligned, p is not None)
        if pl.route == "cublaslt":
            ran = _run_lt(cp, pl, a, b, c, layouts, scale_a, scale_b, alpha, beta, vbias, activation_code, sptr,
                          dev.id)
            if isinstance(ran, Ran):
                if c is not result:
                    result[...] = c
                elif a is given_a and b is given_b and p is pre and _in_place(bias, vbias):
                    _last.launch = _last_lt_launch(scale_a, scale_b, pl.swap)
                return ran
            if backend == "cublas" or ROUTE == "cublaslt":
                raise ValueError(f"{routine}: backend='cublas' cannot run this float8 product: {ran}; "
                                 f"backend='tensorcore' (or None) runs it on our kernels")
            pl = pl._replace(route="ours", why=ran)
        sa, sb = _device_scale(cp, scale_a), _device_scale(cp, scale_b)
        (pa, pb), (scale_m, scale_n) = ((b.data.ptr, a.data.ptr), (sb, sa)) if pl.swap else \
            ((a.data.ptr, b.data.ptr), (sa, sb))
        problem, config = problem_of(pl, pa, pb, c.data.ptr, alpha, beta, dev.attributes["MultiProcessorCount"])
        launch = _bound(problem, config, pl.epi, pl.bias_axis)
        launch(pa, pb, c.data.ptr, float(alpha), float(beta), sptr,
               bias=0 if vbias is None else vbias.data.ptr, pre=0 if p is None else p.data.ptr,
               scale_m=scale_m.data.ptr, scale_n=scale_n.data.ptr)
        if c is not result:
            result[...] = c
        if p is not pre:
            pre[...] = p
        if (a is given_a and b is given_b and c is result and p is pre
                and _in_place(scale_a, sa) and _in_place(scale_b, sb) and _in_place(bias, vbias)):
            _last.launch = Fp8Launch(launch, pl.swap, config)
    return Ran("ours", f"ours: float8 on {config.kernel_family.title} ({config.name}); scales, alpha, beta, "
                       f"bias and activation fused; {pl.explain()}", config)


_lt_version: list = []


def lt_version() -> int | None:
    """cuBLASLt's version (130100 for 13.1.0), None when it cannot be loaded; asked once."""
    if not _lt_version:
        _lt_version.append(lt.version())
    return _lt_version[0]


def _lt_desc(pl: Fp8Plan, a, b, layouts: tuple, out_name: str, activation_code: int, has_bias: bool):
    """The :class:`~pyblasgemm.backends.cublaslt.Fp8Desc` of a plan on the cuBLASLt route: the
    plan's own orientation (its kernel A is cuBLASLt's A: ``b`` when ``swap``), TN."""
    first, second = (b, a) if pl.swap else (a, b)
    modes = _SCALE_PAIRS[tuple(layouts)]
    if pl.swap:     # cuBLASLt's A scale is scale_b's, its B scale scale_a's
        modes = modes[::-1]
    epilogue = lt.LT_EPILOGUES.get((_ACTIVATION_NAMES.get(activation_code), has_bias, False), 0)
    return lt.Fp8Desc(pl.m, pl.n, pl.k, pl.lda, pl.ldb, pl.ldc, first.dtype.name, second.dtype.name, out_name,
                      modes, epilogue)


def _lt_scales(cp, pl: Fp8Plan, layouts: tuple, scale_a, scale_b, m: int, n: int, k: int) -> tuple:
    """(cuBLASLt's A scale, B scale) as device float32 arrays in their modes' layouts: one value,
    a contiguous vector, or the block scales rearranged as cuBLASLt reads them into per-call
    temporaries (which a CUDA graph cannot hold: the scales :class:`LtBlockScaled` cannot read
    in place come here): the 1 x 128 scales of ``a`` (VEC128_32F, m x
    kb) M-contiguous, element (i, q) at q·m + i; the 128 x 128 scales of ``b``
    (BLK128x128_32F, kb x nb) K-block-contiguous, element (q, j) at j·ldq + q with ldq = kb
    rounded up to 4 (16-byte rows) -- the layouts ``torch._scaled_mm`` hands cuBLASLt."""
    if layouts == ("blocks", "blocks"):
        kb, nb = -(-k // 128), -(-n // 128)
        sa = cp.ascontiguousarray(cp.asarray(scale_a).T)                 # (kb, m)
        sb = cp.zeros((nb, -(-kb // 4) * 4), np.float32)
        sb[:, :kb] = cp.asarray(scale_b).T
        scales = (sa, sb)
    else:
        scales = tuple(_aligned16(cp, _device_scale(cp, s)) for s in (scale_a, scale_b))
    return scales[::-1] if pl.swap else scales


def _block_scaled_in_place(cp, pl: Fp8Plan, desc, launch, layouts: tuple, scale_a, scale_b, m: int, n: int,
                           k: int, device: int, sptr: int):
    """The :class:`LtBlockScaled` launch for block scales read where the caller holds them
    (CuPy float32 arrays of the block shapes, element strides), or None (other scales, a
    stream past the launch's buffers): then :func:`_lt_scales`' temporaries."""
    if layouts != ("blocks", "blocks"):
        return None
    kb, nb = -(-k // 128), -(-n // 128)
    for s, shape in ((scale_a, (m, kb)), (scale_b, (kb, nb))):
        if not (isinstance(s, cp.ndarray) and s.dtype == np.float32 and s.shape == shape
                and s.strides[0] % 4 == 0 and s.strides[1] % 4 == 0 and s.data.device_id == device):
            return None
    key = ("fp8 lt block scales", device, desc, pl.swap, scale_a.strides, scale_b.strides)
    hit = _cache.get(key)
    if hit is None or hit.lt_launch is not launch:
        hit = LtBlockScaled(launch, device, m, n, k, scale_a.strides, scale_b.strides, pl.swap)
        _cache.put(key, hit)
    return hit if hit.buffers(sptr) is not None else None


def _aligned16(cp, x):
    """``x`` or a copy of it at a 16-byte aligned address (cuBLASLt reads scale vectors in 16 bytes)."""
    return x if x.data.ptr % 16 == 0 else x.copy()


def _run_lt(cp, pl: Fp8Plan, a, b, c, layouts, scale_a, scale_b, alpha, beta, vbias, activation_code, sptr,
            device: int):
    """The plan on cuBLASLt: a :class:`Ran`, or why cuBLASLt refused it (a str) before any launch."""
    m, k = a.shape
    n = b.shape[1]
    desc = _lt_desc(pl, a, b, layouts, c.dtype.name, activation_code, vbias is not None)
    try:
        launch = lt.fp8_launch(desc, device)
    except lt.LtUnavailable as e:
        return str(e)
    pa, pb = (b.data.ptr, a.data.ptr) if pl.swap else (a.data.ptr, b.data.ptr)
    blocks = _block_scaled_in_place(cp, pl, desc, launch, tuple(layouts), scale_a, scale_b, m, n, k, device, sptr)
    if blocks is not None:
        # the scales' relayout into the launch's own buffers, then cuBLASLt: both capturable
        # (the scales in the kernel's order, as a replay passes them: b's first when swapped)
        s_first, s_second = (scale_b, scale_a) if pl.swap else (scale_a, scale_b)
        blocks(pa, pb, c.data.ptr, float(alpha), float(beta), sptr, bias=0 if vbias is None else vbias.data.ptr,
               scale_m=s_first.data.ptr, scale_n=s_second.data.ptr)
        _last.lt = (blocks, s_first, s_second)
    else:
        s_first, s_second = _lt_scales(cp, pl, tuple(layouts), scale_a, scale_b, m, n, k)
        launch(pa, pb, c.data.ptr, float(alpha), float(beta), sptr, bias=0 if vbias is None else vbias.data.ptr,
               scale_a=s_first.data.ptr, scale_b=s_second.data.ptr)
        _last.lt = (launch, s_first, s_second)
    epi = lt.LT_EPILOGUE_NAMES.get(desc.epilogue, "none")
    return Ran("cublaslt", f"cuBLASLt: float8 TN (cublasLtMatmul, scales {desc.scale_modes[0]} x "
                           f"{desc.scale_modes[1]}, epilogue {epi}, fast accumulation {lt.FAST_ACCUM}); "
                           f"{pl.explain()}", None)


_BLOCK_SCALES_SOURCE = r"""
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
_BLOCK_SCALE_THREADS = 256
#: the most streams one launch keeps relayout buffers for (a stream beyond them gets the
#: per-call temporaries, and no replay)
MAX_BLOCK_SCALE_STREAMS = 8


class LtBlockScaled:
    """cuBLASLt's block-scaled float8 launch that reads the caller's scales where they are:
    ``launch(pm, pn, pc, alpha, beta, stream, bias=, scale_m=, scale_n=)`` (the operands and
    scales in the kernel's order, :class:`Fp8Launch`'s: b's first when ``swap``, the plan
    computing c^T = b^T a^T) enqueues, on ``stream``, the relayout of a's (m, kb) and b's
    (kb, nb) float32 scales (strides in elements, fixed per launch) into buffers it owns, then
    the cuBLASLt call that reads them (cuBLASLt's A scale b's when swapped):
    two launches on stable memory, so a CUDA graph captures both, and a repeated call replays
    them on new pointers (against ``torch._scaled_mm``'s and the per-call route's temporaries,
    which a graph cannot hold). One pair of buffers per stream (at most
    :data:`MAX_BLOCK_SCALE_STREAMS`): calls on two streams never share one.

    Example (on a GPU with cuBLASLt 12.9+)::

        launch = LtBlockScaled(lt.fp8_launch(desc, 0), 0, m, n, k, sa.strides, sb.strides, swap=False)
        launch(a.data.ptr, b.data.ptr, c.data.ptr, 1.0, 0.0, sptr, scale_m=sa.data.ptr, scale_n=sb.data.ptr)
    """

    __slots__ = ("lt_launch", "swap", "_dev", "_fptr", "_grid", "_pack", "_lock", "_buffers", "workspace_nbytes",
                 "__weakref__")

    def __init__(self, lt_launch, device: int, m: int, n: int, k: int, strides_a: tuple, strides_b: tuple,
                 swap: bool):
        import ctypes as ct

        import cupy

        from .jit import raw_function
        from .mma_sync import _ArgPack

        kb, nb = -(-k // 128), -(-n // 128)
        ldq = -(-kb // 4) * 4
        self.lt_launch, self.swap, self._dev = lt_launch, swap, device
        self._fptr = raw_function(_BLOCK_SCALES_SOURCE, "pyblasgemm_fp8_lt_block_scales", device)
        sms = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
        self._grid = max(1, min(-(-(m * kb + nb * ldq) // _BLOCK_SCALE_THREADS), 2 * sms))
        ll, vp = ct.c_longlong, ct.c_void_p
        fields = [("sa", vp), ("sa_row", ll), ("sa_col", ll), ("sa_out", vp), ("m", ll), ("kb", ll),
                  ("sb", vp), ("sb_row", ll), ("sb_col", ll), ("sb_out", vp), ("nb", ll), ("ldq", ll)]
        self._pack = _ArgPack(fields, dict(sa=0, sa_row=strides_a[0] // 4, sa_col=strides_a[1] // 4, sa_out=0,
                                           m=m, kb=kb, sb=0, sb_row=strides_b[0] // 4, sb_col=strides_b[1] // 4,
                                           sb_out=0, nb=nb, ldq=ldq))
        self._lock = threading.Lock()
        self._buffers: dict = {}        # stream handle -> (a's buffer, b's buffer), CuPy arrays
        self.workspace_nbytes = 0

    def buffers(self, stream: int):
        """This stream's (a's, b's) relayout buffers, made on its first call; None past
        :data:`MAX_BLOCK_SCALE_STREAMS` streams."""
        held = self._buffers.get(stream)
        if held is None:
            import cupy

            with self._lock:
                if len(self._buffers) >= MAX_BLOCK_SCALE_STREAMS:
                    return None
                cells = self._pack.cells
                with cupy.cuda.Device(self._dev):
                    held = (cupy.empty((cells["kb"].value, cells["m"].value), np.float32),
                            cupy.empty((cells["nb"].value, cells["ldq"].value), np.float32))
                self._buffers[stream] = held
                self.workspace_nbytes += held[0].nbytes + held[1].nbytes
        return held

    def __call__(self, pm, pn, pc, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
        from .driver import launch_kernel, stream as cu_stream

        held = self.buffers(stream)
        if held is None:
            raise RuntimeError(f"LtBlockScaled: more than {MAX_BLOCK_SCALE_STREAMS} streams")
        sa_out, sb_out = held[0].data.ptr, held[1].data.ptr
        if self.swap:
            scale_m, scale_n = scale_n, scale_m         # a's and b's, as the relayout reads them
        cells = self._pack.cells
        with self._lock:            # (cuLaunchKernel copies the argument cells)
            cells["sa"].value, cells["sb"].value = scale_m, scale_n
            cells["sa_out"].value, cells["sb_out"].value = sa_out, sb_out
            launch_kernel(self._dev, self._fptr, self._grid, 1, 1, _BLOCK_SCALE_THREADS, 1, 1, 0,
                          cu_stream(stream), self._pack.addr)
        if self.swap:
            self.lt_launch(pm, pn, pc, alpha, beta, stream, bias=bias, scale_a=sb_out, scale_b=sa_out)
        else:
            self.lt_launch(pm, pn, pc, alpha, beta, stream, bias=bias, scale_a=sa_out, scale_b=sb_out)


def _last_lt_launch(scale_a, scale_b, swap: bool):
    """The :class:`Fp8Launch` of the cuBLASLt run :func:`_run_lt` just made, when it read both
    scales where the caller holds them (block scales through :class:`LtBlockScaled`'s relayout;
    not the per-call temporaries of :func:`_lt_scales`, nor a scale it copied to the device or
    to an aligned address), else None."""
    launch, s_first, s_second = _last.lt
    sm, sn = (scale_b, scale_a) if swap else (scale_a, scale_b)
    if not (_in_place(sm, s_first) and _in_place(sn, s_second)):
        return None
    if isinstance(launch, LtBlockScaled):       # (already called as our kernels' launch is)
        return Fp8Launch(launch, swap, None)
    return Fp8Launch(launch.kernel_order, swap, None)


def _in_place(given, used) -> bool:
    """Whether the launch read ``given`` (a CuPy array, or None) at its own address: no copy
    (a strided or NumPy scale, a bias of another dtype, are copied first)."""
    if given is None:
        return used is None
    return type(given) is type(used) and given.data.ptr == used.data.ptr


def _device_scale(cp, s):
    """A scale as a contiguous float32 device array (a per-tensor scalar stays one element:
    the kernel reads it through its pointer; a NumPy float32 scalar is copied to the device)."""
    if not isinstance(s, cp.ndarray):
        return cp.asarray(np.asarray(s, np.float32).reshape(1))
    s = s.reshape(-1) if s.ndim else s.reshape(1)
    return s if s.flags.c_contiguous else cp.ascontiguousarray(s)
