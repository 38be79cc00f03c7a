"""The stateful form for loops: plan once, then launch with nothing but pointers.

``Matmul(a, b, out=c)`` does everything a call does except the launch: it checks the
arguments, describes the problem, plans it and binds the plan's launch (compiled kernel and
packed arguments, or the cuBLASLt descriptors and algorithm). ``execute()`` then enqueues the
product; ``execute(a=new_a, b=new_b, c=new_c)`` runs on other arrays of the same layout (same
dtype, shape and strides; pointers in the same alignment class), checked with a handful of
comparisons. ``free()`` (or leaving a ``with`` block) releases what it holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:     # types only: importing pyblasgemm imports none of these
    import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]
    import jax
    import torch

    from ._typing import Activation, Backend, Compute

import numpy as np

from . import _arrays, arrays, calls, streams
from ._layout import may_overlap
from ._types import ROW_BY_DTYPE, ROW_BY_DTYPES, acc_dtype, resolve_compute
from .desc import check_backend, check_epilogue
from .epilogue_pass import apply as _epilogue_pass
from .matmul import _batched, matmul as _matmul

__all__ = ["Matmul"]

#: the framework's array type a Matmul was made from, which execute() answers in
_Array = TypeVar("_Array")


class Matmul(Generic[_Array]):
    """``out = a @ b`` (``numpy.matmul`` semantics on CuPy arrays), planned once.

    The product must run as one launch on the arrays' own memory (what C-contiguous,
    F-contiguous or transposed operands and mergeable batches give); otherwise ValueError
    says why and :func:`pyblasgemm.matmul` is the form to use.

    PyTorch tensors, JAX arrays and other CUDA-array-interface or DLPack objects are taken too
    (:mod:`pyblasgemm.arrays`): on the GPU the same launch runs on their memory, on PyTorch's
    current stream for tensors; on the host (CPU tensors, JAX CPU arrays) there is no launch
    to bind and each execute is a :func:`pyblasgemm.matmul` call into ``out``. Results come
    back in the caller's framework and type (bfloat16 stays bfloat16): a tensor ``out``
    (given, or allocated once) is written in place by every execute; JAX arrays are immutable,
    so ``out`` cannot be one and each execute returns a new JAX array. A tensor that requires
    grad is refused (a bound launch records no autograd graph: :func:`pyblasgemm.matmul`
    differentiates).

    Parameters
    ----------
    a, b : cupy.ndarray, or a framework's arrays (see above)
        Operands with 2 or more dimensions (batch dimensions broadcast), one dtype among
        float16, bfloat16, float32, float64, complex64, complex128.
    out : cupy.ndarray or a tensor, optional
        The result array; allocated (C-ordered) when not given, and reused by every execute.
    compute, backend, stream : optional
        As for :func:`pyblasgemm.matmul`; ``stream`` is the default of :meth:`execute`.
    bias, activation, preactivation_out : optional
        An epilogue, as for :func:`pyblasgemm.matmul` (:mod:`pyblasgemm.epilogue`): the
        product then goes into an accumulation-type array this object holds, and each
        execute adds the epilogue pass (the arrays given here are the ones it uses).

    Examples
    --------
    On a GPU:

    >>> mm = pyblasgemm.Matmul(a, b, out=c)            # doctest: +SKIP
    >>> for step in range(1000):                       # doctest: +SKIP
    ...     mm.execute()                               # c = a @ b, ~5 µs of host time
    >>> mm.execute(a=a2)                               # doctest: +SKIP
    >>> mm.free()                                      # doctest: +SKIP

    PyTorch CPU tensors, on the host:

    >>> import torch, pyblasgemm
    >>> a = torch.ones(2, 3, dtype=torch.bfloat16)
    >>> c = torch.empty(2, 2, dtype=torch.bfloat16)
    >>> mm = pyblasgemm.Matmul(a, torch.ones(3, 2, dtype=torch.bfloat16), out=c)
    >>> mm.execute() is c, c
    (True, tensor([[3., 3.],
            [3., 3.]], dtype=torch.bfloat16))
    """

    #: the door's Converted of a construction from foreign arrays (None: CuPy arrays)
    _conv = None
    #: CUDA tensors with no epilogue and no fixed stream: their device (execute()'s fast path)
    _torch_device = None
    _host = False

    # the arrays' framework in gives it out of execute() (pyblasgemm._typing)
    @overload
    def __init__(self: Matmul[torch.Tensor], a: torch.Tensor, b: torch.Tensor,
                 out: torch.Tensor | None = None, *, compute: Compute | None = None,
                 backend: Backend | None = None, stream: Any = None, bias: Any = None,
                 activation: Activation | None = None, preactivation_out: Any = None) -> None: ...

    @overload
    def __init__(self: Matmul[jax.Array], a: jax.Array, b: jax.Array,
                 out: jax.Array | None = None, *, compute: Compute | None = None,
                 backend: Backend | None = None, stream: Any = None, bias: Any = None,
                 activation: Activation | None = None, preactivation_out: Any = None) -> None: ...

    @overload
    def __init__(self: Matmul[cupy.ndarray], a: cupy.ndarray, b: cupy.ndarray,
                 out: cupy.ndarray | None = None, *, compute: Compute | None = None,
                 backend: Backend | None = None, stream: Any = None, bias: Any = None,
                 activation: Activation | None = None, preactivation_out: Any = None) -> None: ...

    @overload
    def __init__(self: Matmul[Any], a: Any, b: Any, out: Any = None, *,
                 compute: Compute | None = None, backend: Backend | None = None,
                 stream: Any = None, bias: Any = None, activation: Activation | None = None,
                 preactivation_out: Any = None) -> None: ...

    def __init__(self, a: Any, b: Any, out: Any = None, *, compute: Compute | None = None,
                 backend: Backend | None = None, stream: Any = None, bias: Any = None,
                 activation: Activation | None = None, preactivation_out: Any = None) -> None:
        if arrays.is_foreign(a, b, out, bias, preactivation_out):
            self._init_foreign(a, b, out, compute, backend, stream, bias, activation,
                               preactivation_out)
            return
        self._init(a, b, out, compute, backend, stream, bias, activation, preactivation_out)

    def _init_foreign(self, a, b, out, compute, backend, stream, bias, activation, pre):
        """The construction on the views of PyTorch / JAX / DLPack arrays (pyblasgemm.arrays)."""
        if arrays.needs_grad(a, b, out, bias, pre):
            raise TypeError("Matmul: a tensor requires grad, and a bound launch records no "
                            "autograd graph: use pyblasgemm.matmul (differentiable through "
                            "pyblasgemm.torch), or detach the tensors / call under "
                            "torch.no_grad()")
        conv = arrays.convert("Matmul", [("a", a), ("b", b), ("out", out), ("bias", bias),
                                         ("preactivation_out", pre)],
                              writes=("out", "preactivation_out"))
        na, nb, nout, nbias, npre = conv.arrays
        with conv.allocating():
            # the binding run on the caller's stream (PyTorch's current one for tensors);
            # execute() asks for it again each call unless stream= was given
            self._init(na, nb, nout, compute, backend, conv.stream if stream is None else stream,
                       nbias, activation, npre, host_ok=True)
        self._stream = streams.handle(stream)
        self._conv = conv
        # the caller's out: given, or a tensor on the held result's memory (JAX: none, each
        # execute returns a new array)
        self._out_foreign = out if out is not None else (
            None if conv.kind == "jax" else conv.back(self.out, framework_type=False))
        if conv.kind == "torch" and conv.gpu and not self._host and self._epilogue is None \
                and self._stream is None:
            self._torch_device = a.get_device()

    def _init(self, a, b, out, compute, backend, stream, bias, activation, preactivation_out,
              host_ok=False):
        cupy_nd = calls.cupy_type()
        host = host_ok and type(a) is np.ndarray and type(b) is np.ndarray
        if not host and (cupy_nd is None or type(a) is not cupy_nd or type(b) is not cupy_nd):
            raise TypeError(f"Matmul: a and b must be CuPy arrays (or PyTorch tensors, JAX "
                            f"arrays), not {type(a).__name__} and {type(b).__name__} (NumPy "
                            f"arrays: use pyblasgemm.matmul)")
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"Matmul: a and b need 2 or more dimensions (got {a.ndim} and "
                             f"{b.ndim}); use pyblasgemm.matmul for vectors")
        if a.dtype != b.dtype or a.dtype not in ROW_BY_DTYPE or a.dtype.kind == "i":
            raise TypeError(f"Matmul: a and b must share one floating dtype, got {a.dtype} and "
                            f"{b.dtype}")
        row = ROW_BY_DTYPE[a.dtype]
        resolve_compute(row, compute, "Matmul")
        check_backend("Matmul", backend)
        self._stream = streams.handle(stream)
        self._epilogue = None
        if bias is not None or activation is not None or preactivation_out is not None:
            self._epilogue = _epilogue_state(a, b, out, row, bias, activation, preactivation_out,
                                             "numpy" if host else "cupy")
        if host:
            # nothing to plan or bind on the host: each execute is one pyblasgemm.matmul call
            shape = _matmul_shape(a, b)
            if out is None:
                out = np.empty(shape, row.c_dtype)
            elif type(out) is not np.ndarray or out.dtype != row.c_dtype or out.shape != shape:
                raise ValueError(f"Matmul: out must have dtype {row.c_dtype} and shape {shape}, "
                                 f"got {getattr(out, 'dtype', None)} and {getattr(out, 'shape', None)}")
            if _overlap(out, a) or _overlap(out, b):
                raise ValueError("Matmul: out overlaps a or b in memory")
            if not out.flags.writeable:
                raise ValueError("Matmul: out is read-only")
            self._host, self._launch, self._compute, self._backend = True, None, compute, backend
            self.a, self.b, self.out = a, b, out
            self._layout = tuple((x.dtype, x.shape, x.strides) for x in (a, b, out))
            return
        if out is None:
            out = cupy_nd(_matmul_shape(a, b), row.c_dtype) if self._epilogue else \
                _matmul(a, b, compute=compute, backend=backend, stream=self._stream)
        elif type(out) is not cupy_nd:
            raise TypeError(f"Matmul: out must be a CuPy array, not {type(out).__name__}")
        # plan and bind through the ordinary call (its checks and messages), then keep the
        # launch it ran: the one-launch route is what execute() repeats
        target = out if self._epilogue is None else self._epilogue[1]
        ran = _one_launch(a, b, target, compute, backend, self._stream,
                          accumulate_into=self._epilogue is not None)
        if ran is None:
            raise ValueError("Matmul: this product does not run as one launch on the arrays' "
                             "own memory (it needs copies, a temporary or a loop over batch "
                             "dimensions); use pyblasgemm.matmul")
        self._launch, swapped = ran
        self._run = calls.ordered(self._launch, swapped)     # the pointers in our order
        self.a, self.b, self.out = a, b, out
        self._layout = tuple((x.dtype, x.shape, x.strides) for x in (a, b, out))
        self._ptrs = (a.data.ptr, b.data.ptr, target.data.ptr)
        self._mask = _align_mask(self._launch)

    def execute(self, a: _Array | None = None, b: _Array | None = None,
                c: _Array | None = None, *, stream: Any = None) -> _Array:
        """Enqueue ``c = a @ b`` (the arrays given at construction unless others are passed;
        they must have the same dtype, shape and strides). Returns the result array (in the
        framework of the arrays given at construction)."""
        if self._torch_device is not None and a is None and b is None and c is None and stream is None:
            # the loop's call on tensors: the bound launch on torch's current stream, nothing
            # converted (the door's path costs ~5 µs more a call; H200, 64³ fp16)
            pa, pb, pc = self._ptrs
            sptr = arrays.torch_raw_stream(self._torch_device)
            self._run(pa, pb, pc, self._one, self._zero, sptr)
            return self._out_foreign
        if self._conv is not None:
            return self._execute_foreign(a, b, c, stream)
        if self._host:
            return self._execute_host(a, b, c)
        return self._execute_native(a, b, c, stream)

    def _execute_native(self, a, b, c, stream):
        pa, pb, pc = self._ptrs
        if a is not None or b is not None or c is not None:
            pa, pb, pc, c = self._check_new(a, b, c)
            if self._epilogue is not None:
                pc = self._ptrs[2]         # the product still goes into the held array
        else:
            c = self.out
        sptr = (self._stream if stream is None else streams.handle(stream))
        if sptr is None:
            sptr = streams.current()
        self._run(pa, pb, pc, self._one, self._zero, sptr)
        if self._epilogue is not None:
            epi, t, bias, pre = self._epilogue
            with streams.on(sptr):
                _epilogue_pass(epi, t, None, None, None, bias, None, None, pre, c)
        return c

    _one, _zero = 1.0, 0.0

    def _execute_foreign(self, a, b, c, stream):
        conv = self._conv
        na = nb = nc = None
        if a is not None or b is not None or c is not None:
            if arrays.needs_grad(a, b, c):
                raise TypeError("Matmul.execute: a tensor requires grad, and a bound launch "
                                "records no autograd graph: detach the tensors")
            na, nb, nc = arrays.convert("Matmul.execute", [("a", a), ("b", b), ("c", c)],
                                        writes=("c",)).arrays
        fresh = c is None and conv.kind == "jax"
        if stream is None and self._stream is None and conv.kind == "torch" and conv.gpu:
            stream = arrays._torch_stream(conv.like)        # PyTorch's current stream, now
        with conv.allocating():
            if fresh:
                # a JAX caller gets a new array each time (one it could hold is immutable)
                held = self.out
                nc = (np.empty if self._host else type(held))(held.shape, held.dtype)
            result = self._execute_host(na, nb, nc) if self._host else \
                self._execute_native(na, nb, nc, stream)
        if c is not None:
            return c
        return conv.back(result, framework_type=False) if fresh else self._out_foreign

    def _execute_host(self, a, b, c):
        """One pyblasgemm.matmul call into c on the host (no launch to replay)."""
        a, b, c = self._check_host(a, b, c)
        kw = dict(compute=self._compute, backend=self._backend)
        if self._epilogue is not None:
            epi, _, bias, pre = self._epilogue
            return _matmul(a, b, c, bias=bias, activation=epi.activation and epi.activation.name,
                           preactivation_out=pre, **kw)
        if c.dtype.name == "bfloat16":
            # NumPy's bfloat16 product is float32: computed so, rounded into c once
            c[...] = _matmul(a, b, dtype=np.float32, **kw)
            return c
        return _matmul(a, b, c, **kw)

    def _check_host(self, a, b, c):
        arrays = [self.a if a is None else a, self.b if b is None else b,
                  self.out if c is None else c]
        for name, x, (dtype, shape, strides) in zip("abc", arrays, self._layout):
            if type(x) is not np.ndarray or x.dtype != dtype or x.shape != shape \
                    or x.strides != strides:
                raise ValueError(f"Matmul.execute: {name} must have dtype {dtype}, shape "
                                 f"{shape} and strides {strides} like the array it replaces "
                                 f"(got {getattr(x, 'dtype', None)}, {getattr(x, 'shape', None)}, "
                                 f"{getattr(x, 'strides', None)}); make a new Matmul for it")
        a_, b_, c_ = arrays
        for name, x in (("a", a_), ("b", b_)):
            if _overlap(c_, x):
                raise ValueError(f"Matmul.execute: c overlaps {name} in memory")
        if not c_.flags.writeable:
            raise ValueError("Matmul.execute: c is read-only")
        return a_, b_, c_

    def _check_new(self, a, b, c):
        arrays = [self.a if a is None else a, self.b if b is None else b,
                  self.out if c is None else c]
        for name, x, (dtype, shape, strides) in zip("abc", arrays, self._layout):
            if type(x) is not type(self.a) or x.dtype != dtype or x.shape != shape \
                    or x.strides != strides:
                raise ValueError(f"Matmul.execute: {name} must have dtype {dtype}, shape "
                                 f"{shape} and strides {strides} like the array it replaces "
                                 f"(got {getattr(x, 'dtype', None)}, {getattr(x, 'shape', None)}, "
                                 f"{getattr(x, 'strides', None)}); make a new Matmul for it")
            if x.data.device_id != self.a.data.device_id:
                raise ValueError(f"Matmul.execute: {name} is on GPU {x.data.device_id}, the "
                                 f"plan on GPU {self.a.data.device_id}")
        pa, pb, pc = (x.data.ptr for x in arrays)
        if (pa | pb | pc) & self._mask:
            raise ValueError(f"Matmul.execute: pointers 0x{pa:x}, 0x{pb:x}, 0x{pc:x} are less "
                             f"aligned than the planned arrays' ({self._mask + 1} bytes)")
        a_, b_, c_ = arrays
        for name, x in (("a", a_), ("b", b_)):
            if _overlap(c_, x):
                raise ValueError(f"Matmul.execute: c overlaps {name} in memory")
        return pa, pb, pc, c_

    def free(self) -> None:
        """Drop the launch and the arrays (the plan cache may still hold the launch)."""
        self._launch = self._run = None
        self.a = self.b = self.out = None
        self._conv = self._out_foreign = None

    def __enter__(self) -> Matmul[_Array]:
        return self

    def __exit__(self, *exc):
        self.free()
        return False


def _epilogue_state(a, b, out, row, bias, activation, preactivation_out, xp_name="cupy"):
    """(Epilogue, the held accumulation-type product array, bias, pre-activation array)."""

    shape = _matmul_shape(a, b)
    out_dtype = row.c_dtype
    if out is not None and (getattr(out, "dtype", None) != out_dtype or getattr(out, "shape", None) != shape):
        raise ValueError(f"Matmul: out must have dtype {out_dtype} and shape {shape}, got "
                         f"{getattr(out, 'dtype', None)} and {getattr(out, 'shape', None)}")
    epi = check_epilogue("Matmul", shape, shape[-2:], out_dtype, xp_name, bias, activation,
                         preactivation_out, None, None, a.dtype)
    acc = acc_dtype(out_dtype)
    if acc != row.c_dtype and (a.dtype, acc) not in ROW_BY_DTYPES:
        raise TypeError(f"Matmul: no {acc} accumulation route for {a.dtype} operands")
    if xp_name == "numpy":
        return epi, None, bias, preactivation_out       # (the host's call holds its own)
    return epi, _arrays.xp_of(xp_name).empty(shape, acc), bias, preactivation_out


def _one_launch(a, b, out, compute, backend, stream, accumulate_into=False):
    """Run ``matmul(a, b, out=out)`` through the full path and return ``(launch, swapped)`` if
    it ran as one launch on the arrays' memory, else None."""

    row = ROW_BY_DTYPE[a.dtype]
    if accumulate_into and out.dtype != row.c_dtype:   # an epilogue's float32 product (shgemm, sbgemm)
        row = ROW_BY_DTYPES.get((a.dtype, out.dtype), row)
    if out.dtype != row.c_dtype or out.shape != _matmul_shape(a, b):
        raise ValueError(f"Matmul: out must have dtype {row.c_dtype} and shape "
                         f"{_matmul_shape(a, b)}, got {out.dtype} and {out.shape}")
    if may_overlap(out, a) or may_overlap(out, b):
        raise ValueError("Matmul: out overlaps a or b in memory")
    with streams.on(stream):
        return _batched(row, resolve_compute(row, compute, "Matmul"),
                        check_backend("Matmul", backend), a, b, out, None, stream)


def _matmul_shape(a, b):
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"Matmul: batch dimensions {a.shape[:-2]} and {b.shape[:-2]} do not "
                         f"broadcast") from None
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"Matmul: a is {a.shape[-2]} x {a.shape[-1]} but b is "
                         f"{b.shape[-2]} x {b.shape[-1]}")
    return batch + (a.shape[-2], b.shape[-1])


def _align_mask(launch) -> int:
    """Pointer bits that must be zero for the launch (its bound alignment class)."""
    align = max(getattr(launch, "a_align", 1), getattr(launch, "c_align", 1),
                getattr(launch, "align", 1))
    return align - 1


def _overlap(x, y) -> bool:
    return may_overlap(x, y)
