"""Any GPU array in, the same framework out: PyTorch tensors, JAX arrays, and any object with
``__cuda_array_interface__`` or ``__dlpack__``.

Foreign arrays are viewed, never copied: a GPU array becomes a CuPy array on the same memory
(DLPack, or the CUDA array interface), a CPU tensor a NumPy array (so it runs on the host
backend); the product's result goes back as the caller's type (torch in, torch out; JAX in,
JAX out). Device arrays never travel to the host. PyTorch's work is enqueued on PyTorch's
current stream unless ``stream=`` says otherwise; JAX has no user-visible stream, so its
arrays use CuPy's current stream.

bfloat16 crosses as int16 bits (the frameworks disagree on DLPack's bfloat16 code across
versions; the bits are the same) and is viewed back as ``ml_dtypes.bfloat16``.

Example (on a GPU with PyTorch)::

    >>> t = torch.randn(64, 64, device="cuda", dtype=torch.float16)     # doctest: +SKIP
    >>> type(pyblasgemm.matmul(t, t))                                    # doctest: +SKIP
    <class 'torch.Tensor'>
"""
from __future__ import annotations

import sys

import numpy as np

__all__ = ["is_foreign", "Converted", "convert"]

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _jax_array_type():
    jax = sys.modules.get("jax")
    return getattr(jax, "Array", None)


def framework(x) -> str | None:
    """'torch', 'jax', 'cai' (CUDA array interface), 'dlpack', or None (NumPy, CuPy, lists,
    scalars: not ours to convert).

    Example
    -------
    >>> import numpy as np
    >>> framework(np.ones(3)), framework([1.0, 2.0])
    (None, None)
    >>> class Numba:                      # anything with the CUDA array interface
    ...     __cuda_array_interface__ = {}
    >>> framework(Numba())
    'cai'
    """
    if isinstance(x, np.ndarray):
        return None
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return None
    tt = _torch_tensor_type()
    if tt is not None and isinstance(x, tt):
        return "torch"
    jt = _jax_array_type()
    if jt is not None and isinstance(x, jt):
        return "jax"
    if hasattr(x, "__cuda_array_interface__"):
        return "cai"
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return "dlpack"
    return None


def is_foreign(*arrays) -> bool:
    """Whether any of ``arrays`` is a foreign array this module converts.

    Example
    -------
    >>> import numpy as np
    >>> is_foreign(np.ones(2), None)
    False
    """
    return any(x is not None and framework(x) is not None for x in arrays)


def _on_gpu(x, kind: str) -> bool:
    if kind == "torch":
        return x.is_cuda
    if kind == "cai":
        return True
    dev = x.__dlpack_device__()[0]
    return int(dev) in (_KDL_CUDA, _KDL_CUDA_MANAGED)


def _to_native(x, kind: str, gpu: bool):
    """A NumPy / CuPy view of ``x``'s memory."""
    if kind == "torch":
        import torch

        x = x.detach()
        bf16 = x.dtype == torch.bfloat16
        if bf16:
            x = x.view(torch.int16)
        if gpu:
            import cupy

            with cupy.cuda.Device(x.device.index):
                native = cupy.from_dlpack(x)
        else:
            native = x.numpy()
        if bf16:
            import ml_dtypes

            native = native.view(ml_dtypes.bfloat16)
        return native
    if kind == "cai":
        import cupy

        return cupy.asarray(x)
    if gpu:
        import cupy

        if kind == "jax" and str(x.dtype) == "bfloat16":
            import jax
            import ml_dtypes

            return cupy.from_dlpack(jax.lax.bitcast_convert_type(x, "int16")).view(
                ml_dtypes.bfloat16)
        return cupy.from_dlpack(x)
    return np.from_dlpack(x)


def _from_native(result, kind: str, like):
    """``result`` (NumPy / CuPy) as the framework of ``like``."""
    if isinstance(result, np.generic):
        result = np.asarray(result)         # 1-D @ 1-D on the host gives a NumPy scalar
    if kind == "torch":
        import torch

        bf16 = result.dtype.name == "bfloat16"
        if bf16:
            result = result.view(np.int16)
        if isinstance(result, np.ndarray):
            out = torch.from_numpy(np.ascontiguousarray(result) if result.ndim == 0 else result)
        else:
            out = torch.from_dlpack(result)
        return out.view(torch.bfloat16) if bf16 else out
    if kind == "jax":
        import jax
        import jax.numpy as jnp

        if result.dtype.name == "bfloat16":
            bits = _from_native(result.view(np.int16), "jax", like)
            return jax.lax.bitcast_convert_type(bits, jnp.bfloat16)
        if isinstance(result, np.ndarray):
            return jnp.asarray(result)
        return jnp.from_dlpack(result)
    return result       # 'cai' / 'dlpack': a CuPy (or NumPy) array on the same memory


class Converted:
    """The native views of a call's arrays, and how to give the result back."""

    def __init__(self, arrays, kind, like, stream):
        self.arrays, self.kind, self.like, self.stream = arrays, kind, like, stream

    def back(self, result):
        from . import streams

        with streams.on(self.stream):
            return _from_native(result, self.kind, self.like)


def convert(routine: str, named, writes=()) -> Converted:
    """Native views of ``named`` ([(name, array or None), ...]); ``writes``: the names the
    routine writes into (they must be mutable: not JAX arrays).

    The views are taken on the stream the call will run on (PyTorch's current stream for
    tensors), so the DLPack exchange orders nothing across streams: inside a CUDA-graph
    capture, a wait on another stream would break it.

    Raises TypeError for an array on the GPU mixed with one on the host, and for a JAX array
    given to be written (JAX arrays are immutable)."""
    from . import streams

    kind = like = None
    places = set()
    kinds = []
    for name, x in named:
        k = None if x is None else framework(x)
        kinds.append(k)
        if x is None:
            continue
        if k is None:
            if isinstance(x, np.ndarray):
                places.add("host")
            elif hasattr(x, "device") and hasattr(x, "data"):
                places.add("gpu")
            continue
        if k == "jax" and name in writes:
            raise TypeError(f"{routine}: {name} is a JAX array, which is immutable; pass a "
                            f"PyTorch, CuPy or NumPy array to be written, or leave {name} out")
        places.add("gpu" if _on_gpu(x, k) else "host")
        if kind is None:
            kind, like = k, x
    if len(places) > 1:
        raise TypeError(f"{routine}: the arrays are on the host and on the GPU; pass them "
                        f"all on one (no array is copied between them)")
    gpu = "gpu" in places
    stream = _torch_stream(like) if kind == "torch" and gpu else None
    natives = []
    with streams.on(stream):
        for (name, x), k in zip(named, kinds):
            natives.append(x if k is None else _to_native(x, k, gpu))
    return Converted(natives, kind, like, stream)


def _torch_stream(t) -> int:
    """PyTorch's current raw stream on the tensor's device (its cheap accessor when it has one:
    ``torch.cuda.current_stream()`` costs ~6.7 µs on an H100 host)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream
