"""Execute: answer the degenerate cases, else plan and hand the problem to a backend.

The one place a launch is bound (:func:`launch_for`): a plain product's, an epilogue fused in
our kernel's store or cuBLASLt's, a group's persistent launch, a float8 product's (ours or
cuBLASLt's, :func:`execute_fp8`). Each bound launch is kept under one key of the plan cache
(its workspace goes with it); call signatures refer to it.
"""
from __future__ import annotations

import sys

from . import _arrays, composite, streams
from .backends import cublaslt, get_backend
from .epilogue import note_route
from .epilogue_pass import UNFUSED, UnfusedRoute
from .plancache import get_plan_cache
from .desc import GemmDesc, check_backend_place
from .kernels import mlp_kernel
from .kernels.epilogue_ops import PASS_DTYPES, PassLaunch
from .kernels.fp8 import device_scale, in_place
from .kernels.grouped import pack_table
from .kernels.mma_sync import BIAS_MODE
from .kernels.scale import scale_ieee
from .planner import plan_for
from .planner.composite import CompositeSpec
from .planner.fp8 import without_lt
from .planner.overrides import current_settings

_cache = get_plan_cache()


def c_view(desc: GemmDesc, c):
    """C as a (batch, m, n) view of its column-major storage."""
    return _arrays.strided_view(c, (desc.batch, desc.m, desc.n), (desc.stride_c, 1, desc.ldc))


def scale_c(desc: GemmDesc, c) -> None:
    """C = beta * C (alpha == 0 or k == 0); beta == 0 writes zeros without reading C."""
    view = c_view(desc, c)
    if desc.beta == 0:
        view[...] = 0
    elif desc.prefix == "i":
        # int32 arithmetic wraps, as cuBLAS's does; int64 holds the product exactly
        view[...] = (view.astype("int64") * desc.beta).astype(view.dtype)
    elif desc.prefix in ("h", "b"):
        # scale in float32 and round once, as a float32-accumulating GEMM would
        wide = view.astype("float32")
        if desc.xp == "cupy":
            scale_ieee(wide, desc.beta)
        else:
            wide *= desc.beta
        view[...] = wide.astype(view.dtype)
    elif desc.xp == "cupy" and view.dtype.char in "fF":
        scale_ieee(view, desc.beta)      # float32 / complex64: CuPy's own *= flushes subnormals
    else:
        view *= desc.beta


_NO_LAUNCH = "needs the arrays"     # cached answer of a backend whose bind() returned None


def launch_for(desc: GemmDesc, plan):
    """The plan's launch for ``desc``'s class: a callable ``(a_ptr, b_ptr, c_ptr, alpha, beta,
    stream_handle)``, bound once and kept in the plan cache, or None when the backend needs the
    arrays themselves (host BLAS, int8 copies for cuBLAS).

    Example (on a GPU)::

        launch = launch_for(desc, plan_for(desc)); launch(pa, pb, pc, 1.0, 0.0, 0)
    """
    group = getattr(plan, "group", None)
    key = (("launch", group.launch_key) if group is not None else
           ("launch", desc.key, plan.backend, plan.config, plan.pack))
    launch = _cache.get(key)
    if launch is None:
        launch = None
        if desc.xp == "cupy":
            bind = getattr(get_backend(plan.backend), "bind", None)
            launch = bind(desc, plan) if bind is not None else None
        if current_settings().cache:
            _cache.put(key, _NO_LAUNCH if launch is None else launch)
        return launch
    return None if launch is _NO_LAUNCH else launch


def execute(desc: GemmDesc, a, b, c, backend: str | None = None, autotune=None, stream=None):
    """Run ``desc`` on the arrays: quick return, scaling only, or the plan's launch.

    ``stream``: a raw stream handle, or None for CuPy's current stream. Returns the launch
    that ran (the public forms remember it for the next call with the same signature), or
    None when the call took another route (degenerate, host, copies)."""
    if backend is not None:
        check_backend_place(desc.routine, backend, desc.xp)   # before the quick returns too
    if desc.xp == "numpy":
        stream = None      # host work enqueues nothing (a stream= asked CuPy, GPU or none)
    if desc.is_noop:
        return None
    if desc.scales_only:
        with streams.on(stream):
            scale_c(desc, c)
        return None
    plan = plan_for(desc, backend) if autotune is None else plan_for(desc, backend,
                                                                       autotune=autotune)
    if isinstance(plan.launch, CompositeSpec):
        with streams.on(stream):
            composite.run(desc, a, b, c, plan, execute)
        return None
    launch = launch_for(desc, plan)
    if launch is not None:
        launch(a.data.ptr, b.data.ptr, c.data.ptr, desc.alpha, desc.beta,
               streams.current() if stream is None else stream)
        return launch
    with streams.on(stream):
        get_backend(plan.backend).run(desc, a, b, c, plan)
    return None


def execute_epilogue(desc: GemmDesc, a, b, c, backend=None, autotune=None, stream=None, bias=0,
                     pre=0, scale_m=0, scale_n=0, alpha=None, beta=None):
    """Run the plan's route for ``desc`` (a description with an epilogue, operands in its
    order): a fused route is launched here (bias, pre-activation and scale pointers in the
    description's order; ``alpha`` / ``beta`` None: the description's) and ``(launch, the
    plan's Route)`` returned, for the call signature, and the route recorded
    (:func:`pyblasgemm.epilogue.last_route`). The unfused route is launched so too where C is
    the accumulation type (:func:`_unfused_launch`: the product, then the bound pass); else
    ``(None, route)``, and the form completes it (the product into the accumulation type
    through the planned GEMM, then one pass that records the route)."""
    if backend is not None:
        check_backend_place(desc.routine, backend, desc.xp)
    plan = plan_for(desc, backend) if autotune is None else plan_for(desc, backend, autotune=autotune)
    route = plan.epilogue
    if route.kind == "unfused":
        launch = _unfused_launch(desc, backend, autotune)
        if launch is None:
            return None, route
    else:
        launch = launch_for(desc, plan)
        if launch is None:            # cuBLASLt found no algorithm with this epilogue
            return None, UNFUSED[desc.xp]
    launch(a.data.ptr, b.data.ptr, c.data.ptr, desc.alpha if alpha is None else alpha,
           desc.beta if beta is None else beta, streams.current() if stream is None else stream,
           bias=bias, pre=pre, scale_m=scale_m, scale_n=scale_n)
    note_route(route)
    return launch, route


class ProductThenPass:
    """The unfused epilogue route bound as one launch (called as a fused one is, so a call
    signature replays it): the plan's product into C, which is the accumulation type, then the
    bound pass over C in place (:class:`~pyblasgemm.kernels.epilogue_ops.PassLaunch`).
    Unbound, the route took the form's full path and the CuPy elementwise pass on every call
    (64³ float32 bias + GELU: 139 µs a call on an H200); bound, it costs its two launches
    (33 µs there, bench/results/torch_callpath_h200_2026-11-27_228422c.json)."""

    __slots__ = ("product", "pass_", "__weakref__")

    def __init__(self, product, pass_):
        self.product, self.pass_ = product, pass_

    def __call__(self, a_ptr, b_ptr, c_ptr, alpha, beta, stream, bias=0, pre=0, scale_m=0, scale_n=0):
        self.product(a_ptr, b_ptr, c_ptr, alpha, beta, stream)
        self.pass_(c_ptr, bias, pre, stream)


def execute_fp8(desc: GemmDesc, plan, a, b, c, bias, pre, scale_a, scale_b, stream: int) -> tuple:
    """Run a float8 description's plan (:func:`pyblasgemm.desc.describe_fp8`,
    :func:`pyblasgemm.planner.plan_for`) on the CuPy arrays it describes, arranged for the kernels
    (:func:`pyblasgemm.kernels.fp8.arrange`: ``a`` and ``b`` read, ``c`` and ``pre`` written
    where they lie; ``bias`` a contiguous array of the result's type, or None; the scales as the
    call gave them), enqueued on ``stream`` (a raw handle). Our kernel's launch or cuBLASLt's is
    bound by :func:`launch_for` (one plan-cache key each); the operands, scales, bias and
    pre-activation are its per-call pointers, in the kernel's order (b's first when
    ``desc.swap``: c^T = b^T a^T). Block scales on cuBLASLt are rearranged by
    :class:`~pyblasgemm.backends.cublaslt.LtBlockScaled` into buffers it owns, bound per scale
    strides beside the launch. A cuBLASLt plan that cuBLASLt cannot bind (no algorithm for the
    case) runs on our kernels, or is a ValueError where it was forced, before any launch.

    Returns ``(route, launch)``: the route report (an
    :class:`~pyblasgemm.epilogue_pass.UnfusedRoute`: 'cublaslt' / 'ours' and its line, the
    plan's reason last) and the launch a call signature may replay (``launch(pm, pn, pc, alpha,
    beta, stream, bias, pre, scale_m, scale_n)``), or None where a scale was copied for this
    call (a NumPy or strided scale, a misaligned vector for cuBLASLt, block scales rearranged
    into temporaries).

    Example (on an sm_89+ GPU, arrays arranged)::

        route, launch = execute_fp8(desc, plan_for(desc), a, b, c, None, None, sa, sb, stream)
    """
    cp = sys.modules["cupy"]        # (the arrays are CuPy's)
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    first, second = scale_a, scale_b        # the described m side's scale, the n side's
    if desc.swap:
        pa, pb, first, second = pb, pa, scale_b, scale_a
    alpha, beta = float(desc.alpha), float(desc.beta)
    pbias = 0 if bias is None else bias.data.ptr
    if plan.backend == "cublas":
        launch = launch_for(desc, plan)
        if launch is not None:
            blocks = None
            if desc.block_scales and cublaslt.block_scales_readable(cp, desc, scale_a, scale_b):
                blocks = _lt_block_scaled(desc, launch, scale_a.strides, scale_b.strides, stream)
            if blocks is not None:      # the relayout into its own buffers, then cuBLASLt: both capturable
                blocks(pa, pb, pc, alpha, beta, stream, bias=pbias, scale_m=first.data.ptr, scale_n=second.data.ptr)
                launch = blocks
            else:
                scale_m, scale_n = cublaslt.fp8_scales(cp, desc, scale_a, scale_b)
                launch(pa, pb, pc, alpha, beta, stream, bias=pbias, scale_m=scale_m.data.ptr,
                       scale_n=scale_n.data.ptr)
                if not (in_place(first, scale_m) and in_place(second, scale_n)):
                    launch = None
            return UnfusedRoute("cublaslt", f"{cublaslt.fp8_line(desc)}; {plan.reason}"), launch
        why = cublaslt.fp8_refusal(desc) or "cuBLASLt could not bind it"
        if plan.source == "forced":
            raise ValueError(f"{desc.routine}: backend='cublas' cannot run this float8 product: {why}; "
                             f"backend='tensorcore' (or None) runs it on our kernels")
        plan = without_lt(plan, why)
    launch = launch_for(desc, plan)
    scale_m, scale_n = device_scale(cp, first), device_scale(cp, second)
    launch(pa, pb, pc, alpha, beta, stream, bias=pbias, pre=0 if pre is None else pre.data.ptr,
           scale_m=scale_m.data.ptr, scale_n=scale_n.data.ptr)
    config = launch.config          # (mma.sync's where the Hopper kernel's TMA rules refused the class)
    route = UnfusedRoute("ours", f"ours: float8 on {config.kernel_family.title} ({config.name}); scales, alpha, "
                                 f"beta, bias and activation fused; {plan.reason}")
    return route, launch if in_place(first, scale_m) and in_place(second, scale_n) else None


def _lt_block_scaled(desc: GemmDesc, launch, strides_a: tuple, strides_b: tuple, stream: int):
    """The :class:`~pyblasgemm.backends.cublaslt.LtBlockScaled` of a block-scaled float8
    description on its bound cuBLASLt ``launch`` for scales of these strides, kept in the plan
    cache (its relayout buffers are its workspace); None past the streams it keeps buffers for
    (then the per-call temporaries)."""
    key = ("launch", desc.key, "cuBLASLt block scales", strides_a, strides_b)
    hit = _cache.get(key)
    if hit is None or hit.lt_launch is not launch.__self__:
        hit = cublaslt.block_scaled(desc, launch, strides_a, strides_b)
        _cache.put(key, hit)        # (a size-0 cache keeps nothing: made anew each call)
    return hit if hit.buffers(stream) is not None else None


def _unfused_launch(desc: GemmDesc, backend, autotune):
    """The unfused route of ``desc`` as a :class:`ProductThenPass`, bound once and kept in the
    plan cache; None where the form must run it on arrays: not one 2-D CuPy problem, C not the
    accumulation type (float32 / float64: a 16-bit C takes the float32 product apart), int8
    dequantization, arrays the pass cannot read in place (the spec's blocker), or a product
    whose plan has no launch (a composite mode, host BLAS, int8 copies)."""
    spec = desc.epilogue
    if desc.xp != "cupy" or desc.batch != 1 or spec.dequantize or spec.blocker \
            or desc.row.c_dtype.name not in PASS_DTYPES or desc.row.is_complex:
        return None
    # (the product's plan depends on the backend asked for: a forced 'tensorcore' must not
    # reuse an 'auto' call's cuBLAS product)
    key = ("launch", desc.key, "unfused", backend, autotune)
    launch = _cache.get(key)
    if launch is not None:
        return None if launch is _NO_LAUNCH else launch
    product = desc.product
    plan = plan_for(product, backend) if autotune is None else plan_for(product, backend, autotune=autotune)
    first = None if isinstance(plan.launch, CompositeSpec) else launch_for(product, plan)
    if first is not None:
        launch = ProductThenPass(first, PassLaunch(desc.device, desc.row.c_dtype.name, desc.m, desc.n,
                                                   desc.ldc, spec.bias, spec.code))
    if current_settings().cache:
        _cache.put(key, _NO_LAUNCH if launch is None else launch)
    return launch


def _group_launch(desc: GemmDesc, backend):
    """A grouped problem's plan and its one persistent launch, with what both grouped forms
    pack beside them: ``(plan, launch, is_int, bias_mode)`` (``is_int``: int8 products with an
    int32 C, whose scalars are integers; ``bias_mode``: the epilogue's bias code,
    :data:`~pyblasgemm.kernels.mma_sync.BIAS_MODE`); None where the plan is the loop of
    planned GEMMs. A ``backend`` asked for is checked against the arrays' place first."""
    if backend is not None:
        check_backend_place(desc.routine, backend, desc.xp)
    plan = plan_for(desc, backend)
    if plan.group.kind != "one launch":
        note_route(plan.group)      # (the caller runs the loop: last_route() names it)
        return None
    epi = desc.epilogue
    is_int = desc.prefix == "i" and (epi is None or epi.dequantize is None)
    return plan, launch_for(desc, plan), is_int, BIAS_MODE[None if epi is None else epi.bias]


def execute_group(desc: GemmDesc, columns, backend=None, stream=None):
    """Run a grouped problem as its plan says: one persistent launch of the problems' table
    (``columns``: the table's columns, :data:`pyblasgemm.kernels.grouped.COLUMNS`), returned
    as ``(launch, rows, tiles, the plan's Route)`` for the call signature; or None for the
    loop the form runs (one planned GEMM per non-empty problem)."""
    found = _group_launch(desc, backend)
    if found is None:
        return None
    plan, launch, is_int, bias_mode = found
    epi = desc.epilogue
    alpha, beta = (1, 0) if is_int else (1.0, 0.0)
    out_bytes = _OUT_BYTES[epi.dequantize] if epi is not None and epi.dequantize else \
        desc.row.c_dtype.itemsize
    rows, tiles = pack_table(columns, launch.config, is_int, out_bytes, bias_mode, alpha, beta)
    with streams.on(stream):
        launch.launch_rows(rows, tiles)
    note_route(plan.group)
    return launch, rows, tiles, plan.group


def execute_group_offsets(desc: GemmDesc, groups: int, offsets_ptr: int, offsets_bytes: int, values: dict,
                          backend=None, stream=None):
    """The expert form with device-side end offsets as its plan's one persistent launch, the
    problems found on the device (:meth:`GroupedLaunch.launch_offsets
    <pyblasgemm.kernels.grouped.GroupedLaunch.launch_offsets>`; ``values``: the arrays' bases,
    strides and sizes), returned as ``(launch, the table kernel's values, the plan's Route)``
    for the call signature; None when the plan is the loop (its sizes are needed on the host)."""
    found = _group_launch(desc, backend)
    if found is None:
        return None
    plan, launch, is_int, bias_mode = found
    scalars = dict(ialpha=1, ibeta=0, alpha=0.0, beta=0.0) if is_int else dict(ialpha=0, ibeta=0, alpha=1.0,
                                                                                 beta=0.0)
    values = dict(values, bias_mode=bias_mode, **scalars)
    with streams.on(stream):
        launch.launch_offsets(groups, offsets_ptr, offsets_bytes, values)
    note_route(plan.group)
    return launch, values, plan.group


_OUT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def execute_mlp(x, w1, w2, b1, b2, code: int, n2_splits: int, stream):
    """``y = act(x @ w1 + b1) @ w2 + b2`` as the on-chip back-to-back kernel's one launch
    (:mod:`pyblasgemm.kernels.mlp_kernel`; ``code``: the activation's device code), the result
    allocated on the launch's stream; the arrays checked by :func:`pyblasgemm.fused_mlp`."""
    cupy = sys.modules["cupy"]          # (x is a CuPy array)
    handle = streams.handle(stream)
    with cupy.cuda.Device(x.device.id), streams.on(handle):
        y = cupy.empty((x.shape[0], w2.shape[1]), x.dtype)   # on the launch's stream (pool order)
        mlp_kernel.launch(x.data.ptr, w1.data.ptr, 0 if b1 is None else b1.data.ptr, w2.data.ptr,
                          0 if b2 is None else b2.data.ptr, y.data.ptr, x.shape[0], x.shape[1],
                          w1.shape[1], w2.shape[1], x.dtype, code, n2_splits, handle, x.device.id)
    return y
