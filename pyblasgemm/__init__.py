"""pyblasgemm: BLAS-style GEMM for NVIDIA GPUs (and the host), NumPy-compatible.

Three forms, one engine:

* the BLAS raw form, column-major with leading dimensions: :func:`sgemm`, :func:`dgemm`,
  :func:`hgemm`, :func:`bgemm`, :func:`igemm`, :func:`cgemm`, :func:`zgemm`, and the
  mixed-precision :func:`shgemm` / :func:`sbgemm` (16-bit A and B, float32 C);
* :func:`gemm`, the pythonic form of ``cupy.cublas.gemm`` for every supported dtype;
* :func:`matmul`, exactly ``numpy.matmul``.

CuPy arrays run on the GPU (our tensor-core kernels, or cuBLAS), NumPy arrays on the host.
Importing the package imports neither CuPy nor creates a CUDA context.
"""
from ._version import __version__     # (the one source: pyproject reads it statically)

from ._types import get_default_compute, set_default_compute
from .blas import bgemm, cgemm, dgemm, hgemm, igemm, sbgemm, sgemm, shgemm, zgemm
from .desc import BlasArgumentError, GemmDesc
from .gemm import gemm
from .grouped import grouped_matmul
from .matmul import matmul
from .mlp import fused_mlp, mlp_plan
from .plancache import get_plan_cache
from .stateful import Matmul
from . import desc, epilogue, planner, scipy
from .describe_call import explain
from .planner import Plan, clear_plan_cache, plan, precompile, tune
from ._warnings import PyblasgemmWarning
from . import arrays as _array_door     # (not ``_arrays``: that name is a submodule's)


def _load_jax():
    from . import jax as module     # imports JAX: only when a JAX call needs it
    return module


def _load_torch():
    from . import torch as module   # imports PyTorch: only when a tensor needs autograd
    return module


# the integrations sit above the forms (they import them): the top registers them, the forms
# load them through arrays when a call needs one
_array_door.register_integration("jax", _load_jax)
_array_door.register_integration("torch", _load_torch)


__all__ = [
    "sgemm", "dgemm", "hgemm", "bgemm", "igemm", "cgemm", "zgemm", "shgemm", "sbgemm",
    "gemm", "matmul", "Matmul", "get_plan_cache", "grouped_matmul", "fused_mlp", "mlp_plan",
    "BlasArgumentError", "GemmDesc", "Plan", "clear_plan_cache", "plan", "tune", "explain",
    "precompile", "PyblasgemmWarning",
    "set_default_compute", "get_default_compute",
    "__version__",
]
