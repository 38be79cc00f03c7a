"""Our tensor-core kernels (``pyblasgemm.kernels``: mma.sync, NVRTC-compiled) as a backend.

Serves float16 / bfloat16 (fp32 or, for float16, fp16 accumulation; float16 or float32 C),
int8 -> int32, and
float32 through tf32 or 3xTF32, in all four 'N'/'T' arrangements, any sizes, leading
dimensions and strided batches (unaligned data takes the kernels' scalar-copy path). Complex
and float64 problems are not ours: the planner sends them to cuBLAS.
"""
from __future__ import annotations

from .. import constraints, streams
from ..desc import GemmDesc

NAME = "tensorcore"


def kernel_problem(desc: GemmDesc, a_ptr: int | None = None, b_ptr: int | None = None,
                   c_ptr: int | None = None):
    """The kernels' ``KernelProblem`` for ``desc`` (:func:`pyblasgemm.constraints.kernel_problem`)."""
    return constraints.kernel_problem(desc, a_ptr, b_ptr, c_ptr)


def supports(desc: GemmDesc):
    """(ok, reason): :func:`pyblasgemm.constraints.backend_supports` for our kernels."""
    return constraints.backend_supports(NAME, desc)


def bind(desc: GemmDesc, plan):
    """The kernels' ``BoundLaunch`` for ``desc``'s class from the plan's launch spec (its
    config, geometry and argument values; the config alone for a plan without one): called
    with pointers of at least ``desc.align`` bytes' alignment (the class is bound for exactly
    that alignment, so every such pointer is in it). A plan that packs operands (``plan.pack``)
    binds its kernel for the packed problem and copies them first
    (:class:`~pyblasgemm.kernels.pack.PackedLaunch`).

    A description with an epilogue (``desc.epilogue``) whose plan fuses it into our kernel
    (``plan.epilogue.kind == 'ours'``) is bound with the epilogue in the kernel's store: the
    launch then takes ``bias=``, ``pre=`` (and ``scale_m=`` / ``scale_n=`` when it dequantizes
    an int8 product) pointers per call; None for another route. A grouped description whose
    plan runs it as one launch gets the :class:`~pyblasgemm.kernels.grouped.GroupedLaunch` of
    its launch class (``plan.group.launch_key``: kind, operand path, epilogue, tile), or for a
    Hopper grouped config the :class:`~pyblasgemm.kernels.sm90.Sm90GroupedLaunch`. A float8
    description (:func:`pyblasgemm.desc.describe_fp8`) is bound with its scales: the launch takes
    ``scale_m=`` / ``scale_n=`` pointers (the described sides') and ``bias=`` / ``pre=``."""
    from ..kernels.launch import bind as bind_kernels

    if desc.group is not None:
        # the config's family walks the problems: the mma.sync table walk, or the Hopper walk
        # (device-side sizes only)
        _, _, kind, vec, code, bias_axis, config = plan.group.launch_key
        return config.kernel_family.grouped_launch(kind, config, vec, (code, bias_axis))

    # bound for addresses with exactly the alignment every caller's pointers have
    config = plan.config if plan is not None else None
    spec = getattr(plan, "launch", None)
    if getattr(plan, "decomposition", None) == "gemv":     # the decode route (planner/decode.py)
        from ..kernels import gemv

        return gemv.bind(desc)
    pack = getattr(plan, "pack", ())
    epi = desc.epilogue
    if desc.row.b_dtype is not None:
        # a float8 pair: the plan's EPI code holds its scales (the store's, or the mainloop's
        # block scales); mma.sync's config where the Hopper kernel's TMA rules refuse the class
        from ..kernels.fp8 import kernel_problem as fp8_problem, launch_config

        problem = fp8_problem(desc)
        code = plan.epilogue.code
        return bind_kernels(problem, launch_config(problem, config, code, plan.arch.sm_count),
                            epilogue=(code, epi.bias))
    if epi is not None:
        route = getattr(plan, "epilogue", None)
        if route is None or route.kind != "ours" or pack:
            return None
        from ..kernels.jit import epilogue_code

        code = epilogue_code(epi.code, epi.dequantize)
        return bind_kernels(kernel_problem(desc.product), config, spec=spec, epilogue=(code, epi.bias))
    if not pack:
        return bind_kernels(kernel_problem(desc), config, spec=spec)
    from cupy.cuda import runtime

    from ..kernels.pack import PackedLaunch, pack_steps

    inner = bind_kernels(kernel_problem(constraints.packed_desc(desc, pack)), config, spec=spec)
    return PackedLaunch(inner, pack_steps(kernel_problem(desc), pack), runtime.getDevice())


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    """Launch through the bound launch of ``desc``'s class (see :func:`bind`)."""
    bind(desc, plan)(a.data.ptr, b.data.ptr, c.data.ptr, desc.alpha, desc.beta,
                     streams.current())
