"""pyblasgemm's own tensor-core GEMM kernels (CUDA C++ headers compiled with NVRTC).

Public entry points::

    from pyblasgemm.kernels import KernelProblem, KernelConfig, run, supports

Importing this package imports neither CuPy nor creates a CUDA context.
"""
from .config import (DECOMPOSITIONS, SHIPPED_CONFIGS, SM90_CONFIGS, SM90_CONFIGS_BY_TILE, KernelConfig,
                     default_config)
from .problem import KernelProblem
# fills the kernel-family registry (config.KERNEL_FAMILIES) that every layer looks families up in
from . import families  # noqa: E402,F401


def run(problem, config=None, stream=None, **kw):
    """See :func:`pyblasgemm.kernels.launch.run`."""
    from .launch import run as _run

    return _run(problem, config, stream, **kw)


def supports(problem):
    """See :func:`pyblasgemm.kernels.launch.supports`."""
    from .launch import supports as _supports

    return _supports(problem)


__all__ = ["KernelProblem", "KernelConfig", "SHIPPED_CONFIGS", "SM90_CONFIGS", "SM90_CONFIGS_BY_TILE", "DECOMPOSITIONS", "default_config", "run",
           "supports"]
