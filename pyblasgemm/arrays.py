"""The one door: any array in, the same framework out. NumPy and CuPy arrays are the engine's
own; PyTorch tensors, JAX arrays, and any object with ``__cuda_array_interface__`` or
``__dlpack__`` come through here.

Two ways through:

* **A repeated PyTorch call** (:func:`torch_replay`): the tensors' own attributes
  (``data_ptr()``, ``shape``, ``stride()``, ``dtype``, device; :func:`pyblasgemm.calls.key`) make the call's key, and
  a hit launches the recorded launch on the raw pointers, on PyTorch's current stream, into a
  result from ``torch.empty_strided`` (PyTorch's caching allocator: its memory statistics, CUDA
  graph pools and ``record_stream`` hold). No DLPack exchange, no CuPy array.
* **JAX** (:func:`jax_matmul`): ``matmul`` on JAX GPU arrays, and on tracers inside
  ``jax.jit`` / ``jax.grad`` / ``jax.vmap``, runs as an XLA operation (:mod:`pyblasgemm.jax`):
  XLA allocates the result and calls the launch on its own stream.
* **Every other call** (:func:`convert`): the arrays are viewed as NumPy / CuPy arrays, the call
  runs on the views, and the result goes back in the caller's framework. For PyTorch on the
  GPU every CuPy allocation of the call (the result, temporaries) is made by PyTorch's
  allocator (:meth:`Converted.allocating`); the call's launch, if it ran as one, is recorded
  for the replay (:func:`torch_record`).

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

import contextlib
import sys
from typing import NamedTuple

import numpy as np

from . import calls, streams

__all__ = ["framework", "is_foreign", "numpy_dtype", "Converted", "convert", "torch_type", "torch_signature", "torch_replay",
           "torch_record", "TorchCall"]

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


#: ml_dtypes' types that DLPack and ``Tensor.numpy()`` do not carry: name -> the integer type of
#: their size, whose bits are exchanged instead and viewed back (one row per type)
_BITS_ONLY = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def numpy_dtype(dtype):
    """``dtype=`` as the NumPy / CuPy views' call takes it: a PyTorch dtype by its name
    (``torch.bfloat16`` -> ml_dtypes' bfloat16, ``torch.float32`` -> float32); None, NumPy and
    JAX dtypes (NumPy's) and names as given, and a value of no known type too (the call's own
    check then names it).

    >>> numpy_dtype(None), numpy_dtype("float16")
    (None, 'float16')
    """
    if dtype is None or type(dtype).__module__ != "torch":
        return dtype
    name = str(dtype).rpartition(".")[2]                # 'torch.bfloat16' -> 'bfloat16'
    import ml_dtypes

    found = getattr(ml_dtypes, name, None) if name in _BITS_ONLY else getattr(np, name, None)
    return dtype if found is None else np.dtype(found)


def _to_native(x, kind: str, gpu: bool):
    """A NumPy / CuPy view of ``x``'s memory."""
    if kind == "torch":
        import torch

        x = x.detach()
        name = str(x.dtype).rpartition(".")[2]          # 'torch.float8_e4m3fn' -> 'float8_e4m3fn'
        bits = _BITS_ONLY.get(name)
        if bits is not None:
            x = x.view(getattr(torch, bits))
        if gpu:
            import cupy

            with cupy.cuda.Device(x.device.index):
                native = cupy.from_dlpack(x)
        else:
            native = x.numpy()
        if bits is not None:
            import ml_dtypes

            native = native.view(getattr(ml_dtypes, name))
        return native
    if kind == "cai":
        import cupy

        return cupy.asarray(x)
    if gpu:
        import cupy

        if kind == "jax":
            return _jax_gpu_view(cupy, x)
        return cupy.from_dlpack(x)
    if kind == "jax" and str(x.dtype) in _BITS_ONLY:
        # NumPy's DLPack import has no bfloat16 or float8 ("Unsupported dtype in DLTensor"): the bits
        import jax
        import ml_dtypes

        bits = "u" + _BITS_ONLY[str(x.dtype)].lstrip("u")
        return np.from_dlpack(jax.lax.bitcast_convert_type(x, bits)).view(getattr(ml_dtypes, str(x.dtype)))
    return np.from_dlpack(x)


def _jax_gpu_view(cupy, x):
    """A CuPy view of a JAX GPU array's buffer: wait until the array is computed, then take its
    pointer (0.6 µs on an H200, where DLPack took 8 µs and a bfloat16 array a bitcast through
    JAX's dispatch, ~40 µs; ``__cuda_array_interface__`` refuses bfloat16 buffers). JAX buffers
    are dense row-major and ``x.dtype`` is NumPy's (ml_dtypes' bfloat16 included). The view
    keeps ``x`` alive."""
    x.block_until_ready()
    ptr = x.unsafe_buffer_pointer()
    dtype = np.dtype(x.dtype)
    mem = cupy.cuda.UnownedMemory(ptr, x.size * dtype.itemsize, x, _jax_device_id(x))
    if dtype.name in _BITS_ONLY:            # made as its bits, then viewed (as torch's are)
        return cupy.ndarray(x.shape, _BITS_ONLY[dtype.name], cupy.cuda.MemoryPointer(mem, 0)).view(dtype)
    return cupy.ndarray(x.shape, dtype, cupy.cuda.MemoryPointer(mem, 0))


def _jax_device_id(x) -> int:
    """The CUDA ordinal of a single-device JAX array (its device's local id)."""
    (device,) = x.devices()
    local = getattr(device, "local_hardware_id", None)
    return device.id if local is None else local


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
            # a 0-d result (1-D @ 1-D) stays 0-d: np.ascontiguousarray would make it 1-D
            out = torch.from_numpy(np.array(result) if result.ndim == 0 else result)
        else:
            out = torch.from_dlpack(result)
        return out.view(torch.bfloat16) if bf16 else out
    if kind == "jax":
        import jax
        import jax.numpy as jnp

        if not isinstance(result, np.ndarray):
            fast = _JAX_IMPORT.take(result)
            if fast is not None:
                return fast
        if result.dtype.name == "bfloat16":
            bits = _from_native(result.view(np.int16), "jax", like)
            return jax.lax.bitcast_convert_type(bits, jnp.bfloat16)
        if isinstance(result, np.ndarray):
            return jnp.asarray(result)
        return jnp.from_dlpack(result)
    return result       # 'cai' / 'dlpack': a CuPy (or NumPy) array on the same memory


class _JaxImport:
    """A CuPy result as a JAX array through JAX's own DLPack import, called directly.

    ``jax.dlpack.from_dlpack`` costs ~35 µs a call on an H100 host (measured, bench/
    torch_callpath.py's primitives): it looks the backend, the device and the device's stream up
    each time and then passes the array through ``jnp.asarray`` and a placement step. The
    import underneath it (jaxlib's ``dlpack_managed_tensor_to_buffer``) is what makes the
    array; here the device and its stream are looked up once per CUDA device and the import
    is called alone. It is jaxlib's, not public API, so it is used only where its signature is
    the one this code was written for (jaxlib extension version >= 467), only for the dtypes
    JAX keeps as they are with or without ``jax_enable_x64`` (from_dlpack would narrow a
    float64 result there); an error, or an array of another type, dtype or shape, retires it
    for that dtype for the process (CuPy may not export a bfloat16 capsule: float16 keeps the
    direct import). ``take`` returns None, and the caller takes the public route, whenever it
    does not apply."""

    DTYPES = frozenset(("float16", "bfloat16", "float32", "int8", "int32", "complex64"))

    def __init__(self):
        self.usable = None          # None: not tried yet; False: jaxlib lacks the import
        self.retired = set()        # dtype names the import failed for
        self.devices = {}           # CUDA ordinal -> (jax device, its stream for external events)

    def _setup(self):
        try:
            from jax._src.lib import _jax, jaxlib_extension_version
            import jax
        except ImportError:
            return False
        if jaxlib_extension_version < 467 or not hasattr(_jax, "dlpack_managed_tensor_to_buffer"):
            return False
        self._import, self._array_type = _jax.dlpack_managed_tensor_to_buffer, jax.Array
        return True

    def _device(self, ordinal: int):
        entry = self.devices.get(ordinal)
        if entry is None:
            import jax

            device = jax.local_devices(backend="gpu")[0].client.device_from_local_hardware_id(ordinal)
            entry = self.devices[ordinal] = (device, device.get_stream_for_external_ready_events())
        return entry

    def take(self, result):
        name = result.dtype.name
        if self.usable is False or name not in self.DTYPES or name in self.retired:
            return None
        if self.usable is None:
            self.usable = self._setup()
            if not self.usable:
                return None
        try:
            device, stream = self._device(result.device.id)
            # the stream handshake: CuPy records the result's readiness on its stream and
            # makes JAX's stream wait for it, as from_dlpack does
            out = self._import(result.__dlpack__(stream=stream), device, stream, None, _KDL_CUDA)
        except Exception:       # jaxlib (or CuPy's export) differs: the public route from now on
            self.retired.add(name)
            return None
        if not isinstance(out, self._array_type) or out.dtype != result.dtype or out.shape != result.shape:
            self.retired.add(name)
            return None
        return out


_JAX_IMPORT = _JaxImport()


class Converted:
    """The native views of a call's arrays, and how to give the result back."""

    def __init__(self, arrays, kind, like, stream, gpu=False):
        self.arrays, self.kind, self.like, self.stream, self.gpu = arrays, kind, like, stream, gpu

    def allocating(self):
        """A context in which CuPy allocates from the caller's framework: PyTorch's caching
        allocator for tensors on the GPU (the result a torch caller gets is torch's memory),
        else nothing changes."""
        if self.kind == "torch" and self.gpu:
            import cupy

            return cupy.cuda.using_allocator(_torch_allocator(self.like.device))
        return contextlib.nullcontext()

    def back(self, result, framework_type=True):
        """``result`` (computed on the views) in the caller's framework. ``framework_type``:
        the result has NumPy's type for the product and takes the framework's (bfloat16 @
        bfloat16 is bfloat16); False when the call asked for its type (``dtype=``, an epilogue's
        result) and it stays as it is."""
        if (framework_type and self.kind in ("torch", "jax") and getattr(result, "dtype", None) == np.float32
                and len(self.arrays) >= 2 and all(getattr(x, "dtype", None) is not None
                                                  and x.dtype.name == "bfloat16" for x in self.arrays[:2])):
            # NumPy's bfloat16 @ bfloat16 is float32; PyTorch's and JAX's is bfloat16: the
            # float32 sum rounded once, as their own CPU kernels (and our GPU kernels) do
            import ml_dtypes

            result = result.astype(ml_dtypes.bfloat16)
        with streams.on(self.stream):
            return _from_native(result, self.kind, self.like)


def convert(routine: str, named, writes=(), optional_writes: bool = True) -> Converted:
    """Native views of ``named`` ([(name, array or None), ...]); ``writes``: the names the
    routine writes into (they must be mutable: not JAX arrays); ``optional_writes``: whether the
    routine may be called without them (the reference-BLAS form always writes its C).

    The views are taken on the stream the call will run on (PyTorch's current stream for
    tensors), so the DLPack exchange orders nothing across streams: inside a CUDA-graph
    capture, a wait on another stream would break it.

    Raises TypeError for an array on the GPU mixed with one on the host, for a JAX tracer
    (inside ``jax.jit`` / ``jax.grad`` / ``jax.vmap``: no memory to view), and for a JAX array
    given to be written (JAX arrays are immutable)."""
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
        if k == "jax" and _is_tracer(x):
            raise TypeError(f"{routine}: {name} is a JAX tracer ({type(x).__name__}): under jax.jit, "
                            f"jax.grad and jax.vmap pyblasgemm.matmul runs (a, b, "
                            f"{', '.join(JAX_TRACED_KEYWORDS)}: pyblasgemm.jax), {routine} with these "
                            f"arguments does not; call it outside them, on eager (concrete) JAX arrays")
        if k == "jax" and name in writes:
            instead = (f"or leave {name} out" if optional_writes else
                       "or call pyblasgemm.matmul / pyblasgemm.gemm, which return a new array")
            raise TypeError(f"{routine}: {name} is a JAX array, which is immutable; pass a "
                            f"PyTorch, CuPy or NumPy array to be written, {instead}")
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
    return Converted(natives, kind, like, stream, gpu)


def _is_tracer(x) -> bool:
    """Whether ``x`` is an abstract JAX value (a ``jax.core.Tracer``: inside jit, grad, vmap),
    which has no memory to view."""
    core = getattr(sys.modules.get("jax"), "core", None)
    tracer = getattr(core, "Tracer", None)
    return tracer is not None and isinstance(x, tracer)


def _torch_stream(t) -> int:
    """PyTorch's current raw stream on the tensor's device (its cheap accessor when it has one:
    ``torch.cuda.current_stream()`` costs ~6.7 µs on an H100 host)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


def _torch_allocator(device):
    """A CuPy allocator whose memory is PyTorch's (a uint8 tensor owns each block; CuPy's
    pointer keeps it alive)."""
    import cupy
    import torch

    def allocate(size: int):
        block = torch.empty(size, dtype=torch.uint8, device=device)
        mem = cupy.cuda.UnownedMemory(block.data_ptr(), size, block, device.index)
        return cupy.cuda.MemoryPointer(mem, 0)

    return allocate


# ------------------------------------------------------------------------------------------
# The repeated PyTorch call
# ------------------------------------------------------------------------------------------

_torch_tensor = calls.torch_tensor      # one list: the key builder compares types by identity


def torch_type():
    """``torch.Tensor`` once PyTorch has been imported by anyone, else None (never imports it)."""
    if _torch_tensor:
        return _torch_tensor[0]
    tt = _torch_tensor_type()
    if tt is not None:
        _torch_tensor.append(tt)
    return tt


class TorchCall(NamedTuple):
    """A recorded call for PyTorch tensors: the launch (a :class:`pyblasgemm.calls.Call`) and,
    for a fresh result, its torch dtype, shape and strides (None when the form writes into a
    given tensor)."""

    call: object
    dtype: object
    shape: tuple
    strides: tuple


def torch_signature(words: tuple, tensors: tuple):
    """``(key, pointers)`` of a call on CUDA tensors, or ``(None, None)`` for a CPU tensor or
    anything that is not a ``torch.Tensor`` (those take the converting path). ``words``: the
    form's own part of the key (its name, keywords and scalar types, as the CuPy key of the
    form holds them); ``tensors``: the two operands, then the output or None. The key is
    :func:`pyblasgemm.calls.key`'s (each tensor's dtype, shape, strides, device and
    ``requires_grad``, the pointers' alignment class); a tensor that requires grad while
    autograd records gives none (such a call must not replay into a detached launch, even one
    recorded under ``torch.no_grad()``)."""
    if not _torch_tensor:
        torch_type()
    sig = calls.key(words, *tensors)
    if sig is None:
        return None, None
    return sig[0], sig[1:]


def torch_raw_stream(device: int) -> int:
    """PyTorch's current raw stream (``cudaStream_t`` as an int) on device ordinal ``device``.

    The first call looks PyTorch's accessor up and rebinds this module's name to it, so that
    later calls (``arrays.torch_raw_stream(d)`` reads the name each time) go straight to
    torch's C function: a Python frame less, ~0.1 µs of a replayed call."""
    global torch_raw_stream
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:                     # (a PyTorch without the accessor: its public call)
        def raw(d):
            return torch.cuda.current_stream(d).cuda_stream
    torch_raw_stream = raw
    return raw(device)


def torch_replay(words, a, b, out, stream, alpha=None, beta=None):
    """The recorded launch of the call ``words`` on tensors (a, b, out) through their raw
    pointers, or None (not CUDA tensors, no record, or what the key cannot prove fails: a
    fresh result's alignment, C meeting A or B, a scalar out of the routine's range; the
    caller then takes the full path). ``alpha`` / ``beta`` None: the form's fixed ones
    (matmul). Returns the result tensor (``out`` when given).

    Every tensor attribute is read once, by the key (~0.1-0.2 µs a read on an H100 host: the
    key of two tensors is most of the ~1.5 µs this adds to the launch and the allocation)."""
    sig = calls.key(words, a, b, out)
    if sig is None:
        return None
    k, pa, pb, pc = sig
    hit = calls.get(k)
    if hit is None:
        return None
    call = hit.call
    dev = k[calls.TORCH_DEVICE]     # (an ordinal: torch takes it as the CUDA device)
    if out is None:
        # the operands' own dtype and device: ``a.new_empty_strided`` parses no keyword (4.0 µs
        # against empty_strided's 4.3; one H100 host, .dev probe of 2026-11-27)
        c = a.new_empty_strided(hit.shape, hit.strides) if hit.dtype is a.dtype else \
            sys.modules["torch"].empty_strided(hit.shape, hit.strides, dtype=hit.dtype, device=dev)
        pc = c.data_ptr()
        if pc & call.c_mask:
            return None
    else:
        c = out
        if calls.overlaps(call, pa, pb, pc):
            return None
    if alpha is None:
        alpha, beta = call.one, call.zero
    else:
        lim = call.limit
        if not (-lim <= alpha <= lim and -lim <= beta <= lim and alpha != 0):
            return None
        alpha, beta = alpha + call.zero, beta + call.zero
    call.run(pa, pb, pc, alpha, beta, torch_raw_stream(dev) if stream is None else streams.handle(stream))
    return c


def torch_record(words, a, b, out, result) -> None:
    """After a converting call on tensors (a, b, out): if the call on the views was recorded
    as one launch (:func:`pyblasgemm.calls.last_recorded`), record it under the tensors' own
    key (``out`` None: ``result`` is the fresh tensor the call returned)."""
    call = calls.last_recorded()
    sig = calls.key(words, a, b, out)
    if sig is None or call is None:
        return
    if out is None:
        calls.put(sig[0], TorchCall(call, result.dtype, tuple(result.shape), tuple(result.stride())),
                  refers_to=call.launch)
    else:
        calls.put(sig[0], TorchCall(call, None, None, None), refers_to=call.launch)


# ------------------------------------------------------------------------------------------
# The repeated JAX call
# ------------------------------------------------------------------------------------------

def jax_type():
    """JAX's concrete array type once JAX has been imported by anyone, else None (never
    imports it).

    >>> t = jax_type()
    >>> t is None or t.__name__ == "ArrayImpl"
    True
    """
    if calls.jax_array:
        return calls.jax_array[0]
    jax = sys.modules.get("jax")
    impl = getattr(getattr(getattr(jax, "_src", None), "array", None), "ArrayImpl", None)
    if impl is not None:
        calls.jax_array.append(impl)
    return impl


#: the integrations above the forms ({'jax' | 'torch': a function that imports and returns the
#: module}): each imports the forms, so no form may import it; the package's ``__init__``
#: (which imports every layer) registers them, and a call that needs one loads it then
_INTEGRATIONS: dict = {}
#: pyblasgemm.jax, once a JAX call has needed it (it imports JAX: loaded on first need)
_JAX_OPS: list = []
#: pyblasgemm.torch, once a tensor that requires grad has needed it
_TORCH_OPS: list = []


def register_integration(name: str, loader) -> None:
    """Name the function that loads the integration ``name`` (``'jax'``, ``'torch'``): called by
    the package's ``__init__``, so that this layer, below the forms, never names a module above
    them.

    >>> register_integration("jax", _INTEGRATIONS["jax"])    # what pyblasgemm/__init__.py does
    """
    _INTEGRATIONS[name] = loader


def _integration(name: str):
    loader = _INTEGRATIONS.get(name)
    if loader is None:      # (only if this module was imported without the package's __init__)
        raise RuntimeError(f"pyblasgemm's {name} integration is not registered: import pyblasgemm first")
    return loader()

#: what pyblasgemm.jax.matmul takes besides a and b (under jit / grad / vmap nothing else has a
#: meaning: no memory to write into, no stream to name)
JAX_TRACED_KEYWORDS = ("bias", "activation", "compute", "backend")


def jax_matmul(routine: str, a, b, bias, activation, compute, backend, others: dict):
    """``matmul`` on JAX arrays as an XLA operation (:mod:`pyblasgemm.jax`): for tracers
    (inside ``jax.jit`` / ``jax.grad`` / ``jax.vmap``) always, for eager arrays when both
    operands are on one GPU and no keyword of ``others`` ({name: value}: ``out``, ``dtype``,
    ``stream``...) is given. None otherwise (the converting path runs the call); a TypeError
    for a tracer with a keyword the operation cannot take."""
    jt = jax_type()
    # concrete arrays (the eager call) are no tracers: asked only of other types (~0.4 µs a
    # check on the dev host, a third of the route's own cost before the product)
    traced = not (type(a) is jt and type(b) is jt and (bias is None or type(bias) is jt)) and \
        any(_is_tracer(x) for x in (a, b, bias))
    given = [name for name, value in others.items()
             if value is not None and not (type(value) is dict and not value)]
    if traced:
        if given:
            raise TypeError(f"{routine}: under jax.jit, jax.grad and jax.vmap (JAX tracers) "
                            f"pyblasgemm.matmul takes a, b, {', '.join(JAX_TRACED_KEYWORDS)}; "
                            f"not {', '.join(given)} (call it on eager JAX arrays for those)")
    else:
        if given or type(a) is not jt or type(b) is not jt or (bias is not None and type(bias) is not jt) \
                or not (calls.on_one_gpu(a.sharding) and calls.on_one_gpu(b.sharding)):
            return None
    if not (activation is None or type(activation) is str) or not (compute is None or type(compute) is str) \
            or not (backend is None or type(backend) is str):
        if not traced:
            return None             # (the converting path names the bad word)
        raise TypeError(f"{routine}: activation, compute and backend are words (str) or None")
    if not _JAX_OPS:
        _JAX_OPS.append(_integration("jax"))
    if traced:
        return _JAX_OPS[0].matmul(a, b, bias=bias, activation=activation, compute=compute, backend=backend)
    return _JAX_OPS[0].eager(a, b, bias, activation, compute, backend)


def needs_grad(*xs) -> bool:
    """Whether a PyTorch tensor among ``xs`` requires a gradient while autograd records (then
    the call goes to :mod:`pyblasgemm.torch`'s differentiable operators instead of a detached
    product).

    >>> import numpy as np
    >>> needs_grad(np.ones(2), None)
    False
    """
    tt = torch_type()
    # isinstance: a torch.nn.Parameter (a subclass) requires grad too (it was detached)
    if tt is None or not any(isinstance(x, tt) and x.requires_grad for x in xs):
        return False
    import torch

    return torch.is_grad_enabled()


def differentiable(name: str):
    """:mod:`pyblasgemm.torch`'s differentiable operator ``name`` (``'matmul'``, ``'linear'``):
    where the forms send tensors that require grad. The integration is a plug-in above the
    forms (it imports them): loaded on first use through the loader the package's ``__init__``
    registered (:func:`register_integration`), so that no form imports it.

    >>> import pyblasgemm.torch    # doctest: +SKIP
    >>> differentiable("linear") is pyblasgemm.torch.linear    # doctest: +SKIP
    True
    """
    if not _TORCH_OPS:
        _TORCH_OPS.append(_integration("torch"))
    return getattr(_TORCH_OPS[0], name)


def check_differentiable(routine: str, **given) -> None:
    """TypeError naming the first keyword given (not None) that the differentiable product
    does not take: ``out=`` and ``dtype=`` as ``torch.matmul``'s ``out=`` (no automatic
    differentiation), ``compute=`` / ``backend=`` / ``stream=`` / ``autotune=`` because the
    autograd operators plan their products themselves."""
    for name, value in given.items():
        if value is not None and not (name == "numpy_kwargs" and not value):
            raise TypeError(f"{routine}: {name}={value!r} with tensors that require grad: the "
                            f"differentiable product (pyblasgemm.torch.matmul / linear) takes no "
                            f"{name}=; detach the tensors, or call it under torch.no_grad()")
