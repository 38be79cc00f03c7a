"""Our tensor-core kernels (``pyblasgemm.kernels``: mma.sync, NVRTC-compiled) as a backend.

Serves float16 / bfloat16 (fp32 or, for float16, fp16 accumulation; float16 or float32 C),
int8 -> int32, and
float32 through tf32 or 3xTF32, in all four 'N'/'T' arrangements, any sizes, leading
dimensions and strided batches (unaligned data takes the kernels' scalar-copy path). Complex
and float64 problems are not ours: the planner sends them to cuBLAS.
"""
from __future__ import annotations

from ..desc import GemmDesc
from ..kinds import ROUTES

NAME = "tensorcore"

# (prefix, compute) -> (kernel kind, accumulator), from the kinds table
_KINDS = {key: (r.kernel_kind, r.accumulator) for key, r in ROUTES.items()
          if r.kernel_kind is not None}

_sm_counts: dict = {}


def kernel_problem(desc: GemmDesc, a_ptr: int = 0, b_ptr: int = 0, c_ptr: int = 0):
    """The kernels' ``KernelProblem`` for ``desc`` (same column-major convention)."""
    from ..kernels import KernelProblem

    kind, acc = _KINDS[(desc.prefix, desc.compute)]
    return KernelProblem(kind, desc.transa, desc.transb, desc.m, desc.n, desc.k, desc.lda,
                         desc.ldb, desc.ldc, a_ptr, b_ptr, c_ptr, desc.alpha, desc.beta, acc,
                         desc.batch, desc.stride_a, desc.stride_b, desc.stride_c)


def supports(desc: GemmDesc):
    if desc.xp != "cupy":
        return False, "our kernels run on CuPy arrays only"
    if (desc.prefix, desc.compute) not in _KINDS:
        return False, (f"no tensor-core kernel for {desc.row.ab_dtype.name} with "
                       f"compute={desc.compute!r}")
    if desc.transa == "C" or desc.transb == "C":
        return False, "conjugate transposition is for complex data, which our kernels lack"
    if desc.batch > 65535:
        return False, f"batch={desc.batch} exceeds the kernels' grid limit of 65535"
    from ..kernels.launch import supports as kernels_support

    return kernels_support(kernel_problem(desc))


def sm_count(device: int) -> int:
    count = _sm_counts.get(device)
    if count is None:
        import cupy

        count = _sm_counts[device] = cupy.cuda.Device(device).attributes["MultiProcessorCount"]
    return count


def choose_config(desc: GemmDesc):
    """The kernels' documented default rule (tile shape and decomposition) for this problem."""
    from ..kernels import default_config

    return default_config(kernel_problem(desc), sm_count(desc.device))


def bind(desc: GemmDesc, plan):
    """The kernels' ``BoundLaunch`` for ``desc``'s class with the plan's config: called with
    pointers of at least ``desc.align`` bytes' alignment (the class is bound for exactly that
    alignment, so every such pointer is in it)."""
    from ..kernels.launch import bind as bind_kernels

    # addresses with exactly the alignment every caller's pointers have: the problem's
    # (pointers, leading dimensions, strides), and at least their element size
    ab = max(desc.align, desc.row.ab_dtype.itemsize)
    c = max(desc.align, desc.row.c_dtype.itemsize)
    config = plan.config if plan is not None else None
    return bind_kernels(kernel_problem(desc, ab, ab, c), config)


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    """Launch through the bound launch of ``desc``'s class (see :func:`bind`)."""
    from .. import streams

    bind(desc, plan)(a.data.ptr, b.data.ptr, c.data.ptr, desc.alpha, desc.beta,
                     streams.current())
