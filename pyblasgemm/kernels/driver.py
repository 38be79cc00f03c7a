"""The CUDA driver calls of the launchers, through NVIDIA's public bindings (``cuda.bindings``,
the ``cuda-bindings`` package, which finds libcuda with ``cuda-pathfinder``): launches, memsets
and copies on a stream, occupancy, function attributes, stream-capture state, the current
context; raw stream handles and the alpha/beta argument cells.

The bindings are imported once and lazily (``import pyblasgemm`` imports no CUDA module and
creates no context). Every call goes to the driver API (libcuda is one per process), none to a
CUDA runtime: the bindings carry their own cudart, which is not the one CuPy and PyTorch use.

Hot path: a launch is ``cuLaunchKernel`` with handles made once (a :func:`function` per bound
kernel, a :func:`stream` per stream handle); cuda.bindings converts a plain int on every call
(0.1-0.2 µs each, measured on this package's host with a stub driver), an object it was given
it only reads.

Without ``cuda-bindings`` the GPU path raises :class:`BindingsMissing` (an ImportError naming
the install), never a slower route; the host path needs none of this.
"""
from __future__ import annotations

import numpy as np

__all__ = ["bindings", "function", "stream", "device_pointer", "launch_config", "launch_kernel",
           "launch_kernel_ex", "memset_words_async",
           "copy_to_device_async", "record_event", "occupancy", "set_max_dynamic_shared_memory", "is_capturing",
           "make_context_current", "call_in_context", "recover", "check", "set_scales", "stream_handle",
           "CudaDriverError", "BindingsMissing", "INVALID_CONTEXT"]

#: CUresult CUDA_ERROR_INVALID_CONTEXT (cuda.h): a launch on a thread with no current context
INVALID_CONTEXT = 201

#: cuda.bindings.driver, once :func:`bindings` imported it (every handle maker calls it first,
#: so the launch functions, which take handles, find it set)
_CU = None
_CUR = None
#: stream handle -> CUstream; bounded (a handle is a number: a stale entry costs nothing)
_STREAMS: dict = {}
_STREAMS_MAX = 4096


class BindingsMissing(ImportError):
    """``cuda-bindings`` is not installed: the GPU path cannot call the driver."""


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; ``status`` is its CUresult (an int), ``call`` its name.

    >>> e = CudaDriverError("cuLaunchKernel", 201)
    >>> e.status, str(e)
    (201, 'cuLaunchKernel failed: CUresult 201')
    """

    def __init__(self, call: str, status: int, name: str = ""):
        super().__init__(f"{call} failed: {name} ({status})" if name else f"{call} failed: CUresult {status}")
        self.call, self.status = call, status


def bindings():
    """``cuda.bindings.driver``, imported on first use.

    Example::

        cu = bindings(); cu.cuDriverGetVersion()     # (<CUresult.CUDA_SUCCESS: 0>, 13000)
    """
    global _CU
    if _CU is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:
            raise BindingsMissing(
                "pyblasgemm's GPU path calls the CUDA driver through NVIDIA's cuda-bindings, which "
                "is not installed: pip install 'pyblasgemm[cuda13]' (or cuda-bindings 13.x; "
                "cuda-bindings 12.x with CUDA 12)") from e
        _CU = driver
    return _CU


def check(result, call: str):
    """The value(s) a cuda.bindings call returned after its CUresult (None when it returned
    none); :class:`CudaDriverError` with the error's name when the CUresult is not success.

    Example::

        n = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, 256, 0), "occupancy")
    """
    err = result[0]
    if err:
        raise CudaDriverError(call, int(err), getattr(err, "name", ""))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def function(ptr: int):
    """The ``CUfunction`` handle of a kernel's address (CuPy's ``kernel.ptr``), made once per
    bound launch.

    Example::

        fn = function(raw_kernel.kernel.ptr)
    """
    return bindings().CUfunction(ptr)


def stream(handle: int):
    """The ``CUstream`` of a raw stream handle, cached per handle.

    Example::

        s = stream(cupy.cuda.get_current_stream().ptr)
    """
    s = _STREAMS.get(handle)
    if s is None:
        if len(_STREAMS) >= _STREAMS_MAX:
            _STREAMS.clear()
        s = _STREAMS[handle] = bindings().CUstream(handle)
    return s


def device_pointer(ptr: int):
    """The ``CUdeviceptr`` of a device address (made once where a launcher keeps one)."""
    return bindings().CUdeviceptr(ptr)


def launch_config(grid: tuple, block: tuple, smem: int, on_stream):
    """A ``CUlaunchConfig`` for ``cuLaunchKernelEx``: ``grid`` and ``block`` (3 ints each),
    ``smem`` bytes of dynamic shared memory, on ``on_stream`` (a :func:`stream`), no
    attributes. A launcher makes one per stream and keeps it: a launch through it converts 4
    arguments, not cuLaunchKernel's 11 (0.21 against 0.27 µs a call beyond an empty Python
    call, cuda-bindings 13.5 over a stand-in libcuda: bench/replay_host.py's stub).

    Example::

        cfg = launch_config((132, 1, 1), (128, 1, 1), 0, stream(sptr))
    """
    cfg = bindings().CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(x) for x in grid)
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(x) for x in block)
    cfg.sharedMemBytes = int(smem)
    cfg.hStream = on_stream
    cfg.numAttrs = 0
    return cfg


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


def make_context_current(device: int) -> bool:
    """Make ``device``'s primary context current if this thread has none; say whether it had none.

    A thread that has made no CUDA runtime call has no current context (a fresh thread of a
    pool: Dask's threaded scheduler, ``concurrent.futures``; CuPy's allocations there are served
    from its pool without a runtime call). A driver-API launch then fails with
    CUDA_ERROR_INVALID_CONTEXT. The primary context (the one the CUDA runtime of CuPy and
    PyTorch uses) is retained and made current, as the runtime does on a thread's first call;
    the retain is kept (a primary context lives until the process ends). Called only after such
    a failure, so the hot path pays nothing.

    Example::

        make_context_current(0)     # False on a thread that already has a context
    """
    cu = bindings()
    if int(check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent") or 0) != 0:
        return False
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return True


def recover(err, device: int, call: str, fn, *args):
    """After ``fn(*args)`` (a cuda.bindings call) answered ``err``: on a thread without a
    current context (CUDA_ERROR_INVALID_CONTEXT), make one (:func:`make_context_current`) and
    call once more, returning what :func:`check` makes of that; otherwise
    :class:`CudaDriverError`. The cold half of the calls below, whose hot path checks the
    CUresult inline.

    Example::

        err, = cu.cuLaunchKernel(*args)
        if err:
            recover(err, device, "cuLaunchKernel", cu.cuLaunchKernel, *args)
    """
    if err == INVALID_CONTEXT and make_context_current(device):
        return check(fn(*args), call)
    raise CudaDriverError(call, int(err), getattr(err, "name", ""))


def call_in_context(device: int, call: str, fn, *args):
    """``fn(*args)`` through :func:`check`, once more in a context made for a fresh thread
    (:func:`recover`)."""
    result = fn(*args)
    if result[0]:
        return recover(result[0], device, call, fn, *args)
    return check(result, call)


def launch_kernel(device: int, fn, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                  smem: int, stream, params: int) -> None:
    """``cuLaunchKernel`` of ``fn`` (a :func:`function`) on ``stream`` (a :func:`stream`, or a
    raw handle) with a ``void**`` of arguments at ``params``; on a thread without a current
    context (:func:`make_context_current`), makes ``device``'s current and launches again.
    :class:`CudaDriverError` when the driver refuses.

    Example::

        launch_kernel(0, function(fptr), 132, 1, 1, 128, 1, 1, smem, stream(sptr), ct.addressof(params))
    """
    err, = _CU.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, 0)
    if err:
        recover(err, device, "cuLaunchKernel", _CU.cuLaunchKernel, fn, gx, gy, gz, bx, by, bz, smem, stream, params, 0)


def launch_kernel_ex(device: int, config, fn, params: int) -> None:
    """``cuLaunchKernelEx`` of ``fn`` (a :func:`function`) with ``config`` (a
    :func:`launch_config`, which holds the grid, block, shared memory and stream) and a
    ``void**`` of arguments at ``params``; a fresh thread and a refusal as :func:`launch_kernel`.

    Example::

        launch_kernel_ex(0, launch_config((8, 1, 1), (128, 1, 1), 0, stream(sptr)), function(fptr), params)
    """
    err, = _CU.cuLaunchKernelEx(config, fn, params, 0)
    if err:
        recover(err, device, "cuLaunchKernelEx", _CU.cuLaunchKernelEx, config, fn, params, 0)


def memset_words_async(device: int, ptr, words: int, stream) -> None:
    """Zero ``words`` 32-bit words at ``ptr`` (a :func:`device_pointer`) in ``stream`` order
    (capturable: a memset node in a CUDA graph); a fresh thread as :func:`launch_kernel`.

    Example::

        memset_words_async(0, device_pointer(flags.data.ptr), flags.size, stream(sptr))
    """
    err, = _CU.cuMemsetD32Async(ptr, 0, words, stream)
    if err:
        recover(err, device, "cuMemsetD32Async", _CU.cuMemsetD32Async, ptr, 0, words, stream)


def copy_to_device_async(device: int, dst, src_ptr: int, nbytes: int, stream) -> None:
    """Copy ``nbytes`` from host memory at ``src_ptr`` (pinned: the copy is asynchronous) to
    ``dst`` (a :func:`device_pointer`) in ``stream`` order.

    Example::

        copy_to_device_async(0, device_pointer(table.data.ptr), pinned.ptr, rows.nbytes, stream(sptr))
    """
    call_in_context(device, "cuMemcpyHtoDAsync", _CU.cuMemcpyHtoDAsync, dst, src_ptr, nbytes, stream)


def record_event(device: int, event_ptr: int, stream) -> None:
    """Record the event at ``event_ptr`` (a CuPy event's ``.ptr``) in ``stream``.

    Example::

        record_event(0, done.ptr, stream(sptr))
    """
    call_in_context(device, "cuEventRecord", _CU.cuEventRecord, event_ptr, stream)


def occupancy(fptr: int, threads: int, smem: int) -> int:
    """CTAs of the kernel at ``fptr`` that fit on one SM at once with ``threads`` threads and
    ``smem`` bytes of dynamic shared memory (the driver's answer, at least 1).

    Example::

        occupancy(kern.kernel.ptr, 256, 98304)      # 2 on an H100 for a 96 KB tile
    """
    cu = bindings()
    n = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(fptr), threads, smem),
              "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return max(1, int(n))


def set_max_dynamic_shared_memory(fptr: int, nbytes: int) -> None:
    """Let the kernel at ``fptr`` take ``nbytes`` of dynamic shared memory (more than 48 KB
    needs this opt-in: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).

    Example::

        set_max_dynamic_shared_memory(funcs[0].ptr, 200 * 1024)
    """
    cu = bindings()
    check(cu.cuFuncSetAttribute(cu.CUfunction(fptr),
                                cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                nbytes), "cuFuncSetAttribute")


def is_capturing(device: int, handle: int) -> bool:
    """Whether the stream ``handle`` of ``device`` is capturing a CUDA graph (a capture that
    was invalidated counts: nothing may be allocated on it either).

    Example::

        is_capturing(0, cupy.cuda.get_current_stream().ptr)     # False outside a capture
    """
    cu = bindings()
    status = call_in_context(device, "cuStreamIsCapturing", cu.cuStreamIsCapturing, stream(handle))
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
