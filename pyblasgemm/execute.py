"""Execute: answer the degenerate cases, else plan and hand the problem to a backend."""
from __future__ import annotations

from . import _arrays, streams
from .backends import get_backend
from .plancache import get_plan_cache
from .desc import GemmDesc, check_backend_place
from .kernels.scale import scale_ieee
from .planner import plan_for
from .planner.composite import CompositeSpec
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
    key = ("launch", desc.key, plan.backend, plan.config, plan.pack)
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
        from . import composite

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
