"""Execute: answer the degenerate cases, else plan and hand the problem to a backend."""
from __future__ import annotations

from . import _arrays
from .backends import get_backend
from .desc import GemmDesc, check_backend_place
from .kernels.scale import scale_ieee
from .planner import plan_for


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


def execute(desc: GemmDesc, a, b, c, backend: str | None = None, autotune=None) -> None:
    """Run ``desc`` on the arrays: quick return, scaling only, or a planned backend call."""
    if backend is not None:
        check_backend_place(desc.routine, backend, desc.xp)   # before the quick returns too
    if desc.is_noop:
        return
    if desc.scales_only:
        scale_c(desc, c)
        return
    plan = plan_for(desc, backend) if autotune is None else plan_for(desc, backend,
                                                                       autotune=autotune)
    get_backend(plan.backend).run(desc, a, b, c, plan)
