"""Our tensor-core kernels (``pyblasgemm.kernels``: mma.sync, NVRTC-compiled) as a backend.

Serves float16 / bfloat16 (fp32 or, for float16, fp16 accumulation; float16 or float32 C),
int8 -> int32, and
float32 through tf32 or 3xTF32, in all four 'N'/'T' arrangements, any sizes, leading
dimensions and strided batches (unaligned data takes the kernels' scalar-copy path). Complex
and float64 problems are not ours: the planner sends them to cuBLAS.
"""
from __future__ import annotations

from ..desc import GemmDesc

NAME = "tensorcore"

# (prefix, compute) -> (kernel kind, accumulator)
_KINDS = {
    ("h", "fp32"): ("f16", "f32"),
    ("h", "fp16"): ("f16", "f16"),
    ("b", "fp32"): ("bf16", "f32"),
    ("sh", "fp32"): ("f16_out32", "f32"),
    ("sb", "fp32"): ("bf16_out32", "f32"),
    ("i", "int32"): ("s8", "s32"),
    ("s", "tf32"): ("tf32", "f32"),
    ("s", "3xtf32"): ("3xtf32", "f32"),
}

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


_bound: dict = {}


def run(desc: GemmDesc, a, b, c, plan=None) -> None:
    """Launch through a cached ``BoundLaunch``: after the first call of a problem shape, a call
    only refills the kernel's argument block (about 7 µs of host time on an H100 host)."""
    pa, pb, pc = a.data.ptr, b.data.ptr, c.data.ptr
    config = plan.config if plan is not None else None
    # the bound launch fixes each pointer's alignment class (16-byte vector path or not)
    key = (desc.key, config, pa & 15 == 0, pb & 15 == 0, pc & 15 == 0)
    bound = _bound.get(key)
    if bound is None:
        from ..kernels.launch import bind

        bound = _bound[key] = bind(kernel_problem(desc, pa, pb, pc), config)
    bound(pa, pb, pc, desc.alpha, desc.beta)
