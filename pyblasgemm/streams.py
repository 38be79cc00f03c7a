"""Streams: what ``stream=`` accepts, and the raw handle every launch is given.

``stream=`` on the public forms takes a CuPy stream (``.ptr``), a PyTorch stream
(``.cuda_stream``), any object with the ``__cuda_stream__`` protocol (cuda.core: returns
``(version, handle)``), or a raw ``cudaStream_t`` as an int. ``None`` means the current stream
of the arrays' own framework: CuPy's current stream for CuPy arrays, PyTorch's for tensors
(the array door, pyblasgemm.arrays, passes it on). Work the library does with CuPy itself (scaling C, copies of
operands) runs on the same stream, inside :func:`on`.

Example
-------
>>> from pyblasgemm import streams
>>> streams.handle(0), streams.handle(None) is None
(0, True)
>>> streams.handle("fast")
Traceback (most recent call last):
    ...
TypeError: stream='fast' must be a CuPy or PyTorch stream, an object with __cuda_stream__, a raw cudaStream_t int, or None
"""
from __future__ import annotations

import contextlib
import importlib
import sys

__all__ = ["handle", "current", "on"]

_get_current_stream = None


def handle(stream) -> int | None:
    """The raw handle of ``stream`` (None stays None: "the current stream").

    Example
    -------
    >>> class TorchLike:             # what a torch.cuda.Stream offers
    ...     cuda_stream = 0x7f00
    >>> handle(TorchLike()), handle(5), handle(None)
    (32512, 5, None)
    """
    if stream is None:
        return None
    if type(stream) is int:
        if stream < 0:
            raise ValueError(f"stream={stream} must be a cudaStream_t handle (>= 0)")
        return stream
    ptr = getattr(stream, "ptr", None)            # cupy.cuda.Stream / ExternalStream
    if type(ptr) is int:
        return ptr
    ptr = getattr(stream, "cuda_stream", None)    # torch.cuda.Stream
    if type(ptr) is int:
        return ptr
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        return int(value[1])
    raise TypeError(f"stream={stream!r} must be a CuPy or PyTorch stream, an object with "
                    f"__cuda_stream__, a raw cudaStream_t int, or None")


def current() -> int:
    """CuPy's current stream on the current device, as a raw handle."""
    global _get_current_stream
    if _get_current_stream is None:
        from cupy.cuda import get_current_stream

        _get_current_stream = get_current_stream
    return _get_current_stream().ptr


def on(stream_handle: int | None):
    """A context in which CuPy works on ``stream_handle`` (nothing to do for None)."""
    if stream_handle is None:
        return contextlib.nullcontext()
    cupy = sys.modules.get("cupy") or importlib.import_module("cupy")
    if stream_handle == cupy.cuda.get_current_stream().ptr:
        return contextlib.nullcontext()
    return cupy_stream(stream_handle)


def cupy_stream(stream_handle: int):
    """A CuPy stream object for a raw ``cudaStream_t`` handle, not managed by CuPy (usable as a
    context, or where CuPy wants a stream: ``Event.record``): ``cupy.cuda.Stream.from_external``
    on the handle in the ``__cuda_stream__`` protocol (CuPy 14 deprecates ``ExternalStream``;
    an older CuPy gets that)."""
    cupy = sys.modules.get("cupy") or importlib.import_module("cupy")
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:         # CuPy >= 14: the stream protocol
        return from_external(_Handle(stream_handle))
    return cupy.cuda.ExternalStream(stream_handle)


class _Handle:
    """A raw handle dressed in the ``__cuda_stream__`` protocol (CuPy's ``from_external``)."""

    def __init__(self, value: int):
        self.value = value

    def __cuda_stream__(self):
        return (0, self.value)
