"""CUDA driver and runtime shims shared by the launchers (mma.sync and Hopper): the bindings,
imported once and lazily (``import pyblasgemm`` creates no CUDA context), raw stream handles,
and the alpha/beta argument cells.
"""
from __future__ import annotations

import numpy as np

__all__ = ["set_scales", "stream_handle"]

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
