"""CUDA driver and runtime shims shared by the launchers (mma.sync and Hopper): the bindings,
imported once and lazily (``import pyblasgemm`` creates no CUDA context), raw stream handles,
and the alpha/beta argument cells.
"""
from __future__ import annotations

import numpy as np

__all__ = ["set_scales", "stream_handle", "launch_kernel", "make_context_current"]

#: CUresult CUDA_ERROR_INVALID_CONTEXT (cuda.h)
INVALID_CONTEXT = 201

_DRIVER = None
_RUNTIME = None
_CUR = None


def set_scales(cells: dict, is_int: bool, alpha, beta) -> None:
    """Write alpha/beta into a kernel's argument cells: integers for s8 (ValueError otherwise),
    floats for every other kind.

    Example::

        set_scales(cells, False, 0.5, 0.0)      # cells["alpha"].value == 0.5
    """
    if is_int:
        if not (isinstance(alpha, (int, np.integer)) and isinstance(beta, (int, np.integer))):
            raise ValueError("s8 takes integer alpha and beta")
        cells["ialpha"].value = int(alpha)
        cells["ibeta"].value = int(beta)
    else:
        cells["alpha"].value = alpha
        cells["beta"].value = beta


def stream_handle(stream) -> int:
    """The raw ``cudaStream_t`` of a CuPy stream, an int handle, or None (CuPy's current stream).

    Example::

        stream_handle(cupy.cuda.Stream())      # its cudaStream_t as an int; None -> current stream
    """
    if stream is None:
        return _current_stream().ptr
    if isinstance(stream, int):
        return stream
    return stream.ptr


def _current_stream():
    global _CUR
    if _CUR is None:
        from cupy.cuda import get_current_stream

        _CUR = get_current_stream
    return _CUR()


def _driver():
    global _DRIVER
    if _DRIVER is None:
        from cupy_backends.cuda.api import driver

        _DRIVER = driver
    return _DRIVER


def _runtime():
    global _RUNTIME
    if _RUNTIME is None:
        from cupy_backends.cuda.api import runtime

        _RUNTIME = runtime
    return _RUNTIME


def make_context_current(device: int) -> bool:
    """Make ``device``'s primary context current if this thread has none; say whether it had none.

    A thread that has made no CUDA runtime call has no current context (a fresh thread of a
    pool: Dask's threaded scheduler, ``concurrent.futures``; CuPy's allocations there are served
    from its pool without a runtime call). A driver-API launch then fails with
    CUDA_ERROR_INVALID_CONTEXT. ``cudaSetDevice`` makes the primary context current at once
    (CUDA 12+), as the runtime does lazily on a thread's first call. Called only after such a
    failure, so the hot path pays nothing.

    Example::

        make_context_current(0)     # False on a thread that already has a context
    """
    if _driver().ctxGetCurrent() != 0:
        return False
    _runtime().setDevice(device)
    return True


def launch_kernel(device: int, fptr: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                  smem: int, stream: int, params: int) -> None:
    """``cuLaunchKernel`` with a ``void**`` of arguments at ``params``; on a thread without a
    current context (:func:`make_context_current`), makes ``device``'s current and launches again.

    Example::

        launch_kernel(0, fptr, 132, 1, 1, 128, 1, 1, smem, stream, ct.addressof(params))
    """
    drv = _driver()
    try:
        drv.launchKernel(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
    except drv.CUDADriverError as e:
        if getattr(e, "status", None) != INVALID_CONTEXT or not make_context_current(device):
            raise
        drv.launchKernel(fptr, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
